"""Fuse int8 expand -> depthwise -> project chains into one ``expand_depthwise_project`` call.

MobileNet-style blocks widen their channels with a pointwise convolution (6x in MobileNetV2),
filter each channel with a depthwise convolution and project back with a pointwise one. Run
as three ``conv2d`` calls, the two wide tensors between them are written to and read back from
the program's memory, and the memory plan must hold the widest of them. The fused kernel
(runtime_src/kernels/quantized/expand_depthwise_project.cpp) keeps them in per-thread scratch a
band of rows at a time, with bit-identical results.

The pass runs on the ops left to etbuild's runtime (after partitioning): a chain fuses when
each inner tensor feeds only the next convolution and the depthwise convolution has a shape the
kernel's direct path takes (a square 3x3 or 5x5 kernel, one stride of 1 or 2, one padding
below the kernel size, no dilation), on a plane of at least ``MIN_PLANE`` pixels.
"""

from __future__ import annotations

from torch import fx

from ..graph import Graph
from . import ops as qops

E = qops.ops

# Expanded planes smaller than this stay three calls: their tensors are small enough to stay
# in cache anyway, and a band's per-row costs (the rows a band shares with the one before it,
# the per-channel setup of the depthwise planes) outweigh what fusing saves. MobileNetV2 int8
# at 224x224: the 28x28 blocks and bigger gain from fusing, the 14x14 and 7x7 ones lose.
MIN_PLANE = 28 * 28


def _conv(node: object) -> fx.Node | None:
    return node if isinstance(node, fx.Node) and node.target == E.conv2d.default else None


def _shape(node: fx.Node) -> list[int] | None:
    val = node.meta.get("val")
    shape = list(val.shape) if val is not None else []
    return shape if shape and all(isinstance(s, int) for s in shape) else None


def _pointwise(g: Graph, n: fx.Node) -> bool:
    w = n.args[3]
    shape = list(g.const(w).shape) if g.is_const(w) else []
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
    w = n.args[3]
    shape = list(g.const(w).shape) if g.is_const(w) else []
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


def fuse_blocks(g: Graph) -> int:
    """Replaces every fusable int8 expand -> depthwise -> project chain in ``g``; returns how
    many."""
    fused = 0
    for project in g.call_nodes():
        if _conv(project) is None or not _pointwise(g, project):
            continue
        depthwise = _conv(project.args[0])
        expand = _conv(depthwise.args[0]) if depthwise is not None else None
        if expand is None or not _pointwise(g, expand):
            continue
        if _sole_user(expand) is not depthwise or _sole_user(depthwise) is not project:
            continue
        shapes = [_shape(n) for n in (expand.args[0], expand, depthwise, project)]
        if any(s is None for s in shapes) or shapes[1][2] * shapes[1][3] < MIN_PLANE:
            continue
        if not _depthwise(g, depthwise, shapes[1][1]):
            continue
        # Each convolution reads its input quantized as the one before wrote it (as lowered).
        if depthwise.args[1:3] != expand.args[10:12] or project.args[1:3] != depthwise.args[10:12]:
            continue
        x, xs, xzp, we, wes, be, *_ = expand.args
        es, ezp, emin, emax = expand.args[10:14]
        wd, wds, bd, stride, padding = depthwise.args[3:8]
        fs, fzp, fmin, fmax = depthwise.args[10:14]
        wp, wps, bp = project.args[3:6]
        os_, ozp, omin, omax = project.args[10:14]
        s, p = _square(stride), _square(padding)
        args = (x, xs, xzp, we, wes, be, es, ezp, emin, emax, wd, wds, bd, [s, s], [p, p],
                fs, fzp, fmin, fmax, wp, wps, bp, os_, ozp, omin, omax)  # fmt: skip
        with g.fx_graph.inserting_before(project):
            block = g.fx_graph.call_function(E.expand_depthwise_project.default, args)
        block.meta = dict(project.meta)
        project.replace_all_uses_with(block)
        for n in (project, depthwise, expand):
            g.fx_graph.erase_node(n)
        fused += 1
    return fused
