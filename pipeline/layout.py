"""Channels-last activations: the program's Float convolutions and the ops between them keep
their 4-d activations in dim order (0, 2, 3, 1), NHWC, where the runtime's kernels take it.

Why: the runtime splits a layer's pixels over its threads. In NCHW every plane then holds a
boundary between the threads' data, and on hosts whose cores do not share a cache the lines
around each boundary pass between the cores in every layer (docs/architecture.md, the threads
paragraph); in NHWC a run of pixels is one contiguous run of memory, every channel of it.

The pass decides, in program order, how each instruction runs:

- a convolution whose ``ops_yaml`` entry takes ``input``/``out`` in (0, 2, 3, 1) and ``weight``
  in (2, 3, 1, 0) runs channels-last when it is 2-d, not transposed, plain (groups 1) or
  depthwise (one input channel per output channel), its weight a constant, unless its input
  is contiguous and nothing after it takes channels-last (it would convert only to convert
  back); its weight is then stored [KH][KW][C][OC] (dim order (2, 3, 1, 0)): a tap's row of
  the GEMM's B for a plain one, a tap's vector of channels for a depthwise one. A plain one of
  at most STEM_CHANNELS input channels (an image's 3) reads a contiguous input as it is; one
  whose output plane has fewer than SMALL_PLANE pixels keeps its weight as the model has it;
- an op whose every 4-d tensor argument may be channels-last (add, the activations) runs so
  when an input already is and its tensors have one shape (no broadcasting);
- an op that takes only its input channels-last (mean over the plane) when its input is.

An activation is channels-last when its producer ran so. Where a tensor reaches an argument in
the other dim order (a graph input into a convolution; a channels-last tensor into an op that
has no channels-last kernel, a delegate, a view or the graph's outputs), one
``_clone_dim_order`` call converts it, once per tensor and order. Graph inputs and outputs stay
contiguous. Only etbuild's runtime runs such programs (ExecuTorch's kernels take contiguous
convolutions), so the pass runs when ``pipeline.lower.channels_last`` is on.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from .ir import DelegateCall, Instruction, Program, TensorValue
from .ops import OpDef

CHANNELS_LAST = (0, 2, 3, 1)
# A convolution weight [OC, C, KH, KW] stored [KH][KW][C][OC].
TAPS_LAST = (2, 3, 1, 0)
CONVERT = "dim_order_ops::_clone_dim_order.out"
# A convolution (groups 1) of at most this many input channels reads a contiguous input into a
# channels-last output itself (runtime_src/kernels/portable/convolution.cpp, kDirectChannels).
STEM_CHANNELS = 4
# On output planes of fewer pixels a plain convolution keeps its weight [OC][C][KH][KW] and the
# runtime multiplies as for NCHW (a 7x7 plane's few rows of pixels would each read all the
# weights again), transposing the product into place.
SMALL_PLANE = 10 * 10


def _takes(op: OpDef, arg: str, order: tuple[int, ...]) -> bool:
    return order in op.dim_orders.get(arg, ())


def _activation(v: object) -> bool:
    """A planned 4-d Float tensor of fixed shape: one the pass may keep channels-last."""
    return (
        isinstance(v, TensorValue)
        and not v.is_constant
        and not v.dynamic
        and v.dtype == torch.float32
        and len(v.shape) == 4
    )


def _tensor_args(ins: Instruction) -> list[tuple[str, TensorValue]]:
    return [
        (a.name, v)
        for a, v in zip(ins.op.schema.arguments, ins.args, strict=True)
        if isinstance(v, TensorValue)
    ]


def _is_convolution(op: OpDef) -> bool:
    return op.key == "aten::convolution.out"


def _inputs(ins: Instruction | DelegateCall) -> list[TensorValue]:
    """The tensors an instruction reads (its outputs left out)."""
    if isinstance(ins, DelegateCall):
        return list(ins.args)
    found = []
    for a, v in zip(ins.op.schema.arguments, ins.args, strict=True):
        for t in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(t, TensorValue) and not a.is_out:
                found.append(t)
    return found


class _Pass:
    def __init__(self, program: Program, ops: dict[str, OpDef]) -> None:
        self.program = program
        self.convert_op = ops[CONVERT]
        self.channels_last: set[int] = set()  # ids of channels-last tensors
        self.consumers: dict[int, list[Instruction | DelegateCall]] = defaultdict(list)
        self.reaches: dict[int, bool] = {}  # _reaches_convolution's answers by tensor id
        for ins in program.instructions:
            for v in _inputs(ins):
                self.consumers[id(v)].append(ins)

    @staticmethod
    def _free(out: TensorValue) -> bool:
        """Whether an output may be channels-last: an activation with storage of its own (not
        a slice of a concatenation that its producer writes in place). Views of it and the
        graph's outputs get a contiguous copy."""
        return _activation(out) and out.alias_of is None

    def _conv_runs_channels_last(self, ins: Instruction) -> bool:
        op, a = ins.op, dict(zip((x.name for x in ins.op.schema.arguments), ins.args, strict=True))
        if not (
            _takes(op, "input", CHANNELS_LAST)
            and _takes(op, "out", CHANNELS_LAST)
            and _takes(op, "weight", TAPS_LAST)
        ):
            return False
        x, w, out = a["input"], a["weight"], a["out"]
        if not _activation(x):
            return False
        if a["transposed"] or not w.is_constant or len(w.shape) != 4 or not self._free(out):
            return False
        groups, channels = a["groups"], x.shape[1]
        if groups != 1 and not (groups == channels == w.shape[0] and w.shape[1] == 1):
            return False
        if id(x) in self.channels_last:
            return True
        # A contiguous input: worth it only if a convolution after takes channels-last.
        return self._reaches_convolution(out)

    def _reaches_convolution(self, v: TensorValue) -> bool:
        """Whether `v` reaches a convolution that takes channels-last, directly or through ops
        that take every argument channels-last (an activation, an add). Memoized: paths that
        branch and meet again are walked once."""
        if id(v) not in self.reaches:
            self.reaches[id(v)] = False  # (the program is acyclic; this only guards the memo)
            self.reaches[id(v)] = self._reaches_uncached(v)
        return self.reaches[id(v)]

    def _reaches_uncached(self, v: TensorValue) -> bool:
        for ins in self.consumers[id(v)]:
            if isinstance(ins, DelegateCall):
                continue
            if _is_convolution(ins.op) and _takes(ins.op, "input", CHANNELS_LAST):
                return True
            tensors = _tensor_args(ins)
            if all(_takes(ins.op, name, CHANNELS_LAST) for name, _ in tensors):
                outs = [
                    t for a, t in zip(ins.op.schema.arguments, ins.args, strict=True) if a.is_out
                ]
                if any(isinstance(t, TensorValue) and self._reaches_convolution(t) for t in outs):
                    return True
        return False

    def _runs_channels_last(self, ins: Instruction) -> bool:
        """Whether a non-convolution runs channels-last: every 4-d tensor argument may be so
        and one input is, all of one shape; or it takes only its input so (a mean over the
        plane) and that input is."""
        tensors = _tensor_args(ins)
        declared = [(n, v) for n, v in tensors if _takes(ins.op, n, CHANNELS_LAST)]
        if not declared or not any(id(v) in self.channels_last for _, v in declared):
            return False
        outs = [v for a, v in zip(ins.op.schema.arguments, ins.args, strict=True) if a.is_out]
        if len(declared) == len(tensors):  # elementwise: all of one shape, out free
            shape = declared[0][1].shape
            return all(v.shape == shape and len(shape) == 4 for _, v in declared) and all(
                self._free(o) for o in outs
            )
        if ins.op.key == "aten::mean.out":  # the input alone, reduced over the plane
            dims = ins.args[1]
            return dims is not None and sorted(d % 4 for d in dims) == [2, 3]
        return False

    def decide(self) -> list[tuple[Instruction, dict[str, tuple[int, ...]]]]:
        """Each channels-last instruction with the dim order it wants of each tensor argument."""
        plans = []
        for ins in self.program.instructions:
            if isinstance(ins, DelegateCall):
                continue
            if _is_convolution(ins.op):
                if not self._conv_runs_channels_last(ins):
                    continue
                want = {"input": CHANNELS_LAST, "weight": TAPS_LAST, "out": CHANNELS_LAST}
                x, groups, out = ins.args[0], ins.args[8], ins.args[-1]
                stem = x.shape[1] <= STEM_CHANNELS and groups == 1
                if id(x) not in self.channels_last and stem:
                    want["input"] = None  # read as it is: no conversion
                if groups == 1 and not stem and out.shape[2] * out.shape[3] < SMALL_PLANE:
                    want["weight"] = None  # as the model has it: the small-plane product
            elif self._runs_channels_last(ins):
                want = {
                    n: CHANNELS_LAST
                    for n, _ in _tensor_args(ins)
                    if _takes(ins.op, n, CHANNELS_LAST)
                }
            else:
                continue
            for a, v in zip(ins.op.schema.arguments, ins.args, strict=True):
                if a.is_out and a.name in want:
                    self.channels_last.add(id(v))
                    v.dim_order = CHANNELS_LAST
            plans.append((ins, want))
        return plans

    def convert(self, plans) -> int:
        """Gives every argument the dim order its instruction takes, converting where it has
        the other one; returns the conversions added."""
        wanted: dict[int, dict[str, tuple[int, ...]]] = {id(ins): want for ins, want in plans}
        converted: dict[tuple[int, tuple[int, ...] | None], TensorValue] = {}
        after: dict[int, list[Instruction]] = defaultdict(list)  # producer id -> conversions
        before_all: list[Instruction] = []

        def as_order(v: TensorValue, order: tuple[int, ...] | None, producer) -> TensorValue:
            if v.dim_order == order:
                return v
            key = (id(v), order)
            if key not in converted:
                new = TensorValue(
                    f"{v.name}_{'channels_last' if order else 'contiguous'}",
                    v.shape,
                    v.dtype,
                    dim_order=order,
                )
                self.program.values.append(new)
                call = Instruction(
                    self.convert_op,
                    [v, False, list(order or range(4)), new],
                    [new],
                    source=f"dim order of {v.name}",
                )
                (after[id(producer)] if producer is not None else before_all).append(call)
                converted[key] = new
            return converted[key]

        producer: dict[int, Instruction | DelegateCall] = {}
        for ins in self.program.instructions:
            for v in ins.returns:
                producer[id(v)] = ins
        for ins in self.program.instructions:
            if isinstance(ins, DelegateCall):
                ins.args = [
                    as_order(v, None, producer.get(id(v))) if v.dim_order else v for v in ins.args
                ]
                continue
            want = wanted.get(id(ins), {})
            for i, a in enumerate(ins.op.schema.arguments):
                v = ins.args[i]
                if a.is_out or not isinstance(v, TensorValue):
                    if isinstance(v, list):  # tensor lists: contiguous
                        ins.args[i] = [
                            as_order(t, None, producer.get(id(t)))
                            if isinstance(t, TensorValue) and t.dim_order
                            else t
                            for t in v
                        ]
                    continue
                order = want.get(a.name)
                if a.name == "weight" and order == TAPS_LAST:
                    if len(self.consumers[id(v)]) > 1:  # shared: a copy of its own
                        v = TensorValue(f"{v.name}_taps_last", v.shape, v.dtype, data=v.data)
                        self.program.values.append(v)
                        ins.args[i] = v
                    v.dim_order = TAPS_LAST
                elif v.dim_order != order:
                    ins.args[i] = as_order(v, order, producer.get(id(v)))
        # Views and graph outputs read contiguous tensors.
        for v in self.program.values:
            if v.alias_of is not None and v.alias_of.dim_order:
                v.alias_of = as_order(v.alias_of, None, producer.get(id(v.alias_of)))
        for i, v in enumerate(self.program.outputs):
            if v.dim_order:
                new = as_order(v, None, producer.get(id(v)))
                v.is_output, new.is_output = False, True
                self.program.outputs[i] = new
        order: list[Instruction | DelegateCall] = list(before_all)
        for ins in self.program.instructions:
            order.append(ins)
            order.extend(after.get(id(ins), ()))
        added = len(order) - len(self.program.instructions)
        self.program.instructions = order
        return added


def to_channels_last(program: Program, ops: dict[str, OpDef]) -> tuple[int, int]:
    """Rewrites ``program`` in place; returns (instructions run channels-last, conversions)."""
    p = _Pass(program, ops)
    plans = p.decide()
    if not plans:
        return 0, 0
    return len(plans), p.convert(plans)
