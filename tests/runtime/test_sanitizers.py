"""The error paths under AddressSanitizer and UndefinedBehaviorSanitizer; the thread pool and
the kernels that split their work under ThreadSanitizer.

Opt-in (a separate Debug build of the runtime with -fsanitize=address,undefined takes a
minute): set ETB_SANITIZER_TESTS=1 (CI does). The sanitized etb_runner and the C++ test driver
run truncated, bit-flipped and mismatched inputs; any sanitizer report fails the test."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from etbuild_test_support import build_in_process
from rt_helpers import cmake_build, write_delegate_program

pytestmark = pytest.mark.skipif(
    os.environ.get("ETB_SANITIZER_TESTS") != "1", reason="set ETB_SANITIZER_TESTS=1"
)

CPP_DIR = Path(__file__).resolve().parent / "cpp"
BUILD_ROOT = Path(__file__).resolve().parents[2] / "build"
ENV = {
    **os.environ,
    "ASAN_OPTIONS": "allocator_may_return_null=1:detect_leaks=1",
    "UBSAN_OPTIONS": "print_stacktrace=1",
}


def _build_tests(tmp_path_factory, name: str, build_type: str, sanitize: str, *targets: str):
    """Configures and builds tests/runtime/cpp (the runtime, its runner and the C++ tests)."""
    from etbuild.pipeline.paths import RUNTIME_SRC_DIR

    build = BUILD_ROOT / name if BUILD_ROOT.is_dir() else tmp_path_factory.mktemp(name)
    defines = [f"ETB_RUNTIME_SRC={RUNTIME_SRC_DIR}", f"CMAKE_BUILD_TYPE={build_type}",
               f"ETB_SANITIZE={sanitize}"]  # fmt: skip
    cmake_build(CPP_DIR, build, defines, targets)
    return build


@pytest.fixture(scope="session")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_tests(tmp_path_factory, "runtime-tests-asan", "Debug", "address,undefined")


def _check(res: subprocess.CompletedProcess, ok_codes=(0, 1)) -> None:
    report = "ERROR: AddressSanitizer" in res.stderr or "runtime error:" in res.stderr
    assert not report and res.returncode in ok_codes, res.stderr[-3000:]


def _inputs(run_dir: Path, out: Path) -> list[str]:
    subprocess.run(
        [sys.executable, "-m", "etbuild.pipeline.etbt", str(run_dir / "reference.pt"), str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    return [a for p in sorted(out.glob("input_*.etbt")) for a in ("--input", str(p))]


def test_delegate_program_sanitized(sanitized, tmp_path):
    prog = write_delegate_program(tmp_path / "d.pte", scale=2.0, cond=True)
    for mode in ("run", "buffer", "nokernels", "nobackend", "unavailable"):
        res = subprocess.run(
            [str(sanitized / "etb_runtime_tests"), mode, str(prog), "1", "2", "3", "4", "5", "6"],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=120,
        )
        _check(res)


@pytest.mark.parametrize("model,count", [("mlp", 250), ("transformer", 150)])
def test_bit_flips_and_truncation_sanitized(sanitized, zoo_build, tmp_path, model, count):
    run_dir = zoo_build(model)
    inputs = _inputs(run_dir, tmp_path)
    runner = str(sanitized / "runtime" / "etb_runner")
    data = (run_dir / "model.pte").read_bytes()
    psize = int.from_bytes(data[16:24], "little")
    res = subprocess.run([runner, str(run_dir / "model.pte"), *inputs, "--iters", "1"],
                         capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    _check(res, ok_codes=(0,))
    rng = random.Random(11)
    path = tmp_path / "m.pte"
    for n in [8, 40, psize // 2, psize - 1, psize, len(data) - 1]:
        path.write_bytes(data[:n])
        _check(subprocess.run([runner, str(path), *inputs], capture_output=True, text=True,
                              env=ENV, timeout=120))  # fmt: skip
    for _ in range(count):
        d = bytearray(data)
        hi = psize if rng.random() < 0.9 else len(d)
        for _ in range(rng.choice([1, 1, 2, 4])):
            d[rng.randrange(hi)] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(d))
        # past the checksums (which catch any flip), into the parsing they guard
        res = subprocess.run([runner, str(path), *inputs, "--iters", "1", "--warmup", "0",
                              "--no-checksums"],
                             capture_output=True, text=True, errors="replace", env=ENV,
                             timeout=120)  # fmt: skip
        _check(res)


def test_wrong_input_sanitized(sanitized, zoo_build, tmp_path):
    run_dir = zoo_build("mlp")
    bad = tmp_path / "x.etbt"
    t = torch.zeros(4, 64, dtype=torch.int64)
    from etbuild.pipeline.etbt import write as write_etbt

    write_etbt(bad, t)
    res = subprocess.run(
        [str(sanitized / "runtime" / "etb_runner"), str(run_dir / "model.pte"), "--input",
         str(bad)],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    _check(res)
    assert "input 0: expected dtype Float, got Long" in res.stderr


@pytest.fixture(scope="session")
def thread_sanitized_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """etb_runner and the C++ test driver built with ThreadSanitizer."""
    return _build_tests(
        tmp_path_factory, "runtime-tests-tsan", "RelWithDebInfo", "thread", "etb_runner",
        "etb_runtime_tests",
    )  # fmt: skip


@pytest.fixture(scope="session")
def thread_sanitized(thread_sanitized_build: Path) -> Path:
    return thread_sanitized_build / "runtime" / "etb_runner"


@pytest.mark.parametrize("threads", [2, 4])
def test_thread_pool_handoffs_under_thread_sanitizer(thread_sanitized_build, threads):
    """The pool's wake-ups both ways (workers asleep or spinning when a loop starts, the caller
    spinning or asleep while a worker finishes) show no data race."""
    res = subprocess.run(
        [str(thread_sanitized_build / "etb_runtime_tests"), f"handoffs:{threads}", "200"],
        capture_output=True, text=True, env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1"},
        timeout=300,
    )  # fmt: skip
    assert "WARNING: ThreadSanitizer" not in res.stderr, res.stderr[-4000:]
    assert res.returncode == 0 and f"handoffs: ok threads={threads}" in res.stdout, res.stdout


@pytest.mark.parametrize("quant", [False, True], ids=["mobilenet", "mobilenet_int8"])
def test_thread_pool_and_kernels_under_thread_sanitizer(
    thread_sanitized, zoo_build, tmp_path, quant
):
    """The pool (counting each thread's time in tasks: --profile) and the kernels that split
    their work (GEMM, im2col, depthwise; int8: also the fused blocks' runs of bands) show no
    data race at 2 and 4 threads, and their outputs equal one thread's, bit for bit."""
    if quant:
        run_dir = tmp_path / "build"
        build_in_process(["model=mobilenet", "+quant=ptq"], run_dir)
    else:
        run_dir = zoo_build("mobilenet")
    inputs = _inputs(run_dir, tmp_path)
    outputs = {}
    for threads in (1, 2, 4):
        out = tmp_path / f"out{threads}"
        out.mkdir()
        res = subprocess.run(
            [str(thread_sanitized), str(run_dir / "model.pte"), *inputs, "--iters", "1",
             "--warmup", "0", "--threads", str(threads), "--output-dir", str(out), "--profile"],
            capture_output=True, text=True, env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1"},
            timeout=600,
        )  # fmt: skip
        assert "WARNING: ThreadSanitizer" not in res.stderr, res.stderr[-4000:]
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"threads: {threads}" in res.stdout
        assert (threads > 1) == ("task_time: loops_per_run=" in res.stdout), res.stdout
        outputs[threads] = [p.read_bytes() for p in sorted(out.glob("output_*.etbt"))]
    assert outputs[1] and outputs[2] == outputs[1] and outputs[4] == outputs[1]
