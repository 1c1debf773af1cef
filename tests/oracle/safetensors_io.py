"""Read and write safetensors files by parsing the format's layout with PyTorch and the standard
library (Debian has no `safetensors` package): an 8-byte little-endian header size N, N bytes of
JSON ({name: {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}}), then the data.

HAP's checkpoints add CRC-32 checksums to "__metadata__" ("hap.crc32.<name>" per tensor and
"hap.header_crc32" over the rest of the header, models/safetensors.h); load() verifies them when
present, independently of the C++ reader.
"""

import json
import struct
import zlib
from collections import OrderedDict

import torch

DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I64": torch.int64,
    "U8": torch.uint8,
}
NAMES = {v: k for k, v in DTYPES.items()}
CRC_PREFIX = "hap.crc32."
HEADER_CRC = "hap.header_crc32"


class SafetensorsError(ValueError):
    """A file is not a well-formed safetensors file, or its checksums do not match."""


def _hex(crc):
    return f"{crc & 0xFFFFFFFF:08x}"


def header_crc(entries, metadata):
    """The C++ canonical form: per tensor in data order name\\0dtype\\0d0,d1,..,\\0begin\\0end\\n,
    then the metadata sorted by key (without hap.header_crc32) as key\\0value\\n."""
    s = b""
    for name, dtype, shape, begin, end in entries:
        dims = "".join(f"{d}," for d in shape)
        s += f"{name}\0{dtype}\0{dims}\0{begin}\0{end}\n".encode("utf-8")
    for k in sorted(metadata, key=lambda k: k.encode("utf-8")):
        if k != HEADER_CRC:
            s += f"{k}\0{metadata[k]}\n".encode("utf-8")
    return _hex(zlib.crc32(s))


def load(path):
    """(OrderedDict name -> tensor in data order, metadata dict, verified: bool)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SafetensorsError(f"{path}: {len(data)} bytes, too short")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise SafetensorsError(f"{path}: header size {n} exceeds the file")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    body = data[8 + n :]
    entries = []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        entries.append((name, info["dtype"], list(info["shape"]), begin, end))
    entries.sort(key=lambda e: (e[3], e[4]))
    expected = 0
    for name, _, _, begin, end in entries:
        if begin != expected:
            raise SafetensorsError(f"{path}: tensor '{name}' starts at {begin}, expected {expected}")
        expected = end
    if expected != len(body):
        raise SafetensorsError(f"{path}: data takes {expected} bytes, the file holds {len(body)}")
    verified = HEADER_CRC in metadata
    if verified and metadata[HEADER_CRC] != header_crc(entries, metadata):
        raise SafetensorsError(f"{path}: header checksum mismatch")
    tensors = OrderedDict()
    for name, dtype, shape, begin, end in entries:
        raw = body[begin:end]
        if verified and metadata.get(CRC_PREFIX + name) != _hex(zlib.crc32(raw)):
            raise SafetensorsError(f"{path}: checksum of '{name}' does not match")
        torch_dtype = DTYPES[dtype]
        numel = 1
        for d in shape:
            numel *= d
        if numel * torch.empty((), dtype=torch_dtype).element_size() != end - begin:
            raise SafetensorsError(f"{path}: '{name}' size does not match its shape")
        t = torch.frombuffer(bytearray(raw), dtype=torch_dtype) if raw else torch.empty(0, dtype=torch_dtype)
        tensors[name] = t.reshape(shape)
    meta = {k: v for k, v in metadata.items() if k != HEADER_CRC and not k.startswith(CRC_PREFIX)}
    return tensors, meta, verified


def save(path, tensors, metadata=None):
    """Plain safetensors (no HAP checksums), as another framework would write it: the tensors
    in reverse order of their data, keys sorted by json, header padded to 8 bytes."""
    header = {}
    chunks = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        chunks.append(raw)
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, sort_keys=True).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
