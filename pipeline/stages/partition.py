"""The `partition` stage: the configured backend takes the nodes it runs, cut into acyclic
partitions, each replaced by one delegate call (pipeline/partition.py); then every op left
outside a delegate is checked against ``ops_yaml/``.

Without a partitioner the lower stage has checked every op. Either way the stage then fuses
the MobileNet blocks that the runtime runs (``pipeline.lower.fuse_blocks`` for int8,
``pipeline.lower.fuse_float_blocks`` for Float; pipeline/blocks.py): after partitioning, so that
a backend sees the separate convolutions it may take.
"""

from __future__ import annotations

from ..blocks import fuse_blocks
from ..config import TargetKind
from ..partition import Rules, load_backend, partition_graph
from ..runner import Context
from .lower import check_ops


def fuse_runtime_blocks(ctx: Context) -> int:
    """Fuses the MobileNet blocks left to the runtime's kernels, when the config asks for it, and
    counts the ops again; returns how many blocks were fused."""
    g = ctx.artifacts["graph"]
    int8, floats = ctx.cfg.pipeline.lower.fuse_blocks, ctx.cfg.pipeline.lower.fuse_float_blocks
    threads = TargetKind(ctx.cfg.target.kind) != TargetKind.cortex_m  # bare metal: none
    fused = fuse_blocks(g, int8, floats, threads)
    if fused:
        ctx.artifacts["op_counts"] = check_ops(g)
    return fused


def run(ctx: Context) -> None:
    pcfg = ctx.cfg.partitioner
    if pcfg.name == "none":
        ctx.artifacts["partitions"] = None
        ctx.summarize(partitions=0, blocks_fused=fuse_runtime_blocks(ctx))
        return
    backend = load_backend(pcfg)
    rules = Rules(
        ops=list(pcfg.ops),
        include_modules=list(pcfg.include_modules),
        exclude_modules=list(pcfg.exclude_modules),
        dtypes=list(pcfg.dtypes),
        min_partition_size=pcfg.min_partition_size,
    )
    g = ctx.artifacts["graph"]
    report = partition_graph(g, backend, rules)  # tags and replaces nodes of g in place
    ctx.artifacts["graph"] = g
    ctx.artifacts["op_counts"] = check_ops(g)
    ctx.artifacts["partitions"] = report.as_dict()
    blocks = fuse_runtime_blocks(ctx)
    delegated = sum(p["flops"] for p in report.partitions)
    ctx.summarize(
        backend=backend.id,
        partitions=len(report.partitions),
        delegated_ops=sum(sum(p["ops"].values()) for p in report.partitions),
        flops_share=f"{delegated / report.total_flops:.1%}" if report.total_flops else "0%",
        refused=sum(r["calls"] for r in report.refused),
        blocks_fused=blocks,
    )
