"""A long fuzzing campaign over the runtime: libFuzzer with AddressSanitizer + UBSan
(tests/fuzz/program_fuzzer.cpp) on the seed programs of tests/fuzz/make_corpus.py, for
``--runs`` executions (default one million) or ``--seconds``. ``--mutator`` picks the
structure-aware mutator (tests/fuzz/program_mutator.cpp, the default) or libFuzzer's byte
mutations alone. Prints libFuzzer's final stats and what it found; a crash, leak, timeout or
out-of-memory input is copied to tests/fuzz/regressions/, which the test suite replays.

``--compare`` runs both mutators from the same seeds for the same wall time (``--seconds``,
default 120) one after the other and prints coverage, features and new units of each, and
their ratio (structure-aware over bytes).

    python bench/fuzz.py [--runs 1000000] [--mutator structure|bytes] [--build build/fuzz]
                         [--corpus build/fuzz-corpus]
    python bench/fuzz.py --compare [--seconds 120]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
sys.path.insert(0, str(ROOT / "tests" / "runtime"))

FINDINGS = ("crash-", "leak-", "timeout-", "oom-")


def campaign(fuzzer: Path, seeds: Path, limit: str, tmp: Path) -> dict:
    """One libFuzzer run from a copy of ``seeds`` with ``limit`` (-runs=N or
    -max_total_time=S); returns its final stats, findings and exit status."""
    from test_fuzz import FUZZ_DIR, FUZZ_ENV

    corpus, artifacts = tmp / "corpus", tmp / "artifacts"
    shutil.copytree(seeds, corpus)
    artifacts.mkdir()
    started = time.time()
    res = subprocess.run(
        [str(fuzzer), str(corpus), limit, "-seed=1", "-timeout=10", "-rss_limit_mb=4096",
         "-print_final_stats=1", f"-artifact_prefix={artifacts}/"],
        env=FUZZ_ENV, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.time() - started
    stats = {}
    for line in res.stderr.splitlines():
        if line.startswith("stat::"):
            key, _, value = line[len("stat::") :].partition(":")
            stats[key.strip()] = int(value)
    done = [line for line in res.stderr.splitlines() if re.match(r"#\d+\s+DONE", line)]
    for key in ("cov", "ft"):
        m = re.search(rf"\b{key}: (\d+)", done[-1]) if done else None
        stats[key] = int(m.group(1)) if m else 0
    found = [p for p in artifacts.iterdir() if p.name.startswith(FINDINGS)]
    for p in found:
        shutil.copy(p, FUZZ_DIR / "regressions" / p.name)
    return {"stats": stats, "found": found, "wall": wall, "returncode": res.returncode,
            "stderr": res.stderr}  # fmt: skip


def report(name: str, run: dict) -> None:
    s = run["stats"]
    print(
        f"{name}: {s.get('number_of_executed_units', 0)} runs in {run['wall']:.0f} s "
        f"({s.get('average_exec_per_sec', 0)} exec/s), cov {s['cov']}, ft {s['ft']}, "
        f"new units {s.get('new_units_added', 0)}, exit {run['returncode']}, findings: "
        f"{len(run['found'])} {[p.name for p in run['found']]}"
    )
    if run["returncode"] != 0:
        print(run["stderr"][-4000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=int, default=None, help="wall time instead of runs")
    parser.add_argument("--mutator", choices=["structure", "bytes"], default="structure")
    parser.add_argument("--compare", action="store_true", help="both mutators, same time")
    parser.add_argument("--build", type=Path, default=ROOT / "build" / "fuzz")
    parser.add_argument("--corpus", type=Path, default=ROOT / "build" / "fuzz-corpus")
    args = parser.parse_args()

    import pytest
    from make_corpus import make_corpus
    from test_fuzz import build_fuzzer

    mutators = ["bytes", "structure"] if args.compare else [args.mutator]
    try:
        fuzzers = {m: build_fuzzer(args.build, m) for m in mutators}
    except pytest.skip.Exception as exc:
        print(f"fuzz: {exc}")
        return 1
    if not any(args.corpus.glob("*.pte")):
        make_corpus(args.corpus)
    seconds = args.seconds if args.seconds or not args.compare else 120
    limit = f"-max_total_time={seconds}" if seconds else f"-runs={args.runs}"
    runs = {}
    for m in mutators:
        with tempfile.TemporaryDirectory(prefix="etb_fuzz_") as tmp:
            runs[m] = campaign(fuzzers[m], args.corpus, limit, Path(tmp))
        if not args.compare:
            print("\n".join(f"stat::{k}: {v}" for k, v in runs[m]["stats"].items()))
        report(f"fuzz ({m} mutator, {limit})", runs[m])
    if args.compare:
        b, s = runs["bytes"]["stats"], runs["structure"]["stats"]
        print(
            "structure-aware / bytes, same seeds and wall time: "
            + ", ".join(
                f"{k} {s[k] / b[k]:.2f}x" if b.get(k) else f"{k} {s.get(k, 0)} vs 0"
                for k in ("cov", "ft", "new_units_added", "number_of_executed_units")
            )
        )
    ok = all(r["returncode"] == 0 and not r["found"] for r in runs.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
