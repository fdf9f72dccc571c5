"""Memory planning: tensor lifetimes, storage sharing, and offsets in memory banks.

A *storage* is the memory one or more tensors share: a tensor and the views aliasing it, and
(when ``in_place`` is on) the output of an elementwise op written over an input that dies at
that op. Storages whose lifetimes overlap must not overlap in memory.

Two planners: ``greedy`` places the largest storages first, each at the lowest aligned offset
that is free for its whole lifetime; ``naive`` gives every storage its own bytes. The
peak-live lower bound is the largest sum of storage sizes alive at one instruction: no plan
can use less.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import EtbuildError
from .ir import Instruction, Program, TensorValue


def align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(eq=False)
class Storage:
    """Memory shared by ``members``, live from instruction ``start`` to ``end`` inclusive."""

    members: list[TensorValue]
    size: int
    start: int
    end: int
    pinned: bool = False  # holds a program input or output: never reused in place
    bank: int = -1  # index into the bank list
    offset: int = -1

    @property
    def name(self) -> str:
        return self.members[0].name


@dataclass
class Plan:
    """Where every planned tensor lives."""

    storages: list[Storage]
    bank_names: list[str]
    bank_sizes: list[int]
    lower_bound: int
    alignment: int
    planner: str
    in_place_reuses: int = 0
    # Per planned bank (the program's memory ids 1..n): the alignment of its buffer.
    bank_alignments: list[int] = field(default_factory=list)
    # The kernels' scratch memory when memory.scratch_bytes reserves it: (bank, offset, bytes).
    scratch: tuple[int, int, int] | None = None
    location: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(tensor) -> (bank, off)

    def where(self, value: TensorValue) -> tuple[int, int]:
        return self.location[id(value)]


def _uses(program: Program) -> tuple[dict[int, int], dict[int, int]]:
    """First definition and last use (instruction index) of every non-constant tensor."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for v in program.inputs:
        first[id(v)] = -1
        last[id(v)] = -1
    for i, ins in enumerate(program.instructions):
        written = {id(r) for r in ins.returns}
        for t in ins.tensors():
            if t.is_constant:
                continue
            if id(t) in written:
                first.setdefault(id(t), i)
            last[id(t)] = max(last.get(id(t), i), i)
    end = len(program.instructions)
    for v in program.outputs:
        last[id(v)] = end
    return first, last


def build_storages(program: Program, alignment: int, in_place: bool) -> tuple[list[Storage], int]:
    """Group tensors into storages with lifetimes; returns (storages, in-place reuses)."""
    first, last = _uses(program)
    by_root: dict[int, Storage] = {}
    order: list[Storage] = []
    for v in program.values:
        if v.is_constant:
            continue
        root = v.storage_root()
        st = by_root.get(id(root))
        if st is None:
            st = Storage(members=[], size=align_up(root.nbytes, alignment), start=1 << 30, end=-2)
            by_root[id(root)] = st
            order.append(st)
        st.members.append(v)
        st.pinned = st.pinned or v.is_input or v.is_output
        if id(v) not in first and id(v) not in last:
            continue  # a view nothing reads does not extend its storage's lifetime
        st.start = min(st.start, first.get(id(v), last.get(id(v))))
        st.end = max(st.end, last.get(id(v), first.get(id(v))))
    for st in order:
        if st.end < st.start:  # no member is ever read or written: give it an empty lifetime
            st.start = st.end = 0
    owner = {id(m): st for st in order for m in st.members}
    reuses = 0
    if in_place:
        for i, ins in enumerate(program.instructions):
            if not isinstance(ins, Instruction) or not ins.op.in_place or len(ins.returns) != 1:
                continue
            out = ins.returns[0]
            if not isinstance(out, TensorValue) or id(out) not in owner:
                continue
            out_st = owner[id(out)]
            if out_st.start != i:
                continue
            args = dict(zip([a.name for a in ins.op.schema.arguments], ins.args, strict=True))
            for name in ins.op.in_place:
                cand = args.get(name)
                if not isinstance(cand, TensorValue) or cand.is_constant:
                    continue
                st = owner[id(cand)]
                if (
                    st is out_st
                    or st.pinned
                    or st.end != i
                    or st.size != out_st.size
                    or cand.dtype != out.dtype
                    or cand.sym_shape != out.sym_shape
                ):
                    continue
                # The output overwrites its dying input: merge the two storages.
                st.members.extend(out_st.members)
                st.end = out_st.end
                st.pinned = out_st.pinned  # the output may be a program output
                for m in out_st.members:
                    owner[id(m)] = st
                order.remove(out_st)
                reuses += 1
                break
    return order, reuses


def peak_live(storages: list[Storage]) -> int:
    """The largest total size of storages alive at one instruction."""
    events: dict[int, int] = {}
    for s in storages:
        events[s.start] = events.get(s.start, 0) + s.size
        events[s.end + 1] = events.get(s.end + 1, 0) - s.size
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def _overlaps(a: Storage, b: Storage) -> bool:
    return a.start <= b.end and b.start <= a.end


def _first_fit(st: Storage, placed: list[Storage], alignment: int) -> int:
    """Lowest aligned offset where ``st`` fits beside the placed storages it is live with."""
    busy = sorted((p.offset, p.offset + p.size) for p in placed if _overlaps(p, st))
    offset = 0
    for lo, hi in busy:
        if offset + st.size <= lo:
            break
        offset = max(offset, align_up(hi, alignment))
    return offset


def plan_memory(
    program: Program,
    banks: list[tuple[str, int | None]],
    alignment: int,
    planner: str = "greedy",
    in_place: bool = True,
) -> Plan:
    """Place every non-constant tensor in a bank; banks are tried in the order given."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise EtbuildError(f"memory.alignment={alignment} must be a positive power of two")
    if not banks:
        raise EtbuildError("memory.banks is empty: list at least one bank")
    storages, reuses = build_storages(program, alignment, in_place)
    placed: list[list[Storage]] = [[] for _ in banks]
    ends = [0] * len(banks)
    if planner != "naive":
        order = sorted(storages, key=lambda s: (-s.size, s.start, s.end))
    else:
        order = sorted(storages, key=lambda s: (s.start, s.end))
    for st in order:
        for b, (_name, capacity) in enumerate(banks):
            offset = _first_fit(st, placed[b], alignment) if planner != "naive" else ends[b]
            if capacity is None or offset + st.size <= capacity:
                st.bank, st.offset = b, offset
                placed[b].append(st)
                ends[b] = max(ends[b], offset + st.size)
                break
        else:
            sizes = ", ".join(f"{n}={c}" for n, c in banks)
            raise EtbuildError(
                f"the memory plan does not fit the banks ({sizes} bytes): tensor {st.name!r} "
                f"({st.size} bytes) has no room. Raise memory.banks[*].size_bytes, add a bank, "
                "or shrink the model's inputs."
            )
    location = {id(m): (st.bank, st.offset) for st in storages for m in st.members}
    return Plan(
        storages=storages,
        bank_names=[n for n, _ in banks],
        bank_sizes=ends,
        lower_bound=peak_live(storages),
        alignment=alignment,
        planner=planner,
        in_place_reuses=reuses,
        bank_alignments=[alignment] * len(banks),
        location=location,
    )
