"""Kernel speed: etbuild's runtime per x86-64 ISA level against XNNPACK, LiteRT, onnxruntime, eager.

One run on this machine, one thread everywhere, batch 1. For each model (MobileNetV2, ResNet18,
the transformer) and dtype (fp32; int8 = ``+quant=ptq``) the etbuild pipeline builds
``model.pte`` and the reference inputs; etbuild's runtime is built for each ISA level
(``x86-64-v2``, ``x86-64-v3``, ``native``) and the same ``nn.Module`` (same weights, same
inputs, the same calibration batches for int8) is exported to each peer:

- etbuild: the built ``etb_runner``'s own iteration timing, one process per sample;
- xnnpack: ExecuTorch 1.5.1, ``to_edge_transform_and_lower(XnnpackPartitioner)``; int8 with
  ExecuTorch's XNNPACK quantizer (per-channel, static), run with ``executorch.runtime``;
- litert: a .tflite written by ``bench/kernels_tflite.py`` from the exported graph (fp32) or
  from the XNNPACK-quantized PT2E graph (int8), run by ``ai-edge-litert`` (XNNPACK delegate);
- onnxruntime: ``torch.onnx.export``; int8 with ``quantize_static`` (QDQ, per-channel);
- eager: torch, ``torch.set_num_threads(1)`` (fp32 also in the int8 rows).

Every peer's output is checked against torch eager (max abs diff; SQNR for int8) before it
is timed, so a broken conversion cannot post a fast wrong number. Timing is interleaved: in
each of ``--rounds`` rounds every runtime of a cell runs ``--iters / --rounds`` iterations in
turn (A, B, C, ... repeated), so machine noise hits all alike; a runtime's time is the median
over rounds of its per-round median. Printed: ms per cell, then etbuild (native) / each peer,
and the "no cliff" ratio (v3 / XNNPACK) / (native / XNNPACK): how much of the speed a portable
x86-64-v3 build keeps. ``--profile`` adds, per cell, the native build's slowest instructions
with their shapes and achieved GFLOP/s (etbuild.runtime ``run(..., profile=True)``; the
native build then also packs its Python module). Timing uses ``etb_runner`` at every level.

    pip install ".[bench]"        # onnxruntime, onnx, onnxscript, ai-edge-litert, executorch
    python bench/kernels.py [--models mobilenet resnet18 transformer] [--dtypes fp32 int8]
        [--levels x86-64-v2 x86-64-v3 native] [--peers xnnpack litert onnxruntime eager]
        [--iters 30] [--rounds 6] [--profile] [--top 12] [--keep DIR]

Peer artifacts (.pte, .onnx, .tflite) are cached under ``$ETBUILD_CACHE_DIR/bench_kernels``
(default ``~/.cache/etbuild/bench_kernels``), keyed by the program, the converter and the tool
versions; the runtimes come from the build stage's cache (``+target=host target.march=...``,
every case's program in ``selection.programs``), or, where the config has no ``target.march``,
from a CMake build cached there too. A second run with unchanged sources only measures.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODELS = ("mobilenet", "resnet18", "transformer")
DTYPES = ("fp32", "int8")
LEVELS = ("x86-64-v2", "x86-64-v3", "native")
PEERS = ("xnnpack", "litert", "onnxruntime", "eager")
IMAGE_MODELS = {"mobilenet", "resnet18", "mobilenet_v3_small"}
# Bump when a peer's export changes: the cached .pte/.onnx/.tflite files are keyed by it.
ARTIFACT_VERSION = "1"


def log(msg: str) -> None:
    print(msg, flush=True)


def short_error(exc: BaseException, limit: int = 160) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    line = next((t for t in text if t.strip()), type(exc).__name__)
    return line if len(line) <= limit else line[: limit - 3] + "..."


# Untimed runs before each sample of a long-lived runtime (eager, the XNNPACK workers, a
# runtime loaded in this process): while the others ran, the scheduler may have put its idle
# threads on one core, and it takes tens of milliseconds of work to spread them again.
# Without this, XNNPACK at 2 threads took anywhere from 1x to 2.8x its steady time per round
# on a 2-core host, so the verdict leaned on which round the scheduler spoiled. etb_runner is
# a fresh process per sample with its own --warmup (RunnerTimed).
WARM_UP_MS, WARM_UP_RUNS = 100.0, 10


def warm_up(call) -> None:
    """Runs call() until at least WARM_UP_RUNS runs and WARM_UP_MS have passed."""
    t0, runs = time.perf_counter(), 0
    while runs < WARM_UP_RUNS or (time.perf_counter() - t0) * 1e3 < WARM_UP_MS:
        call()
        runs += 1


@contextlib.contextmanager
def quiet():
    """Silence a converter's chatter (stdout, stderr, warnings), C-level output included."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
            try:
                with (
                    contextlib.redirect_stdout(io.StringIO()),
                    contextlib.redirect_stderr(io.StringIO()),
                ):
                    yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])


def version_of(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- the machine ------------------------------------------------------------------------------


def cpu_info() -> dict:
    info = {"model": platform.processor() or platform.machine(), "flags": set()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and info["model"] in ("", platform.machine(), platform.processor()):
            info["model"] = value
        elif key in ("flags", "Features") and not info["flags"]:
            info["flags"] = set(value.split())
    return info


def machine_isa(flags: set[str]) -> str:
    """The widest instruction set the kernels have a path for that this CPU runs."""
    if "avx512f" in flags:
        return "avx512 (avx512f)"
    if {"avx2", "fma"} <= flags:
        return "avx2+fma"
    if "asimd" in flags or platform.machine() in ("aarch64", "arm64"):
        return "neon"
    if "sse2" in flags:
        return "sse2"
    return "scalar"


FMA_PEAK_SOURCE = r"""
#include <chrono>
#include <cstdio>
typedef float V __attribute__((vector_size(VECTOR_BYTES)));
int main() {
  volatile float vb = 0.9999f, vc = 1e-5f, va = 0.3f;  // volatile: no constant folding
  V b, c, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
  for (int i = 0; i < int(sizeof(V) / 4); ++i) {
    b[i] = vb; c[i] = vc; a0[i] = va;
  }
  // Distinct starting values: equal chains would be computed once.
  a1 = a0 + c; a2 = a1 + c; a3 = a2 + c; a4 = a3 + c; a5 = a4 + c; a6 = a5 + c;
  a7 = a6 + c; a8 = a7 + c; a9 = a8 + c; a10 = a9 + c; a11 = a10 + c;
  const long n = 100000000;
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {  // 12 independent multiply-add chains (contracted to FMA)
#define F(x) x = x * b + c;
    F(a0) F(a1) F(a2) F(a3) F(a4) F(a5) F(a6) F(a7) F(a8) F(a9) F(a10) F(a11)
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  V r = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
  printf("%.3f %f\n", double(n) * 12 * 2 * (sizeof(V) / 4) / s / 1e9, double(r[0]));
}
"""


def peak_gflops(flags: set[str]) -> tuple[float | None, str]:
    """One core's fp32 multiply-add peak, measured: a loop of 12 independent FMA chains on the
    widest vectors the kernels use, compiled with -march=native (the clock in /proc/cpuinfo is
    the base clock: a boosting core runs well above it). Cached per CPU. (None, why) when
    there is no compiler or it is not x86."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None, "not measured on this architecture"
    width = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16
    key = hashlib.sha256((" ".join(sorted(flags)) + compiler()).encode()).hexdigest()[:16]
    cached = cache_dir() / f"fma_peak_{key}.txt"
    if cached.is_file():
        return float(cached.read_text()), "measured (cached)"
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "peak.cpp", Path(d) / "peak"
        src.write_text(FMA_PEAK_SOURCE)
        try:
            subprocess.run([compiler(), "-O2", "-march=native", f"-DVECTOR_BYTES={width}",
                            str(src), "-o", str(exe)], check=True, capture_output=True,
                           timeout=120)  # fmt: skip
            runs = []
            for _ in range(3):
                p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
                runs.append(float(p.stdout.split()[0]))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            return None, f"not measured ({short_error(exc)})"
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(f"{max(runs):.1f}")
    return max(runs), "measured"


# ---- the pipeline: model.pte, reference inputs, the module ------------------------------------


@dataclass
class Case:
    model: str
    dtype: str
    overrides: list[str]
    run_dir: Path
    pte: Path
    module: torch.nn.Module  # the fp32 eager module
    inputs: list[torch.Tensor]
    expected: list[torch.Tensor]  # eager fp32 outputs on ``inputs``
    calibration: list[tuple[torch.Tensor, ...]]
    program: object = None  # etbuild.pipeline.ir.Program (instruction shapes for --profile)
    pte_sha: str = ""
    channels_last: bool = False  # built with pipeline.lower.channels_last=true

    @property
    def name(self) -> str:
        return f"{self.model}/{self.dtype}" + ("/nhwc" if self.channels_last else "")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from etbuild.pipeline.paths import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=overrides)


def quant_overrides(model: str, dtype: str, transformer_int8: str) -> list[str]:
    if dtype == "fp32":
        return []
    return [f"+quant={transformer_int8}"] if model == "transformer" else ["+quant=ptq"]


def build_case(
    model: str, dtype: str, work: Path, transformer_int8: str, channels_last: bool = False
) -> Case:
    """The case's program and reference; `channels_last`: lowered with channels-last
    activations (pipeline.lower.channels_last=true)."""
    from etbuild.pipeline.quant.calibration import calibration_batches
    from etbuild.pipeline.runner import run_stages, sha256_file
    from etbuild.pipeline.stages import STAGES

    overrides = [f"model={model}", *quant_overrides(model, dtype, transformer_int8)]
    if channels_last:
        overrides.append("pipeline.lower.channels_last=true")
    cfg = compose(overrides + ["pipeline.stop_after=reference"])
    run_dir = work / (f"{model}_{dtype}" + ("_nhwc" if channels_last else ""))
    with quiet():
        ctx = run_stages(STAGES, cfg, run_dir, stop_after="reference", log=lambda _: None)
    ref = torch.load(run_dir / "reference.pt", weights_only=False)
    module = ctx.artifacts["module"].eval()
    calib: list = []
    if dtype == "int8":
        calib = [tuple(b) for b in calibration_batches(cfg.quant, cfg.model)]
    pte = run_dir / "model.pte"
    return Case(
        model,
        dtype,
        overrides,
        run_dir,
        pte,
        module,
        list(ref["inputs"]),
        [o.float() for o in ref["outputs"]],
        calib,
        ctx.artifacts.get("program"),
        sha256_file(pte),
        channels_last,
    )


def build_cases(
    models: list[str], dtypes: list[str], work: Path, transformer_int8: str, channels_last: bool
) -> list[Case]:
    """build_case for every model and dtype; with `channels_last`, each fp32 case followed by
    its channels-last twin (the int8 kernels take NCHW only)."""
    cases = []
    for model in models:
        for dtype in dtypes:
            cases.append(build_case(model, dtype, work, transformer_int8))
            if channels_last and dtype == "fp32":
                cases.append(build_case(model, dtype, work, transformer_int8, channels_last=True))
    return cases


# ---- etbuild's runtime for each ISA level -----------------------------------------------------


@dataclass
class Build:
    level: str
    runner: Path | None = None
    pymod: Path | None = None  # the Python module (native only)
    isa: str = "?"
    isa_source: str = ""
    how: str = ""
    error: str = ""
    threads_flag: bool = False
    module: object = None


def cache_dir() -> Path:
    env = os.environ.get("ETBUILD_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "etbuild"
    return root / "bench_kernels"


def compiler() -> str:
    return shutil.which(os.environ.get("CXX") or "c++") or "c++"


def isa_from_compiler(level: str) -> str:
    """simd.h's rule applied to what the compiler predefines for -march=<level>."""
    try:
        out = subprocess.run(
            [compiler(), f"-march={level}", "-dM", "-E", "-x", "c++", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    macros = set(re.findall(r"#define (\w+)", out))
    if "__AVX512F__" in macros:
        return "avx512"
    if {"__AVX2__", "__FMA__"} <= macros:
        return "avx2"
    if "__aarch64__" in macros:
        return "neon"
    if "__SSE2__" in macros:
        return "sse2"
    return "scalar"


def has_march_key() -> bool:
    """Whether the config schema has ``target.march`` (the ISA level of a host build)."""
    from etbuild.pipeline import config

    fields = getattr(config.TargetConfig, "__dataclass_fields__", {})
    return "march" in fields


def cmake_defines(level: str, python: bool, root: Path | None = None) -> list[str]:
    """CMake's flags for every kernel at ``level``, from the sources under ``root`` (a copy of
    the repository's runtime_src/, ops_yaml/ and codegen/; default: this checkout)."""
    from etbuild.pipeline.paths import PACKAGE_ROOT

    root = root or PACKAGE_ROOT
    cmakelists = (root / "runtime_src" / "CMakeLists.txt").read_text()
    defines = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DETB_BUILD_RUNNER=ON",
        "-DETB_ALL_OPS_RUNNER=OFF",
        f"-DCMAKE_CXX_COMPILER={compiler()}",
        f"-DETB_OPS_YAML_DIR={root / 'ops_yaml'}",
        f"-DETB_CODEGEN_DIR={root / 'codegen'}",
        f"-DPython_EXECUTABLE={sys.executable}",
    ]
    if "ETB_ARCH" in cmakelists:  # the ISA level as a cache variable (target.march)
        defines.append(f"-DETB_ARCH={level}")
    elif level == "native":
        defines.append("-DETB_NATIVE_ARCH=ON")
    else:
        defines += ["-DETB_NATIVE_ARCH=OFF", f"-DCMAKE_CXX_FLAGS=-march={level}"]
    if python:
        defines.append("-DETB_BUILD_PYTHON=ON")
    return defines


def build_key(defines: list[str], level: str) -> str:
    from etbuild.pipeline.paths import OPS_YAML_DIR, PACKAGE_ROOT, RUNTIME_SRC_DIR
    from etbuild.pipeline.runner import tree_digest

    h = hashlib.sha256()
    tree_digest(h, RUNTIME_SRC_DIR, ("**/*",))
    tree_digest(h, OPS_YAML_DIR, ("*.yaml",))
    tree_digest(h, PACKAGE_ROOT / "codegen", ("*.py",))
    ver = subprocess.run([compiler(), "--version"], capture_output=True, text=True).stdout
    h.update(json.dumps([d for d in defines if "Python_EXECUTABLE" not in d] + [ver]).encode())
    if level == "native":
        h.update(" ".join(sorted(cpu_info()["flags"])).encode())
    return h.hexdigest()[:20]


def build_with_cmake(level: str, python: bool) -> Build:
    """Every kernel, compiled for ``level`` (the runner; with ``python`` the module too)."""
    from etbuild.pipeline.paths import RUNTIME_SRC_DIR

    defines = cmake_defines(level, python)
    entry = cache_dir() / "builds" / f"{level}-{build_key(defines, level)}"
    b = Build(level, how="cmake " + " ".join(d for d in defines if "ARCH" in d or "FLAGS" in d))
    if not (entry / "etb_runner").is_file():
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
        try:
            logf = tmp / "build.log"
            cmake = shutil.which("cmake") or "cmake"
            for cmd in (
                [cmake, "-S", str(RUNTIME_SRC_DIR), "-B", str(tmp / "b"), "-G", "Ninja", *defines],
                [cmake, "--build", str(tmp / "b")],
            ):
                with open(logf, "ab") as f:
                    proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
                if proc.returncode != 0:
                    tail = logf.read_text(errors="replace").splitlines()
                    errs = [t for t in tail if "error" in t.lower()][:3] or tail[-3:]
                    b.error = f"{Path(cmd[0]).name} failed: " + " | ".join(e.strip() for e in errs)
                    return b
            out = tmp / "out"
            out.mkdir()
            shutil.copy2(tmp / "b" / "etb_runner", out / "etb_runner")
            for so in (tmp / "b").glob("runtime*.so"):
                shutil.copy2(so, out / so.name)
            try:
                os.replace(out, entry)
            except OSError:
                if not (entry / "etb_runner").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    b.runner = entry / "etb_runner"
    sos = sorted(entry.glob("runtime*.so"))
    b.pymod = sos[0] if sos else None
    return b


def build_with_pipeline(level: str, cases: list[Case], work: Path, wheel: bool) -> Build:
    """The build stage with ``target.march=<level>`` and every case's program selected."""
    from etbuild.pipeline.runner import run_stages
    from etbuild.pipeline.stage_cache import StageCache, cache_root
    from etbuild.pipeline.stages import STAGES

    programs = ",".join(json.dumps(str(c.pte)) for c in cases)
    overrides = [
        "model=mlp",  # a small program of its own; the runtime gets every case's kernels
        "+target=host",
        f"target.march={level}",
        f"selection.programs=[{programs}]",
        "build.compare_all_ops=false",
        f"build.wheel={'true' if wheel else 'false'}",
        "pipeline.verify.enabled=false",
        "pipeline.stop_after=build",
    ]
    cfg = compose(overrides)
    run_dir = work / f"runtime_{level}"
    cache = StageCache(cache_root(cfg))
    with quiet():
        run_stages(STAGES, cfg, run_dir, stop_after="build", log=lambda _: None, cache=cache)
    b = Build(level, how=f"pipeline target.march={level}")
    b.runner = run_dir / "runtime" / "bin" / "etb_runner"
    wheels = sorted((run_dir / "runtime" / "wheel").glob("*.whl"))
    if wheels:
        dest = run_dir / "wheel_unpacked"
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(dest)
        sos = sorted(dest.rglob("runtime*.so"))
        b.pymod = sos[0] if sos else None
    return b


def load_pymod(path: Path, tag: str):
    """Import a built etbuild runtime module (its init symbol is PyInit_runtime)."""
    spec = importlib.util.spec_from_file_location(f"etb_bench_{tag}.runtime", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def finish_build(b: Build) -> Build:
    """The runner's flags (--threads) and the ISA its kernels were compiled for."""
    if b.runner is None or not b.runner.is_file():
        b.error = b.error or "no etb_runner was built"
        return b
    usage = subprocess.run([str(b.runner)], capture_output=True, text=True)
    text = usage.stdout + usage.stderr
    b.threads_flag = "--threads" in text
    if b.pymod is not None:
        try:
            b.module = load_pymod(b.pymod, b.level.replace("-", "_"))
            if hasattr(b.module, "kernel_isa"):
                b.isa, b.isa_source = str(b.module.kernel_isa()), "etbuild.runtime.kernel_isa()"
        except Exception as exc:  # noqa: BLE001 - reported, the runner still times
            b.module = None
            log(f"  note: cannot import the {b.level} Python module: {short_error(exc)}")
    if b.isa == "?":
        flag = re.search(r"(--[\w-]*isa[\w-]*)", text)
        if flag:
            out = subprocess.run([str(b.runner), flag.group(1)], capture_output=True, text=True)
            m = re.search(r"(avx512\w*|avx2\w*|sse\w*|neon|scalar)", out.stdout + out.stderr, re.I)
            if m:
                b.isa, b.isa_source = m.group(1).lower(), f"etb_runner {flag.group(1)}"
    if b.isa == "?":
        b.isa = isa_from_compiler(b.level)
        b.isa_source = "compiler macros for -march, simd.h's rule (the runtime reports none yet)"
    return b


def build_runtimes(
    levels: list[str], cases: list[Case], work: Path, profile: bool
) -> dict[str, Build]:
    """Each level's runtime; the native one also as the Python module when profiling."""
    builds = {}
    use_pipeline = has_march_key()
    for level in levels:
        t0 = time.perf_counter()
        b = None
        python = profile and level == "native"
        if use_pipeline:
            try:
                b = build_with_pipeline(level, cases, work, python)
            except Exception as exc:  # noqa: BLE001
                log(f"  note: target.march={level} build failed ({short_error(exc)}); CMake")
        if b is None:
            try:
                b = build_with_cmake(level, python)
            except Exception as exc:  # noqa: BLE001
                b = Build(level, error=short_error(exc))
        b = finish_build(b) if not b.error else b
        state = f"ERROR {b.error}" if b.error else f"kernels: {b.isa}  [{b.isa_source}]"
        log(f"  etbuild {level:<10} {time.perf_counter() - t0:6.1f}s  {state}")
        log(f"  {'':<18} via {b.how}")
        builds[level] = b
    return builds


# ---- runtimes under test ----------------------------------------------------------------------


class Timed:
    """A runtime ready to run one case: ``sample(k)`` -> ms (median of k runs), ``output()``."""

    note = ""

    def sample(self, k: int) -> float:
        times = []
        for _ in range(k):
            t0 = time.perf_counter()
            self.call()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def call(self) -> None:
        raise NotImplementedError

    def output(self) -> torch.Tensor:
        raise NotImplementedError


class RunnerTimed(Timed):
    """etb_runner's own timing: one process per sample, --warmup 10 --iters k. A fresh
    process needs some runs before its thread pool's workers are awake and its caches warm,
    which the peers, timed in long-lived processes, have had. (On a shared host a process's
    speed also varies from one process to the next; the rounds' median absorbs that.)"""

    def __init__(self, build: Build, case: Case, work: Path, threads: int = 1) -> None:
        from etbuild.pipeline import etbt

        self.build, self.case, self.threads = build, case, threads
        self.dir = work / "etbt" / case.name.replace("/", "_")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.inputs = []
        for i, t in enumerate(case.inputs):
            etbt.write(self.dir / f"input_{i}.etbt", t)
            self.inputs += ["--input", str(self.dir / f"input_{i}.etbt")]

    def cmd(self, k: int, *extra: str) -> list[str]:
        c = [str(self.build.runner), str(self.case.pte), *self.inputs]
        c += ["--warmup", "10", "--iters", str(k), *extra]
        return c + (["--threads", str(self.threads)] if self.build.threads_flag else [])

    def sample(self, k: int) -> float:
        p = subprocess.run(self.cmd(k), capture_output=True, text=True)
        m = re.search(r"latency_ms: median=([0-9.]+)", p.stdout)
        if p.returncode != 0 or m is None:
            lines = (p.stderr or p.stdout).strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"etb_runner exited {p.returncode}")
        return float(m.group(1))

    def output(self) -> torch.Tensor:
        from etbuild.pipeline import etbt

        out = self.dir / f"out_{self.build.level}"
        out.mkdir(exist_ok=True)
        p = subprocess.run(self.cmd(1, "--output-dir", str(out)), capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(((p.stderr or p.stdout).strip().splitlines() or ["failed"])[-1])
        return etbt.read(out / "output_0.etbt")


class EagerTimed(Timed):
    def __init__(self, case: Case) -> None:
        self.module, self.inputs = case.module, case.inputs

    def call(self) -> None:
        with torch.inference_mode():
            self.module(*self.inputs)

    def output(self) -> torch.Tensor:
        with torch.inference_mode():
            return self.module(*self.inputs)


def artifact_key(case: Case, peer: str, *extra: str) -> str:
    h = hashlib.sha256()
    h.update(case.pte_sha.encode())
    h.update(case.name.encode())
    for t in case.inputs:
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()[:4096])
    h.update(ARTIFACT_VERSION.encode())
    if peer == "litert":
        h.update((HERE / "kernels_tflite.py").read_bytes())
    for dist in ("torch", "torchao", "executorch", "onnx", "onnxruntime", "onnxscript"):
        h.update(f"{dist}={version_of(dist)}".encode())
    h.update(" ".join((peer, *extra)).encode())
    return h.hexdigest()[:20]


def cached_artifact(case: Case, peer: str, suffix: str, make) -> tuple[Path, dict]:
    """``make(path) -> dict`` once per key; returns (path, the facts it recorded)."""
    entry = (
        cache_dir() / "artifacts" / f"{case.model}_{case.dtype}_{peer}_{artifact_key(case, peer)}"
    )
    path, facts = entry / f"model{suffix}", entry / "facts.json"
    if path.is_file() and facts.is_file():
        return path, json.loads(facts.read_text())
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp."))
    try:
        doc = make(tmp / f"model{suffix}") or {}
        (tmp / "facts.json").write_text(json.dumps(doc))
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path, doc


_CONVERTED: dict[str, torch.fx.GraphModule] = {}


def xnnpack_quantized(case: Case) -> torch.fx.GraphModule:
    """The module quantized by ExecuTorch's XNNPACK quantizer on the case's calibration
    batches (per-channel symmetric weights, per-tensor affine activations); shared by the
    ExecuTorch and LiteRT int8 peers."""
    if case.name in _CONVERTED:
        return _CONVERTED[case.name]
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    with quiet():
        gm = torch.export.export(case.module, tuple(case.inputs), strict=False).module()
        prepared = prepare_pt2e(gm, quantizer)
        with torch.no_grad():
            for batch in case.calibration:
                prepared(*batch)
        converted = convert_pt2e(prepared)
    _CONVERTED[case.name] = converted
    return converted


def xnnpack_program(case: Case) -> tuple[Path, dict]:
    """The case's module exported by ExecuTorch with the XNNPACK partitioner (int8: its
    XNNPACK quantizer), cached; and facts about the program (delegates, instructions, ops)."""

    def make(path: Path) -> dict:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
        from executorch.exir import to_edge_transform_and_lower

        src = xnnpack_quantized(case) if case.dtype == "int8" else case.module
        with quiet():
            ep = torch.export.export(src, tuple(case.inputs), strict=False)
            et = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
            prog = et.to_executorch()
        path.write_bytes(prog.buffer)
        plan = prog.executorch_program.execution_plan[0]
        ops = [o.name for o in plan.operators]
        calls = sum(1 for c in plan.chains[0].instructions)
        return {"delegates": len(plan.delegates), "instructions": calls, "ops": ops}

    return cached_artifact(case, "xnnpack", ".pte", make)


class XnnpackTimed(Timed):
    def __init__(self, case: Case) -> None:
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        path, facts = xnnpack_program(case)
        with quiet():  # the runtime logs its CPU probing and thread pool to stderr
            with contextlib.suppress(Exception):
                portable_lib._unsafe_reset_threadpool(1)
            self.method = Runtime.get().load_program(str(path)).load_method("forward")
        self.inputs = case.inputs
        left = [o for o in facts.get("ops", [])]
        self.note = (
            f"{facts.get('delegates', '?')} XNNPACK subgraphs, "
            f"{facts.get('instructions', '?')} instructions"
            + (f"; outside XNNPACK: {', '.join(sorted(set(left)))}" if left else "")
        )

    def call(self) -> None:
        self.method.execute(self.inputs)

    def output(self) -> torch.Tensor:
        return self.method.execute(self.inputs)[0]


class OrtTimed(Timed):
    def __init__(self, case: Case) -> None:
        import onnxruntime as ort

        names = [f"input_{i}" for i in range(len(case.inputs))]

        def export(path: Path) -> None:
            with quiet():
                torch.onnx.export(
                    case.module,
                    tuple(case.inputs),
                    str(path),
                    input_names=names,
                    output_names=["output"],
                    dynamo=True,
                    external_data=False,
                )

        def make(path: Path) -> dict:
            if case.dtype == "fp32":
                export(path)
                return {}
            from onnxruntime.quantization import (
                CalibrationDataReader,
                CalibrationMethod,
                QuantFormat,
                QuantType,
                quantize_static,
            )
            from onnxruntime.quantization.shape_inference import quant_pre_process

            fp32 = path.with_name("fp32.onnx")
            export(fp32)
            pre = path.with_name("pre.onnx")
            try:
                with quiet():
                    quant_pre_process(str(fp32), str(pre))
            except Exception:  # noqa: BLE001 - optional optimization step
                pre = fp32

            class Reader(CalibrationDataReader):
                def __init__(self) -> None:
                    self.it = iter(case.calibration)

                def get_next(self):
                    b = next(self.it, None)
                    return (
                        None if b is None else {n: t.numpy() for n, t in zip(names, b, strict=True)}
                    )

            with quiet():
                quantize_static(
                    str(pre),
                    str(path),
                    Reader(),
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                )
            return {"preprocessed": pre != fp32}

        path, _ = cached_artifact(case, "onnxruntime", ".onnx", make)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.feed = {n: t.numpy() for n, t in zip(names, case.inputs, strict=True)}

    def call(self) -> None:
        self.sess.run(None, self.feed)

    def output(self) -> torch.Tensor:
        return torch.from_numpy(self.sess.run(None, self.feed)[0])


class LiteRtTimed(Timed):
    def __init__(self, case: Case) -> None:
        import kernels_tflite
        from ai_edge_litert.interpreter import Interpreter

        def make(path: Path) -> dict:
            if case.dtype == "int8":
                gm = xnnpack_quantized(case)
            else:
                with quiet():
                    gm = torch.export.export(case.module, tuple(case.inputs), strict=False).module()
            conv = kernels_tflite.convert(gm, case.inputs, image_inputs=case.model in IMAGE_MODELS)
            path.write_bytes(conv.flatbuffer)
            return {"nhwc_inputs": conv.nhwc_inputs, "ops": conv.ops}

        path, facts = cached_artifact(case, "litert", ".tflite", make)
        with quiet():
            self.it = Interpreter(model_path=str(path), num_threads=1)
            self.it.allocate_tensors()
        nhwc = facts["nhwc_inputs"]
        self.feeds = []
        for d, t, is_nhwc in zip(self.it.get_input_details(), case.inputs, nhwc, strict=True):
            x = t.permute(0, 2, 3, 1).contiguous() if is_nhwc else t
            self.feeds.append((d["index"], x.numpy()))
        self.out_index = self.it.get_output_details()[0]["index"]
        ops = self.it._get_ops_details()  # after delegation: DELEGATE nodes + what stayed out
        delegated = sum(1 for o in ops if o["op_name"] == "DELEGATE")
        self.note = f"{sum(facts['ops'].values())} TFLite ops, {delegated} XNNPACK partitions"

    def call(self) -> None:
        for idx, x in self.feeds:
            self.it.set_tensor(idx, x)
        self.it.invoke()

    def output(self) -> torch.Tensor:
        self.call()
        return torch.from_numpy(self.it.get_tensor(self.out_index).copy())


PEER_DISTS = {
    "xnnpack": ("executorch", "executorch"),
    "litert": ("ai-edge-litert", "ai_edge_litert"),
    "onnxruntime": ("onnxruntime", "onnxruntime"),
    "eager": ("torch", "torch"),
}


def peer_available(peer: str) -> str | None:
    """None when usable, else why not."""
    dist, module = PEER_DISTS[peer]
    if importlib.util.find_spec(module) is None:
        return f"{dist} is not installed (pip install {dist}, or pip install '.[bench]')"
    if peer == "onnxruntime" and importlib.util.find_spec("onnxscript") is None:
        return "torch.onnx.export needs onnxscript (pip install onnx onnxscript)"
    return None


# ---- checking outputs --------------------------------------------------------------------------


@dataclass
class Check:
    max_abs: float
    sqnr_db: float
    ok: bool


def check(case: Case, got: torch.Tensor) -> Check:
    """fp32: max abs diff within 1e-3 of the output's scale; int8: SQNR of at least 5 dB."""
    want = case.expected[0].float()
    got = got.detach().float().reshape(want.shape)
    diff = (got - want).abs().max().item()
    noise = (got.double() - want.double()).pow(2).mean().item()
    sig = want.double().pow(2).mean().item()
    sqnr = math.inf if noise == 0 else 10 * math.log10(max(sig, 1e-30) / noise)
    if case.dtype == "fp32":
        ok = diff <= 1e-3 * max(1.0, want.abs().max().item())
    else:
        ok = sqnr >= 5.0  # int8 programs land at 10-35 dB here; a broken conversion near 0
    return Check(diff, sqnr, ok and math.isfinite(diff))


# ---- measuring -------------------------------------------------------------------------------


@dataclass
class Cell:
    runtime: str
    timed: Timed | None = None
    error: str = ""
    check: Check | None = None
    samples: list[float] = field(default_factory=list)

    @property
    def ms(self) -> float | None:
        if self.error or not self.samples:
            return None
        return statistics.median(self.samples)

    @property
    def trusted_ms(self) -> float | None:
        return self.ms if (self.check is None or self.check.ok) else None


def prepare_cells(case: Case, builds: dict[str, Build], peers: list[str], work: Path) -> list[Cell]:
    cells = []
    for level, b in builds.items():
        c = Cell(f"etbuild {level}")
        if b.error:
            c.error = f"build failed: {b.error}"
        else:
            try:
                c.timed = RunnerTimed(b, case, work)
            except Exception as exc:  # noqa: BLE001
                c.error = short_error(exc)
        cells.append(c)
    makers = {
        "xnnpack": XnnpackTimed,
        "litert": LiteRtTimed,
        "onnxruntime": OrtTimed,
        "eager": EagerTimed,
    }
    for peer in peers:
        c = Cell(peer)
        why = peer_available(peer)
        if why:
            c.error = f"skipped: {why}"
        else:
            t0 = time.perf_counter()
            try:
                c.timed = makers[peer](case)
            except Exception as exc:  # noqa: BLE001 - a peer's failure is that cell's result
                c.error = short_error(exc)
                if os.environ.get("ETB_BENCH_TRACE"):
                    traceback.print_exc()
            dt = time.perf_counter() - t0
            if dt > 2:
                log(f"    {peer:<12} prepared in {dt:5.1f}s")
        cells.append(c)
    for c in cells:
        if c.timed is None:
            continue
        try:
            c.check = check(case, c.timed.output())
        except Exception as exc:  # noqa: BLE001
            c.error = f"run failed: {short_error(exc)}"
            c.timed = None
    return cells


SAMPLE_BUDGET_MS = 500.0  # a slow runtime (e.g. x86-64-v2 int8) runs fewer iterations per round


def measure(cells: list[Cell], iters: int, rounds: int) -> None:
    """Round-robin: every runtime runs iters/rounds iterations per round, in turn (fewer when
    that would take more than SAMPLE_BUDGET_MS; at least one). Every other round runs the
    cells in reverse, so that a drift of the host's pace does not favour the first ones."""
    live = [c for c in cells if c.timed is not None and not c.error]
    per = max(1, iters // max(1, rounds))
    count = {}
    for c in live:  # warm-up (caches, lazily packed weights), and how long one run takes
        try:
            c.timed.sample(1)
            ms = c.timed.sample(1)
            count[c.runtime] = max(1, min(per, int(SAMPLE_BUDGET_MS / max(ms, 1e-3))))
        except Exception as exc:  # noqa: BLE001
            c.error = f"run failed: {short_error(exc)}"
    for r in range(rounds):
        for c in live if r % 2 == 0 else live[::-1]:
            if c.error:
                continue
            try:
                c.samples.append(c.timed.sample(count[c.runtime]))
            except Exception as exc:  # noqa: BLE001
                c.error = f"run failed: {short_error(exc)}"


# ---- reporting -------------------------------------------------------------------------------


def fmt_ms(c: Cell) -> str:
    if c.error:
        return "error" if not c.error.startswith("skipped") else "-"
    if c.ms is None:
        return "?"
    return f"{c.ms:.2f}" + ("" if c.check is None or c.check.ok else "!")


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def spread(values: list[float]) -> str:
    """Median [min-max]: a verdict inside the range is the host's noise."""
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def report(results: dict[str, list[Cell]], levels: list[str], peers: list[str]) -> None:
    names = [f"etbuild {lv}" for lv in levels] + list(peers)
    short = {f"etbuild {lv}": f"etb {lv.replace('x86-64-', '')}" for lv in levels}
    width = 22
    log(
        "\n== latency, ms (median over rounds; ! = output check failed, not used in ratios; "
        "eager runs the fp32 module in int8 rows too)"
    )
    log(f"{'model/dtype':<{width}}" + "".join(f"{short.get(n, n):>13}" for n in names))
    for case, cells in results.items():
        by = {c.runtime: c for c in cells}
        log(f"{case:<{width}}" + "".join(f"{fmt_ms(by[n]):>13}" for n in names))

    main = "etbuild native" if "native" in levels else f"etbuild {levels[-1]}" if levels else None
    if main is None:
        return
    log(
        f"\n== ratios: {main} / peer (< 1: etbuild is faster); no cliff = (v3/XNNPACK) / "
        "(native/XNNPACK)"
    )
    cols = [p for p in peers]
    extra = []
    if "x86-64-v2" in levels:
        extra.append(("v2/xnnpack", "etbuild x86-64-v2"))
    if "x86-64-v3" in levels:
        extra.append(("v3/xnnpack", "etbuild x86-64-v3"))
    head = "".join(f"{'etb/' + p:>17}" for p in cols) + "".join(f"{h:>13}" for h, _ in extra)
    log(f"{'model/dtype':<{width}}{head}{'no cliff':>10}")
    per_col: dict[str, list] = {k: [] for k in [*cols, *(h for h, _ in extra), "cliff"]}
    for case, cells in results.items():
        by = {c.runtime: c for c in cells}
        m = by[main].trusted_ms
        row = []
        for p in cols:
            r = ratio(m, by[p].trusted_ms)
            per_col[p].append(r)
            row.append(f"{fmt_ratio(r):>17}")
        xnn = by["xnnpack"].trusted_ms if "xnnpack" in by else None
        for h, rt in extra:
            r = ratio(by[rt].trusted_ms, xnn)
            per_col[h].append(r)
            row.append(f"{fmt_ratio(r):>13}")
        cliff = None
        if "etbuild x86-64-v3" in by and main == "etbuild native":
            cliff = ratio(ratio(by["etbuild x86-64-v3"].trusted_ms, xnn), ratio(m, xnn))
        per_col["cliff"].append(cliff)
        log(f"{case:<{width}}" + "".join(row) + f"{fmt_ratio(cliff):>10}")
    row = [f"{fmt_ratio(geomean(per_col[p])):>17}" for p in cols]
    row += [f"{fmt_ratio(geomean(per_col[h])):>13}" for h, _ in extra]
    log(f"{'geomean':<{width}}" + "".join(row) + f"{fmt_ratio(geomean(per_col['cliff'])):>10}")

    log("\n== output vs torch eager fp32: max abs diff (SQNR dB); int8 rows are int8 programs")
    log(
        f"{'model/dtype':<{width}}"
        + "".join(f"{short.get(n, n):>19}" for n in names if n != "eager")
    )
    for case, cells in results.items():
        by = {c.runtime: c for c in cells}
        row = []
        for n in names:
            if n == "eager":
                continue
            ch = by[n].check
            if ch is None:
                row.append(f"{'-':>19}")
            else:
                sq = "inf" if math.isinf(ch.sqnr_db) else f"{ch.sqnr_db:.1f}"
                row.append(f"{f'{ch.max_abs:.1e} ({sq})' + ('' if ch.ok else '!'):>19}")
        log(f"{case:<{width}}" + "".join(row))

    notes = []
    for case, cells in results.items():
        for c in cells:
            if c.error and not c.error.startswith("skipped"):
                notes.append(f"  {case:<18} {c.runtime:<18} {c.error}")
            elif c.timed is not None and c.timed.note:
                notes.append(f"  {case:<18} {c.runtime:<18} {c.timed.note}")
    skipped = sorted(
        {
            (c.runtime, c.error)
            for cs in results.values()
            for c in cs
            if c.error.startswith("skipped")
        }
    )
    for rt, why in skipped:
        notes.append(f"  {'(all)':<18} {rt:<18} {why}")
    if notes:
        log("\n== notes and errors")
        for n in notes:
            log(n)


# ---- --profile ---------------------------------------------------------------------------------


def instruction_flops(ins) -> tuple[float, str]:
    """(multiply-add flops, 'conv'|'mm'|'') of one program instruction."""
    from etbuild.pipeline.ir import TensorValue

    names = [a.name for a in ins.op.schema.arguments]
    args = dict(zip(names, ins.args, strict=False))
    key = ins.op.key
    out = args.get("out")
    if not isinstance(out, TensorValue):
        return 0.0, ""
    numel = math.prod(out.shape)
    w = args.get("weight")
    if "conv" in key and isinstance(w, TensorValue):
        return 2.0 * numel * math.prod(w.shape[1:]), "conv"
    if "linear" in key and isinstance(w, TensorValue):
        return 2.0 * numel * w.shape[-1], "mm"
    x = args.get("mat1", args.get("self"))
    if key.split("::")[-1].split(".")[0] in ("addmm", "mm", "bmm") and isinstance(x, TensorValue):
        return 2.0 * numel * x.shape[-1], "mm"
    return 0.0, ""


def describe(ins) -> str:
    from etbuild.pipeline.ir import TensorValue

    parts = []
    names = [a.name for a in ins.op.schema.arguments]
    for name, a in zip(names, ins.args, strict=False):
        if isinstance(a, TensorValue) and name != "out" and not name.startswith("out"):
            tag = "w" if a.is_constant else ""
            parts.append(f"{tag}{list(a.shape)}")
        elif name in ("stride", "groups") and a not in (None, [1, 1], 1):
            parts.append(f"{name}={a}")
    out = [
        a
        for n, a in zip(names, ins.args, strict=False)
        if n.startswith("out") and isinstance(a, TensorValue)
    ]
    return " ".join(parts) + (f" -> {list(out[0].shape)}" if out else "")


def profile_case(case: Case, build: Build, top: int, peak: float | None, reps: int = 7) -> None:
    mod = build.module
    if mod is None:
        log(f"  {case.name}: no Python module for the {build.level} build; skipped")
        return
    try:
        prog = mod.load(str(case.pte), threads=1)
    except TypeError:
        prog = mod.load(str(case.pte))
    prog.run(case.inputs)  # warm-up
    runs = []
    for _ in range(reps):
        prog.run(case.inputs, profile=True)
        runs.append(prog.last_profile)
    n = len(runs[0])
    per = [statistics.median(r[i][1] for r in runs) for i in range(n)]
    events = [runs[0][i][0] for i in range(n)]
    instrs = list(getattr(case.program, "instructions", []) or [])
    aligned = len(instrs) == n
    total = sum(per)
    flops_total = 0.0
    rows = []
    for i in range(n):
        desc, flops, kind = "", 0.0, ""
        if aligned:
            with contextlib.suppress(Exception):
                desc = describe(instrs[i])
                flops, kind = instruction_flops(instrs[i])
        flops_total += flops
        rows.append((per[i], i, events[i], desc, flops, kind))
    by_op: dict[str, list[float]] = {}
    for t, _, name, _, f, _ in rows:
        acc = by_op.setdefault(name, [0.0, 0.0, 0])
        acc[0] += t
        acc[1] += f
        acc[2] += 1
    unit = "GOP/s" if case.dtype == "int8" else "GFLOP/s"
    log(
        f"\n-- {case.name}: {total * 1e3:.2f} ms over {n} instructions (profiled, median of "
        f"{reps}); {flops_total / 1e9:.2f} G{'OP' if case.dtype == 'int8' else 'FLOP'} in "
        f"conv/matmul = {flops_total / total / 1e9:.1f} {unit} overall"
        + (f"; one core's measured fp32 FMA peak {peak:.0f} GFLOP/s" if peak else "")
    )
    if not aligned:
        log(f"   (the program has {len(instrs)} instructions, the profile {n}: no shapes)")
    log(f"   {'#':>4} {'op':<34} {'ms':>7} {'share':>6} {unit:>8} {'%peak':>6}  shapes")
    for t, i, name, desc, f, _kind in sorted(rows, key=lambda r: -r[0])[:top]:
        rate = f / t / 1e9 if f and t > 0 else None
        pk = f"{100 * rate / peak:5.0f}%" if rate and peak and case.dtype == "fp32" else ""
        log(
            f"   {i:>4} {name[:34]:<34} {t * 1e3:7.3f} {t / total:6.1%} "
            f"{(f'{rate:.1f}' if rate else ''):>8} {pk:>6}  {desc}"
        )
    log(
        "   per op: "
        + ", ".join(
            f"{k.split('::')[-1]} {v[0] * 1e3:.2f} ms x{v[2]}"
            + (f" ({v[1] / v[0] / 1e9:.0f} {unit})" if v[1] and v[0] else "")
            for k, v in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:8]
        )
    )


# ---- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument(
        "--levels",
        nargs="*",
        default=list(LEVELS),
        help="etbuild ISA levels (-march values; 'native')",
    )
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    parser.add_argument("--iters", type=int, default=30, help="timed runs per runtime per cell")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    parser.add_argument("--profile", action="store_true", help="native build's per-layer profile")
    parser.add_argument("--top", type=int, default=12, help="instructions shown per profile")
    parser.add_argument(
        "--transformer-int8",
        default="ptq",
        choices=("ptq", "dynamic"),
        help="the transformer's etbuild int8 scheme",
    )
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    from etbuild.pipeline.config import register_configs

    register_configs()
    info = cpu_info()
    flags = info["flags"]
    log(
        f"machine: {info['model']}, {os.cpu_count()} cores, {platform.machine()}; ISA "
        f"{machine_isa(flags)}"
        f" (avx512f={'avx512f' in flags}, avx2={'avx2' in flags}, fma={'fma' in flags}); "
        "one thread everywhere"
    )
    vers = {d: version_of(d) for d in ("torch", "executorch", "ai-edge-litert", "onnxruntime")}
    log("versions: " + ", ".join(f"{d} {v or 'absent'}" for d, v in vers.items()))

    work_ctx = (
        contextlib.nullcontext(str(args.keep))
        if args.keep
        else tempfile.TemporaryDirectory(prefix="etb_kernels_")
    )
    with work_ctx as wd:
        work = Path(wd)
        work.mkdir(parents=True, exist_ok=True)
        log("\n== etbuild programs (pipeline through `reference`)")
        cases: list[Case] = []
        for model in args.models:
            for dtype in args.dtypes:
                t0 = time.perf_counter()
                try:
                    case = build_case(model, dtype, work, args.transformer_int8)
                except Exception as exc:  # noqa: BLE001
                    log(f"  {model}/{dtype}: pipeline failed: {short_error(exc, 300)}")
                    continue
                cases.append(case)
                log(
                    f"  {case.name:<20} {time.perf_counter() - t0:6.1f}s  "
                    f"{' '.join(case.overrides)}  {case.pte.stat().st_size / 1e6:.1f} MB"
                )
        if not cases:
            log("no program was built; nothing to measure")
            return 1
        log(
            "\n== etbuild runtimes ("
            + (
                "target.march"
                if has_march_key()
                else "CMake; target.march is not in the config schema yet"
            )
            + ")"
        )
        builds = build_runtimes(args.levels, cases, work, args.profile)

        results: dict[str, list[Cell]] = {}
        for case in cases:
            log(
                f"\n== {case.name}: preparing peers, checking outputs, then {args.rounds} "
                f"rounds x {max(1, args.iters // max(1, args.rounds))} runs each"
            )
            cells = prepare_cells(case, builds, args.peers, work)
            t0 = time.perf_counter()
            measure(cells, args.iters, args.rounds)
            log(
                "    "
                + "  ".join(f"{c.runtime} {fmt_ms(c)}" for c in cells)
                + f"   ({time.perf_counter() - t0:.1f}s)"
            )
            results[case.name] = cells
        report(results, args.levels, args.peers)

        if args.profile:
            b = builds.get("native")
            log("\n== per-layer profile: etbuild native (etbuild.runtime run(profile=True))")
            if b is None or b.error or b.module is None:
                log("  the native build's Python module is not available; add 'native' to --levels")
            else:
                peak, how = peak_gflops(flags)
                log(f"  one core's fp32 FMA peak: {f'{peak:.0f} GFLOP/s' if peak else '-'} ({how})")
                for case in cases:
                    try:
                        profile_case(case, b, args.top, peak)
                    except Exception as exc:  # noqa: BLE001
                        log(f"  {case.name}: profile failed: {short_error(exc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
