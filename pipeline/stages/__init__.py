"""The pipeline's stages, in the order they run (DESIGN.md's data flow).

The cacheable stages form a prefix that depends only on the model, its data and the config
slices they read, never on the target: pipeline/stage_cache.py stores their results.
"""

from ..runner import Stage
from . import (
    build,
    emit,
    export,
    lower,
    model,
    out_variant,
    partition,
    plan,
    quantize,
    reference,
    report,
    select,
    verify,
)

STAGES: list[Stage] = [
    Stage("model", model.run, cacheable=True),
    Stage("export", export.run, cacheable=True),
    Stage("quantize", quantize.run, cacheable=True),
    Stage("lower", lower.run, cacheable=True, passes_on=("fp32_fallbacks",)),
    Stage("partition", partition.run, cacheable=True, passes_on=("partitions",)),
    Stage("out_variant", out_variant.run, cacheable=True),
    Stage("plan", plan.run, cacheable=True),
    Stage("emit", emit.run, cacheable=True, passes_on=("emit_facts", "program_inputs")),
    Stage("reference", reference.run, cacheable=True),
    Stage("select", select.run),
    Stage("build", build.run),
    Stage("verify", verify.run),
    Stage("report", report.run),
]
