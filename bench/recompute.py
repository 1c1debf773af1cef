#!/usr/bin/python3
"""Activation recomputation, measured: memory and step time with parallel.recompute off and all.

Trains the main job's model (configs/gpt.yaml) with hap on 2 CPU ranks planned as
configs/clusters/two-devices.yaml (mpirun, one core each), recomputing no segment and every one,
in interleaved rounds so that a slow spell of the machine falls on both alike. Reports per setting the median step time (after warm-up steps) and
each rank's peak resident memory (getrusage, through /usr/bin/time), with the final losses (they
must be equal: recomputation changes no number), and hap-plan's predicted memory and step time
for the same plans (on that cluster's figures, not this machine's).

Writes bench/results/recompute.json.

  /usr/bin/python3 bench/recompute.py [--build build] [--rounds 3] [--steps 30]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = ["off", "all"]


def train(build, recompute, steps, batch):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--bind-to", "core",
           "/usr/bin/time", "-f", "maxrss_kb %M", os.path.join(build, "hap-train"), "--config",
           "configs/gpt.yaml", "--cluster", "configs/clusters/two-devices.yaml", "--set",
           f"parallel.recompute={recompute}", "--set", "parallel.select_devices=false", "--set",
           f"train.steps={steps}", "--set", "train.log_every=1", "--set", "train.eval_every=1000",
           "--set", f"train.batch_size={batch}", "--set", "train.log_file="]
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"hap-train (recompute {recompute}) failed:\n{r.stdout[-3000:]}")
    ms = [float(m) for m in re.findall(r"\|\s+([0-9.]+) ms/step", r.stdout)]
    rss = [int(m) for m in re.findall(r"maxrss_kb (\d+)", r.stdout)]
    loss = re.findall(r"done(?: on \d+ ranks)?: \d+ steps, loss [0-9.]+ -> ([0-9.]+)", r.stdout)
    return ms, rss, loss


def predicted(build, recompute, batch):
    cmd = [os.path.join(build, "hap-plan"), "--config", "configs/gpt.yaml", "--set",
           f"parallel.recompute={recompute}", "--set", "parallel.select_devices=false", "--set",
           f"train.batch_size={batch}", "--cluster",
           "configs/clusters/two-devices.yaml"]
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    step = re.search(r"predicted step time: ([0-9.]+) (m?s|us)", r.stdout)
    mem = re.findall(r"memory\s+([0-9.]+) (KiB|MiB|GiB) of", r.stdout)
    unit = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
    return {"step_s": float(step.group(1)) * scale[step.group(2)] if step else None,
            "memory_bytes": [float(v) * unit[u] for v, u in mem]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the median")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results/recompute.json"))
    args = p.parse_args()
    ms = {s: [] for s in SETTINGS}
    rss = {s: [] for s in SETTINGS}
    losses = {s: set() for s in SETTINGS}
    for rnd in range(args.rounds):
        for s in SETTINGS:
            m, r, loss = train(args.build, s, args.steps, args.batch)
            ms[s] += m[args.skip:]
            rss[s] += r
            losses[s].update(loss)
            print(f"round {rnd + 1}/{args.rounds} recompute {s}: median "
                  f"{statistics.median(m[args.skip:]):.1f} ms/step, peak RSS per rank "
                  f"{[round(x / 1024, 1) for x in r]} MiB, final loss {loss}", flush=True)
    out = {"benchmark": "activation recomputation, gpt.yaml, hap on 2 CPU ranks",
           "batch_size": args.batch, "steps": args.steps, "rounds": args.rounds, "settings": {}}
    for s in SETTINGS:
        out["settings"][s] = {"median_ms_per_step": statistics.median(ms[s]),
                              "peak_rss_mib_max": max(rss[s]) / 1024,
                              "peak_rss_mib_median": statistics.median(rss[s]) / 1024,
                              "final_losses": sorted(losses[s]),
                              "predicted": predicted(args.build, s, args.batch)}
    off, on = out["settings"]["off"], out["settings"]["all"]
    out["time_ratio_all_over_off"] = on["median_ms_per_step"] / off["median_ms_per_step"]
    out["rss_ratio_all_over_off"] = on["peak_rss_mib_max"] / off["peak_rss_mib_max"]
    out["same_losses"] = off["final_losses"] == on["final_losses"]
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
