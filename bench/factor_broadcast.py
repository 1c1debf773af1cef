#!/usr/bin/python3
"""Sufficient factor broadcasting, measured: data parallelism with the fully connected layers'
gradients all-reduced against the same program with them computed from broadcast factors, and
hap's own plan, on the emulated two-node cluster.

Plans configs/vgg19.yaml (classifier widened to --hidden, --batch images per step) with dp-cp on
bench/results/profiled-emu-2node.yaml (hap-plan --json), then writes a variant of that plan in
which every Linear's weight and bias gradient all-reduces are replaced by a factor_broadcast
after its computation (each rank all-gathers the layer's input and output gradient in backward
and computes the whole weight gradient itself: Poseidon's SFB on data parallelism; the gathers
padded rings). Trains the
two plans and hap's plan (parallel.factor_broadcast: auto, all 4 devices) under
scripts/hap-emulate configs/clusters/emu-2node.yaml (4 CPU ranks with quotas 0.8/0.4/0.2/0.2 of a
core, the nodes joined by a 1 Gbit/s link), in interleaved rounds, and reports each one's
median step time after warm-up, hap-train's predicted step time for the same plan and the final
losses (the factor-broadcast program computes the same gradients: its losses must equal
dp-cp's up to float rounding).

Writes bench/results/factor_broadcast.json. Needs root (cgroups, namespaces).

  /usr/bin/python3 bench/factor_broadcast.py [--build build] [--rounds 3] [--steps 12]
                                             [--hidden 2048] [--batch 16]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "configs/vgg19.yaml"
DECLARED = "configs/clusters/emu-2node.yaml"
PROFILED = "bench/results/profiled-emu-2node.yaml"
SETTINGS = ["dp-cp", "dp-cp+factors", "hap"]
# The gathers of the factors: a ring over shards padded to the largest (P - 1 latencies per
# gather; the cost model prices the grouped form at P log P, which on this cluster's slow link
# would be the dearer).
METHOD = "padded"


def run(cmd):
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stdout[-3000:]}")
    return r.stdout


def linear_params(build, common):
    """Graph node id -> the parameter tensor ids of every Linear (from hap-plan --dump-graph)."""
    out = {}
    for line in run([os.path.join(build, "hap-plan"), "--config", CONFIG, *common,
                     "--dump-graph"]).splitlines():
        m = re.match(r"\s+\[(\d+)\]\s+\S+\s+Linear\s+.*<-(.*)", line)
        if m:
            out[int(m.group(1))] = [int(t) for t in re.findall(r"%(\d+)\(", m.group(2))]
    return out


def make_plans(build, common, tmp):
    paths = {}
    for name, strategy in (("dp-cp", "dp-cp"), ("hap", "hap")):
        paths[name] = os.path.join(tmp, name + ".json")
        run([os.path.join(build, "hap-plan"), "--config", CONFIG, "--cluster", PROFILED, *common,
             "--set", f"parallel.strategy={strategy}", "--json", paths[name]])
    with open(paths["dp-cp"]) as f:
        plan = json.load(f)
    linears = linear_params(build, common)
    params = {t for ps in linears.values() for t in ps}
    out, changed = [], 0
    for ins in plan["instructions"]:
        if ins["kind"] == "grad_all_reduce" and ins["tensor"] in params:
            continue  # computed whole from the factors instead
        out.append(ins)
        if ins["kind"] == "compute" and ins["node"] in linears:
            out.append({"kind": "factor_broadcast", "node": ins["node"],
                        "signature": ins["signature"], "segment": ins["segment"],
                        "method": METHOD, "cost_s": 0.0})
            changed += 1
    plan["instructions"] = out
    paths["dp-cp+factors"] = os.path.join(tmp, "factors.json")
    with open(paths["dp-cp+factors"], "w") as f:
        json.dump(plan, f)
    with open(paths["hap"]) as f:
        hap_factors = sum(1 for i in json.load(f)["instructions"] if i["kind"] == "factor_broadcast")
    return paths, changed, hap_factors


def train(build, common, plan):
    out = run([os.path.join(ROOT, "scripts", "hap-emulate"), DECLARED, "--",
               os.path.join(build, "hap-train"), "--config", CONFIG, "--cluster", PROFILED,
               *common, "--plan", plan])
    ms = [float(m) for m in re.findall(r"\|\s+([0-9.]+) ms/step", out)]
    loss = re.findall(r"done(?: on \d+ ranks)?: \d+ steps, loss [0-9.]+ -> ([0-9.]+)", out)
    predicted = re.findall(r"predicted step time: ([0-9.]+) ms", out)
    return ms, loss, [float(p) for p in predicted]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the median")
    p.add_argument("--hidden", type=int, default=2048, help="the classifier's hidden width")
    p.add_argument("--batch", type=int, default=16, help="images per step")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results/factor_broadcast.json"))
    args = p.parse_args()
    if args.steps <= args.skip:
        sys.exit("factor_broadcast: --steps must exceed --skip")
    common = ["--set", f"model.hidden={args.hidden}", "--set", f"train.batch_size={args.batch}",
              "--set", "parallel.select_devices=false", "--set", f"train.steps={args.steps}",
              "--set", "train.log_every=1", "--set", "train.eval_every=1000",
              "--set", "train.log_file=", "--set", "train.warmup_steps=0"]
    with tempfile.TemporaryDirectory() as tmp:
        plans, changed, hap_factors = make_plans(args.build, common, tmp)
        ms = {s: [] for s in SETTINGS}
        losses = {s: set() for s in SETTINGS}
        predicted = {}
        for rnd in range(args.rounds):
            for s in SETTINGS:
                m, loss, pred = train(args.build, common, plans[s])
                if len(m) <= args.skip:
                    sys.exit(f"factor_broadcast: {s} logged {len(m)} steps")
                ms[s] += m[args.skip:]
                losses[s].update(loss)
                predicted[s] = pred[0] if pred else None
                print(f"round {rnd + 1}/{args.rounds} {s}: median "
                      f"{statistics.median(m[args.skip:]):.1f} ms/step (predicted "
                      f"{predicted[s]} ms), final loss {loss}", flush=True)
    out = {"benchmark": f"sufficient factor broadcasting, {CONFIG} (model.hidden={args.hidden}, "
                        f"batch {args.batch}) on {DECLARED} under scripts/hap-emulate",
           "cluster_file": PROFILED, "steps": args.steps, "skipped_warmup_steps": args.skip,
           "rounds": args.rounds, "linears_with_factors": changed,
           "hap_factor_broadcasts": hap_factors, "settings": {}}
    for s in SETTINGS:
        out["settings"][s] = {"median_ms_per_step": statistics.median(ms[s]),
                              "predicted_ms_per_step": predicted[s],
                              "final_losses": sorted(losses[s])}
    dp = out["settings"]["dp-cp"]["median_ms_per_step"]
    out["speedup_factors_over_dp_cp"] = dp / out["settings"]["dp-cp+factors"]["median_ms_per_step"]
    out["speedup_hap_over_dp_cp"] = dp / out["settings"]["hap"]["median_ms_per_step"]
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
