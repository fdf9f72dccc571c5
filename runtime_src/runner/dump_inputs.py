"""Write a bundled reference.pt's inputs as .etbt files for etb_runner.

usage: python dump_inputs.py RUN_DIR/reference.pt OUT_DIR  -> OUT_DIR/input_0.etbt, ...
Format: see runtime_src/runner/main.cpp.
"""

import struct
import sys
from pathlib import Path

import torch

CODES = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.bool: 11,
}


def write_etbt(path: Path, t: torch.Tensor) -> None:
    t = t.detach().contiguous()
    header = b"ETBT" + struct.pack("<III", 1, CODES[t.dtype], t.dim())
    header += struct.pack(f"<{t.dim()}q", *t.shape)
    path.write_bytes(header + t.reshape(-1).view(torch.uint8).numpy().tobytes())


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    ref = torch.load(sys.argv[1])
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for i, t in enumerate(ref["inputs"]):
        write_etbt(out / f"input_{i}.etbt", t)
        print(out / f"input_{i}.etbt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
