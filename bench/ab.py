"""A/B: the runtime from a git revision (A) against the runtime of the working tree (B), both
loaded in this one process, their calls interleaved.

On a shared host, the speed of a process, and of a machine from one minute to the next, moves
by tens of percent, more than most kernel changes gain. Here both builds run in the same
process (each module has its own nanobind domain, so the two import side by side), and every
round times A and B back to back on the same case and thread count, in alternating order (a
sample is the fastest of ``--iters`` runs). The paired ratio B/A of one round keeps the
change's signal when the host's pace drifts; its median and range over rounds say how much of
a verdict is noise.

The two runtimes are compiled with every kernel, for the machine (``-march=native``) unless
``--level`` says otherwise, in build trees kept under the bench cache, so a second run after
an edit recompiles only what changed. A is ``git archive <rev>`` of runtime_src/, ops_yaml/ and
codegen/; B is the checkout as it is on disk. Every output is checked against torch eager, and
A's output against B's (kernels that split work the same way give bit-identical results).

``--profile`` adds, per case and thread count, the layers whose time changed most: the
runtime's profiler times every instruction of a run (the second of two back-to-back runs,
so the pool's workers are awake), A and B alternating, and each layer's B/A is the median of
its paired per-run ratios. A layer-level change shows there when the whole model's time is
too noisy to show it. Read it against the layers the change did not touch: two builds of the
same kernels, loaded side by side, have differed by up to 10% in every layer alike (where
each module's code and buffers land), an offset that a real change stands out from.

    python bench/ab.py [--base HEAD] [--models mobilenet resnet18] [--dtypes fp32 int8]
        [--threads 1 2] [--iters 20] [--rounds 10] [--level native] [--profile] [--top 12]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kernels as kb  # noqa: E402  (bench/kernels.py: cases, builds, checks)

SOURCES = ("runtime_src", "ops_yaml", "codegen")


def git(*args: str) -> str:
    from etbuild.pipeline.paths import PACKAGE_ROOT

    proc = subprocess.run(["git", "-C", str(PACKAGE_ROOT), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def source_at(rev: str) -> tuple[Path, str]:
    """runtime_src/, ops_yaml/ and codegen/ as they are at ``rev``, unpacked once per commit."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    dest = kb.cache_dir() / "ab" / f"src-{sha[:12]}"
    if not (dest / "runtime_src" / "CMakeLists.txt").is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
        try:
            archive = tmp / "src.tar"
            git("archive", "--output", str(archive), sha, *SOURCES)
            with tarfile.open(archive) as tar:
                tar.extractall(tmp / "src", filter="data")
            os.replace(tmp / "src", dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest, sha[:12]


def build_module(root: Path, name: str, level: str):
    """The Python module of the runtime under ``root``, every kernel, in nanobind domain
    ``etb_ab_<name>``; the build tree is kept, so a rebuild is incremental."""
    defines = kb.cmake_defines(level, python=True, root=root)
    defines.append(f"-DETB_NB_DOMAIN=etb_ab_{name}")
    build = kb.cache_dir() / "ab" / f"build-{name}-{level}"
    cmake = shutil.which("cmake") or "cmake"
    t0 = time.perf_counter()
    for cmd in (
        [cmake, "-S", str(root / "runtime_src"), "-B", str(build), "-G", "Ninja", *defines],
        [cmake, "--build", str(build), "--target", "etb_python"],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = (proc.stdout + proc.stderr).splitlines()
            errors = [line for line in lines if "error" in line.lower()][:5] or lines[-5:]
            raise SystemExit(f"building {name} failed:\n  " + "\n  ".join(errors))
    (so,) = sorted(build.glob("runtime*.so"))
    module = kb.load_pymod(so, f"ab_{name}")
    kb.log(f"  {name:<18} {time.perf_counter() - t0:6.1f}s  kernels: {module.kernel_isa()}  {so}")
    return module


class Side:
    """One runtime's programs for one case, one per thread count."""

    def __init__(self, module, case: kb.Case, threads: list[int]) -> None:
        self.inputs = case.inputs
        self.programs = {t: module.load(str(case.pte), threads=t) for t in threads}

    def sample(self, threads: int, k: int) -> float:
        """The fastest of k runs, in ms: the host's interruptions only ever add time."""
        program, best = self.programs[threads], float("inf")
        for _ in range(k):
            t0 = time.perf_counter()
            program.run(self.inputs)
            best = min(best, (time.perf_counter() - t0) * 1e3)
        return best

    def output(self, threads: int) -> torch.Tensor:
        return self.programs[threads].run(self.inputs)[0]

    def profile(self, threads: int) -> list[float]:
        """Seconds per instruction of one run that follows another (workers awake)."""
        program = self.programs[threads]
        program.run(self.inputs)
        program.run(self.inputs, profile=True)
        return [entry[1] for entry in program.last_profile]


def layer_changes(case: kb.Case, pair: dict[str, Side], threads: int, runs: int, top: int):
    """The layers whose time changed most from A to B: A's time times the median of the
    paired per-run ratios (the medians of A's and B's own times drift with the host)."""
    times: dict[str, list[list[float]]] = {"A": [], "B": []}
    for r in range(runs):
        for k in "AB" if r % 2 == 0 else "BA":
            times[k].append(pair[k].profile(threads))
    names = [entry[0] for entry in pair["A"].programs[threads].last_profile]
    instrs = list(getattr(case.program, "instructions", []) or [])
    rows = []
    for i, name in enumerate(names):
        a = statistics.median(run[i] for run in times["A"])
        b = statistics.median(run[i] for run in times["B"])
        ratios = [rb[i] / ra[i] for ra, rb in zip(times["A"], times["B"], strict=True) if ra[i]]
        ratio = statistics.median(ratios) if ratios else 1.0
        desc = kb.describe(instrs[i]) if len(instrs) == len(names) else ""
        rows.append((abs(a * (ratio - 1)), i, name, a, b, ratio, desc))  # the paired change
    total_a = sum(r[3] for r in rows)
    total_b = sum(r[4] for r in rows)
    kb.log(
        f"\n-- {case.name} at {threads} thread(s): A {total_a * 1e3:.2f} ms, B {total_b * 1e3:.2f}"
        f" ms over {runs} profiled runs each"
    )
    kb.log(f"   {'#':>4} {'op':<30} {'A ms':>7} {'B ms':>7} {'B/A':>5}  shapes")
    for _, i, name, a, b, ratio, desc in sorted(rows, reverse=True)[:top]:
        kb.log(f"   {i:>4} {name[:30]:<30} {a * 1e3:7.3f} {b * 1e3:7.3f} {ratio:5.2f}  {desc}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of A (default: HEAD)")
    parser.add_argument("--models", nargs="+", default=["mobilenet", "resnet18"])
    parser.add_argument("--dtypes", nargs="+", default=list(kb.DTYPES), choices=kb.DTYPES)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--iters", type=int, default=20, help="runs per sample")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--level", default="native", help="-march of both builds")
    parser.add_argument("--transformer-int8", default="ptq", choices=("ptq", "dynamic"))
    parser.add_argument("--profile", action="store_true", help="per-layer changes, A to B")
    parser.add_argument("--top", type=int, default=12, help="layers shown per profile")
    args = parser.parse_args()

    info = kb.cpu_info()
    kb.log(f"machine: {info['model']}, {os.cpu_count()} cpus, {kb.machine_isa(info['flags'])}")
    from etbuild.pipeline.config import register_configs
    from etbuild.pipeline.paths import PACKAGE_ROOT

    register_configs()
    base_root, base_sha = source_at(args.base)
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", *SOURCES) else ""
    kb.log(f"A: {args.base} = {base_sha}    B: the working tree{dirty}")
    modules = {
        "A": build_module(base_root, f"base_{base_sha}", args.level),
        # One build tree per checkout (CMake refuses a tree configured from another source).
        "B": build_module(
            PACKAGE_ROOT,
            f"worktree_{hashlib.sha1(bytes(PACKAGE_ROOT)).hexdigest()[:8]}",
            args.level,
        ),
    }

    with tempfile.TemporaryDirectory(prefix="etb_ab_") as tmp:
        cases: dict[str, kb.Case] = {}
        sides: dict[str, dict[str, Side]] = {}
        for model in args.models:
            for dtype in args.dtypes:
                case = kb.build_case(model, dtype, Path(tmp), args.transformer_int8)
                cases[case.name] = case
                sides[case.name] = {k: Side(m, case, args.threads) for k, m in modules.items()}
                for t in args.threads:
                    a, b = (sides[case.name][k].output(t) for k in "AB")
                    checks = [kb.check(case, a), kb.check(case, b)]
                    same = (
                        "bit-identical"
                        if torch.equal(a, b)
                        else (f"max |A-B| {(a.float() - b.float()).abs().max().item():.3g}")
                    )
                    kb.log(
                        f"  {case.name} x{t}: against eager A {checks[0].max_abs:.3g}, "
                        f"B {checks[1].max_abs:.3g}; A vs B {same}"
                    )
                    if not all(c.ok for c in checks):
                        raise SystemExit(f"{case.name} at {t} threads disagrees with torch eager")

        ms: dict[tuple[str, int, str], list[float]] = {}
        for r in range(args.rounds):
            order = "AB" if r % 2 == 0 else "BA"
            for name, pair in sides.items():
                for t in args.threads:
                    for k in order:
                        ms.setdefault((name, t, k), []).append(pair[k].sample(t, args.iters))
            kb.log(f"  round {r + 1}/{args.rounds}")
        if args.profile:
            for name, pair in sides.items():
                for t in args.threads:
                    layer_changes(cases[name], pair, t, args.rounds * 2, args.top)

    kb.log(f"\n{'case':<20} {'threads':>7} {'A ms':>8} {'B ms':>8}   B/A per round: median [range]")
    for name in sides:
        for t in args.threads:
            a, b = ms[(name, t, "A")], ms[(name, t, "B")]
            paired = [y / x for x, y in zip(a, b, strict=True)]
            kb.log(
                f"{name:<20} {t:>7} {statistics.median(a):8.2f} {statistics.median(b):8.2f}"
                f"   {kb.spread(paired)}"
            )
    kb.log("B/A < 1: the working tree is faster.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
