#!/usr/bin/python3
"""PyTorch twin of HAP's GPT: the golden loss, gradients and AdamW trajectory for oracle tests.

Usage: gpt_oracle.py IN.hapt CONFIG.json OUT.hapt

IN.hapt   every parameter by name (any float dtype) and, for s in 0..steps-1, the batch
          `idx.{s}` and `targets.{s}` (i64 [B, T]; a target of -100 is ignored).
CONFIG    n_layer, n_head, n_embd, vocab_size, block_size, steps, lr, min_lr, warmup_steps,
          total_steps, weight_decay, beta1, beta2, eps, grad_clip; optional layer_norm_eps
          (default 1e-5), dtype ("float64" default, or "float32") and precision ("f32"
          default, or "bf16": HAP's mixed precision written out, gpt_loss(mixed=True)).
OUT.hapt  (all f64) `loss` (step-0 loss), `grad.{name}` (step-0 gradients, before clipping),
          `losses` [steps] (loss of batch s before update s), `final.{name}` (after all updates).

The model is written functionally over a dict of named tensors so that the names are exactly
the ones the C++ model registers, and so bench/torch_gpt_step.py can reuse the same forward.
"""

import json
import math
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hapt  # noqa: E402
import oracle_cli  # noqa: E402
from oracle_cli import OracleError  # noqa: E402

IGNORE_INDEX = -100


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    layer_norm_eps: float = 1e-5

    def validate(self):
        for key in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
            if getattr(self, key) < 1:
                raise OracleError(f"{key} must be >= 1 (got {getattr(self, key)})")
        if self.n_embd % self.n_head != 0:
            raise OracleError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not self.layer_norm_eps > 0:
            raise OracleError(f"layer_norm_eps must be > 0 (got {self.layer_norm_eps})")


def parameter_shapes(cfg):
    """Name -> shape of every parameter, in the canonical (C++ registration) order."""
    C, V = cfg.n_embd, cfg.vocab_size
    shapes = OrderedDict()
    shapes["wte.weight"] = (V, C)
    shapes["wpe.weight"] = (cfg.block_size, C)
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        shapes[p + "ln1.weight"] = (C,)
        shapes[p + "ln1.bias"] = (C,)
        shapes[p + "attn.qkv.weight"] = (3, C, C)  # q, k, v stacked
        shapes[p + "attn.qkv.bias"] = (3, C)
        shapes[p + "attn.proj.weight"] = (C, C)
        shapes[p + "attn.proj.bias"] = (C,)
        shapes[p + "ln2.weight"] = (C,)
        shapes[p + "ln2.bias"] = (C,)
        shapes[p + "mlp.fc.weight"] = (4 * C, C)
        shapes[p + "mlp.fc.bias"] = (4 * C,)
        shapes[p + "mlp.proj.weight"] = (C, 4 * C)
        shapes[p + "mlp.proj.bias"] = (C,)
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


def linear(x, w, b, mixed):
    """F.linear; mixed precision (HAP's train.precision: bf16) casts all three to bf16 first:
    a bf16 product with f32 accumulation and a bf16 result."""
    if mixed:
        return F.linear(x.bfloat16(), w.bfloat16(), None if b is None else b.bfloat16())
    return F.linear(x, w, b)


def in_f32(fn, *xs):
    """An op HAP computes in f32 on bf16 operands, its result rounded back to bf16 once."""
    if xs[0].dtype != torch.bfloat16:
        return fn(*xs)
    return fn(*[t.float() for t in xs]).bfloat16()


def causal_self_attention(x, params, prefix, n_head, mixed=False):
    B, T, C = x.shape
    D = C // n_head
    # HAP stacks the q, k, v weights as [3, C, C]: the same numbers as GPT-2's [3C, C].
    w = params[prefix + "qkv.weight"].reshape(3 * C, C)
    b = params[prefix + "qkv.bias"].reshape(3 * C)
    qkv = linear(x, w, b, mixed)  # [B, T, 3C]
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, n_head, D).transpose(1, 2)  # [B, H, T, D]
    k = k.view(B, T, n_head, D).transpose(1, 2)
    v = v.view(B, T, n_head, D).transpose(1, 2)

    def attention(q, k, v):
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # [B, H, T, T]
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)
        att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
        return att @ v

    y = in_f32(attention, q, k, v).transpose(1, 2).contiguous().view(B, T, C)
    return linear(y, params[prefix + "proj.weight"], params[prefix + "proj.bias"], mixed)


def mlp(x, params, prefix, mixed=False):
    h = linear(x, params[prefix + "fc.weight"], params[prefix + "fc.bias"], mixed)  # [B, T, 4C]
    h = in_f32(lambda t: F.gelu(t, approximate="tanh"), h)
    return linear(h, params[prefix + "proj.weight"], params[prefix + "proj.bias"], mixed)


def gpt_loss(params, idx, targets, cfg, mixed=False):
    """Mean cross-entropy of the tied-head GPT-2 on one batch. idx, targets: i64 [B, T].

    mixed: HAP's bf16 mixed precision (ops::AutocastGuard) written out: linear layers in bf16,
    attention and GELU computed in f32 from their bf16 inputs and rounded to bf16, the residual
    stream, layer norms and the loss in f32 (a bf16 branch is widened where it meets the stream).
    """
    B, T = idx.shape
    C, eps = cfg.n_embd, cfg.layer_norm_eps
    positions = torch.arange(T, device=idx.device)
    x = F.embedding(idx, params["wte.weight"]) + F.embedding(positions, params["wpe.weight"])  # [B, T, C]

    def norm(t, name):
        return F.layer_norm(t.float() if mixed else t, (C,), params[name + ".weight"],
                            params[name + ".bias"], eps)

    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        h = norm(x, p + "ln1")
        x = x + causal_self_attention(h, params, p + "attn.", cfg.n_head, mixed).to(x.dtype)
        h = norm(x, p + "ln2")
        x = x + mlp(h, params, p + "mlp.", mixed).to(x.dtype)
    x = norm(x, "ln_f")
    logits = linear(x, params["wte.weight"], None, mixed)  # [B, T, V]
    if mixed:
        logits = logits.float()
    return F.cross_entropy(logits.view(-1, cfg.vocab_size), targets.view(-1), ignore_index=IGNORE_INDEX)


def adamw_param_groups(params, weight_decay):
    """Decay matrices and embeddings (dim >= 2); never biases (the stacked q, k, v biases are
    [3, C]) or LayerNorm gains."""
    def decays(name, t):
        return t.dim() >= 2 and not name.endswith("bias")

    decay = [t for n, t in params.items() if decays(n, t)]
    no_decay = [t for n, t in params.items() if not decays(n, t)]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def lr_at(step, lr, min_lr, warmup_steps, total_steps):
    """Linear warmup, then cosine decay from lr to min_lr (step is 0-based)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    ratio = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (lr - min_lr)


# ---------------------------------------------------------------------------------------------
# Command line

_INT_KEYS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "steps", "warmup_steps", "total_steps")
_FLOAT_KEYS = ("lr", "min_lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip")
_OPTIONAL = {"layer_norm_eps": 1e-5, "dtype": "float64", "precision": "f32"}
_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def read_config(path):
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise OracleError(f"{path}: cannot read config ({e})") from None
    if not isinstance(raw, dict):
        raise OracleError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    known = set(_INT_KEYS) | set(_FLOAT_KEYS) | set(_OPTIONAL)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise OracleError(f"{path}: unknown key(s) {unknown}; accepted keys are {sorted(known)}")
    missing = [k for k in _INT_KEYS + _FLOAT_KEYS if k not in raw]
    if missing:
        raise OracleError(f"{path}: missing key(s) {missing}")
    cfg = dict(_OPTIONAL)
    cfg.update(raw)
    for k in _INT_KEYS:
        if not isinstance(cfg[k], int) or isinstance(cfg[k], bool):
            raise OracleError(f"{path}: '{k}' must be an integer (got {cfg[k]!r})")
    for k in _FLOAT_KEYS + ("layer_norm_eps",):
        if not isinstance(cfg[k], (int, float)) or isinstance(cfg[k], bool):
            raise OracleError(f"{path}: '{k}' must be a number (got {cfg[k]!r})")
        cfg[k] = float(cfg[k])
    if cfg["precision"] not in ("f32", "bf16"):
        raise OracleError(f"{path}: 'precision' must be f32 or bf16 (got {cfg['precision']!r})")
    if cfg["precision"] == "bf16" and cfg["dtype"] != "float32":
        raise OracleError(f"{path}: 'precision' bf16 keeps f32 parameters: set 'dtype' to float32")
    if cfg["dtype"] not in _DTYPES:
        raise OracleError(f"{path}: 'dtype' must be one of {sorted(_DTYPES)} (got {cfg['dtype']!r})")
    if cfg["steps"] < 1:
        raise OracleError(f"{path}: 'steps' must be >= 1 (got {cfg['steps']}); step 0 gives loss and grads")
    if cfg["warmup_steps"] < 0 or cfg["total_steps"] < 0:
        raise OracleError(f"{path}: 'warmup_steps' and 'total_steps' must be >= 0")
    for k in ("beta1", "beta2"):
        if not 0.0 <= cfg[k] < 1.0:
            raise OracleError(f"{path}: '{k}' must be in [0, 1) (got {cfg[k]})")
    if cfg["eps"] <= 0 or cfg["lr"] < 0 or cfg["min_lr"] < 0 or cfg["weight_decay"] < 0:
        raise OracleError(f"{path}: eps must be > 0 and lr, min_lr, weight_decay >= 0")
    model = GPTConfig(**{k: cfg[k] for k in GPTConfig.__dataclass_fields__})
    try:
        model.validate()
    except OracleError as e:
        raise OracleError(f"{path}: {e}") from None
    return model, cfg


def split_inputs(path, model, steps, dtype):
    """Read IN.hapt, check it against the model and return (params, batches) in the compute dtype."""
    shapes = parameter_shapes(model)
    batch_names = [f"{kind}.{s}" for s in range(steps) for kind in ("idx", "targets")]
    tensors = oracle_cli.load_tensors(path, list(shapes) + batch_names,
                                      " (parameter names or batches beyond steps?)")

    params = OrderedDict()
    for name, shape in shapes.items():
        t = tensors[name]
        if not t.is_floating_point():
            raise OracleError(f"{path}: parameter '{name}' must be floating point (got {t.dtype})")
        if tuple(t.shape) != shape:
            raise OracleError(f"{path}: parameter '{name}' has shape {list(t.shape)}, expected {list(shape)}")
        params[name] = t.to(dtype).clone().requires_grad_(True)

    batches = []
    for s in range(steps):
        idx, targets = tensors[f"idx.{s}"], tensors[f"targets.{s}"]
        for name, t in ((f"idx.{s}", idx), (f"targets.{s}", targets)):
            if t.dtype != torch.int64 or t.dim() != 2:
                raise OracleError(f"{path}: '{name}' must be i64 [B, T] (got {t.dtype} {list(t.shape)})")
        if idx.shape != targets.shape:
            raise OracleError(f"{path}: idx.{s} {list(idx.shape)} and targets.{s} {list(targets.shape)} differ in shape")
        if not 1 <= idx.shape[1] <= model.block_size:
            raise OracleError(f"{path}: idx.{s} has T={idx.shape[1]}, expected 1..block_size={model.block_size}")
        if idx.numel() and (idx.min() < 0 or idx.max() >= model.vocab_size):
            raise OracleError(f"{path}: idx.{s} has token ids outside [0, {model.vocab_size})")
        bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= model.vocab_size))
        if bad.any():
            raise OracleError(f"{path}: targets.{s} has values outside [0, {model.vocab_size}) other than {IGNORE_INDEX}")
        batches.append((idx, targets))
    return params, batches


def run(in_path, config_path, out_path):
    model, cfg = read_config(config_path)
    dtype = _DTYPES[cfg["dtype"]]
    params, batches = split_inputs(in_path, model, cfg["steps"], dtype)

    optimizer = torch.optim.AdamW(
        adamw_param_groups(params, cfg["weight_decay"]),
        lr=cfg["lr"],
        betas=(cfg["beta1"], cfg["beta2"]),
        eps=cfg["eps"],
    )
    out = OrderedDict()
    losses = []
    for step, (idx, targets) in enumerate(batches):
        lr = lr_at(step, cfg["lr"], cfg["min_lr"], cfg["warmup_steps"], cfg["total_steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss = gpt_loss(params, idx, targets, model, cfg["precision"] == "bf16")
        loss.backward()
        losses.append(loss.detach().to(torch.float64))
        if step == 0:
            # Recorded before clipping: the C++ gradient test compares raw backward() output.
            out["loss"] = losses[0].clone()
            for name, p in params.items():
                out[f"grad.{name}"] = p.grad.detach().to(torch.float64).clone()
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["grad_clip"])
        optimizer.step()

    out["losses"] = torch.stack(losses)
    for name, p in params.items():
        out[f"final.{name}"] = p.detach().to(torch.float64).clone()
    hapt.save(out_path, out)


if __name__ == "__main__":
    sys.exit(oracle_cli.main(sys.argv, "gpt_oracle", run))
