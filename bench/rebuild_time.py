"""Wall time of a second identical `etbuild` against the first, both from an empty cache.

Runs the `etbuild` command twice with the same arguments and a fresh, private cache folder
(`build.cache_dir`): the first run does everything (export, lowering, the runtime build), the
second restores the stage cache and the build cache. Prints both times and their ratio.

    python bench/rebuild_time.py [--model mobilenet] [extra etbuild overrides ...]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_run(args: list[str]) -> float:
    exe = shutil.which("etbuild") or "etbuild"
    t0 = time.perf_counter()
    proc = subprocess.run([exe, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"etbuild {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenet")
    p.add_argument("overrides", nargs="*", help="more etbuild overrides")
    opts = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="etb_rebuild_") as tmp:
        base = [f"model={opts.model}", f"build.cache_dir={tmp}/cache", *opts.overrides]
        first = timed_run([*base, f"hydra.run.dir={Path(tmp) / 'first'}"])
        second = timed_run([*base, f"hydra.run.dir={Path(tmp) / 'second'}"])
    print(f"model {opts.model}: first run {first:.2f} s, second identical run {second:.2f} s")
    print(f"ratio second / first: {second / first:.3f} (target: at most 0.25)")


if __name__ == "__main__":
    main()
