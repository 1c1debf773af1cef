# Sourced by the mpirun and srun test scripts: the losses of hap-train's progress lines, and
# their comparison between two runs.

# The loss of every progress line on stdin, one per line.
losses() { grep -E '^step .*\| loss ' | sed -E 's/.*\| loss ([0-9.]+) .*/\1/'; }

# same_losses WHAT REF_NAME REF OTHER_NAME OTHER: OTHER has as many losses as REF (and some), each
# within 2e-4 (relative) of REF's; otherwise prints what differs and fails.
same_losses() {
  local what=$1 ref_name=$2 ref=$3 other_name=$4 other=$5
  if [ -z "$other" ] || [ "$(echo "$other" | wc -l)" != "$(echo "$ref" | wc -l)" ]; then
    echo "$what: $other_name printed losses '$(echo $other)', $ref_name '$(echo $ref)'"
    return 1
  fi
  paste <(echo "$ref") <(echo "$other") | while read -r a b; do
    python3 -c "import sys; a,b=float('$a'),float('$b'); sys.exit(0 if abs(a-b) <= 2e-4*abs(a) else 1)" \
      || { echo "$what: loss differs: $ref_name $a, $other_name $b"; exit 1; }
  done
}
