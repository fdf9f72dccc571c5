"""The MLPerf Tiny reference models build on the host, fp32 and int8 (``+quant=ptq``), and verify.

fp32: the built runner matches eager (the verify stage's check, within
``pipeline.verify.tolerance``). int8: the runtime's output equals the reference execution of
the lowered graph exactly, and every convolution and dense layer (indeed every compute op)
runs in int8. The fp32 builds are the session's zoo builds, shared with test_zoo_e2e.py; the
int8 programs run on the installed all-ops runtime (etbuild.runtime), as the tailored runtime's
build is the zoo builds' to test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from etbuild_test_support import build_in_process, stage_record

pytestmark = pytest.mark.e2e

# model -> the shape of its one output
MLPERF_TINY = {
    "ds_cnn": [1, 12],
    "mobilenet_v1_vww": [1, 2],
    "resnet8": [1, 10],
    "fc_autoencoder": [1, 640],
}

# fp32 kernels that would mean a convolution or a dense layer escaped quantization
FP32_CONV_OR_LINEAR = ("aten::convolution", "aten::addmm", "aten::mm", "aten::linear")


@pytest.fixture(scope="module")
def ptq_build(tmp_path_factory: pytest.TempPathFactory):
    """``ptq_build(model) -> (run_dir, ctx)``: the module's one ``+quant=ptq`` program."""
    done: dict[str, tuple[Path, object]] = {}

    def get(name: str):
        if name not in done:
            run_dir = tmp_path_factory.mktemp(f"ptq_{name}")
            done[name] = (
                run_dir,
                build_in_process(
                    ["+quant=ptq", f"model={name}", "pipeline.stop_after=reference"], run_dir
                ),
            )
        return done[name]

    return get


@pytest.mark.parametrize("model", MLPERF_TINY)
def test_fp32_build_verifies_against_eager(zoo_build, model: str) -> None:
    run_dir = zoo_build(model)
    facts = stage_record(run_dir, "verify")["summary"]
    assert facts["status"] == "ran", facts
    assert facts["max_rel_error"] <= 1e-4, facts
    ref = torch.load(run_dir / "reference.pt", weights_only=True)
    assert [list(o.shape) for o in ref["outputs"]] == [MLPERF_TINY[model]]


@pytest.mark.parametrize("model", MLPERF_TINY)
def test_ptq_build_matches_the_lowered_reference_exactly(ptq_build, model: str) -> None:
    import etbuild.runtime as rt

    run_dir, ctx = ptq_build(model)
    inputs = list(ctx.artifacts["example_inputs"])
    (ours,) = rt.load(str(run_dir / "model.pte")).run(inputs)
    expected = ctx.artifacts["graph"].execute(*inputs)[0]
    assert list(ours.shape) == MLPERF_TINY[model]
    assert torch.equal(ours, expected), (ours - expected).abs().max()


@pytest.mark.parametrize("model", MLPERF_TINY)
def test_ptq_leaves_no_conv_or_linear_in_fp32(ptq_build, model: str) -> None:
    run_dir, ctx = ptq_build(model)
    ops = set(ctx.artifacts["op_counts"])
    assert not [op for op in ops if op.startswith(FP32_CONV_OR_LINEAR)], ops
    assert ops & {"etb_quantized::conv2d.out", "etb_quantized::linear.out"}, ops
    # nothing else stays in fp32 either: an MCU build pays no quantize/dequantize inside
    assert stage_record(run_dir, "lower")["summary"]["fp32_ops"] == 0
