"""The `reference` stage: the example inputs and the eager model's outputs -> reference.pt."""

from __future__ import annotations

import io

import torch
from torch.utils import _pytree as pytree

from ..runner import Context


def run(ctx: Context) -> None:
    module = ctx.artifacts["module"]
    inputs = ctx.artifacts["example_inputs"]
    with torch.no_grad():
        outputs = [o.detach().clone() for o in pytree.tree_leaves(module(*inputs))]
    ctx.artifacts["reference_outputs"] = outputs
    buf = io.BytesIO()
    torch.save({"inputs": [t.clone() for t in inputs], "outputs": outputs}, buf)
    ctx.write("reference.pt", buf.getvalue())
    stds = [float(o.float().std()) if o.numel() > 1 else 0.0 for o in outputs]
    ctx.summarize(outputs=len(outputs), output_std=round(min(stds), 4) if stds else 0)
