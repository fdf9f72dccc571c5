"""Threads: etbuild's runtime at 1, 2, ... threads against ExecuTorch+XNNPACK at the same count.

Three ways to run each case: etbuild's portable kernels (``etbuild``), etbuild with its XNNPACK
delegate (``etb+xnn``: the pipeline with ``+partitioner=xnnpack``, on the system's XNNPACK, a
2022 snapshot on Debian), ExecuTorch with its XNNPACK (``xnnpack``, a recent one), and torch
eager (``eager``, ``torch.set_num_threads(T)``).

One run on this machine, batch 1, MobileNetV2 and ResNet18 (``--models``), fp32 and int8
(``+quant=ptq``; XNNPACK: ExecuTorch's XNNPACK quantizer on the same module and calibration).
etbuild's runtime is built for the machine (``target.march=native``) by the pipeline, and run
as ``etb_runner --threads T``, one process per sample. ExecuTorch's thread pool is
process-wide, so XNNPACK runs in one worker process per thread count, started once and asked
for a sample in turn; each sample of a long-lived process (XNNPACK, eager) follows 100 ms
of untimed runs, as each etb_runner process runs 10 first. Timing is interleaved: in each of
``--rounds`` rounds every (runtime, threads) pair of a cell runs in turn, so machine noise hits
all alike; a time is the median over rounds of the per-round medians. Every output is
checked against torch eager first.

Printed per cell: ms at each thread count, each runtime's speed-up over its own 1-thread time,
and etbuild / XNNPACK at each thread count (< 1: etbuild is faster); then the same quantities
per round, from samples of one round (median and range over rounds: how much of a verdict is
the host's noise). ``--profile`` adds, per
case, the layers that scale worst: each instruction's time at 1 thread and at the highest
count (the runtime's profiler, etbuild.runtime ``run(..., profile=True)``), sorted by the time
it loses against a perfect split. ``--channels-last`` adds, after each fp32 case, the same model
lowered with channels-last activations (``pipeline.lower.channels_last=true``; XNNPACK's program
is the same).

    pip install ".[bench]"
    python bench/threads.py [--models mobilenet resnet18] [--dtypes fp32 int8]
        [--threads 1 2] [--iters 30] [--rounds 6] [--profile] [--top 12] [--channels-last]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kernels as kb  # noqa: E402  (bench/kernels.py: cases, builds, checks)

RUNTIMES = ("etbuild", "etb+xnn", "xnnpack", "eager")


def delegated_case(case: kb.Case, work: Path) -> tuple[kb.Case, kb.Build]:
    """The case built with ``+partitioner=xnnpack`` (runtime and program), verify off."""
    import dataclasses

    from etbuild.pipeline.runner import run_stages
    from etbuild.pipeline.stage_cache import StageCache, cache_root
    from etbuild.pipeline.stages import STAGES

    overrides = [*case.overrides, "+partitioner=xnnpack", "build.compare_all_ops=false"]
    overrides += ["build.wheel=false", "pipeline.verify.enabled=false", "pipeline.stop_after=build"]
    cfg = kb.compose(overrides)
    run_dir = work / f"{case.model}_{case.dtype}_xnnpack"
    cache = StageCache(cache_root(cfg))
    with kb.quiet():
        run_stages(STAGES, cfg, run_dir, stop_after="build", log=lambda _: None, cache=cache)
    build = kb.Build("xnnpack", runner=run_dir / "runtime" / "bin" / "etb_runner")
    build.threads_flag = True
    return dataclasses.replace(case, run_dir=run_dir, pte=run_dir / "model.pte"), build


ROUND_TRIP_SOURCE = r"""
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
alignas(64) std::atomic<int> ping{0};
alignas(64) std::atomic<int> pong{0};
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
// One float of every cache line of x.
float touch(const std::vector<float>& x) {
  float s = 0;
  for (size_t i = 0; i < x.size(); i += 16) s += x[i];
  return s;
}
// A memory-bound layer at `threads` threads: y = a x + b over 64 planes of 56x56 (0.8 MB),
// back and forth between two tensors, the threads synchronized after each pass as a kernel
// call's are. Split by rows of every plane (NCHW by pixels: the threads' data meet in every
// plane) or in contiguous halves (one meeting point). The median seconds a pass.
double pass_time(int threads, bool halves) {
  const long C = 64, P = 56 * 56, rows = 56;
  std::vector<float> x(C * P, 1.f), y(C * P, 1.f);
  std::atomic<int> arrived{0}, generation{0};
  const int passes = 301;
  std::vector<double> t;
  auto body = [&](int thread) {
    for (int p = 0; p < passes; ++p) {
      const float* src = p % 2 ? y.data() : x.data();
      float* dst = p % 2 ? x.data() : y.data();
      Clock::time_point t0 = Clock::now();
      if (halves) {
        const long i0 = C * P * thread / threads, i1 = C * P * (thread + 1) / threads;
        for (long i = i0; i < i1; ++i) dst[i] = src[i] * 0.999f + 0.001f;
      } else {
        const long r0 = rows * thread / threads * 56, r1 = rows * (thread + 1) / threads * 56;
        for (long c = 0; c < C; ++c)
          for (long i = c * P + r0; i < c * P + r1; ++i) dst[i] = src[i] * 0.999f + 0.001f;
      }
      if (arrived.fetch_add(1) + 1 == threads) {
        arrived.store(0);
        generation.fetch_add(1);
      } else {
        while (generation.load() == p) {}
      }
      if (thread == 0) t.push_back(seconds(t0));
    }
  };
  std::thread other;
  if (threads > 1) other = std::thread(body, 1);
  body(0);
  if (threads > 1) other.join();
  std::sort(t.begin(), t.end());
  return t[passes / 2];
}
int main() {
  // The round trip of a cache line between the two threads.
  const int n = 100000;
  std::thread other([] {
    for (int i = 1; i <= n; ++i) {
      while (ping.load(std::memory_order_acquire) != i) {}
      pong.store(i, std::memory_order_release);
    }
  });
  auto t0 = Clock::now();
  for (int i = 1; i <= n; ++i) {
    ping.store(i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) {}
  }
  double s = seconds(t0);
  other.join();
  // Reading 1.8 MB (a MobileNetV2 activation) that the other thread wrote, against as much
  // that this thread wrote: the cost of a layer reading another thread's output.
  const int reps = 31;
  std::vector<float> mine(460800), theirs(460800);
  std::vector<double> local, remote;
  volatile float sink = 0;
  ping = 0;
  pong = 0;
  std::thread writer([&] {
    for (int r = 1; r <= reps; ++r) {
      while (ping.load(std::memory_order_acquire) != r) {}
      std::fill(theirs.begin(), theirs.end(), float(r));
      pong.store(r, std::memory_order_release);
    }
  });
  for (int r = 1; r <= reps; ++r) {
    std::fill(mine.begin(), mine.end(), float(r));
    ping.store(r, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != r) {}
    t0 = Clock::now();
    sink = sink + touch(mine);
    local.push_back(seconds(t0));
    t0 = Clock::now();
    sink = sink + touch(theirs);
    remote.push_back(seconds(t0));
  }
  writer.join();
  std::sort(local.begin(), local.end());
  std::sort(remote.begin(), remote.end());
  printf("%.0f %.2f %.2f %.2f\n", s / n * 1e9, remote[reps / 2] / local[reps / 2],
         pass_time(1, false) / pass_time(2, false), pass_time(1, true) / pass_time(2, true));
}
"""


def round_trip_probe(work: Path) -> Path | None:
    """A program that prints the time (ns) for a cache line to go from one thread to another
    and back, and how much longer one thread takes to read 1.8 MB that the other wrote than
    1.8 MB that it wrote. On a virtual machine the host may move the vCPUs between cores that
    share a cache and cores that do not (on an EPYC: a round trip of ~120 ns vs ~550 ns, and
    reads of the other's writes 1.1x vs 2.5x), and a 2-thread time moves with it; printed per
    cell so that a reader can tell which the cell ran on. (The round trip alone once read
    124-172 ns while MobileNetV2 ran at its slow-placement times.)

    It also prints how much faster 2 threads make a memory-bound pass over 64 planes of 56x56
    than 1, split as the runtime's NCHW kernels split a plane by pixels (rows of every plane)
    and in contiguous halves (as a pixel split of NHWC would be): x1.8-1.9 and x1.95 on cores
    that share a cache, x1.1 and x1.95 where reading the other's writes took 2.7x as long."""
    if (os.cpu_count() or 1) < 2:  # the two threads would take turns on one core
        return None
    src, exe = work / "round_trip.cpp", work / "round_trip"
    src.write_text(ROUND_TRIP_SOURCE)
    try:
        subprocess.run([kb.compiler(), "-O2", "-std=c++17", "-pthread", str(src), "-o", str(exe)],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return exe


def round_trip_ns(probe: Path | None) -> str:
    if probe is None:
        return "?"
    try:
        p = subprocess.run([str(probe)], capture_output=True, text=True, timeout=30)
        ns, ratio, rows, halves = p.stdout.split()[:4]
        return (f"{int(ns)} ns (other's writes read {float(ratio):.1f}x; a memory-bound pass "
                f"at 2 threads x{float(rows):.2f} split by plane rows, "
                f"x{float(halves):.2f} by halves)")  # fmt: skip
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return "?"


class EagerAt(kb.EagerTimed):
    """torch eager at `threads` intra-op threads (set before each sample: cells interleave)."""

    def __init__(self, case: kb.Case, threads: int) -> None:
        super().__init__(case)
        self.threads = threads

    def sample(self, k: int) -> float:
        torch.set_num_threads(self.threads)
        try:
            kb.warm_up(self.call)
            return super().sample(k)
        finally:
            torch.set_num_threads(1)


class XnnpackWorker(kb.Timed):
    """ExecuTorch+XNNPACK at `threads` threads in a process of its own (this script run with
    --xnnpack-worker), answering one request per line: ``<k>`` -> the median ms of k runs,
    ``out <path>`` -> the first output saved with torch.save. Each sample is warmed up first
    (kb.warm_up)."""

    def __init__(self, case: kb.Case, threads: int, work: Path) -> None:
        path, _facts = kb.xnnpack_program(case)
        inputs = work / f"{case.name.replace('/', '_')}_inputs.pt"
        torch.save(list(case.inputs), inputs)
        self.work = work
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--xnnpack-worker", str(path), str(inputs), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def _ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply or reply.startswith("error"):
            raise RuntimeError(f"XNNPACK worker: {reply or 'exited'}")
        return reply

    def sample(self, k: int) -> float:
        return float(self._ask(str(k)))

    def output(self) -> torch.Tensor:
        path = self.work / f"xnnpack_out_{os.getpid()}_{id(self)}.pt"
        self._ask(f"out {path}")
        return torch.load(path)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def xnnpack_worker(pte: str, inputs_path: str, threads: int) -> int:
    """The worker's side of XnnpackWorker."""
    import time

    with kb.quiet():
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        portable_lib._unsafe_reset_threadpool(threads)  # before the delegate is initialized
        method = Runtime.get().load_program(pte).load_method("forward")
    inputs = torch.load(inputs_path)
    for line in sys.stdin:
        try:
            if line.startswith("out "):
                torch.save(method.execute(inputs)[0], line[4:].strip())
                print("ok", flush=True)
                continue
            kb.warm_up(lambda: method.execute(inputs))
            times = []
            for _ in range(int(line)):
                t0 = time.perf_counter()
                method.execute(inputs)
                times.append((time.perf_counter() - t0) * 1e3)
            print(statistics.median(times), flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"error {kb.short_error(exc)}", flush=True)
    return 0


def scaling_profile(case: kb.Case, build: kb.Build, threads: int, top: int, reps: int = 9):
    """The instructions that lose the most time at `threads` threads against a perfect split
    of their 1-thread time, and the loss per operator."""
    per = {}
    for t in (1, threads):
        prog = build.module.load(str(case.pte), threads=t)
        for _ in range(3):
            prog.run(case.inputs)  # warm-up: workers awake, weights packed
        runs = []
        for _ in range(reps):
            prog.run(case.inputs, profile=True)
            runs.append(prog.last_profile)
        per[t] = [statistics.median(r[i][1] for r in runs) for i in range(len(runs[0]))]
        names = [e[0] for e in runs[0]]
    instrs = list(getattr(case.program, "instructions", []) or [])
    rows = []
    for i, name in enumerate(names):
        one, many = per[1][i], per[threads][i]
        desc = kb.describe(instrs[i]) if len(instrs) == len(names) else ""
        rows.append((many - one / threads, i, name, one, many, desc))
    total1, totalt = sum(per[1]), sum(per[threads])
    lost = sum(r[0] for r in rows)
    kb.log(
        f"\n-- {case.name}: {total1 * 1e3:.2f} ms at 1 thread, {totalt * 1e3:.2f} ms at {threads} "
        f"(x{total1 / totalt:.2f}); {lost * 1e3:.2f} ms lost against a perfect split"
    )
    kb.log(f"   {'#':>4} {'op':<34} {'ms@1':>7} {f'ms@{threads}':>7} {'x':>5} {'lost':>6}  shapes")
    for loss, i, name, one, many, desc in sorted(rows, reverse=True)[:top]:
        x = one / many if many > 0 else 0.0
        kb.log(f"   {i:>4} {name[:34]:<34} {one * 1e3:7.3f} {many * 1e3:7.3f} {x:5.2f} "
               f"{loss * 1e3:6.3f}  {desc}")  # fmt: skip
    by_op: dict[str, list[float]] = {}
    for loss, _, name, one, many, _ in rows:
        acc = by_op.setdefault(name, [0.0, 0.0, 0.0])
        acc[0], acc[1], acc[2] = acc[0] + loss, acc[1] + one, acc[2] + many
    kb.log("   lost per op: " + ", ".join(
        f"{n} {v[0] * 1e3:.2f} ms (x{v[1] / v[2]:.2f})"
        for n, v in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:6] if v[2] > 0
    ))  # fmt: skip


def fmt_ms(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet", "resnet18"])
    parser.add_argument("--dtypes", nargs="+", default=list(kb.DTYPES), choices=kb.DTYPES)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--iters", type=int, default=30, help="timed runs per runtime per cell")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    parser.add_argument("--profile", action="store_true", help="the layers that scale worst")
    parser.add_argument(
        "--channels-last",
        action="store_true",
        help="each fp32 case also built with pipeline.lower.channels_last=true (model/fp32/nhwc)",
    )
    parser.add_argument("--top", type=int, default=12, help="instructions shown per profile")
    parser.add_argument("--xnnpack-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.xnnpack_worker:
        pte, inputs, threads = args.xnnpack_worker
        return xnnpack_worker(pte, inputs, int(threads))
    if 1 not in args.threads:
        parser.error("--threads must include 1 (the speed-ups are over one thread)")

    torch.set_num_threads(1)
    from etbuild.pipeline.config import register_configs

    register_configs()
    info = kb.cpu_info()
    kb.log(
        f"machine: {info['model']}, {os.cpu_count()} cores, {platform.machine()}; ISA "
        f"{kb.machine_isa(info['flags'])}; threads {args.threads}"
    )
    with tempfile.TemporaryDirectory(prefix="etb_threads_") as wd:
        work = Path(wd)
        cases = kb.build_cases(args.models, args.dtypes, work, "ptq", args.channels_last)
        build = kb.build_runtimes(["native"], cases, work, profile=args.profile)["native"]
        if build.error:
            kb.log(f"etbuild runtime build failed: {build.error}")
            return 1
        if not build.threads_flag:
            kb.log("this etb_runner has no --threads flag")
            return 1
        probe = round_trip_probe(work)
        rows = []
        for case in cases:
            cells = []
            try:
                delegated, dbuild = delegated_case(case, work)
            except Exception as exc:  # noqa: BLE001
                delegated, dbuild, derror = None, None, kb.short_error(exc)
            # The pairs the verdict compares sit next to each other in a round (a slow spell of
            # the host then hits both): etbuild and XNNPACK at each count, in the order
            # etb@1 xnn@1 xnn@2 etb@2 etb@4 ..., so that etbuild at 1 and at T are close too;
            # the delegated runs and eager come after them.
            for i, t in enumerate(args.threads):
                pair = [kb.Cell(f"etbuild@{t}", kb.RunnerTimed(build, case, work, t))]
                try:
                    pair.append(kb.Cell(f"xnnpack@{t}", XnnpackWorker(case, t, work)))
                except Exception as exc:  # noqa: BLE001
                    pair.append(kb.Cell(f"xnnpack@{t}", error=kb.short_error(exc)))
                cells += pair if i % 2 == 0 else pair[::-1]
            for t in args.threads:
                if delegated is None:
                    cells.append(kb.Cell(f"etb+xnn@{t}", error=derror))
                else:
                    timed = kb.RunnerTimed(dbuild, delegated, work, t)
                    cells.append(kb.Cell(f"etb+xnn@{t}", timed))
            cells += [kb.Cell(f"eager@{t}", EagerAt(case, t)) for t in args.threads]
            for c in cells:
                if c.timed is None:
                    continue
                try:
                    c.check = kb.check(case, c.timed.output())
                    if not c.check.ok:
                        c.error = f"output check failed (SQNR {c.check.sqnr_db:.1f} dB)"
                except Exception as exc:  # noqa: BLE001
                    c.error = f"output failed: {kb.short_error(exc)}"
            before = round_trip_ns(probe)
            kb.measure(cells, args.iters, args.rounds)
            kb.log(f"  {case.name:<20} core-to-core round trip {before} before, "
                   f"{round_trip_ns(probe)} after")  # fmt: skip
            for c in cells:
                if isinstance(c.timed, XnnpackWorker):
                    c.timed.close()
            ms = {c.runtime: c.ms for c in cells}
            samples = {c.runtime: c.samples for c in cells if c.ms is not None}
            errors = [f"{c.runtime}: {c.error}" for c in cells if c.error]
            rows.append((case.name, ms, errors, samples))
            kb.log(f"  {case.name:<20} " + "  ".join(f"{c.runtime} {kb.fmt_ms(c)}" for c in cells))
            if args.profile and build.module is not None:
                scaling_profile(case, build, max(args.threads), args.top)

    kb.log("\n== latency, ms (median over rounds)")
    cols = [f"{rt}@{t}" for t in args.threads for rt in RUNTIMES]
    kb.log(f"{'model/dtype':<20}" + "".join(f"{c:>13}" for c in cols))
    for name, ms, _, _ in rows:
        kb.log(f"{name:<20}" + "".join(f"{fmt_ms(ms.get(c)):>13}" for c in cols))
    kb.log(
        "\n== speed-up over 1 thread (same runtime), and etbuild (portable, then delegated) / "
        "ExecuTorch+XNNPACK at each count"
    )
    head = [f"{rt} x{t}" for rt in RUNTIMES for t in args.threads[1:]]
    head += [f"etb/xnn@{t}" for t in args.threads] + [f"etb+x/xnn@{t}" for t in args.threads]
    kb.log(f"{'model/dtype':<20}" + "".join(f"{h:>13}" for h in head))
    for name, ms, errors, _ in rows:
        vals = [
            kb.ratio(ms.get(f"{rt}@1"), ms.get(f"{rt}@{t}"))
            for rt in RUNTIMES
            for t in args.threads[1:]
        ]
        vals += [kb.ratio(ms.get(f"etbuild@{t}"), ms.get(f"xnnpack@{t}")) for t in args.threads]
        vals += [kb.ratio(ms.get(f"etb+xnn@{t}"), ms.get(f"xnnpack@{t}")) for t in args.threads]
        kb.log(f"{name:<20}" + "".join(f"{kb.fmt_ratio(v):>13}" for v in vals))
        for e in errors:
            kb.log(f"    {e}")
    if args.rounds > 1:
        log_round_spread(rows, args.threads)
    return 0


def log_round_spread(rows, threads: list[int]) -> None:
    """The done-when quantities per round, from samples taken in the same round (a slow
    spell of the machine hits both sides of each pair): etbuild's speed-up over 1 thread, and
    how etbuild / XNNPACK changes from 1 thread to T (< 1: the gap narrows). Median [min-max]
    over rounds: a verdict inside the spread is noise."""
    kb.log("\n== per round: etbuild xT, and (etb/xnn@T) / (etb/xnn@1), median [min-max]")
    for name, _, _, s in rows:
        cells = []
        for t in threads[1:]:
            one, many = s.get("etbuild@1"), s.get(f"etbuild@{t}")
            x1, xt = s.get("xnnpack@1"), s.get(f"xnnpack@{t}")
            if one and many:
                cells.append(f"x{t} {kb.spread([a / b for a, b in zip(one, many, strict=False)])}")
            if one and many and x1 and xt:
                change = [(b / d) / (a / c) for a, b, c, d in zip(one, many, x1, xt, strict=False)]
                cells.append(f"ratio@{t}/@1 {kb.spread(change)}")
        kb.log(f"  {name:<20} " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
