#!/usr/bin/python3
"""ZeRO storage, measured: memory, step time and losses of one data-parallel program with its
parameters stored whole, stored sharded with the gathered copies kept, and stored sharded with
the copies gathered again in backward.

Plans the main job's model (configs/gpt.yaml) with dp-cp on configs/clusters/two-devices.yaml
(hap-plan --json), then writes two variants of that plan: every parameter with a gradient
all-reduce that no view op reads (attention's q, k, v stacks and the position table are read
through views and stay whole) stored Sharded(0), its all-reduce replaced by an all-gather of the
shards (whose backward reduce-scatters the gradient) and its AdamW step run on the shard; the
gathered copies kept for backward ("kept") or gathered again there ("again", the plan's
`regather`). Trains each plan on 2 CPU ranks (mpirun, one core each, hap-train --plan) in
interleaved rounds and reports the median step time after warm-up, each rank's peak resident
memory (getrusage through /usr/bin/time), the final losses (they must be equal: the storage
changes no number) and hap-plan's predicted memory per device for the same plans.

Writes bench/results/zero_storage.json.

  /usr/bin/python3 bench/zero_storage.py [--build build] [--rounds 3] [--steps 30]
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
SETTINGS = ["whole", "kept", "again"]
CLUSTER = "configs/clusters/two-devices.yaml"
VIEWS = {"Slice", "Split", "Reshape", "Transpose", "Permute", "Narrow", "Select", "Expand",
         "Contiguous", "Cast"}


def run(cmd):
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}")
    return r.stdout


def make_plans(build, common, tmp):
    plan = os.path.join(tmp, "whole.json")
    run([os.path.join(build, "hap-plan"), "--config", "configs/gpt.yaml", "--cluster", CLUSTER,
         *common, "--json", plan])
    names, viewed = {}, set()
    dump = run([os.path.join(build, "hap-plan"), "--config", "configs/gpt.yaml", *common,
                "--dump-graph"])
    for line in dump.splitlines():
        m = re.search(r"param %(\d+)\(([^)]*)\)", line)
        if m:
            names[int(m.group(1))] = m.group(2)
            continue
        m = re.match(r"\s+\[\d+\]\s+\S+\s+(\S+)\s+.*<-(.*)", line)
        if m and m.group(1) in VIEWS:
            viewed.update(int(t) for t in re.findall(r"%(\d+)\(", m.group(2)))
    with open(plan) as f:
        whole = json.load(f)
    paths = {"whole": plan}
    sharded = []
    for setting in ("kept", "again"):
        p = json.loads(json.dumps(whole))
        zero = set()
        for ins in p["instructions"]:
            t = ins.get("tensor")
            if ins["kind"] == "grad_all_reduce" and t in names and t not in viewed:
                ins.update({"kind": "all_gather", "from": "S(0)", "to": "R", "method": "grouped",
                            "regather": setting == "again"})
                zero.add(t)
                p["storage"][names[t]] = "S(0)"
        for ins in p["instructions"]:
            if ins["kind"] == "update" and ins["tensor"] in zero:
                ins["from"] = ins["to"] = "S(0)"
        paths[setting] = os.path.join(tmp, setting + ".json")
        with open(paths[setting], "w") as f:
            json.dump(p, f)
        sharded = sorted(names[t] for t in zero)
    return paths, sharded, len(names)


def train(build, common, plan):
    wrapped = ("/usr/bin/time -f \"rank $OMPI_COMM_WORLD_RANK maxrss_kb %M\" "
               + " ".join([os.path.join(build, "hap-train"), "--config", "configs/gpt.yaml",
                           "--cluster", CLUSTER, *common, "--plan", plan]))
    out = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--bind-to", "core",
               "sh", "-c", wrapped])
    ms = [float(m) for m in re.findall(r"\|\s+([0-9.]+) ms/step", out)]
    rss = {int(r): int(k) for r, k in re.findall(r"rank (\d+) maxrss_kb (\d+)", out)}
    loss = re.findall(r"done(?: on \d+ ranks)?: \d+ steps, loss [0-9.]+ -> ([0-9.]+)", out)
    predicted = [float(v) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[u]
                 for v, u in re.findall(r"memory\s+([0-9.]+) (KiB|MiB|GiB) of", out)]
    return ms, [rss[r] for r in sorted(rss)], loss, predicted


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the median")
    p.add_argument("--out", default=os.path.join(ROOT, "bench/results/zero_storage.json"))
    args = p.parse_args()
    common = ["--set", "parallel.strategy=dp-cp", "--set", "parallel.select_devices=false",
              "--set", f"train.steps={args.steps}", "--set", "train.log_every=1", "--set",
              "train.eval_every=1000", "--set", "train.log_file="]
    with tempfile.TemporaryDirectory() as tmp:
        plans, sharded, params = make_plans(args.build, common, tmp)
        ms = {s: [] for s in SETTINGS}
        rss = {s: [] for s in SETTINGS}
        losses = {s: set() for s in SETTINGS}
        predicted = {}
        for rnd in range(args.rounds):
            for s in SETTINGS:
                m, r, loss, pred = train(args.build, common, plans[s])
                ms[s] += m[args.skip:]
                rss[s].append(r)
                losses[s].update(loss)
                predicted[s] = pred
                print(f"round {rnd + 1}/{args.rounds} {s}: median "
                      f"{statistics.median(m[args.skip:]):.1f} ms/step, peak RSS per rank "
                      f"{[round(x / 1024, 1) for x in r]} MiB, final loss {loss}", flush=True)
    out = {"benchmark": "ZeRO storage, gpt.yaml, dp-cp on 2 CPU ranks (two-devices.yaml)",
           "steps": args.steps, "rounds": args.rounds,
           "parameters_sharded": len(sharded), "parameters": params,
           "left_whole": "parameters read by view ops (q, k, v stacks, the position table)",
           "settings": {}}
    for s in SETTINGS:
        per_rank = list(zip(*rss[s]))
        out["settings"][s] = {
            "median_ms_per_step": statistics.median(ms[s]),
            "peak_rss_mib_per_rank_median": [statistics.median(r) / 1024 for r in per_rank],
            "predicted_memory_mib_per_device": [b / 2**20 for b in predicted[s]],
            "final_losses": sorted(losses[s])}
    whole = out["settings"]["whole"]
    for s in ("kept", "again"):
        out[f"time_ratio_{s}_over_whole"] = (out["settings"][s]["median_ms_per_step"]
                                            / whole["median_ms_per_step"])
    out["same_losses"] = all(out["settings"][s]["final_losses"] == whole["final_losses"]
                             for s in SETTINGS)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
