"""The emulated-cluster benchmark's helpers (bench/emulated_cluster.py), which also run
without PyYAML: its own reader of run configs gives what PyYAML gives on every config we ship,
--set overrides land where hap-train puts them, a memory-lifted copy of a cluster file changes
memory and nothing else, the ideal speed-up over dp-ev follows the SM counts or quotas, and
prediction errors are each round's (their median with a profile per round), and runs that
planned the same program are compared round by round; an unknown cluster or a file hap-plan
refuses ends the benchmark with a message.

    python3 check_bench_helpers.py SOURCE_DIR HAP_PLAN
"""
import glob
import os
import sys
import tempfile

import yaml

src, hap_plan = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "bench"))
import emulated_cluster as bench  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


configs = sorted(glob.glob(os.path.join(src, "configs", "*.yaml")))
check(len(configs) >= 5, f"expected the zoo's configs under {src}/configs, found {configs}")
for path in configs:
    with open(path) as f:
        text = f.read()
    with_yaml = yaml.safe_load(text)
    real = bench.load_config
    # The fallback reader, as on a machine without PyYAML.
    saved = sys.modules.get("yaml")
    sys.modules["yaml"] = None  # import yaml now raises ImportError
    try:
        own = real(text)
    finally:
        sys.modules["yaml"] = saved
    for section, values in with_yaml.items():
        for key, value in (values or {}).items():
            got = own.get(section, {}).get(key)
            # PyYAML (YAML 1.1) reads 1.0e-3 as a string; hap-train reads it as a number.
            if isinstance(value, str) and isinstance(got, float):
                check(float(value) == got, f"{path}: {section}.{key}: {value!r} vs {got!r}")
            else:
                check(got == value, f"{path}: {section}.{key}: PyYAML {value!r}, own reader {got!r}")

model = bench.read_config(os.path.join(src, "configs", "gpt.yaml"),
                          ["model.n_layer=12", "model.n_embd=768", "train.batch_size=8",
                           "model.seq_len=0"])
check(model["n_layer"] == 12 and model["n_embd"] == 768 and model["batch_size"] == 8,
      f"--set not applied: {model}")
check(model["seq_len"] == model["block_size"], f"seq_len 0 should mean block_size: {model}")
moe = bench.read_config(os.path.join(src, "configs", "bert_moe.yaml"), [])
check("dp-ep" in bench.strategies_of(moe), f"a model with experts runs dp-ep too: {moe}")

# Prediction errors: each round's beside its median; with a profile per round, their median.
pred, err, rounds = bench.prediction_errors([110.0, 120.0, 100.0], [100.0, 100.0, 125.0], 100.0,
                                            True)
check(pred == 110.0 and abs(err - 0.1) < 1e-12, f"each round: {pred}, {err}")
check([round(e, 12) for e in rounds] == [0.1, 0.2, -0.2], f"round errors: {rounds}")
pred, err, rounds = bench.prediction_errors([90.0, 90.0], [100.0, 80.0], 95.0, False)
check(pred == 90.0 and abs(err - (90.0 - 95.0) / 95.0) < 1e-12, f"one profile: {pred}, {err}")
check([round(e, 12) for e in rounds] == [-0.1, 0.125], f"round errors: {rounds}")

# Identical programs: compared only in the rounds where both runs planned the same one.
programs = {"hap": {0: "P", 1: "Q", 2: "P"}, "dp-cp": {0: "P", 1: "P", 2: "P"},
            "tp": {0: "T", 1: "T", 2: "T"}, "hap-declared": {0: "P", 2: "P"}}
medians = {"hap": {0: 100.0, 1: 90.0, 2: 104.0}, "dp-cp": {0: 102.0, 1: 95.0, 2: 100.0},
           "tp": {0: 300.0, 1: 310.0, 2: 305.0}, "hap-declared": {0: 101.0, 2: 130.0}}
same = bench.identical_programs(["hap", "dp-cp", "tp", "hap-declared"], programs, medians)
pairs = {tuple(p["runs"]): p for p in same}
check(set(pairs) == {("hap", "dp-cp"), ("hap", "hap-declared"), ("dp-cp", "hap-declared")},
      f"pairs of identical programs: {sorted(pairs)}")
hd = pairs.get(("hap", "dp-cp"), {})
check(hd.get("rounds") == [1, 3], f"hap and dp-cp differ in round 2: {hd}")
check([round(g, 12) for g in hd.get("round_gaps", [])] == [0.02, 0.04]
      and abs(hd.get("apart", 0) - 0.03) < 1e-12, f"gaps of hap and dp-cp: {hd}")
hh = pairs.get(("hap", "hap-declared"), {})
check(hh.get("rounds") == [1, 3] and hh.get("round_medians_ms") == [[100.0, 101.0], [104.0, 130.0]],
      f"a run missing a round (failed) is compared where it ran: {hh}")
check(bench.identical_programs(["tp"], programs, medians) == [], "one run: no pair")

build = os.path.dirname(hap_plan)  # describe() runs build/hap-plan from the source folder

# Clusters: a name under configs/clusters or a file; anything else ends the benchmark before its
# first run, with a message that says what there is.
check(bench.cluster_file_of("emu-mixed4") == "configs/clusters/emu-mixed4.yaml", "a cluster name")
for bad, expected in (("nosuch", "no cluster 'nosuch' under configs/clusters (there: "),
                      ("/nonexistent/c.yaml", "no cluster file '/nonexistent/c.yaml'")):
    try:
        bench.cluster_file_of(bad)
        check(False, f"--clusters {bad}: accepted")
    except SystemExit as e:
        check(expected in str(e) and ("emu-2node" in str(e)) == (bad == "nosuch"),
              f"--clusters {bad}: {e}")
with tempfile.TemporaryDirectory() as tmp:
    bad_file = os.path.join(tmp, "bad.yaml")
    with open(bad_file, "w") as f:
        f.write("name: bad\nnodes: []\n")
    try:
        bench.describe(build, bad_file)
        check(False, "a cluster file hap-plan refuses: accepted")
    except SystemExit as e:
        check(f"cluster '{bad_file}'" in str(e) and "nodes" in str(e), f"bad cluster file: {e}")
gpu_file = os.path.join("configs", "clusters", "emu-gpu-mixed4.yaml")
devices = bench.describe(build, gpu_file)
sms = [d["sm_count"] for d in devices]
check(sms == [64, 32, 16, 16], f"emu-gpu-mixed4's SM counts: {sms}")
check(abs(bench.ideal_speedup(devices, "sm_count") - 2.0) < 1e-12,
      f"ideal speed-up of 64/32/16/16 SMs over dp-ev is 128 / (4 x 16) = 2: "
      f"{bench.ideal_speedup(devices, 'sm_count')}")
cpu = bench.describe(build, os.path.join("configs", "clusters", "emu-mixed4.yaml"))
quotas = [d["cpu_quota"] for d in cpu]
check(abs(bench.ideal_speedup(cpu, "cpu_quota") - sum(quotas) / (len(quotas) * min(quotas))) < 1e-12,
      "ideal speed-up from quotas")

with tempfile.TemporaryDirectory() as tmp:
    lifted = bench.memory_lifted(gpu_file, devices, os.path.join(tmp, "lifted.yaml"))
    after = bench.describe(build, lifted)
    largest = max(d["memory_bytes"] for d in devices)
    check([d["memory_bytes"] for d in after] == [largest] * len(devices),
          f"memory lifted to {largest}: {[d['memory_bytes'] for d in after]}")
    for a, b in zip(devices, after):
        rest_a = {k: v for k, v in a.items() if k != "memory_bytes"}
        rest_b = {k: v for k, v in b.items() if k != "memory_bytes"}
        check(rest_a == rest_b, f"only memory changes: {rest_a} vs {rest_b}")

# The benchmark's loop with hap-profile and hap-train stood in for (no GPU, no emulator): GPU
# mode plans on the profiled file, passes train.device=cuda, measures a strategy that does not
# fit the caps again with them lifted (its error kept), and computes the speed-ups from medians.
STEP_MS = {"hap": 10.0, "dp-ev": 20.0, "dp-cp": 12.0, "tp": 30.0}
calls = []


def arg_after(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def sets_of(cmd):
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--set")


def fake_run(cmd, log, fatal=True):
    calls.append(cmd)
    tool = cmd[cmd.index("--") + 1]
    if tool.endswith("hap-profile"):  # the profiled file: the declared one as is
        with open(os.path.join(src, cmd[cmd.index("--") - 1])) as f:
            text = f.read()
        with open(arg_after(cmd, "--out"), "w") as f:
            f.write(text)
        return
    sets = sets_of(cmd)
    strategy = sets["parallel.strategy"]
    cluster = arg_after(cmd, "--cluster")
    if strategy == "dp-ev" and "memory-lifted" not in cluster:
        with open(log, "w") as f:
            f.write("hap-train: error: no program fits in memory: device 3 short by 1 byte\n")
        raise bench.RunFailed(cmd, 1, log)
    with open(sets["train.log_file"], "w") as f:
        for step in range(1, int(sets["train.steps"]) + 1):
            f.write('{"type": "train", "step": %d, "ms_per_step": %f}\n' % (step, STEP_MS[strategy]))
    with open(arg_after(cmd, "--plan-json"), "w") as f:
        f.write('{"predicted_step_s": %f, "ratios": [[0.5, 0.25, 0.125, 0.125]], '
                '"instructions": ["%s"]}' % (STEP_MS[strategy] * 1.05e-3, strategy))


with tempfile.TemporaryDirectory() as tmp:
    bench.run = fake_run
    out = os.path.join(tmp, "gpu.json")
    rc = bench.main(["--device", "cuda", "--build", build, "--steps", "6", "--skip", "2",
                     "--rounds", "2", "--out", out, "--png", os.path.join(tmp, "gpu.png"),
                     "--profile-dir", tmp, "--work", os.path.join(tmp, "runs"),
                     "--set", "data.path=/nowhere"])
    check(rc == 0, f"main returned {rc}")
    import json
    with open(out) as f:
        e = json.load(f)["clusters"]["emu-gpu-mixed4"]
    st = e["strategies"]
    check(set(st) == {"hap", "dp-ev", "dp-cp", "tp"}, f"strategies: {sorted(st)}")
    check(st["dp-ev"]["memory_lifted"] and "no program fits" in st["dp-ev"]["error_under_memory_caps"],
          f"dp-ev measured with memory lifted, its error kept: {st['dp-ev']}")
    check(not st["hap"]["memory_lifted"] and "error_under_memory_caps" not in st["hap"],
          "hap ran under the caps")
    check(all(len(v["step_ms"]) == 2 * 4 for v in st.values()),
          "two rounds of 6 steps less 2 warm-up each")
    check(abs(e["hap_speedup_over_dp_ev"] - 2.0) < 1e-9 and abs(e["ideal_speedup_over_dp_ev"] - 2.0) < 1e-9
          and abs(e["hap_share_of_ideal_speedup"] - 1.0) < 1e-9,
          f"speed-ups: {e.get('hap_speedup_over_dp_ev')}, ideal {e.get('ideal_speedup_over_dp_ev')}")
    check(abs(e["max_abs_prediction_error"] - 0.05) < 1e-6, f"error {e.get('max_abs_prediction_error')}")
    trains = [c for c in calls if c[c.index("--") + 1].endswith("hap-train")]
    check(all("hap-emulate" in " ".join(c[:c.index("--")]) and "--hap-plan" in c for c in calls),
          "every run goes through hap-emulate with --hap-plan")
    check(all(sets_of(c).get("train.device") == "cuda" and sets_of(c).get("data.path") == "/nowhere"
              for c in trains), "train.device=cuda and the --set overrides on every run")
    lifted_runs = [c for c in trains if "memory-lifted" in arg_after(c, "--cluster")]
    check(len(lifted_runs) == 2 and all(sets_of(c)["parallel.strategy"] == "dp-ev" and
                                        "memory-lifted" in c[c.index("--") - 1] for c in lifted_runs),
          "dp-ev's runs after the first failure: emulated and planned with memory lifted, both rounds")
    profiled = [c for c in trains if sets_of(c)["parallel.strategy"] == "hap" and
                "overlap" not in " ".join(c)]
    check(any(arg_after(c, "--cluster") == os.path.join(tmp, "profiled-emu-gpu-mixed4.yaml")
              for c in profiled), "hap planned on the profiled file")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"bench helpers: {len(configs)} configs read alike without PyYAML, --set, memory lifting, "
      f"the ideal speed-up and the GPU benchmark's loop ({len(calls)} stand-in runs) checked")
