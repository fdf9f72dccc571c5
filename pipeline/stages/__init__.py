"""The pipeline's stages, in the order they run (docs/architecture.md's data flow), each with its
contract: the in-memory artifacts it reads and writes, the config it depends on and the input
digests it reads (pipeline/runner.py's ``Stage``; the runner enforces the artifacts).

The cacheable stages (model .. reference) depend only on the model, its data and the config
slices they declare, never on the target: pipeline/stage_cache.py keys and stores each one on
its own.
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
    Stage(
        "model",
        model.run,
        writes=("module", "example_inputs"),
        config=("model",),
        inputs=("model_source", "checkpoint"),
        cacheable=True,
        rerun=("module", "example_inputs"),  # instantiating the model again is cheap
    ),
    Stage(
        "export",
        export.run,
        reads=("module", "example_inputs"),
        writes=("exported",),
        config=("model",),
        cacheable=True,
    ),
    Stage(
        "quantize",
        quantize.run,
        reads=("module", "example_inputs", "exported"),
        writes=("quantized_module", "exported"),
        config=("quant", "model"),
        inputs=("calibration_source", "calibration_files", "train_step_source"),
        cacheable=True,
    ),
    Stage(
        "lower",
        lower.run,
        reads=("exported",),
        writes=("graph", "op_counts", "fp32_fallbacks"),
        config=("pipeline.lower", "partitioner.name"),
        cacheable=True,
    ),
    Stage(
        "partition",
        partition.run,
        reads=("graph",),
        writes=("graph", "op_counts", "partitions"),
        config=(
            "partitioner",
            "pipeline.lower.fuse_blocks",
            "pipeline.lower.fuse_float_blocks",
            "target.kind",  # bare metal fuses fewer blocks (pipeline/blocks.py)
        ),
        inputs=("partitioner_source",),
        cacheable=True,
    ),
    Stage(
        "out_variant",
        out_variant.run,
        reads=("graph",),
        writes=("program",),
        config=("pipeline.lower.channels_last",),
        cacheable=True,
    ),
    Stage(
        "plan",
        plan.run,
        reads=("program",),
        writes=("program", "plan"),
        config=("memory", "quant.scheme"),
        cacheable=True,
        rerun=("program", "plan"),  # the plan finds the program's tensors by id()
    ),
    Stage(
        "emit",
        emit.run,
        reads=("program", "plan"),
        writes=("emit_facts", "program_inputs"),
        config=("pipeline.emit",),
        cacheable=True,
    ),
    Stage(
        "reference",
        reference.run,
        reads=("module", "example_inputs", "quantized_module", "graph"),
        config=("model", "quant.scheme", "pipeline.verify.eval_inputs"),
        cacheable=True,
    ),
    Stage("select", select.run, writes=("selection", "backends")),
    Stage(
        "build",
        build.run,
        reads=("backends",),
        writes=(
            "toolchain",
            "build_cache_entries",
            "runtime_sizes",
            "kernel_isa",
            "runner",
            "firmware",
            "firmware_elf",
        ),
    ),
    Stage(
        "verify",
        verify.run,
        reads=("toolchain", "kernel_isa", "runner", "firmware_elf"),
        writes=("verify",),
    ),
    Stage(
        "report",
        report.run,
        reads=(
            "emit_facts",
            "program_inputs",
            "selection",
            "partitions",
            "fp32_fallbacks",
            "toolchain",
            "runtime_sizes",
            "kernel_isa",
            "firmware",
            "verify",
        ),
    ),
]
