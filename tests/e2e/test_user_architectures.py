"""The architectures users bring (tests/models_for_tests.py: a U-Net, a 1-D convolutional
audio classifier, an EfficientNet-style network, a DS-CNN, a ViT, GRU and LSTM taggers), built
as a user builds them
(``model=custom model._target_=...``): etbuild's runtime and ExecuTorch's runtime both match
eager, and PTQ leaves no convolution, sigmoid or mul in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from etbuild_test_support import build_in_process, custom_model_overrides, run_in_executorch

pytestmark = pytest.mark.e2e

ARCHITECTURES = {
    "unet": [1, 3, 32, 32],
    "audio_cnn": [1, 40, 101],
    "efficientnet_style": [1, 3, 64, 64],
    "ds_cnn": [1, 1, 49, 10],
    "tiny_vit": [1, 3, 16, 16],
    "gru_tagger": [1, 20, 12],
    "lstm_tagger": [1, 20, 12],
}
# Programs with an op of etbuild's own namespace (the fused attention) run on etbuild's
# runtime only.
OWN_OPS_ONLY = {"tiny_vit"}


def _build(name: str, run_dir: Path, quant: str = "none"):
    overrides = custom_model_overrides(name, [("x", ARCHITECTURES[name])])
    if quant != "none":
        overrides.append(f"+quant={quant}")
    return build_in_process([*overrides, "pipeline.stop_after=reference"], run_dir)


@pytest.fixture(scope="module")
def fp32_builds(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("archs")
    return {name: (base / name, _build(name, base / name)) for name in ARCHITECTURES}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_runtime_matches_eager(fp32_builds, name: str) -> None:
    import etbuild.runtime

    run_dir, ctx = fp32_builds[name]
    module = ctx.artifacts["module"]
    prog = etbuild.runtime.load(str(run_dir / "model.pte"))
    gen = torch.Generator().manual_seed(11)
    inputs = [ctx.artifacts["example_inputs"][0]]
    inputs += [torch.randn(ARCHITECTURES[name], generator=gen) for _ in range(2)]
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


@pytest.mark.parametrize("name", ["efficientnet_style", "audio_cnn"])
def test_ptq_leaves_no_convolution_sigmoid_or_mul_in_fp32(tmp_path: Path, name: str) -> None:
    ctx = _build(name, tmp_path, quant="ptq")
    fallbacks = ctx.artifacts["fp32_fallbacks"]
    ops = {f["op"] for f in fallbacks}
    assert not {o for o in ops if any(k in o for k in ("convolution", "sigmoid", "mul"))}, ops
    assert ctx.records[2].summary["scheme"] == "ptq"
