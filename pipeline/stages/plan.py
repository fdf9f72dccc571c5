"""The `plan` stage: the instruction order, then a bank and an offset for every planned tensor
(and the kernels' scratch) -> memory_plan.json and memory_<bank>.png.

Every planner is run for comparison (memory_plan.json's ``planners``); the configured one's
plan is the one the program uses. A model that cannot fit fails here, before any compile.
"""

from __future__ import annotations

import io
import json

from omegaconf import DictConfig

from ..concat import concat_in_place
from ..errors import EtbuildError
from ..ir import Program
from ..planner import (
    CONSTANTS,
    PLANNERS,
    Bank,
    Plan,
    copy_constants,
    peak_live,
    plan_memory,
)
from ..runner import Context
from ..schedule import Schedule, min_peak_order, program_order


def _value(x: object) -> str:
    return x.value if hasattr(x, "value") else str(x)


def banks_of(mem: DictConfig) -> list[Bank]:
    """The configured banks as the planner sees them."""
    return [
        Bank(
            name=str(b.name),
            capacity=b.size_bytes,
            read_cost=float(b.read_cost),
            write_cost=float(b.write_cost),
            alignment=b.alignment,
            holds=frozenset(_value(h) for h in b.holds),
        )
        for b in mem.banks
    ]


def constant_bytes(program: Program) -> int:
    """The bytes of the program's weights and delegate blobs."""
    seen: set[int] = set()
    total = 0
    for v in program.values:
        if v.is_constant and id(v) not in seen:
            seen.add(id(v))
            total += v.nbytes
    for ins in program.instructions:
        delegate = getattr(ins, "delegate", None)
        if delegate is not None and id(delegate) not in seen:
            seen.add(id(delegate))
            total += len(delegate.processed)
    return total


def check_constants_fit(program: Program, banks: list[Bank]) -> dict | None:
    """The constants bank's use; an error when the weights exceed it."""
    holders = [b for b in banks if CONSTANTS in b.holds]
    if not holders:
        return None
    bank = holders[0]
    need = constant_bytes(program)
    if bank.capacity is not None and need > bank.capacity:
        raise EtbuildError(
            f"the program's constants ({need} bytes, {need / 1024:,.1f} KiB) do not fit bank "
            f"{bank.name!r} ({bank.capacity} bytes). Quantize the weights (+quant=ptq or "
            f"+quant=dynamic: int8 weights take a quarter of fp32's bytes), pick a smaller "
            f"model, or raise memory.banks[{bank.name}].size_bytes"
        )
    return {"name": bank.name, "capacity_bytes": bank.capacity, "constant_bytes": need}


def copied_constants(plan: Plan) -> dict:
    """memory_plan.json's account of the constants copied into faster banks at load."""
    return {
        "copied_bytes": sum(c.value.nbytes for c in plan.copied),
        "copied_cost_saved": round(sum(c.saved for c in plan.copied), 1),
        "copied": [
            {
                "name": c.value.name,
                "bank": plan.bank_names[c.bank],
                "offset": c.offset,
                "size": c.value.nbytes,
                "reads": c.reads,
            }
            for c in plan.copied
        ],
    }


def schedule_program(program: Program, mem: DictConfig) -> Schedule:
    if _value(mem.schedule) == "min_peak":
        return min_peak_order(program, mem.alignment, mem.in_place)
    return program_order(program, mem.alignment, mem.in_place)


def compare_planners(program: Program, banks: list[Bank], mem: DictConfig, plan: Plan) -> dict:
    """Each planner's total bytes, cost and bytes per bank (``plan``: the configured one's)."""
    out: dict[str, dict] = {}
    for name in PLANNERS:
        try:
            p = (
                plan
                if name == plan.planner
                else plan_memory(
                    program, banks, mem.alignment, name, mem.in_place, mem.scratch_bytes
                )
            )
        except EtbuildError:
            out[name] = {"fits": False}
            continue
        out[name] = {
            "fits": True,
            "total_bytes": sum(p.bank_sizes),
            "cost": round(p.cost, 1),
            "banks": dict(zip(p.bank_names, p.bank_sizes, strict=True)),
        }
    return out


def plan_document(
    plan: Plan,
    schedule: Schedule,
    planners: dict,
    constants: dict | None,
    concats: int,
    exported_peak: int,
) -> dict:
    scratch = None
    if plan.scratch is not None:
        b, offset, size = plan.scratch
        scratch = {"bank": plan.bank_names[b], "offset": offset, "size": size}
    return {
        "planner": plan.planner,
        "alignment": plan.alignment,
        "in_place_reuses": plan.in_place_reuses,
        "banks": [
            {
                "id": i + 1,
                "name": bank.name,
                "planned_bytes": plan.bank_sizes[i],
                "capacity_bytes": bank.capacity,
                "alignment": plan.bank_alignments[i],
                "lower_bound_bytes": plan.bank_lower_bound(i),
                "read_cost": bank.read_cost,
                "write_cost": bank.write_cost,
                "cost": round(plan.bank_costs[i], 1),
                "tensors": sum(len(s.members) for s in plan.storages if s.bank == i),
                "copied_constant_bytes": sum(c.value.nbytes for c in plan.copied if c.bank == i),
            }
            for i, bank in enumerate(plan.banks)
        ],
        "total_bytes": sum(plan.bank_sizes),
        "tensor_bytes": plan.tensor_bytes(),
        "lower_bound_bytes": plan.lower_bound,
        "cost": round(plan.cost, 1),
        "planners": planners,
        # The peak-live bound of the exported order with every copy, after concatenation in
        # place, and after reordering too.
        "schedule": {
            "order": "min_peak" if schedule.reordered else "program",
            "peak_before": exported_peak,
            "peak_after_concat_in_place": schedule.peak_before,
            "peak_after": peak_live([s for s in plan.storages if s.members]),
        },
        "concat_in_place": concats,
        "scratch": scratch,
        "constants": constants,
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


def bank_picture(plan: Plan, bank: int, n_instructions: int) -> bytes:
    """memory_<bank>.png: offset over instruction index, one rectangle per storage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    placed = [s for s in plan.storages if s.bank == bank]
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    cmap = plt.get_cmap("tab20")
    for k, s in enumerate(sorted(placed, key=lambda s: (s.start, s.offset))):
        color = "0.6" if not s.members else cmap(k % 20)
        ax.add_patch(
            Rectangle(
                (s.start - 0.5, s.offset / 1024),
                s.end - s.start + 1,
                s.size / 1024,
                facecolor=color,
                edgecolor="black",
                linewidth=0.3,
            )
        )
    size = plan.bank_sizes[bank] / 1024
    capacity = plan.banks[bank].capacity
    ax.set_xlim(-1.5, n_instructions + 0.5)
    top = max(size, capacity / 1024 if capacity else 0, 1e-3)
    ax.set_ylim(0, top * 1.05)
    ax.axhline(plan.bank_lower_bound(bank) / 1024, color="tab:green", linestyle="--",
               linewidth=1, label="peak-live bound")  # fmt: skip
    if capacity:
        ax.axhline(capacity / 1024, color="tab:red", linewidth=1, label="capacity")
    ax.set_xlabel("instruction")
    ax.set_ylabel("offset (KiB)")
    ax.set_title(
        f"bank {plan.bank_names[bank]}: {len(placed)} storages, {size:,.1f} KiB planned "
        f"({plan.planner})"
    )
    ax.legend(loc="upper right", fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def run(ctx: Context) -> None:
    mem = ctx.cfg.memory
    banks = banks_of(mem)
    program = ctx.artifacts["program"]
    constants = check_constants_fit(program, banks)
    exported_peak = program_order(program, mem.alignment, mem.in_place).peak_before
    concats = 0
    if mem.concat_in_place:
        program, concats = concat_in_place(program)
    schedule = schedule_program(program, mem)
    program = schedule.program
    ctx.artifacts["program"] = program
    planner = _value(mem.planner)
    quantized = _value(ctx.cfg.quant.scheme) != "none"
    plan = plan_memory(
        program, banks, mem.alignment, planner, mem.in_place, mem.scratch_bytes, quantized
    )
    ctx.artifacts["plan"] = plan
    planners = compare_planners(program, banks, mem, plan)
    if _value(mem.constants) == "copy":
        copy_constants(program, plan, next(b for b in banks if CONSTANTS in b.holds))
        constants = {**constants, **copied_constants(plan)}
    doc = plan_document(plan, schedule, planners, constants, concats, exported_peak)
    ctx.write("memory_plan.json", (json.dumps(doc, indent=1) + "\n").encode())
    for b, name in enumerate(plan.bank_names):
        ctx.write(f"memory_{name}.png", bank_picture(plan, b, len(program.instructions)))
    total = sum(plan.bank_sizes)
    ctx.measure(
        planned_bytes=dict(zip(plan.bank_names, plan.bank_sizes, strict=True)),
        planned_total_bytes=total,
    )
    ctx.summarize(
        planned=total,
        lower_bound=plan.lower_bound,
        cost=round(plan.cost),
        peak_before=exported_peak,
        concat_in_place=concats,
        in_place=plan.in_place_reuses,
        **{
            name: r["total_bytes"]
            for name, r in planners.items()
            if name != planner and r.get("fits")
        },
    )
