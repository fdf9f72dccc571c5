"""Fuse int8 chains of convolutions into one ``expand_depthwise_project`` (or
``depthwise_project``) call.

MobileNet-style blocks widen their channels with a pointwise convolution (6x in MobileNetV2),
filter each channel with a depthwise convolution and project back with a pointwise one;
depthwise-separable layers (MobileNetV1, MobileNetV2's first block) are the last two. Run as
separate ``conv2d`` calls, the wide tensors between them are written to and read back from the
program's memory, and the memory plan must hold the widest of them. The fused kernel
(runtime_src/kernels/quantized/expand_depthwise_project.cpp) keeps them in per-thread scratch a
band of rows at a time, with bit-identical results.

The pass runs on the ops left to etbuild's runtime (after partitioning): a chain fuses when
each inner tensor feeds only the next convolution and the depthwise convolution has a shape the
kernel's direct path takes (a square 3x3 or 5x5 kernel, one stride of 1 or 2, one padding
below the kernel size, no dilation), on an input plane of at least ``MIN_PLANE`` pixels.
"""

from __future__ import annotations

from torch import fx

from ..graph import Graph
from . import ops as qops

E = qops.ops

# Depthwise input planes smaller than this stay separate calls: their tensors are small enough
# to stay in cache anyway, and a band's per-row costs (the rows a band shares with the one
# before it, the per-channel setup of the depthwise planes) outweigh what fusing saves.
# MobileNetV2 int8 at 224x224: the 28x28 blocks and bigger gain from fusing, the 14x14 and
# 7x7 ones lose (1.13x their time at one thread, AVX-512).
MIN_PLANE = 28 * 28


def _conv(node: object) -> fx.Node | None:
    return node if isinstance(node, fx.Node) and node.target == E.conv2d.default else None


def _shape(node: fx.Node) -> list[int] | None:
    val = node.meta.get("val")
    shape = list(val.shape) if val is not None else []
    return shape if shape and all(isinstance(s, int) for s in shape) else None


def _weight_shape(g: Graph, n: fx.Node) -> list[int]:
    """A conv2d's weight shape, or [] when its weight is not a constant."""
    w = n.args[3]
    return list(g.const(w).shape) if g.is_const(w) else []


def _pointwise(g: Graph, n: fx.Node, _channels: int = 0) -> bool:
    shape = _weight_shape(g, n)
    stride, padding, dilation, groups = n.args[6:10]
    return (
        len(shape) == 4
        and shape[2:] == [1, 1]
        and groups == 1
        and list(stride) in ([1], [1, 1])
        and list(padding) in ([0], [0, 0])
        and list(dilation) in ([1], [1, 1])
    )


def _square(v) -> int | None:
    v = list(v)
    return v[0] if len(v) in (1, 2) and len(set(v)) == 1 else None


def _depthwise(g: Graph, n: fx.Node, channels: int) -> bool:
    shape = _weight_shape(g, n)
    stride, padding, dilation, groups = n.args[6:10]
    k = shape[2] if len(shape) == 4 else 0
    s, p, d = _square(stride), _square(padding), _square(dilation)
    return (
        shape == [channels, 1, k, k]
        and groups == channels
        and k in (3, 5)
        and s in (1, 2)
        and p is not None
        and 0 <= p < k
        and d == 1
    )


def _sole_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _fusable_input(g: Graph, conv: fx.Node, kind) -> fx.Node | None:
    """The conv2d that makes ``conv``'s input, when it is of ``kind`` (a check of the node and
    its output's channel count), feeds nothing else, and wrote the quantization ``conv`` reads
    (as lowered)."""
    src = _conv(conv.args[0])
    shape = _shape(src) if src is not None else None
    if src is None or shape is None or _sole_user(src) is not conv:
        return None
    return src if kind(g, src, shape[1]) and conv.args[1:3] == src.args[10:12] else None


def fuse_blocks(g: Graph) -> int:
    """Replaces every fusable int8 chain in ``g`` (expand -> depthwise -> project, or
    depthwise -> project) by one call; returns how many."""
    fused = 0
    for project in g.call_nodes():
        if _conv(project) is None or not _pointwise(g, project) or _shape(project) is None:
            continue
        depthwise = _fusable_input(g, project, _depthwise)
        if depthwise is None:
            continue
        expand = _fusable_input(g, depthwise, _pointwise)
        x = (expand if expand is not None else depthwise).args[0]
        plane = _shape(depthwise.args[0])  # the depthwise convolution's input
        if plane is None or plane[2] * plane[3] < MIN_PLANE or _shape(x) is None:
            continue
        wd, wds, bd, stride, padding = depthwise.args[3:8]
        s, p = _square(stride), _square(padding)
        tail = (wd, wds, bd, [s, s], [p, p], *depthwise.args[10:14], *project.args[3:6],
                *project.args[10:14])  # fmt: skip
        if expand is not None:  # its input, weights and output quantization, then the rest
            args = (*expand.args[:6], *expand.args[10:14], *tail)
            target = E.expand_depthwise_project.default
        else:
            args = (*depthwise.args[:3], *tail)
            target = E.depthwise_project.default
        with g.fx_graph.inserting_before(project):
            block = g.fx_graph.call_function(target, args)
        block.meta = dict(project.meta)
        project.replace_all_uses_with(block)
        for n in (project, depthwise, expand):
            if n is not None:
                g.fx_graph.erase_node(n)
        fused += 1
    return fused
