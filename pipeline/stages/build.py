"""The `build` stage: the runtime with only the selected kernels, for the target's toolchain.

Configures and builds ``runtime_src/`` with CMake + Ninja (``ETB_SELECTED_OPS`` = this run's
selected_operators.yaml; for the host through scikit-build-core, which also packs the wheel
``runtime/wheel/etbuild_runtime-*.whl``) into a cache directory keyed by a hash of the
runtime sources, ops_yaml, codegen, the selection, the toolchain and the flags. A second
identical build, or a sweep job with the same selection, reuses the cached build and compiles
nothing. The cache entry is built in a temporary folder and renamed into place, and the run's
``runtime/`` folder is copied the same way, so neither is ever half-written. Each entry has a
lock (``stage_cache.entry_lock``) held while it is looked up, built and copied from: concurrent
runs on one cache directory build each key once.

With ``build.compare_all_ops`` the report compares against the all-ops runtime: a build with
every kernel, which depends only on the toolchain and flags, so one cached baseline build
serves every selection.

``runtime/`` holds ``lib/`` (libetb_runtime.a: the core; libetb_kernels.a: the selected
kernels and their registration), ``include/``, ``bin/etb_runner`` and
``lib/cmake/etbuild_runtime`` (``find_package(etbuild_runtime)``; targets
``etbuild::runtime``, ``etbuild::core``, ``etbuild::kernels``). A bare-metal target (cortex_m)
has no CLI runner: ``bin/etb_firmware.elf`` is a minimal firmware image whose flash and RAM
(``arm-none-eabi-size``) the stage reports.

The kernels are compiled with ``-march=<target.march>`` (CMake's ``ETB_ARCH``; none when it is
null), which picks their SIMD path in ``kernels/simd.h``. The stage records that path as the
kernels' compile flags give it (``kernel_isa_from_flags``: simd.h preprocessed with the exact
compile command of a kernel source), for every target; verify adds what the runner reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from .. import __version__, process_group
from ..config import TargetKind
from ..errors import EtbuildError
from ..paths import OPS_YAML_DIR, PACKAGE_ROOT, RUNTIME_SRC_DIR
from ..progress import Progress
from ..runner import Context, sha256_file, tree_digest
from ..stage_cache import cache_root, entry_lock, mark_used, remove_stale_temporaries
from ..toolchain import Toolchain, resolve

CODEGEN_DIR = PACKAGE_ROOT / "codegen"
KERNEL_NAMESPACES = ("etb::native::", "etb::quantized::", "etb::prim::")
REGISTRATION_MARKERS = ("register_all_kernels", "::wrap_", "check_tensor_arg", "kKernels")


def cmake_args(cfg, tc: Toolchain) -> list[str]:
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DETB_BUILD_RUNNER=ON",
        "-DETB_ALL_OPS_RUNNER=OFF",  # the all-ops baseline is a build of its own (run())
        f"-DETB_OPS_YAML_DIR={OPS_YAML_DIR}",
        f"-DETB_CODEGEN_DIR={CODEGEN_DIR}",
        f"-DPython_EXECUTABLE={sys.executable}",
    ]
    return args + tc.cmake_args


def build_inputs(cfg, tc: Toolchain):
    """A hash of what every build for this toolchain shares: the etbuild version, the runtime
    sources, ops_yaml, codegen, this module, the flags and the compiler's identity."""
    h = hashlib.sha256()
    h.update(f"etbuild {__version__}\0".encode())
    tree_digest(h, RUNTIME_SRC_DIR, ("**/*",))
    tree_digest(h, OPS_YAML_DIR, ("*.yaml",))
    tree_digest(h, CODEGEN_DIR, ("*.py",))
    h.update(Path(__file__).read_bytes())  # how the build is driven (wheel, install)
    # Paths that differ between installs but not in effect are left out of the flags.
    flags = [
        a
        for a in cmake_args(cfg, tc)
        if not a.startswith(("-DETB_OPS_YAML_DIR", "-DETB_CODEGEN_DIR", "-DPython_EXECUTABLE"))
    ]
    h.update(json.dumps({"flags": flags, "toolchain": tc.identity}).encode())
    return h


def build_key(
    inputs,
    selection: bytes | None,
    wheel: bool,
    backend_dirs: list[Path] = (),
    backend_args: list[str] = (),
) -> str:
    """The build cache key from ``build_inputs``; ``selection`` None: the all-ops baseline.
    The sources of the delegate backends linked, and their CMake arguments, count too."""
    h = inputs.copy()
    for a in backend_args:
        h.update(f"backend arg {a}\0".encode())
    if wheel:
        h.update(f"wheel for python {sys.version}\0".encode())
    h.update(b"all ops\0" if selection is None else b"selection\0" + selection)
    for d in backend_dirs:
        h.update(f"backend {d.name}\0".encode())
        tree_digest(h, d, ("**/*",))
    return h.hexdigest()[:24]


def backend_dirs(cfg, ids: list[str]) -> list[Path]:
    """The C++ folders of the delegate backends the programs call: the configured
    partitioner's backend provides its own; a program that calls another one is an error."""
    if not ids:
        return []
    provided: dict[str, Path] = {}
    if cfg.partitioner.name != "none":
        from ..partition import load_backend

        backend = load_backend(cfg.partitioner)
        provided[backend.id] = Path(backend.runtime_dir)
    missing = [i for i in ids if i not in provided]
    if missing:
        have = (
            f"this build's partitioner provides {', '.join(provided)}"
            if provided
            else ("this build has no partitioner")
        )
        raise EtbuildError(
            f"the programs call delegate backend(s) {', '.join(missing)}, and {have}; build "
            "with the +partitioner=<option> whose backend has that id, or leave the program "
            "out of selection.programs"
        )
    dirs = [provided[i] for i in ids]
    for d in dirs:
        if not (d / "CMakeLists.txt").is_file():
            raise EtbuildError(
                f"backend {d.name}: {d} has no CMakeLists.txt; a backend's runtime_dir holds its "
                "C++ sources and a CMakeLists.txt that calls etb_add_backend()"
            )
    return dirs


def backend_cmake_args(cfg) -> list[str]:
    """The CMake arguments the configured partitioner's backend asks for (its optional
    ``cmake_args``: where its library is, say)."""
    if cfg.partitioner.name == "none":
        return []
    from ..partition import load_backend

    return [str(a) for a in getattr(load_backend(cfg.partitioner), "cmake_args", [])]


def _run(
    cmd: list[str], log: Path, what: str, cwd: Path | None = None, compiles: bool = False
) -> None:
    """Run a build command into ``log``; ``compiles``: show ninja's progress while it runs."""
    with open(log, "ab") as f, Progress(what) if compiles else nullcontext() as progress:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        returncode = process_group.run(cmd, f, cwd=str(cwd) if cwd else None, progress=progress)
    if returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise EtbuildError(f"{what} failed (full log: {log}):\n" + "\n".join(tail))


# kernels/simd.h defines ETB_SIMD_<PATH> for the one path it compiles; kernel_isa() names it.
SIMD_PATHS = {
    "AVX512": "avx512",
    "AVX2": "avx2",
    "SSE2": "sse2",
    "NEON": "neon",
    "SCALAR": "scalar",
}


def kernel_isa_from_flags(build_dir: Path) -> str:
    """The SIMD path of ``kernels/simd.h`` under the kernels' compile flags (the only word on
    it for a build that cannot run here): the compile command of ``kernels/portable/util.cpp``
    (which defines ``etb::kernel_isa()``) from ``compile_commands.json``, run as a preprocessor
    over simd.h. "unknown" when that cannot be done."""
    try:
        commands = json.loads((build_dir / "compile_commands.json").read_text())
        entry = next(
            e for e in commands if Path(e["file"]).as_posix().endswith("kernels/portable/util.cpp")
        )
    except (OSError, ValueError, StopIteration):
        return "unknown"
    args = entry.get("arguments") or shlex.split(entry["command"])
    cmd: list[str] = []
    skip = False
    for a in args:  # the compiler and its flags, without the source, the object and depfiles
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
        elif a not in ("-c", "-MD", "-MMD", entry["file"]):
            cmd.append(a)
    try:
        proc = subprocess.run(
            [*cmd, "-E", "-dM", "-x", "c++", "-"],
            input='#include "kernels/simd.h"\n',
            cwd=entry["directory"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    found = re.findall(r"^#define ETB_SIMD_([A-Z0-9]+) ", proc.stdout, re.M)
    paths = [SIMD_PATHS[f] for f in found if f in SIMD_PATHS]
    return paths[0] if proc.returncode == 0 and len(paths) == 1 else "unknown"


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


def firmware_size(tc: Toolchain, image: Path) -> dict[str, int]:
    """A bare-metal image's sections as ``size -B`` counts them: text (code and read-only
    data), data (initialized), bss; flash = text + data, RAM = data + bss."""
    out = subprocess.run(
        [tc.size, "-B", "-d", str(image)], check=True, capture_output=True, text=True
    ).stdout
    text, data, bss = (int(x) for x in out.splitlines()[1].split()[:3])
    return {"text": text, "data": data, "bss": bss, "flash": text + data, "ram": data + bss}


def measure(tc: Toolchain, build_dir: Path, tmp: Path) -> dict:
    # Bare metal (tc.size): etb_size_test and etb_runner are firmware images (no kernels; the
    # selected ones); the core is what the image without kernels takes in flash.
    bare_metal = bool(tc.size)
    if bare_metal:
        core = firmware_size(tc, build_dir / "etb_size_test")["flash"]
    else:
        core = _stripped_size(tc, build_dir / "etb_size_test", tmp)
    sizes: dict = {"core_bytes": core}
    tailored = classify(symbol_sizes(tc, build_dir / "etb_runner"))
    sizes.update(tailored)
    sizes["tailored_bytes"] = core + tailored["kernels_bytes"] + tailored["registration_bytes"]
    sizes["runner_stripped_bytes"] = _stripped_size(tc, build_dir / "etb_runner", tmp)
    if bare_metal:
        image = firmware_size(tc, build_dir / "etb_runner")
        sizes.update({f"{k}_bytes": v for k, v in image.items()})
        sizes["core_ram_bytes"] = firmware_size(tc, build_dir / "etb_size_test")["ram"]
    return sizes


def baseline_sizes(full: dict) -> dict:
    """The all-ops build's sizes as the ``all_ops_*`` comparison fields of a tailored build."""
    out = {
        "all_ops_kernels_bytes": full["kernels_bytes"],
        "all_ops_registration_bytes": full["registration_bytes"],
        "all_ops_bytes": full["tailored_bytes"],
        "all_ops_runner_stripped_bytes": full["runner_stripped_bytes"],
    }
    if "flash_bytes" in full:
        out["all_ops_flash_bytes"] = full["flash_bytes"]
    return out


WHEEL_PACKAGE = "etbuild_runtime"


def wants_wheel(cfg, tc: Toolchain) -> bool:
    return bool(cfg.build.wheel) and tc.kind == TargetKind.host


def build_wheel(defines: list[str], key: str, build_dir: Path, wheel_dir: Path, log: Path) -> Path:
    """Configure and build the runtime through scikit-build-core, which also packs the Python
    module with only the selected kernels into a wheel (package ``etbuild_runtime``, version
    ``<etbuild version>+<build key>``). ``build_dir`` keeps the whole build (libraries, runner)
    for the install step that follows."""
    project = build_dir.parent / "wheel_project"
    project.mkdir()
    args = [
        *defines,
        f"-DETB_PYTHON_PACKAGE={WHEEL_PACKAGE}",
        "-DETB_BUILD_PYTHON=ON",
        f"-DETB_NB_DOMAIN=etb_{key}",
    ]
    (project / "pyproject.toml").write_text(
        "\n".join(
            [
                "[build-system]",
                'requires = ["scikit-build-core>=0.10", "nanobind>=2.0"]',
                'build-backend = "scikit_build_core.build"',
                "[project]",
                f'name = "{WHEEL_PACKAGE.replace("_", "-")}"',
                f'version = "{__version__}+{key}"',
                'description = "The etbuild runtime with one build\'s selected kernels"',
                "[tool.scikit-build]",
                f"cmake.source-dir = {json.dumps(str(RUNTIME_SRC_DIR))}",
                f"build-dir = {json.dumps(str(build_dir))}",
                f"cmake.args = {json.dumps(args)}",
                'install.components = ["python_module"]',
                "wheel.packages = []",
                "wheel.license-files = []",
                "",
            ]
        )
    )
    wheel_dir.mkdir(parents=True)
    code = "import sys, scikit_build_core.build as b; b.build_wheel(sys.argv[1])"
    _run(
        [sys.executable, "-c", code, str(wheel_dir)],
        log,
        "building the runtime and its wheel (scikit-build-core)",
        cwd=project,
        compiles=True,
    )
    return next(wheel_dir.glob("*.whl"))


def build_into_cache(
    cfg,
    tc: Toolchain,
    selection_path: Path | None,
    entry: Path,
    wheel: bool,
    backends: list[Path] = (),
    backend_args: list[str] = (),
) -> None:
    """Configure, build and install into a temporary folder, then rename it to ``entry``.
    ``selection_path`` None: every kernel (the all-ops baseline)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
    try:
        build_dir, install_dir, log = tmp / "build", tmp / "install", tmp / "build.log"
        cmake = shutil.which("cmake") or "cmake"
        # compile_commands.json: the kernels' flags, for kernel_isa_from_flags.
        defines = [*cmake_args(cfg, tc), "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"]
        if selection_path is not None:
            shutil.copy2(selection_path, tmp / "selected_operators.yaml")
            defines = [f"-DETB_SELECTED_OPS={tmp / 'selected_operators.yaml'}", *defines]
        if backends:
            defines.append(f"-DETB_BACKEND_DIRS={';'.join(str(d) for d in backends)}")
            defines.extend(backend_args)
        if wheel:
            build_wheel(defines, entry.name, build_dir, install_dir / "wheel", log)
        else:
            _run(
                [cmake, "-S", str(RUNTIME_SRC_DIR), "-B", str(build_dir), "-G", "Ninja", *defines],
                log,
                "configuring the runtime (cmake)",
            )
            _run(
                [cmake, "--build", str(build_dir)],
                log,
                "building the runtime (ninja)",
                compiles=True,
            )
        _run(
            [cmake, "--install", str(build_dir), "--prefix", str(install_dir)],
            log,
            "installing the runtime",
        )
        sizes = measure(tc, build_dir, tmp)
        sizes["kernel_isa"] = kernel_isa_from_flags(build_dir)
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


@contextmanager
def cached_build(
    cfg,
    tc: Toolchain,
    key: str,
    selection_path: Path | None,
    wheel: bool,
    backends: list[Path] = (),
    backend_args: list[str] = (),
) -> Iterator[tuple[Path, bool]]:
    """The build cache entry of ``key``, built now unless present: yields (entry, was it a
    hit) with the entry's lock held, so concurrent runs build each key once (the others wait,
    then hit) and nothing prunes the entry while the caller copies out of it."""
    with locked_entry(
        cache_root(cfg),
        key,
        "sizes.json",
        lambda entry: build_into_cache(
            cfg, tc, selection_path, entry, wheel, backends, backend_args
        ),
    ) as found:
        yield found


@contextmanager
def locked_entry(
    root: Path, key: str, marker: str, build: Callable[[Path], None]
) -> Iterator[tuple[Path, bool]]:
    """The build cache entry ``key`` (complete once it holds ``marker``), made by
    ``build(entry)`` unless present: yields (entry, was it a hit) with the entry's lock held."""
    entry = root / "builds" / key
    with entry_lock(root, "builds", key):
        hit = (entry / marker).is_file()
        if hit:
            mark_used(entry)
        else:
            remove_stale_temporaries(entry)
            build(entry)
        yield entry, hit


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


def build_firmware(ctx: Context, tc: Toolchain, runtime_key: str) -> tuple[Path, bool]:
    """cortex_m with target.board: the firmware that runs model.pte on the board
    (``firmware/firmware.elf``; the generated banks.c, banks.ld, program.c beside it). Cached
    in ``build.cache_dir/builds/fw-<key>``, keyed by the runtime build's key (which covers
    runtime_src/, the firmware's sources included), the generated sources, the program's bytes
    and this stage's code: an identical build links nothing. Returns (entry, was it a hit)."""
    from .. import firmware, pte

    cfg = ctx.cfg
    board = firmware.load_board(tc.board)
    program = ctx.run_dir / "model.pte"
    tables = pte.bank_tables(program.read_bytes())
    if tables is None:
        raise EtbuildError(
            "model.pte has no memory bank table, so the firmware cannot name its banks; "
            "rebuild the program with this version of etbuild"
        )
    banks = firmware.firmware_banks(tables[0], cfg.memory.banks, board)
    firmware.check_fit(banks, board)
    out = ctx.run_dir / "firmware"
    tmp = Path(tempfile.mkdtemp(dir=ctx.run_dir, prefix=".firmware."))
    try:
        generated = tmp / "firmware"
        alignment = max(16, int(cfg.pipeline.emit.segment_alignment))
        firmware.generate(banks, program, generated, alignment)
        h = hashlib.sha256(f"firmware {runtime_key} {board.name} {alignment}\0".encode())
        for f in ("banks.c", "banks.ld"):
            h.update((generated / f).read_bytes())
        h.update(program.read_bytes())
        h.update(Path(firmware.__file__).read_bytes())
        h.update(Path(__file__).read_bytes())
        key = "fw-" + h.hexdigest()[:24]

        def link(entry: Path) -> None:
            entry.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{key}."))
            try:
                elf = firmware.build(
                    tc.cmake_args,
                    ctx.run_dir / "runtime",
                    board,
                    banks,
                    generated,
                    staging / "build",
                    staging / "firmware.log",
                )
                (staging / "entry").mkdir()
                shutil.copy2(elf, staging / "entry" / "firmware.elf")
                shutil.copy2(staging / "build" / "firmware.map", staging / "entry")
                os.replace(staging / "entry", entry)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

        with locked_entry(cache_root(cfg), key, "firmware.elf", link) as (entry, hit):
            for f in ("firmware.elf", "firmware.map"):
                shutil.copy2(entry / f, generated / f)
        if out.exists():
            os.replace(out, tmp / "old")
        os.replace(generated, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    facts = firmware.measure(tc, out / "firmware.elf", board, banks, cfg.memory.banks)
    facts["board"] = board.name
    (out / "sizes.json").write_text(json.dumps(facts, indent=1) + "\n")
    for f in ("banks.c", "banks.ld", "program.c", "firmware.elf"):
        ctx.current.writes[f"firmware/{f}"] = sha256_file(out / f)
    ctx.artifacts["firmware"] = facts
    ctx.artifacts["firmware_elf"] = out / "firmware.elf"
    ctx.summarize(
        board=board.name,
        firmware_cache="hit" if hit else "miss",
        firmware_flash_kb=round(facts["flash_bytes"] / 1024, 1),
        firmware_static_ram_kb=round(facts["static_ram_bytes"] / 1024, 1),
    )
    ctx.measure(
        firmware_flash_bytes=facts["flash_bytes"],
        firmware_static_ram_bytes=facts["static_ram_bytes"],
        firmware_bank_bytes={b["name"]: b["bytes"] for b in facts["banks"]},
    )
    return entry, hit


def run(ctx: Context) -> None:
    cfg = ctx.cfg
    tc = resolve(cfg.target, need_run=cfg.pipeline.verify.enabled)
    selection = ctx.read("selected_operators.yaml")
    wheel = wants_wheel(cfg, tc)
    inputs = build_inputs(cfg, tc)
    backends = backend_dirs(cfg, ctx.artifacts["backends"])
    backend_args = backend_cmake_args(cfg) if backends else []
    key = build_key(inputs, selection, wheel, backends, backend_args)
    ctx.note_read("build_cache_key", key)
    selection_path = ctx.run_dir / "selected_operators.yaml"
    with cached_build(cfg, tc, key, selection_path, wheel, backends, backend_args) as (entry, hit):
        sizes = json.loads((entry / "sizes.json").read_text())
        ctx.current.writes.update(copy_runtime(ctx, entry / "install"))
    used = [entry]
    if cfg.build.compare_all_ops:
        # The all-ops runtime does not depend on the selection: one baseline build per
        # toolchain and flags serves every selection.
        with cached_build(cfg, tc, build_key(inputs, None, False), None, False) as (base, hit_all):
            sizes = {**sizes, **baseline_sizes(json.loads((base / "sizes.json").read_text()))}
        used.append(base)
    ctx.artifacts["toolchain"] = tc
    ctx.artifacts["build_cache_entries"] = used
    ctx.artifacts["runtime_sizes"] = sizes
    ctx.artifacts["kernel_isa"] = sizes["kernel_isa"]
    ctx.artifacts["runner"] = ctx.run_dir / "runtime" / "bin" / "etb_runner"
    ctx.summarize(
        cache="hit" if hit else "miss",
        key=key[:12],
        runtime_kb=round(sizes["tailored_bytes"] / 1024, 1),
        march=tc.march or "default",
        kernel_isa=sizes["kernel_isa"],
    )
    if cfg.build.compare_all_ops:
        ctx.summarize(all_ops_cache="hit" if hit_all else "miss")
    ctx.measure(runtime_bytes=sizes["tailored_bytes"])
    if "flash_bytes" in sizes:  # bare metal: the firmware image's flash and static RAM
        ctx.summarize(
            flash_kb=round(sizes["flash_bytes"] / 1024, 1),
            ram_kb=round(sizes["ram_bytes"] / 1024, 1),
        )
        ctx.measure(flash_bytes=sizes["flash_bytes"], ram_bytes=sizes["ram_bytes"])
    if tc.board:
        fw_entry, _ = build_firmware(ctx, tc, key)
        ctx.artifacts["build_cache_entries"].append(fw_entry)
    budget = cfg.build.size_budget_kb
    if budget is not None and sizes["tailored_bytes"] > budget * 1024:
        raise EtbuildError(
            f"the tailored runtime is {sizes['tailored_bytes'] / 1024:.1f} KiB (core "
            f"{sizes['core_bytes'] / 1024:.1f} + kernels {sizes['kernels_bytes'] / 1024:.1f} + "
            f"registration {sizes['registration_bytes'] / 1024:.1f}), over "
            f"build.size_budget_kb={budget:g}; raise the budget, or use fewer or smaller "
            "operators (quantization, a smaller model)"
        )
