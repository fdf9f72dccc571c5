"""Partitioning: which nodes a delegate backend runs, and their replacement by delegate calls.

A backend plugs in as a ``_target_`` (``partitioner._target_``) that returns an object of the
small ``Backend`` protocol below: a per-node capability check that gives the reason when it
refuses, and a preprocess that turns one partition into the blob the backend's C++ half runs.
Everything else is shared: the config's filters (op kinds, module patterns, dtypes, minimum
partition size), cutting the accepted nodes into partitions that keep the graph acyclic
(torch.fx's capability-based partitioner), and replacing each partition by one node whose
target is a ``DelegatedPartition``. The out-variant stage turns that node into a delegate call
instruction, and emit writes the blob into a segment of the program.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.utils.flop_counter import flop_registry

from . import passes
from .errors import EtbuildError
from .graph import Graph, origin_of, source_of
from .ir import Delegate


@dataclass
class Partition:
    """One partition handed to a backend's preprocess.

    ``graph`` is standalone: its placeholders are the delegate call's inputs in order, plus
    the constants it reads (bound in ``graph.constants``); its output node returns a tuple of
    the delegate call's outputs in order."""

    graph: Graph


class Backend(Protocol):
    """What a partitioner's ``_target_`` returns."""

    #: The BackendDelegate id programs name it by (ExecuTorch's ids where the format is theirs).
    id: str
    #: The folder of the backend's C++ half: a CMakeLists.txt that calls etb_add_backend().
    runtime_dir: str
    #: Optional: CMake arguments for the runtime build that links the backend (where its
    #: library is, say); they are part of the build's cache key.
    cmake_args: list[str]

    def check(self, node: fx.Node, graph: Graph) -> str | None:
        """None when the backend runs ``node`` (of ``graph``, which knows its constants);
        else why not, in a few words."""

    def preprocess(self, partition: Partition) -> Delegate:
        """The backend's blob (and compile specs) for one partition."""


@dataclass(eq=False)
class DelegatedPartition:
    """The target of the node that replaces a partition: calling it runs the partition's graph
    in torch (the lowered graph's reference execution); the program gets ``delegate``."""

    delegate: Delegate
    graph: Graph
    ops: dict[str, int]
    flops: int
    __name__: ClassVar[str] = "delegate"  # what FX names the node after

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.graph.execute(*inputs))


@dataclass
class PartitionReport:
    """What the partition stage did, for the report."""

    backend: str
    partitions: list[dict[str, Any]] = field(default_factory=list)  # ops, flops, share
    refused: list[dict[str, Any]] = field(default_factory=list)  # op, reason, calls, where
    total_flops: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "partitions": self.partitions,
            "refused": self.refused,
            "total_flops": self.total_flops,
        }


def load_backend(pcfg: Any) -> Backend:
    """Instantiates ``partitioner._target_`` with ``partitioner.args``; checks the protocol."""
    target = pcfg._target_
    if not target:
        raise EtbuildError(
            f"partitioner {pcfg.name!r} has no _target_: set partitioner._target_ to the "
            "dotted path of a class or function that returns a backend"
        )
    module_name, _, attr = str(target).rpartition(".")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise EtbuildError(
            f"partitioner._target_={target!r} cannot be imported ({exc}); give the dotted path "
            "of a class or function that returns a backend (see pipeline/partition.py)"
        ) from None
    args = dict(pcfg.args or {})
    try:
        backend = factory(**args)
    except TypeError as exc:
        raise EtbuildError(
            f"partitioner {pcfg.name!r}: {target}(**partitioner.args) failed: {exc}; "
            f"it takes {inspect.signature(factory)}"
        ) from None
    missing = [a for a in ("id", "runtime_dir", "check", "preprocess") if not hasattr(backend, a)]
    if missing:
        raise EtbuildError(
            f"partitioner {pcfg.name!r}: {target} returned {type(backend).__name__}, which lacks "
            f"{', '.join(missing)} (a backend has id, runtime_dir, check() and preprocess())"
        )
    return backend


def op_kind(node: fx.Node) -> str:
    """The op's name without namespace and overload: "convolution", "add", "sdpa"."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target))


def module_path(node: fx.Node) -> str:
    """The innermost module's path ("features.3.conv"), "" at the top level."""
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def _dtypes(node: fx.Node) -> set[str]:
    vals = [node.meta.get("val")] + [
        a.meta.get("val") for a in node.all_input_nodes if isinstance(a, fx.Node)
    ]
    flat: list[Any] = []
    for v in vals:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    return {str(v.dtype).removeprefix("torch.") for v in flat if isinstance(v, torch.Tensor)}


def node_flops(node: fx.Node) -> int:
    """Floating-point (or integer) operations of one node: torch's formula where it has one
    (convolution, matrix products, attention), else one per output element; 0 for views. A
    dynamic dim counts at its example size."""
    return _concrete(_symbolic_flops(node))


def _concrete(n: int | torch.SymInt) -> int:
    """An int for a count that may depend on a dynamic dim (its example size)."""
    if isinstance(n, torch.SymInt):
        hint = n.node.hint
        return int(hint) if hint is not None else 0
    return int(n)


def _symbolic_flops(node: fx.Node) -> int | torch.SymInt:
    if (
        node.target is operator.getitem
        or not isinstance(node.target, torch._ops.OpOverload)
        or passes.is_pure_view(node)
    ):
        return 0
    formula = flop_registry.get(node.target.overloadpacket)
    if formula is not None:
        args, kwargs = fx.node.map_aggregate(
            (node.args, node.kwargs), lambda a: a.meta.get("val") if isinstance(a, fx.Node) else a
        )
        try:
            return formula(*args, **kwargs, out_val=node.meta.get("val"))
        except Exception:  # a formula that does not fit this overload: count elements
            pass
    val = node.meta.get("val")
    macs = _int8_macs(node)
    if macs is not None:
        return 2 * macs
    return val.numel() if isinstance(val, torch.Tensor) else 0


def _int8_macs(node: fx.Node) -> int | None:
    """Multiply-adds of etbuild's int8 convolution and linear (torch has no formula for them):
    one per output element and weight element of its group's input channels / features."""
    name = str(node.target)
    if not name.startswith("etb_quantized.") or name.split(".")[1] not in ("conv2d", "linear"):
        return None
    out, w = node.meta.get("val"), node.args[3].meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(w, torch.Tensor):
        return None
    per_output = w[0].numel()  # conv: in/groups x kh x kw; linear: in features
    return int(out.numel() * per_output)


@dataclass
class Rules:
    """The config's filters on top of the backend's own check."""

    ops: list[str]
    include_modules: list[str]
    exclude_modules: list[str]
    dtypes: list[str]
    min_partition_size: int

    def refusal(self, node: fx.Node) -> str | None:
        if self.ops and op_kind(node) not in self.ops:
            return f"{op_kind(node)} is not in partitioner.ops"
        path = module_path(node)
        if self.include_modules and not any(fnmatch.fnmatch(path, p) for p in self.include_modules):
            return f"module '{path}' matches no partitioner.include_modules pattern"
        for p in self.exclude_modules:
            if fnmatch.fnmatch(path, p):
                return f"module '{path}' is excluded by partitioner.exclude_modules '{p}'"
        if self.dtypes:
            extra = sorted(_dtypes(node) - set(self.dtypes))
            if extra:
                return f"dtype {', '.join(extra)} is not in partitioner.dtypes"
        return None


class _Support(OperatorSupportBase):
    """The backend's check and the config's rules, remembering each refusal's reason."""

    def __init__(self, backend: Backend, rules: Rules, graph: Graph) -> None:
        super().__init__()
        self.backend, self.rules, self.graph = backend, rules, graph
        self.reasons: dict[fx.Node, str] = {}

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:  # goes with its producer
            return self.is_node_supported(submodules, node.args[0])
        reason = self.rules.refusal(node) or self.backend.check(node, self.graph)
        if reason:
            self.reasons[node] = reason
        return reason is None


def partition_graph(g: Graph, backend: Backend, rules: Rules) -> PartitionReport:
    """Replaces every partition ``backend`` takes by one delegate node; returns the report."""
    report = PartitionReport(backend=backend.id)
    compute = [n for n in g.call_nodes() if n.target is not operator.getitem]
    report.total_flops = sum(node_flops(n) for n in compute)
    gm = fx.GraphModule(torch.nn.Module(), g.fx_graph)
    support = _Support(backend, rules, g)
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    chosen = []
    for p in partitioner.propose_partitions():
        nodes = [n for n in p.nodes if n.target is not operator.getitem]
        if len(nodes) < rules.min_partition_size:
            for n in nodes:
                support.reasons[n] = (
                    f"its partition has {len(nodes)} op(s), fewer than "
                    f"partitioner.min_partition_size={rules.min_partition_size}"
                )
            continue
        chosen.append(dict.fromkeys(p.nodes))
    _report_refusals(report, support.reasons)
    if not chosen:
        return report
    # Partitions in graph order, so that delegate indices follow the program's order.
    order = {n: i for i, n in enumerate(g.fx_graph.nodes)}
    chosen.sort(key=lambda p: min(order[n] for n in p))
    infos = [
        (Counter(op_kind(n) for n in p if n.target is not operator.getitem),
         sum(node_flops(n) for n in p))
        for p in chosen
    ]  # fmt: skip
    fuse_by_partitions(gm, chosen, prefix="etb_partition_", always_return_tuple=True)
    g.fx_graph = gm.graph
    for node in list(g.fx_graph.nodes):
        if node.op != "call_module":
            continue
        index = int(node.target.removeprefix("etb_partition_"))
        ops, flops = infos[index]
        target = _delegate(g, backend, gm.get_submodule(node.target), dict(ops), flops)
        with g.fx_graph.inserting_before(node):
            call = g.fx_graph.call_function(
                target, tuple(a for a in node.args if not g.is_const(a))
            )
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        g.fx_graph.erase_node(node)
        report.partitions.append(
            {
                "backend": backend.id,
                "ops": dict(sorted(ops.items())),
                "flops": flops,
                "share": flops / report.total_flops if report.total_flops else 0.0,
            }
        )
    g.drop_dead()
    return report


def _delegate(
    g: Graph, backend: Backend, sub: fx.GraphModule, ops: dict[str, int], flops: int
) -> DelegatedPartition:
    """Preprocesses one fused partition; its constant inputs become the partition's own."""
    constants = {
        n.name: g.constants[n.name]
        for n in sub.graph.nodes
        if n.op == "placeholder" and n.name in g.constants
    }
    inputs = [n.name for n in sub.graph.nodes if n.op == "placeholder" and n.name not in constants]
    part = Graph(fx_graph=sub.graph, constants=constants, input_names=inputs)
    delegate = backend.preprocess(Partition(graph=part))
    if not isinstance(delegate, Delegate):
        raise EtbuildError(
            f"backend {backend.id}: preprocess returned {type(delegate).__name__}, not a "
            "Delegate (etbuild.pipeline.ir.Delegate)"
        )
    return DelegatedPartition(delegate=delegate, graph=part, ops=ops, flops=flops)


def _report_refusals(report: PartitionReport, reasons: dict[fx.Node, str]) -> None:
    grouped: dict[tuple[str, str], list[fx.Node]] = {}
    for node, reason in reasons.items():
        grouped.setdefault((op_kind(node), reason), []).append(node)
    for (op, reason), nodes in sorted(grouped.items()):
        where = sorted({origin_of(n) or source_of(n) for n in nodes})
        report.refused.append({"op": op, "reason": reason, "calls": len(nodes), "where": where})
