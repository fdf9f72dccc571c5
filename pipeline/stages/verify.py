"""The `verify` stage: run model.pte on the etbuild runtime and compare with eager.

fp32 programs must match the eager outputs within ``pipeline.verify.tolerance`` x max|eager|.
Quantized programs are measured instead: SQNR (dB) against the fp32 eager model and top-1
agreement over the reference input plus ``pipeline.verify.eval_inputs`` more random inputs;
``quant.min_sqnr_db`` fails the build below it.
"""

from __future__ import annotations

import math

import torch
from torch.utils import _pytree as pytree

from ..config import QuantScheme
from ..errors import EtbuildError
from ..runner import Context, sha256_file
from .model import make_inputs


def load_runtime():
    try:
        from etbuild import runtime
    except ImportError as exc:
        raise EtbuildError(
            "the etbuild runtime (etbuild.runtime) is not built into this installation; "
            "reinstall etbuild with pip so its C++ build runs, or set pipeline.verify.enabled=false"
        ) from exc
    return runtime


def run_program(program, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    try:
        return program.run([t.contiguous() for t in inputs])
    except RuntimeError as exc:
        raise EtbuildError(f"the runtime could not run model.pte: {exc}") from None


def sqnr_db(signal: torch.Tensor, test: torch.Tensor) -> float:
    noise = (signal.double() - test.double()).pow(2).mean().item()
    power = signal.double().pow(2).mean().item()
    return math.inf if noise == 0 else 10 * math.log10(power / noise)


def _check_fp32(outputs, expected, tolerance: float) -> dict:
    worst = 0.0
    for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
        if got.shape != want.shape or got.dtype != want.dtype:
            raise EtbuildError(
                f"verification failed: output {i} is {got.dtype} {list(got.shape)}, eager gives "
                f"{want.dtype} {list(want.shape)}"
            )
        scale = want.abs().max().item() if want.numel() else 0.0
        err = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
        rel = err / scale if scale else err
        worst = max(worst, rel)
        if rel > tolerance:
            raise EtbuildError(
                f"verification failed: output {i} differs from the eager model by max abs error "
                f"{err:.3g} = {rel:.3g} x max|eager| ({scale:.3g}), above "
                f"pipeline.verify.tolerance={tolerance:g}"
            )
    return {"max_rel_error": float(f"{worst:.3g}")}


def _measure_quantized(ctx: Context, program, outputs, expected) -> dict:
    mcfg, vcfg = ctx.cfg.model, ctx.cfg.pipeline.verify
    module = ctx.artifacts["module"]
    got, want = [outputs[0]], [expected[0]]
    for i in range(vcfg.eval_inputs):
        inputs = make_inputs(mcfg.inputs, mcfg.seed + 9000 + i)
        got.append(run_program(program, list(inputs))[0])
        with torch.no_grad():
            want.append(pytree.tree_leaves(module(*inputs))[0])
    got_all, want_all = (
        torch.cat([g.flatten(0, -2) for g in got]),
        torch.cat([w.flatten(0, -2) for w in want]),
    )
    facts = {
        "sqnr_db": round(sqnr_db(want_all, got_all), 2),
        "top1_agreement": round(
            (got_all.argmax(-1) == want_all.argmax(-1)).float().mean().item(), 4
        ),
        "eval_samples": int(got_all.shape[0]),
    }
    converted = ctx.artifacts.get("quantized_module")
    if converted is not None:
        inputs = ctx.artifacts["example_inputs"]
        with torch.no_grad():
            ref = pytree.tree_leaves(converted(*inputs))[0]
        facts["max_abs_diff_vs_converted"] = float(f"{(outputs[0] - ref).abs().max().item():.3g}")
    floor = ctx.cfg.quant.min_sqnr_db
    if floor is not None and facts["sqnr_db"] < floor:
        raise EtbuildError(
            f"the quantized program's SQNR against fp32 is {facts['sqnr_db']} dB, below "
            f"quant.min_sqnr_db={floor}; keep sensitive layers in fp32 (quant.keep_fp32), "
            "calibrate on more or better data, or try quant=qat"
        )
    return facts


def run(ctx: Context) -> None:
    vcfg = ctx.cfg.pipeline.verify
    if not vcfg.enabled:
        ctx.summarize(skipped="pipeline.verify.enabled=false")
        return
    runtime = load_runtime()
    path = ctx.run_dir / "model.pte"
    ctx.note_read("model.pte", sha256_file(path))
    try:
        program = runtime.load(str(path))
    except RuntimeError as exc:
        raise EtbuildError(f"the runtime could not load model.pte: {exc}") from None
    inputs = list(ctx.artifacts["example_inputs"])
    expected = ctx.artifacts["reference_outputs"]
    outputs = run_program(program, inputs)
    if len(outputs) != len(expected):
        raise EtbuildError(
            f"verification failed: the program returns {len(outputs)} outputs, eager "
            f"{len(expected)}"
        )
    if QuantScheme(ctx.cfg.quant.scheme) == QuantScheme.none:
        facts = _check_fp32(outputs, expected, vcfg.tolerance)
    else:
        facts = _measure_quantized(ctx, program, outputs, expected)
    ctx.artifacts["verify"] = facts
    ctx.summarize(**facts)
