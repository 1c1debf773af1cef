#!/usr/bin/python3
"""Train the GPT with PyTorch DistributedDataParallel (gloo, CPU): the peer for hap-train on an
emulated cluster.

Started by mpirun (usually through scripts/hap-emulate), one process per rank; the rank and world
size come from OpenMPI's environment. Same model as hap-train's GPT (the oracle's GPT-2 code,
tests/oracle/gpt_oracle.py, wrapped in an nn.Module), same global batch split evenly over the
ranks (what DDP does: dp-ev), AdamW, global-norm clipping, one thread per rank. Each step's time
is the slowest rank's; rank 0 writes the per-step times as JSON.

Example (4 emulated ranks):
  scripts/hap-emulate configs/clusters/emu-mixed4.yaml -- /usr/bin/python3 bench/torch_ddp_gpt.py \
      --n-layer 4 --n-head 4 --n-embd 128 --vocab 256 --block-size 128 --batch 16 --seq 128 \
      --steps 30 --json out.json
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "oracle"))
from gpt_oracle import GPTConfig, gpt_loss  # noqa: E402
from torch_gpt_step import init_params, limit_blas_threads  # noqa: E402


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

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if args.batch % world:
        print(f"torch_ddp_gpt: --batch {args.batch} is not divisible by {world} ranks", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    limit_blas_threads(1)
    addr = os.environ.get("HAP_EMULATE_MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{args.port}", rank=rank, world_size=world)

    cfg = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                    vocab_size=args.vocab, block_size=args.block_size)
    cfg.validate()
    model = GPTModule(cfg, init_params(cfg, torch.Generator().manual_seed(1234)))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    decay = [q for q in ddp.parameters() if q.dim() >= 2]
    no_decay = [q for q in ddp.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    rows = args.batch // world
    gen = torch.Generator().manual_seed(99 + rank)
    step_ms, losses = [], []
    for step in range(args.warmup + args.steps):
        idx = torch.randint(0, args.vocab, (rows, args.seq), generator=gen)
        targets = torch.randint(0, args.vocab, (rows, args.seq), generator=gen)
        t0 = time.perf_counter()
        loss = ddp(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.grad_clip)
        opt.step()
        ms = torch.tensor([(time.perf_counter() - t0) * 1e3])
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        if step >= args.warmup:
            step_ms.append(float(ms))
            losses.append(float(loss))
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump({"framework": "pytorch-ddp-gloo", "torch_version": torch.__version__,
                       "ranks": world, "rows_per_rank": rows, "step_ms": step_ms,
                       "median_ms": statistics.median(step_ms), "losses": losses}, f, indent=2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
