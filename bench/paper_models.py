#!/usr/bin/python3
"""The paper's models on the paper's cluster: predicted step times of hap and the baselines.

For each model of HAP's evaluation (vgg19, vit, bert, bert_moe with 2 x devices experts) at
the paper's settings (fp32, global batch 32 x devices, AdamW, gradient clipping 0.5), on the
paper's heterogeneous cluster (configs/clusters/hap-paper.yaml: 2 machines of 8 V100 and 6 of 8
P100, about 10.4 Gbit/s between machines) and on its scalability subsets (1, 2, 4 and 8 GPUs per
machine: 8, 16, 32 and 64 devices), hap-plan plans every strategy on one core and reports the
cost model's predicted step time, hap's speed-up over each baseline, hap's ratio to the compute
lower bound, and the synthesis time. Plans that fit no device's memory are reported as such.

Writes bench/results/paper_models.json and bench/results/paper_models.png.

  /usr/bin/python3 bench/paper_models.py [--build build] [--models vgg19,vit,bert]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGIES = ["hap", "dp-ev", "dp-cp", "tp"]
PER_MACHINE = [1, 2, 4, 8]

# The paper's sizes: each model's option defaults are the paper's size, except where listed.
MODELS = {
    "vgg19": ("configs/vgg19.yaml", ["model.width=64", "model.hidden=4096"]),
    "vit": ("configs/vit.yaml", ["model.n_layer=12", "model.n_head=12", "model.n_embd=768",
                                 "model.hidden=3072"]),
    "bert": ("configs/bert.yaml", ["model.n_layer=12", "model.n_head=12", "model.n_embd=768",
                                   "model.hidden=3072", "model.seq_len=128"]),
    # 2 x devices experts (added per device count below), capacity factor 2.5.
    "bert_moe": ("configs/bert_moe.yaml", ["model.n_layer=12", "model.n_head=12", "model.n_embd=768",
                                           "model.hidden=3072", "model.seq_len=128",
                                           "model.capacity_factor=2.5"]),
}
PAPER_SETTINGS = ["train.optimizer=adamw", "train.lr=5e-4", "train.grad_clip=0.5"]


def subset_cluster(path, per_machine, out_dir):
    """hap-paper.yaml with `per_machine` GPUs in each machine (the paper's scalability runs)."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"count: 8", f"count: {per_machine}", text)
    text = re.sub(r"^name: (\S+)", rf"name: \1-{per_machine}x8", text, flags=re.M)
    out = os.path.join(out_dir, f"hap-paper-{per_machine}x8.yaml")
    with open(out, "w") as f:
        f.write(text)
    return out


def plan(build, config, overrides, cluster, strategy, out_json):
    cmd = ["taskset", "-c", "0", os.path.join(build, "hap-plan"), "--config", config, "--cluster",
           cluster, "--strategy", strategy, "--json", out_json]
    for o in overrides:
        cmd += ["--set", o]
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        message = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        if "no program fits in memory" in message:
            return {"fits": False, "error": message}
        if "search budget" in message or "without reaching the loss" in message:
            return {"fits": False, "error": message, "search_budget_exceeded": True}
        raise SystemExit(f"paper_models: {' '.join(cmd)} failed: {r.stderr[-2000:]}")
    with open(out_json) as f:
        p = json.load(f)
    return {"fits": True, "predicted_step_s": p["predicted_step_s"], "compute_s": p["compute_s"],
            "communication_s": p["communication_s"],
            "compute_lower_bound_s": p["compute_lower_bound_s"], "synthesis_s": p["synthesis_s"],
            # hap may leave devices out: its plan then names the ones it runs on (and its
            # compute_lower_bound_s is theirs).
            "devices_used": len(p["devices"]) if "devices" in p else None}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default="bench/results/paper_models.json")
    ap.add_argument("--png", default="bench/results/paper_models.png")
    args = ap.parse_args(argv)
    results = {"cluster": "configs/clusters/hap-paper.yaml", "settings": PAPER_SETTINGS +
               ["train.batch_size=32 x devices"], "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            config, sizes = MODELS[model]
            entry = {"config": config, "overrides": sizes, "devices": {}}
            for k in PER_MACHINE:
                n = 8 * k
                cluster = subset_cluster(os.path.join(ROOT, results["cluster"]), k, tmp)
                overrides = sizes + PAPER_SETTINGS + [f"train.batch_size={32 * n}"]
                if model == "bert_moe":
                    overrides = overrides + [f"model.num_experts={2 * n}"]
                row = {}
                strategies = STRATEGIES + (["dp-ep"] if model == "bert_moe" else [])
                for s in strategies:
                    row[s] = plan(args.build, config, overrides, cluster, s, os.path.join(tmp, "p.json"))
                hap = row["hap"]
                if hap["fits"]:
                    hap["speedup_over"] = {s: row[s]["predicted_step_s"] / hap["predicted_step_s"]
                                           for s in strategies[1:] if row[s]["fits"]}
                    # The whole cluster's bound: a baseline's (every baseline uses all devices).
                    bounds = [row[s]["compute_lower_bound_s"] for s in strategies[1:] if row[s]["fits"]]
                    hap["cluster_compute_lower_bound_s"] = bounds[0] if bounds else hap["compute_lower_bound_s"]
                    hap["ratio_to_compute_lower_bound"] = (hap["predicted_step_s"] /
                                                           hap["cluster_compute_lower_bound_s"])
                entry["devices"][str(n)] = row
                line = f"{model} on {n} devices: hap {hap['predicted_step_s'] * 1e3:.1f} ms" if hap["fits"] \
                    else f"{model} on {n} devices: hap found no program ({hap['error'][:80]})"
                if hap["fits"] and hap["devices_used"]:
                    line += f" (on {hap['devices_used']} of them)"
                for s in strategies[1:]:
                    line += (f", {s} {row[s]['predicted_step_s'] * 1e3:.1f} ms" if row[s]["fits"]
                             else f", {s} search budget exceeded" if row[s].get("search_budget_exceeded")
                             else f", {s} out of memory")
                if hap["fits"]:
                    ev = hap["speedup_over"].get("dp-ev")
                    line += f"; hap {ev:.2f}x over dp-ev, " if ev else "; dp-ev has no program; hap "
                    line += (f"{hap['ratio_to_compute_lower_bound']:.2f}x the compute lower bound, "
                             f"synthesis {hap['synthesis_s']:.2f} s")
                print(line, flush=True)
            results["models"][model] = entry
    os.makedirs(os.path.dirname(os.path.join(ROOT, args.out)), exist_ok=True)
    with open(os.path.join(ROOT, args.out), "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.out}")
    chart(results, os.path.join(ROOT, args.png))
    print(f"wrote {args.png}")
    return 0


def chart(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results["models"].items())
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, (name, e) in zip(axes[0], models):
        counts = sorted(e["devices"], key=int)
        for s in STRATEGIES[1:] + ["dp-ep"]:
            ys = [e["devices"][n]["hap"].get("speedup_over", {}).get(s) for n in counts]
            xs = [int(n) for n, y in zip(counts, ys) if y is not None]
            if not xs:
                continue
            ax.plot(xs, [y for y in ys if y is not None], marker="o", label=f"hap over {s}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([int(n) for n in counts])
        ax.set_xticklabels(counts)
        ax.set_xlabel("devices (1/4 V100, 3/4 P100)")
        ax.set_ylabel("predicted speed-up")
        ax.set_title(name)
        ax.legend()
    fig.suptitle("hap-paper cluster, paper settings: predicted speed-up of hap (cost model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
