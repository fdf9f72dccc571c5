"""The XNNPACK delegate's Python half (``+partitioner=xnnpack``): which lowered ops XNNPACK
runs, and each partition as an XNNPACK subgraph blob in ExecuTorch's format (xnngraph.fbs),
so that ExecuTorch's runtime runs etbuild's delegated programs as well.

What a partition holds:
  - fp32: convolution (incl. depthwise), addmm/linear/mm with constant weights, add, sub,
    mul, div, hardtanh/relu/clamp (fused into their producer where it can), sigmoid,
    hardswish, softmax over the last dim, 2-d max and average pooling, mean over H and W
    (global average pooling), constant padding, view/reshape;
  - int8 (``+quant=ptq``): the same through etbuild's int8 ops: quantize and dequantize,
    convolution (per-channel weights), add, mean, max pooling, view. Fully connected stays on
    etbuild's kernels when its weights are per-channel: the XNNPACK of Debian (2022) refuses
    per-channel int8 fully connected weights.

The program's tensors are contiguous NCHW; XNNPACK's convolutions and pools are NHWC. The blob
moves a tensor between the two with StaticTranspose nodes only where an op needs the other
layout, so a chain of convolutions stays NHWC. Constants go into the blob's own constant
region (which ExecuTorch's runtime reads as well as named data).
"""

from __future__ import annotations

import ctypes.util
import math
import operator
import struct
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import flatbuffers
import torch
from torch import fx

from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.graph import Graph
from etbuild.pipeline.ir import Delegate
from etbuild.pipeline.partition import Partition
from etbuild.pipeline.quant import ops as _quant_ops  # noqa: F401  (registers etb_quantized)
from etbuild.schema.xnnpack import (
    ConstantDataOffset,
    OutputMinMax,
    PerChannelQuant,
    PerTensorQuant,
    XNNFullyConnected,
    XNNGraph,
    XNNQuantizedTensorValue,
    XNNStaticConstantPad,
    XNNStaticReshape,
    XNNStaticTranspose,
    XNNTensorValue,
    XNode,
    XValue,
    _XNNNode1x1,
    _XNNNode2x1,
    _XNNNodeConv,
    _XNNPooling2D,
)
from etbuild.schema.xnnpack.XNNDatatype import XNNDatatype
from etbuild.schema.xnnpack.XNNQuantParams import XNNQuantParams
from etbuild.schema.xnnpack.XNodeUnion import XNodeUnion
from etbuild.schema.xnnpack.XValueUnion import XValueUnion

aten = torch.ops.aten
qops = torch.ops.etb_quantized

INVALID = 0xFFFFFFFF  # XNN_INVALID_VALUE_ID
EXTERNAL_INPUT, EXTERNAL_OUTPUT = 1, 2
CONSTANT_ALIGNMENT = 16
INT8_RANGE = (-128, 127)


class Layout(Enum):
    NCHW = "nchw"  # the program's layout (contiguous torch)
    NHWC = "nhwc"  # XNNPACK's convolutions and pools


TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)

BINARY_FP32 = {
    aten.add.Tensor: XNodeUnion.XNNAdd,
    aten.sub.Tensor: XNodeUnion.XNNSubtract,
    aten.mul.Tensor: XNodeUnion.XNNMultiply,
    aten.div.Tensor: XNodeUnion.XNNDiv,
}
UNARY_FP32 = {
    aten.sigmoid.default: XNodeUnion.XNNSigmoid,
    aten.hardswish.default: XNodeUnion.XNNHardswish,
}
CLAMPS = (aten.hardtanh.default, aten.relu.default, aten.clamp.default)
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def library_problem(root: str | None, target: str) -> str | None:
    """Why the XNNPACK library cannot be linked for ``target``, or None."""
    how = (
        "install it (Debian/Ubuntu: apt-get install libxnnpack-dev libpthreadpool-dev "
        "libcpuinfo-dev) or set target.xnnpack_root to a tree with its headers and libraries"
    )
    if target == "cortex_m":
        return "XNNPACK does not run on bare-metal Cortex-M targets; build with +partitioner=none"
    if root:
        base = Path(root).expanduser()
        headers = [base / "include/xnnpack.h", base / "usr/include/xnnpack.h"]
        libs = [*base.glob("lib*/libXNNPACK.*"), *base.glob("usr/lib*/**/libXNNPACK.*")]
        if not any(h.is_file() for h in headers) or not libs:
            return (
                f"target.xnnpack_root={root!r} has no include/xnnpack.h and lib/libXNNPACK "
                f"(or usr/include, usr/lib/<arch>); {how}"
            )
        return None
    if target != "host":
        arch = {"linux_aarch64": "aarch64-linux-gnu"}.get(target)
        if arch and any(Path(f"/usr/lib/{arch}").glob("libXNNPACK.so*")):
            return None
        return (
            f"the {target} target needs an XNNPACK built for it: set target.xnnpack_root to a "
            "tree with its headers and libraries (for linux_aarch64, Debian's arm64 packages "
            "libxnnpack-dev, libxnnpack0, libpthreadpool-dev, libpthreadpool0, libcpuinfo-dev "
            "and libcpuinfo0, extracted with dpkg -x)"
        )
    header = any(Path(d, "xnnpack.h").is_file() for d in ("/usr/include", "/usr/local/include"))
    if not header or ctypes.util.find_library("XNNPACK") is None:
        return f"the XNNPACK library is not installed on this machine; {how}"
    return None


@dataclass
class QParams:
    scale: float
    zero_point: int


class XnnpackBackend:
    id = "XnnpackBackend"
    runtime_dir = str(Path(__file__).resolve().parent)

    def __init__(self, root: str | None = None, target: object = "host") -> None:
        target = str(getattr(target, "value", target))
        problem = library_problem(root, target)
        if problem:
            raise EtbuildError(f"+partitioner=xnnpack: {problem}")
        self.root = str(Path(root).expanduser().resolve()) if root else None
        self.cmake_args = [f"-DETB_XNNPACK_ROOT={self.root}"] if self.root else []

    # ---- capability -------------------------------------------------------------------
    def check(self, node: fx.Node, graph: Graph) -> str | None:
        t = node.target
        out = _val(node)
        if not isinstance(out, torch.Tensor):
            return "its result is not one tensor"
        if (
            out.dtype not in (torch.float32, torch.int8)
            and t is not qops.dequantize_per_tensor.default
        ):
            return f"XNNPACK takes float32 and int8 tensors, not {out.dtype}"
        if any(isinstance(d, torch.SymInt) for d in out.shape):
            return "its shape is dynamic (XNNPACK subgraphs are static here)"
        if out.dim() > 6:
            return "XNNPACK tensors have at most 6 dims"
        checker = _CHECKS.get(t)
        if checker is None:
            return f"the XNNPACK delegate has no {_name(node)}"
        return checker(node, graph)

    # ---- blob -------------------------------------------------------------------------
    def preprocess(self, partition: Partition) -> Delegate:
        return Delegate(self.id, _Writer(partition.graph).blob())


def _name(node: fx.Node) -> str:
    t = node.target
    return t._schema.name.split("::")[-1] if isinstance(t, torch._ops.OpOverload) else str(t)


def _arg(node: fx.Node, i: int, name: str, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _is_const(graph: Graph, a) -> bool:
    return graph.is_const(a)


def _val(a):
    """A node's tensor (max_pool2d_with_indices: its values; the indices are never used)."""
    v = a.meta.get("val") if isinstance(a, fx.Node) else None
    return v[0] if isinstance(v, (tuple, list)) and v else v


# ---- per-op checks: None when XNNPACK (2022 API) runs the node ---------------------------
def _check_conv(node, graph):
    x, w = node.args[0], node.args[1]
    if _arg(node, 6, "transposed", False):
        return "transposed convolution is not delegated"
    if _val(w) is None or _val(w).dim() != 4:
        return "only 2-d convolution is delegated"
    if not _is_const(graph, w) or (node.args[2] is not None and not _is_const(graph, node.args[2])):
        return "its weight or bias is not a constant"
    if _val(x).dtype != torch.float32:
        return "fp32 convolution takes float32"
    return None


def _check_qconv(node, graph):
    w, bias = node.args[3], node.args[5]
    if _val(w) is None or _val(w).dim() != 4:
        return "only 2-d convolution is delegated"
    if not all(_is_const(graph, a) for a in (w, node.args[4])) or (
        bias is not None and not _is_const(graph, bias)
    ):
        return "its weight, scales or bias is not a constant"
    return None


def _check_linear_fp32(node, graph):
    t = node.target
    if t is aten.addmm.default:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return "addmm with alpha or beta is not delegated"
        bias, x, w = node.args[:3]
        if not _is_const(graph, w) or not _is_const(graph, bias) or _val(bias).dim() != 1:
            return "its weight or bias is not a constant vector"
    elif t is aten.mm.default:
        x, w = node.args[:2]
        if not _is_const(graph, w):
            return "its weight is not a constant"
    else:  # linear
        x, w = node.args[:2]
        b = _arg(node, 2, "bias")
        if not _is_const(graph, w) or (b is not None and not _is_const(graph, b)):
            return "its weight or bias is not a constant"
    if _val(x).dtype != torch.float32:
        return "takes float32"
    return None


def _check_qlinear(node, graph):
    w, ws, bias = node.args[3], node.args[4], node.args[5]
    if not all(_is_const(graph, a) for a in (w, ws)) or (
        bias is not None and not _is_const(graph, bias)
    ):
        return "its weight, scales or bias is not a constant"
    return None


def _check_binary(node, graph):
    if node.kwargs.get("alpha", 1) != 1:
        return "add/sub with alpha is not delegated"
    a, b = node.args[:2]
    for v in (a, b):
        if isinstance(v, fx.Node) and _val(v).dtype != torch.float32:
            return "takes float32"
        if isinstance(v, fx.Node) and _val(v).dim() > 4:
            return "broadcasts over more than 4 dims"
    if not isinstance(a, fx.Node) and not isinstance(b, fx.Node):
        return "has no tensor operand"
    return None


def _check_qbinary(node, graph):
    a, b = node.args[0], node.args[3]
    if not isinstance(a, fx.Node) or not isinstance(b, fx.Node):
        return "has no tensor operands"
    if _val(a).shape != _val(b).shape:
        return "int8 add of different shapes is not delegated"
    return None


def _check_clamp(node, graph):
    if node.target is aten.clamp.default:
        lo, hi = _arg(node, 1, "min"), _arg(node, 2, "max")
        if any(isinstance(v, fx.Node) for v in (lo, hi)):
            return "tensor clamp bounds are not delegated"
    return None if _val(node.args[0]).dtype == torch.float32 else "takes float32"


def _check_unary(node, graph):
    return None if _val(node.args[0]).dtype == torch.float32 else "takes float32"


def _check_softmax(node, graph):
    x = _val(node.args[0])
    dim = node.args[1] % x.dim() if x.dim() else 0
    if dim != x.dim() - 1:
        return "softmax over a dim other than the last is not delegated"
    if len(node.args) > 2 and node.args[2]:
        return "half-to-float softmax is not delegated"
    return _check_unary(node, graph)


def _pool_args(node):
    k = list(node.args[1])
    stride = list(_arg(node, 2, "stride", None) or k)
    padding = list(_arg(node, 3, "padding", [0, 0]))
    k, stride, padding = ([v[0]] * 2 if len(v) == 1 else v for v in (k, stride, padding))
    return k, stride, padding


def _check_max_pool(node, graph):
    if node.target is aten.max_pool2d_with_indices.default and any(
        u.target is not operator.getitem or u.args[1] != 0 for u in node.users
    ):
        return "max pooling whose indices are used is not delegated"
    if _val(node.args[0]).dim() != 4:
        return "only 4-d (NCHW) pooling is delegated"
    ceil = _arg(node, 5, "ceil_mode", False)
    if ceil:
        return "ceil_mode pooling is not delegated"
    return None


def _check_avg_pool(node, graph):
    if _val(node.args[0]).dim() != 4 or _val(node.args[0]).dtype != torch.float32:
        return "only fp32 4-d (NCHW) average pooling is delegated"
    _, _, padding = _pool_args(node)
    if any(padding) or _arg(node, 4, "ceil_mode", False) or _arg(node, 6, "divisor_override"):
        return "average pooling with padding, ceil_mode or a divisor override is not delegated"
    return None


def _mean_dims(node, x_dim: int) -> list[int] | None:
    dims = node.args[3] if node.target is qops.mean.default else node.args[1]
    return sorted(d % x_dim for d in dims) if dims else None


def _check_mean(node, graph):
    x = _val(node.args[0])
    if node.target is aten.mean.dim and x.dtype != torch.float32:
        return "takes float32"
    if x.dim() != 4 or _mean_dims(node, 4) != [2, 3]:
        return "only a mean over H and W of an NCHW tensor is delegated (global pooling)"
    return None


def _check_view(node, graph):
    x = node.args[0]
    if _val(x).dtype not in (torch.float32, torch.int8):
        return "views of float32 and int8 only"
    return None


def _check_pad(node, graph):
    x = _val(node.args[0])
    pads = list(node.args[1])
    if any(p < 0 for p in pads) or len(pads) > 2 * x.dim() or x.dtype != torch.float32:
        return "only fp32 constant padding with non-negative amounts is delegated"
    return None


def _check_quantize(node, graph):
    if tuple(node.args[3:5]) != INT8_RANGE:
        return "quantization to a range other than int8's is not delegated"
    return None


_CHECKS = {
    aten.convolution.default: _check_conv,
    aten.addmm.default: _check_linear_fp32,
    aten.mm.default: _check_linear_fp32,
    aten.linear.default: _check_linear_fp32,
    **{t: _check_binary for t in BINARY_FP32},
    **{t: _check_clamp for t in CLAMPS},
    **{t: _check_unary for t in UNARY_FP32},
    aten._softmax.default: _check_softmax,
    aten.max_pool2d.default: _check_max_pool,
    aten.max_pool2d_with_indices.default: _check_max_pool,
    aten.avg_pool2d.default: _check_avg_pool,
    aten.mean.dim: _check_mean,
    aten.constant_pad_nd.default: _check_pad,
    **{t: _check_view for t in VIEWS},
    qops.quantize_per_tensor.default: _check_quantize,
    qops.dequantize_per_tensor.default: lambda n, g: None,
    qops.conv2d.default: _check_qconv,
    qops.linear.default: _check_qlinear,
    qops.add.default: _check_qbinary,
    qops.mean.default: _check_mean,
    qops.max_pool2d.default: _check_max_pool,
}


# ---- the blob ----------------------------------------------------------------------------
class _Writer:
    """Builds the XNNGraph of one partition."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.values: list[XValue.XValueT] = []
        self.nodes: list[XNode.XNodeT] = []
        self.constants = bytearray()
        self.constant_data = [_offset(0, 0)]  # entry 0: "no data"
        # fx node -> {layout: value id}; an fx node's logical shape is its meta["val"].
        self.ids: dict[fx.Node, dict[Layout, int]] = {}
        self.qparams: dict[fx.Node, QParams] = {}
        self.producer: dict[int, XNode.XNodeT] = {}  # value id -> node writing it

    # values
    def _value(
        self,
        dtype: int,
        dims,
        *,
        q: QParams | None = None,
        per_channel=None,
        data: bytes | None = None,
        external: int = INVALID,
        flags: int = 0,
    ) -> int:
        tv = XNNTensorValue.XNNTensorValueT()
        tv.datatype, tv.numDims, tv.dims = dtype, len(dims), [int(d) for d in dims]
        tv.constantBufferIdx = self._constant(data) if data is not None else 0
        tv.externalId, tv.flags, tv.idOut = external, flags, len(self.values)
        xv = XValue.XValueT()
        if q is None and per_channel is None:
            xv.xvalueUnionType, xv.xvalueUnion = XValueUnion.XNNTensorValue, tv
        else:
            qv = XNNQuantizedTensorValue.XNNQuantizedTensorValueT()
            qv.tensorValue = tv
            if per_channel is not None:
                scales, channel_dim = per_channel
                p = PerChannelQuant.PerChannelQuantT()
                p.scale, p.channelDim = [float(s) for s in scales], channel_dim
                p.numScales = len(scales)
                qv.quantParamsType, qv.quantParams = XNNQuantParams.PerChannelQuant, p
            else:
                p = PerTensorQuant.PerTensorQuantT()
                p.scale, p.zeroPoint = float(q.scale), int(q.zero_point)
                qv.quantParamsType, qv.quantParams = XNNQuantParams.PerTensorQuant, p
            xv.xvalueUnionType, xv.xvalueUnion = XValueUnion.XNNQuantizedTensorValue, qv
        self.values.append(xv)
        return tv.idOut

    def _constant(self, data: bytes) -> int:
        pad = -len(self.constants) % CONSTANT_ALIGNMENT
        self.constants += b"\0" * pad
        self.constant_data.append(_offset(len(self.constants), len(data)))
        self.constants += data
        return len(self.constant_data) - 1

    def _like(self, node: fx.Node, dims) -> int:
        """A new intermediate value with ``node``'s dtype and quantization."""
        v = _val(node)
        if v.dtype == torch.int8:
            return self._value(XNNDatatype.xnn_datatype_qint8, dims, q=self.qparams[node])
        return self._value(XNNDatatype.xnn_datatype_fp32, dims)

    def _node(self, kind: int, table, out_id: int | None = None) -> XNode.XNodeT:
        n = XNode.XNodeT()
        n.xnodeUnionType, n.xnodeUnion, n.debugHandle = kind, table, len(self.nodes)
        self.nodes.append(n)
        if out_id is not None:
            self.producer[out_id] = n
        return n

    def get(self, node: fx.Node, layout: Layout) -> int:
        """``node``'s value in ``layout`` (a transpose is added the first time it is needed)."""
        have = self.ids[node]
        if layout in have:
            return have[layout]
        ((src_layout, src),) = have.items()
        shape = list(_val(node).shape)
        if _layout_free(shape):  # N,C,1,1 or N,1,H,W: the bytes are the same in both layouts
            dims = _dims(shape, layout)
            out = self._like(node, dims)
            self._reshape(src, out, dims)
        else:
            perm = TO_NHWC if layout is Layout.NHWC else TO_NCHW
            out = self._like(node, _dims(shape, layout))
            t = XNNStaticTranspose.XNNStaticTransposeT()
            t.numDims, t.perm, t.inputId, t.outputId, t.flags = 4, list(perm), src, out, 0
            self._node(XNodeUnion.XNNStaticTranspose, t, out)
        have[layout] = out
        return out

    def _reshape(self, src: int, out: int, dims) -> None:
        r = XNNStaticReshape.XNNStaticReshapeT()
        r.numDims, r.newShape, r.inputId, r.outputId, r.flags = len(dims), list(dims), src, out, 0
        self._node(XNodeUnion.XNNStaticReshape, r, out)

    def define(self, node: fx.Node, layout: Layout, value_id: int) -> None:
        self.ids[node] = {layout: value_id}

    def operand(self, a, layout: Layout) -> int:
        """A tensor operand, or a Python number as a one-element constant."""
        if isinstance(a, fx.Node):
            if self.g.is_const(a) and a not in self.ids:
                t = self.g.const(a).to(torch.float32).contiguous()
                if layout is Layout.NHWC:  # broadcast as NCHW, then laid out as NHWC
                    t = t.reshape([1] * (4 - t.dim()) + list(t.shape))
                    t = t.permute(*TO_NHWC).contiguous()
                    dims = list(t.shape)
                else:
                    dims = list(t.shape) or [1]
                return self._value(XNNDatatype.xnn_datatype_fp32, dims, data=_bytes(t))
            return self.get(a, layout)
        return self._value(XNNDatatype.xnn_datatype_fp32, [1], data=struct.pack("<f", float(a)))

    # the whole partition
    def blob(self) -> bytes:
        g = self.g
        placeholders = [n for n in g.fx_graph.nodes if n.op == "placeholder"]
        inputs = [n for n in placeholders if n.name not in g.constants]
        output = next(n for n in g.fx_graph.nodes if n.op == "output")
        outs = list(output.args[0])
        self._input_qparams(inputs)
        for i, n in enumerate(inputs):
            v = _val(n)
            vid = self._value(
                _dtype(v),
                list(v.shape) or [1],
                q=self.qparams.get(n),
                external=i,
                flags=EXTERNAL_INPUT,
            )
            self.define(n, Layout.NCHW, vid)
        for n in g.fx_graph.nodes:
            if n.op == "call_function":
                self.lower(n)
        # Outputs: NCHW, each written by a node of its own (an external output).
        input_ids = list(range(len(inputs)))
        output_ids = []
        for k, n in enumerate(outs):
            v = _val(n)
            ext = len(inputs) + k
            out = self._value(
                _dtype(v),
                list(v.shape) or [1],
                q=self.qparams.get(n),
                external=ext,
                flags=EXTERNAL_OUTPUT,
            )
            src = self.get(n, Layout.NCHW)
            self._move(src, out, n)
            output_ids.append(out)
        return self._serialize(input_ids, output_ids, len(inputs) + len(outs))

    def _move(self, src: int, out: int, node: fx.Node) -> None:
        """Makes ``out`` (an external output) hold ``src``: the node writing ``src`` writes
        ``out`` instead when nothing else reads it, else a reshape copies it."""
        producer = self.producer.get(src)
        readers = sum(1 for n in self.nodes for r in _reads(n) if r == src)
        if producer is not None and readers == 0 and not self._is_external(src):
            _set_output(producer, out)
            self.producer[out] = producer
            self.ids[node] = {Layout.NCHW: out}
            return
        shape = list(_val(node).shape) or [1]
        self._reshape(src, out, shape)

    def _is_external(self, vid: int) -> bool:
        xv = self.values[vid].xvalueUnion
        tv = xv.tensorValue if hasattr(xv, "tensorValue") else xv
        return tv.flags != 0

    def _input_qparams(self, inputs: list[fx.Node]) -> None:
        """int8 inputs take the quantization their first int8 reader declares."""
        for n in inputs:
            if _val(n).dtype != torch.int8:
                continue
            for user in n.users:
                q = _declared_input_qparams(user, n)
                if q is not None:
                    self.qparams[n] = q
                    break
            else:
                raise EtbuildError(
                    f"xnnpack: the int8 partition input {n.name} has no reader that gives its "
                    "quantization; exclude its readers with partitioner.exclude_modules"
                )

    # ---- one op each ----
    def lower(self, n: fx.Node) -> None:
        t = n.target
        if t is aten.convolution.default:
            x, w, bias, stride, padding, dilation, _, _, groups = n.args[:9]
            self._conv(n, x, self.g.const(w), bias, stride, padding, dilation, groups)
        elif t is qops.conv2d.default:
            self._qconv(n)
        elif t in (aten.addmm.default, aten.mm.default, aten.linear.default):
            self._linear(n)
        elif t is qops.linear.default:
            self._qlinear(n)
        elif t in BINARY_FP32:
            self._binary(n, BINARY_FP32[t], n.args[0], n.args[1])
        elif t is qops.add.default:
            self._qadd(n)
        elif t in CLAMPS:
            self._clamp(n)
        elif t in UNARY_FP32 or t is aten._softmax.default:
            kind = UNARY_FP32.get(t, XNodeUnion.XNNSoftmax)
            layout = Layout.NCHW if t is aten._softmax.default else self._any_layout(n.args[0])
            self._unary(n, kind, self.get(n.args[0], layout), layout)
        elif t is operator.getitem:  # the values of max_pool2d_with_indices
            self.ids[n] = self.ids[n.args[0]]
            if n.args[0] in self.qparams:
                self.qparams[n] = self.qparams[n.args[0]]
        elif t in (aten.max_pool2d.default, qops.max_pool2d.default, aten.avg_pool2d.default,
                   aten.max_pool2d_with_indices.default):  # fmt: skip
            self._pool(n)
        elif t in (aten.mean.dim, qops.mean.default):
            self._mean(n)
        elif t in VIEWS:
            self._view(n)
        elif t is aten.constant_pad_nd.default:
            self._pad(n)
        elif t is qops.quantize_per_tensor.default:
            self.qparams[n] = QParams(float(n.args[1]), int(n.args[2]))
            self._unary(n, XNodeUnion.XNNConvert, self.get(n.args[0], Layout.NCHW), Layout.NCHW)
        elif t is qops.dequantize_per_tensor.default:
            src = self.get(n.args[0], self._any_layout(n.args[0]))
            self._unary(n, XNodeUnion.XNNConvert, src, self._any_layout(n.args[0]))
        else:  # check() refused it: a partition never holds it
            raise EtbuildError(f"xnnpack: {_name(n)} reached preprocess")

    def _any_layout(self, a: fx.Node) -> Layout:
        """The layout ``a`` already has (NHWC first: the convolutions' own)."""
        have = self.ids[a]
        return Layout.NHWC if Layout.NHWC in have else next(iter(have))

    def _out(self, n: fx.Node, layout: Layout) -> int:
        vid = self._like(n, _dims(list(_val(n).shape), layout))
        self.define(n, layout, vid)
        return vid

    def _conv_table(self, x_id, w_id, b_id, out_id, stride, padding, dilation, groups, wshape):
        o, i_per_group, kh, kw = wshape
        c = _XNNNodeConv._XNNNodeConvT()
        c.paddingTop = c.paddingBottom = int(padding[0])
        c.paddingLeft = c.paddingRight = int(padding[1])
        c.kernelHeight, c.kernelWidth = kh, kw
        c.subsamplingHeight, c.subsamplingWidth = int(stride[0]), int(stride[1])
        c.dilationHeight, c.dilationWidth = int(dilation[0]), int(dilation[1])
        c.groups, c.groupInputChannels, c.groupOutputChannels = groups, i_per_group, o // groups
        c.input1Id, c.filterId, c.biasId, c.outputId, c.flags = x_id, w_id, b_id, out_id, 0
        return c

    @staticmethod
    def _depthwise(wshape, groups) -> bool:
        return groups > 1 and wshape[1] == 1 and wshape[0] % groups == 0

    def _fp32_constant(self, t: torch.Tensor) -> int:
        t = t.to(torch.float32).contiguous()
        return self._value(XNNDatatype.xnn_datatype_fp32, list(t.shape) or [1], data=_bytes(t))

    def _fp32_bias(self, bias: fx.Node | None) -> int:
        return INVALID if bias is None else self._fp32_constant(self.g.const(bias).reshape(-1))

    def _conv(self, n, x, w, bias, stride, padding, dilation, groups):
        wshape = list(w.shape)
        depthwise = self._depthwise(wshape, groups)
        w_id = self._fp32_constant(_filter(w, depthwise))
        b_id = self._fp32_bias(bias)
        x_id = self.get(x, Layout.NHWC)
        out = self._out(n, Layout.NHWC)
        c = self._conv_table(x_id, w_id, b_id, out, stride, padding, dilation, groups, wshape)
        kind = XNodeUnion.XNNDepthwiseConv2d if depthwise else XNodeUnion.XNNConv2d
        self._node(kind, c, out)

    def _qconv(self, n):
        x, xs, xzp, w, ws, bias, stride, padding, dilation, groups, os_, ozp, omin, omax = n.args
        self.qparams[n] = QParams(float(os_), int(ozp))
        _require_input_qparams(self.qparams[x], xs, xzp, n)
        wq = self.g.const(w)
        scales = self.g.const(ws).to(torch.float32).reshape(-1)
        wshape = list(wq.shape)
        if scales.numel() == 1:
            scales = scales.expand(wshape[0]).contiguous()
        depthwise = self._depthwise(wshape, groups)
        wt = _filter(wq, depthwise)
        channel_dim = 3 if depthwise else 0
        w_id = self._value(
            XNNDatatype.xnn_datatype_qcint8,
            list(wt.shape),
            per_channel=(scales.tolist(), channel_dim),
            data=_bytes(wt.to(torch.int8)),
        )
        b_id = self._qbias(bias, float(xs), scales)
        x_id = self.get(x, Layout.NHWC)
        out = self._out(n, Layout.NHWC)
        c = self._conv_table(x_id, w_id, b_id, out, stride, padding, dilation, groups, wshape)
        kind = XNodeUnion.XNNDepthwiseConv2d if depthwise else XNodeUnion.XNNConv2d
        node = self._node(kind, c, out)
        _clamp_q(node, omin, omax, self.qparams[n])

    def _qbias(self, bias, x_scale: float, w_scales: torch.Tensor) -> int:
        """fp32 bias -> int32 at scale x_scale * w_scale[c] (what XNNPACK adds to the sums)."""
        if bias is None:
            return INVALID
        b = self.g.const(bias).to(torch.float32).reshape(-1)
        bscale = (torch.tensor(x_scale, dtype=torch.float32) * w_scales).to(torch.float32)
        bq = torch.round(b.double() / bscale.double()).clamp(-(2**31), 2**31 - 1).to(torch.int32)
        return self._value(
            XNNDatatype.xnn_datatype_qcint32,
            [b.numel()],
            per_channel=(bscale.tolist(), 0),
            data=_bytes(bq),
        )

    def _linear(self, n):
        t = n.target
        if t is aten.addmm.default:
            bias, x, w = n.args[:3]
            weight = self.g.const(w).t()  # addmm's is [in, out]
        elif t is aten.mm.default:
            (x, w), bias = n.args[:2], None
            weight = self.g.const(w).t()
        else:
            x, w = n.args[:2]
            bias = _arg(n, 2, "bias")
            weight = self.g.const(w)
        self._fc(n, x, self._fp32_constant(weight), self._fp32_bias(bias))

    def _qlinear(self, n):
        x, xs, xzp, w, ws, bias, os_, ozp, omin, omax = n.args
        self.qparams[n] = QParams(float(os_), int(ozp))
        _require_input_qparams(self.qparams[x], xs, xzp, n)
        weight = self.g.const(w).to(torch.int8).contiguous()
        scales = self.g.const(ws).to(torch.float32).reshape(-1)
        if scales.numel() > 1 and not bool((scales == scales[0]).all()):
            self._qlinear_in_fp32(n, weight, scales)
            return
        scale = float(scales[0])
        w_id = self._value(
            XNNDatatype.xnn_datatype_qint8,
            list(weight.shape),
            q=QParams(scale, 0),
            data=_bytes(weight),
        )
        b_id = INVALID
        if bias is not None:
            b = self.g.const(bias).to(torch.float32).reshape(-1)
            bscale = float(torch.tensor(float(xs), dtype=torch.float32) * scale)
            bq = torch.round(b.double() / bscale).clamp(-(2**31), 2**31 - 1).to(torch.int32)
            b_id = self._value(
                XNNDatatype.xnn_datatype_qint32,
                [b.numel()],
                q=QParams(bscale, 0),
                data=_bytes(bq),
            )
        node = self._fc(n, x, w_id, b_id)
        _clamp_q(node, omin, omax, self.qparams[n])

    def _qlinear_in_fp32(self, n, weight: torch.Tensor, scales: torch.Tensor) -> None:
        """Per-channel int8 weights, which the XNNPACK of Debian (2022) refuses for fully
        connected: dequantize the input, multiply by the dequantized weights in fp32 and
        quantize the result (exact products, sums rounded in fp32)."""
        x, bias, omin, omax = n.args[0], n.args[5], n.args[8], n.args[9]
        x_id = self.get(x, Layout.NCHW)
        shape_in = _dims(list(_val(x).shape), Layout.NCHW)
        xf = self._value(XNNDatatype.xnn_datatype_fp32, shape_in)
        self._convert(x_id, xf)
        w_id = self._fp32_constant(weight.to(torch.float32) * scales.reshape(-1, 1))
        b_id = self._fp32_bias(bias)
        yf = self._value(XNNDatatype.xnn_datatype_fp32, _dims(list(_val(n).shape), Layout.NCHW))
        f = XNNFullyConnected.XNNFullyConnectedT()
        f.input1Id, f.filterId, f.biasId, f.outputId, f.flags = xf, w_id, b_id, yf, 0
        node = self._node(XNodeUnion.XNNFullyConnected, f, yf)
        _clamp_q(node, omin, omax, self.qparams[n])
        out = self._out(n, Layout.NCHW)
        self._convert(yf, out)

    def _convert(self, src: int, out: int) -> None:
        u = _XNNNode1x1._XNNNode1x1T()
        u.inputId, u.outputId, u.flags = src, out, 0
        self._node(XNodeUnion.XNNConvert, u, out)

    def _fc(self, n, x, w_id, b_id):
        x_id = self.get(x, Layout.NCHW)
        out = self._out(n, Layout.NCHW)
        f = XNNFullyConnected.XNNFullyConnectedT()
        f.input1Id, f.filterId, f.biasId, f.outputId, f.flags = x_id, w_id, b_id, out, 0
        return self._node(XNodeUnion.XNNFullyConnected, f, out)

    def _binary(self, n, kind, a, b):
        # NHWC when a tensor operand already is and every tensor operand is 4-d (constants
        # and numbers are laid out to match).
        tensors = [v for v in (a, b) if isinstance(v, fx.Node) and not self.g.is_const(v)]
        layout = Layout.NCHW
        if (
            _val(n).dim() == 4
            and all(_val(v).dim() == 4 for v in tensors)
            and any(Layout.NHWC in self.ids[v] for v in tensors)
        ):
            layout = Layout.NHWC
        a_id, b_id = self.operand(a, layout), self.operand(b, layout)
        out = self._out(n, layout)
        t = _XNNNode2x1._XNNNode2x1T()
        t.input1Id, t.input2Id, t.outputId, t.flags = a_id, b_id, out, 0
        return self._node(kind, t, out)

    def _qadd(self, n):
        a, as_, azp, b, bs, bzp, os_, ozp, omin, omax = n.args
        self.qparams[n] = QParams(float(os_), int(ozp))
        _require_input_qparams(self.qparams[a], as_, azp, n)
        _require_input_qparams(self.qparams[b], bs, bzp, n)
        layout = self._any_layout(a) if _val(a).dim() == 4 else Layout.NCHW
        a_id, b_id = self.get(a, layout), self.get(b, layout)
        out = self._out(n, layout)
        t = _XNNNode2x1._XNNNode2x1T()
        t.input1Id, t.input2Id, t.outputId, t.flags = a_id, b_id, out, 0
        node = self._node(XNodeUnion.XNNAdd, t, out)
        _clamp_q(node, omin, omax, self.qparams[n])

    def _clamp(self, n):
        x = n.args[0]
        if n.target is aten.relu.default:
            lo, hi = 0.0, math.inf
        else:
            default = (-1.0, 1.0) if n.target is aten.hardtanh.default else (-math.inf, math.inf)
            lo = _arg(n, 1, "min_val" if n.target is aten.hardtanh.default else "min", default[0])
            hi = _arg(n, 2, "max_val" if n.target is aten.hardtanh.default else "max", default[1])
            lo = -math.inf if lo is None else float(lo)
            hi = math.inf if hi is None else float(hi)
        layout = self._any_layout(x)
        src = self.get(x, layout)
        producer = self.producer.get(src)
        # Fused into the op that wrote x when nothing else reads x.
        if (
            producer is not None
            and len(x.users) == 1
            and producer.outputMinMax is None
            and producer.xnodeUnionType in _CLAMPABLE
            and len(self.ids[x]) == 1
        ):
            m = OutputMinMax.OutputMinMaxT()
            m.outputMin, m.outputMax = lo, hi
            producer.outputMinMax = m
            self.ids[n] = {layout: src}
            return
        out = self._out(n, layout)
        u = _XNNNode1x1._XNNNode1x1T()
        u.inputId, u.outputId, u.flags = src, out, 0
        node = self._node(XNodeUnion.XNNClamp, u, out)
        m = OutputMinMax.OutputMinMaxT()
        m.outputMin, m.outputMax = lo, hi
        node.outputMinMax = m

    def _unary(self, n, kind, src, layout):
        out = self._out(n, layout)
        u = _XNNNode1x1._XNNNode1x1T()
        u.inputId, u.outputId, u.flags = src, out, 0
        self._node(kind, u, out)

    def _pool(self, n):
        x = n.args[0]
        if n.target in (qops.max_pool2d.default,):
            self.qparams[n] = self.qparams[x]
        k, stride, padding = _pool_args(n)
        x_id = self.get(x, Layout.NHWC)
        out = self._out(n, Layout.NHWC)
        p = _XNNPooling2D._XNNPooling2DT()
        p.paddingTop = p.paddingBottom = int(padding[0])
        p.paddingLeft = p.paddingRight = int(padding[1])
        p.poolingHeight, p.poolingWidth = int(k[0]), int(k[1])
        p.strideHeight, p.strideWidth = int(stride[0]), int(stride[1])
        if n.target is aten.avg_pool2d.default:
            p.dilationHeight = p.dilationWidth = 1
            kind = XNodeUnion.XNNAvgPooling2d
        else:
            dilation = list(_arg(n, 4, "dilation", [1, 1]))
            dilation = dilation * 2 if len(dilation) == 1 else dilation
            p.dilationHeight, p.dilationWidth = int(dilation[0]), int(dilation[1])
            kind = XNodeUnion.XNNMaxPooling2d
        p.inputId, p.outputId, p.flags = x_id, out, 0
        self._node(kind, p, out)

    def _mean(self, n):
        x = n.args[0]
        keepdim = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        if n.target is qops.mean.default:
            _require_input_qparams(self.qparams[x], n.args[1], n.args[2], n)
            keepdim = n.args[4]
            self.qparams[n] = QParams(float(n.args[5]), int(n.args[6]))
        x_id = self.get(x, Layout.NHWC)
        nb, c = _val(x).shape[0], _val(x).shape[1]
        pooled_dims = [nb, 1, 1, c]
        if keepdim:
            out = self._out(n, Layout.NHWC)
        else:
            out = self._like(n, pooled_dims)
        u = _XNNNode1x1._XNNNode1x1T()
        u.inputId, u.outputId, u.flags = x_id, out, 0
        self._node(XNodeUnion.XNNGlobalAvgPooling2d, u, out)
        if not keepdim:  # [N, 1, 1, C] is [N, C]
            flat = self._out(n, Layout.NCHW)
            self._reshape(out, flat, [nb, c])

    def _view(self, n):
        x = n.args[0]
        if _val(x).dtype == torch.int8:
            self.qparams[n] = self.qparams[x]
        src = self.get(x, Layout.NCHW)
        shape = list(_val(n).shape) or [1]
        out = self._out(n, Layout.NCHW)
        self._reshape(src, out, shape)

    def _pad(self, n):
        x, pads = n.args[0], list(n.args[1])
        value = float(_arg(n, 2, "value", 0.0))
        dim = _val(x).dim()
        pre, post = [0] * dim, [0] * dim
        for i in range(len(pads) // 2):  # torch: last dim first
            pre[dim - 1 - i], post[dim - 1 - i] = pads[2 * i], pads[2 * i + 1]
        layout = self._any_layout(x) if dim == 4 else Layout.NCHW
        if layout is Layout.NHWC:
            pre, post = [pre[i] for i in TO_NHWC], [post[i] for i in TO_NHWC]
        src = self.get(x, layout)
        out = self._out(n, layout)
        p = XNNStaticConstantPad.XNNStaticConstantPadT()
        p.prePaddings, p.postPaddings, p.paddingValue = pre, post, value
        p.inputId, p.outputId, p.flags = src, out, 0
        self._node(XNodeUnion.XNNStaticConstantPad, p, out)

    # ---- bytes ----
    def _serialize(self, input_ids, output_ids, num_externs) -> bytes:
        graph = XNNGraph.XNNGraphT()
        graph.version = "0"
        graph.xnodes, graph.xvalues = self.nodes, self.values
        graph.numExterns, graph.inputIds, graph.outputIds = num_externs, input_ids, output_ids
        graph.constantData = self.constant_data
        b = flatbuffers.Builder(1024)
        b.Finish(graph.Pack(b), file_identifier=b"XN01")
        fb = bytes(b.Output())
        fb_offset = 32
        const_offset = fb_offset + _align(len(fb), 16)
        header = struct.pack(
            "<4s4sHIIIQ",
            b"\0\0\0\0",
            b"XH00",
            30,
            fb_offset,
            len(fb),
            const_offset,
            len(self.constants),
        )
        blob = header + b"\0" * (fb_offset - len(header)) + fb
        blob += b"\0" * (const_offset - len(blob)) + bytes(self.constants)
        return blob


_CLAMPABLE = {
    XNodeUnion.XNNConv2d,
    XNodeUnion.XNNDepthwiseConv2d,
    XNodeUnion.XNNFullyConnected,
    XNodeUnion.XNNAdd,
    XNodeUnion.XNNSubtract,
    XNodeUnion.XNNMultiply,
    XNodeUnion.XNNDiv,
    XNodeUnion.XNNAvgPooling2d,
    XNodeUnion.XNNMaxPooling2d,
    XNodeUnion.XNNGlobalAvgPooling2d,
}


def _filter(w: torch.Tensor, depthwise: bool) -> torch.Tensor:
    """A convolution's [O, I/groups, kh, kw] weight as XNNPACK's filter: OHWI, or for a
    depthwise convolution 1HWO."""
    return (w.permute(1, 2, 3, 0) if depthwise else w.permute(0, 2, 3, 1)).contiguous()


def _offset(offset: int, size: int) -> ConstantDataOffset.ConstantDataOffsetT:
    c = ConstantDataOffset.ConstantDataOffsetT()
    c.offset, c.size = offset, size
    return c


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().numpy().tobytes()


def _dtype(v: torch.Tensor) -> int:
    return (
        XNNDatatype.xnn_datatype_qint8 if v.dtype == torch.int8 else XNNDatatype.xnn_datatype_fp32
    )


def _layout_free(shape) -> bool:
    return len(shape) == 4 and (shape[2] * shape[3] == 1 or shape[1] == 1)


def _dims(shape, layout: Layout):
    if layout is Layout.NHWC and len(shape) == 4:
        return [shape[i] for i in TO_NHWC]
    return list(shape) or [1]


def _reads(node: XNode.XNodeT):
    t = node.xnodeUnion
    for name in ("input1Id", "input2Id", "inputId", "filterId", "biasId"):
        if hasattr(t, name):
            yield getattr(t, name)


def _set_output(node: XNode.XNodeT, out: int) -> None:
    node.xnodeUnion.outputId = out


def _clamp_q(node: XNode.XNodeT, qmin: int, qmax: int, q: QParams) -> None:
    """An int8 op's output clamp as XNNPACK's float output range."""
    if (int(qmin), int(qmax)) == INT8_RANGE:
        return
    m = OutputMinMax.OutputMinMaxT()
    m.outputMin = (int(qmin) - q.zero_point) * q.scale
    m.outputMax = (int(qmax) - q.zero_point) * q.scale
    node.outputMinMax = m


def _declared_input_qparams(user: fx.Node, x: fx.Node) -> QParams | None:
    t = user.target
    if t in (qops.conv2d.default, qops.linear.default, qops.mean.default) and user.args[0] is x:
        return QParams(float(user.args[1]), int(user.args[2]))
    if t is qops.add.default:
        if user.args[0] is x:
            return QParams(float(user.args[1]), int(user.args[2]))
        if user.args[3] is x:
            return QParams(float(user.args[4]), int(user.args[5]))
    if t is qops.dequantize_per_tensor.default:
        return QParams(float(user.args[1]), int(user.args[2]))
    return None


def _require_input_qparams(have: QParams, scale, zero_point, n: fx.Node) -> None:
    if scale is None:
        return
    if abs(have.scale - float(scale)) > 1e-12 * max(1.0, abs(have.scale)) or have.zero_point != int(
        zero_point
    ):
        raise EtbuildError(
            f"xnnpack: {n.name} reads an int8 tensor quantized as ({have.scale}, "
            f"{have.zero_point}) but declares ({scale}, {zero_point})"
        )
