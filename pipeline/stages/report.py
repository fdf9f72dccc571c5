"""The `report` stage: report.md, what was built and what it costs."""

from __future__ import annotations

from ..runner import Context


def _kb(n: int) -> str:
    return f"{n:,} B ({n / 1024:,.1f} KiB)"


def render(ctx: Context) -> str:
    cfg = ctx.cfg
    a = ctx.artifacts
    plan = a["plan"]
    facts = a["emit_facts"]
    program = a["program"]
    lines = [
        f"# etbuild report: {cfg.model.name}",
        "",
        f"- target: {cfg.target.name}",
        f"- quantization: {cfg.quant.scheme.value}",
        f"- partitioner: {cfg.partitioner.name}",
        "- inputs: "
        + ", ".join(
            f"{spec.name} {list(v.shape)} {str(v.dtype).removeprefix('torch.')}"
            for spec, v in zip(cfg.model.inputs, program.inputs, strict=False)
        ),
        "",
        "## Program (model.pte)",
        "",
        "| what | value |",
        "|---|---|",
        f"| file size | {_kb(facts['file_bytes'])} |",
        f"| instructions | {facts['instructions']} |",
        f"| operators | {facts['operators']} |",
        f"| values | {facts['values']} |",
        f"| constants | {facts['constants']} tensors, {_kb(facts['constant_bytes'])} |",
        "",
        "## Memory plan",
        "",
        f"Planner `{plan.planner}`, alignment {plan.alignment} B, "
        f"{plan.in_place_reuses} outputs written in place over a dying input.",
        "",
        "| bank | planned |",
        "|---|---|",
    ]
    for name, size in zip(plan.bank_names, plan.bank_sizes, strict=True):
        lines.append(f"| {name} | {_kb(size)} |")
    total = sum(plan.bank_sizes)
    ratio = total / plan.lower_bound if plan.lower_bound else 1.0
    lines += [
        "",
        f"Peak-live lower bound: {_kb(plan.lower_bound)}; the plan is {ratio:.3f}x of it.",
        "",
        "## Operators",
        "",
        "| operator | calls | dtypes |",
        "|---|---|---|",
    ]
    for key, info in a["selection"].items():
        dtypes = "; ".join(f"{arg}: {'/'.join(d)}" for arg, d in info["dtypes"].items())
        lines.append(f"| `{key}` | {info['count']} | {dtypes} |")
    verify = a.get("verify")
    if verify:
        lines += ["", "## Verification on the etbuild runtime", "", "| what | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in verify.items()]
    lines += ["", "## Stage times", "", "| stage | seconds | summary |", "|---|---|---|"]
    for rec in ctx.records[:-1]:
        summary = ", ".join(f"{k}={v}" for k, v in rec.summary.items())
        lines.append(f"| {rec.name} | {rec.seconds:.3f} | {summary} |")
    return "\n".join(lines) + "\n"


def run(ctx: Context) -> None:
    ctx.write("report.md", render(ctx).encode())
