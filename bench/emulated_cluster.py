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

--device cuda measures a mixed GPU cluster emulated on one GPU instead (issue 16, item 7; default
cluster emu-gpu-mixed4: ranks in green contexts of 64/32/16/16 SMs with memory caps, through
scripts/hap-emulate, no cgroups, no PyTorch peer): hap-profile and hap-train run with
train.device=cuda, and the results go to bench/results/emulated_gpu_cluster[-TAG].json/.png. The
ideal speed-up over dp-ev is what the devices' SM counts allow (sum / (ranks x smallest));
each cluster reports hap's share of it. A strategy whose plan does not fit the memory caps (dp-ev
with GPT-2 124M) is recorded with its error and measured again with every device given the
largest cap of the file ("memory_lifted"), so that its speed is still known. Without PyYAML or
matplotlib the script still runs: it reads the config itself, writes the JSON, and --chart-only
draws the PNG from it later.

--profile-each-round profiles the cluster again before every round after the first and plans
that round on that profile: the machine's speed drifts (round medians 10-25% apart on this shared
machine), and each round's prediction is then set beside a measurement minutes after its own
profile; every strategy reports each round's prediction and error, and its prediction_error is
their median (without it: one profile, one plan, the overall median's error).

--set KEY=VALUE (repeatable) overrides a config key in every hap-profile and hap-train run (a
larger model: --set model.n_layer=12 ...), --tag names the results files after it.

--throttle ops runs everything under hap-emulate --throttle ops (HAP's kernels slowed to the
quotas instead of CPU quotas; no PyTorch peer, whose kernels would run at full speed) and writes
its profiles as bench/results/profiled-<cluster>-ops.yaml.

  /usr/bin/python3 bench/emulated_cluster.py [--steps 30] [--rounds 3]
                                             [--clusters emu-mixed4,emu-2node] [--throttle ops]
                                             [--device cuda] [--set KEY=VALUE]... [--tag TAG]
                                             [--profile-each-round]
  /usr/bin/python3 bench/emulated_cluster.py --chart-only --out JSON --png PNG
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import re
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGIES = ["hap", "dp-ev", "dp-cp", "tp"]


def strategies_of(model):
    """The strategies a model runs: dp-ep too where it has experts."""
    return STRATEGIES + (["dp-ep"] if model.get("options", {}).get("num_experts") else [])


class RunFailed(Exception):
    """A command that exited non-zero, with the tail of its log."""

    def __init__(self, cmd, code, log):
        with open(log) as f:
            self.tail = f.read()[-3000:]
        super().__init__(f"'{' '.join(cmd)}' failed (exit {code}); log {log}:\n{self.tail}")


def run(cmd, log, fatal=True):
    """Runs cmd with its output in log; a failure ends the benchmark, or raises RunFailed."""
    print("+ " + " ".join(cmd), flush=True)
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        err = RunFailed(cmd, r.returncode, log)
        if fatal:
            raise SystemExit(f"emulated_cluster: {err}")
        raise err


def scalar(text):
    """A YAML scalar as bool, int, float or string (comments and quotes removed)."""
    text = text.split(" #")[0].strip().strip("'\"")
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def load_config(text):
    """The run config: PyYAML where it is installed, else the two-level subset our configs use
    (sections of `key: value` lines), which is all the GPU machine's Python needs to read."""
    try:
        import yaml
    except ImportError:
        yaml = None
    if yaml is not None:
        return yaml.safe_load(text)
    cfg, section = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.strip().partition(":")
        if not line.startswith((" ", "\t")):
            section = cfg.setdefault(key, {})
        elif section is not None:
            section[key] = scalar(value)
    return cfg


def read_config(path, sets):
    """The model and batch sizes of the run config with the --set overrides applied (hap-train
    validates the same file; the DDP peer needs the sizes)."""
    with open(os.path.join(ROOT, path)) as f:
        cfg = load_config(f.read())
    for s in sets:
        key, _, value = s.partition("=")
        section, _, name = key.partition(".")
        cfg.setdefault(section, {})[name] = scalar(value)
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


def describe(build, cluster_file):
    """The cluster file's devices as hap-plan validates them (one per rank); a file hap-plan
    refuses ends the benchmark with hap-plan's message."""
    r = subprocess.run([os.path.join(build, "hap-plan"), "--cluster", cluster_file, "--describe-cluster"],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"emulated_cluster: cluster '{cluster_file}': " +
                         (r.stderr.strip() or f"hap-plan exited {r.returncode}"))
    return json.loads(r.stdout)["devices"]


def cluster_file_of(name):
    """A name under configs/clusters, or a cluster file's path; a name that is neither ends the
    benchmark, listing the names there are."""
    if name.endswith((".yaml", ".yml")):
        if not os.path.isfile(os.path.join(ROOT, name)):
            raise SystemExit(f"emulated_cluster: --clusters: no cluster file '{name}'")
        return name
    path = f"configs/clusters/{name}.yaml"
    if not os.path.isfile(os.path.join(ROOT, path)):
        names = sorted(os.path.splitext(f)[0] for f in os.listdir(os.path.join(ROOT, "configs", "clusters"))
                       if f.endswith(".yaml"))
        raise SystemExit(f"emulated_cluster: --clusters: no cluster '{name}' under configs/clusters "
                         f"(there: {', '.join(names)}); or give a cluster file's path")
    return path


def ideal_speedup(devices, key):
    """The speed-up over even data parallelism that the devices' speeds (key: cpu_quota or
    sm_count) allow: dp-ev runs at the slowest device's pace on 1/n of the batch each, the ideal
    split at the sum of all speeds."""
    speeds = [d[key] for d in devices]
    return sum(speeds) / (len(speeds) * min(speeds))


def profile_vs_declared(build, profiled, key):
    """How far the profiled compute rates' ratios are from the declared speeds' ratios (key:
    cpu_quota or sm_count, which the profiled file keeps), rank 0 as 1."""
    devices = describe(build, profiled)
    rates = [d["flops_per_s"] for d in devices]
    speeds = [d[key] for d in devices]
    deviation = [(rt / rates[0]) / (q / speeds[0]) - 1 for rt, q in zip(rates, speeds)]
    return {"flops_per_s": rates, key: speeds, "ratio_deviation": deviation,
            "max_ratio_deviation": max(abs(x) for x in deviation)}


def memory_lifted(src, devices, dst):
    """A copy of the cluster file src with every device given the largest memory_bytes of the
    file: where a plan does not fit the caps, its speed is still measured there."""
    big = max(d["memory_bytes"] for d in devices)
    with open(os.path.join(ROOT, src)) as f:
        text = f.read()
    text = re.sub(r"(memory_bytes:\s*)[^,}\n#]+", lambda m: m.group(1) + str(big), text)
    with open(dst, "w") as f:
        f.write(text)
    return dst


def spread(values):
    """max / min - 1 of positive values (0 for one value)."""
    return max(values) / min(values) - 1


def prediction_errors(round_predicted, round_medians, median, each_round):
    """(predicted ms, prediction error, each round's error): each round's prediction beside that
    round's median; with a profile per round the error is the median of the rounds' errors and
    the prediction their median, else (one plan, one prediction) the prediction's error against
    the median of all steps."""
    round_errors = [(p - m) / m for p, m in zip(round_predicted, round_medians)]
    if each_round:
        return statistics.median(round_predicted), statistics.median(round_errors), round_errors
    return round_predicted[-1], (round_predicted[-1] - median) / median, round_errors


def identical_programs(labels, programs, medians):
    """Pairs of runs that executed the same program in the same round, and how far apart they
    measured: programs[label] and medians[label] map a round to its plan (ratios and
    instructions, as text) and its median ms/step. For each pair with at least one such round:
    those rounds' medians, each round's gap (max / min - 1), and the median of the gaps. Rounds
    in which a pair planned different programs are left out of that pair."""
    same = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            rounds = sorted(r for r in programs.get(a, {})
                            if r in programs.get(b, {}) and programs[a][r] == programs[b][r]
                            and r in medians.get(a, {}) and r in medians.get(b, {}))
            if not rounds:
                continue
            gaps = [max(medians[a][r], medians[b][r]) / min(medians[a][r], medians[b][r]) - 1
                    for r in rounds]
            same.append({"runs": [a, b], "rounds": [r + 1 for r in rounds],
                         "round_medians_ms": [[medians[a][r], medians[b][r]] for r in rounds],
                         "round_gaps": gaps, "apart": statistics.median(gaps)})
    return same


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
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: clusters emulated with CPU quotas (default); cuda: a mixed GPU "
                        "cluster emulated on one GPU (default cluster emu-gpu-mixed4)")
    p.add_argument("--clusters", default=None,
                   help="comma-separated names under configs/clusters or cluster files (default "
                        "emu-mixed4,emu-2node; emu-gpu-mixed4 with --device cuda)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run (repeatable)")
    p.add_argument("--tag", default="", help="appended to the results files' names")
    p.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the median")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds of every strategy (default 3)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="where hap-train, hap-profile and hap-plan are")
    p.add_argument("--out", default=None,
                   help="results JSON (default bench/results/emulated_cluster[-TAG].json, "
                        "emulated_gpu_cluster[-TAG].json with --device cuda)")
    p.add_argument("--png", default=None, help="chart (default: --out with .png)")
    p.add_argument("--profile-dir", default="bench/results",
                   help="where the profiled cluster files go (default bench/results)")
    p.add_argument("--work", default="runs/bench-emulated",
                   help="where every run's log and plan go (default runs/bench-emulated)")
    p.add_argument("--no-ddp", action="store_true", help="skip the PyTorch DDP peer")
    p.add_argument("--strategies-only", action="store_true",
                   help="run the strategies alone, not hap planned on the declared file, hap "
                        "without overlap or the flat all-reduces (a shorter benchmark)")
    p.add_argument("--quick-profile", action="store_true", help="hap-profile --quick")
    p.add_argument("--profile-each-round", action="store_true",
                   help="profile the cluster again before every round after the first and plan "
                        "that round on it: each round's prediction is then set beside a "
                        "measurement minutes after its profile, not the machine's drift since "
                        "the first (prediction_error: the median of the rounds' errors)")
    p.add_argument("--chart-only", action="store_true",
                   help="draw --png from an existing --out JSON and exit")
    p.add_argument("--throttle", choices=["cfs", "ops"], default="cfs",
                   help="how hap-emulate slows the ranks (default cfs: CPU quotas; ops: HAP's "
                        "kernels slowed, which leaves a PyTorch peer at full speed: no DDP peer)")
    args = p.parse_args(argv)
    gpu = args.device == "cuda"
    tag = f"-{args.tag}" if args.tag else ""
    if args.out is None:
        args.out = f"bench/results/emulated_{'gpu_' if gpu else ''}cluster{tag}.json"
    if args.png is None:
        args.png = os.path.splitext(args.out)[0] + ".png"
    if args.chart_only:
        with open(os.path.join(ROOT, args.out)) as f:
            chart(json.load(f), os.path.join(ROOT, args.png))
        return 0
    if args.clusters is None:
        args.clusters = "emu-gpu-mixed4" if gpu else "emu-mixed4,emu-2node"
    if args.steps <= args.skip:
        raise SystemExit("emulated_cluster: --steps must exceed --skip")
    if args.rounds < 1:
        raise SystemExit("emulated_cluster: --rounds must be at least 1")
    for s in args.sets:
        if "=" not in s or "." not in s.partition("=")[0]:
            raise SystemExit(f"emulated_cluster: --set '{s}': expected SECTION.KEY=VALUE")
    sets = [x for s in args.sets for x in ("--set", s)]
    if gpu:
        # Green contexts on one GPU: no cgroups, no throttling, no PyTorch peer on those ranks.
        emulate = [sys.executable, os.path.join(ROOT, "scripts", "hap-emulate"),
                   "--hap-plan", os.path.join(args.build, "hap-plan")]
        sets += ["--set", "train.device=cuda"]
        args.no_ddp = True
        speed_key = "sm_count"
    else:
        emulate = [os.path.join(ROOT, "scripts", "hap-emulate"), "--throttle", args.throttle]
        speed_key = "cpu_quota"
    if args.throttle == "ops":
        args.no_ddp = True  # PyTorch's kernels would run at full speed
    train = os.path.join(args.build, "hap-train")
    profile = os.path.join(args.build, "hap-profile")
    model = read_config(args.config, args.sets)
    strategies = strategies_of(model)
    work = os.path.join(ROOT, args.work, model["name"] + tag)
    os.makedirs(work, exist_ok=True)
    os.makedirs(os.path.join(ROOT, args.profile_dir), exist_ok=True)
    results = {"config": args.config, "sets": args.sets, "device": args.device, "steps": args.steps,
               "skipped_warmup_steps": args.skip, "rounds": args.rounds,
               "throttle": None if gpu else args.throttle,
               "machine_cores": len(os.sched_getaffinity(0)),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "clusters": {}}

    # Every cluster checked before the first run (minutes each).
    declared_files = [cluster_file_of(name) for name in args.clusters.split(",")]
    described = [describe(args.build, declared) for declared in declared_files]
    for declared, declared_devices in zip(declared_files, described):
        name = os.path.splitext(os.path.basename(declared))[0]
        name_tag = tag if tag or model["name"] == "gpt" else f"-{model['name']}"
        profiled = os.path.join(args.profile_dir, f"profiled-{name}{name_tag}" +
                    ("" if gpu or args.throttle == "cfs" else f"-{args.throttle}") + ".yaml")
        def profile_to(path, suffix=""):
            run(emulate + [declared, "--", profile, "--config", args.config, "--out", path,
                 "--raw", os.path.join(work, f"profile-{name}{suffix}.json")] + sets +
                (["--quick"] if args.quick_profile else []),
                os.path.join(work, f"profile-{name}{suffix}.log"))
        profile_to(profiled)
        entry = {"declared_cluster": declared, "profiled_cluster": profiled, "strategies": {}}
        entry["profile"] = profile_vs_declared(args.build, profiled, speed_key)
        entry["ideal_speedup_over_dp_ev"] = ideal_speedup(declared_devices, speed_key)
        print(f"{name} profile: rate ratios vs {speed_key} ratios off by at most "
              f"{entry['profile']['max_ratio_deviation'] * 100:.1f}%", flush=True)
        # hap without overlap: the gradient all-reduces after the backward pass (the same numbers).
        runs = [(s, profiled, s, []) for s in strategies]
        if not args.strategies_only:
            runs += [("hap-declared", declared, "hap", []),
                     ("hap-no-overlap", profiled, "hap",
                      ["--set", "parallel.overlap_grad_comm=false"])]
        # On several nodes: hap and dp-cp with every all-reduce flat (no hierarchical form).
        several_nodes = len({d["node"] for d in declared_devices}) > 1
        flat = ["--set", "parallel.hierarchical_collectives=false"]
        if several_nodes and not args.strategies_only:
            runs += [("hap-flat", profiled, "hap", flat), ("dp-cp-flat", profiled, "dp-cp", flat)]
        step_ms = {label: [] for label, _, _, _ in runs}
        round_medians = {label: [] for label, _, _, _ in runs}
        programs = {label: {} for label, _, _, _ in runs}  # round -> plan
        medians_by_round = {label: {} for label, _, _, _ in runs}
        predicted = {label: [] for label, _, _, _ in runs}
        round_profiles = [profiled]
        # A run that fails under the memory caps runs again, from then on, with every device given
        # the file's largest cap (lifted[label]: the cluster files it runs with); one that fails
        # there too is recorded with its error and not run again.
        lifted, failed, error_under_caps = {}, {}, {}
        lifted_declared = memory_lifted(declared, declared_devices,
                                        os.path.join(work, f"{name}-memory-lifted.yaml"))
        ddp_ms, ddp_round_medians, torch_version = [], [], None
        for rnd in range(args.rounds):
            if args.profile_each_round and rnd > 0:
                base, ext = os.path.splitext(profiled)
                round_profiles.append(f"{base}-r{rnd}{ext}")
                profile_to(round_profiles[-1], f"-r{rnd}")
                print(f"{name} round {rnd + 1}/{args.rounds}: profiled again "
                      f"({os.path.basename(round_profiles[-1])})", flush=True)
            for label, cluster_file, strategy, extra in runs:
                if label in failed:
                    continue
                if cluster_file == profiled:
                    cluster_file = round_profiles[-1]
                log = os.path.join(work, f"{name}-{label}-r{rnd}.jsonl")
                plan = os.path.join(work, f"{name}-{label}-plan.json")
                for path in (log, plan):
                    if os.path.exists(path):
                        os.remove(path)
                def train_cmd(emulated, planned):
                    return emulate + [emulated, "--", train, "--config", args.config, "--cluster", planned,
                                      "--set", f"parallel.strategy={strategy}", "--set", f"train.steps={args.steps}",
                                      "--set", f"train.warmup_steps={min(args.steps, 5)}", "--set", "train.log_every=1",
                                      "--set", "train.eval_every=100000", "--set", f"train.log_file={log}",
                                      "--plan-json", plan, "--quiet"] + sets + extra
                train_log = os.path.join(work, f"{name}-{label}.log")
                try:
                    run(train_cmd(*lifted.get(label, (declared, cluster_file))), train_log, fatal=False)
                except RunFailed as e:
                    if label in lifted or rnd > 0 or "memory" not in e.tail.lower():
                        failed[label] = e.tail
                        print(f"{name} {label}: failed in round {rnd + 1}" +
                              (" with memory lifted" if label in lifted else "") + "; left out", flush=True)
                        continue
                    error_under_caps[label] = e.tail
                    lifted[label] = (lifted_declared, memory_lifted(
                        cluster_file, describe(args.build, cluster_file),
                        os.path.join(work, f"{name}-{label}-memory-lifted.yaml")))
                    print(f"{name} {label}: failed under the memory caps; measured with every device "
                          f"given the largest cap instead", flush=True)
                    try:
                        run(train_cmd(*lifted[label]), train_log, fatal=False)
                    except RunFailed as e2:
                        failed[label] = e2.tail
                        print(f"{name} {label}: failed with memory lifted too; left out", flush=True)
                        continue
                ms = steps_from_log(log, args.skip)
                step_ms[label] += ms
                round_medians[label].append(statistics.median(ms))
                with open(plan) as f:
                    plan_json = json.load(f)
                predicted[label].append(plan_json["predicted_step_s"] * 1e3)
                programs[label][rnd] = json.dumps([plan_json["ratios"], plan_json["instructions"]],
                                                  sort_keys=True)
                medians_by_round[label][rnd] = round_medians[label][-1]
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
            if label in failed:
                result = {"error": failed[label], "memory_lifted": label in lifted}
                print(f"{name} {label}: failed; error recorded", flush=True)
            else:
                median = statistics.median(step_ms[label])
                predicted_ms, error, round_errors = prediction_errors(
                    predicted[label], round_medians[label], median, args.profile_each_round)
                result = {"median_ms": median, "predicted_ms": predicted_ms,
                          "cluster_file": lifted.get(label, (None, cluster_file))[1],
                          "prediction_error": error,
                          "round_predicted_ms": predicted[label],
                          "round_prediction_errors": round_errors,
                          "round_medians_ms": round_medians[label],
                          "round_spread": spread(round_medians[label]), "step_ms": step_ms[label],
                          "distinct_programs": len(set(programs[label].values())),
                          "memory_lifted": label in lifted}
                print(f"{name} {label}: median {median:.1f} ms/step over {args.rounds} round(s) "
                      f"(round medians {spread(round_medians[label]) * 100:.1f}% apart), predicted "
                      f"{predicted_ms:.1f} ms, error {error * 100:+.1f}% (rounds: " +
                      ", ".join(f"{e * 100:+.0f}%" for e in round_errors) + ")" +
                      (" (memory lifted)" if label in lifted else ""), flush=True)
            if label in error_under_caps:
                result["error_under_memory_caps"] = error_under_caps[label]
            if label == "hap-declared":
                entry["hap_planned_on_declared_file"] = result
            elif label == "hap-no-overlap":
                entry["hap_without_overlap"] = result
            elif label.endswith("-flat"):
                entry.setdefault("flat_all_reduces", {})[strategy] = result
            else:
                entry["strategies"][strategy] = result
        if not args.no_ddp:
            entry["pytorch_ddp"] = {"median_ms": statistics.median(ddp_ms), "step_ms": ddp_ms,
                                    "round_medians_ms": ddp_round_medians,
                                    "round_spread": spread(ddp_round_medians),
                                    "torch_version": torch_version}
            print(f"{name} pytorch-ddp: median {entry['pytorch_ddp']['median_ms']:.1f} ms/step",
                  flush=True)
        if args.profile_each_round:
            entry["round_profiled_clusters"] = round_profiles
        # The same program planned under two names (hap finding dp-cp's, or hap planned on the
        # declared file finding the profiled plan) must measure alike: compared round by round,
        # where both ran it. Runs with options that change how a program executes (no overlap)
        # are not compared, nor a run with memory lifted beside one without.
        s = entry["strategies"]
        labels = [label for label, _, _, extra in runs if not extra and label not in failed]
        same = [pair for pair in identical_programs(labels, programs, medians_by_round)
                if (pair["runs"][0] in lifted) == (pair["runs"][1] in lifted)]
        for pair in same:
            a, b = pair["runs"]
            print(f"{name}: {a} and {b} ran the same program in round(s) "
                  f"{', '.join(map(str, pair['rounds']))}; round medians "
                  + ", ".join(f"{g * 100:.1f}%" for g in pair["round_gaps"])
                  + f" apart (median {pair['apart'] * 100:.1f}%)", flush=True)
        entry["identical_programs"] = same
        measured = {k: v["median_ms"] for k, v in s.items() if "median_ms" in v}
        if "hap" in measured:
            if "dp-ev" in measured:
                entry["hap_speedup_over_dp_ev"] = measured["dp-ev"] / measured["hap"]
                entry["hap_share_of_ideal_speedup"] = (entry["hap_speedup_over_dp_ev"] /
                                                      entry["ideal_speedup_over_dp_ev"])
            others = [v for k, v in measured.items() if k != "hap"]
            if others:
                entry["hap_speedup_over_best_baseline"] = min(others) / measured["hap"]
            if "pytorch_ddp" in entry:
                entry["hap_speedup_over_pytorch_ddp"] = entry["pytorch_ddp"]["median_ms"] / measured["hap"]
            if "median_ms" in entry.get("hap_planned_on_declared_file", {}):
                entry["hap_profiled_vs_declared_plan"] = (
                    entry["hap_planned_on_declared_file"]["median_ms"] / measured["hap"])
            if "median_ms" in entry.get("hap_without_overlap", {}):
                entry["overlap_speedup"] = entry["hap_without_overlap"]["median_ms"] / measured["hap"]
        if "pytorch_ddp" in entry and "dp-ev" in measured:
            entry["dp_ev_speedup_over_pytorch_ddp"] = entry["pytorch_ddp"]["median_ms"] / measured["dp-ev"]
        if measured:
            entry["max_abs_prediction_error"] = max(
                abs(v["prediction_error"]) for v in s.values() if "median_ms" in v)
        if "flat_all_reduces" in entry:  # measured and predicted speed-up of the hierarchical form
            entry["hierarchical_speedup"] = {
                k: {"measured": v["median_ms"] / s[k]["median_ms"],
                    "predicted": v["predicted_ms"] / s[k]["predicted_ms"]}
                for k, v in entry["flat_all_reduces"].items()
                if "median_ms" in v and "median_ms" in s.get(k, {})}
        results["clusters"][name] = entry

    os.makedirs(os.path.dirname(os.path.join(ROOT, args.out)), exist_ok=True)
    with open(os.path.join(ROOT, args.out), "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")
    chart(results, os.path.join(ROOT, args.png))
    for name, e in results["clusters"].items():
        line = f"{name}:"
        if "hap_speedup_over_dp_ev" in e:
            line += (f" hap {e['hap_speedup_over_dp_ev']:.2f}x over dp-ev"
                     + (" (dp-ev with memory lifted)" if e["strategies"]["dp-ev"]["memory_lifted"] else "")
                     + f", {e['hap_share_of_ideal_speedup'] * 100:.0f}% of the ideal "
                     f"{e['ideal_speedup_over_dp_ev']:.2f}x")
        else:
            line += " hap or dp-ev did not run (see the JSON's errors)"
        if "hap_speedup_over_pytorch_ddp" in e:
            line += f", {e['hap_speedup_over_pytorch_ddp']:.2f}x over PyTorch DDP"
            if "dp_ev_speedup_over_pytorch_ddp" in e:
                line += f"; dp-ev {e['dp_ev_speedup_over_pytorch_ddp']:.2f}x over PyTorch DDP"
        if "max_abs_prediction_error" in e:
            line += f"; prediction error at most {e['max_abs_prediction_error'] * 100:.0f}%"
        if "hap_profiled_vs_declared_plan" in e:
            line += (f"; hap planned on the declared file takes {e['hap_profiled_vs_declared_plan']:.2f}x "
                     f"the profiled plan's time")
        if "overlap_speedup" in e:
            line += (f"; without overlap hap takes {e['overlap_speedup']:.2f}x its time (predicted "
                     f"{e['hap_without_overlap']['predicted_ms'] / e['strategies']['hap']['predicted_ms']:.2f}x)")
        for k, v in e.get("hierarchical_speedup", {}).items():
            line += (f"; {k} with hierarchical all-reduces {v['measured']:.2f}x as fast as flat "
                     f"(predicted {v['predicted']:.2f}x)")
        failed_names = [k for k, v in e["strategies"].items() if "error" in v]
        if failed_names:
            line += f"; failed: {', '.join(failed_names)}"
        print(line)
    return 0


def chart(results, path):
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib not found: no chart; draw it later with --chart-only --out JSON --png {path}")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clusters = list(results["clusters"].items())
    fig, axes = plt.subplots(1, len(clusters), figsize=(6 * len(clusters), 4.5), squeeze=False)
    for ax, (name, e) in zip(axes[0], clusters):
        names = [k for k, v in e["strategies"].items() if "median_ms" in v]
        labels = [k + (" (mem. lifted)" if e["strategies"][k]["memory_lifted"] else "") for k in names]
        labels += ["pytorch-ddp"] if "pytorch_ddp" in e else []
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
        title = name
        if "hap_speedup_over_dp_ev" in e:
            title += (f": hap {e['hap_speedup_over_dp_ev']:.2f}x over dp-ev "
                      f"(ideal {e['ideal_speedup_over_dp_ev']:.2f}x)")
        ax.set_title(title)
        ax.legend()
    sets = f" ({', '.join(results['sets'])})" if results.get("sets") else ""
    # Two lines, so that a title with --set overrides still fits one chart's width.
    fig.suptitle(f"{results['config']}{sets}\non emulated mixed {'GPU ' if results.get('device') == 'cuda' else ''}"
                 f"clusters, {results['steps']} steps per run, {results.get('rounds', 1)} interleaved round(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
