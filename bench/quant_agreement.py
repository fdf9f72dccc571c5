"""How far apart int8 outputs are, in output quantization steps, between the etbuild runtime and
the torchao-converted eager model, and between that model and itself evaluated more exactly.

torchao's converted model computes each quantized layer as dequantize -> float32 op ->
quantize; the runtime accumulates int8 products exactly in int32. Where a value lies within
float32 rounding of a quantization tie, the two round differently, and a deep network carries
such one-step flips forward. The third line shows the same effect inside torchao alone: its
converted model with each layer's float ops in float64 (the same arithmetic, rounded less)
against itself in float32.

    python bench/quant_agreement.py [--model mobilenet]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from quant_latency import build
from torch.utils import _pytree as pytree

from etbuild import runtime
from etbuild.pipeline.config import register_configs

# The float ops of a converted graph that accumulate (and so round differently in float64).
_ACCUMULATING = ("conv2d", "convolution", "linear", "addmm", "aten.add", "mean", "adaptive_avg")


class Float64Layers(torch.fx.Interpreter):
    """Runs a converted graph with its accumulating float32 ops computed in float64."""

    def call_function(self, target, args, kwargs):
        if not any(k in str(target) for k in _ACCUMULATING):
            return super().call_function(target, args, kwargs)

        def up(v):
            return v.double() if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v

        out = target(*pytree.tree_map(up, args), **pytree.tree_map(up, kwargs))
        return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def output_scale(module: torch.fx.GraphModule) -> float:
    """The scale of the last quantize op: one step of the program's output."""
    last = [
        n
        for n in module.graph.nodes
        if n.op == "call_function"
        and "quantize_per_tensor" in str(n.target)
        and "dequantize" not in str(n.target)
    ][-1]
    scale = last.args[1]
    return float(getattr(module, scale.target) if isinstance(scale, torch.fx.Node) else scale)


def first(out) -> torch.Tensor:
    return pytree.tree_leaves(out)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenet")
    opts = p.parse_args()
    register_configs()
    with tempfile.TemporaryDirectory(prefix="etb_qagree_") as tmp:
        run_dir = Path(tmp) / "int8"
        ctx, _ = build([f"model={opts.model}", "+quant=ptq"], run_dir)
        converted = ctx.artifacts["quantized_module"]
        inputs = list(ctx.artifacts["example_inputs"])
        ours = runtime.load(str(run_dir / "model.pte")).run(inputs)[0]
    step = output_scale(converted)
    with torch.no_grad():
        fp32 = first(converted(*inputs))
        fp64 = first(Float64Layers(converted).run(*inputs))
    print(f"{opts.model}: output step {step:.4g}; differences in output steps, one input")
    for label, a, b in (
        ("runtime vs torchao (float32 layers)", ours, fp32),
        ("runtime vs torchao (float64 layers)", ours, fp64),
        ("torchao float32 layers vs float64 layers", fp32, fp64),
    ):
        d = (a - b).abs() / step
        print(
            f"  {label:<42} max {d.max().item():5.1f}   "
            f"elements beyond one step {(d > 1.01).float().mean().item():6.1%}"
        )


if __name__ == "__main__":
    main()
