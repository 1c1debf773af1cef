#!/usr/bin/python3
"""Per-op PyTorch reference: forward output and input gradients for one op on given inputs.

Usage: op_oracle.py IN.hapt SPEC.json OUT.hapt

SPEC.json  {"op": NAME, "attrs": {...}, "dtype": "float64" | "float32"}  (dtype defaults to float64)
IN.hapt    the op's inputs `in.0`, `in.1`, ... and `gout` (the upstream gradient, shaped like out)
OUT.hapt   (all f64) `out` and `grad.{i}` for every floating input i: the gradient of
           sum(out * gout) with respect to in.{i}.

Floating inputs are converted to dtype before the op; integer inputs (ids, targets) stay i64.
Ops whose HAP definition has no PyTorch 1.13 built-in (rms_norm, attention) are written out by
hand here, matching the formula the C++ op documents.
"""

import json
import math
import os
import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hapt  # noqa: E402
import oracle_cli  # noqa: E402
from oracle_cli import OracleError  # noqa: E402


def _softmax(inputs, attrs):
    (x,) = inputs
    return torch.softmax(x, dim=attrs["dim"])


def _log_softmax(inputs, attrs):
    (x,) = inputs
    return torch.log_softmax(x, dim=attrs["dim"])


def _layer_norm(inputs, attrs):
    x, weight, bias = inputs
    return F.layer_norm(x, (x.shape[-1],), weight, bias, attrs["eps"])


def _batch_norm(inputs, attrs):
    x, weight, bias = inputs
    return F.batch_norm(x, None, None, weight, bias, training=True, eps=attrs["eps"])


def _rms_norm(inputs, attrs):
    x, weight = inputs
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + attrs["eps"]) * weight


def _gelu(inputs, attrs):
    (x,) = inputs
    return F.gelu(x, approximate=attrs["approximate"])


def _cross_entropy(inputs, attrs):
    logits, targets = inputs
    return F.cross_entropy(logits, targets, ignore_index=attrs["ignore_index"],
                           label_smoothing=attrs["label_smoothing"], reduction=attrs["reduction"])


def _attention(inputs, attrs):
    q, k, v = inputs  # [B, H, T, D]
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    att = (q @ k.transpose(-2, -1)) * scale  # [B, H, T, T]
    if attrs["causal"]:
        T = q.shape[-2]
        future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
        att = att.masked_fill(future, float("-inf"))
    if attrs["key_mask"] is not None:  # [B, T]: 1 where a query may attend to that key
        keep = torch.tensor(attrs["key_mask"], dtype=torch.bool)
        att = att.masked_fill(~keep[:, None, None, :], float("-inf"))
    return att.softmax(dim=-1) @ v


def _embedding(inputs, attrs):
    weight, ids = inputs
    return F.embedding(ids, weight)


def _check_attention(inputs, attrs):
    q, k, v = inputs
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"q, k, v must be [B, H, T, D] (got {list(q.shape)}, {list(k.shape)}, {list(v.shape)})"
    if q.shape != k.shape or q.shape[:3] != v.shape[:3]:
        return f"q and k must match and v must share [B, H, T] (got {list(q.shape)}, {list(k.shape)}, {list(v.shape)})"
    return None


def _check_embedding(inputs, attrs):
    weight, ids = inputs
    if weight.dim() != 2:
        return f"weight must be [V, C] (got {list(weight.shape)})"
    if ids.numel() and (ids.min() < 0 or ids.max() >= weight.shape[0]):
        return f"ids must lie in [0, {weight.shape[0]})"
    return None


def _check_cross_entropy(inputs, attrs):
    logits, targets = inputs
    if logits.dim() != 2 or targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        return f"expects logits [N, V] and targets [N] (got {list(logits.shape)} and {list(targets.shape)})"
    V, ignore = logits.shape[1], attrs["ignore_index"]
    if ((targets != ignore) & ((targets < 0) | (targets >= V))).any():
        return f"targets must lie in [0, {V}) or equal ignore_index {ignore}"
    return None


def _check_norm(inputs, attrs):
    x, params = inputs[0], inputs[1:]
    for p in params:
        if tuple(p.shape) != (x.shape[-1],):
            return f"weight/bias must be [{x.shape[-1]}] to match the last dim of x {list(x.shape)} (got {list(p.shape)})"
    return None


def _conv2d(inputs, attrs):
    x, weight, bias = inputs
    return F.conv2d(x, weight, bias, stride=attrs["stride"], padding=attrs["padding"],
                    dilation=attrs["dilation"], groups=attrs["groups"])


def _max_pool2d(inputs, attrs):
    (x,) = inputs
    return F.max_pool2d(x, attrs["kernel"], attrs["stride"], attrs["padding"])


def _avg_pool2d(inputs, attrs):
    (x,) = inputs
    return F.avg_pool2d(x, attrs["kernel"], attrs["stride"], attrs["padding"], count_include_pad=True)


def _logsumexp(inputs, attrs):
    (x,) = inputs
    return torch.logsumexp(x, dim=-1)


# name -> (function, input kinds ("f" floating, "i" i64), {attr: (type check, default or REQUIRED)}, extra check)
REQUIRED = object()
_is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
_is_num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
_is_pair = lambda v: isinstance(v, list) and len(v) == 2 and all(_is_int(e) for e in v)  # noqa: E731
OPS = {
    "softmax": (_softmax, "f", {"dim": (_is_int, REQUIRED)}, None),
    "log_softmax": (_log_softmax, "f", {"dim": (_is_int, REQUIRED)}, None),
    "layer_norm": (_layer_norm, "fff", {"eps": (_is_num, REQUIRED)}, _check_norm),
    "rms_norm": (_rms_norm, "ff", {"eps": (_is_num, REQUIRED)}, _check_norm),
    "batch_norm": (_batch_norm, "fff", {"eps": (_is_num, REQUIRED)}, None),
    "gelu": (_gelu, "f", {"approximate": (lambda v: v in ("tanh", "none"), REQUIRED)}, None),
    "cross_entropy": (
        _cross_entropy,
        "fi",
        {"ignore_index": (_is_int, -100), "label_smoothing": (_is_num, 0.0),
         "reduction": (lambda v: v in ("mean", "sum", "none"), "mean")},
        _check_cross_entropy,
    ),
    "attention": (
        _attention,
        "fff",
        {"causal": (lambda v: isinstance(v, bool), REQUIRED), "scale": (lambda v: v is None or _is_num(v), None),
         "key_mask": (lambda v: v is None or (isinstance(v, list) and all(isinstance(r, list) for r in v)), None)},
        _check_attention,
    ),
    "embedding": (_embedding, "fi", {}, _check_embedding),
    "conv2d": (
        _conv2d,
        "fff",
        {"stride": (_is_pair, [1, 1]), "padding": (_is_pair, [0, 0]), "dilation": (_is_pair, [1, 1]),
         "groups": (_is_int, 1)},
        None,
    ),
    "max_pool2d": (_max_pool2d, "f", {"kernel": (_is_pair, REQUIRED), "stride": (_is_pair, REQUIRED),
                                      "padding": (_is_pair, [0, 0])}, None),
    "avg_pool2d": (_avg_pool2d, "f", {"kernel": (_is_pair, REQUIRED), "stride": (_is_pair, REQUIRED),
                                      "padding": (_is_pair, [0, 0])}, None),
    "logsumexp": (_logsumexp, "f", {}, None),
}
_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def read_spec(path):
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise OracleError(f"{path}: cannot read spec ({e})") from None
    if not isinstance(spec, dict):
        raise OracleError(f"{path}: expected a JSON object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - {"op", "attrs", "dtype"})
    if unknown:
        raise OracleError(f"{path}: unknown key(s) {unknown}; accepted: op, attrs, dtype")
    op = spec.get("op")
    if op not in OPS:
        raise OracleError(f"{path}: unknown op {op!r}; supported: {sorted(OPS)}")
    dtype = spec.get("dtype", "float64")
    if dtype not in _DTYPES:
        raise OracleError(f"{path}: 'dtype' must be one of {sorted(_DTYPES)} (got {dtype!r})")
    given = spec.get("attrs", {})
    if not isinstance(given, dict):
        raise OracleError(f"{path}: 'attrs' must be an object (got {given!r})")
    schema = OPS[op][2]
    unknown = sorted(set(given) - set(schema))
    if unknown:
        raise OracleError(f"{path}: op '{op}' has no attribute(s) {unknown}; it takes {sorted(schema) or 'none'}")
    attrs = {}
    for name, (valid, default) in schema.items():
        if name not in given:
            if default is REQUIRED:
                raise OracleError(f"{path}: op '{op}' needs attribute '{name}'")
            attrs[name] = default
        elif not valid(given[name]):
            raise OracleError(f"{path}: op '{op}' attribute '{name}' has invalid value {given[name]!r}")
        else:
            attrs[name] = given[name]
    return op, attrs, _DTYPES[dtype]


def read_inputs(path, op, dtype):
    try:
        tensors = hapt.load(path)
    except (OSError, hapt.HaptError) as e:
        raise OracleError(f"cannot read {path}: {e}") from None
    kinds = OPS[op][1]
    expected = [f"in.{i}" for i in range(len(kinds))] + ["gout"]
    if sorted(tensors) != sorted(expected):
        raise OracleError(f"{path}: op '{op}' expects tensors {expected}, file has {list(tensors)}")
    inputs = []
    for i, kind in enumerate(kinds):
        t = tensors[f"in.{i}"]
        if kind == "f":
            if not t.is_floating_point():
                raise OracleError(f"{path}: in.{i} of '{op}' must be floating point (got {t.dtype})")
            t = t.to(dtype).clone().requires_grad_(True)
        elif t.dtype != torch.int64:
            raise OracleError(f"{path}: in.{i} of '{op}' must be i64 (got {t.dtype})")
        inputs.append(t)
    gout = tensors["gout"]
    if not gout.is_floating_point():
        raise OracleError(f"{path}: gout must be floating point (got {gout.dtype})")
    return inputs, gout.to(dtype)


def run(in_path, spec_path, out_path):
    op, attrs, dtype = read_spec(spec_path)
    inputs, gout = read_inputs(in_path, op, dtype)
    fn, kinds, _, check = OPS[op]
    if check is not None:
        problem = check(inputs, attrs)
        if problem:
            raise OracleError(f"{in_path}: op '{op}': {problem}")
    try:
        out = fn(inputs, attrs)
    except (RuntimeError, IndexError) as e:
        raise OracleError(f"{in_path}: op '{op}' rejected its inputs: {e}") from None
    if gout.shape != out.shape:
        raise OracleError(f"{in_path}: gout has shape {list(gout.shape)}, the output of '{op}' has {list(out.shape)}")
    (out * gout).sum().backward()

    result = OrderedDict(out=out.detach().to(torch.float64))
    for i, (t, kind) in enumerate(zip(inputs, kinds)):
        if kind == "f":
            result[f"grad.{i}"] = t.grad.to(torch.float64)
    hapt.save(out_path, result)


if __name__ == "__main__":
    sys.exit(oracle_cli.main(sys.argv, "op_oracle", run, config="SPEC.json"))
