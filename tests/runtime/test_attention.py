"""Attention: F.scaled_dot_product_attention becomes one etb::sdpa kernel call (lower stage,
pipeline/attention.py), or with ``pipeline.lower.attention=aten`` torch's own decomposition;
either must match torch on randomized shapes, masks and scales;
nn.MultiheadAttention and a small ViT build and match eager end to end."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from rt_helpers import assert_matches, build_with_pipeline
from torch import nn

from etbuild.pipeline.attention import sdpa_reference
from etbuild.pipeline.errors import EtbuildError


class Attention(nn.Module):
    """F.scaled_dot_product_attention(q, k, v, mask, is_causal, scale) with the mask a
    constant buffer (or an input when ``mask_input``)."""

    def __init__(self, mask, is_causal, scale, mask_input=False) -> None:
        super().__init__()
        self.is_causal, self.scale, self.mask_input = is_causal, scale, mask_input
        self.mask = mask if not mask_input else None
        if mask is not None and not mask_input:
            self.register_buffer("m", mask)

    def forward(self, q, k, v, *mask):
        m = mask[0] if self.mask_input else (self.m if self.mask is not None else None)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=m, is_causal=self.is_causal, scale=self.scale
        )


def attention_case(seed: int):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lead = rng.choice([[], [3], [2, 4], [1, 2]])
    L, S = rng.choice([1, 5, 16, 23]), rng.choice([1, 7, 16, 30])
    E, Ev = rng.choice([4, 8, 17, 64]), rng.choice([3, 8, 32])
    kind = ["none", "bool", "float", "causal"][seed % 4]
    if kind == "causal":
        S = L  # a square causal mask: every row keeps column 0
    mask = None
    if kind == "bool":
        # one mask for all, broadcast over the last leading dim (heads), or over rows
        shape = rng.choice([[L, S], [*lead[:-1], 1, L, S] if lead else [L, S], [1, S]])
        mask = torch.rand(shape, generator=gen) > 0.3
        mask[..., 0] = True  # no row fully masked (see the test for that case)
    elif kind == "float":
        shape = rng.choice([[L, S], [*lead, L, S]])
        mask = torch.randn(shape, generator=gen)
    scale = rng.choice([None, 0.3])
    q, k, v = (
        torch.randn((*lead, L, E), generator=gen),
        torch.randn((*lead, S, E), generator=gen),
        torch.randn((*lead, S, Ev), generator=gen) * 2,
    )
    return Attention(mask, kind == "causal", scale), [q, k, v]


@pytest.mark.parametrize("seed", range(16))
def test_sdpa_matches_torch(rt, pipeline_program, seed):
    module, inputs = attention_case(seed)
    pte = pipeline_program(module, inputs)
    prog = rt.load(str(pte))
    assert "etb::sdpa.out" in [name for name, _ in run_profile(prog, inputs)]
    with torch.no_grad():
        want = module(*inputs)
    (got,) = prog.run(inputs)
    assert_matches(got, want)
    # The reference the kernel implements agrees with torch too.
    m = module.m if module.mask is not None else None
    ref = sdpa_reference(*inputs, m, module.is_causal, module.scale or inputs[0].shape[-1] ** -0.5)
    assert_matches(ref, want)


@pytest.mark.parametrize("seed", range(8))
def test_sdpa_lowered_as_aten_ops_matches_torch(rt, tmp_path, seed):
    """``pipeline.lower.attention=aten``: torch's own decomposition (the boolean plumbing of its
    safe softmax) runs on the portable kernels, without etb::sdpa."""
    module, inputs = attention_case(seed)
    aten = ["pipeline.lower.attention=aten", "model.dynamic_dims=[]"]
    prog = rt.load(str(build_with_pipeline(module, inputs, tmp_path, overrides=aten)))
    ran = {name for name, _ in run_profile(prog, inputs)}
    assert "etb::sdpa.out" not in ran and {"aten::bmm.out", "aten::mm.out"} & ran, ran
    with torch.no_grad():
        want = module(*inputs)
    (got,) = prog.run(inputs)
    assert_matches(got, want)


def test_sdpa_as_aten_ops_gives_zeros_for_rows_with_nothing_to_attend(rt, tmp_path):
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 6, 8, generator=gen) for _ in range(3))
    mask = torch.rand(2, 6, 6, generator=gen) > 0.5
    mask[:, :, 0] = True
    mask[0, 2, :] = False
    module = Attention(mask, False, None, mask_input=True)
    aten = ["pipeline.lower.attention=aten", "model.dynamic_dims=[]"]
    prog = rt.load(str(build_with_pipeline(module, [q, k, v, mask], tmp_path, overrides=aten)))
    with torch.no_grad():
        want = module(q, k, v, mask)
    (got,) = prog.run([q, k, v, mask])
    assert torch.equal(want[0, 2], torch.zeros(8))
    assert_matches(got, want)


def run_profile(prog, inputs):
    prog.run(inputs, profile=True)
    return prog.last_profile


def test_sdpa_mask_as_input_and_rows_with_nothing_to_attend(rt, pipeline_program):
    """A Bool mask given at run time; a row whose mask is all false gives zeros, as torch."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 6, 8, generator=gen) for _ in range(3))
    mask = torch.rand(2, 6, 6, generator=gen) > 0.5
    mask[:, :, 0] = True
    mask[1, 4, :] = False
    module = Attention(mask, False, None, mask_input=True)
    prog = rt.load(str(pipeline_program(module, [q, k, v, mask])))
    with torch.no_grad():
        want = module(q, k, v, mask)
    (got,) = prog.run([q, k, v, mask])
    assert torch.equal(want[1, 4], torch.zeros(8))
    assert_matches(got, want)
    other = torch.rand(2, 6, 6, generator=gen) > 0.4
    other[..., 0] = True
    (got,) = prog.run([q, k, v, other])
    with torch.no_grad():
        assert_matches(got, module(q, k, v, other))


def test_sdpa_with_dropout_is_refused_with_the_fix(pipeline_program):
    class Dropping(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)

    x = torch.randn(1, 4, 8)
    with pytest.raises(EtbuildError, match=r"dropout_p=0\.1.*pass dropout_p=0\.0 when not"):
        pipeline_program(Dropping(), [x, x, x])


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention(rt, pipeline_program, need_weights):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = mha

        def forward(self, x):
            return self.attn(x, x, x, need_weights=need_weights)[0]

    x = torch.randn(2, 9, 32)
    prog = rt.load(str(pipeline_program(Block().eval(), [x])))
    for batch in (x, torch.randn(2, 9, 32) * 3):
        with torch.no_grad():
            want = Block().eval()(batch)
        assert want.std() > 0.1
        assert_matches(prog.run([batch])[0], want)


def test_vit_builds_end_to_end_and_matches_eager(rt, tmp_path):
    """A ViT written with F.scaled_dot_product_attention (models_for_tests.TinyViT) goes
    through etbuild's pipeline; the runtime matches eager on inputs it was not built with."""
    import models_for_tests
    from etbuild_test_support import build_in_process, custom_model_overrides

    overrides = custom_model_overrides("tiny_vit", [("x", [1, 3, 16, 16])])
    build_in_process([*overrides, "pipeline.stop_after=emit"], tmp_path / "vit")
    prog = rt.load(str(tmp_path / "vit" / "model.pte"))
    model = models_for_tests.tiny_vit()
    gen = torch.Generator().manual_seed(1)
    outs = []
    for _ in range(3):
        x = torch.randn(1, 3, 16, 16, generator=gen)
        with torch.no_grad():
            want = model(x)
        (got,) = prog.run([x])
        assert_matches(got, want)
        outs.append(want)
    assert outs[0].std() > 0.1 and (outs[0] - outs[1]).std() > 0.1  # outputs that say something
    names = [name for name, _ in run_profile(prog, [x])]
    assert names.count("etb::sdpa.out") == 2  # one fused call per block, no decomposition
