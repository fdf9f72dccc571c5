"""The `lower` stage: core-ATen decompositions, graph passes, and the operator check.

Every op left after the passes must have a kernel in ``ops_yaml/``; the check reports all
missing ops at once, each with the model source lines it came from.
"""

from __future__ import annotations

import operator
from collections import defaultdict

import torch
from torch import fx
from torch.export.graph_signature import InputKind, OutputKind

from .. import attention, passes
from ..config import AttentionLowering
from ..errors import EtbuildError
from ..graph import Graph, origin_of, source_of
from ..ops import kernel_key_for, load_ops, ops_yaml_digest
from ..partition import DelegatedPartition
from ..runner import Context
from ..symints import SYM_OPS


def graph_from_exported(ep: torch.export.ExportedProgram) -> Graph:
    """Bind an exported program's parameters, buffers and constants to its placeholders."""
    constants: dict[str, torch.Tensor] = {}
    inputs: list[str] = []
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            if not isinstance(spec.arg, torch.export.graph_signature.TensorArgument):
                raise EtbuildError(
                    f"model input {name!r} is not a tensor; etbuild programs take tensors only"
                )
            inputs.append(name)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            value = ep.state_dict.get(spec.target)
            if value is None:
                value = ep.constants[spec.target]
            constants[name] = value.detach().contiguous()
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            constants[name] = ep.constants[spec.target].detach().contiguous()
        else:
            raise EtbuildError(
                f"model input {name!r} is a {spec.kind.name}; etbuild supports tensors, "
                "parameters, buffers and constant tensors"
            )
    for spec in ep.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise EtbuildError(
                f"the model mutates {spec.target!r} in forward ({spec.kind.name}); programs "
                "must be free of state updates: compute a new tensor instead"
            )
    dynamic = any(
        not isinstance(s, int)
        for n in ep.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
        for s in n.meta["val"].shape
    )
    return Graph(
        fx_graph=ep.graph,
        constants=constants,
        input_names=inputs,
        in_spec=ep.call_spec.in_spec,
        out_spec=ep.call_spec.out_spec,
        dynamic=dynamic,
    )


def required_kernel(node: torch.fx.Node) -> str | None:
    """The ops_yaml key a node needs, "" when it needs no kernel (a view, a delegate call),
    None when ATen has none."""
    target = node.target
    if isinstance(target, DelegatedPartition):
        return ""
    if target is operator.getitem or passes.is_pure_view(node):
        return ""
    if target in SYM_OPS:
        return SYM_OPS[target]
    if not isinstance(target, torch._ops.OpOverload):
        return None
    return kernel_key_for(passes.VIEW_TO_COPY.get(target, target))


def check_ops(g: Graph) -> dict[str, int]:
    """Raise one error listing every op without a kernel; else return kernel use counts.

    Each missing op is named with where it came from (the torch-level call and module, and
    the user's line) and with its fix: a kernel, or a rewrite when no kernel can exist.
    """
    ops = load_ops()
    used: dict[str, int] = defaultdict(int)
    missing: dict[str, list[fx.Node]] = defaultdict(list)
    fixes: dict[str, str] = {}
    for node in g.call_nodes():
        key = required_kernel(node)
        if key == "":
            continue
        if key is None:
            label = str(node.target)
            fixes[label] = (
                f"rewrite the line: torch has no form of {node.target} that writes into a "
                "given output tensor, which every kernel of the runtime does"
            )
        elif key not in ops:
            label = key
            fixes[label] = (
                "add a kernel (an ops_yaml/ entry and its code in runtime_src/kernels/), "
                "or rewrite the line with operations the runtime has"
            )
        else:
            used[key] += 1
            continue
        missing[label].append(node)
    if missing:
        lines = [
            f"The model uses {len(missing)} operator(s) that the runtime has no kernel for "
            "(ops_yaml/ lists every kernel):"
        ]
        for label in sorted(missing):
            lines.append(f"  {label}")
            places = {(origin_of(n), source_of(n)) for n in missing[label]}
            for origin, src in sorted(places):
                lines.append(f"      {origin + ', ' if origin else ''}at {src}")
            lines.append(f"      fix: {fixes[label]}")
        raise EtbuildError("\n".join(lines))
    return dict(sorted(used.items()))


# Ops that the runtime runs whole and torch's core-ATen table would decompose (padding into
# index arithmetic that needs aten::index.Tensor).
KEPT_WHOLE = (
    torch.ops.aten.reflection_pad1d.default,
    torch.ops.aten.reflection_pad2d.default,
    torch.ops.aten.replication_pad1d.default,
    torch.ops.aten.replication_pad2d.default,
)


def decompositions(fuse_attention: bool) -> dict:
    """The core-ATen decomposition table, less the ops the runtime runs whole: with
    ``fuse_attention``, F.scaled_dot_product_attention stays whole for one etb::sdpa call."""
    table = torch.export.default_decompositions()
    for op in (*KEPT_WHOLE, attention.SDPA) if fuse_attention else KEPT_WHOLE:
        table.pop(op, None)
    return table


def lower_graph(
    ep: torch.export.ExportedProgram, fuse_attention: bool = True
) -> tuple[Graph, dict[str, object]]:
    """Core-ATen decompositions and every graph pass; returns the graph and pass counts.

    ``fuse_attention=False`` keeps torch's decomposition of attention (plain ATen ops, which
    ExecuTorch's runtime runs too) instead of one etb::sdpa call.
    """
    g = graph_from_exported(ep.run_decompositions(decompositions(fuse_attention)))
    before = len(g.call_nodes())
    fused_attention = attention.fuse_attention(g)
    splits = passes.split_into_slices(g)
    noops = passes.drop_noops(g)
    int8_kernels = 0
    if any(getattr(n.target, "namespace", "") == "quantized_decomposed" for n in g.call_nodes()):
        from ..quant.lowering import lower_quantized  # imports torchao: only when quantized

        int8_kernels = lower_quantized(g)
    passes.wrap_scalar_tensor_args(g)
    # Fold constants first so a linear layer's transposed weight is a constant for BN folding.
    folded = passes.fold_constants(g)
    folded_bn, rewritten_bn = passes.fold_batchnorm(g)
    folded += passes.fold_constants(g)
    noops += passes.drop_noops(g)
    g.drop_dead()
    facts = {
        "nodes": f"{before}->{len(g.call_nodes())}",
        "bn_folded": folded_bn + rewritten_bn,
        "const_folded": folded,
        "noops_dropped": noops,
        "int8_kernels": int8_kernels,
        "attention_fused": fused_attention,
        "splits_sliced": splits,
    }
    return g, facts


def run(ctx: Context) -> None:
    fuse = ctx.cfg.pipeline.lower.attention == AttentionLowering.fused
    g, facts = lower_graph(ctx.artifacts["exported"], fuse_attention=fuse)
    ctx.note_read("ops_yaml", ops_yaml_digest())
    if ctx.cfg.partitioner.name == "none":
        ctx.artifacts["op_counts"] = check_ops(g)
    # else the partition stage checks the ops its backend leaves to the runtime's kernels
    ctx.artifacts["graph"] = g
    fallbacks: list[dict] = []
    if facts["int8_kernels"]:
        from ..quant.lowering import fp32_fallbacks

        fallbacks = fp32_fallbacks(g, required_kernel)
        facts["fp32_ops"] = sum(f["calls"] for f in fallbacks)
    ctx.artifacts["fp32_fallbacks"] = fallbacks
    ctx.summarize(**facts)
