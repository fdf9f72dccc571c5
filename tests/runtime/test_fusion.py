"""Activation fusion at Method load: a relu, hardtanh (ReLU6) or clamp right after a
convolution or linear layer runs in that kernel's epilogue, with results bit-identical to the
unfused pair, and is left alone whenever fusing could change what the program computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class ConvAct(nn.Module):
    """conv -> activation; with ``also_raw`` the conv output is an output too (no fusion)."""

    def __init__(self, act: nn.Module, also_raw: bool = False, linear: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(24, 40) if linear else nn.Conv2d(6, 20, 3, padding=1)
        self.act = act
        self.also_raw = also_raw

    def forward(self, x):
        y = self.layer(x)
        return (y, self.act(y)) if self.also_raw else self.act(y)


ACTS = {
    "relu": (nn.ReLU(), lambda t: t.clamp(min=0)),
    "relu6": (nn.ReLU6(), lambda t: t.clamp(0, 6)),
    "hardtanh": (nn.Hardtanh(-0.5, 0.25), lambda t: t.clamp(-0.5, 0.25)),
}


def _profile_names(prog, inputs):
    prog.run(inputs, profile=True)
    return [name for name, _ in prog.last_profile]


@pytest.mark.parametrize("linear", [False, True], ids=["conv", "linear"])
@pytest.mark.parametrize("act", sorted(ACTS))
def test_fused_equals_unfused_bit_for_bit(rt, pipeline_program, act, linear):
    torch.manual_seed(0)
    module, clamp = ACTS[act]
    x = torch.randn(3, 24) if linear else torch.randn(1, 6, 11, 13)
    fused = ConvAct(module, linear=linear).eval()
    unfused = ConvAct(module, also_raw=True, linear=linear).eval()
    unfused.load_state_dict(fused.state_dict())
    p_fused = rt.load(str(pipeline_program(fused, [x])))
    p_unfused = rt.load(str(pipeline_program(unfused, [x])))

    assert "fused" in _profile_names(p_fused, [x])
    assert "fused" not in _profile_names(p_unfused, [x])  # the raw output is read twice
    (got,) = p_fused.run([x])
    raw, act_out = p_unfused.run([x])
    assert torch.equal(got, clamp(raw))
    assert torch.equal(got, act_out)
    with torch.no_grad():
        want = fused(x)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert 0 < (got == clamp(torch.full_like(got, -1e9))).float().mean() < 1  # both sides hit


def test_nan_survives_the_fused_clamp(rt, pipeline_program):
    """torch's relu and clamp keep NaN; the fused epilogue must too."""
    module = ConvAct(nn.ReLU6()).eval()
    x = torch.randn(1, 6, 5, 5)
    prog = rt.load(str(pipeline_program(module, [x])))
    assert "fused" in _profile_names(prog, [x])
    x_nan = x.clone()
    x_nan[0, 0, 2, 2] = float("nan")
    (got,) = prog.run([x_nan])
    with torch.no_grad():
        want = module(x_nan)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    keep = ~want.isnan()
    assert (got[keep] - want[keep]).abs().max() <= 1e-4 * want[keep].abs().max()


def test_clamp_with_only_an_upper_bound_fuses(rt, pipeline_program):
    class ConvClampMax(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 1)

        def forward(self, x):
            return torch.clamp(self.conv(x), max=0.1)

    module = ConvClampMax().eval()
    x = torch.randn(1, 4, 9, 7)
    prog = rt.load(str(pipeline_program(module, [x])))
    assert "fused" in _profile_names(prog, [x])
    (got,) = prog.run([x])
    with torch.no_grad():
        want = module(x)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert got.max() <= 0.1
