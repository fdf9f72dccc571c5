"""Quantized builds end to end: each scheme builds, runs on the runtime's int8 kernels and
verifies; the outputs agree with torchao's converted model and with the reference execution of
the lowered graph; an override keeps its module in fp32; the SQNR gate fails the build.

MobileNetV2 (random weights) is compared with the reference execution of its lowered graph,
exactly: against torchao's converted model single elements differ by one step where fp32
convolution and exact integer accumulation round a tie differently, and a deep random-weight
network amplifies those flips layer by layer, while each int8 kernel implements its reference
op exactly (tests/runtime/test_quantized.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from etbuild_test_support import build_in_process, run_cli

pytest.importorskip("torchao")
pytestmark = pytest.mark.e2e

from etbuild.pipeline.errors import EtbuildError  # noqa: E402
from etbuild.pipeline.graph import Graph  # noqa: E402
from etbuild.pipeline.quant import ops as qops  # noqa: E402


def reference(ctx, inputs) -> torch.Tensor:
    """The lowered graph's reference execution (int8 ops run their Python specification)."""
    return ctx.artifacts["graph"].execute(*inputs)[0]


def runtime_output(run_dir: Path, inputs) -> torch.Tensor:
    import etbuild.runtime as rt

    return rt.load(str(run_dir / "model.pte")).run([t.contiguous() for t in inputs])[0]


def output_step(g: Graph) -> float:
    """Scale of the dequantize that produces the program's output."""
    (out,) = [n for n in g.fx_graph.nodes if n.op == "output"]
    node = out.args[0][0] if isinstance(out.args[0], (list, tuple)) else out.args[0]
    assert node.target == qops.ops.dequantize_per_tensor.default, node.target
    return float(node.args[1])


def stage_summary(run_dir: Path, name: str) -> dict:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (stage,) = [s for s in manifest["stages"] if s["name"] == name]
    return stage["summary"]


@pytest.fixture(scope="module")
def mobilenet_ptq(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("mobilenet_ptq")
    return run_dir, build_in_process(["+quant=ptq", "model=mobilenet"], run_dir)


def test_mobilenet_ptq_builds_verifies_and_reports_accuracy(mobilenet_ptq):
    run_dir, ctx = mobilenet_ptq
    facts = stage_summary(run_dir, "verify")
    assert {"sqnr_db", "top1_agreement", "eval_samples"} <= set(facts)
    report = (run_dir / "report.md").read_text()
    assert "sqnr_db" in report or "SQNR" in report
    ops = set(ctx.artifacts["op_counts"])
    assert {"etb_quantized::conv2d.out", "etb_quantized::add.out"} <= ops
    assert not any(op.startswith("aten::convolution") for op in ops)


def test_mobilenet_ptq_matches_the_reference_execution_exactly(mobilenet_ptq):
    run_dir, ctx = mobilenet_ptq
    inputs = ctx.artifacts["example_inputs"]
    g = ctx.artifacts["graph"]
    ours, ref = runtime_output(run_dir, inputs), reference(ctx, inputs)
    assert torch.equal(ours, ref), (ours - ref).abs().max()
    # Against torchao's converted model: tie flips compound over 50+ layers (module docstring);
    # the difference stays a bounded number of output steps, not garbage.
    with torch.no_grad():
        converted = ctx.artifacts["quantized_module"](*inputs)
    step = output_step(g)
    assert (ours - converted).abs().max() <= 0.5 * converted.abs().max() + step


def test_mobilenet_ptq_fuses_its_wide_blocks_and_plans_less_memory(mobilenet_ptq, tmp_path):
    run_dir, ctx = mobilenet_ptq
    # All 17 blocks (the first without an expansion): those on 112x112, 56x56 and 28x28
    # planes run in bands of rows, the 14x14 and 7x7 ones split their channels.
    assert stage_summary(run_dir, "partition")["blocks_fused"] == 17
    assert ctx.artifacts["op_counts"]["etb_quantized::expand_depthwise_project.out"] == 16
    assert ctx.artifacts["op_counts"]["etb_quantized::depthwise_project.out"] == 1
    fused = json.loads((run_dir / "memory_plan.json").read_text())["total_bytes"]
    build_in_process(["+quant=ptq", "model=mobilenet", "pipeline.lower.fuse_blocks=false",
                      "pipeline.stop_after=plan"], tmp_path)  # fmt: skip
    separate = json.loads((tmp_path / "memory_plan.json").read_text())["total_bytes"]
    # 752,640 against 1,505,280 bytes: the 112x112 blocks' 32- and 96-channel tensors are
    # gone; the peak is now the fp32 input and its int8 copy.
    assert fused <= 0.55 * separate, (fused, separate)


def test_mobilenet_int8_constants_are_at_most_30_percent_of_fp32(mobilenet_ptq, zoo_build):
    run_dir, _ = mobilenet_ptq
    int8 = stage_summary(run_dir, "emit")["constant_bytes"]
    fp32 = stage_summary(zoo_build("mobilenet"), "emit")["constant_bytes"]
    assert int8 <= 0.30 * fp32, (int8, fp32)


def test_keep_classifier_in_fp32(tmp_path):
    ctx = build_in_process(
        ["+quant=ptq", "model=mobilenet", "quant.keep_fp32.modules=[classifier.*]"], tmp_path
    )
    ops = set(ctx.artifacts["op_counts"])
    assert "aten::addmm.out" in ops
    assert "etb_quantized::linear.out" not in ops
    assert "etb_quantized::conv2d.out" in ops
    # The report lists the classifier as fp32 inside the int8 program, with its dequantize.
    report = (tmp_path / "report.md").read_text()
    section = report.split("## fp32 inside the quantized program")[1].split("\n## ")[0]
    assert "| `aten::addmm.out` | 1 | not quantized by the quantizer" in section, section
    assert "1 call(s) run in fp32, at the cost of 1 quantize/dequantize" in section, section
    assert "sqnr_db" in stage_summary(tmp_path, "verify")
    inputs = ctx.artifacts["example_inputs"]
    ours = runtime_output(tmp_path, inputs)
    ref = reference(ctx, inputs)
    # The fp32 classifier runs the runtime's fp32 GEMM: float summation order differs.
    assert torch.allclose(ours, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


@pytest.mark.parametrize(
    "scheme,model",
    [("ptq", "mlp"), ("qat", "mlp"), ("dynamic", "mlp"), ("dynamic", "transformer")],
)
def test_scheme_builds_verifies_and_matches_torchao(tmp_path, scheme, model):
    ctx = build_in_process([f"+quant={scheme}", f"model={model}"], tmp_path)
    facts = stage_summary(tmp_path, "verify")
    assert facts["sqnr_db"] > 15, facts
    inputs = ctx.artifacts["example_inputs"]
    ours = runtime_output(tmp_path, inputs)
    g = ctx.artifacts["graph"]
    with torch.no_grad():
        converted = ctx.artifacts["quantized_module"](*inputs)
    ops = set(ctx.artifacts["op_counts"])
    if scheme == "dynamic":
        assert "etb_quantized::dynamic_linear.out" in ops
        ref = reference(ctx, inputs)
        if model == "mlp":  # int8 kernels only: exact
            assert torch.equal(ours, ref), (ours - ref).abs().max()
        else:  # fp32 attention / layer norm run the runtime's fp32 kernels
            assert torch.allclose(ours, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
        assert torch.allclose(ours, converted, rtol=1e-3, atol=1e-3 * converted.abs().max())
    else:
        assert "etb_quantized::linear.out" in ops
        assert torch.equal(ours, reference(ctx, inputs))
        # Within one output quantization step of torchao's converted model at every element.
        step = output_step(g)
        assert (ours - converted).abs().max() <= step * 1.0001
        assert converted.std() > 3 * step  # the comparison is not vacuous


def test_sqnr_gate_fails_the_build(tmp_path):
    with pytest.raises(EtbuildError, match=r"SQNR against fp32 is .* dB, below "
                       r"quant.min_sqnr_db=200"):  # fmt: skip
        build_in_process(["+quant=ptq", "model=mlp", "quant.min_sqnr_db=200"], tmp_path)


def test_headline_quant_command_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["+quant=ptq", "model=mlp", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "quantize" in proc.stdout and "sqnr_db=" in proc.stdout
    assert stage_summary(run_dir, "quantize")["scheme"] == "ptq"
    assert (
        "SQNR" in (run_dir / "report.md").read_text()
        or "sqnr_db" in (run_dir / "report.md").read_text()
    )
