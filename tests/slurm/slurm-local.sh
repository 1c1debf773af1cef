#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this host, for tests: starts slurmctld and slurmd (and
# munged, where the installed Slurm has no auth/none) from a temporary folder with their own
# slurm.conf, waits until the node is idle, runs COMMAND with SLURM_CONF pointing at that
# cluster, then stops the daemons and removes the folder. Exits with COMMAND's status, or 1 when
# the cluster did not come up (the daemons' logs are printed).
#
# Usage: slurm-local.sh [--cpus N] [--features LIST] [--] COMMAND [ARG...]
#
#   --cpus N          CPUs (task slots) the node offers (default 4; may exceed the real cores:
#                     slurmd takes the configured figure, SlurmdParameters=config_overrides)
#   --features LIST   node features (comma-separated), for --constraint
#
# Everything lives under one mktemp folder: slurm.conf, StateSaveLocation, SlurmdSpoolDir, pid
# and log files (and munged's key, socket and seed). Ports: two free ones picked from 20000-29999
# (below the kernel's ephemeral range), so neither a system Slurm on 6817/6818 nor a second copy
# of this script clashes. No systemd, no /etc/slurm, no cgroups: ProctrackType=proctrack/linuxproc,
# TaskPlugin=task/none. Run as root (slurmd launches tasks as the submitting user).
#
# Nothing is left behind: daemons run in the foreground as children of this script and are
# stopped on exit, Ctrl-C, SIGTERM or SIGHUP (running jobs cancelled, then `scontrol shutdown`,
# then SIGTERM/SIGKILL to any process still holding a file of the folder open or carrying its
# marker in the environment: slurmstepd, stray tasks). A detached watcher does the same if this
# script is killed with SIGKILL (a test timeout).
#
# Environment: HAP_SLURM_AUTH=none|munge forces the authentication (default: none when the
# auth_none plugin is installed, as in Debian 12's Slurm 22.05; munge otherwise, Slurm >= 23.11).
# HAP_SLURM_KEEP=1 keeps the folder (logs) and prints its path.
set -u
export PATH="$PATH:/usr/sbin:/sbin"
SELF=$(readlink -f "${BASH_SOURCE[0]}")

# ---- stopping (shared by the script and its watcher) ----

# A process that exists and is not a zombie.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# Processes of this cluster: a file of $DIR open (daemons, slurmstepd: their logs) or the marker
# in their environment (daemons, tasks). Not this shell.
ours() {
  {
    find /proc/[0-9]*/fd -lname "$DIR/*" 2> /dev/null | cut -d/ -f3
    grep -lzxF "HAP_SLURM_LOCAL=$DIR" /proc/[0-9]*/environ 2> /dev/null | cut -d/ -f3
  } | sort -un | while read -r p; do
    [ "$p" != $$ ] && [ "$p" != "$BASHPID" ] && alive "$p" && echo "$p"
  done
}

# Waits up to $1 seconds for the processes $2... to end.
wait_gone() {
  local deadline=$((SECONDS + $1)) p left
  shift
  while :; do
    left=
    for p in "$@"; do alive "$p" && left=1; done
    [ -z "$left" ] && return 0
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.2
  done
}

stop_cluster() {
  [ -d "$DIR" ] || return 0
  export -n HAP_SLURM_LOCAL
  export SLURM_CONF="$DIR/slurm.conf"
  local pids jobs
  pids=$(cat "$DIR"/*.pid 2> /dev/null)
  if [ -n "$pids" ] && [ -f "$DIR/slurm.conf" ] && alive "$(cat "$DIR/slurmctld.pid" 2> /dev/null || echo 0)"; then
    jobs=$(timeout 5 squeue -h -o %A 2> /dev/null)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      timeout 5 scancel $jobs 2> /dev/null
      for _ in $(seq 50); do
        [ -z "$(timeout 5 squeue -h -o %A 2> /dev/null)" ] && break
        sleep 0.2
      done
    fi
    timeout 5 scontrol shutdown > /dev/null 2>&1
  fi
  # shellcheck disable=SC2046
  wait_gone 10 $(cat "$DIR"/slurm*.pid 2> /dev/null)
  for signal in TERM KILL; do
    pids=$(ours)
    [ -z "${pids//[[:space:]]/}" ] && break
    # shellcheck disable=SC2086
    kill -$signal $pids 2> /dev/null
    # shellcheck disable=SC2086
    wait_gone 5 $pids
  done
}

# The watcher: started detached (its own session, not a child of the script), it waits for the
# script to end and stops whatever is left when the script could not (SIGKILL).
if [ "${1:-}" = --watch ]; then
  parent=$2 DIR=$3
  echo $$ > "$DIR/watcher"
  while alive "$parent" && [ -d "$DIR" ]; do sleep 1; done
  if [ -d "$DIR" ]; then
    stop_cluster
    rm -rf "$DIR"
  fi
  exit 0
fi

# ---- starting ----

CPUS=4 FEATURES=
while [ $# -gt 0 ]; do
  case $1 in
    --cpus) CPUS=$2; shift 2 ;;
    --features) FEATURES=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "slurm-local: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "usage: slurm-local.sh [--cpus N] [--features LIST] [--] COMMAND [ARG...]" >&2
  exit 2
fi
for c in slurmctld slurmd srun sinfo squeue scancel scontrol; do
  command -v $c > /dev/null || { echo "slurm-local: $c not found (apt-get install slurm-wlm)" >&2; exit 1; }
done

# A Slurm job or allocation around us must not leak into this cluster's srun.
# shellcheck disable=SC2046
unset $(compgen -e | grep -E '^(SLURM_|SLURMD_|SRUN_|SBATCH_|SALLOC_|SQUEUE_|PMIX_|PMI_|OMPI_COMM_WORLD_)') 2> /dev/null

DIR=$(mktemp -d "${TMPDIR:-/tmp}/hap-slurm.XXXXXX") || exit 1
chmod 755 "$DIR"
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
chmod 700 "$DIR/state"
export HAP_SLURM_LOCAL="$DIR"
rc=1
finish() {
  trap - EXIT INT TERM HUP
  stop_cluster
  wait 2> /dev/null # reap the daemons (children of this script)
  [ -f "$DIR/watcher" ] && kill "$(cat "$DIR/watcher")" 2> /dev/null
  if [ "${HAP_SLURM_KEEP:-0}" = 1 ]; then
    echo "slurm-local: kept $DIR" >&2
  else
    rm -rf "$DIR"
  fi
  exit $rc
}
trap finish EXIT
trap 'rc=130; exit' INT
trap 'rc=143; exit' TERM
trap 'rc=129; exit' HUP
setsid -f env -u HAP_SLURM_LOCAL bash "$SELF" --watch $$ "$DIR" < /dev/null > /dev/null 2>&1

fail() {
  echo "slurm-local: $*" >&2
  for f in "$DIR"/log/*; do
    [ -s "$f" ] && { echo "--- ${f##*/} (last 25 lines)" >&2; tail -n 25 "$f" >&2; }
  done
  rc=1
  exit
}

# Two free TCP ports in 20000-29999.
port_free() { python3 -c "import socket,sys; s=socket.socket(); s.bind(('', int(sys.argv[1])))" "$1" 2> /dev/null; }
ctld_port=
for _ in $(seq 100); do
  p=$((20000 + (RANDOM % 5000) * 2))
  if port_free $p && port_free $((p + 1)); then ctld_port=$p; break; fi
done
[ -n "$ctld_port" ] || fail "no two free ports in 20000-29999"
slurmd_port=$((ctld_port + 1))

# Authentication: auth/none where the plugin exists (Slurm <= 23.02), else munge with a fresh key.
plugin_dir=$(ldd "$(command -v slurmd)" 2> /dev/null | awk '/libslurmfull/ {print $3}')
plugin_dir=${plugin_dir%/*}
auth=${HAP_SLURM_AUTH:-}
if [ -z "$auth" ]; then
  auth=munge
  for d in "$plugin_dir" /usr/lib/*/slurm-wlm /usr/lib64/slurm /usr/lib/slurm /usr/local/lib/slurm; do
    [ -n "$d" ] && [ -e "$d/auth_none.so" ] && { auth=none; break; }
  done
fi
if [ "$auth" = munge ]; then
  command -v munged > /dev/null || fail "munged not found (apt-get install munge)"
  mkdir -p "$DIR/munge"
  chmod 700 "$DIR/munge"
  head -c 1024 /dev/urandom > "$DIR/munge/munge.key"
  chmod 400 "$DIR/munge/munge.key"
  (cd / && exec munged --foreground --force --key-file="$DIR/munge/munge.key" \
     --socket="$DIR/munge/munge.socket" --pid-file="$DIR/munge/pid" \
     --seed-file="$DIR/munge/seed" --log-file="$DIR/log/munged.log" \
     > "$DIR/log/munged.out" 2>&1 < /dev/null) &
  echo $! > "$DIR/munged.pid"
  for _ in $(seq 50); do [ -S "$DIR/munge/munge.socket" ] && break; sleep 0.1; done
  [ -S "$DIR/munge/munge.socket" ] || fail "munged did not start"
  auth_lines="AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket"
else
  auth_lines="AuthType=auth/none
CredType=cred/none"
fi

user=$(id -un)
host=$(hostname -s 2> /dev/null || hostname)
: > "$DIR/plugstack.conf"
cat > "$DIR/slurm.conf" << EOF
# Written by tests/slurm/slurm-local.sh: a throwaway one-node cluster.
ClusterName=haplocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
$auth_lines
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/state/slurmctld.pid
SlurmdPidFile=$DIR/spool/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
PlugStackConfig=$DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=2
MailProg=/bin/true
NodeName=hapnode NodeAddr=127.0.0.1 NodeHostname=$(hostname) CPUs=$CPUS${FEATURES:+ Features=$FEATURES} State=UNKNOWN
PartitionName=hap Nodes=hapnode Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$DIR/slurm.conf"

(cd "$DIR" && exec slurmctld -D -i > "$DIR/log/slurmctld.out" 2>&1 < /dev/null) &
echo $! > "$DIR/slurmctld.pid"
up=
for _ in $(seq 100); do
  alive "$(cat "$DIR/slurmctld.pid")" || fail "slurmctld exited"
  timeout 5 scontrol ping 2> /dev/null | grep -q "is UP" && { up=1; break; }
  sleep 0.2
done
[ -n "$up" ] || fail "slurmctld did not answer within 20 s"

(cd "$DIR" && exec slurmd -D -N hapnode > "$DIR/log/slurmd.out" 2>&1 < /dev/null) &
echo $! > "$DIR/slurmd.pid"
state=
for _ in $(seq 150); do
  alive "$(cat "$DIR/slurmd.pid")" || fail "slurmd exited"
  state=$(timeout 5 sinfo -h -N -n hapnode -o %T 2> /dev/null)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || fail "node hapnode is '$state', not idle, after 30 s"
echo "slurm-local: slurmctld on port $ctld_port, slurmd on $slurmd_port, $CPUS CPUs, auth/$auth, $DIR" >&2

# The command in the background, so that a signal to this script is handled at once.
"$@" <&0 &
wait $!
rc=$?
exit
