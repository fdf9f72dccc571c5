"""The `report` stage: report.md, what was built and what it costs."""

from __future__ import annotations

from ..runner import Context


def _kb(n: int) -> str:
    return f"{n:,} B ({n / 1024:,.1f} KiB)"


def _size_section(cfg, sizes: dict) -> list[str]:
    lines = [
        "",
        f"## Runtime size ({cfg.target.name})",
        "",
        "Core: the stripped `etb_size_test` (executor, no kernels). Kernels and registration: "
        "the symbol sizes (`nm --size-sort`) in the linked runner (`--gc-sections`).",
        "",
        "| part | tailored |" + (" all ops |" if "all_ops_bytes" in sizes else ""),
        "|---|---|" + ("---|" if "all_ops_bytes" in sizes else ""),
    ]
    rows = [
        ("core", "core_bytes", "core_bytes"),
        ("kernels", "kernels_bytes", "all_ops_kernels_bytes"),
        ("registration", "registration_bytes", "all_ops_registration_bytes"),
        ("**runtime (core + kernels + registration)**", "tailored_bytes", "all_ops_bytes"),
        ("runner binary, stripped", "runner_stripped_bytes", "all_ops_runner_stripped_bytes"),
    ]
    for label, mine, full in rows:
        cell = f"| {label} | {_kb(sizes[mine])} |"
        if "all_ops_bytes" in sizes:
            cell += f" {_kb(sizes[full])} |"
        lines.append(cell)
    if "all_ops_bytes" in sizes:
        ratio = sizes["tailored_bytes"] / sizes["all_ops_bytes"]
        lines += ["", f"The tailored runtime is {ratio:.2f}x the all-ops runtime."]
    budget = cfg.build.size_budget_kb
    if budget is not None:
        lines += ["", f"Size budget: {budget:g} KiB (build.size_budget_kb)."]
    lines += ["", "Largest kernels:", "", "| kernel | bytes |", "|---|---|"]
    lines += [f"| `{name}` | {n:,} |" for n, name in sizes["largest_kernels"]]
    return lines


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
    sizes = a.get("runtime_sizes")
    if sizes:
        lines += _size_section(cfg, sizes)
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
