#!/usr/bin/python3
"""Train a zoo model (vgg19, vit, bert, bert_moe) with PyTorch DistributedDataParallel (gloo,
CPU): the peer for hap-train on an emulated cluster, as bench/torch_ddp_gpt.py is for GPT.

The model is the PyTorch twin of tests/oracle/model_oracle.py (the same forward and parameter
names as HAP's model), wrapped in an nn.Module; started by mpirun (usually through
scripts/hap-emulate), one process per rank, the global batch split evenly (what DDP does: dp-ev; as
evenly as whole rows allow, losses weighted by rows, see bench/ddp_common.py), AdamW, global-norm clipping, one thread per rank. Each step's time is the slowest rank's; rank 0
writes the per-step times as JSON. Inputs are random with the model's shapes (images N(0, 1),
labels and token ids uniform; under the mlm objective 15% of positions masked).

  scripts/hap-emulate configs/clusters/emu-mixed4.yaml -- /usr/bin/python3 bench/torch_ddp_zoo.py \
      --model '{"model": "vgg19", "options": {...}}' --batch 32 --steps 30 --json out.json
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "oracle"))
from model_oracle import MODELS  # noqa: E402
import ddp_common  # noqa: E402


class ZooModule(torch.nn.Module):
    """A twin's functional loss over named parameters, as a module DDP can own."""

    def __init__(self, name, options, generator):
        super().__init__()
        shapes_of, self.loss_of, self.inputs_of, buffer_shapes_of = MODELS[name]
        self.options = options
        # Running statistics (VGG with batch norm): means 0, variances 1, as HAP starts them; DDP
        # broadcasts rank 0's buffers before each forward.
        self.buffer_names = list(buffer_shapes_of(options))
        for n, shape in buffer_shapes_of(options).items():
            init = torch.ones(shape) if n.endswith("running_var") else torch.zeros(shape)
            self.register_buffer(n.replace(".", "__"), init)
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
        buffers = {n: getattr(self, n.replace(".", "__")) for n in self.buffer_names}
        return self.loss_of({n: self.store[n.replace(".", "__")] for n in self.names}, inputs,
                            self.options, buffers, True)


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

    joined = ddp_common.join("torch_ddp_zoo", args.batch, args.port)
    if joined is None:
        return 2
    rank, world, rows = joined
    model = ZooModule(name, options, torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(99 + rank)
    step_ms, losses = ddp_common.train(model, lambda: (draw_inputs(name, options, rows, gen),),
                                       args.steps, args.warmup, args.grad_clip,
                                       weight=rows * world / args.batch)
    ddp_common.finish(args.json, rank, world, args.batch, step_ms, losses, model=name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
