#!/usr/bin/python3
"""PyTorch twins of the zoo's models: the golden loss and parameter gradients for oracle tests.

Usage: model_oracle.py IN.hapt CONFIG.json OUT.hapt

CONFIG    {"model": NAME, "options": {...every option of the model, as the C++ zoo resolved
          them...}, "dtype": "float64" (default) or "float32"}.
IN.hapt   every parameter by its C++ name and every model input by name (see each model below).
OUT.hapt  (all f64) `loss` (scalar) and `grad.{name}` for every parameter.

Each model is written functionally over a dict of named tensors, so that the names are exactly
the ones the C++ model registers. Dropout must be 0 (the oracle has no access to our RNG).
"""

import json
import os
import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hapt  # noqa: E402


class OracleError(Exception):
    """Bad arguments or inputs; main() prints the message and exits with status 2."""


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
            shapes[f"features.{s}.{j}.bias"] = (out,)
            channels = out
    side = o["image_size"] // 32
    shapes["classifier.fc1.weight"] = (o["hidden"], channels * side * side)
    shapes["classifier.fc1.bias"] = (o["hidden"],)
    shapes["classifier.fc2.weight"] = (o["hidden"], o["hidden"])
    shapes["classifier.fc2.bias"] = (o["hidden"],)
    shapes["classifier.head.weight"] = (o["num_classes"], o["hidden"])
    shapes["classifier.head.bias"] = (o["num_classes"],)
    return shapes


def vgg_loss(p, inputs, o):
    x = inputs["images"]
    for s, layers in enumerate(VGG_STAGES[o["depth"]]):
        for j in range(layers):
            x = F.relu(F.conv2d(x, p[f"features.{s}.{j}.weight"], p[f"features.{s}.{j}.bias"], padding=1))
        x = F.max_pool2d(x, 2)
    x = x.reshape(x.shape[0], -1)
    x = F.relu(F.linear(x, p["classifier.fc1.weight"], p["classifier.fc1.bias"]))
    x = F.relu(F.linear(x, p["classifier.fc2.weight"], p["classifier.fc2.bias"]))
    logits = F.linear(x, p["classifier.head.weight"], p["classifier.head.bias"])
    return F.cross_entropy(logits, inputs["labels"])


MODELS = {
    "vgg19": (vgg_parameter_shapes, vgg_loss, ("images", "labels")),
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
    shapes_of, loss_of, input_names = MODELS[name]
    try:
        shapes = shapes_of(options)
    except KeyError as e:
        raise OracleError(f"{config_path}: option {e} is missing for model {name}") from None
    try:
        tensors = hapt.load(in_path)
    except (OSError, hapt.HaptError) as e:
        raise OracleError(f"cannot read {in_path}: {e}") from None
    missing = [n for n in list(shapes) + list(input_names) if n not in tensors]
    if missing:
        raise OracleError(f"{in_path}: missing tensor(s) {missing[:8]}")
    unknown = [n for n in tensors if n not in shapes and n not in input_names]
    if unknown:
        raise OracleError(f"{in_path}: unexpected tensor(s) {unknown[:8]}")
    params = OrderedDict()
    for pname, shape in shapes.items():
        t = tensors[pname]
        if tuple(t.shape) != shape:
            raise OracleError(f"{in_path}: parameter '{pname}' has shape {list(t.shape)}, expected {list(shape)}")
        params[pname] = t.to(dtype).clone().requires_grad_(True)
    inputs = {n: (tensors[n].to(dtype) if tensors[n].is_floating_point() else tensors[n]) for n in input_names}
    loss = loss_of(params, inputs, options)
    loss.backward()
    out = OrderedDict()
    out["loss"] = loss.detach().to(torch.float64)
    for pname, p in params.items():
        if p.grad is None:
            raise OracleError(f"parameter '{pname}' got no gradient in the {name} twin")
        out[f"grad.{pname}"] = p.grad.detach().to(torch.float64)
    hapt.save(out_path, out)


def main(argv):
    if len(argv) != 4:
        print(f"usage: {os.path.basename(argv[0])} IN.hapt CONFIG.json OUT.hapt", file=sys.stderr)
        return 2
    try:
        run(argv[1], argv[2], argv[3])
    except OracleError as e:
        print(f"model_oracle: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
