"""The `verify` stage: run model.pte with the runner the build stage built for the target
(natively, or under qemu for linux_aarch64) and compare with eager. Where the target cannot
run here (android, cortex_m), the report says the runtime was built but not run.

``kernel_isa`` is the kernels' SIMD path (avx512, avx2, sse2, neon, scalar) as the runner
reports it; for a target that cannot run here, the path its compile flags give (build stage).
The runner runs at ``target.threads`` (``--threads``); ``threads`` is the count it reports.
``latency``: the runner's median, p10 and p90 over ``pipeline.verify.latency_iters`` runs of the
reference input (after one warm-up run); under qemu 2 runs and no warm-up, flagged as emulated.

fp32 programs must match the eager outputs within ``pipeline.verify.tolerance`` x max|eager|.
Quantized programs are measured instead: SQNR (dB) against the fp32 eager model and top-1
agreement over the reference input plus ``pipeline.verify.eval_inputs`` more random inputs;
``quant.min_sqnr_db`` fails the build below it.
"""

from __future__ import annotations

import io
import math
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from .. import etbt
from ..config import QuantScheme, TargetKind
from ..errors import EtbuildError
from ..runner import Context, sha256_file


def scratch_peak(console: str) -> int | None:
    """The runner's or firmware's "scratch_peak: N" line: the most kernel scratch bytes one
    instruction used (what a fixed memory.scratch_bytes reservation must cover)."""
    found = re.search(r"^scratch_peak: (\d+)", console, re.M)
    return int(found.group(1)) if found else None


class BuiltRunner:
    """The build stage's ``etb_runner`` for one program, run once per input set."""

    def __init__(self, runner: Path, program: Path, prefix: list[str], threads: int = 1) -> None:
        self.runner, self.program, self.prefix, self.threads = runner, program, prefix, threads
        self.kernel_isa = ""  # the runner's "kernel_isa: <path>" line, after a run
        self.ran_threads = 0  # the runner's "threads: N" line, after a run
        self.latency = ""  # the runner's latency line, after a run of several iterations
        self.latency_ms: dict[str, float] = {}  # its numbers: median, p10, p90, runs
        self.scratch_peak: int | None = None  # the runner's "scratch_peak: N" line

    def run(
        self, inputs: list[torch.Tensor], iters: int = 1, warmup: int = 0
    ) -> list[torch.Tensor]:
        # In the run directory, where a killed run's leftovers are removed by the next run.
        with tempfile.TemporaryDirectory(dir=self.program.parent, prefix=".verify.") as tmp:
            d = Path(tmp)
            cmd = [*self.prefix, str(self.runner), str(self.program)]
            for i, t in enumerate(inputs):
                etbt.write(d / f"input_{i}.etbt", t)
                cmd += ["--input", str(d / f"input_{i}.etbt")]
            cmd += ["--iters", str(iters), "--warmup", str(warmup), "--threads", str(self.threads)]
            cmd += ["--output-dir", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise EtbuildError(
                    f"the built runner could not run model.pte: {proc.stderr.strip()} "
                    f"(command: {' '.join(cmd)})"
                )
            isa = re.search(r"^kernel_isa: (\S+)$", proc.stdout, re.M)
            self.kernel_isa = isa.group(1) if isa else "unknown"
            threads = re.search(r"^threads: (\d+)$", proc.stdout, re.M)
            self.ran_threads = int(threads.group(1)) if threads else 0
            self.scratch_peak = scratch_peak(proc.stdout)
            latency = re.search(
                r"^latency_ms: median=(\S+) p10=(\S+) p90=(\S+) iters=(\d+)$", proc.stdout, re.M
            )
            if latency and iters > 1:
                median, p10, p90, n = latency.groups()
                self.latency = f"{median} ms median (p10 {p10}, p90 {p90}; {n} runs)"
                self.latency_ms = {
                    "median": float(median),
                    "p10": float(p10),
                    "p90": float(p90),
                    "runs": int(n),
                }
            outs = sorted(d.glob("output_*.etbt"), key=lambda p: int(p.stem.split("_")[1]))
            return [etbt.read(p) for p in outs]


def sqnr_db(signal: torch.Tensor, test: torch.Tensor) -> float:
    noise = (signal.double() - test.double()).pow(2).mean().item()
    power = signal.double().pow(2).mean().item()
    return math.inf if noise == 0 else 10 * math.log10(power / noise)


def _check_fp32(outputs, expected, tolerance: float) -> dict:
    worst = 0.0
    for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
        if got.shape != want.shape or got.dtype != want.dtype:
            raise EtbuildError(
                f"verification failed: output {i} is {got.dtype} {list(got.shape)}, eager gives "
                f"{want.dtype} {list(want.shape)}"
            )
        scale = want.abs().max().item() if want.numel() else 0.0
        err = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
        rel = err / scale if scale else err
        worst = max(worst, rel)
        if rel > tolerance:
            raise EtbuildError(
                f"verification failed: output {i} differs from the eager model by max abs error "
                f"{err:.3g} = {rel:.3g} x max|eager| ({scale:.3g}), above "
                f"pipeline.verify.tolerance={tolerance:g}"
            )
    return {"max_rel_error": float(f"{worst:.3g}")}


def _measure_quantized(program: BuiltRunner, reference: dict, outputs) -> dict:
    got, want = [outputs[0]], [reference["outputs"][0]]
    for inputs, expected in zip(reference["eval_inputs"], reference["eval_outputs"], strict=True):
        got.append(program.run(list(inputs))[0])
        want.append(expected[0])
    got_all, want_all = (
        torch.cat([g.flatten(0, -2) for g in got]),
        torch.cat([w.flatten(0, -2) for w in want]),
    )
    facts = {
        "sqnr_db": round(sqnr_db(want_all, got_all), 2),
        "top1_agreement": round(
            (got_all.argmax(-1) == want_all.argmax(-1)).float().mean().item(), 4
        ),
        "eval_samples": int(got_all.shape[0]),
    }
    converted = reference.get("converted_outputs")
    if converted is not None:
        diff = (outputs[0] - converted[0]).abs().max().item()
        facts["max_abs_diff_vs_converted"] = float(f"{diff:.3g}")
    return facts


def _check_sqnr(ctx: Context, facts: dict) -> None:
    floor = ctx.cfg.quant.min_sqnr_db
    if floor is not None and facts["sqnr_db"] < floor:
        raise EtbuildError(
            f"the quantized program's SQNR against fp32 is {facts['sqnr_db']} dB, below "
            f"quant.min_sqnr_db={floor}; keep sensitive layers in fp32 (quant.keep_fp32), "
            "calibrate on more or better data, or try quant=qat"
        )


def run(ctx: Context) -> None:
    vcfg = ctx.cfg.pipeline.verify
    if not vcfg.enabled:
        ctx.summarize(skipped="pipeline.verify.enabled=false")
        return
    tc = ctx.artifacts["toolchain"]
    if tc.kind == TargetKind.cortex_m and tc.board and tc.runnable:
        _verify_firmware(ctx, tc)
        return
    if not tc.runnable:  # a firmware without qemu-system-arm, or a target nothing here runs
        skipped = tc.kind == TargetKind.cortex_m and tc.board
        facts = {
            "status": f"skipped: {tc.not_runnable_reason}"
            if skipped
            else f"built, not run ({tc.not_runnable_reason})",
            "kernel_isa": f"{ctx.artifacts['kernel_isa']} (the target's path from its compile "
            "flags; not run)",
        }
        ctx.artifacts["verify"] = facts
        ctx.summarize(**facts)
        return
    path = ctx.run_dir / "model.pte"
    runner = ctx.artifacts["runner"]
    ctx.note_read("model.pte", sha256_file(path))
    ctx.note_read("runtime/bin/etb_runner", sha256_file(runner))
    program = BuiltRunner(runner, path, tc.run_prefix, tc.threads)
    reference = torch.load(io.BytesIO(ctx.read("reference.pt")), weights_only=True)
    inputs, expected = reference["inputs"], reference["outputs"]
    # The reference run also times the program. Under an emulator the time says little about
    # the device, and each run is slow: a few runs, flagged.
    emulated = bool(tc.run_prefix)
    iters = min(vcfg.latency_iters, 2) if emulated else vcfg.latency_iters
    outputs = program.run(inputs, iters=iters, warmup=1 if iters > 1 and not emulated else 0)
    if len(outputs) != len(expected):
        raise EtbuildError(
            f"verification failed: the program returns {len(outputs)} outputs, eager "
            f"{len(expected)}"
        )
    status = "ran" + (f" under {Path(tc.run_prefix[0]).name}" if tc.run_prefix else "")
    if QuantScheme(ctx.cfg.quant.scheme) == QuantScheme.none:
        measured = _check_fp32(outputs, expected, vcfg.tolerance)
    else:
        measured = _measure_quantized(program, reference, outputs)
    facts = {
        "status": status,
        "kernel_isa": program.kernel_isa,
        "threads": program.ran_threads,
        **measured,
        **_scratch_fact(program.scratch_peak),
    }
    if program.latency:
        facts["latency"] = program.latency + (
            " (emulated: not the device's speed)" if emulated else ""
        )
    ctx.artifacts["verify"] = facts
    ctx.summarize(**facts)
    if program.latency_ms:
        ctx.measure(latency_ms={**program.latency_ms, "emulated": emulated})
    _measure(ctx, facts)


def _measure(ctx: Context, facts: dict) -> None:
    """Record the numbers that compare builds; a quantized build below its SQNR floor fails."""
    ctx.measure(
        **{
            k: facts[k]
            for k in ("max_rel_error", "sqnr_db", "top1_agreement", "scratch_peak_bytes")
            if k in facts
        }
    )
    if "sqnr_db" in facts:
        _check_sqnr(ctx, facts)


def _scratch_fact(peak: int | None) -> dict:
    return {} if peak is None else {"scratch_peak_bytes": peak}


class FirmwareRunner:
    """The build stage's board firmware, run once per input set under qemu-system-arm."""

    def __init__(self, ctx: Context, tc) -> None:
        from .. import firmware

        self.firmware = firmware
        self.board = firmware.load_board(tc.board)
        self.qemu, self.elf, self.work = tc.qemu, ctx.artifacts["firmware_elf"], ctx.run_dir
        self.timeout_s = float(ctx.cfg.pipeline.verify.timeout_s)
        self.console = ""

    def run(self, inputs: list[torch.Tensor], iters: int = 1, warmup: int = 0):
        done = self.firmware.run(self.qemu, self.board, self.elf, inputs, self.work, self.timeout_s)
        self.console = done.console
        return done.outputs


def _check_lowered(outputs, reference: dict, tolerance: float) -> dict:
    """A quantized program's outputs against the lowered graph's reference execution (its
    int8 ops' Python specification). The int8 kernels match it exactly; an fp32 op left
    inside the program may differ by its libm's last bits, so the difference may reach
    ``tolerance`` x max|reference| (pipeline.verify.tolerance), no more."""
    lowered = reference.get("lowered_outputs")
    if lowered is None:
        raise EtbuildError(
            "reference.pt has no lowered_outputs (it was written by an older etbuild); rerun "
            "with pipeline.cache=false"
        )
    worst = 0.0
    for i, (got, want) in enumerate(zip(outputs, lowered, strict=True)):
        if got.shape != want.shape or got.dtype != want.dtype:
            raise EtbuildError(
                f"verification failed: output {i} is {got.dtype} {list(got.shape)}, the lowered "
                f"graph's reference execution gives {want.dtype} {list(want.shape)}"
            )
        diff = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
        scale = want.double().abs().max().item() if want.numel() else 0.0
        worst = max(worst, diff)
        if diff > tolerance * scale:
            raise EtbuildError(
                f"verification failed: output {i} differs from the lowered graph's reference "
                f"execution by up to {diff:.3g} (max|reference| {scale:.3g}), above "
                f"pipeline.verify.tolerance={tolerance:g} of it; the int8 kernels must match it"
            )
    return {"max_abs_diff_vs_lowered": worst}


def _verify_firmware(ctx: Context, tc) -> None:
    """cortex_m: run the firmware under qemu-system-arm on the reference inputs; fp32 against
    eager within the tolerance, int8 exactly against the lowered graph's reference execution
    (and SQNR against fp32 over the evaluation inputs, as on the host)."""
    vcfg = ctx.cfg.pipeline.verify
    ctx.note_read("model.pte", sha256_file(ctx.run_dir / "model.pte"))
    ctx.note_read("firmware/firmware.elf", sha256_file(ctx.artifacts["firmware_elf"]))
    program = FirmwareRunner(ctx, tc)
    reference = torch.load(io.BytesIO(ctx.read("reference.pt")), weights_only=True)
    inputs, expected = reference["inputs"], reference["outputs"]
    outputs = program.run(inputs)
    if len(outputs) != len(expected):
        raise EtbuildError(
            f"verification failed: the firmware wrote {len(outputs)} outputs, eager gives "
            f"{len(expected)}"
        )
    if QuantScheme(ctx.cfg.quant.scheme) == QuantScheme.none:
        measured = _check_fp32(outputs, expected, vcfg.tolerance)
    else:
        measured = {
            **_check_lowered(outputs, reference, vcfg.tolerance),
            **_measure_quantized(program, reference, outputs),
        }
    status = f"ran under {Path(tc.qemu).name} -M {program.board.qemu_machine}"
    facts = {
        "status": status,
        "kernel_isa": f"{ctx.artifacts['kernel_isa']} (the target's path from its compile flags)",
        "threads": 1,
        **measured,
        **_scratch_fact(scratch_peak(program.console)),
        "latency": "not measured (qemu does not model the board's timing)",
    }
    ctx.artifacts["verify"] = facts
    ctx.summarize(**{k: v for k, v in facts.items() if k != "latency"})
    _measure(ctx, facts)
