"""The `.etbt` tensor file that etb_runner reads (inputs) and writes (``--output-dir``).

Little-endian: ``"ETBT"``, u32 version (1), u32 dtype (the program schema's ScalarType code:
6 Float, 4 Long, 3 Int, 1 Char, 11 Bool, ...), u32 ndim, ndim x i64 sizes, then the row-major
data. See runtime_src/runner/main.cpp.

    python -m etbuild.pipeline.etbt RUN_DIR/reference.pt OUT_DIR

writes a build's reference inputs as OUT_DIR/input_0.etbt, input_1.etbt, ... for
``etb_runner model.pte --input OUT_DIR/input_0.etbt ...``.
"""

from __future__ import annotations

import struct
import sys
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


def main(argv: list[str]) -> int:
    """``reference.pt OUT_DIR``: the reference inputs as .etbt files, one path a line."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    ref = torch.load(argv[0], weights_only=True)
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for i, t in enumerate(ref["inputs"]):
        write(out / f"input_{i}.etbt", t)
        print(out / f"input_{i}.etbt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
