"""Fuse MobileNet-style chains of convolutions into one ``expand_depthwise_project`` (or
``depthwise_project``) call: int8 (``etb_quantized::``) and Float (``etb::``).

MobileNet-style blocks widen their channels with a pointwise convolution (6x in MobileNetV2),
filter each channel with a depthwise convolution and project back with a pointwise one;
depthwise-separable layers (MobileNetV1, MobileNetV2's first block) are the last two. Run as
separate convolutions, the wide tensors between them are written to and read back from the
program's memory, and the memory plan must hold the widest of them. The fused kernels
(runtime_src/kernels/{quantized,portable}/expand_depthwise_project.cpp) keep them in
per-thread scratch, a band of rows at a time (the int8 one splits small planes' channels
instead): int8 results are bit-identical to the separate calls; Float ones are the same sums,
some of them in another order (as a thread count never changes them).

Float chains fuse only when the config asks for it (``pipeline.lower.fuse_float_blocks``):
ExecuTorch's runtime has no ``etb::`` kernels, and a Float program without a delegate otherwise
loads in it too.

The pass runs on the ops left to etbuild's runtime (after partitioning): a chain fuses when
each inner tensor feeds only the next convolution and the depthwise convolution has a shape the
kernels' direct paths take (a square 3x3 or 5x5 kernel, one stride of 1 or 2, one padding
below the kernel size, no dilation); a Float one, on an input plane of at least ``MIN_PLANE``
pixels. In a Float chain, the expansion and the depthwise convolution may each be followed by
a ReLU, ReLU6 (hardtanh) or clamp, which the call takes as bounds; the projection's activation
stays a separate op, which the runtime fuses into the call at load.

The Float ops' reference (the kernel's specification):

    e = clamp(conv2d(x, expand_weight, expand_bias), expand_min, expand_max)
    f = clamp(conv2d(e, depthwise_weight, depthwise_bias, stride, padding, groups=E),
              depthwise_min, depthwise_max)
    out = conv2d(f, project_weight, project_bias)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx

from .graph import Graph
from .quant import ops as qops

Q = qops.ops
aten = torch.ops.aten

# Depthwise input planes smaller than this stay separate calls, but for int8 on a target with
# threads: their tensors are small enough to stay in cache anyway, and a band's per-row costs
# (the rows a band shares with the one before it, the per-channel setup of the depthwise
# planes) outweigh what fusing saves. The hosted int8 kernel splits the channels of such
# planes instead of their rows: MobileNetV2 int8's 14x14 and 7x7 blocks fused that way ran
# at 2 threads in 0.92x the time of their separate calls in the host's slow placement, the
# same in the fast one (in bands: 1.13x at one thread). On a microcontroller (bands only)
# they would cost flash and save no RAM: DS-CNN int8 on a Cortex-M4, 94.0 KB of flash
# against 83.2, the same 16,000 bytes planned.
MIN_PLANE = 28 * 28

# A Float block's smallest band (see the kernel: rows in units whose pixels fill whole vectors
# of 16 floats, AVX-512's, the widest) within this many bytes of a thread's scratch: E
# expanded channels over 70-pixel rows take bands of 8 rows, 600 of them 5.6 MB a thread.
MAX_FLOAT_BAND_BYTES = 1 << 20

# ---- the Float ops (namespace etb) --------------------------------------------------------

NAMESPACE = "etb"
_TAIL = (
    "Tensor depthwise_weight, Tensor? depthwise_bias, int[] stride, int[] padding, "
    "float depthwise_min, float depthwise_max, Tensor project_weight, Tensor? project_bias"
)
SCHEMAS = {
    "expand_depthwise_project": "Tensor input, Tensor expand_weight, Tensor? expand_bias, "
    "float expand_min, float expand_max, " + _TAIL,
    "depthwise_project": "Tensor input, " + _TAIL,
}
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")


def depthwise_project_reference(x, wd, bd, stride, padding, dmin, dmax, wp, bp):
    f = F.conv2d(x, wd, bd, list(stride), list(padding), 1, x.shape[1]).clamp(dmin, dmax)
    return F.conv2d(f, wp, bp)


def expand_depthwise_project_reference(x, we, be, emin, emax, *tail):
    return depthwise_project_reference(F.conv2d(x, we, be).clamp(emin, emax), *tail)


REFERENCE = {
    "expand_depthwise_project": expand_depthwise_project_reference,
    "depthwise_project": depthwise_project_reference,
}


# conv2d on fake tensors gives the shapes: the reference is the fake too
qops.define_ops(_lib, NAMESPACE, SCHEMAS, REFERENCE, REFERENCE)
ops = getattr(torch.ops, NAMESPACE)

# ---- matching ------------------------------------------------------------------------------


@dataclass
class _Conv:
    """A convolution of either form, as the pass sees it."""

    node: fx.Node  # the convolution
    out: fx.Node  # what the next stage reads: the convolution, or the activation after it
    weight: fx.Node
    stride: list
    padding: list
    dilation: list
    groups: int
    bounds: tuple[float, float] = (-math.inf, math.inf)  # the activation's (Float)


def _int8_conv(node: object) -> _Conv | None:
    if not isinstance(node, fx.Node) or node.target != Q.conv2d.default:
        return None
    stride, padding, dilation, groups = node.args[6:10]
    return _Conv(node, node, node.args[3], stride, padding, dilation, groups)


_ACTIVATIONS = {aten.relu.default, aten.hardtanh.default, aten.clamp.default}


def _activation_bounds(node: fx.Node) -> tuple[float, float] | None:
    """The bounds of a ReLU, hardtanh or clamp with constant bounds, else None."""
    if node.target == aten.relu.default:
        return (0.0, math.inf)
    args = list(node.args[1:]) + [None] * 2
    if node.target == aten.hardtanh.default:
        lo = args[0] if args[0] is not None else node.kwargs.get("min_val", -1.0)
        hi = args[1] if args[1] is not None else node.kwargs.get("max_val", 1.0)
    else:
        lo = args[0] if args[0] is not None else node.kwargs.get("min")
        hi = args[1] if args[1] is not None else node.kwargs.get("max")
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi))
    return (float(lo), float(hi)) if ok and lo <= hi else None


def _float_conv(node: object) -> _Conv | None:
    if not isinstance(node, fx.Node) or node.target != aten.convolution.default:
        return None
    _, weight, _, stride, padding, dilation, transposed, _, groups = node.args[:9]
    if transposed or not _is_float(node):
        return None
    conv = _Conv(node, node, weight, stride, padding, dilation, groups)
    after = _sole_user(node)
    if after is not None and after.target in _ACTIVATIONS and after.args[0] is node:
        bounds = _activation_bounds(after)
        if bounds is not None:
            conv.out, conv.bounds = after, bounds
    return conv


def _is_float(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return val is not None and val.dtype == torch.float32


def _shape(node: fx.Node) -> list[int] | None:
    val = node.meta.get("val")
    shape = list(val.shape) if val is not None else []
    return shape if shape and all(isinstance(s, int) for s in shape) else None


def _weight_shape(g: Graph, c: _Conv) -> list[int]:
    """A convolution's weight shape, or [] when its weight is not a constant."""
    return list(g.const(c.weight).shape) if g.is_const(c.weight) else []


def _pointwise(g: Graph, c: _Conv, _channels: int = 0) -> bool:
    shape = _weight_shape(g, c)
    return (
        len(shape) == 4
        and shape[2:] == [1, 1]
        and c.groups == 1
        and list(c.stride) in ([1], [1, 1])
        and list(c.padding) in ([0], [0, 0])
        and list(c.dilation) in ([1], [1, 1])
    )


def _square(v) -> int | None:
    v = list(v)
    return v[0] if len(v) in (1, 2) and len(set(v)) == 1 else None


def _depthwise(g: Graph, c: _Conv, channels: int) -> bool:
    shape = _weight_shape(g, c)
    k = shape[2] if len(shape) == 4 else 0
    s, p, d = _square(c.stride), _square(c.padding), _square(c.dilation)
    return (
        shape == [channels, 1, k, k]
        and c.groups == channels
        and k in (3, 5)
        and s in (1, 2)
        and p is not None
        and 0 <= p < k
        and d == 1
    )


def _sole_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


class _Form:
    """How one dtype's chains look and fuse."""

    def __init__(self, conv, reads, fits, fused, min_plane: int) -> None:
        self.min_plane = min_plane  # the smallest depthwise input plane fused, with threads
        self.conv = conv  # node -> _Conv | None
        self.reads = reads  # (consumer, producer) -> whether it reads what the producer wrote
        self.fits = fits  # (graph, depthwise) -> whether the kernel's bands fit its scratch
        self.fused = fused  # (expand | None, depthwise, project) -> (target, args)

    def input_stage(self, g: Graph, c: _Conv, kind) -> _Conv | None:
        """The stage that makes ``c``'s input (a convolution, or the activation after one),
        when it is of ``kind`` (a check of the convolution and its output's channel count)
        and its output feeds nothing else."""
        arg = c.node.args[0]
        src = self.conv(arg)
        if src is None and isinstance(arg, fx.Node) and arg.args:
            src = self.conv(arg.args[0])
        shape = _shape(src.node) if src is not None and src.out is arg else None
        if shape is None or _sole_user(arg) is not c.node:
            return None
        return src if kind(g, src, shape[1]) and self.reads(c, src) else None


def _int8_fused(expand: _Conv | None, depthwise: _Conv, project: _Conv):
    dw, pr = depthwise.node, project.node
    s, p = _square(depthwise.stride), _square(depthwise.padding)
    tail = (*dw.args[3:6], [s, s], [p, p], *dw.args[10:14], *pr.args[3:6], *pr.args[10:14])
    if expand is not None:  # its input, weights and output quantization, then the rest
        return Q.expand_depthwise_project.default, (*expand.node.args[:6],
                                                    *expand.node.args[10:14], *tail)  # fmt: skip
    return Q.depthwise_project.default, (*dw.args[:3], *tail)


def _float_band_bytes(channels: int, width: int, out_width: int, k: int, stride: int) -> int:
    """The scratch of the Float kernel's smallest band (its Block::band_bytes at 16 lanes)."""
    unit_in, unit_out = (16 // math.gcd(w, 16) for w in (width, out_width))
    in_rows = (unit_out - 1) * stride + k + 2 * (unit_in - 1)
    return 4 * channels * (in_rows * width + unit_out * out_width)


def _float_fits(g: Graph, depthwise: _Conv) -> bool:
    _, e, _, w = _shape(depthwise.node.args[0])
    ow = _shape(depthwise.node)[3]
    k = _weight_shape(g, depthwise)[2]
    return _float_band_bytes(e, w, ow, k, _square(depthwise.stride)) <= MAX_FLOAT_BAND_BYTES


def _float_fused(expand: _Conv | None, depthwise: _Conv, project: _Conv):
    dw, pr = depthwise.node, project.node
    s, p = _square(depthwise.stride), _square(depthwise.padding)
    tail = (dw.args[1], dw.args[2], [s, s], [p, p], *depthwise.bounds, pr.args[1], pr.args[2])
    if expand is not None:
        ex = expand.node
        return ops.expand_depthwise_project.default, (ex.args[0], ex.args[1], ex.args[2],
                                                      *expand.bounds, *tail)  # fmt: skip
    return ops.depthwise_project.default, (dw.args[0], *tail)


FORMS = (
    # An int8 convolution reads the quantization its producer wrote (as lowered).
    _Form(
        _int8_conv,
        lambda c, src: c.node.args[1:3] == src.node.args[10:12],
        lambda g, depthwise: True,  # bands of any one row
        _int8_fused,
        min_plane=0,
    ),
    _Form(_float_conv, lambda c, src: True, _float_fits, _float_fused, min_plane=MIN_PLANE),
)


def fuse_blocks(g: Graph, int8: bool = True, floats: bool = False, threads: bool = True) -> int:
    """Replaces every fusable chain in ``g`` (expand -> depthwise -> project, or depthwise ->
    project) of the chosen dtypes by one call; returns how many. ``threads``: the target's
    runtime has threads (not bare metal), so int8 blocks on small planes fuse too."""
    forms = [f for f, on in zip(FORMS, (int8, floats), strict=True) if on]
    fused = 0
    for node in g.call_nodes():
        for form in forms:
            project = form.conv(node)
            if project is not None:
                min_plane = form.min_plane if threads else MIN_PLANE
                fused += _fuse_at(g, form, project, min_plane)
    return fused


def _fuse_at(g: Graph, form: _Form, project: _Conv, min_plane: int) -> int:
    if not _pointwise(g, project) or _shape(project.node) is None:
        return 0
    depthwise = form.input_stage(g, project, _depthwise)
    if depthwise is None:
        return 0
    expand = form.input_stage(g, depthwise, _pointwise)
    x = (expand if expand is not None else depthwise).node.args[0]
    plane = _shape(depthwise.node.args[0])  # the depthwise convolution's input
    if plane is None or plane[2] * plane[3] < min_plane or _shape(x) is None:
        return 0
    if not form.fits(g, depthwise):
        return 0
    target, args = form.fused(expand, depthwise, project)
    with g.fx_graph.inserting_before(project.node):
        block = g.fx_graph.call_function(target, args)
    block.meta = dict(project.node.meta)
    project.node.replace_all_uses_with(block)  # the projection's activation reads the block
    g.fx_graph.erase_node(project.node)
    for stage in (depthwise, expand):
        if stage is not None:
            if stage.out is not stage.node:
                g.fx_graph.erase_node(stage.out)
            g.fx_graph.erase_node(stage.node)
    return 1
