"""Memory plans: each planner's total bytes and access cost against the peak-live lower bound
and against ExecuTorch's planner, over the model zoo; and per-bank use on an MCU.

Part 1, fp32 and one flat bank, for every zoo model: etbuild's pipeline runs up to the `plan`
stage (in-process, into a temporary run directory) and its `memory_plan.json` gives the
lower bound (the most bytes alive at any instruction) and each planner's total bytes and
access cost. ExecuTorch 1.5.1 plans the same fp32 module (the `model` stage's module and
example inputs, exported with the same dynamic dims): `to_edge(...).to_executorch()` with its
default memory planning, whose total is the sum of the execution plan's
`non_const_buffer_sizes`. Both plan the inputs and outputs. ExecuTorch's total is its default
flow's, graph included: its edge program transposes linear weights at run time (a
`permute_copy` into planned memory) where etbuild folds them into constants. Printed per model
and planner: total bytes, total / lower bound, total / ExecuTorch's, access cost.

Part 2, the MLPerf Tiny models with `+memory=stm32h7 +quant=ptq` (an MCU's memory banks):
each bank's planned bytes against its capacity, and its access cost.

Part 3, memory-aware scheduling: each model's peak in the exported order, with concatenation
in place, and reordered (`memory.schedule=min_peak`), for the zoo and two graphs with branches
from tests/models_for_tests.py (a U-Net; a ResNet-50-style bottleneck network).

`memory_plan.json` gains keys over time (`planners`, `banks[].capacity_bytes`,
`banks[].cost`, `schedule`); a key this etbuild does not write yet is reported once, as
such, and the rest is printed. Only sizes are compared: no wall time is measured.

    pip install executorch==1.5.1   # for the ExecuTorch column; without it, that column is n/a
    python bench/memory_plan.py [--models mobilenet,mlp] [--mcu-models ds_cnn]
        [--mcu-memory stm32h7] [--schedule-models unet,bottleneck_resnet,resnet18]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from etbuild.pipeline.cli import check_supported
from etbuild.pipeline.config import register_configs, validate
from etbuild.pipeline.paths import CONF_DIR
from etbuild.pipeline.runner import Context, run_stages
from etbuild.pipeline.stages import STAGES
from etbuild.pipeline.stages.export import export_program

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kernels as kb  # noqa: E402  (the machine line, as the other benches print it)

# Every zoo model: each config of conf/model/ but the bring-your-own one.
ZOO_MODELS = tuple(
    sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml") if p.stem != "custom")
)
MCU_MODELS = ("ds_cnn", "mobilenet_v1_vww", "resnet8", "fc_autoencoder")


@dataclass
class PlannerResult:
    """One planner's plan of a program, as memory_plan.json reports it."""

    name: str
    total_bytes: int
    cost: float | None  # None: this memory_plan.json gives no cost
    banks: dict[str, int]  # bank name -> planned bytes (empty: not reported)


class Notes:
    """Messages about keys missing from memory_plan.json: each kept once, printed after the
    section's table."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self.seen: set[str] = set()

    def once(self, message: str) -> None:
        if message not in self.seen:
            self.seen.add(message)
            self.pending.append(message)

    def flush(self) -> None:
        for message in self.pending:
            print(f"  note: {message}")
        self.pending.clear()


def planner_results(doc: dict, notes: Notes) -> list[PlannerResult]:
    """Every planner's result: the `planners` table, or else (an older memory_plan.json) the
    chosen planner's totals and each `<planner>_total_bytes` key."""
    if "planners" in doc:
        return [
            PlannerResult(name, p["total_bytes"], p.get("cost"), dict(p.get("banks", {})))
            for name, p in doc["planners"].items()
        ]
    notes.once(
        "memory_plan.json has no 'planners' table (this etbuild predates it): showing the "
        "chosen planner and the one '<planner>_total_bytes' baseline it reports"
    )
    chosen = PlannerResult(
        doc.get("planner", "chosen"),
        doc["total_bytes"],
        doc.get("cost"),
        {b["name"]: b["planned_bytes"] for b in doc.get("banks", [])},
    )
    others = [
        PlannerResult(key.removesuffix("_total_bytes"), value, None, {})
        for key, value in doc.items()
        if key.endswith("_total_bytes") and key not in ("total_bytes", "lower_bound_bytes")
    ]
    return [chosen, *others]


def plan(model: str, overrides: list[str], work: Path) -> tuple[dict, Context]:
    """Run the pipeline for ``model`` up to the plan stage; its memory_plan.json and context."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"model={model}", *overrides])
    cfg = validate(cfg)
    check_supported(cfg)
    run_dir = work / "_".join([model, *(o.lstrip("+").replace("=", "-") for o in overrides)])
    ctx = run_stages(STAGES, cfg, run_dir, stop_after="plan", log=lambda _line: None)
    return json.loads((run_dir / "memory_plan.json").read_text()), ctx


def executorch_planned_bytes(ctx: Context) -> int:
    """ExecuTorch's default memory plan of the run's fp32 module: its non-constant buffers."""
    from executorch.exir import to_edge

    module, inputs = ctx.artifacts["module"], ctx.artifacts["example_inputs"]
    exported = export_program(module, ctx.cfg.model, inputs)
    program = to_edge(exported).to_executorch().executorch_program
    return sum(program.execution_plan[0].non_const_buffer_sizes)


def ratio(a: float, b: float | None) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def cost_text(cost: float | None) -> str:
    return "n/a" if cost is None else f"{cost:,.0f}"


def print_schedule(doc: dict, notes: Notes) -> None:
    schedule = doc.get("schedule")
    if schedule is None:
        notes.once("memory_plan.json has no 'schedule' (peak before/after reordering)")
        return
    before, after = schedule.get("peak_before"), schedule.get("peak_after")
    print(
        f"    schedule {schedule.get('order', '?')}: peak {before:,} -> {after:,} B "
        f"({ratio(after, before)}x)"
        if before and after is not None
        else f"    schedule: {schedule}"
    )


def flat_fp32(models: list[str], work: Path, with_executorch: bool, notes: Notes) -> None:
    print("\n== fp32, one flat bank: planned bytes (inputs and outputs included) ==")
    print(
        f"  {'model':<20} {'planner':<24} {'total B':>12} {'x bound':>8} {'x ExecuTorch':>13} "
        f"{'cost':>14}"
    )
    chosen_vs_bound, chosen_vs_et = [], []
    for model in models:
        try:
            doc, ctx = plan(model, [], work)
        except Exception as exc:  # a bench reports a failing model and goes on
            print(f"  {model:<20} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        bound = doc["lower_bound_bytes"]
        et = None
        if with_executorch:
            try:
                et = executorch_planned_bytes(ctx)
            except Exception as exc:
                print(f"  {model:<20} ExecuTorch failed: {type(exc).__name__}: {exc}"[:200])
        print(f"  {model:<20} {'lower bound':<24} {bound:>12,} {'1.00':>8} {ratio(bound, et):>13}")
        if et is not None:
            print(f"  {'':<20} {'ExecuTorch':<24} {et:>12,} {ratio(et, bound):>8}")
        results = planner_results(doc, notes)
        for r in results:
            label = r.name + (" (chosen)" if r.name == doc.get("planner") else "")
            print(
                f"  {'':<20} {label:<24} {r.total_bytes:>12,} {ratio(r.total_bytes, bound):>8} "
                f"{ratio(r.total_bytes, et):>13} {cost_text(r.cost):>14}"
            )
        if all(r.cost is None for r in results):
            notes.once("no access costs in memory_plan.json ('planners' or banks[].cost absent)")
        print_schedule(doc, notes)
        chosen = next((r for r in results if r.name == doc.get("planner")), results[0])
        chosen_vs_bound.append(chosen.total_bytes / bound if bound else 1.0)
        if et:
            chosen_vs_et.append(chosen.total_bytes / et)
    if chosen_vs_bound:
        print(
            f"  chosen planner over {len(chosen_vs_bound)} models: total / lower bound "
            f"geomean {geomean(chosen_vs_bound):.3f}, worst {max(chosen_vs_bound):.3f}"
        )
    if chosen_vs_et:
        print(
            f"  chosen planner / ExecuTorch's: geomean {geomean(chosen_vs_et):.3f}, "
            f"worst {max(chosen_vs_et):.3f}"
        )
    notes.flush()


def mcu_banks(models: list[str], memory: str, work: Path, notes: Notes) -> None:
    print(f"\n== int8 (+quant=ptq), +memory={memory}: each bank's use ==")
    for model in models:
        try:
            doc, ctx = plan(model, [f"+memory={memory}", "+quant=ptq"], work)
        except Exception as exc:
            print(f"  {model}: failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        bound = doc["lower_bound_bytes"]
        print(
            f"  {model}: planner {doc.get('planner', '?')}, total {doc['total_bytes']:,} B, "
            f"lower bound {bound:,} B ({ratio(doc['total_bytes'], bound)}x)"
        )
        configured = {b.name: b.size_bytes for b in ctx.cfg.memory.banks}
        for bank in doc.get("banks", []):
            capacity = bank.get("capacity_bytes")
            if "capacity_bytes" not in bank:
                notes.once(
                    "memory_plan.json has no banks[].capacity_bytes: capacities are the "
                    "config's memory.banks[].size_bytes"
                )
                capacity = configured.get(bank["name"])
            used = bank["planned_bytes"]
            share = f"{100 * used / capacity:5.1f}% of {capacity:,}" if capacity else "no cap"
            print(
                f"    {bank['name']:<8} {used:>10,} B  {share:<24} "
                f"cost {cost_text(bank.get('cost'))}"
            )
        for r in planner_results(doc, notes):
            banks = ", ".join(f"{k} {v:,}" for k, v in r.banks.items())
            print(
                f"    planner {r.name:<20} total {r.total_bytes:>10,} B "
                f"({ratio(r.total_bytes, bound)}x bound)  cost {cost_text(r.cost)}"
                + (f"  [{banks}]" if banks else "")
            )
        print_schedule(doc, notes)
    notes.flush()


# Graphs with branches (tests/models_for_tests.py): the U-Net's skips and a ResNet-50-style
# network whose peak is a downsampling bottleneck block with a projection shortcut.
BRANCHY = {
    "unet": ("models_for_tests.unet", "[1,3,64,64]"),
    "bottleneck_resnet": ("models_for_tests.bottleneck_resnet", "[1,3,32,32]"),
}


def scheduling(models: list[str], work: Path, notes: Notes) -> None:
    print("\n== scheduling, fp32, one flat bank: the peak in the exported order and reordered ==")
    print(
        f"  {'model':<20} {'exported order':>15} {'+ cat in place':>15} {'min_peak':>12} {'x':>6}"
    )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    for model in models:
        overrides = ["memory.schedule=min_peak"]
        name = model
        if model in BRANCHY:
            target, shape = BRANCHY[model]
            overrides += [
                f"model._target_={target}",
                f"model.name={model}",
                f"model.inputs=[{{name:x,shape:{shape}}}]",
                "model.dynamic_dims=[]",
            ]
            model = "custom"
        try:
            doc, _ = plan(model, overrides, work)
        except Exception as exc:
            print(f"  {name:<20} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        sched = doc.get("schedule")
        if sched is None:
            notes.once("memory_plan.json has no 'schedule' (peak before/after reordering)")
            continue
        before, after = sched["peak_before"], sched["peak_after"]
        mid = sched.get("peak_after_concat_in_place", before)
        print(f"  {name:<20} {before:>15,} {mid:>15,} {after:>12,} {ratio(after, before):>6}")
    notes.flush()


def quiet_third_party_warnings() -> None:
    """torch.export's deprecation warnings and torchao's optional-library messages are not
    about memory plans."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ZOO_MODELS), help="fp32 flat-memory models")
    p.add_argument("--mcu-models", default=",".join(MCU_MODELS), help="int8 MCU models")
    p.add_argument("--mcu-memory", default="stm32h7", help="the MCU's memory preset")
    p.add_argument(
        "--schedule-models",
        default=",".join([*ZOO_MODELS, *BRANCHY]),
        help="models whose peak is compared in the exported order and with memory.schedule="
        "min_peak (zoo names, or unet / bottleneck_resnet from tests/models_for_tests.py)",
    )
    args = p.parse_args()
    quiet_third_party_warnings()
    register_configs()
    info = kb.cpu_info()
    with_executorch = importlib.util.find_spec("executorch") is not None
    print(
        f"machine: {info['model']}, {os.cpu_count()} cores, {platform.machine()}; "
        f"torch {torch.__version__}, executorch {version('executorch')}"
    )
    notes = Notes()
    if not with_executorch:
        notes.once("executorch is not importable: the ExecuTorch column is n/a")
    with tempfile.TemporaryDirectory(prefix="etb_memory_plan_") as tmp:
        if args.models:
            flat_fp32(args.models.split(","), Path(tmp), with_executorch, notes)
        if args.mcu_models:
            mcu_banks(args.mcu_models.split(","), args.mcu_memory, Path(tmp), notes)
        if args.schedule_models:
            scheduling(args.schedule_models.split(","), Path(tmp), notes)


if __name__ == "__main__":
    main()
