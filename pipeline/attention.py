"""Attention as one operator: ``etb::sdpa`` and the pass that puts it in place of
``F.scaled_dot_product_attention``.

Decomposed, SDPA is a dozen ops of boolean plumbing (``full_like``, ``any``, ``logical_not``,
``where``: torch's safe softmax) around two matrix products; the runtime's ``etb::sdpa.out``
kernel (runtime_src/kernels/portable/attention.cpp) runs it in one call. The reference here is
the kernel's specification:

    scores = (query @ key^T) * scale                    float32, [..., L, S]
    scores[i, j] = -inf where is_causal and j > i, or where a Bool mask is false;
    scores += mask                                      for a Float mask (broadcast)
    out = softmax(scores, -1) @ value                   rows that are all -inf give zeros
"""

from __future__ import annotations

import math

import torch
from torch import fx

from .errors import EtbuildError
from .graph import Graph, source_of

NAMESPACE = "etb"
SCHEMA = "Tensor query, Tensor key, Tensor value, Tensor? attn_mask, bool is_causal, float scale"
_lib = torch.library.Library(NAMESPACE, "DEF")


def sdpa_reference(query, key, value, attn_mask, is_causal, scale):
    scores = (query @ key.transpose(-2, -1)) * scale
    L, S = scores.shape[-2], scores.shape[-1]
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    return probs @ value


def _fake(query, key, value, attn_mask, is_causal, scale):
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


def _register() -> None:
    _lib.define(f"sdpa({SCHEMA}) -> Tensor")
    _lib.define(f"sdpa.out({SCHEMA}, *, Tensor(a!) out) -> Tensor(a!)")

    def out_variant(*args, out):
        result = sdpa_reference(*args)
        out.resize_(result.shape)
        return out.copy_(result)

    _lib.impl("sdpa", sdpa_reference, "CompositeExplicitAutograd")
    _lib.impl("sdpa.out", out_variant, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::sdpa", _fake, lib=_lib)


_register()

SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _arg(node: fx.Node, index: int, name: str, default):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def fuse_attention(g: Graph) -> int:
    """Replaces every aten.scaled_dot_product_attention by etb::sdpa; returns how many."""
    fused = 0
    for node in g.call_nodes():
        if node.target != SDPA:
            continue
        q, k, v = node.args[:3]
        mask = _arg(node, 3, "attn_mask", None)
        dropout = _arg(node, 4, "dropout_p", 0.0)
        causal = _arg(node, 5, "is_causal", False)
        scale = _arg(node, 6, "scale", None)
        gqa = _arg(node, 7, "enable_gqa", False)
        where = source_of(node)
        if dropout != 0.0:
            raise EtbuildError(
                f"F.scaled_dot_product_attention at {where} has dropout_p={dropout}; a deployed "
                "model must not drop: pass dropout_p=0.0 when not training "
                "(e.g. `self.dropout if self.training else 0.0`)"
            )
        if gqa:
            raise EtbuildError(
                f"F.scaled_dot_product_attention at {where} uses enable_gqa=True, which etbuild "
                "does not support yet: repeat key and value to the query's heads "
                "(key.repeat_interleave(groups, dim=-3)) before the call"
            )
        if scale is None:
            scale = 1.0 / math.sqrt(q.meta["val"].shape[-1])
        with g.fx_graph.inserting_before(node):
            fused_node = g.fx_graph.call_function(
                torch.ops.etb.sdpa.default, (q, k, v, mask, bool(causal), float(scale))
            )
        fused_node.meta = dict(node.meta)
        node.replace_all_uses_with(fused_node)
        g.fx_graph.erase_node(node)
        fused += 1
    return fused
