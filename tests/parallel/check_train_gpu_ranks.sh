#!/usr/bin/env bash
# GPU ranks (label gpu; exits 77, reported as skipped, without a GPU): checkpoints hold logical
# tensors on GPU ranks too: 2 GPU ranks stop at step 6 and one CPU process resumes, one CPU
# process stops and 2 GPU ranks resume, and both end with the straight CPU run's loss (f32; the
# GPU's sums differ from the CPU's in their last bits, hence 1e-3); and bf16 mixed precision on 2
# GPU ranks trains to within 3% of that loss in 12 steps.
# Usage: check_train_gpu_ranks.sh MPIEXEC HAP_TRAIN SOURCE_DIR [DATA_PATH]
set -u
MPIEXEC=$1 TRAIN=$2 SRC=$3 DATA=${4:-}
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "SKIP: no GPU (nvidia-smi -L fails)"
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$SRC/tests/losses.sh"
ARGS=(--config "$SRC/configs/gpt-tiny.yaml" --set train.steps=12 --set train.log_every=4)
[ -n "$DATA" ] && ARGS+=(--set "data.path=$DATA")
# (Two ranks may share one GPU here: parallel.share_gpus.)
RANKS=(--allow-run-as-root --oversubscribe -np 2 "$TRAIN" "${ARGS[@]}"
       --cluster "$SRC/configs/clusters/two-devices.yaml" --set parallel.share_gpus=true)
last() { losses | tail -n 1; }
near() {  # near WHAT A B TOLERANCE
  python3 -c "import sys; a,b=float('$2'),float('${3:-nan}'); sys.exit(0 if abs(a-b) <= $4*abs(a) else 1)" \
    || { echo "FAIL: $1: loss $3, the straight CPU run's $2"; exit 1; }
}
straight=$("$TRAIN" "${ARGS[@]}" --set train.device=cpu | last)
[ -n "$straight" ] || { echo "FAIL: the straight CPU run printed no loss"; exit 1; }
"$MPIEXEC" "${RANKS[@]}" --set train.device=cuda --quiet --stop-after 6 \
  --save "$TMP/gpu.safetensors" || { echo "FAIL: GPU ranks --save"; exit 1; }
on_cpu=$("$TRAIN" "${ARGS[@]}" --set train.device=cpu --resume "$TMP/gpu.safetensors" | last)
near "GPU ranks -> one CPU process" "$straight" "$on_cpu" 1e-3
"$TRAIN" "${ARGS[@]}" --set train.device=cpu --quiet --stop-after 6 --save "$TMP/cpu.safetensors" \
  || { echo "FAIL: CPU --save"; exit 1; }
on_gpu=$("$MPIEXEC" "${RANKS[@]}" --set train.device=cuda --resume "$TMP/cpu.safetensors" | last)
near "one CPU process -> GPU ranks" "$straight" "$on_gpu" 1e-3
bf16=$("$MPIEXEC" "${RANKS[@]}" --set train.device=cuda --set train.precision=bf16 | last)
near "bf16 on GPU ranks" "$straight" "$bf16" 0.03
echo "GPU ranks: straight $straight, GPU->CPU $on_cpu, CPU->GPU $on_gpu, bf16 $bf16"
echo "PASS"
