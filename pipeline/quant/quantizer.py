"""etbuild's PT2E quantizer: annotates the patterns the runtime has int8 kernels for.

Built on torchao's Quantizer API from the ``quant`` config. Patterns (on the pre-dispatch
ATen graph, after prepare_pt2e has folded batch norm into convolutions):

  conv2d [-> relu | relu6 | hardtanh]      int8 input, int8 weight, int8 output
  linear [-> relu]                         same (dynamic: input quantized at run time)
  add    [-> relu]                         int8 inputs and output
  mul (of two tensors)                     int8 inputs and output
  sigmoid, hardsigmoid, hardswish, SiLU, GELU, tanh
                                           int8 input and output (one table lookup each)
  mean / adaptive_avg_pool2d / avg_pool2d / avg_pool1d
                                           int8 input and output
  max_pool2d, amax, max over a dim (values), and shape ops (view, flatten, reshape,
  permute, dropout, clone)                 output shares its input's quantization

Biases stay fp32 here; the lowering quantizes them to int32 at input_scale x weight_scale.
"""

from __future__ import annotations

import fnmatch
import operator

import torch
from torch import fx
from torchao.quantization.pt2e import (
    FakeQuantize,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

from ..config import ActivationScheme, ObserverKind, QuantScheme, WeightGranularity

aten = torch.ops.aten

ACT_QMIN, ACT_QMAX = -128, 127
WEIGHT_QMIN, WEIGHT_QMAX = -127, 127  # symmetric: keep -128 out so that -w is representable
_EPS = 2**-12

CONV_OPS = {aten.conv2d.default, aten.conv1d.default}
LINEAR_OPS = {aten.linear.default}
ADD_OPS = {aten.add.Tensor}
MUL_OPS = {aten.mul.Tensor}
ACTIVATION_OPS = {
    "sigmoid": {aten.sigmoid.default},
    "hardsigmoid": {aten.hardsigmoid.default},
    "hardswish": {aten.hardswish.default, aten.hardswish_.default},
    "silu": {aten.silu.default, aten.silu_.default},
    "gelu": {aten.gelu.default},
    "tanh": {aten.tanh.default},
}
_ACTIVATION_TARGETS = set().union(*ACTIVATION_OPS.values())
RELU_OPS = {aten.relu.default, aten.relu_.default, aten.relu6.default, aten.hardtanh.default,
            aten.hardtanh_.default}  # fmt: skip
AVG_POOL_OPS = {aten.avg_pool2d.default, aten.avg_pool1d.default}
POOL_OPS = {aten.mean.dim, aten.adaptive_avg_pool2d.default, *AVG_POOL_OPS}
# max over dims: amax, and max.dim whose values (not indices) are used.
AMAX_OPS = {aten.amax.default, aten.max.dim}
SHARED_OPS = {
    aten.max_pool2d.default,
    *AMAX_OPS,
    aten.view.default,
    aten.reshape.default,
    aten.flatten.using_ints,
    aten.permute.default,
    aten.dropout.default,
    aten.clone.default,
}
OP_TYPES = {
    "conv2d": CONV_OPS,
    "linear": LINEAR_OPS,
    "add": ADD_OPS,
    "mul": MUL_OPS,
    **ACTIVATION_OPS,
    "mean": {aten.mean.dim},
    "adaptive_avg_pool2d": {aten.adaptive_avg_pool2d.default},
    "max_pool2d": {aten.max_pool2d.default},
    "avg_pool2d": AVG_POOL_OPS,
    "amax": AMAX_OPS,
}

ANNOTATION = "quantization_annotation"


def _observer(kind: ObserverKind):
    return {
        ObserverKind.minmax: MinMaxObserver,
        ObserverKind.moving_average_minmax: MovingAverageMinMaxObserver,
        ObserverKind.histogram: HistogramObserver,
    }[kind]


class EtbQuantizer(Quantizer):
    """Annotates a pre-dispatch ATen graph from a ``quant`` config slice."""

    def __init__(self, qcfg) -> None:
        super().__init__()
        self.scheme = QuantScheme(qcfg.scheme)
        self.qat = self.scheme == QuantScheme.qat
        self.dynamic = self.scheme == QuantScheme.dynamic
        self.keep_modules = list(qcfg.keep_fp32.modules)
        unknown = [o for o in qcfg.keep_fp32.ops if o not in OP_TYPES]
        if unknown:
            from ..errors import EtbuildError

            raise EtbuildError(
                f"quant.keep_fp32.ops has unknown op type(s) {unknown}; "
                f"allowed: {', '.join(sorted(OP_TYPES))}"
            )
        self.keep_ops = set().union(*(OP_TYPES[o] for o in qcfg.keep_fp32.ops))
        self.act = self._activation_spec(qcfg)
        self.weight = self._weight_spec(qcfg)

    # -- specs ------------------------------------------------------------------------------

    def _activation_spec(self, qcfg) -> QuantizationSpec:
        symmetric = ActivationScheme(qcfg.activations) == ActivationScheme.symmetric
        qscheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
        if self.dynamic:
            ctr = PlaceholderObserver.with_args(eps=_EPS)
        elif self.qat:
            ctr = FakeQuantize.with_args(
                observer=_observer(ObserverKind(qcfg.observer)),
                quant_min=ACT_QMIN,
                quant_max=ACT_QMAX,
                dtype=torch.int8,
                qscheme=qscheme,
                eps=_EPS,
            )
        else:
            ctr = _observer(ObserverKind(qcfg.observer)).with_args(eps=_EPS)
        return QuantizationSpec(
            dtype=torch.int8,
            quant_min=ACT_QMIN,
            quant_max=ACT_QMAX,
            qscheme=qscheme,
            is_dynamic=self.dynamic,
            observer_or_fake_quant_ctr=ctr,
        )

    def _weight_spec(self, qcfg) -> QuantizationSpec:
        per_channel = WeightGranularity(qcfg.weights) == WeightGranularity.per_channel
        qscheme = torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric
        if self.qat:
            obs = (
                MovingAveragePerChannelMinMaxObserver
                if per_channel
                else MovingAverageMinMaxObserver
            )
            ctr = FakeQuantize.with_args(
                observer=obs,
                quant_min=WEIGHT_QMIN,
                quant_max=WEIGHT_QMAX,
                dtype=torch.int8,
                qscheme=qscheme,
                ch_axis=0,
                eps=_EPS,
            )
        else:
            obs = PerChannelMinMaxObserver if per_channel else MinMaxObserver
            ctr = obs.with_args(eps=_EPS)
        return QuantizationSpec(
            dtype=torch.int8,
            quant_min=WEIGHT_QMIN,
            quant_max=WEIGHT_QMAX,
            qscheme=qscheme,
            ch_axis=0 if per_channel else None,
            is_dynamic=False,
            observer_or_fake_quant_ctr=ctr,
        )

    # -- annotation -------------------------------------------------------------------------

    def _kept_fp32(self, node: fx.Node) -> bool:
        if node.target in self.keep_ops:
            return True
        stack = node.meta.get("nn_module_stack") or {}
        names = [path for path, _type in stack.values()]
        return any(fnmatch.fnmatchcase(n, p) for n in names for p in self.keep_modules)

    @staticmethod
    def _annotated(node: object) -> bool:
        return isinstance(node, fx.Node) and ANNOTATION in node.meta

    def _mark(self, node: fx.Node, inputs: dict, output) -> None:
        node.meta[ANNOTATION] = QuantizationAnnotation(
            input_qspec_map=inputs, output_qspec=output, _annotated=True
        )

    def _fused_activation(self, node: fx.Node) -> fx.Node | None:
        """The relu/relu6/hardtanh that alone consumes ``node``, if any (not with dynamic)."""
        if self.dynamic or len(node.users) != 1:
            return None
        (user,) = node.users
        if user.target in RELU_OPS and not self._kept_fp32(user):
            return user
        return None

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        for node in model.graph.nodes:
            if node.op != "call_function" or self._annotated(node) or self._kept_fp32(node):
                continue
            if node.target in CONV_OPS or node.target in LINEAR_OPS:
                self._annotate_weighted(node)
            elif self.dynamic:
                continue  # dynamic quantization covers linear layers only
            elif node.target in ADD_OPS or node.target in MUL_OPS:
                self._annotate_binary(node)
            elif node.target in POOL_OPS or node.target in _ACTIVATION_TARGETS:
                self._annotate_simple(node)
        if not self.dynamic:
            self._annotate_shared(model)
        return model

    def _annotate_weighted(self, node: fx.Node) -> None:
        if self.dynamic and node.target not in LINEAR_OPS:
            return
        x, w = node.args[0], node.args[1]
        if not isinstance(w, fx.Node) or w.op != "get_attr":
            return  # weights computed at run time stay fp32
        inputs = {x: self.act, w: self.weight}
        if self.dynamic:
            self._mark(node, inputs, None)
            return
        act = self._fused_activation(node)
        if act is None:
            self._mark(node, inputs, self.act)
        else:
            self._mark(node, inputs, None)
            self._mark(act, {}, self.act)

    def _annotate_binary(self, node: fx.Node) -> None:
        """add or mul of two tensors (a scalar operand stays fp32 arithmetic)."""
        a, b = node.args[0], node.args[1]
        if not all(isinstance(t, fx.Node) for t in (a, b)):
            return
        act = self._fused_activation(node)
        self._mark(node, {a: self.act, b: self.act}, None if act else self.act)
        if act is not None:
            self._mark(act, {}, self.act)

    def _annotate_simple(self, node: fx.Node) -> None:
        self._mark(node, {node.args[0]: self.act}, self.act)

    def _annotate_shared(self, model: fx.GraphModule) -> None:
        """Shape ops, max pooling and max over dims keep their input's quantization (only when
        it has one)."""
        for node in model.graph.nodes:
            if node.op != "call_function" or node.target not in SHARED_OPS:
                continue
            src = node.args[0]
            if self._annotated(node) or self._kept_fp32(node) or not self._quantized_output(src):
                continue
            if node.target == aten.max.dim:
                self._annotate_max_values(node, src)
                continue
            # The input edge shares the producer's output qparams; the output shares the edge's.
            self._mark(
                node,
                {src: SharedQuantizationSpec(src)},
                SharedQuantizationSpec((src, node)),
            )

    def _annotate_max_values(self, node: fx.Node, src: fx.Node) -> None:
        """max over a dim whose indices nothing reads: its values share the input's
        quantization (max is monotonic, so it is the max of the int8 codes)."""
        items = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        if set(items) - {0, 1} or len(items) != len(node.users) or 0 not in items:
            return
        if 1 in items and items[1].users:
            return  # the indices are used: no int8 kernel gives them
        self._mark(node, {src: SharedQuantizationSpec(src)}, None)
        self._mark(items[0], {}, SharedQuantizationSpec((src, node)))

    def _quantized_output(self, node: object) -> bool:
        if not isinstance(node, fx.Node):
            return False
        if node.target is operator.getitem and ANNOTATION not in node.meta:
            node = node.args[0]
        ann = node.meta.get(ANNOTATION)
        return ann is not None and ann.output_qspec is not None

    def validate(self, model: fx.GraphModule) -> None:
        pass
