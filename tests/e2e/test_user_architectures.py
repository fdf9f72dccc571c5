"""The architectures users bring (tests/models_for_tests.py: a U-Net, a 1-D convolutional
audio classifier, a spectrogram CNN with average pooling, an EfficientNet-style network, a
DS-CNN, a ViT, GRU and LSTM taggers), built
as a user builds them
(``model=custom model._target_=...``): etbuild's runtime and ExecuTorch's runtime both match
eager, and PTQ leaves no op in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from etbuild_test_support import build_in_process, custom_model_overrides, run_in_executorch

pytestmark = pytest.mark.e2e

ARCHITECTURES = {
    "unet": [1, 3, 32, 32],
    "audio_cnn": [1, 40, 101],
    "pooled_cnn": [1, 1, 40, 49],
    "efficientnet_style": [1, 3, 64, 64],
    "ds_cnn": [1, 1, 49, 10],
    "tiny_vit": [1, 3, 16, 16],
    "gru_tagger": [1, 20, 12],
    "lstm_tagger": [1, 20, 12],
}
# The ViT built a second way: attention as torch decomposes it (plain ATen ops), not as one
# etb::sdpa call, which only etbuild's runtime has.
VIT_ATEN = "tiny_vit:attention=aten"
BUILDS = {**{name: (name, []) for name in ARCHITECTURES},
          VIT_ATEN: ("tiny_vit", ["pipeline.lower.attention=aten"])}  # fmt: skip
# Programs with an op of etbuild's own namespace (the fused attention) run on etbuild's
# runtime only.
OWN_OPS_ONLY = {"tiny_vit"}


def _build(name: str, run_dir: Path, quant: str = "none", extra: list[str] | None = None):
    overrides = custom_model_overrides(name, [("x", ARCHITECTURES[name])]) + (extra or [])
    if quant != "none":
        overrides.append(f"+quant={quant}")
    return build_in_process([*overrides, "pipeline.stop_after=reference"], run_dir)


@pytest.fixture(scope="module")
def fp32_builds(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("archs")
    builds = {}
    for build, (name, extra) in BUILDS.items():
        run_dir = base / build.replace(":", "_").replace("=", "_")
        builds[build] = (run_dir, _build(name, run_dir, extra=extra))
    return builds


def test_attention_lowered_as_aten_has_no_etbuild_op(fp32_builds) -> None:
    fused = fp32_builds["tiny_vit"][1].artifacts["op_counts"]
    aten = fp32_builds[VIT_ATEN][1].artifacts["op_counts"]
    assert fused["etb::sdpa.out"] == 2
    assert not [k for k in aten if k.startswith("etb::")], aten
    assert aten["aten::bmm.out"] >= 4 and "aten::_softmax.out" in aten


@pytest.mark.parametrize("name", BUILDS)
def test_runtime_matches_eager(fp32_builds, name: str) -> None:
    import etbuild.runtime

    run_dir, ctx = fp32_builds[name]
    module = ctx.artifacts["module"]
    prog = etbuild.runtime.load(str(run_dir / "model.pte"))
    gen = torch.Generator().manual_seed(11)
    inputs = [ctx.artifacts["example_inputs"][0]]
    inputs += [torch.randn(ARCHITECTURES[BUILDS[name][0]], generator=gen) for _ in range(2)]
    wants = []
    for x in inputs:
        with torch.no_grad():
            want = module(x)
        (got,) = prog.run([x])
        assert want.std() >= 0.1, want.std()  # outputs of order one
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
        wants.append(want)
    assert (wants[1] - wants[2]).std() >= 0.1  # and they depend on the input


@pytest.mark.oracle
def test_executorch_runs_the_programs_and_matches_eager(fp32_builds) -> None:
    dirs = {n: str(d) for n, (d, _) in fp32_builds.items() if n not in OWN_OPS_ONLY}
    results = run_in_executorch(list(dirs.values()))
    for name, d in dirs.items():
        r = results[d]
        assert "error" not in r, (name, r.get("error"))
        for o in r["outputs"]:
            assert o["shape"] == o["want_shape"], name
            assert o["std"] >= 0.1 and o["err"] <= 1e-4 * o["scale"], (name, o)


# int8 kernels each PTQ build must use: average pooling (2-d and 1-d) and max over time.
PTQ_INT8_OPS = {
    "efficientnet_style": ["conv2d", "mul", "table_lookup"],
    "audio_cnn": ["conv2d", "amax"],
    "pooled_cnn": ["conv2d", "avg_pool2d", "mean", "amax"],
}


@pytest.mark.parametrize("name", PTQ_INT8_OPS)
def test_ptq_leaves_no_op_in_fp32(tmp_path: Path, name: str) -> None:
    """Every op between the input's quantize and the output's dequantize runs in int8, and
    the program gives the lowered graph's reference output exactly."""
    import etbuild.runtime

    ctx = _build(name, tmp_path, quant="ptq")
    assert ctx.artifacts["fp32_fallbacks"] == []
    assert ctx.records[2].summary["scheme"] == "ptq"
    counts = ctx.artifacts["op_counts"]
    assert not [k for k in counts if not k.startswith("etb_quantized::")], counts
    for op in PTQ_INT8_OPS[name]:
        assert f"etb_quantized::{op}.out" in counts, (op, counts)
    x = torch.randn(ARCHITECTURES[name], generator=torch.Generator().manual_seed(3))
    (got,) = etbuild.runtime.load(str(tmp_path / "model.pte"), threads=2).run([x])
    assert torch.equal(got, ctx.artifacts["graph"].execute(x)[0])
