"""Target toolchains: how to configure the runtime's CMake build for a target, which binary
tools (strip, nm) read its output, and how (whether) its runner can run on this machine.

Host tools (flatc, codegen) always run on the build machine: the runtime's CMake project runs
them through custom commands with the host Python, never through the target compiler.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from .config import MARCH_EXPECTED, MARCH_PATTERN, FloatAbi, TargetKind
from .errors import EtbuildError
from .paths import RUNTIME_SRC_DIR


@dataclass
class Toolchain:
    """A resolved target toolchain."""

    kind: TargetKind
    cmake_args: list[str]
    strip: str
    nm: str
    # The command prefix that runs a target binary here ([] = natively); None: cannot run.
    run_prefix: list[str] | None
    not_runnable_reason: str = ""
    # What identifies the compiler for the build cache (its path and --version output).
    identity: list[str] = field(default_factory=list)
    # Bare metal: the GNU size tool that reports a firmware image's flash and RAM.
    size: str = ""
    # The kernels' -march (CMake's ETB_ARCH): "native", an -march value, or "" (the
    # toolchain's default).
    march: str = ""
    # The threads the runtime splits its kernels over (target.threads).
    threads: int = 1
    # cortex_m: the board a firmware is built for ("": none) and the qemu-system-arm that
    # runs it ("": not installed, see not_runnable_reason).
    board: str = ""
    qemu: str = ""

    @property
    def runnable(self) -> bool:
        return self.run_prefix is not None


def _version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return ""
    return out.stdout.strip()


def _which(name: str, what: str, apt_package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise EtbuildError(
            f"{what} {name!r} is not installed (not on PATH); install it with "
            f"`apt-get install {apt_package}` (Debian/Ubuntu)"
        )
    return path


def target_march(tcfg: DictConfig) -> str:
    """``target.march`` as the value of CMake's ETB_ARCH ("" for null: the toolchain's default),
    checked: one -march word, ``native`` only for the host, none for cortex_m (``-mcpu``)."""
    march = "" if tcfg.get("march") is None else str(tcfg.march)
    if not re.fullmatch(MARCH_PATTERN, march):
        raise EtbuildError(f"target.march={march!r} is not valid: it must be {MARCH_EXPECTED}")
    kind = TargetKind(tcfg.kind)
    if march == "native" and kind != TargetKind.host:
        raise EtbuildError(
            f"target.march=native compiles for this machine's CPU, which is not the "
            f"{kind.value} target's; set target.march=null (the toolchain's default) or an "
            "-march value of the target (e.g. armv8.2-a)"
        )
    if march and kind == TargetKind.cortex_m:
        raise EtbuildError(
            f"target.march={march!r}: a cortex_m build names its core with target.cpu "
            "(-mcpu), not -march; set target.march=null"
        )
    return march


def _host(tcfg: DictConfig) -> Toolchain:
    cxx = os.environ.get("CXX") or "c++"
    compiler = shutil.which(cxx)
    if compiler is None:
        raise EtbuildError(
            f"no C++ compiler: {cxx!r} is not on PATH; install one (`apt-get install g++`) "
            "or set CXX"
        )
    strip = shutil.which("strip") or _which("strip", "the strip tool", "binutils")
    nm = shutil.which("nm") or _which("nm", "the nm tool", "binutils")
    march = target_march(tcfg)
    cpu = platform.machine()
    if march == "native":  # the build depends on this CPU's features (an -march level does not)
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith(("flags", "Features")):
                    cpu += " " + line
                    break
        except OSError:
            pass
    return Toolchain(
        kind=TargetKind.host,
        cmake_args=[f"-DCMAKE_CXX_COMPILER={compiler}", f"-DETB_ARCH={march}"],
        strip=strip,
        nm=nm,
        run_prefix=[],
        identity=[compiler, _version(compiler), cpu],
        march=march,
    )


def _linux_aarch64(tcfg: DictConfig, need_run: bool) -> Toolchain:
    prefix = tcfg.compiler_prefix or "aarch64-linux-gnu-"
    apt = "g++-aarch64-linux-gnu"
    march = target_march(tcfg)
    args = [f"-DETB_ARCH={march}"]
    if tcfg.toolchain_file:
        file = _existing(tcfg.toolchain_file, "target.toolchain_file")
        args.append(f"-DCMAKE_TOOLCHAIN_FILE={file}")
        compiler = shutil.which(f"{prefix}g++") or ""
    else:
        compiler = _which(f"{prefix}g++", "the aarch64 cross compiler", apt)
        args += [
            "-DCMAKE_SYSTEM_NAME=Linux",
            "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            f"-DCMAKE_CXX_COMPILER={compiler}",
        ]
    strip = _which(f"{prefix}strip", "the aarch64 strip tool", "binutils-aarch64-linux-gnu")
    nm = _which(f"{prefix}nm", "the aarch64 nm tool", "binutils-aarch64-linux-gnu")
    run_prefix: list[str] | None = None
    reason = ""
    qemu = shutil.which(tcfg.qemu)
    if platform.machine() in ("aarch64", "arm64"):
        run_prefix = []
    elif qemu is not None:
        run_prefix = [qemu, "-L", tcfg.qemu_sysroot]
    elif need_run:
        raise EtbuildError(
            f"verifying a linux_aarch64 build runs its runner under {tcfg.qemu!r}, which is not "
            "installed; install it with `apt-get install qemu-user`, or set "
            "pipeline.verify.enabled=false"
        )
    else:
        reason = f"{tcfg.qemu} is not installed"
    return Toolchain(
        kind=TargetKind.linux_aarch64,
        cmake_args=args,
        strip=strip,
        nm=nm,
        run_prefix=run_prefix,
        not_runnable_reason=reason,
        identity=[compiler, _version(compiler) if compiler else "", str(tcfg.toolchain_file)],
        march=march,
    )


def _existing(path: str, key: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise EtbuildError(f"{key}={path!r}: no such file")
    return str(p.resolve())


def find_ndk(tcfg: DictConfig) -> Path:
    """The Android NDK: ``target.ndk``, else ``$ANDROID_NDK_HOME``, else ``$ANDROID_NDK_ROOT``."""
    for where, value in (
        ("target.ndk", tcfg.ndk),
        ("ANDROID_NDK_HOME", os.environ.get("ANDROID_NDK_HOME")),
        ("ANDROID_NDK_ROOT", os.environ.get("ANDROID_NDK_ROOT")),
    ):
        if not value:
            continue
        ndk = Path(value).expanduser()
        if not (ndk / "build/cmake/android.toolchain.cmake").is_file():
            raise EtbuildError(
                f"{where}={value!r} is not an Android NDK (it has no "
                "build/cmake/android.toolchain.cmake); point it at the NDK's root folder"
            )
        return ndk.resolve()
    raise EtbuildError(
        "target android needs the Android NDK, and none was found: set target.ndk=/path/to/ndk "
        "on the command line, or the ANDROID_NDK_HOME or ANDROID_NDK_ROOT environment variable "
        "(get the NDK from https://developer.android.com/ndk/downloads or `sdkmanager ndk`)"
    )


def _android(tcfg: DictConfig) -> Toolchain:
    march = target_march(tcfg)
    ndk = find_ndk(tcfg)
    bins = sorted((ndk / "toolchains/llvm/prebuilt").glob("*/bin"))
    if not bins:
        raise EtbuildError(f"the NDK at {ndk} has no toolchains/llvm/prebuilt/<host>/bin")
    strip, nm = str(bins[0] / "llvm-strip"), str(bins[0] / "llvm-nm")
    return Toolchain(
        kind=TargetKind.android,
        cmake_args=[
            f"-DCMAKE_TOOLCHAIN_FILE={ndk / 'build/cmake/android.toolchain.cmake'}",
            f"-DANDROID_ABI={tcfg.abi}",
            f"-DANDROID_PLATFORM=android-{tcfg.api_level}",
            f"-DETB_ARCH={march}",
            "-DETB_WERROR=OFF",  # the NDK's clang is not in this project's CI
        ],
        strip=strip,
        nm=nm,
        run_prefix=None,
        not_runnable_reason="no Android device is attached to this build machine",
        identity=[
            str(ndk),
            (ndk / "source.properties").read_text()
            if (ndk / "source.properties").is_file()
            else "",
        ],
        march=march,
    )


CORTEX_M_APT = "gcc-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib"
QEMU_APT = "apt-get install qemu-system-arm"


def cortex_m_flags(tcfg: DictConfig) -> list[str]:
    """The compiler flags that select the Cortex-M core, its FPU and the float ABI."""
    flags = [f"-mcpu={tcfg.cpu}", "-mthumb", f"-mfloat-abi={FloatAbi(tcfg.float_abi).value}"]
    if tcfg.fpu:
        flags.append(f"-mfpu={tcfg.fpu}")
    return flags


def _cortex_m(tcfg: DictConfig) -> Toolchain:
    march = target_march(tcfg)  # always "": the core is target.cpu
    prefix = tcfg.compiler_prefix or "arm-none-eabi-"
    install = f"install the toolchain with `apt-get install {CORTEX_M_APT}` (Debian/Ubuntu)"
    found = {}
    for tool in ("gcc", "g++", "ar", "ranlib", "strip", "nm", "size"):
        path = shutil.which(f"{prefix}{tool}")
        if path is None:
            raise EtbuildError(
                f"target cortex_m needs the Arm bare-metal toolchain, and {prefix}{tool} is not "
                f"on PATH (target.compiler_prefix={prefix}); {install}"
            )
        found[tool] = path
    gcc, gxx = found["gcc"], found["g++"]
    flags = cortex_m_flags(tcfg)
    # The core, FPU and float ABI must be ones this compiler knows and has a C library for.
    probe = subprocess.run(
        [gxx, *flags, "-std=c++17", "-fsyntax-only", "-x", "c++", "-"],
        input="#include <cstdio>\n#include <cstring>\n#include <new>\nint main() { return 0; }\n",
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        err = probe.stderr.strip().splitlines()
        first = next((line for line in err if "error" in line), err[0] if err else "")
        if "No such file" in first:  # a missing <cstdio> (libstdc++) or <stdio.h> (newlib)
            hint = f"the C or C++ library headers are missing; {install}"
        else:
            hint = (
                f"check target.cpu={tcfg.cpu}, target.fpu={tcfg.fpu} and "
                f"target.float_abi={FloatAbi(tcfg.float_abi).value}"
            )
        raise EtbuildError(f"{gxx} cannot compile for {' '.join(flags)}: {first}; {hint}")
    for lib, package in (
        ("libc_nano.a", "libnewlib-arm-none-eabi"),
        ("libstdc++_nano.a", "libstdc++-arm-none-eabi-newlib"),
    ):
        where = subprocess.run(
            [gxx, *flags, f"-print-file-name={lib}"], capture_output=True, text=True
        ).stdout.strip()
        if not Path(where).is_absolute() or not Path(where).is_file():
            raise EtbuildError(
                f"target cortex_m links newlib-nano, and {gxx} has no {lib} for "
                f"{' '.join(flags)}; install it with `apt-get install {package}` (Debian/Ubuntu)"
            )
    if tcfg.toolchain_file:
        toolchain_file = _existing(tcfg.toolchain_file, "target.toolchain_file")
    else:
        toolchain_file = str(RUNTIME_SRC_DIR / "cmake" / "cortex_m.cmake")
    board = "" if tcfg.get("board") is None else str(tcfg.board)
    qemu = ""
    reason = f"bare-metal {tcfg.cpu} libraries, no firmware (target.board=null): not run"
    if board:
        from .firmware import check_target, load_board

        b = load_board(board)
        check_target(b, tcfg)
        qemu = shutil.which(tcfg.qemu) or ""
        reason = (
            ""
            if qemu
            else f"{tcfg.qemu} is not installed; install it with `{QEMU_APT}` to run the "
            f"{b.name} firmware"
        )
    return Toolchain(
        kind=TargetKind.cortex_m,
        cmake_args=[
            f"-DCMAKE_TOOLCHAIN_FILE={toolchain_file}",
            f"-DETB_ARM_TOOLCHAIN_PREFIX={gcc[: -len('gcc')]}",
            f"-DETB_ARM_CPU={tcfg.cpu}",
            f"-DETB_ARM_FPU={tcfg.fpu or ''}",
            f"-DETB_ARM_FLOAT_ABI={FloatAbi(tcfg.float_abi).value}",
            "-DETB_BARE_METAL=ON",
            f"-DETB_ARCH={march}",
        ],
        strip=found["strip"],
        nm=found["nm"],
        size=found["size"],
        run_prefix=[qemu] if qemu else None,
        not_runnable_reason=reason,
        identity=[gxx, _version(gxx), str(tcfg.toolchain_file)],
        board=board,
        qemu=qemu,
    )


# The runtime's thread pool holds at most this many threads (ThreadPool::kMaxThreads).
MAX_THREADS = 64


def target_threads(tcfg: DictConfig) -> int:
    """``target.threads``, checked: 1 to MAX_THREADS, and 1 on bare metal (no threads)."""
    threads = int(tcfg.threads)
    if not 1 <= threads <= MAX_THREADS:
        raise EtbuildError(
            f"target.threads={threads} is not valid: it must be 1 to {MAX_THREADS} (the threads "
            "the runtime splits its kernels over, the calling thread included)"
        )
    if threads != 1 and TargetKind(tcfg.kind) == TargetKind.cortex_m:
        raise EtbuildError(
            f"target.threads={threads}: a cortex_m build is bare metal and has no threads; "
            "set target.threads=1"
        )
    return threads


def resolve(tcfg: DictConfig, need_run: bool = True) -> Toolchain:
    """The toolchain for a ``target`` config; raises EtbuildError naming what to install or
    set when something is missing. ``need_run``: verify will run the runner here."""
    kind = TargetKind(tcfg.kind)
    threads = target_threads(tcfg)
    builders = {
        TargetKind.host: lambda: _host(tcfg),
        TargetKind.linux_aarch64: lambda: _linux_aarch64(tcfg, need_run),
        TargetKind.android: lambda: _android(tcfg),
        TargetKind.cortex_m: lambda: _cortex_m(tcfg),
    }
    if kind in builders:
        tc = builders[kind]()
        tc.threads = threads
        return tc
    raise EtbuildError(
        f"target.kind={kind.value} is not supported by this version of etbuild; use "
        "+target=host, +target=linux_aarch64, +target=android or +target=cortex_m"
    )
