"""The cortex_m target: the runtime and the selected kernels as static libraries for a
Cortex-M4F (bare metal, arm-none-eabi-gcc + newlib), a minimal firmware image whose flash and
RAM the report gives, and a report that says the runtime was built but not run."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from etbuild_test_support import (
    build_cmake_app,
    build_in_process,
    compose_config,
    kernels_in_library,
    run_cli,
    stage_record,
)

pytestmark = pytest.mark.e2e

APT = "apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib"
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None,
    reason=f"needs the Arm bare-metal toolchain (arm-none-eabi-gcc): {APT} (CI installs it)",
)
M4 = ["model=mlp", "+target=cortex_m"]
# What a bare-metal runtime must not call: no file system, no mmap, no OS clock or environment.
OS_CALLS = {"open", "fopen", "mmap", "munmap", "fstat", "clock_gettime", "getenv", "fprintf"}


def _tool(name: str, *args: str) -> str:
    return subprocess.run(
        [f"arm-none-eabi-{name}", *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="session")
def m4_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip(f"needs the Arm bare-metal toolchain (arm-none-eabi-gcc): {APT}")
    run_dir = tmp_path_factory.mktemp("cortex_m_mlp")
    build_in_process(M4, run_dir)
    return run_dir


def test_cortex_m_config_composes_with_the_m4f_defaults() -> None:
    cfg = compose_config(M4)
    assert cfg.target.kind.value == "cortex_m"
    assert cfg.target.compiler_prefix == "arm-none-eabi-"
    assert (cfg.target.cpu, cfg.target.fpu, cfg.target.float_abi.value) == (
        "cortex-m4",
        "fpv4-sp-d16",
        "hard",
    )


def test_a_wrong_float_abi_fails_at_compose_time(tmp_path: Path) -> None:
    proc = run_cli([*M4, "target.float_abi=hardfp", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "target.float_abi" in out and "soft, softfp, hard" in out, out


def test_a_missing_toolchain_names_the_apt_packages(tmp_path: Path) -> None:
    proc = run_cli(
        [*M4, "target.compiler_prefix=no-such-arm-", f"hydra.run.dir={tmp_path}/run"], tmp_path
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "no-such-arm-gcc is not on PATH" in out and APT in out, out
    assert "Traceback" not in out, out
    assert "export" not in proc.stdout and "[1/" not in proc.stdout, out  # before any stage
    assert not (tmp_path / "run" / "model.pte").exists()


def test_no_arm_compiler_on_path_names_the_apt_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from etbuild.pipeline.errors import EtbuildError
    from etbuild.pipeline.toolchain import resolve

    target = compose_config(M4).target
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without arm-none-eabi-gcc
    with pytest.raises(EtbuildError) as err:
        resolve(target)
    assert "arm-none-eabi-gcc is not on PATH" in str(err.value) and APT in str(err.value)


@needs_arm
def test_a_cpu_the_compiler_does_not_know_is_named() -> None:
    from etbuild.pipeline.errors import EtbuildError
    from etbuild.pipeline.toolchain import resolve

    target = compose_config([*M4, "target.cpu=cortex-m99"]).target
    with pytest.raises(EtbuildError, match="target.cpu=cortex-m99"):
        resolve(target)


@needs_arm
def test_libraries_are_built_for_a_cortex_m4_with_hard_float(m4_build: Path) -> None:
    runtime = m4_build / "runtime"
    for rel in (
        "lib/libetb_runtime.a",
        "lib/libetb_kernels.a",
        "bin/etb_firmware.elf",
        "include/register_kernels.h",
        "include/executor/data_loader.h",
        "include/platform/platform.h",
        "lib/cmake/etbuild_runtime/etbuild_runtimeConfig.cmake",
    ):
        assert (runtime / rel).is_file(), rel
    assert not (runtime / "bin/etb_runner").exists()  # no CLI runner on bare metal
    for lib in ("libetb_runtime.a", "libetb_kernels.a"):
        path = str(runtime / "lib" / lib)
        headers = _tool("readelf", "-h", path)
        assert "ELF32" in headers and re.search(r"Machine:\s+ARM\n", headers), headers
        assert "architecture: armv7e-m" in _tool("objdump", "-f", path)
        attrs = _tool("readelf", "-A", path)
        for member in attrs.split("File: ")[1:]:  # every object in the archive
            assert "Tag_CPU_arch: v7E-M" in member, member
            assert "Tag_CPU_arch_profile: Microcontroller" in member, member
            assert "Tag_FP_arch: VFPv4-D16" in member, member  # the M4F's FPv4-SP
            assert "Tag_ABI_VFP_args: VFP registers" in member, member  # -mfloat-abi=hard
    image = _tool("readelf", "-h", str(runtime / "bin/etb_firmware.elf"))
    assert "hard-float ABI" in image, image
    # No file loader, no OS calls in the core.
    nm = _tool("nm", "-C", str(runtime / "lib/libetb_runtime.a"))
    assert "FileDataLoader" not in nm
    # No threads on bare metal: no thread pool, no pthreads, in the runtime or the kernels.
    for lib in ("libetb_runtime.a", "libetb_kernels.a"):
        symbols = _tool("nm", "-C", str(runtime / "lib" / lib))
        assert "ThreadPool" not in symbols and "pthread" not in symbols, lib
    undefined = {line.split()[-1] for line in nm.splitlines() if " U " in line}
    assert not undefined & OS_CALLS, sorted(undefined & OS_CALLS)


@needs_arm
def test_the_kernel_library_holds_only_the_selected_kernels(m4_build: Path) -> None:
    selected = yaml.safe_load((m4_build / "selected_operators.yaml").read_text())["operators"]
    present = kernels_in_library(m4_build / "runtime/lib/libetb_kernels.a", "arm-none-eabi-nm")
    assert present == set(selected), (sorted(present), sorted(selected))


@needs_arm
def test_flash_size_in_the_report_is_what_arm_none_eabi_size_says(m4_build: Path) -> None:
    report = (m4_build / "report.md").read_text()
    assert "## Runtime size (cortex_m)" in report and "## Flash and RAM (bare metal)" in report
    flash = re.search(r"^- flash: ([\d,]+) B .*= text ([\d,]+) \+ data ([\d,]+)$", report, re.M)
    ram = re.search(r"^- RAM: ([\d,]+) B .*static = data ([\d,]+) \+ bss ([\d,]+)", report, re.M)
    assert flash and ram, report
    flash_bytes, text, data = (int(g.replace(",", "")) for g in flash.groups())
    ram_bytes, _, bss = (int(g.replace(",", "")) for g in ram.groups())
    out = _tool("size", "-B", "-d", str(m4_build / "runtime/bin/etb_firmware.elf"))
    size_text, size_data, size_bss = (int(x) for x in out.splitlines()[1].split()[:3])
    assert flash_bytes > 0 and ram_bytes > 0
    assert (text, data, bss) == (size_text, size_data, size_bss), out
    assert flash_bytes == size_text + size_data and ram_bytes == size_data + size_bss
    summary = stage_record(m4_build, "build")["summary"]
    assert summary["flash_kb"] == round(flash_bytes / 1024, 1), summary
    # The program is reported next to the runtime (it is not in the image).
    pte = (m4_build / "model.pte").stat().st_size
    assert f"- program: model.pte is {pte:,} B" in report, report
    assert pte > flash_bytes  # the mlp's weights outweigh its runtime


@needs_arm
def test_report_says_built_not_run(m4_build: Path) -> None:
    status = stage_record(m4_build, "verify")["summary"]["status"]
    assert status.startswith("built, not run") and "Cortex-M" in status, status
    assert f"| status | {status} |" in (m4_build / "report.md").read_text()
    # Nothing ran: the kernels' SIMD path is the one their compile flags give (no vector unit).
    isa = stage_record(m4_build, "verify")["summary"]["kernel_isa"]
    assert isa.startswith("scalar (the target's path from its compile flags"), isa
    assert (
        f"- kernels: the toolchain's default `-march`, SIMD path {isa}"
        in (m4_build / "report.md").read_text()
    )
    assert (
        "- threads: 1 (bare metal: the runtime has no thread pool)"
        in (m4_build / "report.md").read_text()
    )


@needs_arm
def test_an_application_firmware_links_the_installed_runtime(
    m4_build: Path, tmp_path: Path
) -> None:
    """find_package(etbuild_runtime) with the cortex_m toolchain file: a firmware with the
    program in flash (.incbin), linked against the tailored libraries."""
    from etbuild.pipeline.paths import RUNTIME_SRC_DIR

    pte = m4_build / "model.pte"
    app = tmp_path / "app"
    app.mkdir()
    (app / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(app CXX)\n"
        "find_package(etbuild_runtime REQUIRED)\n"
        "add_executable(app main.cpp)\ntarget_link_libraries(app PRIVATE etbuild::runtime)\n"
        "set_target_properties(app PROPERTIES CXX_STANDARD 17)\n"
        "target_compile_options(app PRIVATE -Wall -Wextra -Werror -fno-exceptions -fno-rtti)\n"
    )
    (app / "main.cpp").write_text(
        "#include <cstdint>\n"
        '#include "executor/data_loader.h"\n#include "executor/program.h"\n'
        '#include "register_kernels.h"\n'
        "#ifndef ETB_BARE_METAL\n#error the package config must define ETB_BARE_METAL\n#endif\n"
        '__asm__(".section .rodata.etb_program,\\"a\\"\\n.balign 16\\n.global etb_program\\n'
        f'etb_program:\\n.incbin \\"{pte}\\"\\n.global etb_program_end\\netb_program_end:\\n'
        '.previous\\n");\n'
        'extern "C" const uint8_t etb_program[];\nextern "C" const uint8_t etb_program_end[];\n'
        "int main() {\n"
        "  if (etb::register_all_kernels() != etb::Error::Ok) return 2;\n"
        "  etb::BufferDataLoader loader(etb_program, size_t(etb_program_end - etb_program));\n"
        "  etb::Result<etb::Program> program = etb::Program::load(&loader);\n"
        "  return program.ok() ? int(program->num_methods()) : 1;\n}\n"
    )
    proc = build_cmake_app(
        app,
        f"-DCMAKE_TOOLCHAIN_FILE={RUNTIME_SRC_DIR / 'cmake/cortex_m.cmake'}",
        f"-DCMAKE_PREFIX_PATH={m4_build / 'runtime'}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    image = app / "b" / "app"
    assert "hard-float ABI" in _tool("readelf", "-h", str(image))
    text, data = (int(x) for x in _tool("size", "-B", "-d", str(image)).splitlines()[1].split()[:2])
    assert text + data > pte.stat().st_size  # the program is in flash with the runtime
    assert "etb::native::addmm_out" in _tool("nm", "-C", str(image))
