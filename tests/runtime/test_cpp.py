"""The runtime driven from C++ (tests/runtime/cpp): a test backend behind a delegate call,
jumps, moves and frees, the buffer loader, and init errors. The C++ tests are built once per
session against the installed package's runtime_src (the same sources the wheel ships)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from rt_helpers import build_with_pipeline, cmake_build, write_delegate_program

CPP_DIR = Path(__file__).resolve().parent / "cpp"
BUILD_ROOT = Path(__file__).resolve().parents[2] / "build"


@pytest.fixture(scope="session")
def cpp_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Configures and builds tests/runtime/cpp once per session (incrementally, under build/)."""
    from etbuild.pipeline.paths import RUNTIME_SRC_DIR

    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("cmake and ninja are needed to build the C++ runtime tests")
    build = BUILD_ROOT / "runtime-tests" if BUILD_ROOT.is_dir() else tmp_path_factory.mktemp("b")
    cmake_build(CPP_DIR, build, [f"ETB_RUNTIME_SRC={RUNTIME_SRC_DIR}"])
    return build / "etb_runtime_tests"


def _run(exe: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)


X = ["1", "2", "3", "-4", "0.5", "0"]


@pytest.mark.parametrize("cond", [False, True])
@pytest.mark.parametrize("mode", ["run", "buffer"])
def test_delegate_jump_move_free(cpp_tests, tmp_path, cond, mode):
    prog = write_delegate_program(tmp_path / "d.pte", scale=2.5, cond=cond)
    res = _run(cpp_tests, mode, str(prog), *X)
    assert res.returncode == 0, res.stdout + res.stderr
    values = [float(v) for v in res.stdout.split("output 0:")[1].splitlines()[0].split()]
    assert values == [float(x) * 3.5 for x in X]
    profile = res.stdout.split("profile:")[1].splitlines()[0].split()
    expected = ["delegate", "jump_false", "move", "aten::add.out", "free"]
    if cond:
        expected.insert(2, "aten::add.out")
    assert profile == expected
    assert "backend: inits=1 destroys=1" in res.stdout


class _MixedKernels(torch.nn.Module):
    """int8 and fp32 kernels that keep per-thread scratch: depthwise convolutions (planes and
    channel lanes), a pointwise one split by runs of columns and one split in depth halves, and
    fp32 depthwise and 3x3 (taps path) convolutions."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.register_buffer(
            "dw", torch.randint(-127, 128, (144, 1, 3, 3), generator=g).to(torch.int8)
        )
        self.register_buffer(
            "pw", torch.randint(-127, 128, (32, 144, 1, 1), generator=g).to(torch.int8)
        )
        self.register_buffer("dws", torch.rand(144, generator=g) * 0.01 + 0.001)
        self.register_buffer("pws", torch.rand(32, generator=g) * 0.01 + 0.001)
        self.fdw = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.f3 = torch.nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x):
        from etbuild.pipeline.quant.ops import ops as Q

        def conv(x, w, ws, stride, padding, groups, out_scale):  # input scale 0.05, zero points 0
            return Q.conv2d(x, 0.05, 0, w, ws, None, stride, padding, [1, 1], groups, out_scale,
                            0, -128, 127)  # fmt: skip

        q = Q.quantize_per_tensor(x, 0.05, 0, -128, 127)
        d = conv(q, self.dw, self.dws, [1, 1], [1, 1], 144, 0.05)
        d2 = conv(q, self.dw, self.dws, [2, 2], [1, 1], 144, 0.05)  # 8x8: halves, not columns
        p = conv(d, self.pw, self.pws, [1, 1], [0, 0], 1, 0.1)
        p2 = conv(d2, self.pw, self.pws, [1, 1], [0, 0], 1, 0.1)
        f = Q.dequantize_per_tensor(p, 0.1, 0)
        return self.f3(self.fdw(f)), Q.dequantize_per_tensor(p2, 0.1, 0)


class _TapsCopies(torch.nn.Module):
    """3x3 convolutions on a small plane that the taps path splits by output channels alone,
    fp32 and int8: each thread multiplies from a copy of the input's layout of its own."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(6)
        self.f = torch.nn.Conv2d(32, 100, 3, padding=1)
        self.register_buffer(
            "w", torch.randint(-127, 128, (160, 32, 3, 3), generator=g).to(torch.int8)
        )
        self.register_buffer("ws", torch.rand(160, generator=g) * 0.01 + 0.001)

    def forward(self, x):
        from etbuild.pipeline.quant.ops import ops as Q

        q = Q.quantize_per_tensor(x, 0.05, 0, -128, 127)
        c = Q.conv2d(q, 0.05, 0, self.w, self.ws, None, [1, 1], [1, 1], [1, 1], 1, 0.1, 0,
                     -128, 127)  # fmt: skip
        return self.f(x), Q.dequantize_per_tensor(c, 0.1, 0)


def _run_poisoned(rt, cpp_tests, pte: Path, x: torch.Tensor, threads: int) -> None:
    """Runs `pte` on x under PoisonedPool (garbage in the threads' own memory before every loop,
    tasks dealt out to every thread): each output is bit-identical to one thread's."""
    wants = rt.load(str(pte), threads=1).run([x])
    res = _run(
        cpp_tests, f"poisoned:{threads}", str(pte), *(f"{v:.9g}" for v in x.flatten().tolist())
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    stats = res.stdout.split("loops: ")[1].splitlines()[0].split()
    loops, by_thread = int(stats[0]), [int(t) for t in stats[4:]]
    assert f"threads: {threads} " in res.stdout and loops >= 2, res.stdout[-500:]
    assert len(by_thread) == threads and min(by_thread) > 0, res.stdout[-500:]
    for i, want in enumerate(wants):
        line = res.stdout.split(f"output {i}:")[1].splitlines()[0]
        got = torch.tensor([float(v) for v in line.split()], dtype=torch.float32)
        assert want.abs().max() > 0.5 and want.std() > 0.1  # outputs of order one that vary
        assert torch.equal(got, want.flatten()), f"output {i}: {(got - want.flatten()).abs().max()}"


@pytest.mark.parametrize("threads", [2, 3])
def test_kernels_ignore_what_their_threads_memory_held(rt, cpp_tests, tmp_path, threads):
    """The memory each thread keeps for the kernels' scratch holds garbage before every loop,
    and every thread takes tasks: every output is still bit-identical to one thread's."""
    torch.manual_seed(0)
    x = torch.randn(1, 144, 16, 16)
    pte = build_with_pipeline(_MixedKernels().eval(), [x], tmp_path / "run")
    _run_poisoned(rt, cpp_tests, pte, x, threads)


@pytest.mark.parametrize("threads", [2, 3])
def test_taps_copies_of_every_thread(rt, cpp_tests, tmp_path, threads):
    """Where each thread multiplies from its own copy of the layout, every thread's copy holds
    the input (a copy left unfilled changes the outputs of the tasks dealt to its thread)."""
    torch.manual_seed(0)
    x = torch.randn(1, 32, 14, 14)
    pte = build_with_pipeline(_TapsCopies().eval(), [x], tmp_path / "run")
    _run_poisoned(rt, cpp_tests, pte, x, threads)


@pytest.mark.parametrize("threads", [2, 4])
def test_thread_pool_hands_work_over_awake_and_asleep(cpp_tests, threads):
    """Loops after pauses that let the workers fall asleep or not, with tasks that keep the
    caller waiting (spinning or asleep): each task runs once, and no wake-up is lost (a lost
    one hangs the run past _run's timeout)."""
    res = _run(cpp_tests, f"handoffs:{threads}", "400")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    ran = int(res.stdout.split("tasks_on_workers=")[1].split()[0])
    assert f"handoffs: ok threads={threads} loops=400" in res.stdout and ran > 400, res.stdout


def test_missing_backend(cpp_tests, tmp_path):
    prog = write_delegate_program(tmp_path / "d.pte", scale=1.0, cond=False)
    res = _run(cpp_tests, "nobackend", str(prog), *X)
    assert res.returncode == 1
    assert "no backend 'EtbTestBackend' is registered" in res.stdout


def test_unavailable_backend(cpp_tests, tmp_path):
    prog = write_delegate_program(tmp_path / "d.pte", scale=1.0, cond=False)
    res = _run(cpp_tests, "unavailable", str(prog), *X)
    assert res.returncode == 1 and "is not available" in res.stdout


def test_no_kernels_registered(cpp_tests, tmp_path):
    prog = write_delegate_program(tmp_path / "d.pte", scale=1.0, cond=False)
    res = _run(cpp_tests, "nokernels", str(prog), *X)
    assert res.returncode == 1
    assert "1 operator(s) have no kernel: aten::add.out" in res.stdout


def test_python_rejects_unknown_backend(rt, tmp_path):
    prog = write_delegate_program(tmp_path / "d.pte", scale=1.0, cond=False)
    with pytest.raises(rt.Error, match="no backend 'EtbTestBackend' is registered"):
        rt.load(str(prog)).run([__import__("torch").zeros(2, 3)])


def test_noop_rebuild_does_nothing(cpp_tests):
    """Codegen rewrites files only when they change, so a second build has nothing to do."""
    res = subprocess.run(
        ["cmake", "--build", str(cpp_tests.parent)], capture_output=True, text=True
    )
    assert res.returncode == 0
    assert "no work to do" in res.stdout, res.stdout
