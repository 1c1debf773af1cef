#!/usr/bin/python3
"""Do the emulated cluster files' compute figures hold on this machine? Stated vs hap-profile.

The emulated cluster files state each rank's compute in CPU cores (`flops_per_s: 0.8 cores`),
resolved with one core's rate on this machine (train/core_rate.h: measured once, unthrottled, and
cached per CPU and GEMM path). This measures each file under scripts/hap-emulate with hap-profile
(the default GPT of configs/gpt.yaml, its global batch split over the ranks) and compares every
rank's measured flops_per_s with the figure the file states, in --rounds rounds. The per-core
rate is measured afresh before each round's profile (a temporary cache folder), so that stated
and measured come from the same minute of the machine (its speed drifts by 20% over minutes). Writes bench/results/core_rate.json. Needs root (cgroups).

  /usr/bin/python3 bench/core_rate_check.py [--rounds 3] [--clusters emu-mixed4,emu-2node]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env):
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"core_rate_check: '{' '.join(cmd)}' failed (exit {r.returncode}):\n"
                         f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def profiled_flops(path):
    """flops_per_s of each device line of a cluster file hap-profile wrote, in rank order."""
    out = []
    with open(path) as f:
        for line in f:
            m = re.search(r"\{name: ([^,]+),.*flops_per_s: ([0-9.e+-]+),", line)
            if m:
                out.append((m.group(1), float(m.group(2))))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clusters", default="emu-mixed4,emu-2node")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "core_rate.json"))
    args = p.parse_args()
    build = os.path.join(ROOT, "build")
    cache = tempfile.mkdtemp(prefix="hap-core-rate-")
    env = dict(os.environ)
    env.pop("HAP_CORE_FLOPS", None)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "clusters": {}}
    for name in args.clusters.split(","):
        path = os.path.join(ROOT, "configs", "clusters", name + ".yaml")
        rounds = []
        for k in range(args.rounds):
            # A fresh cache each round: the stated figures come from a core rate measured right
            # before the profile, so that the machine's drift over minutes falls on both alike.
            env["HAP_CACHE_DIR"] = os.path.join(cache, f"{name}-{k}")
            described = json.loads(run([os.path.join(build, "hap-plan"), "--cluster", path,
                                        "--describe-cluster"], env).stdout)
            stated = {d["name"]: d["flops_per_s"] for d in described["devices"]}
            quotas = {d["name"]: d["cpu_quota"] for d in described["devices"]}
            with open(os.path.join(env["HAP_CACHE_DIR"], "core-flops.json")) as f:
                result["machine"] = list(json.load(f)["entries"])  # the CPU and GEMM path
            out = os.path.join(cache, f"profiled-{name}-{k}.yaml")
            run([os.path.join(ROOT, "scripts", "hap-emulate"), path, "--",
                 os.path.join(build, "hap-profile"), "--config", "configs/gpt.yaml", "--out", out],
                env)
            measured = dict(profiled_flops(out))
            rounds.append({"core_flops_per_s": described["core_flops_per_s"],
                           "stated": stated, "measured": measured})
            print(f"{name} round {k + 1}: one core {described['core_flops_per_s']:.4g} FLOP/s; "
                  "measured / stated: " +
                  ", ".join(f"{d} {measured[d] / stated[d]:.3f}" for d in stated), flush=True)
        devices = []
        for d in rounds[0]["stated"]:
            ratios = [r["measured"][d] / r["stated"][d] for r in rounds]
            devices.append({"name": d, "cpu_quota": quotas[d],
                            "stated_flops_per_s": [r["stated"][d] for r in rounds],
                            "measured_flops_per_s": [r["measured"][d] for r in rounds],
                            "measured_over_stated": ratios,
                            "median_measured_over_stated": statistics.median(ratios)})
        cores = [r["core_flops_per_s"] for r in rounds]
        result["clusters"][name] = {"core_flops_per_s": cores, "devices": devices}
        worst = max(abs(x["median_measured_over_stated"] - 1) for x in devices)
        print(f"{name}: one core {min(cores):.4g}-{max(cores):.4g} FLOP/s over the rounds; "
              "medians of measured / stated: " +
              ", ".join(f"{x['name']} {x['median_measured_over_stated']:.3f}" for x in devices) +
              f"; worst {worst * 100:.1f}% off", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
