#!/usr/bin/env bash
# hap-profile under mpirun: writes a cluster file hap-plan accepts as is (one device per rank,
# positive rates, per-collective link fits, a measured overlap, figures of the lanes between
# nodes, a fixed cost per kernel call from a step measured at
# two sizes); ranks of one kind pool their measurements; ranks of different speeds are rated on the rows a proportional split gives them; one rank profiles compute only and says so; an
# interrupted profile leaves no file behind; bad input exits 2.
# Usage: check_profile.sh MPIEXEC HAP_PROFILE HAP_PLAN SOURCE_DIR
set -u
MPIEXEC=$1 PROFILE=$2 PLAN=$3 SRC=$4
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
CFG="$SRC/configs/gpt-tiny.yaml"
run() { "$MPIEXEC" --allow-run-as-root --oversubscribe "$@"; }

# Two ranks, one node: compute and links.
# (The two ranks are of one kind: --pool-tolerance 1000 makes them pool however busy the
# machine is, so that their figures are alike.)
run -np 2 "$PROFILE" --quick --config "$CFG" --pool-tolerance 1000 --out "$TMP/two.yaml" \
  > "$TMP/two.log" 2>&1 \
  || fail "2-rank profile failed: $(cat "$TMP/two.log")"
grep -q "\[ *[0-9]*/[0-9]*\] node .*: round 2 of 2 (28 collectives" "$TMP/two.log" \
  || fail "no progress lines for the collectives: $(cat "$TMP/two.log")"
"$PLAN" --cluster "$TMP/two.yaml" --describe-cluster > "$TMP/two.json" \
  || fail "hap-plan rejects the profiled file: $(cat "$TMP/two.yaml")"
python3 - "$TMP/two.json" "$TMP/two.yaml" <<'EOF' || exit 1
import json, re, sys
c = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
assert len(c["devices"]) == 2, c
for d in c["devices"]:
    assert d["flops_per_s"] > 1e6 and d["memory_bytes"] > 1e6, d
# A fit per collective where it has 8 samples or more (--quick: 2 sizes, even and uneven, both
# methods), else a note that the link's overall figures price it (all_reduce: one method, 4).
for name in ("all_gather", "reduce_scatter", "all_to_all"):
    assert re.search(name + r": \{bandwidth_bytes_per_s: [0-9.e+-]+, latency_s: ", text), \
        f"no {name} fit in the profiled file"
assert re.search(r"# all_reduce: fewer than 8 samples each, priced by the figures above", text), \
    "no note for all_reduce's 4 samples"
assert "all_reduce: {" not in text, "a fit of all_reduce's own from 4 samples"
# Each rank's step measured at a second size too, a fixed cost per kernel call fitted.
for d in c["devices"]:
    assert 0 <= d["kernel_overhead_s"] < 1e-2, d
seconds = re.findall(r"#   rank \d+: step [0-9.e+-]+ ms on (\d+) examples \([0-9.e+-]+ ms on (\d+); "
                     r"fixed [0-9.e+-]+ ms\)", text)
assert len(seconds) == 2 and all(a != b for a, b in seconds), seconds
# Two ranks of one kind pool their rounds: one set of figures, and the file says so.
a, b = c["devices"]
for key in ("flops_per_s", "memory_bandwidth_bytes_per_s", "kernel_overhead_s",
            "update_s_per_param"):
    assert a[key] == b[key], (key, a, b)
assert "pooled with rank 1;" in text and "pooled with rank 0;" in text, text
# How much of an all-reduce passes beside compute, measured on the node's link and read back.
m = re.search(r"\n +overlap: ([0-9.e+-]+)   # all_reduce of [0-9]+ KiB ([0-9.e+-]+) ms, products "
              r"([0-9.e+-]+) ms, together ([0-9.e+-]+) ms\n", text)
assert m, "no measured overlap in the profiled file"
overlap = float(m.group(1))
assert 0 <= overlap <= 1 and all(float(g) > 0 for g in m.groups()[1:]), m.groups()
assert abs(c["nodes"][0]["link"]["overlap"] - overlap) < 1e-12, c["nodes"][0]["link"]
print("2-rank profile loads:", [round(d["flops_per_s"] / 1e9, 1) for d in c["devices"]], "GFLOP/s,",
      "overlap", overlap)
EOF
"$PLAN" --config "$CFG" --cluster "$TMP/two.yaml" > "$TMP/plan.log" 2>&1 \
  || fail "hap-plan cannot plan on the profiled file: $(cat "$TMP/plan.log")"

# Two nodes of two ranks (named by --node-name): the link between nodes is fitted to collectives
# over all four, and the hierarchical forms' lanes (one rank per node, both lanes at once) get
# figures of their own, which the planner reads.
run -np 2 "$PROFILE" --quick --config "$CFG" --node-name a --out "$TMP/nodes.yaml" : \
  -np 2 "$PROFILE" --quick --config "$CFG" --node-name b --out "$TMP/nodes.yaml" \
  > "$TMP/nodes.log" 2>&1 || fail "2-node profile failed: $(cat "$TMP/nodes.log")"
grep -q "lanes between nodes (2): round 2 of 2" "$TMP/nodes.log" \
  || fail "no progress lines for the lanes: $(cat "$TMP/nodes.log")"
"$PLAN" --cluster "$TMP/nodes.yaml" --describe-cluster > "$TMP/nodes.json" \
  || fail "hap-plan rejects the 2-node profile: $(cat "$TMP/nodes.yaml")"
python3 - "$TMP/nodes.json" <<'EOF' || fail "2-node profile: $(cat "$TMP/nodes.yaml")"
import json, sys
c = json.load(open(sys.argv[1]))
assert [len(n["devices"]) for n in c["nodes"]] == [2, 2], c["nodes"]
inter = c["inter_node"]
assert inter["bandwidth_bytes_per_s"] > 0 and 0 <= inter["overlap"] <= 1, inter
lanes = inter["lanes"]
assert lanes["bandwidth_bytes_per_s"] > 0 and lanes["latency_s"] >= 0, lanes
print("2-node profile: lanes", lanes)
EOF
"$PLAN" --config "$CFG" --cluster "$TMP/nodes.yaml" > "$TMP/nodes-plan.log" 2>&1 \
  || fail "hap-plan cannot plan on the 2-node profile: $(cat "$TMP/nodes-plan.log")"

# Two ranks of different speeds (rank 1's kernels slowed to a tenth): each rank's rate is
# measured again on the rows a split of the batch in proportion to the first rates gives it (the
# operating point), and the file says how many each ran. (Only the kernels are slowed, not what
# the step does between them: a quarter left the steps under 1.7x apart when ctest ran other
# tests beside this one, and an even split of the 4 rows.)
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 1 -x HAP_EMULATE_SPEED=1 "$PROFILE" --quick \
  --config "$CFG" --out "$TMP/mixed.yaml" : -np 1 -x HAP_EMULATE_SPEED=0.1 "$PROFILE" --quick \
  --config "$CFG" --out "$TMP/mixed.yaml" > "$TMP/mixed.log" 2>&1 \
  || fail "mixed-speed profile failed: $(cat "$TMP/mixed.log")"
python3 - "$TMP/mixed.yaml" <<'EOF' || fail "mixed-speed profile: $(cat "$TMP/mixed.yaml")"
import re, sys
text = open(sys.argv[1]).read()
rows = [int(n) for n in re.findall(r"#   rank \d+: step [0-9.e+-]+ ms on (\d+) examples", text)]
assert len(rows) == 2 and sum(rows) == 4 and rows[0] > rows[1] >= 1, rows
# Of one kind by name (no type, no quota) but 10x apart: each keeps its own figures.
assert "pooled with" not in text, text
print("mixed-speed profile: rows per rank", rows)
EOF
"$PLAN" --config "$CFG" --cluster "$TMP/mixed.yaml" > "$TMP/mixed-plan.log" 2>&1 \
  || fail "hap-plan cannot plan on the mixed-speed file: $(cat "$TMP/mixed-plan.log")"

# One rank: compute only, said so, and still a valid file.
run -np 1 "$PROFILE" --quick --config "$CFG" --out "$TMP/one.yaml" > "$TMP/one.log" 2>&1 \
  || fail "1-rank profile failed: $(cat "$TMP/one.log")"
grep -q "one rank: profiling compute only" "$TMP/one.log" || fail "1-rank run did not say compute only"
"$PLAN" --cluster "$TMP/one.yaml" --describe-cluster | grep -q '"rank": 0' || fail "1-rank file unusable"

# Interrupted: no file at --out, no temporary file either.
# (mpirun itself in the background, so that $! is its pid and the signal reaches it.)
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$PROFILE" --config "$CFG" --out "$TMP/cut.yaml" \
  > "$TMP/cut.log" 2>&1 &
pid=$!
sleep 2
kill -INT $pid
wait $pid && fail "an interrupted profile exited 0: $(cat "$TMP/cut.log")"
sleep 0.5
[ ! -e "$TMP/cut.yaml" ] || fail "an interrupted profile left $TMP/cut.yaml"
ls -a "$TMP" | grep -q "cut.yaml.tmp" && fail "an interrupted profile left a temporary file"

# Bad input.
run -np 1 "$PROFILE" --quick --config "$CFG" --out "$TMP" > "$TMP/dir.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "is a directory" "$TMP/dir.log" || fail "--out DIR: exit $rc: $(cat "$TMP/dir.log")"
# An output folder that does not exist is refused before the minutes of profiling, on every rank.
run -np 2 "$PROFILE" --quick --config "$CFG" --out "$TMP/none/x.yaml" > "$TMP/nodir.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "folder '$TMP/none' does not exist" "$TMP/nodir.log" \
  && ! grep -q "hap-profile: \[" "$TMP/nodir.log" \
  || fail "--out in a missing folder: exit $rc: $(cat "$TMP/nodir.log")"
run -np 1 "$PROFILE" --quick --config "$CFG" --out "$TMP/y.yaml" --raw "$TMP/none/r.json" \
  > "$TMP/noraw.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "\-\-raw '$TMP/none/r.json': cannot write: the folder '$TMP/none' does not exist" \
  "$TMP/noraw.log" && [ ! -e "$TMP/y.yaml" ] \
  || fail "--raw in a missing folder: exit $rc: $(cat "$TMP/noraw.log")"
run -np 1 "$PROFILE" --quick --config "$CFG" --pool-tolerance -1 --out "$TMP/x.yaml" \
  > "$TMP/pool.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "pool-tolerance" "$TMP/pool.log" \
  || fail "--pool-tolerance -1: exit $rc: $(cat "$TMP/pool.log")"
run -np 1 "$PROFILE" --quick --config "$TMP/none.yaml" --out "$TMP/x.yaml" > "$TMP/cfg.log" 2>&1; rc=$?
[ $rc -eq 2 ] || fail "missing --config: exit $rc: $(cat "$TMP/cfg.log")"
# NCCL carries GPU ranks' collectives only: CPU ranks asking for it are refused alike.
run -np 2 "$PROFILE" --quick --config "$CFG" --set parallel.backend=nccl --out "$TMP/n.yaml" \
  > "$TMP/nccl.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "nccl needs GPU ranks" "$TMP/nccl.log" \
  || fail "parallel.backend=nccl on CPU ranks: exit $rc: $(cat "$TMP/nccl.log")"
# GPU ranks where there is no GPU: every rank stops with the reason, promptly, and no file.
if ! command -v nvidia-smi > /dev/null; then
  timeout 60 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$PROFILE" --quick \
    --config "$CFG" --set train.device=cuda --out "$TMP/g.yaml" > "$TMP/gpu.log" 2>&1; rc=$?
  # (A build without the CUDA backend says so instead.)
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qE \
    "train.device: (cuda:0: no CUDA device is visible|.*this build or process has no cuda backend)" \
    "$TMP/gpu.log" || fail "train.device=cuda without a GPU: exit $rc: $(cat "$TMP/gpu.log")"
  [ ! -e "$TMP/g.yaml" ] || fail "a failed GPU profile wrote $TMP/g.yaml"
fi
echo "PASS"
