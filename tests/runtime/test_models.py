"""End to end: every zoo model's program runs on the runtime and matches eager; so does a
MobileNetV2 program exported by the executorch package; the runner CLI and the profiler."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from etbuild_test_support import ZOO
from rt_helpers import assert_matches, build_with_executorch


@pytest.mark.e2e
@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_matches_eager(rt, zoo_build, name):
    run_dir = zoo_build(name)
    ref = torch.load(run_dir / "reference.pt")
    prog = rt.load(str(run_dir / "model.pte"))
    assert prog.method_names == ["forward"]
    got = prog.run(list(ref["inputs"]))
    assert len(got) == len(ref["outputs"])
    for g, w in zip(got, ref["outputs"], strict=True):
        assert_matches(g, w)
    # A second run on the same method gives the same result (planned memory is reused).
    again = prog.run(list(ref["inputs"]))
    for a, g in zip(again, got, strict=True):
        assert torch.equal(a, g)


@pytest.mark.e2e
def test_dynamic_batch_mlp(rt, zoo_build):
    from rt_helpers import compose

    from etbuild.pipeline.stages.model import build_module

    run_dir = zoo_build("mlp")
    prog = rt.load(str(run_dir / "model.pte"))
    meta = prog.method_meta()
    assert meta["inputs"][0]["dynamic"] and meta["inputs"][0]["sizes"] == [16, 64]
    # The eager model with the same (seeded) weights, built as the model stage does.
    module = build_module(compose(["model=mlp"]).model).eval()
    for batch in (1, 3, 16, 4):
        x = torch.randn(batch, 64)
        (out,) = prog.run([x])
        assert out.shape == (batch, 10)
        with torch.no_grad():
            assert_matches(out, module(x))
    ref = torch.load(run_dir / "reference.pt")
    (out,) = prog.run(list(ref["inputs"]))
    assert_matches(out, ref["outputs"][0])


@pytest.mark.e2e
def test_profile(rt, zoo_build):
    run_dir = zoo_build("mobilenet")
    ref = torch.load(run_dir / "reference.pt")
    prog = rt.load(str(run_dir / "model.pte"))
    prog.run(list(ref["inputs"]))
    assert prog.last_profile == []  # off by default
    prog.run(list(ref["inputs"]), profile=True)
    prof = prog.last_profile
    assert len(prof) == prog.method_meta()["instructions"]
    names = {name for name, _ in prof}
    assert "aten::convolution.out" in names
    assert all(seconds >= 0 for _, seconds in prof)
    assert sum(s for n, s in prof if n == "aten::convolution.out") > 0


@pytest.mark.oracle
@pytest.mark.e2e
def test_executorch_exported_mobilenet_v2(rt, tmp_path):
    """MobileNetV2 exported by the executorch package as is (batch norm and dropout left for
    ExecuTorch's own ops, no delegate) runs on the etbuild runtime and matches eager."""
    pytest.importorskip("executorch")
    from etbuild.pipeline.zoo import mobilenet_v2, reestimate_batchnorm

    torch.manual_seed(0)
    model = mobilenet_v2()
    reestimate_batchnorm(model, [(torch.randn(8, 3, 224, 224),) for _ in range(2)])
    model.eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        want = model(x)
    path = build_with_executorch(model, [x], tmp_path / "et_mobilenet_v2.pte")
    prog = rt.load(str(path))
    (got,) = prog.run([x])
    assert_matches(got, want)


def _runner() -> str:
    exe = shutil.which("etb_runner") or str(Path(sys.executable).parent / "etb_runner")
    assert Path(exe).exists(), "etb_runner is not installed"
    return exe


def test_runner_help_prints_usage_and_the_etbt_format():
    res = subprocess.run([_runner(), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: etb_runner PROGRAM.pte [--input FILE.etbt]")
    assert "A .etbt file is one tensor" in res.stdout
    assert "python -m etbuild.pipeline.etbt RUN/reference.pt DIR" in res.stdout
    bad = subprocess.run([_runner(), "x.pte", "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: etb_runner")


@pytest.mark.e2e
def test_runner_cli(zoo_build, tmp_path):
    run_dir = zoo_build("mobilenet_v3_small")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "etbuild.pipeline.etbt",
            str(run_dir / "reference.pt"),
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    res = subprocess.run(
        [
            _runner(),
            str(run_dir / "model.pte"),
            "--input",
            str(tmp_path / "input_0.etbt"),
            "--iters",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    ref = torch.load(run_dir / "reference.pt")["outputs"][0]
    m = re.search(r"output 0: Float \[1, 1000\] sum=(\S+) abs_sum=(\S+) fnv1a=", res.stdout)
    assert m, res.stdout
    assert abs(float(m.group(1)) - ref.sum().item()) < 1e-3 * ref.abs().sum().item()
    assert abs(float(m.group(2)) - ref.abs().sum().item()) < 1e-3 * ref.abs().sum().item()
    assert re.search(r"latency_ms: median=\S+ p10=\S+ p90=\S+ iters=3", res.stdout)


def _etbt_header(dtype: int, sizes: list[int]) -> bytes:
    return (
        b"ETBT" + struct.pack("<3I", 1, dtype, len(sizes)) + struct.pack(f"<{len(sizes)}q", *sizes)
    )


@pytest.mark.parametrize(
    "data,why",
    [
        (_etbt_header(6, [1 << 20, 1 << 20]), "the data length does not match the sizes"),  # 4 TB
        (_etbt_header(6, [1 << 62, 1 << 62]), "the sizes overflow"),
        (_etbt_header(6, [2, -3]), "a size is negative"),
        (_etbt_header(6, [2, 3]) + bytes(23), "the data length does not match the sizes"),
        (_etbt_header(6, [2, 3]) + bytes(25), "the data length does not match the sizes"),
        (_etbt_header(99, [2]), "unknown dtype code"),
        (_etbt_header(6, [2, 3])[:-4], "the sizes are cut short"),
    ],
)
def test_runner_checks_an_input_file_before_allocating(zoo_build, tmp_path, data, why):
    """A header that claims terabytes, overflows or does not match the file is refused with
    the reason, without allocating what it claims."""
    run_dir = zoo_build("mlp")
    bad = tmp_path / "bad.etbt"
    bad.write_bytes(data)
    res = subprocess.run(
        [_runner(), str(run_dir / "model.pte"), "--input", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1, res.stderr
    assert f"bad.etbt is not a valid .etbt file: {why}" in res.stderr


def test_runner_cli_errors(zoo_build, tmp_path):
    run_dir = zoo_build("mlp")
    bad = tmp_path / "bad.etbt"
    bad.write_bytes(b"nope")
    res = subprocess.run(
        [_runner(), str(run_dir / "model.pte"), "--input", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "not a valid .etbt file: no ETBT header" in res.stderr
    res = subprocess.run(
        [_runner(), str(tmp_path / "missing.pte")], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1 and "cannot open" in res.stderr
