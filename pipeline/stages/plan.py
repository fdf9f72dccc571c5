"""The `plan` stage: tensor lifetimes and offsets in the memory banks -> memory_plan.json."""

from __future__ import annotations

import json

from ..planner import plan_memory
from ..runner import Context


def run(ctx: Context) -> None:
    mem = ctx.cfg.memory
    program = ctx.artifacts["program"]
    banks = [(b.name, b.size_bytes) for b in mem.banks]
    planner = mem.planner.value if hasattr(mem.planner, "value") else str(mem.planner)
    plan = plan_memory(program, banks, mem.alignment, planner, mem.in_place)
    other = "naive" if planner != "naive" else "greedy_by_size"
    baseline = plan_memory(
        program, [(n, None) for n, _ in banks], mem.alignment, other, mem.in_place
    )
    ctx.artifacts["plan"] = plan
    total = sum(plan.bank_sizes)
    doc = {
        "planner": planner,
        "alignment": plan.alignment,
        "in_place_reuses": plan.in_place_reuses,
        "banks": [
            {"id": i + 1, "name": n, "planned_bytes": s}
            for i, (n, s) in enumerate(zip(plan.bank_names, plan.bank_sizes, strict=True))
        ],
        "total_bytes": total,
        "lower_bound_bytes": plan.lower_bound,
        f"{other}_total_bytes": sum(baseline.bank_sizes),
        "tensors": [
            {
                "name": m.name,
                "bank": plan.bank_names[st.bank],
                "offset": st.offset,
                "size": m.nbytes,
                "lifetime": [st.start, st.end],
                "storage": st.name,
                "dtype": str(m.dtype).removeprefix("torch."),
                "shape": list(m.shape),
            }
            for st in sorted(plan.storages, key=lambda s: (s.start, s.name))
            for m in st.members
        ],
    }
    ctx.write("memory_plan.json", (json.dumps(doc, indent=1) + "\n").encode())
    ctx.measure(
        planned_bytes=dict(zip(plan.bank_names, plan.bank_sizes, strict=True)),
        planned_total_bytes=total,
    )
    ctx.summarize(
        planned=total,
        lower_bound=plan.lower_bound,
        **{other: sum(baseline.bank_sizes)},
        in_place=plan.in_place_reuses,
    )
