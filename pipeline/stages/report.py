"""The `report` stage: report.md, what was built and what it costs."""

from __future__ import annotations

import json

from ..config import TargetKind
from ..runner import Context


def _kb(n: int) -> str:
    return f"{n:,} B ({n / 1024:,.1f} KiB)"


def _size_section(cfg, sizes: dict) -> list[str]:
    core = (
        "Core: the flash (text + data) of the firmware image with no kernels (executor, "
        "platform layer, newlib-nano)"
        if "flash_bytes" in sizes
        else "Core: the stripped `etb_size_test` (executor, no kernels)"
    )
    lines = [
        "",
        f"## Runtime size ({cfg.target.name})",
        "",
        f"{core}. Kernels and registration: "
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
    if "flash_bytes" in sizes:  # bare metal: the firmware image, not a CLI runner
        rows[-1] = ("firmware image, flash", "flash_bytes", "all_ops_flash_bytes")
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


def _flash_section(sizes: dict, program_bytes: int, planned_bytes: int) -> list[str]:
    """Bare metal: the firmware image's flash and RAM, and the program next to them."""
    flash = sizes["flash_bytes"]
    return [
        "",
        "## Flash and RAM (bare metal)",
        "",
        "The firmware image `runtime/bin/etb_firmware.elf` as `arm-none-eabi-size -B` counts it "
        "(the runtime, the selected kernels and their registration, newlib-nano; not the "
        "program):",
        "",
        f"- flash: {_kb(flash)} = text {sizes['text_bytes']:,} + data {sizes['data_bytes']:,}",
        f"- RAM: {_kb(sizes['ram_bytes'])} static = data {sizes['data_bytes']:,} + bss "
        f"{sizes['bss_bytes']:,}; the application adds the planned memory banks "
        f"({_kb(planned_bytes)}), the method allocator and the kernels' scratch memory",
        f"- program: model.pte is {_kb(program_bytes)}, {program_bytes / flash:,.2f}x the "
        f"runtime's flash; flash must hold both ({_kb(program_bytes + flash)})",
    ]


def _firmware_section(fw: dict, program_bytes: int) -> list[str]:
    """cortex_m with a board: the linked firmware's flash, static RAM and each memory bank's
    buffer (its section, the region its symbol lies in, its use against its capacity)."""
    ram = fw["static_ram_sections"]
    lines = [
        "",
        f"## Firmware ({fw['board']})",
        "",
        "`firmware/firmware.elf`: the runtime, the selected kernels, the board's startup code "
        "and the program (model.pte, in flash), with one buffer per planned memory bank in its "
        "linker section (`firmware/banks.c`, `firmware/banks.ld`). Sizes from the linked ELF's "
        "sections (`readelf -S`) and the bank symbols (`nm`).",
        "",
        f"- flash: {_kb(fw['flash_bytes'])} (code, read-only data and the program "
        f"({_kb(program_bytes)}), and .data's initial values)",
        f"- static RAM: {_kb(fw['static_ram_bytes'])} = "
        + " + ".join(f"{name} {n:,}" for name, n in ram.items()),
        f"- stack {_kb(fw['stack_bytes'])}; arena (method tables, inputs, and the kernels' "
        f"scratch unless the plan reserves it) {_kb(fw['arena_bytes'])}",
        "",
        "| bank | section | region | address | used | capacity | use |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in fw["banks"]:
        cap = b["capacity"]
        use = f"{b['bytes'] / cap:.1%}" if cap else "-"
        address = f"`{b['address']:#010x}`" if b["address"] is not None else "(empty: no buffer)"
        lines.append(
            f"| {b['name']} | `{b['section']}` | {b['region'] or b['wanted_region']} | {address} | "
            f"{_kb(b['bytes'])} | {_kb(cap) if cap else 'unbounded'} | {use} |"
        )
    lines += ["", "| region | origin | size | linked |", "|---|---|---|---|"]
    for name, r in fw["regions"].items():
        lines.append(f"| {name} | `{r['origin']:#010x}` | {_kb(r['length'])} | {_kb(r['used'])} |")
    return lines


def _kernels_line(a: dict) -> list[str]:
    """The kernels' -march and SIMD path: as the runner reported it, else (a target that does
    not run here, or verify off) as the compile flags give it."""
    tc = a.get("toolchain")
    if tc is None or "kernel_isa" not in a:
        return []
    march = f"`-march={tc.march}`" if tc.march else "the toolchain's default `-march`"
    reported = (a.get("verify") or {}).get("kernel_isa")
    if reported and tc.runnable and tc.kind != TargetKind.cortex_m:  # firmware: flags only
        isa = f"`{reported}` (reported by the runner)"
    elif reported:
        isa = reported
    else:
        isa = f"`{a['kernel_isa']}` (from the compile flags)"
    if tc.kind == TargetKind.cortex_m:
        threads = "- threads: 1 (bare metal: the runtime has no thread pool)"
    else:
        threads = (
            f"- threads: {tc.threads} (target.threads: `etb_runner --threads {tc.threads}`, "
            f"`load(path, threads={tc.threads})`)"
        )
    return [f"- kernels: {march}, SIMD path {isa}", threads]


def _fp32_section(fallbacks: list[dict]) -> list[str]:
    """The fp32 ops a quantized program runs between int8 values, and what they cost."""
    lines = ["", "## fp32 inside the quantized program", ""]
    if not fallbacks:
        return lines + ["None: every compute op after the input's quantize runs in int8."]
    calls = sum(f["calls"] for f in fallbacks)
    conversions = sum(f["conversions"] for f in fallbacks)
    lines += [
        f"{calls} call(s) run in fp32, at the cost of {conversions} quantize/dequantize "
        "kernel(s) around them.",
        "",
        "| operator | calls | why fp32 | quantize/dequantize | at |",
        "|---|---|---|---|---|",
    ]
    for f in fallbacks:
        at = "<br>".join(f"`{w}`" for w in f["at"][:3])
        more = f" (+{len(f['at']) - 3} more)" if len(f["at"]) > 3 else ""
        lines.append(
            f"| `{f['op']}` | {f['calls']} | {f['reason']} | {f['conversions']} | {at}{more} |"
        )
    return lines


def _partition_section(parts: dict) -> list[str]:
    """Each delegated partition (ops, share of the model's operations) and every op the
    partitioner left to the portable kernels, with its reason."""
    total = parts["total_flops"]
    delegated = sum(p["flops"] for p in parts["partitions"])
    share = f"{delegated / total:.1%}" if total else "0%"
    lines = [
        "",
        f"## Delegated to {parts['backend']}",
        "",
        f"{len(parts['partitions'])} partition(s) hold {share} of the model's operations "
        f"({delegated:,} of {total:,}: multiply-adds count two, other ops one per element).",
    ]
    if parts["partitions"]:
        lines += ["", "| partition | ops | share of operations |", "|---|---|---|"]
        for i, p in enumerate(parts["partitions"]):
            ops = ", ".join(f"{op} x{n}" for op, n in p["ops"].items())
            lines.append(f"| {i} | {ops} | {p['share']:.1%} |")
    lines += ["", "Left to the portable kernels:", ""]
    if not parts["refused"]:
        return lines + ["None: the backend took every op."]
    lines += ["| op | calls | why | at |", "|---|---|---|---|"]
    for r in parts["refused"]:
        at = "<br>".join(f"`{w}`" for w in r["where"][:3])
        more = f" (+{len(r['where']) - 3} more)" if len(r["where"]) > 3 else ""
        lines.append(f"| `{r['op']}` | {r['calls']} | {r['reason']} | {at}{more} |")
    return lines


def render(ctx: Context) -> str:
    cfg = ctx.cfg
    a = ctx.artifacts
    plan = json.loads(ctx.read("memory_plan.json"))
    facts = a["emit_facts"]
    lines = [
        f"# etbuild report: {cfg.model.name}",
        "",
        f"- target: {cfg.target.name}",
        *_kernels_line(a),
        f"- quantization: {cfg.quant.scheme.value}",
        f"- partitioner: {cfg.partitioner.name}",
        "- inputs: "
        + ", ".join(
            f"{spec.name} {shape} {dtype}"
            for spec, (shape, dtype) in zip(cfg.model.inputs, a["program_inputs"], strict=False)
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
        f"| delegates | {facts['delegates']} blobs, {_kb(facts['delegate_bytes'])} |",
        "",
    ]
    lines += _memory_section(plan)
    lines += [
        "",
        "## Operators",
        "",
        "| operator | calls | dtypes |",
        "|---|---|---|",
    ]
    for key, info in a["selection"].items():
        dtypes = "; ".join(f"{arg}: {'/'.join(d)}" for arg, d in info["dtypes"].items())
        lines.append(f"| `{key}` | {info['count']} | {dtypes} |")
    if a.get("partitions"):
        lines += _partition_section(a["partitions"])
    if cfg.quant.scheme.value != "none":
        lines += _fp32_section(a["fp32_fallbacks"])
    sizes = a.get("runtime_sizes")
    if sizes:
        lines += _size_section(cfg, sizes)
    if sizes and "flash_bytes" in sizes:
        lines += _flash_section(sizes, facts["file_bytes"], plan["total_bytes"])
    if a.get("firmware"):
        lines += _firmware_section(a["firmware"], facts["file_bytes"])
    verify = a.get("verify")
    if verify:
        lines += ["", "## Verification on the etbuild runtime", "", "| what | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in verify.items()]
    lines += ["", "## Stage times", "", "| stage | seconds | summary |", "|---|---|---|"]
    for rec in ctx.records[:-1]:
        summary = ", ".join(f"{k}={v}" for k, v in rec.summary.items())
        lines.append(f"| {rec.name} | {rec.seconds:.3f} | {summary} |")
    return "\n".join(lines) + "\n"


def _capacity(n: int | None) -> str:
    return "unbounded" if n is None else _kb(n)


def _memory_section(plan: dict) -> list[str]:
    """Per bank: capacity, planned bytes, its peak-live bound, tensors and access cost; the
    planners side by side; the schedule's effect; the pictures."""
    sched = plan.get("schedule", {})
    lines = [
        "## Memory plan",
        "",
        f"Planner `{plan['planner']}`, alignment {plan['alignment']} B, "
        f"{plan['in_place_reuses']} outputs written in place over a dying input, "
        f"{plan.get('concat_in_place', 0)} concatenations done in place by their producers; "
        f"instruction order: {sched.get('order', 'program')}. Cost: bytes moved x the bank's "
        "relative cost per byte.",
        "",
        "| bank | capacity | planned | use | peak-live bound | tensors | cost |",
        "|---|---|---|---|---|---|---|",
    ]
    for bank in plan["banks"]:
        cap = bank.get("capacity_bytes")
        use = f"{bank['planned_bytes'] / cap:.0%}" if cap else "-"
        lines.append(
            f"| {bank['name']} | {_capacity(cap)} | {_kb(bank['planned_bytes'])} | {use} | "
            f"{_kb(bank.get('lower_bound_bytes', 0))} | {bank.get('tensors', '-')} | "
            f"{bank.get('cost', 0):,.0f} |"
        )
    constants = plan.get("constants")
    if constants:
        lines.append(
            f"| {constants['name']} (constants) | {_capacity(constants['capacity_bytes'])} | "
            f"{_kb(constants['constant_bytes'])} | "
            + (
                f"{constants['constant_bytes'] / constants['capacity_bytes']:.0%}"
                if constants["capacity_bytes"]
                else "-"
            )
            + " | - | - | - |"
        )
    bound = plan["lower_bound_bytes"]
    ratio = plan.get("tensor_bytes", plan["total_bytes"]) / bound if bound else 1.0
    lines += ["", f"Peak-live lower bound: {_kb(bound)}; the plan is {ratio:.3f}x of it."]
    if constants and constants.get("copied"):
        into = sorted({c["bank"] for c in constants["copied"]})
        lines.append(
            f"Constants copied at load (memory.constants=copy): {len(constants['copied'])} "
            f"tensors, {_kb(constants['copied_bytes'])} into {', '.join(into)}, after the "
            f"planned tensors; they save {constants['copied_cost_saved']:,.0f} of access "
            f"cost per call against reading them from {constants['name']}."
        )
    scratch = plan.get("scratch")
    if scratch:
        lines.append(
            f"Kernel scratch: {_kb(scratch['size'])} reserved in bank {scratch['bank']} "
            f"at offset {scratch['offset']}."
        )
    if sched:
        lines.append(
            f"Peak: {_kb(sched['peak_before'])} in the exported order with every copy, "
            f"{_kb(sched.get('peak_after_concat_in_place', sched['peak_before']))} with "
            f"concatenation in place, {_kb(sched['peak_after'])} as planned."
        )
    planners = plan.get("planners")
    if planners:
        lines += ["", "| planner | total | cost |", "|---|---|---|"]
        for name, r in planners.items():
            if r.get("fits"):
                lines.append(f"| `{name}` | {_kb(r['total_bytes'])} | {r['cost']:,.0f} |")
            else:
                lines.append(f"| `{name}` | does not fit | - |")
    lines += [""] + [f"![bank {b['name']}](memory_{b['name']}.png)" for b in plan["banks"]]
    return lines


def run(ctx: Context) -> None:
    ctx.write("report.md", render(ctx).encode())
