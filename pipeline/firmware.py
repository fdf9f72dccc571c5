"""Bare-metal firmware for a board (cortex_m with ``target.board``): generated sources, the
link, its sizes and running it under qemu-system-arm.

A board is a folder ``runtime_src/firmware/boards/<board>/``: ``board.ld`` (its MEMORY
regions and the layout, which INCLUDEs the generated ``banks.ld``), ``startup.c`` (vector
table, reset handler) and ``board.yaml`` (the qemu machine, the cores and FPUs it runs, its RAM
and flash regions). For one program, etbuild generates into ``<run>/firmware/``:

- ``banks.c``: one static buffer per planned memory bank, ``etb_bank_<name>``, with
  ``__attribute__((section(<bank.section>), aligned(<alignment>)))`` (no section: ``.bss``),
  and the table ``etb_fw_banks`` the firmware checks against the program's bank table;
- ``banks.ld``: each bank section as a NOLOAD output section in the bank's ``region``;
- ``program.c``: model.pte embedded in flash (``.incbin``).

The firmware (``runtime_src/firmware/main.cpp``) reads ``input_<i>.etbt`` and writes
``output_<i>.etbt`` through ARM semihosting; ``run`` runs it under ``qemu-system-arm -M
<machine> -semihosting-config enable=on,target=native`` with a timeout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from . import etbt, process_group
from .errors import EtbuildError
from .paths import RUNTIME_SRC_DIR
from .progress import Progress

FIRMWARE_DIR = RUNTIME_SRC_DIR / "firmware"
BOARDS_DIR = FIRMWARE_DIR / "boards"
# Sections a planned (writable) bank must not be placed in.
READ_ONLY_SECTIONS = re.compile(r"^\.(text|rodata)(\..*)?$")
# Exit statuses of the firmware (runtime_src/firmware/firmware.h).
EXIT_STATUS = {1: "the runtime reported an error", 2: "an input/output error", 3: "a fault"}


@dataclass
class Region:
    """A MEMORY region of a board's linker script."""

    name: str
    origin: int
    length: int
    attributes: str

    def holds(self, address: int) -> bool:
        return self.origin <= address < self.origin + self.length


@dataclass
class Board:
    name: str
    folder: Path
    qemu_machine: str
    cpus: list[str]
    fpus: list[str | None]
    ram_region: str
    flash_region: str
    regions: dict[str, Region] = field(default_factory=dict)


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(0x[0-9a-fA-F]+|\d+)\s*([KM]?)\s*", text)
    if m is None:
        raise ValueError(text)
    n = int(m.group(1), 0)
    return n * {"": 1, "K": 1024, "M": 1024 * 1024}[m.group(2)]


def parse_memory(script: str) -> dict[str, Region]:
    """The MEMORY block of a GNU ld script: {region name: Region}."""
    block = re.search(r"\bMEMORY\s*\{(.*?)\}", re.sub(r"/\*.*?\*/", "", script, flags=re.S), re.S)
    regions: dict[str, Region] = {}
    for line in (block.group(1) if block else "").splitlines():
        m = re.match(r"\s*(\w+)\s*\((\w+)\)\s*:\s*ORIGIN\s*=\s*([^,]+),\s*LENGTH\s*=\s*(\S+)", line)
        if m:
            regions[m.group(1)] = Region(
                m.group(1), _size(m.group(3)), _size(m.group(4)), m.group(2)
            )
    return regions


def boards() -> list[str]:
    return sorted(p.parent.name for p in BOARDS_DIR.glob("*/board.yaml"))


def load_board(name: str) -> Board:
    folder = BOARDS_DIR / name
    if not (folder / "board.yaml").is_file():
        raise EtbuildError(
            f"target.board={name!r} is not a board etbuild has; the boards are "
            f"{', '.join(boards())} (folders of {BOARDS_DIR}), or null for no firmware"
        )
    doc = yaml.safe_load((folder / "board.yaml").read_text())
    return Board(
        name=name,
        folder=folder,
        qemu_machine=doc["qemu_machine"],
        cpus=list(doc["cpus"]),
        fpus=list(doc["fpus"]),
        ram_region=doc["ram_region"],
        flash_region=doc["flash_region"],
        regions=parse_memory((folder / "board.ld").read_text()),
    )


def check_target(board: Board, tcfg) -> None:
    """The target's core and FPU must be ones the board runs."""
    if str(tcfg.cpu) not in board.cpus:
        raise EtbuildError(
            f"target.board={board.name} runs {', '.join(board.cpus)} code, not "
            f"target.cpu={tcfg.cpu}; set target.cpu to one of them, or target.board=null "
            "(libraries only, no firmware)"
        )
    fpu = None if tcfg.fpu is None else str(tcfg.fpu)
    if fpu not in board.fpus:
        allowed = ", ".join("null" if f is None else f for f in board.fpus)
        raise EtbuildError(
            f"target.board={board.name} has no {fpu} FPU: set target.fpu to one of {allowed}"
        )


@dataclass
class FirmwareBank:
    """A planned bank as the firmware holds it."""

    name: str
    size: int  # bytes of its buffer (the planned bytes)
    alignment: int
    section: str  # ".bss" when the bank names none
    region: str  # the board region the section goes to


def placement(bank, board: Board) -> tuple[str, str]:
    """(section, region) of a configured bank on ``board``; an error when the board cannot
    place it. Checked before any stage (cli.check_supported) and again for the program's
    banks."""
    name = str(bank.name)
    section = str(bank.section) if bank.section is not None else ".bss"
    region = str(bank.region) if bank.region is not None else board.ram_region
    if bank.section is None and bank.region is not None and region != board.ram_region:
        raise EtbuildError(
            f"memory.banks[{name}] names region {region} but no section; a bank without a "
            f"section goes to .bss (in {board.ram_region}): give it a section too"
        )
    if region not in board.regions:
        raise EtbuildError(
            f"memory.banks[{name}].region={region} is not a memory region of board "
            f"{board.name} ({', '.join(board.regions)}); set it to one of them, or "
            "target.board=null to build the libraries for your own board's linker script"
        )
    return section, region


def firmware_banks(table, cfg_banks, board: Board) -> list[FirmwareBank]:
    """The program's banks (its bank table) with their sections and regions from the memory
    config, checked against the board."""
    by_name = {str(b.name): b for b in cfg_banks}
    out = []
    for name, size, alignment in zip(table.names, table.sizes, table.alignments, strict=True):
        bank = by_name.get(name)
        if bank is None:
            raise EtbuildError(
                f"the program plans memory bank {name!r}, which memory.banks does not have "
                f"({', '.join(by_name)}); rebuild the program with this memory config"
            )
        section, region = placement(bank, board)
        if size > 0 and READ_ONLY_SECTIONS.match(section):
            raise EtbuildError(
                f"memory bank {name!r} holds {size:,} planned bytes, but its section {section} "
                "is read-only; give the bank a RAM section (such as .sram_bss) or keep it for "
                "constants only"
            )
        if size > 0 and "w" not in board.regions[region].attributes:
            raise EtbuildError(
                f"memory bank {name!r} holds {size:,} planned bytes, but region {region} of "
                f"board {board.name} is not writable ({board.regions[region].attributes}); "
                "place the bank in a RAM region"
            )
        # The runtime aligns every tensor to at least 16 bytes (Method checks each buffer).
        out.append(FirmwareBank(name, int(size), max(16, int(alignment)), section, region))
    return out


def check_fit(banks: list[FirmwareBank], board: Board) -> None:
    """Each region must hold the banks placed in it (the link checks the rest)."""
    for region in board.regions.values():
        inside = [b for b in banks if b.region == region.name and b.size > 0]
        total = sum(b.size for b in inside)
        if total > region.length:
            listed = ", ".join(f"{b.name} {b.size:,} B" for b in inside)
            raise EtbuildError(
                f"the memory banks do not fit board {board.name}'s {region.name} "
                f"({region.length:,} B at {region.origin:#010x}): {listed} = {total:,} B; "
                "shrink memory.banks[*].size_bytes (the planner then spills to the next bank) "
                "or place a bank in another region"
            )


def _c_string(s: str) -> str:
    return json.dumps(s)  # ASCII with \" and \\ escaped: a valid C string literal


def generate(banks: list[FirmwareBank], program: Path, out: Path, program_alignment: int) -> None:
    """Writes banks.c, banks.ld and program.c into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    c = [
        "// Generated by etbuild (pipeline/firmware.py): one buffer per planned memory bank, each",
        "// in its linker section (banks.ld places the section in its region).",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "",
        '#include "firmware.h"',
        "",
    ]
    entries = []
    for b in banks:
        if b.size == 0:
            entries.append(f"  {{{_c_string(b.name)}, NULL, 0, {b.alignment}}},")
            continue
        c.append(
            f"uint8_t etb_bank_{b.name}[{b.size}] __attribute__((section({_c_string(b.section)}), "
            f"aligned({b.alignment}), used));"
        )
        entries.append(
            f"  {{{_c_string(b.name)}, etb_bank_{b.name}, sizeof(etb_bank_{b.name}), "
            f"{b.alignment}}},"
        )
    c += [
        "",
        f"const struct etb_fw_bank etb_fw_banks[{max(len(banks), 1)}] = {{",
        *(entries or ["  {NULL, NULL, 0, 1},"]),
        "};",
        f"const size_t etb_fw_num_banks = {len(banks)};",
        "",
    ]
    (out / "banks.c").write_text("\n".join(c))
    ld = [
        "/* Generated by etbuild (pipeline/firmware.py): each memory bank's section in its",
        "   region; INCLUDEd by the board's linker script. */",
    ]
    for b in banks:
        if b.size == 0 or b.section == ".bss":
            continue  # an empty bank has no buffer; .bss is the board script's own
        ld += [
            f"{b.section} (NOLOAD) : ALIGN({b.alignment})",
            "{",
            f"  __etb_bank_{b.name}_start = .;",
            f"  KEEP(*({b.section} {b.section}.*))",
            f"  __etb_bank_{b.name}_end = .;",
            f"}} > {b.region}",
        ]
    (out / "banks.ld").write_text("\n".join(ld) + "\n")
    path = str(program.resolve()).replace("\\", "\\\\").replace('"', '\\"')
    assembly = (
        '.section .rodata.etb_program,"a"\n'
        f".balign {program_alignment}\n"
        ".global etb_program\netb_program:\n"
        f'.incbin "{path}"\n'
        ".global etb_program_end\netb_program_end:\n"
        ".previous\n"
    )
    (out / "program.c").write_text(
        "// Generated by etbuild (pipeline/firmware.py): the program, embedded in flash.\n"
        f"__asm__({_c_string(assembly)});\n"
    )


OVERFLOW = re.compile(r"region [`']?(\w+)'? overflowed by (\d+) bytes")
NOT_FIT = re.compile(r"section [`']?(\S+?)'? will not fit in region [`']?(\w+)'?")


def link_error(log: str, banks: list[FirmwareBank], board: Board) -> str | None:
    """A message for a firmware that does not fit the board, from the linker's output."""
    over = OVERFLOW.findall(log)
    arena = "less than 32 KiB left for the arena" in log
    if not over and not arena:
        return None
    parts = []
    for region_name, n in dict(over).items():
        region = board.regions.get(region_name)
        inside = [b for b in banks if b.region == region_name and b.size > 0]
        listed = ", ".join(f"bank {b.name} {b.size:,} B" for b in inside) or "no memory bank"
        what = (
            "code, the program and its constants"
            if region_name == board.flash_region
            else "data, bss, the stack (64 KiB) and the arena (at least 32 KiB)"
        )
        size = f" ({region.length:,} B at {region.origin:#010x})" if region else ""
        parts.append(
            f"{region_name}{size} overflows by {int(n):,} B: it holds {listed}, plus {what}"
        )
    if arena and not over:
        region = board.regions[board.ram_region]
        inside = [b for b in banks if b.region == board.ram_region and b.size > 0]
        listed = ", ".join(f"bank {b.name} {b.size:,} B" for b in inside) or "no memory bank"
        parts.append(
            f"{board.ram_region} ({region.length:,} B) leaves less than 32 KiB for the arena "
            f"(the method's tables and the inputs) after {listed}, data, bss and the stack"
        )
    return (
        f"the firmware does not fit board {board.name}: "
        + "; ".join(parts)
        + ". Shrink memory.banks[*].size_bytes (the planner spills to the next bank), place a "
        "bank in another region, or quantize the model (+quant=ptq)"
    )


def build(
    cmake_args: list[str],
    runtime_dir: Path,
    board: Board,
    banks: list[FirmwareBank],
    generated: Path,
    work: Path,
    log: Path,
) -> Path:
    """Configures and links the firmware in ``work``; returns the ELF."""
    cmake = shutil.which("cmake") or "cmake"
    defines = [
        a
        for a in cmake_args
        if a.startswith(("-DCMAKE_TOOLCHAIN_FILE", "-DETB_ARM_")) or a == "-DETB_BARE_METAL=ON"
    ]
    configure = [
        cmake,
        "-S",
        str(FIRMWARE_DIR),
        "-B",
        str(work),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_PREFIX_PATH={runtime_dir}",
        f"-DETB_FW_BOARD={board.name}",
        f"-DETB_FW_GENERATED={generated}",
        *defines,
    ]
    for cmd, what in ((configure, "configuring"), ([cmake, "--build", str(work)], "linking")):
        building = what == "linking"
        with (
            open(log, "ab") as f,
            Progress("building the firmware (ninja)") if building else nullcontext() as progress,
        ):
            f.write(("$ " + " ".join(cmd) + "\n").encode())
            f.flush()
            code = process_group.run(cmd, f, progress=progress)
        if code != 0:
            text = log.read_text(errors="replace")
            message = link_error(text, banks, board)
            if message:
                raise EtbuildError(message)
            tail = "\n".join(text.splitlines()[-30:])
            raise EtbuildError(f"{what} the firmware failed (full log: {log}):\n{tail}")
    return work / "firmware.elf"


def section_sizes(readelf: str, elf: Path) -> dict[str, tuple[int, int, str]]:
    """{section: (address, size, flags)} of the allocated sections of an ELF."""
    out = subprocess.run(
        [readelf, "-S", "-W", str(elf)], check=True, capture_output=True, text=True
    ).stdout
    sections = {}
    for m in re.finditer(
        r"^\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\S+\s+(\S*)",
        out,
        re.M,
    ):
        name, addr, size, flags = m.groups()
        if "A" in flags:
            sections[name] = (int(addr, 16), int(size, 16), flags)
    return sections


def symbols(nm: str, elf: Path) -> dict[str, tuple[int, int]]:
    """{symbol: (address, size)} of the sized symbols of an ELF."""
    out = subprocess.run([nm, "-S", str(elf)], check=True, capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4:
            syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
        elif len(parts) == 3:
            syms[parts[2]] = (int(parts[0], 16), 0)
    return syms


def measure(tc, elf: Path, board: Board, banks: list[FirmwareBank], cfg_banks) -> dict:
    """Flash, static RAM, each bank's buffer (address, region, use against capacity) and what
    is left of each region, from the linked ELF's sections and the bank symbols."""
    readelf = tc.nm[: -len("nm")] + "readelf"
    sections = section_sizes(readelf, elf)
    syms = symbols(tc.nm, elf)
    capacity = {str(b.name): b.size_bytes for b in cfg_banks}
    flash = (
        sum(
            size
            for name, (addr, size, flags) in sections.items()
            if board.regions[board.flash_region].holds(addr) and name != ".data"
        )
        + sections.get(".data", (0, 0, ""))[1]
    )
    static = {
        name: size
        for name, (addr, size, flags) in sections.items()
        if "W" in flags and name not in (".heap", ".arena", ".stack")
    }
    used: dict[str, int] = {}
    for addr, size, _flags in sections.values():
        for region in board.regions.values():
            if region.holds(addr) and size:
                used[region.name] = used.get(region.name, 0) + size
    out_banks = []
    for b in banks:
        sym = syms.get(f"etb_bank_{b.name}")
        address = sym[0] if sym else None
        region = next(
            (r.name for r in board.regions.values() if address is not None and r.holds(address)),
            None,
        )
        out_banks.append(
            {
                "name": b.name,
                "symbol": f"etb_bank_{b.name}" if sym else None,
                "address": address,
                "bytes": b.size,
                "capacity": capacity.get(b.name),
                "alignment": b.alignment,
                "section": b.section,
                "region": region,
                "wanted_region": b.region,
            }
        )
    arena = sections.get(".arena", (0, 0, ""))[1]
    return {
        "flash_bytes": flash,
        "static_ram_bytes": sum(static.values()),
        "static_ram_sections": static,
        "arena_bytes": arena,
        "stack_bytes": sections.get(".stack", (0, 0, ""))[1],
        "banks": out_banks,
        "regions": {
            r.name: {"origin": r.origin, "length": r.length, "used": used.get(r.name, 0)}
            for r in board.regions.values()
        },
    }


_SCRATCH_SHORT = re.compile(
    r"kernel temp allocator cannot provide (\d+) bytes \(size (\d+), used (\d+)\)"
)


def _scratch_hint(console: str) -> str:
    """How to fix a kernel that ran out of scratch memory (memory.scratch_bytes)."""
    m = _SCRATCH_SHORT.search(console)
    if m is None or "scratch: " not in console:
        return ""
    need = int(m.group(1)) + int(m.group(3))
    return (
        f"The kernels' scratch region (memory.scratch_bytes={m.group(2)}) is too small: an "
        f"instruction needs {need} bytes. Raise memory.scratch_bytes to at least {need}, or "
        "set memory.scratch_bytes=null so the firmware gives the kernels its free RAM.\n"
    )


def qemu_command(qemu: str, board: Board, elf: Path) -> list[str]:
    return [
        qemu,
        "-M",
        board.qemu_machine,
        "-nographic",
        "-monitor",
        "none",
        "-serial",
        "none",
        "-semihosting-config",
        "enable=on,target=native",
        "-kernel",
        str(elf),
    ]


def _kill(proc: subprocess.Popen) -> None:
    """Kills qemu's process group (it leads one) and reaps it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


@dataclass
class FirmwareRun:
    outputs: list[torch.Tensor]
    console: str


def run(
    qemu: str,
    board: Board,
    elf: Path,
    inputs: list[torch.Tensor],
    work_parent: Path,
    timeout_s: float,
) -> FirmwareRun:
    """Runs the firmware once under qemu-system-arm on ``inputs`` (semihosting files in a
    temporary folder under ``work_parent``); kills qemu after ``timeout_s``."""
    with tempfile.TemporaryDirectory(dir=work_parent, prefix=".verify.") as tmp:
        d = Path(tmp)
        for i, t in enumerate(inputs):
            etbt.write(d / f"input_{i}.etbt", t)
        cmd = qemu_command(qemu, board, elf)
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise EtbuildError(
                f"the firmware did not finish under {Path(qemu).name} within "
                f"pipeline.verify.timeout_s={timeout_s:g} s (killed); raise the timeout for a "
                f"large model (command: {' '.join(cmd)}, in {tmp})"
            ) from None
        except BaseException:  # interrupted: qemu must not outlive etbuild
            _kill(proc)
            raise
        console = out.decode(errors="replace")
        if proc.returncode != 0:
            why = EXIT_STATUS.get(proc.returncode, f"exit status {proc.returncode}")
            lines = "\n".join(console.strip().splitlines()[-10:])
            raise EtbuildError(
                f"the firmware failed under {Path(qemu).name} ({why}):\n{lines}\n"
                f"{_scratch_hint(console)}(command: {' '.join(cmd)})"
            )
        outs = sorted(d.glob("output_*.etbt"), key=lambda p: int(p.stem.split("_")[1]))
        return FirmwareRun([etbt.read(p) for p in outs], console)
