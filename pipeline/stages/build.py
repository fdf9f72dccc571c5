"""The `build` stage: the runtime with only the selected kernels, for the target's toolchain.

Configures and builds ``runtime_src/`` with CMake + Ninja (``ETB_SELECTED_OPS`` = this run's
selected_operators.yaml) into a cache directory keyed by a hash of the runtime sources,
ops_yaml, codegen, the selection, the toolchain and the flags. A second identical build, or a
sweep job with the same selection, reuses the cached build and compiles nothing. The cache
entry is built in a temporary folder and renamed into place, and the run's ``runtime/`` folder
is copied the same way, so neither is ever half-written.

``runtime/`` holds ``lib/`` (libetb_runtime.a: the core; libetb_kernels.a: the selected
kernels and their registration), ``include/``, ``bin/etb_runner`` and
``lib/cmake/etbuild_runtime`` (``find_package(etbuild_runtime)``; targets
``etbuild::runtime``, ``etbuild::core``, ``etbuild::kernels``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import __version__
from ..errors import EtbuildError
from ..paths import OPS_YAML_DIR, PACKAGE_ROOT, RUNTIME_SRC_DIR
from ..runner import Context, sha256_file
from ..toolchain import Toolchain, resolve

CODEGEN_DIR = PACKAGE_ROOT / "codegen"
KERNEL_NAMESPACES = ("etb::native::", "etb::quantized::", "etb::prim::")
REGISTRATION_MARKERS = ("register_all_kernels", "::wrap_", "check_tensor_arg", "kKernels")


def cache_root(cfg) -> Path:
    """``build.cache_dir``, else ``$ETBUILD_CACHE_DIR``, else ``~/.cache/etbuild/builds``."""
    if cfg.build.cache_dir:
        return Path(cfg.build.cache_dir).expanduser()
    env = os.environ.get("ETBUILD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "etbuild" / "builds"


def _tree_digest(h, root: Path, patterns: tuple[str, ...]) -> None:
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0")
                h.update(path.read_bytes() + b"\0")


def cmake_args(cfg, tc: Toolchain) -> list[str]:
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DETB_BUILD_RUNNER=ON",
        f"-DETB_ALL_OPS_RUNNER={'ON' if cfg.build.compare_all_ops else 'OFF'}",
        f"-DETB_OPS_YAML_DIR={OPS_YAML_DIR}",
        f"-DETB_CODEGEN_DIR={CODEGEN_DIR}",
        f"-DPython_EXECUTABLE={sys.executable}",
    ]
    return args + tc.cmake_args


def build_key(cfg, tc: Toolchain, selection: bytes) -> str:
    h = hashlib.sha256()
    h.update(f"etbuild {__version__}\0".encode())
    _tree_digest(h, RUNTIME_SRC_DIR, ("**/*",))
    _tree_digest(h, OPS_YAML_DIR, ("*.yaml",))
    _tree_digest(h, CODEGEN_DIR, ("*.py",))
    h.update(b"selection\0" + selection)
    # Paths that differ between installs but not in effect are left out of the flags.
    flags = [
        a
        for a in cmake_args(cfg, tc)
        if not a.startswith(("-DETB_OPS_YAML_DIR", "-DETB_CODEGEN_DIR", "-DPython_EXECUTABLE"))
    ]
    h.update(json.dumps({"flags": flags, "toolchain": tc.identity}).encode())
    return h.hexdigest()[:24]


def _run(cmd: list[str], log: Path, what: str) -> None:
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise EtbuildError(f"{what} failed (full log: {log}):\n" + "\n".join(tail))


def _stripped_size(tc: Toolchain, binary: Path, tmp: Path) -> int:
    out = tmp / (binary.name + ".stripped")
    subprocess.run([tc.strip, "-o", str(out), str(binary)], check=True, capture_output=True)
    size = out.stat().st_size
    out.unlink()
    return size


def symbol_sizes(tc: Toolchain, binary: Path) -> list[tuple[int, str]]:
    """(size, demangled name) of every sized symbol of ``binary``, largest first."""
    out = subprocess.run(
        [tc.nm, "--size-sort", "-C", "-S", str(binary)], check=True, capture_output=True, text=True
    ).stdout
    syms = []
    for line in out.splitlines():
        m = re.match(r"^[0-9a-fA-F]+ ([0-9a-fA-F]+) (\w) (.*)$", line)
        if m and m.group(2).lower() in "tdr":  # code and data in the file
            syms.append((int(m.group(1), 16), m.group(3)))
    return sorted(syms, reverse=True)


def classify(syms: list[tuple[int, str]]) -> dict:
    kernels = [(n, s) for n, s in syms if s.startswith(KERNEL_NAMESPACES)]
    registration = [
        (n, s)
        for n, s in syms
        if not s.startswith(KERNEL_NAMESPACES) and any(m in s for m in REGISTRATION_MARKERS)
    ]
    return {
        "kernels_bytes": sum(n for n, _ in kernels),
        "registration_bytes": sum(n for n, _ in registration),
        "largest_kernels": [
            [n, s.replace("(anonymous namespace)", "{anon}").split("(")[0]] for n, s in kernels[:10]
        ],
    }


def measure(tc: Toolchain, build_dir: Path, tmp: Path, all_ops: bool) -> dict:
    core = _stripped_size(tc, build_dir / "etb_size_test", tmp)
    sizes: dict = {"core_bytes": core}
    tailored = classify(symbol_sizes(tc, build_dir / "etb_runner"))
    sizes.update(tailored)
    sizes["tailored_bytes"] = core + tailored["kernels_bytes"] + tailored["registration_bytes"]
    sizes["runner_stripped_bytes"] = _stripped_size(tc, build_dir / "etb_runner", tmp)
    if all_ops:
        full = classify(symbol_sizes(tc, build_dir / "etb_runner_all_ops"))
        sizes["all_ops_kernels_bytes"] = full["kernels_bytes"]
        sizes["all_ops_registration_bytes"] = full["registration_bytes"]
        sizes["all_ops_bytes"] = core + full["kernels_bytes"] + full["registration_bytes"]
        sizes["all_ops_runner_stripped_bytes"] = _stripped_size(
            tc, build_dir / "etb_runner_all_ops", tmp
        )
    return sizes


def build_into_cache(cfg, tc: Toolchain, selection_path: Path, entry: Path) -> None:
    """Configure, build and install into a temporary folder, then rename it to ``entry``."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
    try:
        build_dir, install_dir, log = tmp / "build", tmp / "install", tmp / "build.log"
        shutil.copy2(selection_path, tmp / "selected_operators.yaml")
        cmake = shutil.which("cmake") or "cmake"
        _run(
            [
                cmake,
                "-S",
                str(RUNTIME_SRC_DIR),
                "-B",
                str(build_dir),
                "-G",
                "Ninja",
                f"-DETB_SELECTED_OPS={tmp / 'selected_operators.yaml'}",
                *cmake_args(cfg, tc),
            ],
            log,
            "configuring the runtime (cmake)",
        )
        _run([cmake, "--build", str(build_dir)], log, "building the runtime (ninja)")
        _run(
            [cmake, "--install", str(build_dir), "--prefix", str(install_dir)],
            log,
            "installing the runtime",
        )
        sizes = measure(tc, build_dir, tmp, bool(cfg.build.compare_all_ops))
        (tmp / "sizes.json").write_text(json.dumps(sizes, indent=2) + "\n")
        shutil.rmtree(build_dir)  # the cache keeps what a run copies, not the objects
        try:
            os.replace(tmp, entry)
        except OSError:
            if not (entry / "sizes.json").is_file():  # not a concurrent identical build
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def copy_runtime(ctx: Context, src: Path) -> dict[str, str]:
    """Copy the cached install into ``run_dir/runtime`` atomically; {relative path: sha256}."""
    dest = ctx.run_dir / "runtime"
    tmp = Path(tempfile.mkdtemp(dir=ctx.run_dir, prefix=".runtime."))
    try:
        staged = tmp / "runtime"
        shutil.copytree(src, staged, symlinks=True)
        if dest.exists():
            old = tmp / "old"
            os.replace(dest, old)
        os.replace(staged, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        f"runtime/{p.relative_to(dest)}": sha256_file(p)
        for p in sorted(dest.rglob("*"))
        if p.is_file()
    }


def run(ctx: Context) -> None:
    cfg = ctx.cfg
    tc = resolve(cfg.target, need_run=cfg.pipeline.verify.enabled)
    selection = ctx.read("selected_operators.yaml")
    key = build_key(cfg, tc, selection)
    entry = cache_root(cfg) / key
    ctx.note_read("build_cache_key", key)
    hit = (entry / "sizes.json").is_file()
    if not hit:
        build_into_cache(cfg, tc, ctx.run_dir / "selected_operators.yaml", entry)
    sizes = json.loads((entry / "sizes.json").read_text())
    ctx.current.writes.update(copy_runtime(ctx, entry / "install"))
    ctx.artifacts["toolchain"] = tc
    ctx.artifacts["runtime_sizes"] = sizes
    ctx.artifacts["runner"] = ctx.run_dir / "runtime" / "bin" / "etb_runner"
    ctx.summarize(
        cache="hit" if hit else "miss",
        key=key[:12],
        runtime_kb=round(sizes["tailored_bytes"] / 1024, 1),
    )
    budget = cfg.build.size_budget_kb
    if budget is not None and sizes["tailored_bytes"] > budget * 1024:
        raise EtbuildError(
            f"the tailored runtime is {sizes['tailored_bytes'] / 1024:.1f} KiB (core "
            f"{sizes['core_bytes'] / 1024:.1f} + kernels {sizes['kernels_bytes'] / 1024:.1f} + "
            f"registration {sizes['registration_bytes'] / 1024:.1f}), over "
            f"build.size_budget_kb={budget:g}; raise the budget, or use fewer or smaller "
            "operators (quantization, a smaller model)"
        )
