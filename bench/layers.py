"""Per layer against XNNPACK, inside the whole model: each convolution and linear layer's time
on etbuild's runtime next to the same layer's time in ExecuTorch+XNNPACK, at 1 thread and more.
Which layers are off the pace, and which scale worse than XNNPACK's.

The models are those of ``bench/kernels.py`` (same pipeline programs, same module exported to
ExecuTorch with the XNNPACK partitioner; int8: its XNNPACK quantizer on the same calibration
batches). Both run the whole model and time every operator of it:

- etbuild: the runtime's profiler (the native build's Python module,
  ``run(inputs, profile=True)``), in this process;
- XNNPACK: ExecuTorch's ETDump, which records each XNNPACK operator of the delegate call
  (``load_program(enable_etdump=True)``, read back with ``executorch.devtools.Inspector``), in
  one worker process per thread count (ExecuTorch's thread pool is process-wide).

Layers are paired in program order: etbuild's convolution, linear and matmul instructions
against XNNPACK's Convolution and Fully Connected operators (XNNPACK runs a 1x1 convolution as
a Fully Connected over the pixels). The two lists must have the same length, else the case is
skipped; where a model has parallel branches (ResNet's downsample convolutions), the two
runtimes may order them differently, and the shapes shown are etbuild's. The rest of each
runtime's time (elementwise ops, pooling, layout transposes, quantize/dequantize) is one line.

Each of ``--rounds`` rounds runs the model three times on each (runtime, thread count) in
turn, so that the samples of one round share the machine's state (a shared host's pace drifts
over seconds). Untimed runs go before each turn (at least 100 ms: kernels.warm_up), so that
idle threads the scheduler put on one core are spread again; the first run of each turn only
warms the caches (four copies of a model's weights do not all stay in L3). A layer's time is
the median of the other runs. The whole run's speed-up over one thread and its ratio to
XNNPACK are also given per round (median and p10-p90 of the per-round values): the paired form
of bench/threads.py's done-when quantities. ``--channels-last`` adds, after each fp32 case, the
same model lowered with channels-last activations (``pipeline.lower.channels_last=true``) against
the same XNNPACK program.

    pip install ".[bench]"
    python bench/layers.py [--models mobilenet resnet18] [--dtypes fp32 int8] [--threads 1 2]
        [--rounds 12] [--top 25] [--channels-last]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kernels as kb  # noqa: E402  (bench/kernels.py: cases, builds, checks)

WARMUP = 3  # runs of each side dropped before the medians
TURN = 3  # runs of one side in a row; the first of each turn is dropped (it warms the caches)
SETTLE_S = 0.02  # pause after each side's turn: its threads stop spinning before the other runs
ETB_LAYER_OPS = ("convolution", "conv2d", "linear", "addmm", "::mm.", "bmm")
XNN_LAYER_OPS = ("Convolution", "Fully Connected")


def is_etb_layer(name: str) -> bool:
    return any(k in name for k in ETB_LAYER_OPS)


def is_xnn_layer(name: str) -> bool:
    return name.startswith(XNN_LAYER_OPS)


# ---- XNNPACK with ETDump, in a worker process per thread count ---------------------------------


class XnnpackProfiler:
    """ExecuTorch+XNNPACK at `threads` threads in a process of its own (this script with
    --xnnpack-worker), its program loaded with ETDump on: ``run <k>`` runs it k times;
    ``dump <path>`` writes, as JSON, every operator's name and time (ms) of every run so far,
    in program order, and the whole delegate call's."""

    def __init__(self, pte: Path, inputs: Path, threads: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--xnnpack-worker", str(pte), str(inputs), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def ask(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if reply != "ok":
            raise RuntimeError(f"XNNPACK worker: {reply or 'exited'}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def xnnpack_worker(pte: str, inputs_path: str, threads: int) -> int:
    with kb.quiet():
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        portable_lib._unsafe_reset_threadpool(threads)  # before the delegate is initialized
        program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=0)
        method = program.load_method("forward")
        # A second copy without ETDump for the warm-up runs, which the dump must not hold.
        untraced = Runtime.get().load_program(pte).load_method("forward")
    inputs = torch.load(inputs_path)
    for line in sys.stdin:
        try:
            verb, arg = line.split(maxsplit=1)
            if verb == "run":
                kb.warm_up(lambda: untraced.execute(inputs))
                for _ in range(int(arg)):
                    method.execute(inputs)
            else:
                with kb.quiet():
                    from executorch.devtools import Inspector

                    etdp = arg.strip() + ".etdp"
                    program.write_etdump_result_to_file(etdp, etdp + ".debug")
                    inspector = Inspector(etdump_path=etdp)
                ops = [
                    (e.name, list(e.perf_data.raw))
                    for block in inspector.event_blocks
                    if block.name == "Execute"
                    for e in block.events
                    if e.perf_data is not None
                ]
                Path(arg.strip()).write_text(json.dumps(ops))
            print("ok", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"error {kb.short_error(exc)}", flush=True)
    return 0


# ---- measuring ---------------------------------------------------------------------------------


@dataclass
class Profile:
    """One runtime's per-operator times (ms, one per run) at one thread count."""

    names: list[str] = field(default_factory=list)
    runs: list[list[float]] = field(default_factory=list)  # per operator
    total: list[float] = field(default_factory=list)  # the whole model, per run

    def median(self, i: int) -> float:
        return statistics.median(kept(self.runs[i]))

    def total_ms(self) -> float:
        return statistics.median(kept(self.total))

    def round_totals(self) -> list[float]:
        """The whole run's time per round: the median of the round's kept runs."""
        rounds = (len(self.total) - WARMUP) // TURN
        return [statistics.median(self.total[WARMUP + r * TURN + 1 : WARMUP + (r + 1) * TURN])
                for r in range(rounds)]  # fmt: skip


def kept(runs: list[float]) -> list[float]:
    """The runs after the warm-up, but the first of each turn."""
    out = [v for i, v in enumerate(runs[WARMUP:]) if i % TURN != 0]
    return out or runs


def etb_profile(prog, inputs: list[torch.Tensor], runs: int, into: Profile) -> None:
    kb.warm_up(lambda: prog.run(inputs))
    for _ in range(runs):
        prog.run(inputs, profile=True)
        events = prog.last_profile
        if not into.names:
            into.names = [name for name, _ in events]
            into.runs = [[] for _ in events]
        for i, (_, seconds) in enumerate(events):
            into.runs[i].append(seconds * 1e3)
        into.total.append(sum(s for _, s in events) * 1e3)


def xnn_profile(path: Path) -> Profile:
    ops = json.loads(path.read_text())
    p = Profile()
    for name, times in ops:
        if name in ("DELEGATE_CALL",):
            p.total = times
        elif name not in ("Method::execute",):
            p.names.append(name)
            p.runs.append(times)
    return p


@dataclass
class CaseResult:
    case: kb.Case
    etb: dict[int, Profile] = field(default_factory=dict)
    xnn: dict[int, Profile] = field(default_factory=dict)
    error: str = ""


def measure(case: kb.Case, mod, threads: list[int], work: Path, rounds: int) -> CaseResult:
    """Each round runs the model TURN times on each (runtime, thread count), in turn: pairs
    taken within a round share the machine's state (on a shared host its pace drifts over
    seconds)."""
    result = CaseResult(case)
    pte, _ = kb.xnnpack_program(case)
    inputs = work / f"{case.name.replace('/', '_')}_inputs.pt"
    torch.save(list(case.inputs), inputs)
    progs = {t: mod.load(str(case.pte), threads=t) for t in threads}
    workers = {t: XnnpackProfiler(pte, inputs, t) for t in threads}
    try:
        for t in threads:
            result.etb[t] = Profile()
            etb_profile(progs[t], case.inputs, WARMUP, result.etb[t])
            workers[t].ask(f"run {WARMUP}")
        for _ in range(rounds):
            for t in threads:
                etb_profile(progs[t], case.inputs, TURN, result.etb[t])
                time.sleep(SETTLE_S)
                workers[t].ask(f"run {TURN}")
                time.sleep(SETTLE_S)
        for t in threads:
            out = work / f"{case.name.replace('/', '_')}_xnn_{t}.json"
            workers[t].ask(f"dump {out}")
            result.xnn[t] = xnn_profile(out)
    except Exception as exc:  # noqa: BLE001
        result.error = kb.short_error(exc)
    finally:
        for w in workers.values():
            w.close()
    return result


# ---- reporting ---------------------------------------------------------------------------------


def report(r: CaseResult, threads: list[int], top: int) -> None:
    case = r.case
    kb.log(f"\n== {case.name}")
    if r.error:
        kb.log(f"   error: {r.error}")
        return
    e1, x1 = r.etb[1], r.xnn[1]
    etb_layers = [i for i, n in enumerate(e1.names) if is_etb_layer(n)]
    xnn_layers = [i for i, n in enumerate(x1.names) if is_xnn_layer(n)]
    if len(etb_layers) != len(xnn_layers):
        kb.log(f"   {len(etb_layers)} etbuild layers against {len(xnn_layers)} XNNPACK layers: "
               "cannot pair them")  # fmt: skip
        return
    instrs = list(getattr(case.program, "instructions", []) or [])
    aligned = len(instrs) == len(e1.names)
    more = [t for t in threads if t != 1]
    head = f"   {'#':>3} {'etbuild layer':<44} {'XNNPACK op':<24}{'etb@1':>7}{'xnn@1':>7}{'e/x':>6}"
    for t in more:
        head += f"{f'etb x{t}':>7}{f'xnn x{t}':>7}{f'e/x@{t}':>7}"
    head += f"{'lost':>7}"
    rows = []
    for ei, xi in zip(etb_layers, xnn_layers, strict=True):
        desc = kb.describe(instrs[ei]) if aligned else e1.names[ei]
        xname = x1.names[xi].split(" #")[0].replace("Fully Connected", "FC")
        a, b = e1.median(ei), x1.median(xi)
        line = f"   {ei:>3} {desc[:44]:<44} {xname[:24]:<24}{a:7.3f}{b:7.3f}{a / b:6.2f}"
        for t in more:
            at, bt = r.etb[t].median(ei), r.xnn[t].median(xi)
            line += f"{a / at:7.2f}{b / bt:7.2f}{at / bt:7.2f}"
        worst = max([a - b] + [r.etb[t].median(ei) - r.xnn[t].median(xi) for t in more])
        rows.append((worst, line + f"{worst:7.3f}"))
    kb.log(head + "   (lost: ms behind XNNPACK at the worst thread count)")
    for _, line in sorted(rows, reverse=True)[:top]:
        kb.log(line)
    for t in threads:
        e, x = r.etb[t], r.xnn[t]
        el = sum(e.median(i) for i in etb_layers)
        xl = sum(x.median(i) for i in xnn_layers)
        eo = sum(e.median(i) for i in range(len(e.names))) - el
        xo = sum(x.median(i) for i in range(len(x.names))) - xl
        kb.log(f"   @{t}: layers etb {el:.2f} ms, xnn {xl:.2f} ms ({el / xl:.2f}); "
               f"the rest etb {eo:.2f}, xnn {xo:.2f}; whole run etb {e.total_ms():.2f}, "
               f"xnn {x.total_ms():.2f} ({e.total_ms() / x.total_ms():.2f})")  # fmt: skip
    for t in more:
        e1t, et = r.etb[1].round_totals(), r.etb[t].round_totals()
        x1t, xt = r.xnn[1].round_totals(), r.xnn[t].round_totals()
        n = min(len(e1t), len(et), len(x1t), len(xt))
        if n == 0:
            continue
        ex = [e1t[i] / et[i] for i in range(n)]
        xx = [x1t[i] / xt[i] for i in range(n)]
        change = [(et[i] / xt[i]) / (e1t[i] / x1t[i]) for i in range(n)]
        kb.log(f"   per round, whole run: etb x{t} {pct(ex)}, xnn x{t} {pct(xx)}; "
               f"(etb/xnn@{t}) / (etb/xnn@1) {pct(change)}")  # fmt: skip


def pct(values: list[float]) -> str:
    """Median [p10-p90]."""
    v = sorted(values)
    at = lambda q: v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]  # noqa: E731
    return f"{statistics.median(v):.2f} [{at(0.1):.2f}-{at(0.9):.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet", "resnet18"])
    parser.add_argument("--dtypes", nargs="+", default=list(kb.DTYPES), choices=kb.DTYPES)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=12, help="rounds (a turn of each side)")
    parser.add_argument("--top", type=int, default=25, help="layers shown per case")
    parser.add_argument(
        "--channels-last",
        action="store_true",
        help="each fp32 case also built with pipeline.lower.channels_last=true (model/fp32/nhwc)",
    )
    parser.add_argument("--xnnpack-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.xnnpack_worker:
        pte, inputs, threads = args.xnnpack_worker
        return xnnpack_worker(pte, inputs, int(threads))
    if 1 not in args.threads:
        parser.error("--threads must include 1 (the speed-ups are over one thread)")
    if why := kb.peer_available("xnnpack"):
        parser.error(f"ExecuTorch is needed: {why}")

    torch.set_num_threads(1)
    from etbuild.pipeline.config import register_configs

    register_configs()
    info = kb.cpu_info()
    kb.log(f"machine: {info['model']}, {os.cpu_count()} cores, {platform.machine()}; ISA "
           f"{kb.machine_isa(info['flags'])}; threads {args.threads}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="etb_layers_") as wd:
        work = Path(wd)
        cases = kb.build_cases(args.models, args.dtypes, work, "ptq", args.channels_last)
        build = kb.build_runtimes(["native"], cases, work, profile=True)["native"]
        if build.error or build.module is None:
            kb.log(f"etbuild runtime: {build.error or 'no Python module'}")
            return 1
        for case in cases:
            r = measure(case, build.module, args.threads, work, args.rounds)
            report(r, args.threads, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
