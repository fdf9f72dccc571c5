"""The `out_variant` stage: every op becomes its ``.out`` form, schemas from ``ops_yaml/``.

The FX graph becomes the program IR: each call binds its arguments to the ops_yaml schema
(defaults filled in) and gets fresh output tensors; views that move no data become aliases.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from .. import passes
from ..errors import EtbuildError
from ..graph import Graph, source_of
from ..ir import DelegateCall, Instruction, Program, SymValue, TensorValue
from ..layout import to_channels_last
from ..ops import load_ops
from ..partition import DelegatedPartition
from ..runner import Context
from .lower import required_kernel


def upper_bound(size: int | torch.SymInt, what: str) -> int:
    """The largest value a (possibly symbolic) size can take."""
    if isinstance(size, int):
        return size
    node = size.node
    bound = node.shape_env.bound_sympy(node.expr).upper
    if not bound.is_finite:
        raise EtbuildError(
            f"{what} has a dynamic size {node.expr} with no upper bound; give every dynamic "
            "dim a max in model.dynamic_dims"
        )
    return int(bound)


def tensor_value(name: str, val: torch.Tensor) -> TensorValue:
    shape = tuple(upper_bound(s, name) for s in val.shape)
    dynamic = any(not isinstance(s, int) for s in val.shape)
    return TensorValue(
        name=name,
        shape=shape,
        dtype=val.dtype,
        dynamic=dynamic,
        sym_shape=tuple(str(s) for s in val.shape),
    )


def _bind(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in.

    A view binds against its copy op's schema (same arguments, e.g. view -> view_copy).
    """
    schema = passes.VIEW_TO_COPY.get(node.target, node.target)._schema
    bound: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif not arg.kwarg_only and i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


class _ProgramBuilder:
    """Walks the lowered FX graph once, turning each node into program values/instructions."""

    def __init__(self) -> None:
        self.ops = load_ops()
        self.env: dict[fx.Node, Any] = {}
        self.values: list[TensorValue] = []
        self.inputs: list[TensorValue] = []
        self.outputs: list[TensorValue] = []
        self.instructions: list[Instruction | DelegateCall] = []

    def value(self, tv: TensorValue) -> TensorValue:
        self.values.append(tv)
        return tv

    def lookup(self, a: Any) -> Any:
        return fx.node.map_aggregate(a, lambda x: self.env[x] if isinstance(x, fx.Node) else x)

    def placeholder(self, g: Graph, node: fx.Node) -> TensorValue:
        if g.is_const(node):
            data = g.const(node)
            return self.value(TensorValue(node.name, tuple(data.shape), data.dtype, data=data))
        tv = self.value(tensor_value(node.name, node.meta["val"]))
        tv.is_input = True
        self.inputs.append(tv)
        return tv

    def output(self, node: fx.Node) -> None:
        self.outputs = [self.lookup(o) for o in pytree.tree_leaves(node.args[0])]
        for o in self.outputs:
            if not isinstance(o, TensorValue):
                raise EtbuildError(
                    f"model output {o!r} is not a tensor; programs return tensors only"
                )
            o.is_output = True

    def call(self, node: fx.Node) -> Any:
        if node.target is operator.getitem:
            return self.env[node.args[0]][node.args[1]]
        if isinstance(node.target, DelegatedPartition):
            return self.delegate_call(node)
        key = required_kernel(node)
        if key == "":
            return self.view(node)
        op = self.ops[key]
        if (
            isinstance(node.target, torch._ops.OpOverload)
            and node.target._schema.name != "aten::sym_size"
        ):
            bound = _bind(node)
        else:  # symbolic-size ops: positional
            bound = {a.name: v for a, v in zip(op.schema.arguments, node.args, strict=False)}
        args: list[Any] = []
        returns: list[Any] = []
        val = node.meta.get("val")
        outs = iter(val if isinstance(val, (list, tuple)) else [val])
        for arg in op.schema.arguments:
            if arg.is_out:
                name = f"{node.name}_{arg.name}" if len(op.schema.returns) > 1 else node.name
                tv = self.value(tensor_value(name, next(outs)))
                args.append(tv)
                returns.append(tv)
            elif arg.name in bound:
                args.append(self.lookup(bound[arg.name]))
            elif arg.has_default_value():
                args.append(arg.default_value)
            else:
                raise EtbuildError(
                    f"ops_yaml schema of {key} has argument {arg.name!r} that {node.target} "
                    "does not provide; fix the schema in ops_yaml/"
                )
        if not returns:  # symbolic-size op: one Int result
            returns.append(SymValue(node.name))
        self.instructions.append(Instruction(op, args, returns, source=source_of(node)))
        return returns[0] if len(returns) == 1 else tuple(returns)

    def delegate_call(self, node: fx.Node) -> tuple[TensorValue, ...]:
        """A delegated partition: its inputs, and fresh tensors for its outputs."""
        args = [self.lookup(a) for a in node.args]
        returns = [
            self.value(tensor_value(f"{node.name}_out{i}", val))
            for i, val in enumerate(node.meta["val"])
        ]
        delegate = node.target.delegate
        self.instructions.append(DelegateCall(delegate, args, returns, source=source_of(node)))
        return tuple(returns)

    def view(self, node: fx.Node) -> TensorValue:
        """A view that moves no data: it shares its input's storage (constants: its data)."""
        src = self.env[node.args[0]]
        val = node.meta["val"]
        if src.is_constant:
            data = src.data.reshape(val.shape)
            return self.value(TensorValue(node.name, tuple(val.shape), val.dtype, data=data))
        tv = self.value(tensor_value(node.name, val))
        tv.alias_of = src
        return tv


def build_program(g: Graph) -> Program:
    """The program IR of a lowered graph: every op in its ops_yaml ``.out`` form."""
    b = _ProgramBuilder()
    for node in g.fx_graph.nodes:
        if node.op == "placeholder":
            b.env[node] = b.placeholder(g, node)
        elif node.op == "call_function":
            b.env[node] = b.call(node)
        elif node.op == "output":
            b.output(node)
    return Program(
        inputs=b.inputs,
        outputs=b.outputs,
        instructions=b.instructions,
        in_spec=pytree.treespec_dumps(g.in_spec) if g.in_spec is not None else "",
        out_spec=pytree.treespec_dumps(g.out_spec) if g.out_spec is not None else "",
        values=b.values,
    )


def run(ctx: Context) -> None:
    program = build_program(ctx.artifacts["graph"])
    summary = {}
    if ctx.cfg.pipeline.lower.channels_last:
        ran, converted = to_channels_last(program, load_ops())
        summary = {"channels_last_calls": ran, "dim_order_conversions": converted}
    ctx.artifacts["program"] = program
    aliases = sum(1 for v in program.values if v.alias_of is not None)
    ctx.summarize(instructions=len(program.instructions), views_aliased=aliases, **summary)
