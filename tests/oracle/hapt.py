"""Read and write HAP tensor files (.hapt), the format the C++ tests and the PyTorch oracles share.

Layout (all integers little-endian):
    b"HAPT", u32 version (= 1), u32 tensor count, then per tensor:
    u32 name length, UTF-8 name, u8 dtype code, u32 ndim, ndim x i64 dims, raw row-major data.
dtype codes: 0 = f32, 1 = bf16 (the upper 16 bits of an f32), 2 = f64, 3 = i64, 4 = u8.
A scalar has ndim 0 and one element.
"""

import struct
from collections import OrderedDict

import numpy as np
import torch

MAGIC = b"HAPT"
VERSION = 1

# code -> (torch dtype, little-endian numpy dtype of the stored bytes). bf16 is carried through
# numpy as raw uint16 bits because numpy has no bfloat16.
_CODES = {
    0: (torch.float32, np.dtype("<f4")),
    1: (torch.bfloat16, np.dtype("<u2")),
    2: (torch.float64, np.dtype("<f8")),
    3: (torch.int64, np.dtype("<i8")),
    4: (torch.uint8, np.dtype("u1")),
}
_CODE_OF = {torch_dtype: code for code, (torch_dtype, _) in _CODES.items()}


class HaptError(ValueError):
    """A .hapt file is malformed, or a tensor cannot be stored in one."""


def _to_numpy(name, tensor):
    if not isinstance(tensor, torch.Tensor):
        raise HaptError(f"tensor '{name}': expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _CODE_OF:
        supported = ", ".join(str(d) for d in _CODE_OF)
        raise HaptError(f"tensor '{name}': dtype {tensor.dtype} cannot be stored (supported: {supported})")
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)  # same bits, a dtype numpy understands
    return _CODE_OF[tensor.dtype], t.numpy()


def save(path, tensors):
    """Write an ordered mapping name -> torch.Tensor to `path`, keeping each tensor's dtype."""
    chunks = [MAGIC, struct.pack("<II", VERSION, len(tensors))]
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name:
            raise HaptError(f"tensor names must be non-empty strings (got {name!r})")
        code, array = _to_numpy(name, tensor)
        name_bytes = name.encode("utf-8")
        chunks.append(struct.pack("<I", len(name_bytes)))
        chunks.append(name_bytes)
        chunks.append(struct.pack("<BI", code, array.ndim))
        chunks.append(struct.pack(f"<{array.ndim}q", *array.shape))
        chunks.append(array.astype(_CODES[code][1], copy=False).tobytes(order="C"))
    with open(path, "wb") as f:
        f.write(b"".join(chunks))


class _Reader:
    def __init__(self, path, data):
        self.path = path
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n, what):
        if self.pos + n > len(self.data):
            raise HaptError(
                f"{self.path}: truncated while reading {what} "
                f"(needs {n} bytes at offset {self.pos}, file has {len(self.data)})"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))


def load(path):
    """Read `path` into an OrderedDict name -> torch.Tensor (dtypes as stored, file order)."""
    with open(path, "rb") as f:
        r = _Reader(path, f.read())
    magic = bytes(r.take(4, "magic"))
    if magic != MAGIC:
        raise HaptError(f"{path}: not a .hapt file (magic {magic!r}, expected {MAGIC!r})")
    version, count = r.unpack("<II", "header")
    if version != VERSION:
        raise HaptError(f"{path}: unsupported .hapt version {version} (this reader knows {VERSION})")
    tensors = OrderedDict()
    for i in range(count):
        (name_len,) = r.unpack("<I", f"name length of tensor #{i}")
        try:
            name = bytes(r.take(name_len, f"name of tensor #{i}")).decode("utf-8")
        except UnicodeDecodeError as e:
            raise HaptError(f"{path}: name of tensor #{i} is not UTF-8 ({e})") from None
        if name in tensors:
            raise HaptError(f"{path}: tensor name '{name}' appears twice")
        code, ndim = r.unpack("<BI", f"dtype and ndim of '{name}'")
        if code not in _CODES:
            raise HaptError(f"{path}: tensor '{name}' has unknown dtype code {code} (known: {sorted(_CODES)})")
        dims = r.unpack(f"<{ndim}q", f"dims of '{name}'")
        if any(d < 0 for d in dims):
            raise HaptError(f"{path}: tensor '{name}' has a negative dim in {list(dims)}")
        torch_dtype, np_dtype = _CODES[code]
        numel = int(np.prod(dims, dtype=np.int64)) if ndim else 1
        raw = r.take(numel * np_dtype.itemsize, f"data of '{name}' ({numel} elements)")
        # copy() detaches the array from the file buffer and makes it writable for torch.
        array = np.frombuffer(raw, dtype=np_dtype).astype(np_dtype.newbyteorder("="), copy=True)
        if torch_dtype == torch.bfloat16:
            t = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(array)
        tensors[name] = t.reshape(dims)
    if r.pos != len(r.data):
        raise HaptError(f"{path}: {len(r.data) - r.pos} unexpected bytes after the last of {count} tensors")
    return tensors
