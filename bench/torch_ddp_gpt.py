#!/usr/bin/python3
"""Train the GPT with PyTorch DistributedDataParallel (gloo, CPU): the peer for hap-train on an
emulated cluster.

Started by mpirun (usually through scripts/hap-emulate), one process per rank; the rank and world
size come from OpenMPI's environment. Same model as hap-train's GPT (the oracle's GPT-2 code,
tests/oracle/gpt_oracle.py, wrapped in an nn.Module), same global batch split evenly over the
ranks (what DDP does: dp-ev; as evenly as whole rows allow, losses weighted by rows, see
bench/ddp_common.py), AdamW, global-norm clipping, one thread per rank. Each step's time
is the slowest rank's; rank 0 writes the per-step times as JSON.

Example (4 emulated ranks):
  scripts/hap-emulate configs/clusters/emu-mixed4.yaml -- /usr/bin/python3 bench/torch_ddp_gpt.py \
      --n-layer 4 --n-head 4 --n-embd 128 --vocab 256 --block-size 128 --batch 16 --seq 128 \
      --steps 30 --json out.json
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "oracle"))
from gpt_oracle import GPTConfig, gpt_loss  # noqa: E402
import ddp_common  # noqa: E402
from torch_gpt_step import init_params  # noqa: E402


class GPTModule(torch.nn.Module):
    """The oracle's functional GPT as a module, so DDP can own its parameters."""

    def __init__(self, cfg, params):
        super().__init__()
        self.cfg = cfg
        self.names = list(params)
        self.store = torch.nn.ParameterDict(
            {n.replace(".", "__"): torch.nn.Parameter(p.detach().clone()) for n, p in params.items()})

    def forward(self, idx, targets):
        return gpt_loss({n: self.store[n.replace(".", "__")] for n in self.names}, idx, targets, self.cfg)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("n-layer", "n-head", "n-embd", "vocab", "block-size", "batch", "seq", "steps"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)

    joined = ddp_common.join("torch_ddp_gpt", args.batch, args.port)
    if joined is None:
        return 2
    rank, world, rows = joined
    cfg = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                    vocab_size=args.vocab, block_size=args.block_size)
    cfg.validate()
    model = GPTModule(cfg, init_params(cfg, torch.Generator().manual_seed(1234)))
    gen = torch.Generator().manual_seed(99 + rank)

    def draw():
        return (torch.randint(0, args.vocab, (rows, args.seq), generator=gen),
                torch.randint(0, args.vocab, (rows, args.seq), generator=gen))

    step_ms, losses = ddp_common.train(model, draw, args.steps, args.warmup, args.grad_clip,
                                       betas=(0.9, 0.95), weight=rows * world / args.batch)
    ddp_common.finish(args.json, rank, world, args.batch, step_ms, losses)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
