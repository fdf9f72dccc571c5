"""The pipeline's stages, in the order they run (DESIGN.md's data flow)."""

from ..runner import Stage
from . import (
    build,
    emit,
    export,
    lower,
    model,
    out_variant,
    plan,
    quantize,
    reference,
    report,
    select,
    verify,
)

STAGES: list[Stage] = [
    Stage("model", model.run),
    Stage("export", export.run),
    Stage("quantize", quantize.run),
    Stage("lower", lower.run),
    Stage("out_variant", out_variant.run),
    Stage("plan", plan.run),
    Stage("emit", emit.run),
    Stage("select", select.run),
    Stage("build", build.run),
    Stage("reference", reference.run),
    Stage("verify", verify.run),
    Stage("report", report.run),
]
