"""The `.etbt` tensor file that etb_runner reads (inputs) and writes (``--output-dir``).

Little-endian: ``"ETBT"``, u32 version (1), u32 dtype (ScalarType code), u32 ndim,
ndim x i64 sizes, then the row-major data. See runtime_src/runner/main.cpp.
"""

from __future__ import annotations

import struct
from pathlib import Path

import torch

from .scalar_types import DTYPES
from .scalar_types import SCALAR_TYPES as CODES


def encode(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    header = b"ETBT" + struct.pack("<III", 1, CODES[t.dtype], t.dim())
    header += struct.pack(f"<{t.dim()}q", *t.shape)
    return header + t.reshape(-1).view(torch.uint8).numpy().tobytes()


def write(path: Path, t: torch.Tensor) -> None:
    path.write_bytes(encode(t))


def read(path: Path) -> torch.Tensor:
    data = path.read_bytes()
    if data[:4] != b"ETBT":
        raise ValueError(f"{path} is not a .etbt file")
    version, code, ndim = struct.unpack_from("<III", data, 4)
    if version != 1 or code not in DTYPES:
        raise ValueError(f"{path}: unsupported .etbt version {version} or dtype {code}")
    sizes = struct.unpack_from(f"<{ndim}q", data, 16)
    body = bytearray(data[16 + 8 * ndim :])
    flat = torch.frombuffer(body, dtype=torch.uint8) if body else torch.empty(0, dtype=torch.uint8)
    return flat.view(DTYPES[code]).reshape(sizes).clone()
