#!/usr/bin/env bash
# mpirun hap-train against one process: the same config must give the same losses (to float
# reassociation), and a world size that differs from the cluster must stop every rank with exit 2.
# Also: a plan written by hap-plan --json runs as is, and a plan for another cluster or with ratios
# that do not sum to 1 is refused with exit 2, and so is a checkpoint of another model or past the
# schedule, on ranks as on one process.
# Usage: check_train_mpi.sh MPIEXEC HAP_TRAIN HAP_PLAN SOURCE_DIR
set -u
MPIEXEC=$1 TRAIN=$2 PLAN=$3 SRC=$4
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
CFG="$SRC/configs/gpt-tiny.yaml"
CLUSTER="$SRC/configs/clusters/emu-mixed4.yaml"
# Every rank trains below (hap would leave two of them out for this tiny model) but where said.
ARGS=(--config "$CFG" --set train.steps=12 --set train.log_every=4 --set model.dropout=0.1
      --set parallel.select_devices=false)
source "$SRC/tests/losses.sh"

single=$("$TRAIN" "${ARGS[@]}" | losses) || { echo "single-process run failed"; exit 1; }
for strategy in hap dp-ev tp; do
  dist=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
         --set parallel.strategy="$strategy" | losses) || { echo "mpirun ($strategy) failed"; exit 1; }
  same_losses "$strategy" single-process "$single" mpirun "$dist" || exit 1
  echo "$strategy: losses match: $(echo $dist)"
done

# hap's own choice of devices: for this tiny model it predicts the fastest devices alone faster
# (the one fastest since the cross-entropy's own all-reduces are priced, the two fastest before)
# and leaves the others out; the losses are one process's.
chosen=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
         --set parallel.select_devices=true 2>&1) || { echo "mpirun with device selection failed: $chosen"; exit 1; }
echo "$chosen" | grep -Eq "^devices: runs on the [123] fastest devices" \
  || { echo "device selection: hap did not leave devices out: $(echo "$chosen" | head -5)"; exit 1; }
same_losses "device selection" single-process "$single" mpirun "$(echo "$chosen" | losses)" || exit 1
# A pinned device subset: 4 ranks launched, the program runs on cpu0 and cpu2 only, the other
# two ranks wait (saying so) and every rank exits 0; the losses are one process's. A plan file of
# that program (hap-plan --json) names its devices and runs as is; a name the cluster lacks is a
# config error (exit 2) naming the key.
subset=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
         --set parallel.devices=cpu0,cpu2 2>&1) || { echo "mpirun on a device subset failed: $subset"; exit 1; }
[ "$(echo "$subset" | grep -c "is left out by the plan")" -eq 2 ] \
  || { echo "device subset: expected two ranks left out: $subset"; exit 1; }
echo "$subset" | grep -q "done on 2 ranks" || { echo "device subset: not done on 2 ranks: $subset"; exit 1; }
same_losses "device subset" single-process "$single" mpirun "$(echo "$subset" | losses)" || exit 1
"$PLAN" "${ARGS[@]}" --cluster "$CLUSTER" --set parallel.devices=cpu1,cpu3 --json "$TMP/subset.json" \
  > "$TMP/subset.plan" || { echo "hap-plan on a device subset failed"; exit 1; }
grep -q "^devices: runs on the 2 devices pinned; left out: cpu0, cpu2" "$TMP/subset.plan" \
  || { echo "hap-plan does not say which devices it left out: $(head -5 "$TMP/subset.plan")"; exit 1; }
from_file=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
            --plan "$TMP/subset.json" | losses) || { echo "mpirun --plan of a device subset failed"; exit 1; }
same_losses "device subset plan file" single-process "$single" mpirun "$from_file" || exit 1
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" --quiet \
  --set parallel.devices=cpu0,gpu7 2> "$TMP/badsubset.err"
rc=$?
[ $rc -eq 2 ] && grep -q "parallel.devices: the cluster 'emu-mixed4' has no device 'gpu7'" "$TMP/badsubset.err" \
  || { echo "an unknown pinned device: rc=$rc: $(cat "$TMP/badsubset.err")"; exit 1; }
echo "device subsets: losses match, two ranks left out, plan file runs, unknown names refused"

# bf16 mixed precision on ranks: the casts are part of the planned graph, so the distributed
# program runs the same recipe as one process (losses within the same 2e-4; a row-parallel
# product's partial sums meet in an all-reduce of bf16 values, summed in f32 and rounded once).
single16=$("$TRAIN" "${ARGS[@]}" --set train.precision=bf16 | losses) \
  || { echo "single-process bf16 run failed"; exit 1; }
for strategy in hap tp; do
  dist16=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
           --set train.precision=bf16 --set parallel.strategy="$strategy" | losses) \
    || { echo "mpirun bf16 ($strategy) failed"; exit 1; }
  same_losses "bf16 $strategy" single-process "$single16" mpirun "$dist16" || exit 1
  echo "bf16 $strategy: losses match: $(echo $dist16)"
done

# Rank 0 writes the JSONL metrics log.
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" --quiet \
  --set train.log_file="$TMP/run.jsonl" || { echo "mpirun with a log failed"; exit 1; }
for kind in config train eval done; do
  grep -q "\"type\":\"$kind\"" "$TMP/run.jsonl" || { echo "no $kind record in the JSONL log"; exit 1; }
done
echo "JSONL log written"
# --trace on ranks: one timeline file, one track per rank named after its device, each with the
# traced steps, its ops and its collectives (and the waits inside them).
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" --quiet \
  --trace "$TMP/trace.json" --trace-steps 3-4 || { echo "mpirun --trace failed"; exit 1; }
python3 - "$TMP/trace.json" <<'PY' || exit 1
import collections, json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
assert sorted(names) == [0, 1, 2, 3] and all(n.startswith(f"rank {p}: ") for p, n in names.items()), names
for pid in range(4):
    mine = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
    cats = collections.Counter(e["cat"] for e in mine)
    steps = [e["name"] for e in mine if e["cat"] == "step"]
    assert steps == ["step 3", "step 4"], (pid, steps)
    assert cats["op"] > 50 and cats["collective"] > 0 and cats["wait"] > 0, (pid, cats)
print("trace:", len(events), "events,", ", ".join(names[p] for p in sorted(names)))
PY

# Checkpoints hold logical tensors: stop on 4 ranks, resume on one process, and the other way
# round; both end with the loss of the straight run.
last() { tail -n 1; }
straight=$(echo "$single" | last)
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" --quiet \
  --stop-after 6 --save "$TMP/dist.safetensors" || { echo "mpirun --save failed"; exit 1; }
resumed=$("$TRAIN" "${ARGS[@]}" --resume "$TMP/dist.safetensors" | losses | last)
"$TRAIN" "${ARGS[@]}" --quiet --stop-after 6 --save "$TMP/one.safetensors" || { echo "--save failed"; exit 1; }
resumed_dist=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
               --resume "$TMP/one.safetensors" | losses | last)
for r in "$resumed" "$resumed_dist"; do
  python3 -c "import sys; a,b=float('$straight'),float('${r:-nan}'); sys.exit(0 if abs(a-b) <= 2e-4*abs(a) else 1)" \
    || { echo "resumed run ends at loss '$r', the straight run at $straight"; exit 1; }
done
echo "checkpoints resume across plans: $straight $resumed $resumed_dist"
# Periodic checkpoints: one process stops at step 7 with checkpoints every 3 steps; ranks resume
# from the newest with --resume auto and end where the straight run ends.
"$TRAIN" "${ARGS[@]}" --quiet --set train.checkpoint_every=3 --set train.checkpoint_dir="$TMP/ck" \
  --stop-after 7 || { echo "periodic checkpoints failed"; exit 1; }
[ -f "$TMP/ck/step_00000006.safetensors" ] && [ -f "$TMP/ck/step_00000007.safetensors" ] \
  || { echo "periodic checkpoints: $(ls "$TMP/ck")"; exit 1; }
auto=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
       --set train.checkpoint_every=3 --set train.checkpoint_dir="$TMP/ck" --resume auto | losses | last)
python3 -c "import sys; a,b=float('$straight'),float('${auto:-nan}'); sys.exit(0 if abs(a-b) <= 2e-4*abs(a) else 1)" \
  || { echo "--resume auto on ranks ends at '$auto', the straight run at $straight"; exit 1; }
echo "--resume auto on ranks from a periodic checkpoint: $auto"
# SIGTERM to one rank: every rank stops after the same step, rank 0 writes the checkpoint, and the
# job exits 143 within a second or two.
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" --quiet \
  --set train.steps=10000000 --set train.warmup_steps=0 --set train.checkpoint_dir="$TMP/sig" \
  2> "$TMP/sig.err" &
job=$!
for _ in $(seq 60); do [ "$(pgrep -P $job | wc -l)" -ge 4 ] && break; sleep 0.5; done
sleep 3
kill -TERM "$(pgrep -P $job | tail -1)"
start=$(date +%s)
wait $job
rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -eq 143 ] && grep -q "stopped by signal 15" "$TMP/sig.err" && ls "$TMP/sig"/step_*.safetensors > /dev/null \
  && [ $elapsed -le 10 ] || { echo "SIGTERM to one rank: rc=$rc after ${elapsed}s: $(cat "$TMP/sig.err")"; exit 1; }
echo "SIGTERM to one rank: every rank stopped, $(ls "$TMP/sig"), exit 143 in ${elapsed}s"
# SIGTERM to mpirun itself: it forwards the signal to every rank, which stop after the same step
# and write the checkpoint (mpirun then exits non-zero on its own terms).
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" --quiet \
  --set train.steps=10000000 --set train.warmup_steps=0 --set train.checkpoint_dir="$TMP/sigrun" \
  > "$TMP/sigrun.out" 2>&1 &
job=$!
for _ in $(seq 60); do [ "$(pgrep -P $job | wc -l)" -ge 4 ] && break; sleep 0.5; done
sleep 3
kill -TERM $job
wait $job
rc=$?
[ $rc -ne 0 ] && grep -q "stopped by signal 15" "$TMP/sigrun.out" && ls "$TMP/sigrun"/step_*.safetensors > /dev/null \
  || { echo "SIGTERM to mpirun: rc=$rc: $(tail -c 1000 "$TMP/sigrun.out")"; exit 1; }
echo "SIGTERM to mpirun: every rank stopped, $(ls "$TMP/sigrun"), mpirun exit $rc"
# A killed rank: SIGKILL to one rank mid-run ends the job; relaunched with --resume auto, it
# finishes with a final checkpoint byte-identical to that of an uninterrupted run.
# (Same config, folder included: the config's digest is part of the checkpoint.)
KILL_ARGS=("${ARGS[@]}" --cluster "$CLUSTER" --quiet --set train.steps=600 --set train.warmup_steps=0
           --set train.checkpoint_every=50 --set train.checkpoint_dir="$TMP/killed")
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${KILL_ARGS[@]}" \
  || { echo "the uninterrupted run failed"; exit 1; }
mv "$TMP/killed/step_00000600.safetensors" "$TMP/straight.safetensors" && rm -rf "$TMP/killed"
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${KILL_ARGS[@]}" 2> "$TMP/killed.err" &
job=$!
for _ in $(seq 600); do [ -f "$TMP/killed/step_00000100.safetensors" ] && break; sleep 0.05; done
victim=$(pgrep -P $job | tail -1)
kill -KILL "$victim"
wait $job
rc=$?
[ $rc -ne 0 ] && [ ! -f "$TMP/killed/step_00000600.safetensors" ] \
  || { echo "SIGKILL to rank pid $victim: the job exited $rc with $(ls "$TMP/killed")"; exit 1; }
resumed_from=$(ls "$TMP/killed" | tail -1)
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${KILL_ARGS[@]}" --resume auto > /dev/null \
  || { echo "the relaunch with --resume auto failed"; exit 1; }
cmp "$TMP/straight.safetensors" "$TMP/killed/step_00000600.safetensors" \
  || { echo "the relaunched run's final checkpoint differs from the uninterrupted run's"; exit 1; }
echo "SIGKILL to one rank (exit $rc), relaunched from $resumed_from: final checkpoint byte-identical"
# The watchdog: a stopped rank (SIGSTOP) no longer hangs the others; they stop within the
# collective timeout, naming the collective and the step.
timeout -s KILL 120 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" \
  --cluster "$CLUSTER" --quiet --set train.steps=10000000 --set train.warmup_steps=0 \
  --set parallel.collective_timeout_s=2 2> "$TMP/watchdog.err" &
job=$!
for _ in $(seq 60); do [ "$(pgrep -f "collective_timeout_s=2" | wc -l)" -ge 6 ] && break; sleep 0.5; done
sleep 3
stopped=$(pgrep -f "collective_timeout_s=2" | tail -1)
kill -STOP "$stopped"
start=$(date +%s)
wait $job
rc=$?
elapsed=$(( $(date +%s) - start ))
kill -KILL "$stopped" 2> /dev/null
[ $rc -ne 0 ] && grep -q "did not complete within parallel.collective_timeout_s = 2 s at step" "$TMP/watchdog.err" \
  && [ $elapsed -le 60 ] || { echo "watchdog: rc=$rc after ${elapsed}s: $(head -c 2000 "$TMP/watchdog.err")"; exit 1; }
echo "watchdog: a stopped rank ends the job in ${elapsed}s: $(grep -m1 'did not complete' "$TMP/watchdog.err" | cut -c1-120)"
# A checkpoint of another model or past the schedule is refused on ranks as on one process.
for case in "model.n_layer=1:this model does not have" "model.vocab_size=300:but the model's is" \
            "train.steps=5:past this run's train.steps"; do
  set_arg=${case%%:*} want=${case#*:}
  for launcher in one ranks; do
    if [ $launcher = one ]; then
      err=$("$TRAIN" "${ARGS[@]}" --set "$set_arg" --set train.warmup_steps=0 --resume "$TMP/one.safetensors" 2>&1 >/dev/null)
    else
      err=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
            --set "$set_arg" --set train.warmup_steps=0 --resume "$TMP/one.safetensors" 2>&1 >/dev/null)
    fi
    rc=$?
    [ $rc -ne 0 ] && echo "$err" | grep -q "$want" \
      || { echo "resume with $set_arg ($launcher): rc=$rc, message: $err"; exit 1; }
  done
  echo "resume with $set_arg refused: $want"
done
# Resumed with another train.seed: dropout keeps the checkpoint's seed (batches follow
# train.seed), on one process and on ranks alike.
reseeded=$("$TRAIN" "${ARGS[@]}" --set train.seed=7 --resume "$TMP/one.safetensors" | losses | last)
reseeded_dist=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
                --set train.seed=7 --resume "$TMP/one.safetensors" | losses | last)
python3 -c "import sys; a,b=float('${reseeded:-nan}'),float('${reseeded_dist:-nan}'); sys.exit(0 if abs(a-b) <= 2e-5*abs(a) else 1)" \
  || { echo "resumed with train.seed=7: one process ends at '$reseeded', 4 ranks at '$reseeded_dist'"; exit 1; }
echo "resumed with another train.seed: $reseeded $reseeded_dist"

# A saved plan runs as is.
"$PLAN" --config "$CFG" --cluster "$CLUSTER" --set model.dropout=0.1 --json "$TMP/plan.json" > /dev/null || { echo "hap-plan failed"; exit 1; }
planned=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
          --plan "$TMP/plan.json" | losses) || { echo "mpirun --plan failed"; exit 1; }
[ "$(echo $planned)" = "$(echo $dist)" ] || { echo "--plan losses '$planned' differ from '$dist'"; exit 1; }
echo "--plan: losses match"
err=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" --quiet \
      --set train.steps=2 --plan-json /dev/null/plan.json 2>&1 >/dev/null) \
  && { echo "--plan-json to an unwritable path succeeded"; exit 1; }
echo "$err" | grep -q "cannot write" || { echo "--plan-json unwritable: message '$err'"; exit 1; }
echo "--plan-json to an unwritable path is refused"
# Refused plans: another cluster; ratios that do not sum to 1.
"$PLAN" --config "$CFG" --cluster "$SRC/configs/clusters/emu-2node.yaml" --set model.dropout=0.1 \
        --json "$TMP/other.json" > /dev/null || { echo "hap-plan failed"; exit 1; }
python3 -c "import json; p=json.load(open('$TMP/plan.json')); p['ratios'][0][0] += 0.1; json.dump(p, open('$TMP/bad.json', 'w'))"
for case in "other.json:made for another cluster" "bad.json:sum to"; do
  file=${case%%:*} want=${case#*:}
  err=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
        --plan "$TMP/$file" 2>&1 >/dev/null)
  rc=$?
  [ $rc -ne 0 ] && echo "$err" | grep -q "$want" || { echo "$file: rc=$rc, message: $err"; exit 1; }
  echo "$file refused: $want"
done

start=$(date +%s)
err=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 3 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" 2>&1 >/dev/null)
rc=$?
elapsed=$(( $(date +%s) - start ))
if [ $rc -eq 0 ] || ! echo "$err" | grep -q "has 4 devices but 3 ranks"; then
  echo "world-size mismatch: rc=$rc, message: $err"; exit 1
fi
[ $elapsed -le 30 ] || { echo "world-size mismatch took ${elapsed}s to stop"; exit 1; }
echo "world-size mismatch stops every rank (rc=$rc, ${elapsed}s)"

# NCCL for CPU ranks is a configuration error on every rank (exit 2).
err=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" --cluster "$CLUSTER" \
  --set parallel.backend=nccl 2>&1 >/dev/null)
rc=$?
if [ $rc -ne 2 ] || ! echo "$err" | grep -q "parallel.backend: nccl needs GPU ranks"; then
  echo "nccl on CPU ranks: rc=$rc, message: $err"; exit 1
fi
echo "nccl on CPU ranks refused (rc=$rc)"
