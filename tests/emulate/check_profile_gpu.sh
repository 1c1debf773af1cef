#!/usr/bin/env bash
# hap-profile on GPU ranks (label gpu; exits 77, reported as skipped, without a GPU): two ranks
# sharing the GPU write a cluster file hap-plan accepts, with the GPU's type and its GEMMs in f32
# and bf16; on emu-gpu-mixed4 (scripts/hap-emulate: green contexts) every rank writes its SMs back.
# Usage: check_profile_gpu.sh MPIEXEC HAP_PROFILE HAP_PLAN SOURCE_DIR
set -u
MPIEXEC=$1 PROFILE=$2 PLAN=$3 SRC=$4
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIP: no GPU (nvidia-smi -L fails)"
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
CFG="$SRC/configs/gpt-tiny.yaml"
"$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$PROFILE" --quick --config "$CFG" \
  --set train.device=cuda --out "$TMP/two.yaml" > "$TMP/two.log" 2>&1 \
  || fail "2 GPU ranks: $(cat "$TMP/two.log")"
"$PLAN" --cluster "$TMP/two.yaml" --describe-cluster > "$TMP/two.json" \
  || fail "hap-plan rejects the profiled file: $(cat "$TMP/two.yaml")"
python3 - "$TMP/two.json" "$TMP/two.yaml" <<'PY' || exit 1
import json, sys
c = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
assert len(c["devices"]) == 2, c
for d in c["devices"]:
    assert d["flops_per_s"] > 1e6 and d["memory_bytes"] > 1e6 and d["type"] != "cpu", d
assert "bf16" in text and "cuda:0" in text, text
print("2 GPU ranks:", [(d["type"], round(d["flops_per_s"] / 1e9, 1)) for d in c["devices"]])
PY
# On a mixed GPU cluster emulated on this GPU: the SMs written back, the file emulatable again.
"$SRC/scripts/hap-emulate" --hap-plan "$PLAN" --mps off "$SRC/configs/clusters/emu-gpu-mixed4.yaml" \
  -- "$PROFILE" --quick --config "$CFG" --set train.device=cuda --out "$TMP/emu.yaml" \
  > "$TMP/emu.log" 2>&1 || fail "emu-gpu-mixed4: $(cat "$TMP/emu.log")"
"$PLAN" --cluster "$TMP/emu.yaml" --describe-cluster > "$TMP/emu.json" \
  || fail "hap-plan rejects $(cat "$TMP/emu.yaml")"
python3 - "$TMP/emu.json" <<'PY' || exit 1
import json, sys
c = json.load(open(sys.argv[1]))
assert [d["sm_count"] for d in c["devices"]] == [64, 32, 16, 16], c["devices"]
assert [d["type"] for d in c["devices"]] == ["gpu-64sm", "gpu-32sm", "gpu-16sm", "gpu-16sm"], c
print("emu-gpu-mixed4 profiled:", [round(d["flops_per_s"] / 1e9, 1) for d in c["devices"]], "GFLOP/s")
PY
echo "PASS"
