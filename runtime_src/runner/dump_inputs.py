"""Write a bundled reference.pt's inputs as .etbt files for etb_runner.

usage: python dump_inputs.py RUN_DIR/reference.pt OUT_DIR  -> OUT_DIR/input_0.etbt, ...
Format: see runtime_src/runner/main.cpp.
"""

import sys
from pathlib import Path

import torch

from etbuild.pipeline import etbt


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    ref = torch.load(sys.argv[1])
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for i, t in enumerate(ref["inputs"]):
        etbt.write(out / f"input_{i}.etbt", t)
        print(out / f"input_{i}.etbt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
