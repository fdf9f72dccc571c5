"""The `export` stage: torch.export (non-strict), dynamic dims from the config."""

from __future__ import annotations

import torch

from ..errors import EtbuildError
from ..runner import Context


def dynamic_shapes_for(mcfg, inputs: tuple[torch.Tensor, ...]) -> tuple | None:
    """torch.export's dynamic_shapes: one {dim: Dim} dict per input, from model.dynamic_dims."""
    if not mcfg.dynamic_dims:
        return None
    names = [s.name for s in mcfg.inputs]
    shapes: list[dict] = [{} for _ in names]
    for d in mcfg.dynamic_dims:
        if d.input not in names:
            raise EtbuildError(
                f"model.dynamic_dims[{d.name}].input={d.input!r} is not an input; "
                f"inputs are: {', '.join(names)}"
            )
        i = names.index(d.input)
        rank = inputs[i].dim()
        if not -rank <= d.dim < rank:
            raise EtbuildError(
                f"model.dynamic_dims[{d.name}].dim={d.dim} is out of range for input "
                f"{d.input!r} of rank {rank}"
            )
        example = inputs[i].shape[d.dim]
        if not d.min <= example <= d.max:
            raise EtbuildError(
                f"model.dynamic_dims[{d.name}]: the example size {example} of {d.input!r} dim "
                f"{d.dim} is outside [min={d.min}, max={d.max}]; widen the range or change "
                "the input shape"
            )
        shapes[i][d.dim % rank] = torch.export.Dim(d.name, min=d.min, max=d.max)
    return tuple(shapes)


def run(ctx: Context) -> None:
    mcfg = ctx.cfg.model
    module = ctx.artifacts["module"]
    inputs = ctx.artifacts["example_inputs"]
    dynamic = dynamic_shapes_for(mcfg, inputs)
    try:
        ep = torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)
    except Exception as exc:  # torch.export raises many error types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EtbuildError(
            f"torch.export could not trace model {mcfg.name!r}: {first}\n"
            "The model must be exportable with torch.export.export(strict=False); see "
            "the torch.export documentation on data-dependent control flow and dynamic shapes."
        ) from exc
    ctx.artifacts["exported"] = ep
    nodes = sum(1 for n in ep.graph.nodes if n.op == "call_function")
    ctx.summarize(nodes=nodes, dynamic_dims=len(mcfg.dynamic_dims))
