"""The `reference` stage: what the eager model says, saved for the verify stage -> reference.pt.

reference.pt holds the example inputs and the fp32 eager outputs. For a quantized program it
also holds ``pipeline.verify.eval_inputs`` more random inputs with their fp32 eager outputs
(for SQNR and top-1 agreement), the torchao-converted model's outputs on the example inputs,
and the lowered graph's reference execution on them (``lowered_outputs``: int8 ops run their
Python specification), which the program's int8 kernels match exactly. The verify stage reads
only this file, so it runs the same whether the stages before it ran or came from the stage
cache.
"""

from __future__ import annotations

import io

import torch
from torch.utils import _pytree as pytree

from ..config import QuantScheme
from ..runner import Context
from .model import make_inputs

# Seeds of the evaluation inputs: model.seed + EVAL_SEED_OFFSET + i.
EVAL_SEED_OFFSET = 9000


def eager_outputs(module: torch.nn.Module, inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        return [o.detach().clone() for o in pytree.tree_leaves(module(*inputs))]


def run(ctx: Context) -> None:
    mcfg = ctx.cfg.model
    module = ctx.artifacts["module"]
    inputs = [t.clone() for t in ctx.artifacts["example_inputs"]]
    outputs = eager_outputs(module, inputs)
    doc: dict = {"inputs": inputs, "outputs": outputs}
    if QuantScheme(ctx.cfg.quant.scheme) != QuantScheme.none:
        evals = [
            list(make_inputs(mcfg.inputs, mcfg.seed + EVAL_SEED_OFFSET + i))
            for i in range(ctx.cfg.pipeline.verify.eval_inputs)
        ]
        doc["eval_inputs"] = evals
        doc["eval_outputs"] = [eager_outputs(module, x) for x in evals]
        converted = ctx.artifacts.get("quantized_module")
        if converted is not None:
            doc["converted_outputs"] = eager_outputs(converted, inputs)
        graph = ctx.artifacts.get("graph")
        if graph is not None:  # the lowered graph's reference execution (its int8 semantics)
            with torch.no_grad():
                doc["lowered_outputs"] = [o.clone() for o in graph.execute(*inputs)]
    buf = io.BytesIO()
    torch.save(doc, buf)
    ctx.write("reference.pt", buf.getvalue())
    stds = [float(o.float().std()) if o.numel() > 1 else 0.0 for o in outputs]
    ctx.summarize(outputs=len(outputs), output_std=round(min(stds), 4) if stds else 0)
