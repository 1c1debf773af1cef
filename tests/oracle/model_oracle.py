#!/usr/bin/python3
"""PyTorch twins of the zoo's models: the golden loss and parameter gradients for oracle tests.

Usage: model_oracle.py IN.hapt CONFIG.json OUT.hapt

CONFIG    {"model": NAME, "options": {...every option of the model, as the C++ zoo resolved
          them...}, "dtype": "float64" (default) or "float32"}.
IN.hapt   every parameter and buffer by its C++ name and every model input by name (see each
          model below).
OUT.hapt  (all f64) `loss` (scalar) and `grad.{name}` for every parameter; for a model with
          buffers (running statistics) also `buffer.{name}`, each after the training forward,
          and `eval_loss` and `eval_grad.{name}`, the loss and gradients of an evaluation
          forward with them.

Each model is written functionally over a dict of named tensors, so that the names are exactly
the ones the C++ model registers. Dropout must be 0 (the oracle has no access to our RNG).
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


# ---------------------------------------------------------------------------------------------
# vgg19: stages of 3x3 convolutions (padding 1) + ReLU, 2x2 max pooling after each stage, then
# fc1 -> ReLU -> fc2 -> ReLU -> head. Inputs images f32 [B, C, S, S], labels i64 [B].

VGG_STAGES = {11: (1, 1, 2, 2, 2), 13: (2, 2, 2, 2, 2), 16: (2, 2, 3, 3, 3), 19: (2, 2, 4, 4, 4)}
VGG_WIDTH = (1, 2, 4, 8, 8)


def vgg_parameter_shapes(o):
    shapes = OrderedDict()
    channels = o["in_channels"]
    for s, layers in enumerate(VGG_STAGES[o["depth"]]):
        out = o["width"] * VGG_WIDTH[s]
        for j in range(layers):
            shapes[f"features.{s}.{j}.weight"] = (out, channels, 3, 3)
            if not o.get("batch_norm", False):  # a bias before BatchNorm would be cancelled
                shapes[f"features.{s}.{j}.bias"] = (out,)
            else:
                shapes[f"features.{s}.norm{j}.weight"] = (out,)
                shapes[f"features.{s}.norm{j}.bias"] = (out,)
            channels = out
    side = o["image_size"] // 32
    shapes["classifier.fc1.weight"] = (o["hidden"], channels * side * side)
    shapes["classifier.fc1.bias"] = (o["hidden"],)
    shapes["classifier.fc2.weight"] = (o["hidden"], o["hidden"])
    shapes["classifier.fc2.bias"] = (o["hidden"],)
    shapes["classifier.head.weight"] = (o["num_classes"], o["hidden"])
    shapes["classifier.head.bias"] = (o["num_classes"],)
    return shapes


def vgg_buffer_shapes(o):
    shapes = OrderedDict()
    if o.get("batch_norm", False):
        for s, layers in enumerate(VGG_STAGES[o["depth"]]):
            for j in range(layers):
                for stat in ("running_mean", "running_var"):
                    shapes[f"features.{s}.norm{j}.{stat}"] = (o["width"] * VGG_WIDTH[s],)
    return shapes


def vgg_loss(p, inputs, o, b, training):
    x = inputs["images"]
    for s, layers in enumerate(VGG_STAGES[o["depth"]]):
        for j in range(layers):
            x = F.conv2d(x, p[f"features.{s}.{j}.weight"], p.get(f"features.{s}.{j}.bias"), padding=1)
            if o.get("batch_norm", False):  # running statistics updated in place in training
                n = f"features.{s}.norm{j}"
                x = F.batch_norm(x, b[f"{n}.running_mean"], b[f"{n}.running_var"],
                                 p[f"{n}.weight"], p[f"{n}.bias"], training=training,
                                 momentum=0.1, eps=1e-5)
            x = F.relu(x)
        x = F.max_pool2d(x, 2)
    x = x.reshape(x.shape[0], -1)
    x = F.relu(F.linear(x, p["classifier.fc1.weight"], p["classifier.fc1.bias"]))
    x = F.relu(F.linear(x, p["classifier.fc2.weight"], p["classifier.fc2.bias"]))
    logits = F.linear(x, p["classifier.head.weight"], p["classifier.head.bias"])
    return F.cross_entropy(logits, inputs["labels"])


# ---------------------------------------------------------------------------------------------
# Transformer blocks shared by vit and bert: pre-norm, x + attn(ln1(x)), x + mlp(ln2(x)).

LN_EPS = 1e-5


def self_attention(x, p, prefix, n_head, causal):
    B, T, C = x.shape
    D = C // n_head
    # HAP stacks the q, k, v weights as [3, C, C]: the same numbers as one [3C, C] linear.
    w = p[prefix + "qkv.weight"].reshape(3 * C, C)
    qkv = F.linear(x, w, p[prefix + "qkv.bias"].reshape(3 * C))
    q, k, v = (t.view(B, T, n_head, D).transpose(1, 2) for t in qkv.split(C, dim=2))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    if causal:
        future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
        att = att.masked_fill(future, float("-inf"))
    y = (att.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    return F.linear(y, p[prefix + "proj.weight"], p[prefix + "proj.bias"])


def block(x, p, prefix, n_head, causal):
    C = x.shape[-1]
    h = F.layer_norm(x, (C,), p[prefix + "ln1.weight"], p[prefix + "ln1.bias"], LN_EPS)
    x = x + self_attention(h, p, prefix + "attn.", n_head, causal)
    h = F.layer_norm(x, (C,), p[prefix + "ln2.weight"], p[prefix + "ln2.bias"], LN_EPS)
    h = F.gelu(F.linear(h, p[prefix + "mlp.fc.weight"], p[prefix + "mlp.fc.bias"]), approximate="tanh")
    return x + F.linear(h, p[prefix + "mlp.proj.weight"], p[prefix + "mlp.proj.bias"])


def moe_layer(x, p, prefix, o):
    """Top-k MoE with GShard routing per sequence (models/moe.h); returns (y, aux loss)."""
    B, T, C = x.shape
    E, k = o["num_experts"], o["top_k"]
    cap = max(1, math.ceil(T * o["capacity_factor"] / E))
    probs = F.linear(x, p[prefix + "gate.weight"]).softmax(dim=-1)
    top, idx = probs.topk(k, dim=-1)
    gates = top / top.sum(dim=-1, keepdim=True)
    route = torch.zeros(B, T, k, E, cap, dtype=x.dtype)  # 1 where choice (t, j) sits in (e, slot)
    for b in range(B):
        used = [0] * E
        for j in range(k):
            for t in range(T):
                e = int(idx[b, t, j])
                if used[e] < cap:
                    route[b, t, j, e, used[e]] = 1
                    used[e] += 1
    buf = torch.einsum("btjes,btc->besc", route, x)
    h = F.gelu(buf @ p[prefix + "w1"] + p[prefix + "b1"][:, None, :], approximate="tanh")
    out = h @ p[prefix + "w2"] + p[prefix + "b2"][:, None, :]
    y = torch.einsum("btjes,btj,besc->btc", route, gates, out)
    share = F.one_hot(idx[..., 0], E).to(x.dtype).mean(dim=(0, 1))
    aux = E * (probs.mean(dim=(0, 1)) * share).sum()
    return y, aux


def moe_block(x, p, prefix, o, causal):
    C = x.shape[-1]
    h = F.layer_norm(x, (C,), p[prefix + "ln1.weight"], p[prefix + "ln1.bias"], LN_EPS)
    x = x + self_attention(h, p, prefix + "attn.", o["n_head"], causal)
    h = F.layer_norm(x, (C,), p[prefix + "ln2.weight"], p[prefix + "ln2.bias"], LN_EPS)
    y, aux = moe_layer(h, p, prefix + "moe.", o)
    return x + y, aux


def block_shapes(shapes, prefix, C, hidden):
    shapes[prefix + "ln1.weight"] = (C,)
    shapes[prefix + "ln1.bias"] = (C,)
    shapes[prefix + "attn.qkv.weight"] = (3, C, C)  # q, k, v stacked
    shapes[prefix + "attn.qkv.bias"] = (3, C)
    shapes[prefix + "attn.proj.weight"] = (C, C)
    shapes[prefix + "attn.proj.bias"] = (C,)
    shapes[prefix + "ln2.weight"] = (C,)
    shapes[prefix + "ln2.bias"] = (C,)
    shapes[prefix + "mlp.fc.weight"] = (hidden, C)
    shapes[prefix + "mlp.fc.bias"] = (hidden,)
    shapes[prefix + "mlp.proj.weight"] = (C, hidden)
    shapes[prefix + "mlp.proj.bias"] = (C,)


# ---------------------------------------------------------------------------------------------
# vit: patch convolution (stride = kernel = patch), class token, positions, bidirectional
# blocks, final LayerNorm, head on the class token. Inputs images, labels as vgg19.


def vit_parameter_shapes(o):
    C, P = o["n_embd"], o["patch_size"]
    N = (o["image_size"] // P) ** 2
    shapes = OrderedDict()
    shapes["patch.weight"] = (C, o["in_channels"], P, P)
    shapes["patch.bias"] = (C,)
    shapes["cls_token"] = (1, 1, C)
    shapes["pos_embed"] = (1, N + 1, C)
    for i in range(o["n_layer"]):
        block_shapes(shapes, f"blocks.{i}.", C, o["hidden"])
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    shapes["head.weight"] = (o["num_classes"], C)
    shapes["head.bias"] = (o["num_classes"],)
    return shapes


def vit_loss(p, inputs, o, b, training):
    images = inputs["images"]
    B, C = images.shape[0], o["n_embd"]
    x = F.conv2d(images, p["patch.weight"], p["patch.bias"], stride=o["patch_size"])
    x = x.reshape(B, C, -1).transpose(1, 2)
    x = torch.cat([p["cls_token"].expand(B, 1, C), x], dim=1) + p["pos_embed"]
    for i in range(o["n_layer"]):
        x = block(x, p, f"blocks.{i}.", o["n_head"], causal=False)
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], LN_EPS)
    logits = F.linear(x[:, 0], p["head.weight"], p["head.bias"])
    return F.cross_entropy(logits, inputs["labels"])


# ---------------------------------------------------------------------------------------------
# bert: token + position embeddings, embedding LayerNorm, blocks (causal unless mlm), final
# LayerNorm, head dense -> gelu -> LayerNorm -> tied decoder + bias. Inputs: idx, targets
# (causal); under mlm the C++ test passes the corrupted ids and targets the model drew
# (`mlm.inputs`, `mlm.targets`: the oracle cannot replay our generator) beside idx.


def bert_parameter_shapes(o):
    C, H = o["n_embd"], o["hidden"]
    V = o["vocab_size"] + (1 if o["objective"] == "mlm" else 0)
    shapes = OrderedDict()
    shapes["wte.weight"] = (V, C)
    shapes["wpe.weight"] = (o["seq_len"], C)
    shapes["ln_emb.weight"] = (C,)
    shapes["ln_emb.bias"] = (C,)
    E = o.get("num_experts", 0)
    for i in range(o["n_layer"]):
        pre = f"blocks.{i}."
        if E and i % 2 == 1:
            for n in ("ln1.weight", "ln1.bias"):
                shapes[pre + n] = (C,)
            shapes[pre + "attn.qkv.weight"] = (3, C, C)
            shapes[pre + "attn.qkv.bias"] = (3, C)
            shapes[pre + "attn.proj.weight"] = (C, C)
            shapes[pre + "attn.proj.bias"] = (C,)
            for n in ("ln2.weight", "ln2.bias"):
                shapes[pre + n] = (C,)
            shapes[pre + "moe.gate.weight"] = (E, C)
            shapes[pre + "moe.w1"] = (E, C, H)
            shapes[pre + "moe.b1"] = (E, H)
            shapes[pre + "moe.w2"] = (E, H, C)
            shapes[pre + "moe.b2"] = (E, C)
        else:
            block_shapes(shapes, pre, C, H)
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    shapes["head.bias"] = (V,)
    shapes["head.dense.weight"] = (C, C)
    shapes["head.dense.bias"] = (C,)
    shapes["head.ln.weight"] = (C,)
    shapes["head.ln.bias"] = (C,)
    return shapes


def bert_inputs(o):
    return ("idx", "mlm.inputs", "mlm.targets") if o["objective"] == "mlm" else ("idx", "targets")


def bert_loss(p, inputs, o, b, training):
    mlm = o["objective"] == "mlm"
    idx, targets = (inputs["mlm.inputs"], inputs["mlm.targets"]) if mlm else (inputs["idx"], inputs["targets"])
    C = o["n_embd"]
    x = F.embedding(idx, p["wte.weight"]) + p["wpe.weight"]
    x = F.layer_norm(x, (C,), p["ln_emb.weight"], p["ln_emb.bias"], LN_EPS)
    aux = 0.0
    for i in range(o["n_layer"]):
        if o.get("num_experts", 0) and i % 2 == 1:
            x, a = moe_block(x, p, f"blocks.{i}.", o, causal=not mlm)
            aux = aux + a
        else:
            x = block(x, p, f"blocks.{i}.", o["n_head"], causal=not mlm)
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], LN_EPS)
    x = F.gelu(F.linear(x, p["head.dense.weight"], p["head.dense.bias"]), approximate="tanh")
    x = F.layer_norm(x, (C,), p["head.ln.weight"], p["head.ln.bias"], LN_EPS)
    logits = F.linear(x, p["wte.weight"], p["head.bias"])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    return loss + o.get("aux_loss_coef", 0.0) * aux


def no_buffers(o):
    return OrderedDict()


# name: (parameter shapes, loss(params, inputs, options, buffers, training), input names,
#        buffer shapes)
MODELS = {
    "vgg19": (vgg_parameter_shapes, vgg_loss, lambda o: ("images", "labels"), vgg_buffer_shapes),
    "vit": (vit_parameter_shapes, vit_loss, lambda o: ("images", "labels"), no_buffers),
    "bert": (bert_parameter_shapes, bert_loss, bert_inputs, no_buffers),
    "bert_moe": (bert_parameter_shapes, bert_loss, bert_inputs, no_buffers),
}

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def read_config(path):
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise OracleError(f"{path}: cannot read config ({e})") from None
    if not isinstance(raw, dict):
        raise OracleError(f"{path}: expected a JSON object")
    unknown = sorted(set(raw) - {"model", "options", "dtype"})
    if unknown:
        raise OracleError(f"{path}: unknown key(s) {unknown}; accepted: model, options, dtype")
    if raw.get("model") not in MODELS:
        raise OracleError(f"{path}: 'model' must be one of {sorted(MODELS)} (got {raw.get('model')!r})")
    options = raw.get("options")
    if not isinstance(options, dict):
        raise OracleError(f"{path}: 'options' must be an object of the model's options")
    if options.get("dropout", 0) != 0:
        raise OracleError(f"{path}: dropout must be 0 in the oracle (got {options['dropout']})")
    dtype = raw.get("dtype", "float64")
    if dtype not in _DTYPES:
        raise OracleError(f"{path}: 'dtype' must be one of {sorted(_DTYPES)} (got {dtype!r})")
    return raw["model"], options, _DTYPES[dtype]


def run(in_path, config_path, out_path):
    name, options, dtype = read_config(config_path)
    shapes_of, loss_of, inputs_of, buffer_shapes_of = MODELS[name]
    try:
        shapes = shapes_of(options)
        buffer_shapes = buffer_shapes_of(options)
        input_names = inputs_of(options)
    except KeyError as e:
        raise OracleError(f"{config_path}: option {e} is missing for model {name}") from None
    tensors = oracle_cli.load_tensors(in_path, list(shapes) + list(buffer_shapes) + list(input_names))

    def leaf(pname, shape, what):
        t = tensors[pname]
        if tuple(t.shape) != shape:
            raise OracleError(f"{in_path}: {what} '{pname}' has shape {list(t.shape)}, expected {list(shape)}")
        return t.to(dtype).clone()

    params = OrderedDict((n, leaf(n, s, "parameter").requires_grad_(True)) for n, s in shapes.items())
    buffers = OrderedDict((n, leaf(n, s, "buffer")) for n, s in buffer_shapes.items())
    inputs = {n: (tensors[n].to(dtype) if tensors[n].is_floating_point() else tensors[n]) for n in input_names}
    loss = loss_of(params, inputs, options, buffers, True)
    loss.backward()
    out = OrderedDict()
    out["loss"] = loss.detach().to(torch.float64)
    for pname, p in params.items():
        if p.grad is None:
            raise OracleError(f"parameter '{pname}' got no gradient in the {name} twin")
        out[f"grad.{pname}"] = p.grad.detach().to(torch.float64)
    if buffers:
        for bname, b in buffers.items():
            out[f"buffer.{bname}"] = b.to(torch.float64)
        for p in params.values():
            p.grad = None
        eval_loss = loss_of(params, inputs, options, buffers, False)
        eval_loss.backward()
        out["eval_loss"] = eval_loss.detach().to(torch.float64)
        for pname, p in params.items():
            out[f"eval_grad.{pname}"] = p.grad.detach().to(torch.float64)
    hapt.save(out_path, out)


if __name__ == "__main__":
    sys.exit(oracle_cli.main(sys.argv, "model_oracle", run))
