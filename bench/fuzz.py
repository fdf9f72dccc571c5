"""A long fuzzing campaign over the runtime: libFuzzer with AddressSanitizer + UBSan
(tests/fuzz/program_fuzzer.cpp) on the seed programs of tests/fuzz/make_corpus.py, for
``--runs`` executions (default one million). Prints libFuzzer's final stats and what it
found; a crash, leak, timeout or out-of-memory input is copied to tests/fuzz/regressions/,
which the test suite replays.

    python bench/fuzz.py [--runs 1000000] [--build build/fuzz] [--corpus build/fuzz-corpus]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--build", type=Path, default=ROOT / "build" / "fuzz")
    parser.add_argument("--corpus", type=Path, default=ROOT / "build" / "fuzz-corpus")
    args = parser.parse_args()

    import pytest
    from make_corpus import make_corpus
    from test_fuzz import FUZZ_DIR, FUZZ_ENV, build_fuzzer

    try:
        fuzzer = build_fuzzer(args.build)
    except pytest.skip.Exception as exc:
        print(f"fuzz: {exc}")
        return 1
    if not any(args.corpus.glob("*.pte")):
        make_corpus(args.corpus)
    with tempfile.TemporaryDirectory(prefix="etb_fuzz_") as tmp:
        started = time.time()
        res = subprocess.run(
            [str(fuzzer), str(args.corpus), f"-runs={args.runs}", "-timeout=10",
             "-rss_limit_mb=4096", "-print_final_stats=1", f"-artifact_prefix={tmp}/"],
            env=FUZZ_ENV, capture_output=True, text=True,
        )  # fmt: skip
        stats = [line for line in res.stderr.splitlines() if line.startswith("stat::")]
        print("\n".join(stats))
        found = [p for p in Path(tmp).iterdir() if p.name.startswith(("crash-", "leak-",
                 "timeout-", "oom-"))]  # fmt: skip
        for p in found:
            shutil.copy(p, FUZZ_DIR / "regressions" / p.name)
        print(
            f"fuzz: {args.runs} runs requested, exit {res.returncode}, "
            f"{time.time() - started:.0f} s, findings: {len(found)} "
            f"{[p.name for p in found]}"
        )
        if res.returncode != 0:
            print(res.stderr[-4000:])
    return 0 if res.returncode == 0 and not found else 1


if __name__ == "__main__":
    sys.exit(main())
