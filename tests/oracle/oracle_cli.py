"""What the PyTorch oracles share: their error type, reading the input tensors, and the
command line (IN.hapt CONFIG.json OUT.hapt, or SPEC.json for op_oracle.py; bad input prints one
line and exits with status 2)."""
import os
import sys

import hapt


class OracleError(Exception):
    """Bad arguments or inputs; main() prints the message and exits with status 2."""


def load_tensors(path, expected, hint=""):
    """The tensors of a .hapt file, which must hold exactly the names in `expected`."""
    try:
        tensors = hapt.load(path)
    except (OSError, hapt.HaptError) as e:
        raise OracleError(f"cannot read {path}: {e}") from None
    missing = [n for n in expected if n not in tensors]
    if missing:
        raise OracleError(f"{path}: missing tensor(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    known = set(expected)
    unknown = [n for n in tensors if n not in known]
    if unknown:
        raise OracleError(f"{path}: unexpected tensor(s) {unknown[:8]}{hint}")
    return tensors


def main(argv, prog, run, config="CONFIG.json"):
    """Runs run(in_path, config_path, out_path) from the command line."""
    if len(argv) != 4:
        print(f"usage: {os.path.basename(argv[0])} IN.hapt {config} OUT.hapt", file=sys.stderr)
        return 2
    try:
        run(argv[1], argv[2], argv[3])
    except OracleError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0
