"""Lower quantize/dequantize patterns to the int8 kernels of ``etb_quantized``.

After PT2E convert and core-ATen decomposition a quantized layer reads

    dequantize(x_q) -> convolution(., dequantize(w_q)) [-> relu | hardtanh] -> quantize

This pass replaces each such pattern with one int8 kernel (convolution, linear, add, mean,
max and average pooling, max over dims, shape ops), folds ReLU/ReLU6 into the output clamp,
and turns the quantize/dequantize that remain into ``etb_quantized`` kernels. It runs before
batch-norm and constant folding, which must not fold int8 weights back to fp32.
"""

from __future__ import annotations

import operator

import torch
import torchao.quantization.pt2e  # noqa: F401  (registers the quantized_decomposed ops)
from torch import fx

from ..graph import Graph, is_static, source_of
from ..passes import is_pure_view
from . import ops as qops

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
E = qops.ops

INT8_MIN, INT8_MAX = -128, 127
_SHAPE_OPS = {aten.view.default, aten._unsafe_view.default, aten.permute.default,
              aten.clone.default, aten.squeeze.dims, aten.unsqueeze.default}  # fmt: skip


# Elementwise fp32 ops a chain between a dequantize and a quantize may hold to become one
# int8 table lookup (with scalars or one-element constants as their other operands).
_ELEMENTWISE = {
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.add.Scalar,
    aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar, aten.rsub.Scalar, aten.clamp.default,
    aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default, aten.relu.default,
    aten.sigmoid.default, aten.tanh.default, aten.gelu.default, aten.hardswish.default,
    aten.hardsigmoid.default, aten.silu.default, aten.exp.default, aten.log.default,
    aten.neg.default, aten.abs.default, aten.elu.default, aten.leaky_relu.default,
    aten.erf.default, aten.pow.Tensor_Scalar, aten.sqrt.default, aten.rsqrt.default,
    aten.minimum.default, aten.maximum.default, aten.where.self, aten.gt.Scalar,
    aten.ge.Scalar, aten.lt.Scalar, aten.le.Scalar, aten.softplus.default,
}  # fmt: skip


def _is(node: object, *targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _dequant(node: object) -> tuple[fx.Node, float, int] | None:
    """(int8 source, scale, zero point) when ``node`` dequantizes an int8 activation."""
    if _is(node, qd.dequantize_per_tensor.default) and node.args[5] == torch.int8:
        return node.args[0], float(node.args[1]), int(node.args[2])
    return None


def _quant_of_int8(node: object) -> bool:
    return _is(node, qd.quantize_per_tensor.default) and node.args[5] == torch.int8


def _sole_user(node: fx.Node, *targets) -> fx.Node | None:
    if len(node.users) == 1:
        (user,) = node.users
        if _is(user, *targets):
            return user
    return None


def _quant_user(node: fx.Node) -> tuple[fx.Node, float, int, int, int] | None:
    """(quantize node, scale, zero point, qmin, qmax) when ``node`` feeds one int8 quantize."""
    q = _sole_user(node, qd.quantize_per_tensor.default)
    if q is None or q.args[5] != torch.int8:
        return None
    return q, float(q.args[1]), int(q.args[2]), int(q.args[3]), int(q.args[4])


def _args(n: fx.Node) -> dict[str, object]:
    """``n``'s arguments by name, defaults filled in from its schema."""
    out = {}
    for i, a in enumerate(n.target._schema.arguments):
        if i < len(n.args):
            out[a.name] = n.args[i]
        elif a.name in n.kwargs:
            out[a.name] = n.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _int_list(v: object) -> list[int]:
    """An int[] argument (a single int is a one-item list) as a list of ints."""
    return [int(i) for i in v] if isinstance(v, (list, tuple)) else [int(v)]


# Why an avg_pool2d / amax the quantizer annotated stays fp32 (read by fp32_fallbacks).
REFUSED = "etb_int8_refused"
_MAX_AVG_TAPS = 1 << 23  # the int8 kernel's int32 sums hold 255 x this many taps


def _through_views(node: object) -> tuple[fx.Node, list[fx.Node]]:
    """Walk back through shape ops; returns (source, views outermost-last)."""
    views: list[fx.Node] = []
    while _is(node, aten.view.default, aten._unsafe_view.default) and len(node.users) == 1:
        views.append(node)
        node = node.args[0]
    return node, list(reversed(views))


class _Lowering:
    def __init__(self, g: Graph) -> None:
        self.g = g
        self.count = 0

    # -- helpers -----------------------------------------------------------------------

    def weight(self, node: object, out_channels: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(int8 weight, fp32 scale per output channel) of a dequantized constant weight."""
        if _is(node, qd.dequantize_per_channel.default):
            src, scales, _zps, axis = node.args[:4]
            if axis != 0 or not (self.g.is_const(src) and self.g.is_const(scales)):
                return None
            return self.g.const(src), self.g.const(scales).to(torch.float32)
        if _is(node, qd.dequantize_per_tensor.default) and self.g.is_const(node.args[0]):
            if int(node.args[2]) != 0:
                return None
            scale = torch.full((out_channels,), float(node.args[1]), dtype=torch.float32)
            return self.g.const(node.args[0]), scale
        return None

    def clamp_bounds(self, act: fx.Node | None, scale: float, zp: int, lo: int, hi: int):
        """Output clamp for a fused ReLU / ReLU6 / hardtanh (monotonic, so exact)."""
        if act is None:
            return lo, hi
        if _is(act, aten.relu.default):
            return max(lo, zp), hi
        min_val = act.args[1] if len(act.args) > 1 else -1.0  # hardtanh's defaults
        max_val = act.args[2] if len(act.args) > 2 else 1.0
        return (
            max(lo, zp + round(float(min_val) / scale)),
            min(hi, zp + round(float(max_val) / scale)),
        )

    def replace(self, old: fx.Node, target, args: tuple) -> fx.Node:
        """Insert ``target(*args)`` before ``old`` and route ``old``'s users to it."""
        with self.g.fx_graph.inserting_before(old):
            new = self.g.fx_graph.call_function(target, args)
        new.meta = dict(old.meta)
        fake = old.meta.get("val")
        if isinstance(fake, torch.Tensor):
            new.meta["val"] = fake  # same shape; dtype set by the caller's pattern
        old.replace_all_uses_with(new)
        self.count += 1
        return new

    def with_views(self, source: fx.Node, views: list[fx.Node]) -> fx.Node:
        """Re-apply ``views`` (fp32 view nodes) on ``source``, an int8 or fp32 tensor."""
        node = source
        for v in views:
            with self.g.fx_graph.inserting_before(v):
                node = self.g.fx_graph.call_function(v.target, (node, *v.args[1:]))
            node.meta = dict(v.meta)
            src_val = source.meta.get("val")
            if isinstance(src_val, torch.Tensor):
                node.meta["val"] = v.meta["val"].to(src_val.dtype)
        return node

    def requantized_output(self, n: fx.Node) -> tuple[fx.Node, float, int, int, int] | None:
        """(quantize node, scale, zero point, clamp low, clamp high) of ``n``'s int8 output,
        through an optional ReLU/ReLU6 that becomes the clamp."""
        act = _sole_user(n, aten.relu.default, aten.hardtanh.default)
        q = _quant_user(act or n)
        if q is None:
            return None
        qnode, scale, zp, qmin, qmax = q
        return (qnode, scale, zp, *self.clamp_bounds(act, scale, zp, qmin, qmax))

    def weight_consts(self, n: fx.Node, wq: tuple[torch.Tensor, torch.Tensor]):
        """Constant nodes for an int8 weight and its per-channel scales."""
        weight, scales = wq
        return (
            self.g.add_const(weight, f"{n.name}_wq"),
            self.g.add_const(scales, f"{n.name}_wscale"),
        )

    # -- patterns ----------------------------------------------------------------------

    def conv(self, n: fx.Node) -> None:
        x, w, b, stride, padding, dilation, transposed, _op, groups = n.args
        xq = _dequant(x)
        if transposed or xq is None or not (b is None or self.g.is_const(b)):
            return
        out_channels = n.meta["val"].shape[1]
        wq = self.weight(w, out_channels)
        rank = len(n.meta["val"].shape)
        # A 1-D convolution runs as a 2-D one of height 1, through views that move no data
        # (static shapes only: a dynamic view would cost a copy).
        as_2d = rank == 3 and is_static(n) and is_static(xq[0])
        if wq is None or not (rank == 4 or as_2d):
            return
        out = self.requantized_output(n)
        if out is None:
            return
        qnode, os_, ozp, lo, hi = out
        src, xs, xzp = xq
        stride, padding, dilation = list(stride), list(padding), list(dilation)
        if as_2d:
            src = self.reshaped(src, [*_val_shape(src)[:2], 1, _val_shape(src)[2]], before=n)
            wq = (wq[0].unsqueeze(2), wq[1])
            stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
        args = (src, xs, xzp, *self.weight_consts(n, wq), self.fp32_bias(b, n), stride,
                padding, dilation, groups, os_, ozp, lo, hi)  # fmt: skip
        new = self.replace(qnode, E.conv2d.default, args)
        if as_2d:
            shape = _val_shape(new)
            new.meta["val"] = new.meta["val"].unsqueeze(2)
            back = self.reshaped(new, shape, after=new)
            new.replace_all_uses_with(back, delete_user_cb=lambda user: user is not back)

    def reshaped(self, node: fx.Node, shape: list[int], before=None, after=None) -> fx.Node:
        """A view of ``node`` with static ``shape``, inserted before or after a node."""
        graph = self.g.fx_graph
        with graph.inserting_before(before) if before is not None else graph.inserting_after(after):
            view = graph.call_function(aten.view.default, (node, shape))
        view.meta = dict(node.meta)
        view.meta["val"] = node.meta["val"].reshape(shape)
        return view

    def fp32_bias(self, b: fx.Node | None, n: fx.Node) -> fx.Node | None:
        if b is None:
            return None
        return self.g.add_const(self.g.const(b).to(torch.float32), f"{n.name}_bias")

    def linear(self, n: fx.Node) -> None:
        if n.target == aten.addmm.default:
            if n.kwargs or len(n.args) != 3:
                return
            b, x, wt = n.args
            if not self.g.is_const(b):
                return
        else:
            (x, wt), b = n.args, None
        if not _is(wt, aten.permute.default) or list(wt.args[1]) != [1, 0]:
            return
        out_features = n.meta["val"].shape[-1]
        wq = self.weight(wt.args[0], out_features)
        if wq is None:
            return
        source, views = _through_views(x)
        if self.dynamic_linear(n, source, views, wq, b):
            return
        xq = _dequant(source)
        if xq is None:
            return
        out = self.requantized_output(n)
        if out is None:
            return
        qnode, os_, ozp, lo, hi = out
        src, xs, xzp = xq
        args = (self.with_views(src, views), xs, xzp, *self.weight_consts(n, wq),
                self.fp32_bias(b, n), os_, ozp, lo, hi)  # fmt: skip
        self.replace(qnode, E.linear.default, args)

    def dynamic_linear(self, n, source, views, wq, b) -> bool:
        """choose_qparams -> quantize -> dequantize -> linear, on an fp32 input."""
        if not _is(source, qd.dequantize_per_tensor.tensor):
            return False
        q = source.args[0]
        if not _is(q, qd.quantize_per_tensor.tensor):
            return False
        x = q.args[0]
        args = (self.with_views(x, views), *self.weight_consts(n, wq), self.fp32_bias(b, n))
        self.replace(n, E.dynamic_linear.default, args)
        return True

    def add(self, n: fx.Node) -> None:
        if n.kwargs.get("alpha", 1) != 1 or len(n.args) > 2:
            return
        self.binary(n, E.add.default)

    def mul(self, n: fx.Node) -> None:
        self.binary(n, E.mul.default)

    def binary(self, n: fx.Node, target) -> None:
        """add or mul of two dequantized int8 tensors, quantized after (with broadcasting)."""
        a, b = (_dequant(x) for x in n.args)
        if a is None or b is None:
            return
        out = self.requantized_output(n)
        if out is None:
            return
        qnode, os_, ozp, lo, hi = out
        args = (a[0], a[1], a[2], b[0], b[1], b[2], os_, ozp, lo, hi)
        self.replace(qnode, target, args)

    def mean(self, n: fx.Node) -> None:
        xq = _dequant(n.args[0])
        q = _quant_user(n)
        if xq is None or q is None or n.kwargs.get("dtype") is not None:
            return
        dims = [d % n.args[0].meta["val"].dim() for d in n.args[1]]
        keepdim = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
        qnode, os_, ozp, _qmin, _qmax = q
        self.replace(qnode, E.mean.default, (xq[0], xq[1], xq[2], dims, keepdim, os_, ozp))

    def max_pool(self, n: fx.Node) -> None:
        xq = _dequant(n.args[0])
        if xq is None or set(u.args[1] for u in n.users if _is(u, operator.getitem)) != {0}:
            return
        (item,) = n.users
        q = _quant_user(item)
        if q is None or (q[1], q[2]) != (xq[1], xq[2]):
            return
        kernel = list(n.args[1])
        stride = list(n.args[2]) if len(n.args) > 2 and n.args[2] else kernel
        padding = list(n.args[3]) if len(n.args) > 3 else [0, 0]
        dilation = list(n.args[4]) if len(n.args) > 4 else [1, 1]
        ceil = bool(n.args[5]) if len(n.args) > 5 else False
        self.replace(q[0], E.max_pool2d.default, (xq[0], kernel, stride, padding, dilation, ceil))

    def avg_pool(self, n: fx.Node) -> None:
        """dequantize -> avg_pool2d -> quantize, and avg_pool1d's decomposition
        dequantize -> unsqueeze -> avg_pool2d -> squeeze -> quantize."""
        x, views = n.args[0], []
        if _is(x, aten.unsqueeze.default) and len(x.users) == 1:
            x, views = x.args[0], [x]
        xq = _dequant(x)
        after = _sole_user(n, aten.squeeze.dims, aten.squeeze.dim) if views else None
        q = _quant_user(after or n)
        if xq is None or q is None or (views and after is None):
            return
        a = _args(n)
        kernel, stride, padding = (_int_list(a[k]) for k in ("kernel_size", "stride", "padding"))
        taps = kernel[0] * kernel[-1]
        if taps > _MAX_AVG_TAPS:
            n.meta[REFUSED] = f"windows of more than {_MAX_AVG_TAPS} taps ({taps} here)"
            return
        src = self.with_views(xq[0], views)
        args = (src, xq[1], xq[2], kernel, stride, padding, bool(a["ceil_mode"]),
                bool(a["count_include_pad"]), a["divisor_override"], q[1], q[2])  # fmt: skip
        new = self.replace(q[0], E.avg_pool2d.default, args)
        if after is not None:
            new.meta["val"] = n.meta["val"].to(torch.int8)
            back = self.graph_call(after.target, (new, *after.args[1:]), after=new, like=after)
            new.replace_all_uses_with(back, delete_user_cb=lambda user: user is not back)

    def amax(self, n: fx.Node) -> None:
        """dequantize -> amax (or max.dim's values) -> quantize: the largest int8 code, then,
        when the output's quantization differs from the input's, a table that requantizes
        (both steps are monotonic, so this is the fp32 op exactly)."""
        xq = _dequant(n.args[0])
        out = n
        if n.target == aten.max.dim:
            items = [u for u in n.users if _is(u, operator.getitem)]
            if len(items) != len(n.users) or any(u.args[1] != 0 and u.users for u in items):
                n.meta[REFUSED] = "max's indices (it gives the values only)"
                return
            values = [u for u in items if u.args[1] == 0]
            if len(values) != 1:
                return
            out = values[0]
        q = _quant_user(out)
        if xq is None or q is None:
            return
        a = _args(n)
        dims = _int_list(a["dim"])
        new = self.replace(q[0], E.amax.default, (xq[0], dims, bool(a["keepdim"])))
        if (q[1], q[2]) != (xq[1], xq[2]):
            table = self.requantize_table(n.args[0], q[0])
            const = self.g.add_const(table, f"{q[0].name}_requantize")
            back = self.graph_call(E.table_lookup.default, (new, const), after=new, like=new)
            new.replace_all_uses_with(back, delete_user_cb=lambda user: user is not back)

    def graph_call(self, target, args: tuple, after: fx.Node, like: fx.Node) -> fx.Node:
        """``target(*args)`` inserted after ``after``, with ``like``'s metadata as int8."""
        with self.g.fx_graph.inserting_after(after):
            node = self.g.fx_graph.call_function(target, args)
        node.meta = dict(like.meta)
        val = like.meta.get("val")
        if isinstance(val, torch.Tensor):
            node.meta["val"] = val.to(torch.int8)
        return node

    @staticmethod
    def requantize_table(dq: fx.Node, q: fx.Node) -> torch.Tensor:
        """quantize(dequantize(v)) for every int8 v: what torch computes, as a 256-entry table."""
        every = torch.arange(-128, 128, dtype=torch.int8)
        with torch.no_grad():
            values = dq.target(every, *dq.args[1:], **dq.kwargs)
            return q.target(values, *q.args[1:], **q.kwargs).contiguous()

    def concat(self, n: fx.Node) -> None:
        """cat of int8 activations to one int8 output: each input whose scale or zero point
        differs from the output's is requantized by a 256-entry table lookup (exact: the
        dequantize and quantize torch would run, on every int8 value), then the bytes are
        concatenated."""
        out = _quant_user(n)
        inputs = [_dequant(t) for t in n.args[0]]
        if out is None or any(i is None for i in inputs):
            return
        q, scale, zp = out[0], out[1], out[2]
        parts = []
        for dq, (src, s, z) in zip(n.args[0], inputs, strict=True):
            if (s, z) == (scale, zp):
                parts.append(src)
                continue
            const = self.g.add_const(self.requantize_table(dq, q), f"{dq.name}_requantize")
            with self.g.fx_graph.inserting_before(n):
                lookup = self.g.fx_graph.call_function(E.table_lookup.default, (src, const))
            lookup.meta = dict(src.meta)
            parts.append(lookup)
        self.replace(q, aten.cat.default, (parts, *n.args[1:]))

    def shape_op(self, n: fx.Node) -> None:
        """A view/permute/clone between dequantize and an identical quantize runs on int8."""
        xq = _dequant(n.args[0])
        q = _quant_user(n)
        if xq is None or q is None or (q[1], q[2]) != (xq[1], xq[2]):
            return
        new = self.replace(q[0], n.target, (xq[0], *n.args[1:]))
        new.kwargs = dict(n.kwargs)

    # -- the pass ----------------------------------------------------------------------

    def run(self) -> int:
        dispatch = {
            aten.convolution.default: self.conv,
            aten.addmm.default: self.linear,
            aten.mm.default: self.linear,
            aten.add.Tensor: self.add,
            aten.mul.Tensor: self.mul,
            aten.mean.dim: self.mean,
            aten.max_pool2d_with_indices.default: self.max_pool,
            aten.avg_pool2d.default: self.avg_pool,
            aten.amax.default: self.amax,
            aten.max.dim: self.amax,
            aten.cat.default: self.concat,
        }
        for node in self.g.call_nodes():
            if getattr(node, "_erased", False):
                continue  # removed by an earlier pattern
            handler = dispatch.get(node.target)
            if handler is None and node.target in _SHAPE_OPS:
                handler = self.shape_op
            if handler is not None:
                handler(node)
                self.g.drop_dead()
        for q in self.g.call_nodes():
            if _quant_of_int8(q):
                self.table_lookup(q)
        self.g.drop_dead()
        self.cancel_pairs()
        self.remaining_qdq()
        self.g.drop_dead()
        return self.count

    def elementwise_chain(self, q: fx.Node) -> tuple[fx.Node, list[fx.Node]] | None:
        """(dequantize, chain) when the value ``q`` quantizes is an elementwise function of
        one int8 activation: fp32 ops of _ELEMENTWISE from one dequantize, with only scalars
        or one-element constants besides, whose values nothing else reads."""
        source: fx.Node | None = None
        chain: list[fx.Node] = []
        stack, seen = [q.args[0]], set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if _dequant(n) is not None and not self.g.is_const(n.args[0]):
                if source is not None and source is not n:
                    return None  # a function of two int8 tensors
                source = n
                continue
            if not _is(n, *_ELEMENTWISE):
                return None
            chain.append(n)
            for a in n.all_input_nodes:
                if self.g.is_const(a):
                    if self.g.const(a).numel() != 1:
                        return None
                else:
                    stack.append(a)
        inside = set(chain) | {q}
        if source is None or not chain or any(u not in inside for n in chain for u in n.users):
            return None
        order = {n: i for i, n in enumerate(self.g.fx_graph.nodes)}
        return source, sorted(chain, key=order.__getitem__)

    def table_lookup(self, q: fx.Node) -> None:
        """dequantize -> elementwise fp32 ops -> quantize as one 256-entry int8 table: the
        chain (sigmoid, hardswish, SiLU, GELU, ...) run by torch on every int8 value. Runs
        in graph order, so consecutive lookups compose into one."""
        found = self.elementwise_chain(q)
        if found is None:
            return
        dq, chain = found
        every = torch.arange(-128, 128, dtype=torch.int8)
        values: dict[fx.Node, torch.Tensor] = {}

        def value(a: fx.Node) -> torch.Tensor:
            return values[a] if a in values else self.g.const(a)

        with torch.no_grad():
            values[dq] = dq.target(every, *dq.args[1:], **dq.kwargs)
            for n in chain:
                args, kwargs = fx.node.map_arg((n.args, n.kwargs), value)
                values[n] = n.target(*args, **kwargs)
            out = values[q.args[0]]
            # One value per int8 input (a one-element constant may have added leading dims).
            out = out.to(torch.float32).reshape(-1).expand(256)
            table = q.target(out, *q.args[1:], **q.kwargs)
        source = dq.args[0]
        # A lookup of a lookup that nothing else reads is one lookup of the composed table.
        if (
            _is(source, E.table_lookup.default)
            and set(source.users) == {dq}
            and all(u in chain for u in dq.users)
        ):
            table = table[self.g.const(source.args[1]).to(torch.int64) + 128]
            source = source.args[0]
        const = self.g.add_const(table.contiguous(), f"{q.name}_table")
        self.replace(q, E.table_lookup.default, (source, const))

    def cancel_pairs(self) -> None:
        """quantize(dequantize(x)) with the same parameters is x."""
        for q in self.g.call_nodes():
            if not _is(q, qd.quantize_per_tensor.default):
                continue
            dq = _dequant(q.args[0])
            if dq is not None and (dq[1], dq[2]) == (float(q.args[1]), int(q.args[2])):
                q.replace_all_uses_with(dq[0])

    def remaining_qdq(self) -> None:
        """Quantize/dequantize that remain run as etb_quantized kernels."""
        for n in self.g.call_nodes():
            if not n.users:
                continue
            if _is(n, qd.quantize_per_tensor.default) and n.args[5] == torch.int8:
                x, s, zp, lo, hi = n.args[:5]
                self.replace(n, E.quantize_per_tensor.default, (x, float(s), int(zp), lo, hi))
            elif _dequant(n) is not None and not self.g.is_const(n.args[0]):
                x, s, zp = _dequant(n)
                self.replace(n, E.dequantize_per_tensor.default, (x, s, zp))


def lower_quantized(g: Graph) -> int:
    """Fuse every quantized pattern in ``g``; returns how many kernels were created."""
    return _Lowering(g).run()


# The float ops that have an int8 kernel when the quantizer annotates them (see run()).
_INT8_LOWERED = {aten.convolution.default, aten.addmm.default, aten.mm.default,
                 aten.add.Tensor, aten.mul.Tensor, aten.mean.dim,
                 aten.max_pool2d_with_indices.default, aten.avg_pool2d.default,
                 aten.amax.default, aten.max.dim, aten.cat.default}  # fmt: skip


def _val_shape(node: fx.Node) -> list[int]:
    return [int(d) for d in node.meta["val"].shape]


def _moves_no_data(node: fx.Node) -> bool:
    return node.op == "call_function" and (node.target is operator.getitem or is_pure_view(node))


def _past_views(node: fx.Node) -> fx.Node:
    """The node that computed ``node``'s data, past views of it."""
    while _moves_no_data(node):
        node = node.args[0]
    return node


def _users_past_views(node: fx.Node) -> list[fx.Node]:
    """The users of ``node``'s data, past views of it."""
    out = []
    for user in node.users:
        out += _users_past_views(user) if _moves_no_data(user) else [user]
    return out


def fp32_fallbacks(g: Graph, kernel_key) -> list[dict]:
    """The fp32 compute that a lowered quantized program runs after dequantizing an int8
    activation: one entry per operator (``kernel_key(node)`` names it) with its calls, why it
    is not int8, the quantize/dequantize kernels around it (what it costs) and where the
    model made it."""
    dq, q = E.dequantize_per_tensor.default, E.quantize_per_tensor.default
    float_after_int8: set[fx.Node] = set()
    found: dict[str, dict] = {}
    for node in g.call_nodes():  # in topological order
        if node.target == dq:
            float_after_int8.add(node)
            continue
        if node.target == q or not any(i in float_after_int8 for i in node.all_input_nodes):
            continue
        float_after_int8.add(node)
        if _moves_no_data(node):
            continue
        key = kernel_key(node) or str(node.target)
        if REFUSED in node.meta:
            reason = f"the int8 kernel does not take {node.meta[REFUSED]}"
        elif node.target in _INT8_LOWERED:
            reason = (
                "not quantized by the quantizer (quant.keep_fp32, or a pattern it does not "
                "annotate)"
            )
        else:
            reason = "etbuild has no int8 kernel for it"
        entry = found.setdefault(
            key, {"op": key, "calls": 0, "reason": reason, "conversions": 0, "at": []}
        )
        if reason not in entry["reason"].split("; "):
            entry["reason"] += f"; {reason}"
        entry["calls"] += 1
        entry["conversions"] += sum(1 for i in node.all_input_nodes if _past_views(i).target == dq)
        entry["conversions"] += sum(1 for u in _users_past_views(node) if u.target == q)
        where = source_of(node)
        if where not in entry["at"]:
            entry["at"].append(where)
    return sorted(found.values(), key=lambda e: (-e["conversions"], e["op"]))
