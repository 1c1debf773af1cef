#!/usr/bin/python3
"""Time one PyTorch GPT training step on the CPU or a GPU: the peer HAP's step is measured against.

A step is forward, backward, AdamW step and zero_grad, on the same GPT-2 (tied head, no dropout)
that tests/oracle/gpt_oracle.py defines; the model code is imported from there so the peer and
the oracle can never drift apart. Each step gets a fresh random batch, drawn outside the timer.
By default float32 and the oracle's own attention (scores materialised, as HAP's own kernels);
a tuned PyTorch: --autocast-bf16 (torch.autocast to bfloat16 around the loss), --sdpa (the
attention through F.scaled_dot_product_attention, causal: flash or memory-efficient kernels on a
GPU) and --compile (torch.compile of the loss).

Example:
  /usr/bin/python3 bench/torch_gpt_step.py --n-layer 4 --n-head 4 --n-embd 256 --vocab 256 \
      --block-size 128 --batch 16 --seq 128 --threads 2 --warmup 3 --iters 10 --json out.json
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "oracle"))
from gpt_oracle import GPTConfig, OracleError, adamw_param_groups, gpt_loss, parameter_shapes  # noqa: E402

SEED = 1234
LR = 3e-4
WEIGHT_DECAY = 0.1


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])

    def positive(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
        return value

    def non_negative(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
        return value

    parser.add_argument("--n-layer", type=positive, required=True)
    parser.add_argument("--n-head", type=positive, required=True)
    parser.add_argument("--n-embd", type=positive, required=True)
    parser.add_argument("--vocab", type=positive, required=True)
    parser.add_argument("--block-size", type=positive, required=True)
    parser.add_argument("--batch", type=positive, required=True)
    parser.add_argument("--seq", type=positive, required=True, help="tokens per sequence (<= block size)")
    parser.add_argument("--threads", type=positive, required=True, help="torch intra-op threads")
    parser.add_argument("--warmup", type=non_negative, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--iters", type=positive, default=10, help="timed steps (default 10)")
    parser.add_argument("--json", required=True, metavar="OUT.json", help="where to write the results")
    parser.add_argument("--autocast-bf16", action="store_true",
                        help="torch.autocast(dtype=torch.bfloat16) around the forward and loss")
    parser.add_argument("--sdpa", action="store_true",
                        help="attention through F.scaled_dot_product_attention (is_causal)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the loss")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda[:N] (float32 with TF32 off, fused AdamW on a GPU)")
    args = parser.parse_args(argv)
    if args.seq > args.block_size:
        parser.error(f"--seq {args.seq} exceeds --block-size {args.block_size}")
    if args.n_embd % args.n_head != 0:
        parser.error(f"--n-embd {args.n_embd} must be divisible by --n-head {args.n_head}")
    return args


def limit_blas_threads(threads):
    """Size OpenBLAS's own thread pool; return its size, or None where the BLAS is not OpenBLAS.

    Debian's torch is built against the generic system BLAS (libblas.so.3, OpenBLAS by default)
    and calls sgemm there, so torch.set_num_threads does not reach it: without this, GEMMs use
    every core whatever --threads says."""
    try:
        blas = ctypes.CDLL("libblas.so.3")  # already loaded by torch: the same handle
        blas.openblas_set_num_threads(ctypes.c_int(threads))
        return int(blas.openblas_get_num_threads())
    except (OSError, AttributeError):
        return None


def init_params(cfg, generator):
    """GPT-2 init: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 n_layer), zero biases,
    LayerNorm at identity."""
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    params = {}
    for name, shape in parameter_shapes(cfg).items():
        t = torch.empty(shape, dtype=torch.float32)
        if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
            t.normal_(0.0, residual_std, generator=generator)
        elif name.endswith(".weight") and t.dim() >= 2:
            t.normal_(0.0, 0.02, generator=generator)
        elif name.endswith(".weight"):  # LayerNorm gain
            t.fill_(1.0)
        else:
            t.zero_()
        params[name] = t.requires_grad_(True)
    return params


def to_device(params, device):
    """The parameters moved to `device`, still leaves that require grad."""
    return {name: t.detach().to(device).requires_grad_(True) for name, t in params.items()}


def main(argv):
    args = parse_args(argv)
    # Must precede any other torch work: the intra-op pool size is what is being compared.
    torch.set_num_threads(args.threads)
    blas_threads = limit_blas_threads(args.threads)

    cfg = GPTConfig(
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        vocab_size=args.vocab,
        block_size=args.block_size,
    )
    try:
        cfg.validate()
    except OracleError as e:
        print(f"torch_gpt_step: error: {e}", file=sys.stderr)
        return 2

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(f"torch_gpt_step: error: --device {args.device}: no CUDA device", file=sys.stderr)
            return 2
        # float32 as HAP computes it: no TF32 in GEMMs or convolutions.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    generator = torch.Generator().manual_seed(SEED)
    params = to_device(init_params(cfg, generator), device)
    extra = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(adamw_param_groups(params, WEIGHT_DECAY), lr=LR, **extra)
    n_params = sum(p.numel() for p in params.values())

    def batch():
        shape = (args.batch, args.seq)
        idx = torch.randint(0, args.vocab, shape, generator=generator).to(device)
        targets = torch.randint(0, args.vocab, shape, generator=generator).to(device)
        sync()
        return idx, targets

    if args.sdpa:
        import gpt_oracle

        if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            print(f"torch_gpt_step: error: --sdpa needs PyTorch 2.0 or later (this is "
                  f"{torch.__version__})", file=sys.stderr)
            return 2

        def sdpa_attention(x, params_, prefix, n_head, mixed=False):
            B, T, C = x.shape
            w = params_[prefix + "qkv.weight"].reshape(3 * C, C)
            b = params_[prefix + "qkv.bias"].reshape(3 * C)
            q, k, v = torch.nn.functional.linear(x, w, b).split(C, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return torch.nn.functional.linear(y, params_[prefix + "proj.weight"],
                                              params_[prefix + "proj.bias"])

        gpt_oracle.causal_self_attention = sdpa_attention  # gpt_loss looks it up at call time

    def plain_loss(idx, targets):
        if args.autocast_bf16:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                return gpt_loss(params, idx, targets, cfg)
        return gpt_loss(params, idx, targets, cfg)

    loss_of = torch.compile(plain_loss) if args.compile else plain_loss

    def step(idx, targets):
        loss = loss_of(idx, targets)
        loss.backward()
        optimizer.step()
        # set_to_none is what a tuned PyTorch loop does (and the default from 2.0 on).
        optimizer.zero_grad(set_to_none=True)
        return loss.item()  # waits for the device

    for _ in range(args.warmup):
        step(*batch())
    step_ms = []
    for _ in range(args.iters):
        idx, targets = batch()
        start = time.perf_counter()
        loss = step(idx, targets)
        step_ms.append((time.perf_counter() - start) * 1e3)
        if not math.isfinite(loss):
            print(f"torch_gpt_step: error: loss became {loss}", file=sys.stderr)
            return 1

    median_ms = statistics.median(step_ms)
    result = {
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "blas_threads": blas_threads,
        "config": {
            "n_layer": args.n_layer,
            "n_head": args.n_head,
            "n_embd": args.n_embd,
            "vocab_size": args.vocab,
            "block_size": args.block_size,
            "batch": args.batch,
            "seq": args.seq,
            "dtype": "bfloat16 autocast" if args.autocast_bf16 else "float32",
            "attention": "scaled_dot_product_attention" if args.sdpa else "oracle (scores materialised)",
            "compiled": args.compile,
            "n_params": n_params,
            "warmup": args.warmup,
            "iters": args.iters,
        },
        "step_ms": step_ms,
        "median_ms": median_ms,
        "tokens_per_s": args.batch * args.seq / (median_ms / 1e3),
    }
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"pytorch {torch.__version__}, {result['threads']} threads: median {median_ms:.2f} ms/step, "
          f"{result['tokens_per_s']:.0f} tokens/s ({n_params / 1e6:.2f}M params)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
