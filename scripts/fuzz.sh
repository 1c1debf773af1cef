#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (docs/fuzzing.md): configures and builds them in
# build-fuzz/ with clang-14, AddressSanitizer and UndefinedBehaviorSanitizer (-DHAP_FUZZ=ON), then
# runs each for SECONDS (default 60) from a working corpus build-fuzz/corpus/<target> (the seeds of
# fuzz/corpus/<target> are copied in; what the fuzzer adds stays for the next run), and prints per
# target its executions, exec/s, coverage, corpus size and findings. Exits 1 if any target found
# something (a crash, a leak, a timeout, an out-of-memory or an escaping exception).
#
#   scripts/fuzz.sh [-j JOBS] [--keep-going] [SECONDS] [TARGET...]
#
#   -j JOBS       targets run side by side (default 1); each one uses one core
#   --keep-going  a finding does not stop the target, so that a long run goes past a known bug:
#                 libFuzzer's fork mode (-fork=1 -ignore_crashes=1 -ignore_timeouts=1
#                 -ignore_ooms=1) keeps every crash, timeout and out-of-memory input, and an
#                 exception other than hap::Error keeps its first input of each kind in
#                 build-fuzz/findings/<target> (HAP_FUZZ_KEEP_GOING)
#   TARGET        fuzz_plan or plan, ...; default: every fuzz/fuzz_*.cc
#
# Environment: HAP_FUZZ_BUILD_DIR (default build-fuzz), HAP_FUZZ_BUILD_JOBS (compile jobs, default
# nproc), HAP_FUZZ_ARGS (more libFuzzer flags). Installs nothing: it names the Debian packages it
# lacks (clang-14, libclang-rt-14-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=1
keep_going=0
seconds=60
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    --keep-going) keep_going=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if [ ${#targets[@]} -eq 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
        seconds=$1
      else
        t=${1#fuzz_}
        [ -f "fuzz/fuzz_$t.cc" ] || { echo "fuzz.sh: no target fuzz_$t (fuzz/fuzz_$t.cc)" >&2; exit 2; }
        targets+=("fuzz_$t")
      fi
      shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/fuzz_*.cc; do targets+=("$(basename "$f" .cc)"); done
fi

# ---- what it needs ----
missing=()
command -v clang-14 >/dev/null && command -v clang++-14 >/dev/null || missing+=(clang-14)
if command -v clang++-14 >/dev/null; then
  rt="$(clang++-14 -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a"
  [ -f "$rt" ] || missing+=(libclang-rt-14-dev)
fi
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz.sh: missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 2
fi

# ---- build ----
build=${HAP_FUZZ_BUILD_DIR:-build-fuzz}
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAP_CUDA=OFF \
  -DHAP_FUZZ=ON -DHAP_BUILD_TESTS=OFF -DHAP_BUILD_BENCH=OFF >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log" >&2; exit 2; }
rm -f "$build.configure.log"
cmake --build "$build" -j "${HAP_FUZZ_BUILD_JOBS:-$(nproc)}" --target "${targets[@]}"

# ---- run ----
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
run_target() {
  local t=$1 corpus="$build/corpus/$1" artifacts="$build/artifacts/$1/" log="$build/logs/$1.log"
  rm -rf "$artifacts" "$build/findings/$t"  # this run's findings only
  mkdir -p "$corpus" "$artifacts" "$build/logs"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  local keep="" mode=()
  if [ "$keep_going" = 1 ]; then
    keep="$PWD/$build/findings/$t"
    mode=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  # -print_final_stats: executions and exec/s at the end; the last status line has cov and corp.
  HAP_FUZZ_KEEP_GOING="$keep" "$build/fuzz/$t" "$corpus" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$artifacts" \
    "${mode[@]}" ${HAP_FUZZ_ARGS:-} >"$log" 2>&1
}
echo "fuzz.sh: ${#targets[@]} target(s), ${seconds} s each, $jobs at a time; logs in $build/logs/"
status_dir=$(mktemp -d)
touch "$status_dir/start"
# A target killed by a finding leaves its input files (/dev/shm/hap-fuzz-<pid>-*) and libomp's
# registration file (/dev/shm/__KMP_REGISTERED_LIB_<pid>_*): removed at the end when made by
# this run (newer than its start) and their process is gone.
remove_leftovers() {
  local f pid
  for f in /dev/shm/hap-fuzz-* /dev/shm/__KMP_REGISTERED_LIB_*; do
    [ -e "$f" ] && [ "$f" -nt "$status_dir/start" ] || continue
    pid=$(basename "$f" | sed -E 's/^(hap-fuzz-|__KMP_REGISTERED_LIB_)([0-9]+).*/\2/')
    kill -0 "$pid" 2>/dev/null || rm -f -- "$f"
  done
  rm -rf "$status_dir"
}
trap remove_leftovers EXIT
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  ( rc=0; run_target "$t" || rc=$?; echo "$rc" >"$status_dir/$t" ) &
  running=$((running + 1))
done
wait

# ---- report ----
# Plain mode ends with -print_final_stats figures; fork mode (--keep-going) with a status line
# "#EXECS: cov: N ft: N corp: N exec/s N oom/timeout/crash: A/B/C time: Ss ...".
set +e +o pipefail  # a grep that finds nothing is an empty figure here, not an error
failed=0
details=()
printf '%-20s %11s %7s %6s %6s  %s\n' target executions exec/s cov corpus findings
for t in "${targets[@]}"; do
  log="$build/logs/$t.log"
  rc=$(cat "$status_dir/$t" 2>/dev/null || echo "?")
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -1 | awk '{print $2}')
  status=$(grep -E '^#[0-9]+[:[:space:]]' "$log" | grep 'cov: ' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$status" | awk '{print $2}')
  if [ -z "$execs" ] && [ -n "$status" ]; then  # fork mode
    execs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$status")
    time_s=$(grep -o 'time: [0-9]*s' <<<"$status" | tr -dc 0-9)
    [ -n "$time_s" ] && [ "$time_s" -gt 0 ] && rate=$((execs / time_s))
  fi
  corpus=$(find "$build/corpus/$t" -type f | wc -l)
  found=()
  n=$(find "$build/artifacts/$t" -type f | wc -l)
  if [ "$n" -gt 0 ]; then
    kinds=$(find "$build/artifacts/$t" -type f -printf '%f\n' | sed 's/-.*//' | sort | uniq -c |
      awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2}')
    found+=("$kinds input(s) in $build/artifacts/$t")
  fi
  if [ -d "$build/findings/$t" ]; then
    n=$(find "$build/findings/$t" -name 'finding-*' ! -name '*.txt' | wc -l)
    [ "$n" -gt 0 ] && found+=("$n kind(s) of escaping exception in $build/findings/$t")
  fi
  if [ "$rc" != 0 ] && [ ${#found[@]} -eq 0 ]; then found+=("exit status $rc, see $log"); fi
  if [ ${#found[@]} -gt 0 ]; then failed=1; fi
  summary=none
  if [ ${#found[@]} -gt 0 ]; then summary=$(printf '%s; ' "${found[@]}"); summary=${summary%; }; fi
  printf '%-20s %11s %7s %6s %6s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$corpus" \
    "$summary"
  # What the sanitizers and the harness said, once per distinct message (numbers left out).
  while IFS= read -r line; do
    [ -n "$line" ] && details+=("$t: $line")
  done < <(grep -hE 'SUMMARY: |runtime error: |ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' \
             "$log" | grep -v NEW_FUNC | sed -E 's/^==[0-9]+== ?//; s/0x[0-9a-f]+/0x.../g; s/[0-9]+ \* [0-9]+/N * N/g; s/[0-9]{4,}/N/g' | sort -u)
  for f in "$build/findings/$t"/finding-*.txt; do
    [ -e "$f" ] && details+=("$t: exception $(head -c 300 "$f")")
  done
done
if [ ${#details[@]} -gt 0 ]; then
  echo
  echo "findings (one line per distinct message):"
  printf '  %s\n' "${details[@]}"
fi
exit "$failed"
