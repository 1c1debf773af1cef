#!/usr/bin/env bash
# scripts/hap-emulate: bad input is refused with exit 2 before anything is created; each rank
# runs in its own cgroup with the declared CPU quota; a two-node file puts the nodes' ranks in
# different network namespaces; everything is removed after a normal exit and after SIGINT.
# Exits 77 (skipped) where this machine cannot create cgroups or namespaces (not root).
# Usage: check_emulate.sh SOURCE_DIR HAP_PLAN
set -u
SRC=$1 PLAN=$2
EMU="$SRC/scripts/hap-emulate"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
leftovers() {
  ls -d /sys/fs/cgroup/cpu/hap-emulate.* /sys/fs/cgroup/hap-emulate.* 2>/dev/null
  ip netns list 2>/dev/null | grep '^hapemu'
}

# ---- bad input: exit 2 and a message naming the problem ----
expect_refusal() {  # expected-text, args...
  local want=$1; shift
  out=$("$EMU" --hap-plan "$PLAN" "$@" 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "hap-emulate $* exited $rc, expected 2: $out"
  echo "$out" | grep -q -- "$want" || fail "hap-emulate $*: message lacks '$want': $out"
  echo "refused as expected: $want"
}
expect_refusal "not an emulated cluster" "$SRC/configs/clusters/hap-paper.yaml" -- true
expect_refusal "expected --np 4" --np 3 "$SRC/configs/clusters/emu-mixed4.yaml" -- true
expect_refusal "'--' before the command is required" "$SRC/configs/clusters/emu-mixed4.yaml" true
expect_refusal "no such cluster file" "$TMP/missing.yaml" -- true
# More quota than cores: refused, unless --scale-to-fit.
cores=$(nproc)
{
  echo "name: too-many"
  echo "nodes:"
  echo "  - link: {bandwidth_bytes_per_s: 1e9, latency_s: 1e-6}"
  echo "    devices:"
  echo "      - {type: cpu, flops_per_s: 1e10, memory_bytes: 1GB, cpu_quota: 1.0, count: $((cores + 1))}"
} > "$TMP/too-many.yaml"
expect_refusal "add up to $((cores + 1)) cores" "$TMP/too-many.yaml" -- true
{
  echo "nodes:"
  echo "  - link: {bandwidth_bytes_per_s: 1e9, latency_s: 1e-6}"
  echo "    devices:"
  echo "      - {type: cpu, flops_per_s: 1e10, memory_bytes: 1GB, cpu_quota: 1.5}"
} > "$TMP/bad-quota.yaml"
expect_refusal "cpu_quota: expected a number in (0, 1]" "$TMP/bad-quota.yaml" -- true
# Clusters emulated on one GPU (sm_count): refusals of what does not go together.
gpu_file() {  # NAME DEVICE-LINES...: a one-node cluster file with those device entries
  local name=$1; shift
  { echo "nodes:"; echo "  - link: {bandwidth_bytes_per_s: 1e9, latency_s: 1e-6}"
    echo "    devices:"; for d in "$@"; do echo "      - {$d}"; done; } > "$TMP/$name.yaml"
}
gpu_file both "type: g, flops_per_s: 1e12, memory_bytes: 1GB, sm_count: 16" \
  "type: c, flops_per_s: 1e10, memory_bytes: 1GB, cpu_quota: 0.5"
expect_refusal "not both" "$TMP/both.yaml" -- true
gpu_file partial "type: g, flops_per_s: 1e12, memory_bytes: 1GB, sm_count: 16" \
  "type: r, flops_per_s: 1e12, memory_bytes: 1GB"
expect_refusal "have no sm_count" "$TMP/partial.yaml" -- true
gpu_file one-device-both "type: g, flops_per_s: 1e12, memory_bytes: 1GB, sm_count: 16, cpu_quota: 0.5"
expect_refusal "sm_count: expected no sm_count on a device with cpu_quota" "$TMP/one-device-both.yaml" -- true
gpu_file zero-sms "type: g, flops_per_s: 1e12, memory_bytes: 1GB, sm_count: 0"
expect_refusal "sm_count: expected an integer" "$TMP/zero-sms.yaml" -- true
expect_refusal "options of CPU-emulated clusters" --throttle ops \
  "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- true
expect_refusal "options of GPU-emulated clusters" --gpu 0 "$SRC/configs/clusters/emu-mixed4.yaml" \
  -- true
[ -z "$(leftovers)" ] || fail "refusals left behind: $(leftovers)"

# On one GPU: every rank gets the partition of the GPU's SMs, its own group and its memory cap,
# and sees only the GPU asked for; no cgroup is made. (Without a GPU, nothing here needs one.)
cat > "$TMP/gpu-env.sh" <<'EOF2'
#!/bin/sh
echo "rank $OMPI_COMM_WORLD_RANK sms=$HAP_EMULATE_SMS group=$HAP_EMULATE_SM_GROUP cap=$HAP_CUDA_MEMORY_CAP visible=$CUDA_VISIBLE_DEVICES mps=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-unset}"
EOF2
chmod +x "$TMP/gpu-env.sh"
out=$(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 "$EMU" --hap-plan "$PLAN" --mps off \
  "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- "$TMP/gpu-env.sh" 2>&1) \
  || fail "hap-emulate on emu-gpu-mixed4 exited $?: $out"
echo "$out"
for want in "rank 0 sms=64,32,16,16 group=0 cap=25769803776 visible=0 mps=unset" \
            "rank 1 sms=64,32,16,16 group=1 cap=12884901888 visible=0 mps=unset" \
            "rank 3 sms=64,32,16,16 group=3 cap=2147483648 visible=0 mps=unset" \
            "without MPS: the ranks' kernels take turns"; do
  echo "$out" | grep -qF -- "$want" || fail "hap-emulate on emu-gpu-mixed4 lacks '$want': $out"
done
out=$(CUDA_VISIBLE_DEVICES=5,7 "$EMU" --hap-plan "$PLAN" --mps off --gpu 1 \
  "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- "$TMP/gpu-env.sh" 2>&1) \
  || fail "hap-emulate --gpu 1 exited $?: $out"
echo "$out" | grep -qF "rank 2 sms=64,32,16,16 group=2 cap=6442450944 visible=7" \
  || fail "hap-emulate --gpu 1 with CUDA_VISIBLE_DEVICES=5,7: $out"
out=$(CUDA_VISIBLE_DEVICES=3 "$EMU" --hap-plan "$PLAN" --gpu 1 \
  "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- true 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -qF "CUDA_VISIBLE_DEVICES=3 makes 1 GPU(s) visible" \
  || fail "--gpu 1 with one GPU visible: exit $rc: $out"
if ! command -v nvidia-cuda-mps-control > /dev/null; then
  out=$(PATH=/usr/bin:/bin "$EMU" --hap-plan "$PLAN" --mps on \
    "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- true 2>&1); rc=$?
  [ $rc -eq 3 ] && echo "$out" | grep -qF "nvidia-cuda-mps-control is not on PATH" \
    || fail "--mps on without MPS: exit $rc: $out"
fi
# A stand-in MPS control program: one whose daemon keeps what it was given open (as a forked
# daemon does) must not hold hap-emulate, and one that fails is a warning with what it said (auto),
# naming its words; the ranks then run without MPS. HAP_EMULATE_MPS sets the mode; a bad one is a
# usage error.
mkdir -p "$TMP/mps-bin"
cat > "$TMP/mps-bin/nvidia-cuda-mps-control" <<'EOF2'
#!/bin/sh
if [ "${1:-}" = "-d" ]; then
  [ -n "${FAKE_MPS_FAIL:-}" ] && { echo "fake MPS: no GPU here"; exit 1; }
  (sleep 60 &)  # a daemon holding the descriptors it inherited
  exit 0
fi
cat > /dev/null  # 'quit'
EOF2
chmod +x "$TMP/mps-bin/nvidia-cuda-mps-control"
t0=$SECONDS
out=$(PATH="$TMP/mps-bin:$PATH" HAP_EMULATE_MPS=on "$EMU" --hap-plan "$PLAN" \
  "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- "$TMP/gpu-env.sh" 2>&1) \
  || fail "hap-emulate under a stand-in MPS daemon exited $?: $out"
[ $((SECONDS - t0)) -lt 30 ] || fail "hap-emulate waited on the MPS daemon: $((SECONDS - t0)) s"
echo "$out" | grep -qF "under a private MPS daemon" || fail "HAP_EMULATE_MPS=on: no MPS: $out"
out=$(PATH="$TMP/mps-bin:$PATH" FAKE_MPS_FAIL=1 "$EMU" --hap-plan "$PLAN" \
  "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- "$TMP/gpu-env.sh" 2>&1) \
  || fail "hap-emulate with a failing MPS daemon (auto) exited $?: $out"
echo "$out" | grep -qF "fake MPS: no GPU here" && echo "$out" | grep -qF "without MPS" \
  || fail "a failing MPS daemon (auto) is not a warning naming its words: $out"
out=$(HAP_EMULATE_MPS=sometimes "$EMU" --hap-plan "$PLAN" \
  "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- true 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -qF "HAP_EMULATE_MPS=sometimes: expected auto, on or off" \
  || fail "HAP_EMULATE_MPS=sometimes: exit $rc: $out"
# Training on it without a GPU: every rank stops with the reason, promptly, never a hang.
if ! command -v nvidia-smi > /dev/null; then
  t0=$SECONDS
  out=$(timeout 120 "$EMU" --hap-plan "$PLAN" --mps off \
    "$SRC/configs/clusters/emu-gpu-mixed4.yaml" -- "$(dirname "$PLAN")/hap-train" \
    --config "$SRC/configs/gpt-tiny.yaml" --cluster "$SRC/configs/clusters/emu-gpu-mixed4.yaml" \
    --set train.device=cuda --set train.steps=3 2>&1); rc=$?
  { [ $rc -ne 0 ] && [ $rc -ne 124 ]; } || fail "hap-train on emu-gpu-mixed4 without a GPU: exit $rc: $out"
  # (A build without the CUDA backend says so instead.)
  echo "$out" | grep -qE "no CUDA device is visible|this build or process has no cuda backend" \
    || fail "hap-train on emu-gpu-mixed4 without a GPU does not say why: $out"
  echo "without a GPU: every rank stopped in $((SECONDS - t0)) s, exit $rc, naming why"
fi
[ -z "$(leftovers)" ] || fail "the GPU emulation left behind: $(leftovers)"

# ---- the real thing needs root and a cgroup CPU controller ----
if [ "$(id -u)" != 0 ] || ! mkdir /sys/fs/cgroup/cpu/hap-emulate-probe.$$ 2>/dev/null; then
  echo "SKIP: cannot create cgroups here (not root, or no cgroup v1 cpu controller)"
  exit 77
fi
rmdir /sys/fs/cgroup/cpu/hap-emulate-probe.$$

# Each rank reports its cgroup's quota and period; they must match the file's cpu_quota.
cat > "$TMP/report.sh" <<'EOF'
#!/bin/sh
group=$(grep -E '^[0-9]+:([^:]*,)?cpu(,[^:]*)?:' /proc/self/cgroup | head -1 | cut -d: -f3)
# (Inside a network namespace /sys is remounted without the cgroup tree: q and p stay empty.)
q=$(cat "/sys/fs/cgroup/cpu$group/cpu.cfs_quota_us" 2>/dev/null)
p=$(cat "/sys/fs/cgroup/cpu$group/cpu.cfs_period_us" 2>/dev/null)
echo "rank $OMPI_COMM_WORLD_RANK group ${group##*/} quota $q period $p threads $OMP_NUM_THREADS node $HAP_NODE_NAME netns $(ip netns identify $$)"
EOF
chmod +x "$TMP/report.sh"
# The ranks' reports are read from stdout alone: mpirun forwards every rank's stderr too, and
# pieces of it could land inside a report line.
out=$("$EMU" --hap-plan "$PLAN" "$SRC/configs/clusters/emu-mixed4.yaml" -- "$TMP/report.sh" \
      2> "$TMP/emu.err") || fail "emu-mixed4 run failed: $out $(cat "$TMP/emu.err")"
echo "$out"; cat "$TMP/emu.err"
# The default period is 10 ms (every quota stays above the kernel's 1 ms minimum).
for want in "rank 0 group rank0 quota 8000 period 10000 threads 1" "rank 1 group rank1 quota 4000 period 10000" \
            "rank 2 group rank2 quota 2000 period 10000" "rank 3 group rank3 quota 2000 period 10000"; do
  echo "$out" | grep -q "$want" || fail "missing '$want'"
done
[ -z "$(leftovers)" ] || fail "left behind after a normal exit: $(leftovers)"

# --throttle ops: every rank capped at one core, its kernels slowed to its cpu_quota of full
# speed (HAP_EMULATE_SPEED, read by the op dispatcher); no speed without it. A bad mode is refused.
printf '#!/bin/sh\ngroup=$(grep -E "^[0-9]+:([^:]*,)?cpu(,[^:]*)?:" /proc/self/cgroup | head -1 | cut -d: -f3)\necho "rank $OMPI_COMM_WORLD_RANK quota $(cat /sys/fs/cgroup/cpu$group/cpu.cfs_quota_us) speed ${HAP_EMULATE_SPEED:-none}"\n' > "$TMP/speed.sh"
chmod +x "$TMP/speed.sh"
out=$("$EMU" --hap-plan "$PLAN" --throttle ops "$SRC/configs/clusters/emu-mixed4.yaml" -- \
      "$TMP/speed.sh" 2> "$TMP/emu.err") || fail "--throttle ops run failed: $out $(cat "$TMP/emu.err")"
echo "$out"
for want in "rank 0 quota 10000 speed 0.8" "rank 1 quota 10000 speed 0.4" \
            "rank 2 quota 10000 speed 0.2" "rank 3 quota 10000 speed 0.2"; do
  echo "$out" | grep -q "$want" || fail "--throttle ops: missing '$want'"
done
out=$("$EMU" --hap-plan "$PLAN" "$SRC/configs/clusters/emu-mixed4.yaml" -- "$TMP/speed.sh" \
      2> "$TMP/emu.err") || fail "default run failed: $out $(cat "$TMP/emu.err")"
echo "$out" | grep -q "rank 3 quota 2000 speed none" || fail "cfs mode set a speed: $out"
"$EMU" --hap-plan "$PLAN" --throttle fast "$SRC/configs/clusters/emu-mixed4.yaml" -- true \
  > "$TMP/bad.log" 2>&1 && fail "--throttle fast was accepted"
grep -q "invalid choice: 'fast'" "$TMP/bad.log" || fail "--throttle fast: $(cat "$TMP/bad.log")"
[ -z "$(leftovers)" ] || fail "left behind after the throttle runs: $(leftovers)"

# The file states compute in cores: hap-emulate resolves one core's rate unthrottled (measured
# once, then cached per machine) and hands the same figure to every rank in HAP_CORE_FLOPS.
printf '#!/bin/sh\necho "rank $OMPI_COMM_WORLD_RANK core $HAP_CORE_FLOPS"\n' > "$TMP/core.sh"
chmod +x "$TMP/core.sh"
for round in measured cached; do
  out=$(env -u HAP_CORE_FLOPS HAP_CACHE_DIR="$TMP/cache" "$EMU" --hap-plan "$PLAN" \
        "$SRC/configs/clusters/emu-mixed4.yaml" -- "$TMP/core.sh" 2> "$TMP/emu.err") \
    || fail "emu-mixed4 core-rate run failed: $out $(cat "$TMP/emu.err")"
  echo "$out"; cat "$TMP/emu.err"
  rates=$(echo "$out" | grep '^rank [0-3] core ' | sed 's/.* core //' | sort -u)
  [ "$(echo "$out" | grep -c '^rank [0-3] core [0-9]')" = 4 ] && [ "$(echo "$rates" | wc -l)" = 1 ] \
    || fail "expected one per-core rate on all 4 ranks, got: $out"
  [ "$round" = measured ] && first=$rates
  [ "$rates" = "$first" ] || fail "the cached rate $rates differs from the measured $first"
  want="(measured now (cached in $TMP/cache/core-flops.json))"
  [ "$round" = cached ] && want="(cached in $TMP/cache/core-flops.json"
  grep -qF "one CPU core: " "$TMP/emu.err" && grep -qF "$want" "$TMP/emu.err" \
    || fail "round $round: the emulator's note lacks '$want': $(cat "$TMP/emu.err")"
done
grep -q '"flops_per_s"' "$TMP/cache/core-flops.json" || fail "no cache written"

# Two nodes: ranks 0-1 in one namespace, 2-3 in another; traffic between them is shaped.
SIGINT_CLUSTER="$SRC/configs/clusters/emu-mixed4.yaml"
if ip netns add hapemu-probe.$$ 2>/dev/null; then
  ip netns del hapemu-probe.$$
  SIGINT_CLUSTER="$SRC/configs/clusters/emu-2node.yaml"  # namespaces too
  out=$("$EMU" --hap-plan "$PLAN" "$SRC/configs/clusters/emu-2node.yaml" -- "$TMP/report.sh" \
        2> "$TMP/emu.err") || fail "emu-2node run failed: $out $(cat "$TMP/emu.err")"
  echo "$out"; cat "$TMP/emu.err"
  ns0=$(echo "$out" | grep "^rank 0 " | sed 's/.*netns //') ns1=$(echo "$out" | grep "^rank 1 " | sed 's/.*netns //')
  ns2=$(echo "$out" | grep "^rank 2 " | sed 's/.*netns //') ns3=$(echo "$out" | grep "^rank 3 " | sed 's/.*netns //')
  [ -n "$ns0" ] && [ "$ns0" = "$ns1" ] && [ -n "$ns2" ] && [ "$ns2" = "$ns3" ] && [ "$ns0" != "$ns2" ] \
    || fail "expected ranks 0,1 and 2,3 in two different namespaces, got '$ns0' '$ns1' '$ns2' '$ns3': $out"
  echo "$out" | grep -q "rank 2 .*node b" || fail "rank 2 should emulate node b"
  for r in 0 1 2 3; do
    echo "$out" | grep -q "^rank $r group rank$r " || fail "rank $r is not in its own cgroup: $out"
  done
  [ -z "$(leftovers)" ] || fail "left behind after a two-node run: $(leftovers)"
else
  echo "note: no network namespaces here; two-node check skipped"
fi

# SIGINT (Ctrl-C) in the middle of a run: exit 130, nothing left behind.
"$EMU" --hap-plan "$PLAN" "$SIGINT_CLUSTER" -- sleep 60 > "$TMP/int.log" 2>&1 &
pid=$!
for _ in $(seq 50); do [ -n "$(leftovers)" ] && break; sleep 0.1; done
[ -n "$(leftovers)" ] || fail "the emulator did not start: $(cat "$TMP/int.log")"
sleep 1
kill -INT $pid
wait $pid; rc=$?
[ $rc -eq 130 ] || fail "after SIGINT the emulator exited $rc, expected 130: $(cat "$TMP/int.log")"
for _ in $(seq 20); do [ -z "$(leftovers)" ] && break; sleep 0.1; done
[ -z "$(leftovers)" ] || fail "left behind after SIGINT: $(leftovers)"
pgrep -f "hap-emulate.*sleep 60" > /dev/null && fail "ranks still running after SIGINT"
echo "PASS"
