"""The PyTorch DDP peers' shared harness (bench/torch_ddp_gpt.py, bench/torch_ddp_zoo.py): joining
the gloo group as OpenMPI's rank, the timed training loop (AdamW with decay on matrices only,
global-norm clipping, each step timed as the slowest rank's), and rank 0's JSON.

The global batch is split as evenly as whole rows allow (the first batch % world ranks get one
row more, as dp-ev does); each rank's mean loss is weighted by its rows x world / batch before
DDP averages the gradients, so the update is the global batch's mean gradient either way."""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from torch_gpt_step import limit_blas_threads


def rows_of(batch, world, rank):
    """This rank's rows of the global batch: batch // world, one more for the first batch % world."""
    return batch // world + (1 if rank < batch % world else 0)


def join(prog, batch, port):
    """(rank, world, rows of this rank) after joining the gloo group; None when some rank would
    get no row."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if batch < world:
        print(f"{prog}: --batch {batch} gives some of the {world} ranks no row", file=sys.stderr)
        return None
    torch.set_num_threads(1)
    limit_blas_threads(1)
    addr = os.environ.get("HAP_EMULATE_MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    return rank, world, rows_of(batch, world, rank)


def train(model, draw, steps, warmup, grad_clip, betas=(0.9, 0.999), weight=1.0):
    """Trains model under DDP on draw()'s inputs, scaling the loss by `weight` (this rank's rows x
    world / batch) before backward; returns (step_ms, losses) of the timed steps."""
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    decay = [q for q in ddp.parameters() if q.dim() >= 2]
    no_decay = [q for q in ddp.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=betas)
    step_ms, losses = [], []
    for step in range(warmup + steps):
        inputs = draw()
        t0 = time.perf_counter()
        loss = ddp(*inputs)
        opt.zero_grad(set_to_none=True)
        (loss * weight if weight != 1.0 else loss).backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), grad_clip)
        opt.step()
        ms = torch.tensor([(time.perf_counter() - t0) * 1e3])
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        if step >= warmup:
            step_ms.append(float(ms))
            losses.append(float(loss))
    return step_ms, losses


def finish(path, rank, world, batch, step_ms, losses, **extra):
    """Rank 0 writes the run as JSON; every rank leaves the group."""
    if rank == 0:
        rows = [rows_of(batch, world, r) for r in range(world)]
        with open(path, "w") as f:
            json.dump({"framework": "pytorch-ddp-gloo", "torch_version": torch.__version__, **extra,
                       "ranks": world, "rows_per_rank": rows, "step_ms": step_ms,
                       "median_ms": statistics.median(step_ms), "losses": losses}, f, indent=2)
    dist.destroy_process_group()
