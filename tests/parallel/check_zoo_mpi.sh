#!/usr/bin/env bash
# Every zoo model's shipped config under mpirun hap-train on the emulated 4-rank cluster gives the
# training and validation losses of one process (to float reassociation): the datasets read
# per rank, the models' random ops (dropout, masked-LM masking, in training and in evaluation)
# draw by logical position, and the plan is exact.
# Usage: check_zoo_mpi.sh MPIEXEC HAP_TRAIN SOURCE_DIR
set -u
MPIEXEC=$1 TRAIN=$2 SRC=$3
CLUSTER="$SRC/configs/clusters/emu-mixed4.yaml"
source "$SRC/tests/losses.sh"
# Training and validation losses.
losses() { grep -E '\| (val )?loss ' | sed -E 's/.*\| (val )?loss ([0-9.]+).*/\2/'; }

run_case() {
  local name=$1; shift
  local args=(--set train.steps=6 --set train.warmup_steps=1 --set train.log_every=2
              --set train.eval_every=3 --set train.eval_batches=1 --set train.log_file= "$@")
  single=$("$TRAIN" "${args[@]}" | losses) || { echo "$name: single-process run failed"; exit 1; }
  dist=$("$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${args[@]}" \
         --cluster "$CLUSTER" | losses) || { echo "$name: mpirun failed"; exit 1; }
  same_losses "$name" single-process "$single" mpirun "$dist" || exit 1
  echo "$name: losses match: $(echo $dist)"
}

run_case vgg19 --config "$SRC/configs/vgg19.yaml" --set model.width=4 --set model.hidden=32 \
  --set train.batch_size=8 --set model.dropout=0.1
run_case vgg19_bn --config "$SRC/configs/vgg19.yaml" --set model.width=4 --set model.hidden=32 \
  --set train.batch_size=8 --set model.batch_norm=true
run_case vit --config "$SRC/configs/vit.yaml" --set model.n_embd=32 --set model.hidden=48 \
  --set train.batch_size=8 --set model.dropout=0.1
run_case bert --config "$SRC/configs/bert.yaml" --set model.seq_len=16 --set train.batch_size=6 \
  --set model.dropout=0.1
run_case bert_moe --config "$SRC/configs/bert_moe.yaml" --set model.seq_len=16 \
  --set train.batch_size=6 --set model.dropout=0.1 --set model.num_experts=5
run_case bert_moe_dp_ep --config "$SRC/configs/bert_moe.yaml" --set model.seq_len=16 \
  --set train.batch_size=6 --set model.dropout=0.1 --set model.num_experts=5 \
  --set parallel.strategy=dp-ep
run_case bert_mlm --config "$SRC/configs/bert.yaml" --set model.objective=mlm \
  --set model.seq_len=16 --set train.batch_size=6 --set model.dropout=0.1
