"""The XNNPACK delegate (``+partitioner=xnnpack``, runtime_src/backends/xnnpack/): MobileNetV2
in fp32 and int8 runs in one XNNPACK partition on the library of the system, verifies against
eager, and the programs are ExecuTorch's format both ways: ExecuTorch's runtime runs
etbuild's delegated programs, and etbuild's runtime runs ExecuTorch's own XNNPACK program."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch
from etbuild_test_support import build_in_process, custom_model_overrides, run_in_executorch

from etbuild.pipeline import etbt, pte
from etbuild.pipeline.errors import EtbuildError
from etbuild.runtime_src.backends.xnnpack.partitioner import library_problem

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        library_problem(None, "host") is not None,
        reason="the XNNPACK library is not installed (apt-get install libxnnpack-dev "
        "libpthreadpool-dev libcpuinfo-dev)",
    ),
]

XNN = ["model=mobilenet", "+partitioner=xnnpack", "build.compare_all_ops=false"]


@pytest.fixture(scope="module")
def fp32_build(tmp_path_factory: pytest.TempPathFactory):
    run_dir = tmp_path_factory.mktemp("xnn_fp32")
    return run_dir, build_in_process(XNN, run_dir)


@pytest.fixture(scope="module")
def int8_build(tmp_path_factory: pytest.TempPathFactory):
    run_dir = tmp_path_factory.mktemp("xnn_int8")
    return run_dir, build_in_process([*XNN, "+quant=ptq"], run_dir)


def run_runner(run_dir: Path, program: Path, inputs: list[torch.Tensor], tmp: Path):
    """Outputs of the build's etb_runner on ``program``."""
    args = []
    for i, t in enumerate(inputs):
        etbt.write(tmp / f"in_{i}.etbt", t)
        args += ["--input", str(tmp / f"in_{i}.etbt")]
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    runner = run_dir / "runtime" / "bin" / "etb_runner"
    proc = subprocess.run(
        [str(runner), str(program), *args, "--iters", "1", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [etbt.read(p) for p in sorted(out.glob("output_*.etbt"))]


def test_mobilenet_fp32_runs_in_one_xnnpack_partition_and_matches_eager(fp32_build) -> None:
    run_dir, ctx = fp32_build
    parts = ctx.artifacts["partitions"]
    assert parts["backend"] == "XnnpackBackend"
    assert max(p["share"] for p in parts["partitions"]) >= 0.95, parts
    verify = ctx.artifacts["verify"]
    assert verify["status"] == "ran" and float(verify["max_rel_error"]) <= 1e-4, verify
    report = (run_dir / "report.md").read_text()
    assert "XnnpackBackend" in report and "| latency |" in report


@pytest.mark.oracle
def test_executorch_runs_the_delegated_programs(fp32_build, int8_build, tmp_path) -> None:
    fp32_dir, _ = fp32_build
    int8_dir, _ = int8_build
    ref = torch.load(int8_dir / "reference.pt", weights_only=True)
    ours = run_runner(int8_dir, int8_dir / "model.pte", ref["inputs"], tmp_path)
    cases = tmp_path / "int8_cases.pt"
    torch.save({"inputs": [ref["inputs"]], "outputs": [ours]}, cases)
    results = run_in_executorch([str(fp32_dir), str(int8_dir)], {str(int8_dir): cases})
    fp32 = results[str(fp32_dir)]
    assert "error" not in fp32, fp32
    (out,) = fp32["outputs"]
    assert out["std"] > 0.1 and out["err"] <= 1e-4 * out["scale"], out
    int8 = results[str(int8_dir)]
    assert "error" not in int8, int8
    (vs_ours,) = int8["cases"][0]
    step = output_step(int8_dir / "model.pte")
    assert 0 < step < 0.1 and vs_ours["err"] <= step * 1.001, (vs_ours, step)


def output_step(program: Path) -> float:
    """The scale of the int8 value the program's last delegate converts to its fp32 output
    (read with flatc's plain accessors: its object API misnames the XNodeUnion creator)."""
    from etbuild.schema.xnnpack import PerTensorQuant, XNNGraph, XNNQuantizedTensorValue
    from etbuild.schema.xnnpack._XNNNode1x1 import _XNNNode1x1
    from etbuild.schema.xnnpack.XNodeUnion import XNodeUnion
    from etbuild.schema.xnnpack.XValueUnion import XValueUnion

    f = pte.read(program.read_bytes())
    (plan,) = f.program.executionPlan
    blob = f.segment(plan.delegates[-1].processed.index)
    fb_offset, fb_size = struct.unpack_from("<II", blob, 10)
    g = XNNGraph.XNNGraph.GetRootAs(blob[fb_offset : fb_offset + fb_size], 0)
    for i in reversed(range(g.XnodesLength())):
        node = g.Xnodes(i)
        if node.XnodeUnionType() != XNodeUnion.XNNConvert:
            continue
        table, convert = node.XnodeUnion(), _XNNNode1x1()
        convert.Init(table.Bytes, table.Pos)
        src = g.Xvalues(convert.InputId())
        if src.XvalueUnionType() == XValueUnion.XNNQuantizedTensorValue:
            table, qv = src.XvalueUnion(), XNNQuantizedTensorValue.XNNQuantizedTensorValue()
            qv.Init(table.Bytes, table.Pos)
            table, q = qv.QuantParams(), PerTensorQuant.PerTensorQuant()
            q.Init(table.Bytes, table.Pos)
            return q.Scale()
    raise AssertionError("the program converts no int8 value to its output")


def test_mobilenet_int8_runs_in_one_xnnpack_partition(int8_build) -> None:
    run_dir, ctx = int8_build
    parts = ctx.artifacts["partitions"]
    assert len(parts["partitions"]) == 1 and parts["partitions"][0]["share"] >= 0.95, parts
    # int8 convolutions count their multiply-adds, as the fp32 ones do (about 0.6 GFLOP)
    assert 5.5e8 < parts["total_flops"] < 6.5e8, parts["total_flops"]
    ops = parts["partitions"][0]["ops"]
    assert ops["conv2d"] == 52 and ops["quantize_per_tensor"] == 1, ops
    verify = ctx.artifacts["verify"]
    assert verify["status"] == "ran" and verify["sqnr_db"] > 10, verify
    selection = (run_dir / "selected_operators.yaml").read_text()
    assert "XnnpackBackend" in selection


@pytest.mark.oracle
def test_etbuild_runs_executorchs_own_xnnpack_program(fp32_build, tmp_path) -> None:
    """ExecuTorch's XnnpackPartitioner lowers the same MobileNetV2 (weights in named data,
    transposes inside the blob); the runtime etbuild built for its own program runs it."""
    pytest.importorskip("executorch")
    script = tmp_path / "export.py"
    script.write_text(
        "import sys, torch\n"
        "from executorch.backends.xnnpack.partition.xnnpack_partitioner import "
        "XnnpackPartitioner\n"
        "from executorch.exir import to_edge_transform_and_lower\n"
        "from etbuild.pipeline.zoo import mobilenet_v2, reestimate_batchnorm\n"
        "torch.manual_seed(0)\n"
        "m = mobilenet_v2(num_classes=1000)\n"
        "reestimate_batchnorm(m, [torch.randn(4, 3, 224, 224) for _ in range(2)])\n"
        "m.eval()\n"
        "x = torch.randn(1, 3, 224, 224)\n"
        "ep = torch.export.export(m, (x,))\n"
        "prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])\n"
        "open(sys.argv[1], 'wb').write(prog.to_executorch().buffer)\n"
        "torch.save({'x': x, 'y': m(x).detach()}, sys.argv[2])\n"
    )
    program, ref = tmp_path / "et_mobilenet.pte", tmp_path / "ref.pt"
    proc = subprocess.run(
        ["python", str(script), str(program), str(ref)], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    f = pte.read(program.read_bytes())
    assert [d.id.decode() for d in f.program.executionPlan[0].delegates] == ["XnnpackBackend"]
    assert f.program.namedData, "ExecuTorch keeps the weights in named data"
    expected = torch.load(ref, weights_only=True)
    run_dir, _ = fp32_build
    (out,) = run_runner(run_dir, program, [expected["x"]], tmp_path)
    want = expected["y"]
    assert want.std() > 0.1
    assert (out - want).abs().max() <= 1e-4 * want.abs().max()


def test_a_malformed_blob_is_a_load_error(fp32_build, tmp_path) -> None:
    run_dir, _ = fp32_build
    data = bytearray((run_dir / "model.pte").read_bytes())
    f = pte.read(bytes(data))
    (plan,) = f.program.executionPlan
    blob = f.segment(plan.delegates[0].processed.index)
    at = bytes(data).find(blob[:64])
    struct.pack_into("<I", data, at + 14, 0x7FFFFFFF)  # the flatbuffer size
    bad = tmp_path / "bad.pte"
    bad.write_bytes(bytes(data))
    runner = run_dir / "runtime" / "bin" / "etb_runner"
    proc = subprocess.run(
        [str(runner), str(bad), "--no-checksums", "--iters", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "xnnpack: the blob header is malformed" in proc.stderr, proc.stderr


def test_an_output_over_the_delegates_input_is_a_run_error(fp32_build, tmp_path) -> None:
    """A memory plan that puts the delegate's output over its input is refused at the call,
    never run: the delegate would overwrite the image it still reads."""
    run_dir, _ = fp32_build
    f = pte.read((run_dir / "model.pte").read_bytes())
    (plan,) = f.program.executionPlan
    (call,) = [i.instrArgs for c in plan.chains for i in c.instructions if i.instrArgsType == 2]
    x, y = (plan.values[v].val.allocationInfo for v in call.args)
    assert (x.memoryId, x.memoryOffsetLow) != (y.memoryId, y.memoryOffsetLow)
    y.memoryId, y.memoryOffsetLow, y.memoryOffsetHigh = x.memoryId, x.memoryOffsetLow, 0
    segments = [f.segment(i) for i in range(len(f.program.segments))]
    bad = tmp_path / "bad.pte"
    bad.write_bytes(pte.serialize(f.program, segments, 128))  # emit.segment_alignment
    etbt.write(tmp_path / "x.etbt", torch.randn(1, 3, 224, 224))
    runner = run_dir / "runtime" / "bin" / "etb_runner"
    proc = subprocess.run([str(runner), str(bad), "--input", str(tmp_path / "x.etbt"), "--iters",
                           "1"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0
    assert "xnnpack: arguments 0 and 1 overlap in memory and one is an output" in proc.stderr, (
        proc.stderr
    )


def test_a_target_without_the_library_fails_before_export(tmp_path) -> None:
    with pytest.raises(EtbuildError) as e:
        build_in_process([*XNN, f"target.xnnpack_root={tmp_path}"], tmp_path / "run")
    msg = str(e.value)
    assert "target.xnnpack_root" in msg and "apt-get install libxnnpack-dev" in msg, msg
    assert not (tmp_path / "run" / "model.pte").exists()
    with pytest.raises(EtbuildError, match="XNNPACK does not run on bare-metal Cortex-M"):
        build_in_process([*XNN, "+target=cortex_m"], tmp_path / "run2")


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("aarch64-linux-gnu-g++", "qemu-aarch64", "apt-get", "dpkg")),
    reason="needs g++-aarch64-linux-gnu, qemu-user, and apt-get/dpkg for Debian's arm64 XNNPACK",
)
def test_linux_aarch64_builds_against_debians_arm64_xnnpack_and_verifies_under_qemu(
    tmp_path,
) -> None:
    from etbuild.runtime_src.backends.xnnpack.debian_root import make_root

    root = tmp_path / "xnnpack-arm64"
    make_root("arm64", root)
    run_dir = tmp_path / "run"
    ctx = build_in_process([*XNN, "+target=linux_aarch64", f"target.xnnpack_root={root}"], run_dir)
    assert max(p["share"] for p in ctx.artifacts["partitions"]["partitions"]) >= 0.95
    verify = ctx.artifacts["verify"]
    assert verify["status"] == "ran under qemu-aarch64", verify
    assert float(verify["max_rel_error"]) <= 1e-4, verify


def test_every_fp32_op_kind_runs_in_the_delegate_and_matches_eager(tmp_path) -> None:
    model = custom_model_overrides("xnnpack_ops", [("x", [2, 3, 32, 32])])
    ctx = build_in_process([*model, *XNN[1:]], tmp_path)
    parts = ctx.artifacts["partitions"]
    assert parts["refused"] == [] and len(parts["partitions"]) == 1, parts
    ops = parts["partitions"][0]["ops"]
    for kind in ("max_pool2d_with_indices", "avg_pool2d", "clamp", "div", "sigmoid", "mean",
                 "constant_pad_nd", "_softmax", "mul", "addmm", "relu"):  # fmt: skip
        assert kind in ops, (kind, sorted(ops))
    verify = ctx.artifacts["verify"]
    assert verify["status"] == "ran" and float(verify["max_rel_error"]) <= 1e-4, verify


def test_kernels_and_delegate_share_one_pool_and_match_one_thread(tmp_path) -> None:
    """A method that alternates between XNNPACK and the runtime's kernels runs on one set of
    threads (the process runs N threads at --threads N, not N plus XNNPACK's own), and its
    outputs at 2 and 4 threads are bit-identical to one thread."""
    model = custom_model_overrides("mixed_delegate", [("x", [1, 3, 40, 40])])
    run_dir = tmp_path / "build"
    ctx = build_in_process([*model, *XNN[1:]], run_dir)
    parts = ctx.artifacts["partitions"]
    refused = {r["op"] for r in parts["refused"]}
    assert len(parts["partitions"]) >= 2 and {"convolution", "native_group_norm"} <= refused, parts
    torch.manual_seed(0)
    x = torch.randn(1, 3, 40, 40)
    runner = run_dir / "runtime" / "bin" / "etb_runner"
    etbt.write(tmp_path / "x.etbt", x)
    outputs = {}
    for threads in (1, 2, 4):
        out = tmp_path / f"out{threads}"
        out.mkdir()
        proc = subprocess.run(
            [str(runner), str(run_dir / "model.pte"), "--input", str(tmp_path / "x.etbt"),
             "--iters", "3", "--threads", str(threads), "--output-dir", str(out)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert f"threads: {threads}\n" in proc.stdout
        assert f"process_threads: {threads}\n" in proc.stdout, proc.stdout
        (outputs[threads],) = [etbt.read(p) for p in sorted(out.glob("output_*.etbt"))]
    one = outputs[1]
    assert one.abs().max() > 0.1 and one.std() > 0.01  # outputs of order one that vary
    for threads in (2, 4):
        assert torch.equal(outputs[threads], one), f"threads={threads} differs from one thread"
