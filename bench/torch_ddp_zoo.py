#!/usr/bin/python3
"""Train a zoo model (vgg19, vit, bert) with PyTorch DistributedDataParallel (gloo, CPU): the peer
for hap-train on an emulated cluster, as bench/torch_ddp_gpt.py is for GPT.

The model is the PyTorch twin of tests/oracle/model_oracle.py (the same forward and parameter
names as HAP's model), wrapped in an nn.Module; started by mpirun (usually through
scripts/hap-emulate), one process per rank, the global batch split evenly (what DDP does: dp-ev),
AdamW, global-norm clipping, one thread per rank. Each step's time is the slowest rank's; rank 0
writes the per-step times as JSON. Inputs are random with the model's shapes (images N(0, 1),
labels and token ids uniform; under the mlm objective 15% of positions masked).

  scripts/hap-emulate configs/clusters/emu-mixed4.yaml -- /usr/bin/python3 bench/torch_ddp_zoo.py \
      --model '{"model": "vgg19", "options": {...}}' --batch 32 --steps 30 --json out.json
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
from model_oracle import MODELS  # noqa: E402
from torch_gpt_step import limit_blas_threads  # noqa: E402


class ZooModule(torch.nn.Module):
    """A twin's functional loss over named parameters, as a module DDP can own."""

    def __init__(self, name, options, generator):
        super().__init__()
        shapes_of, self.loss_of, self.inputs_of = MODELS[name]
        self.options = options
        self.names = list(shapes_of(options))
        params = {}
        for n, shape in shapes_of(options).items():
            t = torch.empty(shape)
            if n.endswith("bias"):
                t.zero_()
            elif len(shape) == 1:  # LayerNorm gains
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02, generator=generator)
            params[n.replace(".", "__")] = torch.nn.Parameter(t)
        self.store = torch.nn.ParameterDict(params)

    def forward(self, inputs):
        return self.loss_of({n: self.store[n.replace(".", "__")] for n in self.names}, inputs, self.options)


def draw_inputs(name, o, rows, gen):
    if name in ("vgg19", "vit"):
        S, C = o["image_size"], o["in_channels"]
        return {"images": torch.randn(rows, C, S, S, generator=gen),
                "labels": torch.randint(0, o["num_classes"], (rows,), generator=gen)}
    V, T = o["vocab_size"], o["seq_len"]
    idx = torch.randint(0, V, (rows, T), generator=gen)
    if o.get("objective") == "mlm":
        chosen = torch.rand(rows, T, generator=gen) < o.get("mask_prob", 0.15)
        return {"idx": idx, "mlm.inputs": idx.masked_fill(chosen, V),
                "mlm.targets": idx.masked_fill(~chosen, -100)}
    return {"idx": idx, "targets": torch.randint(0, V, (rows, T), generator=gen)}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help='JSON: {"model": NAME, "options": {...}}')
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--port", type=int, default=29519)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    spec = json.loads(args.model)
    name, options = spec["model"], spec["options"]
    if name not in MODELS:
        print(f"torch_ddp_zoo: unknown model {name!r}; known: {sorted(MODELS)}", file=sys.stderr)
        return 2

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if args.batch % world:
        print(f"torch_ddp_zoo: --batch {args.batch} is not divisible by {world} ranks", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    limit_blas_threads(1)
    addr = os.environ.get("HAP_EMULATE_MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{args.port}", rank=rank, world_size=world)

    model = ZooModule(name, options, torch.Generator().manual_seed(1234))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    decay = [q for q in ddp.parameters() if q.dim() >= 2]
    no_decay = [q for q in ddp.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    rows = args.batch // world
    gen = torch.Generator().manual_seed(99 + rank)
    step_ms, losses = [], []
    for step in range(args.warmup + args.steps):
        inputs = draw_inputs(name, options, rows, gen)
        t0 = time.perf_counter()
        loss = ddp(inputs)
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
                       "model": name, "ranks": world, "rows_per_rank": rows, "step_ms": step_ms,
                       "median_ms": statistics.median(step_ms), "losses": losses}, f, indent=2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
