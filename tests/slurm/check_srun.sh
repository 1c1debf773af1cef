#!/usr/bin/env bash
# srun hap-train on a real one-node Slurm cluster (slurmctld + slurmd started by slurm-local.sh,
# 4 CPUs of slots): OpenMPI ranks launched by `srun --mpi=pmix` get their rank and size from
# Slurm's PMIx server, train the emulated 4-device cluster, and print the same losses as mpirun;
# a step of 3 tasks for the 4-device cluster stops with exit 2 (the world size differs).
# Skips (exit 77) where Slurm (Debian's slurm-wlm) is not installed.
# Usage: check_srun.sh MPIEXEC HAP_TRAIN SOURCE_DIR
set -u

if [ "${HAP_SLURM_CHECK_INSIDE:-}" != 1 ]; then
  if [ $# -ne 3 ]; then
    echo "usage: check_srun.sh MPIEXEC HAP_TRAIN SOURCE_DIR" >&2
    exit 2
  fi
  missing=()
  for c in slurmctld slurmd srun sinfo scontrol; do
    PATH="$PATH:/usr/sbin:/sbin" command -v $c > /dev/null || missing+=("$c")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "SKIPPED: Slurm is not installed (no ${missing[*]}): apt-get install slurm-wlm"
    exit 77
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIPPED: the local slurmd needs root to launch tasks"
    exit 77
  fi
  HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  HAP_SLURM_CHECK_INSIDE=1 exec bash "$HERE/slurm-local.sh" --cpus 4 -- bash "${BASH_SOURCE[0]}" "$@"
fi

# ---- inside the local cluster (SLURM_CONF is set) ----
MPIEXEC=$1 TRAIN=$2 SRC=$3
CLUSTER="$SRC/configs/clusters/emu-mixed4.yaml"
# Every rank trains (hap would leave two of them out for this tiny model: not what is tested here).
ARGS=(--config "$SRC/configs/gpt-tiny.yaml" --set train.steps=12 --set train.log_every=4
      --cluster "$CLUSTER" --set parallel.select_devices=false)
source "$SRC/tests/losses.sh"
# 4 ranks on this machine's cores: MPI must yield while it waits, or the spinning ranks starve the
# working ones (mpirun --oversubscribe does this by itself; under srun Slurm's 4 slots look like 4
# cores to OpenMPI).
export OMPI_MCA_mpi_yield_when_idle=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

srun --mpi=list 2>&1 | grep -qw pmix || { echo "this Slurm has no PMIx plugin: $(srun --mpi=list 2>&1)"; exit 1; }
MPI=--mpi=pmix

# Distinct ranks: Slurm tells each task its rank, and OpenMPI's MPI_Init agrees (hap-train would
# otherwise see 4 worlds of 1 rank and refuse the 4-device cluster).
ranks=$(timeout 60 srun -n 4 $MPI bash -c 'echo "$SLURM_PROCID/$SLURM_NTASKS/$SLURM_LOCALID/$PMIX_RANK"' | sort)
[ "$(echo $ranks)" = "0/4/0/0 1/4/1/1 2/4/2/2 3/4/3/3" ] \
  || { echo "srun tasks see SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/PMIX_RANK '$(echo $ranks)'"; exit 1; }
echo "srun -n 4: SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/PMIX_RANK = $(echo $ranks)"

start=$(date +%s)
timeout 120 srun -n 4 $MPI "$TRAIN" "${ARGS[@]}" > "$TMP/srun.out" 2> "$TMP/srun.err"
rc=$?
[ $rc -eq 0 ] || { echo "srun -n 4 hap-train failed (rc=$rc): $(tail -n 20 "$TMP/srun.err")"; exit 1; }
echo "srun -n 4 hap-train: $(( $(date +%s) - start ))s"
grep -q "^hap-train: done on 4 ranks" "$TMP/srun.out" \
  || { echo "srun run did not end with 'done on 4 ranks': $(tail -n 5 "$TMP/srun.out")"; exit 1; }
srun_losses=$(losses < "$TMP/srun.out")
mpi_losses=$(timeout 120 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 4 "$TRAIN" "${ARGS[@]}" | losses) \
  || { echo "mpirun hap-train failed"; exit 1; }
same_losses "srun -n 4" mpirun "$mpi_losses" srun "$srun_losses" || exit 1
echo "srun and mpirun losses match: $(echo $srun_losses)"

# Messages printed before MPI starts come from rank 0 only (its rank read from PMIx/Slurm).
timeout 60 srun -n 4 $MPI "$TRAIN" "${ARGS[@]}" --set train.steps=2 --set train.warmup_steps=1 \
  --set train.checkpoint_dir="$TMP/ck" --resume auto > "$TMP/auto.out" 2>&1
said=$(grep -c "resume auto" "$TMP/auto.out")
[ "$said" = 1 ] || { echo "srun -n 4 --resume auto: said $said times, want once: $(tail -n 5 "$TMP/auto.out")"; exit 1; }
echo "srun -n 4 --resume auto: said once"

# 3 tasks for the 4-device cluster: every rank stops with exit 2.
err=$(timeout 60 srun -n 3 $MPI "$TRAIN" "${ARGS[@]}" 2>&1 > /dev/null)
rc=$?
if [ $rc -ne 2 ] || ! echo "$err" | grep -q "has 4 devices but 3 ranks"; then
  echo "srun -n 3: rc=$rc (want 2), message: $err"; exit 1
fi
echo "srun -n 3: exit 2, $(echo "$err" | grep -m1 'has 4 devices but 3 ranks' | cut -c1-100)"
