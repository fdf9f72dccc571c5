"""The `export` stage: torch.export (non-strict), dynamic dims from the config."""

from __future__ import annotations

import re

import torch

from ..config import dynamic_dim_problem
from ..errors import EtbuildError
from ..runner import Context


def dynamic_shapes_for(mcfg, inputs: tuple[torch.Tensor, ...]) -> tuple | None:
    """torch.export's dynamic_shapes: one {dim: Dim} dict per input, from model.dynamic_dims."""
    if not mcfg.dynamic_dims:
        return None
    names = [s.name for s in mcfg.inputs]
    shapes: list[dict] = [{} for _ in names]
    for d in mcfg.dynamic_dims:
        i = names.index(d.input) if d.input in names else -1
        problem = dynamic_dim_problem(d, names, list(inputs[i].shape) if i >= 0 else [])
        if problem:
            raise EtbuildError(problem)
        rank = inputs[i].dim()
        shapes[i][d.dim % rank] = torch.export.Dim(d.name, min=d.min, max=d.max)
    return tuple(shapes)


def tracing_inputs(mcfg, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``inputs`` with every dynamic dim of example size 0 or 1 grown to a size of at least 2.

    torch.export treats sizes 0 and 1 as constants, so a dynamic batch traced at its usual
    example size of 1 would be fixed to 1. Tracing at the smallest size >= 2 inside the
    declared range keeps it symbolic; the example inputs themselves (reference, verify) keep
    their configured sizes.
    """
    names = [s.name for s in mcfg.inputs]
    out = list(inputs)
    for d in mcfg.dynamic_dims:
        i = names.index(d.input)
        example = out[i].shape[d.dim]
        if example >= 2:
            continue
        shape = list(out[i].shape)
        shape[d.dim] = max(2, d.min)  # <= max: dynamic_shapes_for checked max >= 2
        x = out[i]
        # Repeat the example's values; an empty example has none, so use zeros.
        out[i] = x.expand(shape).contiguous() if example == 1 else x.new_zeros(shape)
    return tuple(out)


def export_program(module: torch.nn.Module, mcfg, inputs: tuple[torch.Tensor, ...]):
    """torch.export.export of ``module`` with the config's dynamic dims, or a clear error."""
    dynamic = dynamic_shapes_for(mcfg, inputs)
    traced = tracing_inputs(mcfg, inputs) if dynamic else inputs
    try:
        return torch.export.export(module, traced, dynamic_shapes=dynamic, strict=False)
    except Exception as exc:  # torch.export raises many error types
        text = str(exc).strip()
        fixed = re.search(r"Constraints violated \(([^)]*)\)", text)
        if fixed:
            dims = [d for d in mcfg.dynamic_dims if d.name in fixed.group(1).split(", ")]
            where = "; ".join(f"{d.name} = input {d.input!r} dim {d.dim}" for d in dims)
            value = re.search(r"specialized it to be a constant \((\d+)\)", text)
            to = f" to {value.group(1)}" if value else ""
            raise EtbuildError(
                f"model {mcfg.name!r}: the model's code fixes a dim declared dynamic{to} "
                f"({where or fixed.group(1)}), so it cannot vary at run time. Remove the entry "
                "from model.dynamic_dims to build for the example size, or write the model "
                "without hard-coded sizes for that dim (e.g. x.flatten(1) rather than "
                "x.view(N, -1))."
            ) from exc
        first = text.splitlines()[0] if text else type(exc).__name__
        raise EtbuildError(
            f"torch.export could not trace model {mcfg.name!r}: {first}\n"
            "The model must be exportable with torch.export.export(strict=False); see "
            "the torch.export documentation on data-dependent control flow and dynamic shapes."
        ) from exc


def run(ctx: Context) -> None:
    mcfg = ctx.cfg.model
    ep = export_program(ctx.artifacts["module"], mcfg, ctx.artifacts["example_inputs"])
    ctx.artifacts["exported"] = ep
    nodes = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    ctx.summarize(nodes=nodes, dynamic_dims=len(mcfg.dynamic_dims))
