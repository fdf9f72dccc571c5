"""The program file container: flatbuffer, extended header, data segments.

Layout (ExecuTorch's):
  bytes 0..3   flatbuffer root offset          bytes 4..7  file identifier "ET12"
  bytes 8..39  extended header: "eh00", header length (u32 = 32), program size (u64),
               segment base offset (u64), segment data size (u64)
  then the rest of the flatbuffer, zero padding to the segment alignment, then the segments.
The header sits inside the flatbuffer's bytes; flatbuffer offsets past it are relative, so
only the root offset moves.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import flatbuffers

from .errors import EtbuildError

FILE_IDENTIFIER = b"ET12"
HEADER_MAGIC = b"eh00"
HEADER_LENGTH = 32
_HEADER = struct.Struct("<4sIQQQ")


def check_schema_installed():
    """The generated ``etbuild.schema.Program`` module, or a clear error."""
    try:
        from etbuild.schema import Program
    except ImportError as exc:  # the package was not built by its CMake step
        raise EtbuildError(
            "etbuild.schema (generated from runtime_src/schema/program.fbs at install time) "
            "is missing; reinstall etbuild with pip so its build step runs"
        ) from exc
    return Program


def align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def serialize(program, segments: list[bytes], segment_alignment: int) -> bytes:
    """A .pte file from a ``ProgramT`` whose ``segments`` already describe ``segments``; when
    the program names a checksum segment (``CHECKSUMS_KEY``), its checksums are filled in."""
    builder = flatbuffers.Builder(1 << 16)
    builder.Finish(program.Pack(builder), file_identifier=FILE_IDENTIFIER)
    fb = bytes(builder.Output())
    (root,) = struct.unpack_from("<I", fb, 0)
    program_size = len(fb) + HEADER_LENGTH
    base = align_up(program_size, segment_alignment)
    data = bytearray()
    for seg in segments:
        data += b"\0" * (align_up(len(data), segment_alignment) - len(data))
        data += seg
    header = _HEADER.pack(HEADER_MAGIC, HEADER_LENGTH, program_size, base, len(data))
    out = bytearray(struct.pack("<I", root + HEADER_LENGTH))
    out += fb[4:8] + header + fb[8:]
    out += b"\0" * (base - len(out))
    out += data
    for named in program.namedData or []:
        key = named.key.decode() if isinstance(named.key, bytes) else named.key
        if key == CHECKSUMS_KEY:
            return write_checksums(bytes(out), named.segmentIndex)
    return bytes(out)


# The named data entry whose segment holds the program's checksums (runtime_src/executor/
# program.cpp verifies them at load): "ETCS", u32 version 1, u32 count, then a CRC-32 of the
# flatbuffer's bytes (file offset 0 to the program size) and of every other segment, in order.
CHECKSUMS_KEY = "etbuild.checksums"
_CHECKSUMS = struct.Struct("<4sII")


def checksums_size(num_segments: int) -> int:
    """Bytes of the checksum segment of a program with ``num_segments`` segments (its own
    included)."""
    return _CHECKSUMS.size + 4 * num_segments


def write_checksums(data: bytes, index: int) -> bytes:
    """``data`` with its checksum segment (segment ``index``, of checksums_size bytes) filled."""
    f = read(data)
    _, _, program_size, _, _ = _HEADER.unpack_from(data, 8)
    crcs = [zlib.crc32(data[:program_size])]
    crcs += [zlib.crc32(f.segment(i)) for i in range(len(f.program.segments)) if i != index]
    body = _CHECKSUMS.pack(b"ETCS", 1, len(crcs)) + struct.pack(f"<{len(crcs)}I", *crcs)
    start = f.segment_base + f.program.segments[index].offset
    return data[:start] + body + data[start + len(body) :]


def segment_layout(sizes: list[int], segment_alignment: int) -> list[tuple[int, int]]:
    """(offset, size) of each segment relative to the segment base, as ``serialize`` lays them."""
    layout, end = [], 0
    for size in sizes:
        start = align_up(end, segment_alignment)
        layout.append((start, size))
        end = start + size
    return layout


@dataclass
class ProgramFile:
    """A parsed .pte: the flatbuffer object tree and the raw segment bytes."""

    program: object  # etbuild.schema.Program.ProgramT
    segment_base: int
    data: bytes

    def segment(self, index: int) -> bytes:
        seg = self.program.segments[index]
        start = self.segment_base + seg.offset
        return self.data[start : start + seg.size]


def read(data: bytes) -> ProgramFile:
    """Parse a .pte file, checking the identifier, the header and the segment bounds.

    The extended header is optional (ExecuTorch leaves it out of programs with no segments);
    without it the file is the flatbuffer alone and has no segment data."""
    if len(data) < 8 or data[4:8] != FILE_IDENTIFIER:
        raise EtbuildError("not an ExecuTorch program: the file identifier ET12 is missing")
    if len(data) >= 8 + HEADER_LENGTH and data[8:12] == HEADER_MAGIC:
        _, length, program_size, base, seg_size = _HEADER.unpack_from(data, 8)
        if length < HEADER_LENGTH:
            raise EtbuildError("malformed program: the extended header is corrupt")
        if program_size > len(data) or base + seg_size > len(data) or base < program_size:
            raise EtbuildError("malformed program: the header points past the end of the file")
    else:
        base, seg_size = len(data), 0
    mod = check_schema_installed()
    try:
        program = mod.ProgramT.InitFromObj(mod.Program.GetRootAs(data, 0))
    except Exception as exc:  # the flatbuffers runtime raises struct/index/unicode errors
        raise EtbuildError(f"malformed program: its flatbuffer cannot be read ({exc})") from None
    for seg in program.segments or []:
        if seg.offset + seg.size > seg_size:
            raise EtbuildError("malformed program: a segment lies outside the segment data")
    return ProgramFile(program=program, segment_base=base, data=data)


# The named data entry whose segment holds the memory bank table (runtime_src/schema/
# memory_banks.fbs, file identifier "ETMB"): each method's banks by name, size and alignment,
# and the kernels' scratch region.
BANKS_KEY = "etbuild.memory_banks"
BANKS_IDENTIFIER = b"ETMB"


@dataclass
class BankTable:
    """One method's memory bank table as the emit stage records it."""

    method: str
    names: list[str]
    sizes: list[int]
    alignments: list[int]
    scratch: tuple[int, int, int] | None = None  # (bank, offset, bytes)


def encode_bank_tables(tables: list[BankTable]) -> bytes:
    """The memory bank table segment (a flatbuffer with identifier ETMB)."""
    from etbuild.schema.banks import MemoryBank, MemoryBankTable, MethodBanks, ScratchRegion

    methods = []
    for t in tables:
        if not len(t.names) == len(t.sizes) == len(t.alignments):
            raise EtbuildError(
                f"method {t.method!r}: {len(t.names)} bank names, {len(t.sizes)} sizes and "
                f"{len(t.alignments)} alignments (the plan must give one of each per bank)"
            )
        mb = MethodBanks.MethodBanksT()
        mb.method = t.method
        mb.banks = []
        for name, size, alignment in zip(t.names, t.sizes, t.alignments, strict=True):
            b = MemoryBank.MemoryBankT()
            b.name, b.size, b.alignment = name, int(size), int(alignment)
            mb.banks.append(b)
        if t.scratch is not None:
            sc = ScratchRegion.ScratchRegionT()
            sc.bank, sc.offset, sc.size = (int(x) for x in t.scratch)
            mb.scratch = sc
        methods.append(mb)
    root = MemoryBankTable.MemoryBankTableT()
    root.methods = methods
    builder = flatbuffers.Builder(1024)
    builder.Finish(root.Pack(builder), file_identifier=BANKS_IDENTIFIER)
    return bytes(builder.Output())


def decode_bank_tables(data: bytes) -> list[BankTable]:
    """The tables of a memory bank table segment (no validation beyond the identifier)."""
    from etbuild.schema.banks import MemoryBankTable

    if data[4:8] != BANKS_IDENTIFIER:
        raise EtbuildError("not a memory bank table (identifier is not ETMB)")
    root = MemoryBankTable.MemoryBankTableT.InitFromPackedBuf(data, 0)
    out = []
    for m in root.methods or []:
        banks = m.banks or []
        scratch = None if m.scratch is None else (m.scratch.bank, m.scratch.offset, m.scratch.size)
        out.append(
            BankTable(
                method=m.method.decode(),
                names=[b.name.decode() for b in banks],
                sizes=[b.size for b in banks],
                alignments=[b.alignment for b in banks],
                scratch=scratch,
            )
        )
    return out


def bank_tables(data: bytes) -> list[BankTable] | None:
    """The memory bank tables of a .pte file's bytes; None when it carries none."""
    f = read(data)
    for named in f.program.namedData or []:
        key = named.key.decode() if isinstance(named.key, bytes) else named.key
        if key == BANKS_KEY:
            return decode_bank_tables(f.segment(named.segmentIndex))
    return None
