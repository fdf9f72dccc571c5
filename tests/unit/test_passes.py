"""The `lower` stage's graph passes, driven through the real stages on small test models."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import models_for_tests
import pytest
import torch
from etbuild_test_support import build_in_process, custom_model_overrides
from torch import fx

from etbuild.pipeline.errors import EtbuildError

aten = torch.ops.aten
BN = aten._native_batch_norm_legit_no_training.default


def lower(tmp_path: Path, name: str, inputs: list[tuple[str, list[int]]], stop: str = "lower"):
    """Run the stages through ``stop`` on ``models_for_tests.<name>``; returns the Context."""
    overrides = [*custom_model_overrides(name, inputs), f"pipeline.stop_after={stop}"]
    return build_in_process(overrides, tmp_path / name)


def run_graph(g, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Evaluate the lowered FX graph with its bound constants (an independent interpreter)."""
    feeds = dict(zip(g.input_names, inputs, strict=True))
    args = [
        g.const(n) if g.is_const(n) else feeds[n.name]
        for n in g.fx_graph.nodes
        if n.op == "placeholder"
    ]
    gm = fx.GraphModule(torch.nn.Module(), g.fx_graph)
    with torch.no_grad():
        out = gm(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def lower_summary(ctx) -> dict:
    (rec,) = [r for r in ctx.records if r.name == "lower"]
    return rec.summary


def targets(g) -> list[object]:
    return [n.target for n in g.call_nodes()]


def check_matches_eager(ctx, atol: float = 1e-5) -> None:
    g = ctx.artifacts["graph"]
    module, inputs = ctx.artifacts["module"], ctx.artifacts["example_inputs"]
    with torch.no_grad():
        expected = module(*inputs)
    (got,) = run_graph(g, inputs)
    assert expected.std() > 0.1  # a comparison of near-zeros proves nothing
    torch.testing.assert_close(got, expected, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("name", ["conv_bn", "conv_bias_bn"])
def test_batchnorm_folds_into_conv(tmp_path: Path, name: str) -> None:
    ctx = lower(tmp_path, name, [("x", [2, 3, 8, 8])])
    g = ctx.artifacts["graph"]
    ops = targets(g)
    assert BN not in ops
    assert ops.count(aten.convolution.default) == 1
    # Folded into the conv's weight and bias: no per-channel multiply or add is left.
    assert aten.mul.Tensor not in ops and aten.add.Tensor not in ops, ops
    assert lower_summary(ctx)["bn_folded"] == 1
    conv = next(n for n in g.call_nodes() if n.target == aten.convolution.default)
    assert g.is_const(conv.args[2]), "the folded conv must carry a bias"
    check_matches_eager(ctx)


def test_batchnorm_folds_into_linear(tmp_path: Path) -> None:
    ctx = lower(tmp_path, "linear_bn", [("x", [4, 16])])
    g = ctx.artifacts["graph"]
    ops = targets(g)
    assert BN not in ops
    assert ops.count(aten.addmm.default) == 2, ops
    assert aten.mul.Tensor not in ops and aten.add.Tensor not in ops, ops
    check_matches_eager(ctx)


def test_standalone_batchnorm_becomes_mul_add(tmp_path: Path) -> None:
    ctx = lower(tmp_path, "standalone_bn", [("x", [2, 4, 5, 5])])
    g = ctx.artifacts["graph"]
    ops = targets(g)
    assert BN not in ops
    assert aten.relu.default in ops
    # the BN's scale and shift, then the model's own "* 2.0"
    assert ops.count(aten.add.Tensor) == 1 and ops.count(aten.mul.Tensor) == 2, ops
    for n in g.call_nodes():
        if n.target in (aten.mul.Tensor, aten.add.Tensor):
            consts = [a for a in n.args if g.is_const(a)]
            assert len(consts) == 1  # one constant operand per op
    check_matches_eager(ctx)


def test_constant_permute_of_weight_is_folded(tmp_path: Path) -> None:
    ctx = lower(tmp_path, "permuted_weight", [("x", [3, 16])])
    g = ctx.artifacts["graph"]
    ops = targets(g)
    assert all("permute" not in str(t) and "transpose" not in str(t) for t in ops), ops
    assert lower_summary(ctx)["const_folded"] >= 1
    # the folded weight is a [16, 8] constant read by the matmul
    mm = next(n for n in g.call_nodes() if n.target in (aten.mm.default, aten.addmm.default))
    shapes = [tuple(g.const(a).shape) for a in mm.args if g.is_const(a)]
    assert (16, 8) in shapes
    check_matches_eager(ctx)


def test_noop_clone_and_views_are_dropped(tmp_path: Path) -> None:
    ctx = lower(tmp_path, "no_ops", [("x", [2, 6, 5])])
    g = ctx.artifacts["graph"]
    assert targets(g) == [aten.relu.default, aten.sigmoid.default]
    assert lower_summary(ctx)["noops_dropped"] >= 1
    check_matches_eager(ctx)


def test_noop_program_has_no_copy_instruction(tmp_path: Path) -> None:
    ctx = lower(tmp_path, "no_ops", [("x", [2, 6, 5])], stop="out_variant")
    program = ctx.artifacts["program"]
    assert [ins.op.key for ins in program.instructions] == ["aten::relu.out", "aten::sigmoid.out"]


def _marked_line(marker: str) -> int:
    lines, start = inspect.getsourcelines(models_for_tests.TwoMissingOps)
    for i, line in enumerate(lines):
        if f"# MISSING-OP {marker}" in line:
            return start + i
    raise AssertionError(marker)


def test_missing_ops_fail_lower_with_one_message(tmp_path: Path) -> None:
    run_dir = tmp_path / "two_missing_ops"
    with pytest.raises(EtbuildError) as info:
        lower(tmp_path, "two_missing_ops", [("x", [2, 8])], stop="report")
    src = Path(models_for_tests.__file__)
    fix = (
        "      fix: add a kernel (an ops_yaml/ entry and its code in runtime_src/kernels/), "
        "or rewrite the line with operations the runtime has"
    )
    # each op once, named by the torch-level call and module that made it, the user's line
    # and the fix; the pool's op comes from inside nn.AdaptiveMaxPool1d
    assert str(info.value).splitlines() == [
        "The model uses 2 operator(s) that the runtime has no kernel for "
        "(ops_yaml/ lists every kernel):",
        "  aten::adaptive_max_pool2d.out",
        "      F.adaptive_max_pool1d in nn.AdaptiveMaxPool1d 'pool', "
        f"at {src}:{_marked_line('pool')}  b = self.pool(a)  # MISSING-OP pool",
        fix,
        "  aten::special_erfcx.out",
        "      torch.special.erfcx in TwoMissingOps, "
        f"at {src}:{_marked_line('erfcx')}  a = torch.special.erfcx(x)  # MISSING-OP erfcx",
        fix,
    ]
    # it is the lower stage that failed, and nothing after it ran
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    names = [s["name"] for s in manifest["stages"]]
    assert names[-1] == "lower" and names[0] == "model", names
    assert manifest["stages"][-1]["summary"]["failed"] == "EtbuildError"
    assert "adaptive_max_pool2d" in manifest["error"]
    assert not (run_dir / "model.pte").exists()
    assert sorted(p.name for p in run_dir.iterdir()) == ["manifest.json", "recipe.lock.yaml"]


def test_model_target_not_a_module(tmp_path: Path) -> None:
    with pytest.raises(EtbuildError, match=r"returned object, not a torch\.nn\.Module"):
        lower(tmp_path, "not_a_module", [("x", [2, 8])], stop="model")


def test_model_target_not_importable(tmp_path: Path) -> None:
    overrides = [
        *custom_model_overrides("nope", [("x", [2, 8])]),
        "model._target_=models_for_tests.does_not_exist",
        "pipeline.stop_after=model",
    ]
    with pytest.raises(EtbuildError, match=r"model\._target_='models_for_tests\.does_not_exist'"):
        build_in_process(overrides, tmp_path / "run")
