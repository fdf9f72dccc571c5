"""The cortex_m target: the runtime and the selected kernels as static libraries for a
Cortex-M4F (bare metal, arm-none-eabi-gcc + newlib), a minimal firmware image whose flash and
RAM the report gives, and a firmware for qemu-system-arm's mps2-an386 that runs the program
(each memory bank in its linker section and region), which verify runs and checks (fp32
against eager, int8 exactly against the lowered graph's reference execution)."""

from __future__ import annotations

import json
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
QEMU_APT = "apt-get install qemu-system-arm"
needs_qemu = pytest.mark.skipif(
    shutil.which("qemu-system-arm") is None,
    reason=f"needs qemu-system-arm to run the firmware: {QEMU_APT} (CI installs it)",
)
# The emulated board's memory preset, with the fast bank shrunk below the mlp's plan so that
# activations spill to PSRAM: both RAM banks then hold planned bytes.
M4 = ["model=mlp", "+target=cortex_m", "+memory=mps2_an386", "memory.banks.0.size_bytes=16384"]
M4_CONTEXT: dict = {}  # m4_build's in-memory artifacts (program IR, plan)
# The int8 build copies its weights into SRAM at load (memory.constants=copy; the board's
# "flash" made slower than SRAM so that a copy gains): the firmware's runtime does the copy.
M4_PTQ = [
    "model=mlp",
    "+target=cortex_m",
    "+memory=mps2_an386",
    "+quant=ptq",
    "memory.constants=copy",
    "memory.banks.2.read_cost=3.0",
]
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
    M4_CONTEXT["ctx"] = build_in_process(M4, run_dir)
    return run_dir


@pytest.fixture(scope="session")
def m4_ptq_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip(f"needs the Arm bare-metal toolchain (arm-none-eabi-gcc): {APT}")
    run_dir = tmp_path_factory.mktemp("cortex_m_mlp_ptq")
    build_in_process(M4_PTQ, run_dir)
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
@needs_qemu
def test_the_firmware_runs_under_qemu_and_verifies_fp32(m4_build: Path) -> None:
    summary = stage_record(m4_build, "verify")["summary"]
    assert summary["status"] == "ran under qemu-system-arm -M mps2-an386", summary
    assert summary["max_rel_error"] <= 1e-4, summary
    report = (m4_build / "report.md").read_text()
    assert "| status | ran under qemu-system-arm -M mps2-an386 |" in report
    assert "built, not run" not in report
    # Nothing reports the SIMD path on the board: it is the one the compile flags give.
    isa = summary["kernel_isa"]
    assert isa.startswith("scalar (the target's path from its compile flags"), isa
    assert f"- kernels: the toolchain's default `-march`, SIMD path {isa}" in report
    assert "- threads: 1 (bare metal: the runtime has no thread pool)" in report
    assert (m4_build / "firmware/firmware.elf").is_file()
    assert "hard-float ABI" in _tool("readelf", "-h", str(m4_build / "firmware/firmware.elf"))


@needs_arm
@needs_qemu
def test_the_int8_firmware_matches_the_lowered_graph_exactly(m4_ptq_build: Path) -> None:
    summary = stage_record(m4_ptq_build, "verify")["summary"]
    assert summary["status"] == "ran under qemu-system-arm -M mps2-an386", summary
    assert summary["max_abs_diff_vs_lowered"] == 0.0, summary
    assert summary["sqnr_db"] > 20 and summary["eval_samples"] > 4, summary
    banks = [
        b["name"] for b in json.loads((m4_ptq_build / "firmware/sizes.json").read_text())["banks"]
    ]
    assert banks[:2] == ["sram", "psram"], banks
    constants = json.loads((m4_ptq_build / "memory_plan.json").read_text())["constants"]
    assert constants["copied_bytes"] == constants["constant_bytes"] > 0
    assert {c["bank"] for c in constants["copied"]} == {"sram"}


@needs_arm
@needs_qemu
def test_the_ds_cnn_int8_firmware_verifies_with_mcu_sized_kernel_scratch(tmp_path: Path) -> None:
    """MLPerf Tiny's keyword-spotting DS-CNN, int8, on the emulated board: exact against the
    lowered graph, and the kernels' scratch is sized for a microcontroller: the int8 GEMM's
    blocks hold no more columns than a product has (its first convolution asked for 197 KiB
    of a 192 KiB desktop block for 125 columns)."""
    run_dir = tmp_path / "run"
    build_in_process(
        ["model=ds_cnn", "+target=cortex_m", "+memory=mps2_an386", "+quant=ptq"], run_dir
    )
    summary = stage_record(run_dir, "verify")["summary"]
    assert summary["status"] == "ran under qemu-system-arm -M mps2-an386", summary
    assert summary["max_abs_diff_vs_lowered"] == 0.0, summary
    assert 0 < summary["scratch_peak_bytes"] <= 32 * 1024, summary


def _regions() -> dict:
    from etbuild.pipeline.firmware import BOARDS_DIR, parse_memory

    return parse_memory((BOARDS_DIR / "mps2_an386/board.ld").read_text())


@needs_arm
def test_each_bank_symbol_lies_in_its_region(m4_build: Path) -> None:
    """nm's address of every bank buffer is inside the MEMORY region its bank names (the
    board's linker script), and its section is the bank's: SRAM in SSRAM2/3, PSRAM above."""
    cfg = compose_config(M4)
    regions = _regions()
    assert (regions["SRAM"].origin, regions["SRAM"].length) == (0x20000000, 4 << 20)
    assert (regions["PSRAM"].origin, regions["PSRAM"].length) == (0x21000000, 16 << 20)
    elf = str(m4_build / "firmware/firmware.elf")
    symbols = {}
    for line in _tool("nm", "-S", elf).splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3].startswith("etb_bank_"):
            symbols[parts[3].removeprefix("etb_bank_")] = (int(parts[0], 16), int(parts[1], 16))
    plan = json.loads((m4_build / "memory_plan.json").read_text())
    planned = {b["name"]: b["planned_bytes"] for b in plan["banks"]}
    assert planned["sram"] > 0 and planned["psram"] > 0, planned  # the plan spilled
    sections = _tool("readelf", "-S", "-W", elf)
    for bank in cfg.memory.banks:
        if not planned.get(bank.name):
            assert bank.name not in symbols, bank.name  # no buffer for an empty bank
            continue
        address, size = symbols[bank.name]
        region = regions[bank.region]
        assert region.origin <= address and address + size <= region.origin + region.length, (
            bank.name,
            hex(address),
        )
        assert size >= planned[bank.name], (bank.name, size)
        assert re.search(rf"\s{re.escape(bank.section)}\s+NOBITS\s+{address:08x}\s", sections), (
            bank.name,
            sections,
        )
    # The report gives each bank's use against its capacity, from the same symbols.
    report = (m4_build / "report.md").read_text()
    assert "## Firmware (mps2_an386)" in report
    sram_address = symbols["sram"][0]
    use = planned["sram"] / 16384
    assert re.search(
        rf"^\| sram \| `\.sram_bss` \| SRAM \| `{sram_address:#010x}` \| {planned['sram']:,} B "
        rf".*\| 16,384 B \(16\.0 KiB\) \| {use:.1%} \|$",
        report,
        re.M,
    ), report
    fw = json.loads((m4_build / "firmware/sizes.json").read_text())
    assert f"- flash: {fw['flash_bytes']:,} B" in report
    assert f"- static RAM: {fw['static_ram_bytes']:,} B" in report
    metrics = stage_record(m4_build, "build")["metrics"]
    assert metrics["firmware_bank_bytes"]["sram"] == planned["sram"], metrics
    assert (
        metrics["firmware_flash_bytes"]
        == fw["flash_bytes"]
        > (m4_build / "model.pte").stat().st_size
    )  # the program is in the firmware's flash


@needs_arm
def test_a_missing_qemu_skips_verify_naming_the_apt_command(m4_build: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    build_in_process([*M4, "target.qemu=no-such-qemu-system-arm"], run_dir)
    status = stage_record(run_dir, "verify")["summary"]["status"]
    assert status == (
        "skipped: no-such-qemu-system-arm is not installed; install it with "
        f"`{QEMU_APT}` to run the mps2_an386 firmware"
    ), status
    assert (run_dir / "firmware/firmware.elf").is_file()  # the build still succeeded
    # Same runtime, memory plan and program as m4_build: the firmware comes from the cache.
    assert stage_record(run_dir, "build")["summary"]["firmware_cache"] == "hit"
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "ok"


def _firmware_parts(run_dir: Path):
    from etbuild.pipeline import firmware, pte
    from etbuild.pipeline.toolchain import resolve

    cfg = compose_config(M4)
    board = firmware.load_board("mps2_an386")
    (table,) = pte.bank_tables((run_dir / "model.pte").read_bytes())
    banks = firmware.firmware_banks(table, cfg.memory.banks, board)
    return firmware, board, banks, resolve(cfg.target)


@needs_arm
def test_a_firmware_that_does_not_fit_the_board_names_the_bank(
    m4_build: Path, tmp_path: Path
) -> None:
    """A bank that fills SRAM leaves no room for data, bss and the stack: the link fails, and
    the error names the region, the bank and the sizes."""
    from etbuild.pipeline.errors import EtbuildError

    firmware, board, banks, tc = _firmware_parts(m4_build)
    banks[0].size = (4 << 20) - 4096  # sram: all but 4 KiB of SSRAM2/3
    firmware.generate(banks, m4_build / "model.pte", tmp_path / "gen", 16)
    with pytest.raises(EtbuildError) as err:
        firmware.build(
            tc.cmake_args, m4_build / "runtime", board, banks, tmp_path / "gen",
            tmp_path / "build", tmp_path / "log",
        )  # fmt: skip
    message = str(err.value)
    assert message.startswith("the firmware does not fit board mps2_an386: SRAM (4,194,304 B"), (
        message
    )
    assert f"bank sram {banks[0].size:,} B" in message and "overflows by" in message, message
    # A bank larger than its region is caught before the link.
    banks[1].size = 32 << 20
    with pytest.raises(EtbuildError, match=r"do not fit board mps2_an386's PSRAM \(16,777,216 B"):
        firmware.check_fit(banks, board)


@needs_arm
@needs_qemu
def test_a_program_whose_banks_differ_from_the_firmware_is_refused(
    m4_build: Path, tmp_path: Path
) -> None:
    from etbuild.pipeline.errors import EtbuildError

    firmware, board, banks, tc = _firmware_parts(m4_build)
    firmware.generate(banks[:1], m4_build / "model.pte", tmp_path / "gen", 16)
    elf = firmware.build(
        tc.cmake_args, m4_build / "runtime", board, banks[:1], tmp_path / "gen",
        tmp_path / "build", tmp_path / "log",
    )  # fmt: skip
    import torch

    x = torch.load(m4_build / "reference.pt", weights_only=True)["inputs"]
    with pytest.raises(EtbuildError) as err:
        firmware.run("qemu-system-arm", board, elf, x, tmp_path, 60)
    message = str(err.value)
    assert "(the runtime reported an error)" in message, message
    assert (
        f"the program plans {len(banks)} memory banks, this firmware has 1 (it was built for "
        "another memory plan)" in message
    ), message


def _firmware_with_scratch(m4_build: Path, tmp_path: Path, bank: int, size: int):
    """The mlp program emitted with ``size`` bytes of kernel scratch reserved at the end of
    ``bank`` and its firmware linked: (firmware module, board, elf, reference, offset)."""
    import copy

    import torch

    from etbuild.pipeline import pte
    from etbuild.pipeline.stages.emit import emit_program

    ctx = M4_CONTEXT["ctx"]
    plan = copy.copy(ctx.artifacts["plan"])
    at = plan.bank_sizes[bank]
    plan.bank_sizes = list(plan.bank_sizes)
    plan.bank_sizes[bank] = at + size
    plan.scratch = (bank, at, size)
    data, _ = emit_program(ctx.artifacts["program"], plan, 16, 128)
    program = tmp_path / "model.pte"
    program.write_bytes(data)
    firmware, board, _, tc = _firmware_parts(m4_build)
    (table,) = pte.bank_tables(data)
    banks = firmware.firmware_banks(table, compose_config(M4).memory.banks, board)
    firmware.generate(banks, program, tmp_path / "gen", 128)
    elf = firmware.build(
        tc.cmake_args, m4_build / "runtime", board, banks, tmp_path / "gen",
        tmp_path / "build", tmp_path / "log",
    )  # fmt: skip
    reference = torch.load(m4_build / "reference.pt", weights_only=True)
    return firmware, board, elf, reference, at


@needs_arm
@needs_qemu
def test_the_firmware_takes_the_kernels_scratch_from_the_planned_region(
    m4_build: Path, tmp_path: Path
) -> None:
    """A plan that reserves the kernels' scratch (64 KiB at the end of the psram bank): the
    firmware runs with the method's scratch in that region, not the arena, and verifies."""
    import torch

    firmware, board, elf, reference, at = _firmware_with_scratch(m4_build, tmp_path, 1, 65536)
    done = firmware.run("qemu-system-arm", board, elf, reference["inputs"], tmp_path, 60)
    assert f"scratch: 65536 bytes at offset {at} of bank 'psram'" in done.console, done.console
    torch.testing.assert_close(done.outputs[0], reference["outputs"][0], rtol=1e-4, atol=1e-4)


@needs_arm
@needs_qemu
def test_too_small_a_scratch_region_is_reported_with_its_numbers_and_fix(
    m4_build: Path, tmp_path: Path
) -> None:
    """64 bytes of planned scratch: the kernel's error comes out of the board with its numbers
    (the runtime's own formatter: newlib-nano would print "zu"), and etbuild says what to set."""
    import re

    from etbuild.pipeline.errors import EtbuildError

    firmware, board, elf, reference, _ = _firmware_with_scratch(m4_build, tmp_path, 0, 64)
    with pytest.raises(EtbuildError) as err:
        firmware.run("qemu-system-arm", board, elf, reference["inputs"], tmp_path, 60)
    message = str(err.value)
    found = re.search(
        r"instruction (\d+) \(aten::\w+\.out\): kernel temp allocator cannot provide (\d+) "
        r"bytes \(size 64, used (\d+)\)",
        message,
    )
    assert found, message
    need = int(found.group(2)) + int(found.group(3))
    assert f"Raise memory.scratch_bytes to at least {need}" in message, message


def test_a_board_the_target_cannot_run_is_named() -> None:
    from etbuild.pipeline.errors import EtbuildError
    from etbuild.pipeline.firmware import check_target, load_board

    board = load_board("mps2_an386")
    with pytest.raises(EtbuildError, match="runs cortex-m0, .*cortex-m4 code, not target.cpu=c"):
        check_target(board, compose_config([*M4, "target.cpu=cortex-m7"]).target)
    with pytest.raises(EtbuildError, match="target.board='nope' is not a board etbuild has"):
        load_board("nope")


def test_a_firmware_that_hangs_is_killed_after_the_timeout(tmp_path: Path) -> None:
    """firmware.run kills qemu (its process group) when the run takes longer than the timeout;
    a stand-in qemu that never ends shows it."""
    import time

    import torch

    from etbuild.pipeline.errors import EtbuildError
    from etbuild.pipeline.firmware import load_board, run

    fake = tmp_path / "fake-qemu"
    pid_file = tmp_path / "pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    fake.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(EtbuildError, match=r"did not finish under fake-qemu within .*=1 s \(k"):
        run(str(fake), load_board("mps2_an386"), tmp_path / "x.elf", [torch.ones(2)], tmp_path, 1)
    assert time.monotonic() - start < 30
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)  # gone, not left running
    assert not list(tmp_path.glob(".verify.*"))  # its temporary folder is removed


def test_link_errors_become_a_message_naming_banks_and_sizes() -> None:
    from etbuild.pipeline.firmware import FirmwareBank, link_error, load_board

    board = load_board("mps2_an386")
    banks = [
        FirmwareBank("sram", 4000000, 16, ".sram_bss", "SRAM"),
        FirmwareBank("psram", 100, 16, ".psram_bss", "PSRAM"),
    ]
    log = (
        "ld: firmware.elf section `.stack' will not fit in region `SRAM'\n"
        "ld: region `SRAM' overflowed by 123456 bytes\n"
    )
    message = link_error(log, banks, board)
    assert message is not None and "SRAM (4,194,304 B at 0x20000000) overflows by 123,456 B" in (
        message
    ), message
    assert "bank sram 4,000,000 B" in message and "psram" not in message, message
    assert link_error("undefined reference to `foo'", banks, board) is None


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


@needs_arm
def test_banks_the_board_cannot_place_are_refused_before_any_stage() -> None:
    """An STM32H7's DTCM region is not on the MPS2 board: the build stops before any work."""
    from etbuild.pipeline.cli import check_supported
    from etbuild.pipeline.errors import EtbuildError

    cfg = compose_config(["model=mlp", "+target=cortex_m", "+memory=stm32h7"])
    with pytest.raises(EtbuildError) as err:
        check_supported(cfg)
    assert str(err.value) == (
        "memory.banks[dtcm].region=DTCMRAM is not a memory region of board mps2_an386 "
        "(FLASH, SRAM, PSRAM); set it to one of them, or target.board=null to build the "
        "libraries for your own board's linker script"
    )
    check_supported(compose_config(["model=mlp", "+target=cortex_m", "+memory=stm32h7",
                                     "target.board=null"]))  # fmt: skip
