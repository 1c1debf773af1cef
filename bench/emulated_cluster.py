#!/usr/bin/python3
"""Measured speed-ups on emulated mixed clusters: hap vs dp-ev, dp-cp, tp and PyTorch DDP.

Any zoo model: --config names its run config (GPT by default; vgg19, vit, bert and bert_moe
train their PyTorch twins from tests/oracle/model_oracle.py under DDP, bench/torch_ddp_zoo.py).
A model with experts (options.num_experts) also runs the dp-ep baseline (even expert parallelism
plus data parallelism elsewhere, as DeepSpeed-MoE runs it).

For each emulated cluster (default: emu-mixed4 and emu-2node), in one run:
  1. hap-profile measures the cluster under scripts/hap-emulate and writes
     bench/results/profiled-<cluster>.yaml (compute rates, memory, fitted links);
  2. hap-train trains the model of --config with each strategy on that profiled file, under the
     emulator, logging every step; the median step time (after --skip warm-up steps) is
     compared with the cost model's predicted step time from the same plan;
  3. PyTorch DDP (gloo) trains the same model, global batch and quotas (bench/torch_ddp_gpt.py).
Steps 2 and 3 run in --rounds interleaved rounds (every strategy once per round, in turn), so
that a slow spell of the machine falls on all of them alike: each strategy reports the median of
all its steps, each round's median and the spread of those (max / min - 1); strategies whose
plans are the same program (hap often finds dp-cp's) report how far apart they measured. hap
also runs without overlap (parallel.overlap_grad_comm=false: gradient all-reduces after the
backward pass), measured and predicted beside the overlapped default; on a cluster of several
nodes hap and dp-cp also run with every all-reduce flat (parallel.hierarchical_collectives=false)
beside their default, which may run them hierarchically.
Writes bench/results/emulated_cluster.json and a bar chart bench/results/emulated_cluster.png
(measured vs predicted per strategy, per cluster). Needs root (cgroups, namespaces).

--throttle ops runs everything under hap-emulate --throttle ops (HAP's kernels slowed to the
quotas instead of CPU quotas; no PyTorch peer, whose kernels would run at full speed) and writes
its profiles as bench/results/profiled-<cluster>-ops.yaml.

  /usr/bin/python3 bench/emulated_cluster.py [--steps 30] [--rounds 3]
                                             [--clusters emu-mixed4,emu-2node] [--throttle ops]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGIES = ["hap", "dp-ev", "dp-cp", "tp"]


def strategies_of(model):
    """The strategies a model runs: dp-ep too where it has experts."""
    return STRATEGIES + (["dp-ep"] if model.get("options", {}).get("num_experts") else [])


def run(cmd, log):
    print("+ " + " ".join(cmd), flush=True)
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"emulated_cluster: '{' '.join(cmd)}' failed (exit {r.returncode}); "
                         f"log {log}:\n{tail}")


def read_config(path):
    """The model and batch sizes the DDP peer needs (hap-train validates the same file)."""
    with open(os.path.join(ROOT, path)) as f:
        cfg = yaml.safe_load(f)
    name = cfg["model"].get("name", "gpt")
    if name != "gpt":
        options = {k: v for k, v in cfg["model"].items() if k != "name"}
        return {"name": name, "options": options, "batch_size": int(cfg["train"]["batch_size"])}
    out = {k: int(cfg["model"][k]) for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")}
    out["name"] = "gpt"
    # seq_len 0 (or absent) means block_size, as in the gpt model's options.
    out["seq_len"] = int(cfg["model"].get("seq_len", 0)) or out["block_size"]
    out["batch_size"] = int(cfg["train"]["batch_size"])
    return out


def profile_vs_quotas(build, profiled):
    """How far the profiled compute rates' ratios are from the quotas' ratios (rank 0 as 1)."""
    r = subprocess.run([os.path.join(build, "hap-plan"), "--cluster", profiled, "--describe-cluster"],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
    devices = json.loads(r.stdout)["devices"]
    rates = [d["flops_per_s"] for d in devices]
    quotas = [d["cpu_quota"] for d in devices]
    deviation = [(rt / rates[0]) / (q / quotas[0]) - 1 for rt, q in zip(rates, quotas)]
    return {"flops_per_s": rates, "cpu_quota": quotas, "ratio_deviation": deviation,
            "max_ratio_deviation": max(abs(x) for x in deviation)}


def spread(values):
    """max / min - 1 of positive values (0 for one value)."""
    return max(values) / min(values) - 1


def steps_from_log(path, skip):
    ms = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "train":
                ms.append((rec["step"], rec["ms_per_step"]))
    return [m for s, m in ms if s > skip]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/gpt.yaml")
    p.add_argument("--clusters", default="emu-mixed4,emu-2node")
    p.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the median")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds of every strategy (default 3)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default="bench/results/emulated_cluster.json")
    p.add_argument("--png", default="bench/results/emulated_cluster.png")
    p.add_argument("--no-ddp", action="store_true", help="skip the PyTorch DDP peer")
    p.add_argument("--throttle", choices=["cfs", "ops"], default="cfs",
                   help="how hap-emulate slows the ranks (default cfs: CPU quotas; ops: HAP's "
                        "kernels slowed, which leaves a PyTorch peer at full speed: no DDP peer)")
    args = p.parse_args(argv)
    if args.steps <= args.skip:
        raise SystemExit("emulated_cluster: --steps must exceed --skip")
    if args.rounds < 1:
        raise SystemExit("emulated_cluster: --rounds must be at least 1")
    emulate = [os.path.join(ROOT, "scripts", "hap-emulate"), "--throttle", args.throttle]
    if args.throttle == "ops":
        args.no_ddp = True  # PyTorch's kernels would run at full speed
    train = os.path.join(args.build, "hap-train")
    profile = os.path.join(args.build, "hap-profile")
    model = read_config(args.config)
    strategies = strategies_of(model)
    work = os.path.join(ROOT, "runs", "bench-emulated", model["name"])
    os.makedirs(work, exist_ok=True)
    results = {"config": args.config, "steps": args.steps, "skipped_warmup_steps": args.skip,
               "rounds": args.rounds, "throttle": args.throttle,
               "machine_cores": len(os.sched_getaffinity(0)),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "clusters": {}}

    for name in args.clusters.split(","):
        declared = f"configs/clusters/{name}.yaml"
        tag = "" if model["name"] == "gpt" else f"-{model['name']}"
        profiled = (f"bench/results/profiled-{name}{tag}" +
                    ("" if args.throttle == "cfs" else f"-{args.throttle}") + ".yaml")
        run(emulate + [declared, "--", profile, "--config", args.config, "--out", profiled,
             "--raw", os.path.join(work, f"profile-{name}.json")], os.path.join(work, f"profile-{name}.log"))
        entry = {"declared_cluster": declared, "profiled_cluster": profiled, "strategies": {}}
        entry["profile"] = profile_vs_quotas(args.build, profiled)
        print(f"{name} profile: rate ratios vs quota ratios off by at most "
              f"{entry['profile']['max_ratio_deviation'] * 100:.1f}%", flush=True)
        # hap without overlap: the gradient all-reduces after the backward pass (the same numbers).
        runs = [(s, profiled, s, []) for s in strategies] + [
            ("hap-declared", declared, "hap", []),
            ("hap-no-overlap", profiled, "hap", ["--set", "parallel.overlap_grad_comm=false"])]
        # On several nodes: hap and dp-cp with every all-reduce flat (no hierarchical form).
        with open(os.path.join(ROOT, declared)) as f:
            several_nodes = len(yaml.safe_load(f).get("nodes", [])) > 1
        flat = ["--set", "parallel.hierarchical_collectives=false"]
        if several_nodes:
            runs += [("hap-flat", profiled, "hap", flat), ("dp-cp-flat", profiled, "dp-cp", flat)]
        step_ms = {label: [] for label, _, _, _ in runs}
        round_medians = {label: [] for label, _, _, _ in runs}
        programs, predicted = {}, {}
        ddp_ms, ddp_round_medians, torch_version = [], [], None
        for rnd in range(args.rounds):
            for label, cluster_file, strategy, extra in runs:
                log = os.path.join(work, f"{name}-{label}-r{rnd}.jsonl")
                plan = os.path.join(work, f"{name}-{label}-plan.json")
                if os.path.exists(log):
                    os.remove(log)
                run(emulate + [declared, "--", train, "--config", args.config, "--cluster", cluster_file,
                     "--set", f"parallel.strategy={strategy}", "--set", f"train.steps={args.steps}",
                     "--set", f"train.warmup_steps={min(args.steps, 5)}", "--set", "train.log_every=1",
                     "--set", "train.eval_every=100000", "--set", f"train.log_file={log}",
                     "--plan-json", plan, "--quiet"] + extra, os.path.join(work, f"{name}-{label}.log"))
                ms = steps_from_log(log, args.skip)
                step_ms[label] += ms
                round_medians[label].append(statistics.median(ms))
                with open(plan) as f:
                    plan_json = json.load(f)
                predicted[label] = plan_json["predicted_step_s"] * 1e3
                programs[label] = json.dumps([plan_json["ratios"], plan_json["instructions"]],
                                             sort_keys=True)
                print(f"{name} {label} round {rnd + 1}/{args.rounds}: median "
                      f"{round_medians[label][-1]:.1f} ms/step", flush=True)
            if not args.no_ddp:
                out = os.path.join(work, f"{name}-ddp-r{rnd}.json")
                if model["name"] == "gpt":
                    peer = ["bench/torch_ddp_gpt.py",
                            "--n-layer", str(model["n_layer"]), "--n-head", str(model["n_head"]),
                            "--n-embd", str(model["n_embd"]), "--vocab", str(model["vocab_size"]),
                            "--block-size", str(model["block_size"]), "--seq", str(model["seq_len"])]
                else:
                    peer = ["bench/torch_ddp_zoo.py", "--model",
                            json.dumps({"model": model["name"], "options": model["options"]})]
                run(emulate + [declared, "--", "/usr/bin/python3"] + peer +
                    ["--batch", str(model["batch_size"]), "--steps", str(args.steps - args.skip),
                     "--warmup", str(args.skip), "--json", out], os.path.join(work, f"{name}-ddp.log"))
                with open(out) as f:
                    ddp = json.load(f)
                ddp_ms += ddp["step_ms"]
                ddp_round_medians.append(ddp["median_ms"])
                torch_version = ddp["torch_version"]
                print(f"{name} pytorch-ddp round {rnd + 1}/{args.rounds}: median "
                      f"{ddp['median_ms']:.1f} ms/step", flush=True)
        for label, cluster_file, strategy, _ in runs:
            median = statistics.median(step_ms[label])
            result = {"median_ms": median, "predicted_ms": predicted[label],
                      "cluster_file": cluster_file,
                      "prediction_error": (predicted[label] - median) / median,
                      "round_medians_ms": round_medians[label],
                      "round_spread": spread(round_medians[label]), "step_ms": step_ms[label]}
            if label == "hap-declared":
                entry["hap_planned_on_declared_file"] = result
            elif label == "hap-no-overlap":
                entry["hap_without_overlap"] = result
            elif label.endswith("-flat"):
                entry.setdefault("flat_all_reduces", {})[strategy] = result
            else:
                entry["strategies"][strategy] = result
            print(f"{name} {label}: median {median:.1f} ms/step over {args.rounds} round(s) "
                  f"(round medians {spread(round_medians[label]) * 100:.1f}% apart), predicted "
                  f"{predicted[label]:.1f} ms", flush=True)
        if not args.no_ddp:
            entry["pytorch_ddp"] = {"median_ms": statistics.median(ddp_ms), "step_ms": ddp_ms,
                                    "round_medians_ms": ddp_round_medians,
                                    "round_spread": spread(ddp_round_medians),
                                    "torch_version": torch_version}
            print(f"{name} pytorch-ddp: median {entry['pytorch_ddp']['median_ms']:.1f} ms/step",
                  flush=True)
        # The same program planned under two names (hap finding dp-cp's, say) must measure alike.
        same = []
        labels = [label for label, _, _, _ in runs if label in strategies]
        for i, a in enumerate(labels):
            for b in labels[i + 1:]:
                if programs[a] == programs[b]:
                    ma, mb = (entry["strategies"][x]["median_ms"] for x in (a, b))
                    same.append({"strategies": [a, b], "median_ms": [ma, mb],
                                 "apart": max(ma, mb) / min(ma, mb) - 1})
                    print(f"{name}: {a} and {b} are the same program; medians "
                          f"{(max(ma, mb) / min(ma, mb) - 1) * 100:.1f}% apart", flush=True)
        entry["identical_programs"] = same
        s = entry["strategies"]
        entry["hap_speedup_over_dp_ev"] = s["dp-ev"]["median_ms"] / s["hap"]["median_ms"]
        entry["hap_speedup_over_best_baseline"] = min(
            s[k]["median_ms"] for k in strategies if k != "hap") / s["hap"]["median_ms"]
        if "pytorch_ddp" in entry:
            entry["hap_speedup_over_pytorch_ddp"] = entry["pytorch_ddp"]["median_ms"] / s["hap"]["median_ms"]
            entry["dp_ev_speedup_over_pytorch_ddp"] = entry["pytorch_ddp"]["median_ms"] / s["dp-ev"]["median_ms"]
        entry["max_abs_prediction_error"] = max(abs(v["prediction_error"]) for v in s.values())
        entry["hap_profiled_vs_declared_plan"] = (
            entry["hap_planned_on_declared_file"]["median_ms"] / s["hap"]["median_ms"])
        entry["overlap_speedup"] = entry["hap_without_overlap"]["median_ms"] / s["hap"]["median_ms"]
        if "flat_all_reduces" in entry:  # measured and predicted speed-up of the hierarchical form
            entry["hierarchical_speedup"] = {
                k: {"measured": v["median_ms"] / s[k]["median_ms"],
                    "predicted": v["predicted_ms"] / s[k]["predicted_ms"]}
                for k, v in entry["flat_all_reduces"].items()}
        results["clusters"][name] = entry

    os.makedirs(os.path.dirname(os.path.join(ROOT, args.out)), exist_ok=True)
    with open(os.path.join(ROOT, args.out), "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")
    chart(results, os.path.join(ROOT, args.png))
    print(f"wrote {args.png}")
    for name, e in results["clusters"].items():
        line = f"{name}: hap {e['hap_speedup_over_dp_ev']:.2f}x over dp-ev"
        if "hap_speedup_over_pytorch_ddp" in e:
            line += (f", {e['hap_speedup_over_pytorch_ddp']:.2f}x over PyTorch DDP; dp-ev "
                     f"{e['dp_ev_speedup_over_pytorch_ddp']:.2f}x over PyTorch DDP")
        line += (f"; prediction error at most {e['max_abs_prediction_error'] * 100:.0f}%; hap planned on "
                 f"the declared file takes {e['hap_profiled_vs_declared_plan']:.2f}x the profiled plan's time"
                 f"; without overlap hap takes {e['overlap_speedup']:.2f}x its time (predicted "
                 f"{e['hap_without_overlap']['predicted_ms'] / e['strategies']['hap']['predicted_ms']:.2f}x)")
        for k, v in e.get("hierarchical_speedup", {}).items():
            line += (f"; {k} with hierarchical all-reduces {v['measured']:.2f}x as fast as flat "
                     f"(predicted {v['predicted']:.2f}x)")
        print(line)
    return 0


def chart(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clusters = list(results["clusters"].items())
    fig, axes = plt.subplots(1, len(clusters), figsize=(6 * len(clusters), 4.5), squeeze=False)
    for ax, (name, e) in zip(axes[0], clusters):
        names = list(e["strategies"])
        labels = names + (["pytorch-ddp"] if "pytorch_ddp" in e else [])
        measured = [e["strategies"][s]["median_ms"] for s in names]
        predicted = [e["strategies"][s]["predicted_ms"] for s in names]
        if "pytorch_ddp" in e:
            measured.append(e["pytorch_ddp"]["median_ms"])
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], measured, width=0.4, label="measured (median)")
        ax.bar([i + 0.2 for i in range(len(predicted))], predicted, width=0.4, label="predicted (cost model)")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels)
        ax.set_ylabel("ms per training step")
        ax.set_title(f"{name}: hap {e['hap_speedup_over_dp_ev']:.2f}x over dp-ev")
        ax.legend()
    fig.suptitle(f"{results['config']} on emulated mixed clusters, {results['steps']} steps per run, "
                 f"{results.get('rounds', 1)} interleaved round(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
