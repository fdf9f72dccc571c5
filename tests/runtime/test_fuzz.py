"""A short fuzzing campaign on every run (CI sets ETB_SANITIZER_TESTS=1): libFuzzer mutates
seed programs (tests/fuzz/make_corpus.py: fp32 with a dynamic batch, int8, int8 with weights
copied at load, attention with int64 tokens) and loads and runs each mutant in the sanitized
runtime (tests/fuzz/). The main campaign uses the structure-aware mutator
(tests/fuzz/program_mutator.cpp), which reaches further than byte mutations in the same time
(bench/fuzz.py --compare measures it); a shorter one uses byte mutations alone, which reach
what the structure-aware mutator keeps valid (a misaligned vector of the program, found by a
byte campaign after 40 minutes of structure-aware ones had not). Every file in
tests/fuzz/regressions/ (a crash a campaign once found, kept) is replayed first.
bench/fuzz.py runs a long campaign."""

from __future__ import annotations

import base64
import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("ETB_SANITIZER_TESTS") != "1", reason="set ETB_SANITIZER_TESTS=1"
)

FUZZ_DIR = Path(__file__).resolve().parents[1] / "fuzz"
# Seconds of each mutator's campaign.
CAMPAIGN_SECONDS = {"structure": 60, "bytes": 30}
# The fuzzer binary of each mutator: libFuzzer's byte mutations alone, or with the
# structure-aware mutator (which falls back to them for half its mutations).
FUZZER_TARGETS = {"bytes": "etb_program_fuzzer", "structure": "etb_program_fuzzer_structured"}


def build_fuzzer(build: Path, mutator: str = "structure") -> Path:
    """Configures and builds tests/fuzz with clang; returns the fuzzer binary that uses
    ``mutator`` (a key of FUZZER_TARGETS)."""
    from etbuild.pipeline.paths import RUNTIME_SRC_DIR

    if shutil.which("clang++") is None:
        pytest.skip("clang is needed for libFuzzer (apt-get install clang)")
    cfg = subprocess.run(
        ["cmake", "-S", str(FUZZ_DIR), "-B", str(build), "-G", "Ninja",
         "-DCMAKE_CXX_COMPILER=clang++", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
         f"-DETB_RUNTIME_SRC={RUNTIME_SRC_DIR}", f"-DPython_EXECUTABLE={sys.executable}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert cfg.returncode == 0, cfg.stdout[-3000:] + cfg.stderr[-3000:]
    res = subprocess.run(
        ["cmake", "--build", str(build), "-j2", "--target", FUZZER_TARGETS[mutator]],
        capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return build / FUZZER_TARGETS[mutator]


FUZZ_ENV = {
    **os.environ,
    "ASAN_OPTIONS": "allocator_may_return_null=1:detect_leaks=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


@pytest.fixture(scope="module")
def fuzz_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz_build")


@pytest.fixture(scope="module")
def fuzzer(fuzz_build: Path) -> Path:
    return build_fuzzer(fuzz_build)


def test_the_kept_crashes_stay_fixed(fuzzer: Path, tmp_path: Path) -> None:
    cases = sorted((FUZZ_DIR / "regressions").glob("*"))
    cases = [c for c in cases if c.is_file() and c.name != "README.md"]
    if not cases:
        pytest.skip("no regression inputs kept yet")
    res = subprocess.run([str(fuzzer), *map(str, cases)], capture_output=True, text=True,
                         env=FUZZ_ENV, timeout=300, cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]


def campaign_report(stderr: str, artifacts: Path, found: list[str]) -> str:
    """What a failed campaign's assertion shows, so that a CI log alone is enough to reproduce
    and fix it: libFuzzer's seed (the same binary replays the same campaign from it), the
    sanitizer's or libFuzzer's report (the tail of stderr is mostly the final stats and the
    recommended dictionary, which hid it), and each input found, gzipped and base64-encoded
    (``base64 -d | gunzip > crash`` restores the file to replay: ``fuzzer crash``)."""
    lines = stderr.splitlines()
    seed = next((line for line in lines if line.startswith("INFO: Seed:")), "INFO: Seed: ?")
    markers = ("ERROR:", "runtime error:")  # sanitizers' and libFuzzer's, UBSan's
    start = next((i for i, line in enumerate(lines) if any(m in line for m in markers)), None)
    report = "\n".join(lines[start : start + 80]) if start is not None else stderr[-4000:]
    parts = [seed, report[:6000]]
    for name in found:
        data = (artifacts / name).read_bytes()
        packed = base64.b64encode(gzip.compress(data)).decode()
        parts.append(f"{name} ({len(data)} bytes), gzip + base64:\n{packed[:16000]}")
    return "\n".join(parts)


@pytest.mark.parametrize("mutator", ["structure", "bytes"])
def test_a_short_campaign_finds_nothing(fuzz_build: Path, mutator: str, tmp_path: Path) -> None:
    sys.path.insert(0, str(FUZZ_DIR))
    from make_corpus import make_corpus

    fuzzer = build_fuzzer(fuzz_build, mutator)  # the second shares the first's objects
    corpus = tmp_path / "corpus"
    make_corpus(corpus)
    seconds = CAMPAIGN_SECONDS[mutator]
    res = subprocess.run(
        [str(fuzzer), str(corpus), f"-max_total_time={seconds}", "-timeout=10",
         "-rss_limit_mb=4096", "-print_final_stats=1", f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, env=FUZZ_ENV, timeout=seconds + 300,
    )  # fmt: skip
    found = sorted(p.name for p in tmp_path.glob("*") if p.name.startswith(("crash-", "leak-",
                   "timeout-", "oom-")))  # fmt: skip
    if found:  # keep them as regression inputs for the next runs (and a human to fix)
        for name in found:
            shutil.copy(tmp_path / name, FUZZ_DIR / "regressions" / name)
    assert res.returncode == 0 and not found, campaign_report(res.stderr, tmp_path, found)
    runs = [line for line in res.stderr.splitlines() if "stat::number_of_executed_units" in line]
    assert runs and int(runs[-1].split(":")[-1]) > 1000, res.stderr[-2000:]
