"""Reads a HAP checkpoint (safetensors) with PyTorch by parsing the format's layout, and checks
it against the same tensors written as .hapt by the C++ side; then writes a plain safetensors
file (no HAP checksums) for the C++ reader to load.

usage: checkpoint_oracle.py CHECKPOINT.safetensors REFERENCE.hapt STEP OUT.safetensors
Exit 0 when every tensor is bitwise equal, the checksums verify and the metadata's step is STEP.
"""
import sys

import torch

import hapt
import safetensors_io


def main(argv):
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    ckpt, ref_path, step, out = argv[1], argv[2], argv[3], argv[4]
    tensors, meta, verified = safetensors_io.load(ckpt)
    ref = hapt.load(ref_path)
    problems = []
    if not verified:
        problems.append("the checkpoint carries no HAP checksums")
    if meta.get("format") != "hap-checkpoint-v2" or meta.get("step") != step:
        problems.append(f"metadata format/step {meta.get('format')}/{meta.get('step')}, expected hap-checkpoint-v2/{step}")
    if list(tensors) != list(ref):
        problems.append(f"tensor names/order differ: {list(tensors)[:5]} vs {list(ref)[:5]}")
    for name, t in ref.items():
        got = tensors.get(name)
        if got is None or got.dtype != t.dtype or got.shape != t.shape or not torch.equal(got, t):
            problems.append(f"tensor '{name}' differs")
    if problems:
        print("checkpoint_oracle: " + "; ".join(problems[:10]), file=sys.stderr)
        return 1
    # Written the way another framework would: reversed order, no checksums.
    safetensors_io.save(out, dict(reversed(list(ref.items()))), {"written_by": "pytorch"})
    print(f"checkpoint_oracle: {len(tensors)} tensors equal, checksums verified, "
          f"metadata {sorted(meta)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
