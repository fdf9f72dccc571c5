"""Memory planning: tensor lifetimes, storage sharing, and a bank and offset for each storage.

A *storage* is the memory one or more tensors share: a tensor and the views aliasing it, and
(when ``in_place`` is on) the output of an elementwise op written over an input that dies at
that op. Storages whose lifetimes overlap must not overlap in memory.

Banks have capacities and access costs (relative cycles per byte read and written). A
placement puts each storage in a bank that may hold it, at the lowest free aligned offset
there, and costs the bytes each storage moves times its bank's cost. The planners differ in
the order they place storages in, each taking the cheapest bank with room:

- ``greedy_by_size``: largest first (ties: earliest);
- ``greedy_by_conflicts``: most lifetime overlaps first, then largest (TVM USMP's order);
- ``hill_climb``: starts from the better greedy order and swaps pairs of storages, keeping a
  swap when the placement fits and costs no more (then uses no more bytes); seeded, so the
  plan is reproducible;
- ``naive``: every storage its own bytes (the no-reuse baseline).

The peak-live lower bound is the largest sum of storage sizes alive at one instruction: no
plan can use less memory in total.

Constants stay in the program's data (a constants bank: flash, read in place) unless
``copy_constants`` moves some into the room a plan leaves in faster banks; they are then
copied there when the method loads.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import EtbuildError
from .ir import Instruction, Program, TensorValue

PLANNERS = ("greedy_by_size", "greedy_by_conflicts", "hill_climb", "naive")
ACTIVATIONS, SCRATCH, CONSTANTS = "activations", "scratch", "constants"
# Hill-climb swaps tried per storage (bounded, so big graphs stay within a second or two).
HILL_CLIMB_SWAPS_PER_STORAGE = 8
HILL_CLIMB_MAX_SWAPS = 3000


def align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class Bank:
    """A memory bank as the planner sees it (``capacity`` None: unbounded)."""

    name: str
    capacity: int | None = None
    read_cost: float = 1.0
    write_cost: float = 1.0
    alignment: int | None = None  # None: the plan's alignment
    holds: frozenset[str] = frozenset({ACTIVATIONS, SCRATCH})


@dataclass(eq=False)
class Storage:
    """Memory shared by ``members``, live from instruction ``start`` to ``end`` inclusive.

    ``reads``/``writes`` count the bytes instructions (and the caller, for program inputs
    and outputs) move through it; with a bank's costs they give the storage's access cost.
    A storage without members is the kernels' scratch memory."""

    members: list[TensorValue]
    size: int
    start: int
    end: int
    pinned: bool = False  # holds a program input or output: never reused in place
    bank: int = -1  # index into the plan's banks
    offset: int = -1
    reads: int = 0
    writes: int = 0

    @property
    def name(self) -> str:
        return self.members[0].storage_root().name if self.members else "kernel scratch"

    @property
    def holds(self) -> str:
        return ACTIVATIONS if self.members else SCRATCH

    def cost(self, bank: Bank) -> float:
        return self.reads * bank.read_cost + self.writes * bank.write_cost


@dataclass
class CopiedConstant:
    """A constant the runtime copies at load from the program's data into ``bank``."""

    value: TensorValue
    bank: int
    offset: int
    reads: int  # bytes instructions read from it per call
    saved: float  # access cost per call saved against reading it from the constants bank


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
    banks: list[Bank] = field(default_factory=list)
    bank_costs: list[float] = field(default_factory=list)  # access cost placed in each bank
    copied: list[CopiedConstant] = field(default_factory=list)  # constants copied at load

    def tensor_bytes(self) -> int:
        """The bytes the planned tensors (and scratch) span, without copied constants."""
        ends = list(self.bank_sizes)
        for c in self.copied:
            ends[c.bank] = min(ends[c.bank], c.offset)
        return sum(ends)

    @property
    def cost(self) -> float:
        return sum(self.bank_costs)

    def where(self, value: TensorValue) -> tuple[int, int]:
        return self.location[id(value)]

    def bank_lower_bound(self, bank: int) -> int:
        """The peak-live bound of the storages placed in ``bank``."""
        return peak_live([s for s in self.storages if s.bank == bank])


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


def reads_and_writes(ins: object) -> tuple[list[TensorValue], list[TensorValue]]:
    """The non-constant tensors an instruction reads and those it writes (each once)."""
    written = {id(r): r for r in ins.returns if isinstance(r, TensorValue)}
    read: dict[int, TensorValue] = {}
    for t in ins.tensors():
        if not t.is_constant and id(t) not in written:
            read.setdefault(id(t), t)
    return list(read.values()), list(written.values())


def _count_traffic(program: Program, owner: dict[int, Storage]) -> None:
    """Bytes each storage moves: every read and write by an instruction, the caller's write
    of an input and read of an output."""
    for ins in program.instructions:
        read, written = reads_and_writes(ins)
        for t in read:
            owner[id(t)].reads += t.nbytes
        for t in written:
            owner[id(t)].writes += t.nbytes
    for v in program.inputs:
        owner[id(v)].writes += v.nbytes
    for v in program.outputs:
        owner[id(v)].reads += v.nbytes


def in_place_candidates(ins: object) -> list[TensorValue]:
    """The inputs an instruction's one output may overwrite (an elementwise op's operands of
    the output's dtype and shape), when each dies there; empty when it has none."""
    if not isinstance(ins, Instruction) or not ins.op.in_place or len(ins.returns) != 1:
        return []
    out = ins.returns[0]
    if not isinstance(out, TensorValue):
        return []
    args = dict(zip([a.name for a in ins.op.schema.arguments], ins.args, strict=True))
    return [
        cand
        for name in ins.op.in_place
        if isinstance(cand := args.get(name), TensorValue)
        and not cand.is_constant
        and cand.dtype == out.dtype
        and cand.sym_shape == out.sym_shape
    ]


def build_storages(program: Program, alignment: int, in_place: bool) -> tuple[list[Storage], int]:
    """Group tensors into storages with lifetimes and traffic; returns (storages, in-place
    reuses)."""
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
            candidates = in_place_candidates(ins)
            if not candidates or id(ins.returns[0]) not in owner:
                continue
            out_st = owner[id(ins.returns[0])]
            if out_st.start != i:
                continue
            for cand in candidates:
                st = owner[id(cand)]
                if st is out_st or st.pinned or st.end != i or st.size != out_st.size:
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
    _count_traffic(program, owner)
    return order, reuses


def peak_live(storages: list[Storage]) -> int:
    """The largest total size of storages alive at one instruction."""
    return live_at_peak(storages)[0]


def live_at_peak(storages: list[Storage]) -> tuple[int, int]:
    """(peak bytes, the first instruction index where the peak is reached)."""
    events: dict[int, int] = {}
    for s in storages:
        events[s.start] = events.get(s.start, 0) + s.size
        events[s.end + 1] = events.get(s.end + 1, 0) - s.size
    live = peak = 0
    at = 0
    for t in sorted(events):
        live += events[t]
        if live > peak:
            peak, at = live, t
    return peak, at


def _overlaps(a: Storage, b: Storage) -> bool:
    return a.start <= b.end and b.start <= a.end


# -- placement ------------------------------------------------------------------------------


@dataclass
class _Placement:
    """One placement of all storages: (bank, offset) per storage index, and what it costs."""

    where: list[tuple[int, int]]
    ends: list[int]  # bytes used per bank
    cost: float
    unplaced: list[int]  # storage indices that found no room

    def key(self) -> tuple[int, float, int]:
        """What the planners minimise: room first, then access cost, then bytes."""
        return (len(self.unplaced), self.cost, sum(self.ends))


class _Placer:
    """Places storages in a given order: each in the cheapest bank that may hold it and has
    room, at the lowest aligned offset free for its whole lifetime."""

    def __init__(self, storages: list[Storage], banks: list[Bank], alignment: int) -> None:
        self.storages = storages
        self.banks = banks
        self.align = [b.alignment or alignment for b in banks]
        n = len(storages)
        self.conflicts: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                if _overlaps(storages[i], storages[j]):
                    self.conflicts[i].append(j)
                    self.conflicts[j].append(i)
        # Banks per storage, cheapest first for that storage's traffic (config order on ties).
        self.choices = [
            sorted(
                (b for b, bank in enumerate(banks) if st.holds in bank.holds),
                key=lambda b, st=st: (st.cost(banks[b]), b),
            )
            for st in storages
        ]
        self.raw = [
            st.size if not st.members else st.members[0].storage_root().nbytes for st in storages
        ]

    def size_in(self, i: int, bank: int) -> int:
        return align_up(self.raw[i], self.align[bank])

    def place(self, order: Sequence[int]) -> _Placement:
        where = [(-1, -1)] * len(self.storages)
        ends = [0] * len(self.banks)
        cost = 0.0
        unplaced: list[int] = []
        for i in order:
            for b in self.choices[i]:
                size = self.size_in(i, b)
                busy = sorted(
                    (where[j][1], where[j][1] + self.size_in(j, b))
                    for j in self.conflicts[i]
                    if where[j][0] == b
                )
                offset = 0
                for lo, hi in busy:
                    if offset + size <= lo:
                        break
                    offset = max(offset, align_up(hi, self.align[b]))
                capacity = self.banks[b].capacity
                if capacity is None or offset + size <= capacity:
                    where[i] = (b, offset)
                    ends[b] = max(ends[b], offset + size)
                    cost += self.storages[i].cost(self.banks[b])
                    break
            else:
                unplaced.append(i)
        return _Placement(where, ends, cost, unplaced)

    def place_naive(self) -> _Placement:
        """Every storage its own bytes, in lifetime order."""
        where = [(-1, -1)] * len(self.storages)
        ends = [0] * len(self.banks)
        cost = 0.0
        unplaced: list[int] = []
        for i in sorted(range(len(self.storages)), key=lambda i: self._lifetime(i)):
            for b in self.choices[i]:
                offset = align_up(ends[b], self.align[b])
                size = self.size_in(i, b)
                capacity = self.banks[b].capacity
                if capacity is None or offset + size <= capacity:
                    where[i] = (b, offset)
                    ends[b] = offset + size
                    cost += self.storages[i].cost(self.banks[b])
                    break
            else:
                unplaced.append(i)
        return _Placement(where, ends, cost, unplaced)

    def _lifetime(self, i: int) -> tuple[int, int]:
        return (self.storages[i].start, self.storages[i].end)

    def by_size(self) -> list[int]:
        return sorted(range(len(self.storages)), key=lambda i: (-self.raw[i], self._lifetime(i)))

    def by_conflicts(self) -> list[int]:
        return sorted(
            range(len(self.storages)),
            key=lambda i: (-len(self.conflicts[i]), -self.raw[i], self._lifetime(i)),
        )

    def hill_climb(self, start: list[int], seed: int = 0) -> tuple[list[int], _Placement]:
        """Swap random pairs in the placement order, keeping swaps that do not make it worse."""
        rng = random.Random(seed)
        order = list(start)
        best = self.place(order)
        n = len(order)
        if n < 2:
            return order, best
        for _ in range(min(HILL_CLIMB_MAX_SWAPS, HILL_CLIMB_SWAPS_PER_STORAGE * n)):
            i, j = rng.sample(range(n), 2)
            order[i], order[j] = order[j], order[i]
            trial = self.place(order)
            if trial.key() <= best.key():
                best = trial
            else:
                order[i], order[j] = order[j], order[i]
        return order, best


def run_planner(placer: _Placer, planner: str) -> _Placement:
    if planner == "naive":
        return placer.place_naive()
    if planner == "greedy_by_size":
        return placer.place(placer.by_size())
    if planner == "greedy_by_conflicts":
        return placer.place(placer.by_conflicts())
    if planner == "hill_climb":
        starts = [placer.by_size(), placer.by_conflicts()]
        start = min(starts, key=lambda order: placer.place(order).key())
        return placer.hill_climb(start)[1]
    raise EtbuildError(f"memory.planner={planner!r} is not one of: {', '.join(PLANNERS)}")


def _as_bank(bank: Bank | tuple[str, int | None]) -> Bank:
    return bank if isinstance(bank, Bank) else Bank(name=bank[0], capacity=bank[1])


def plan_memory(
    program: Program,
    banks: Sequence[Bank | tuple[str, int | None]],
    alignment: int,
    planner: str = "greedy_by_size",
    in_place: bool = True,
    scratch_bytes: int | None = None,
    quantized: bool = False,
) -> Plan:
    """Place every non-constant tensor (and ``scratch_bytes`` of kernel scratch, live for the
    whole method) in the banks that hold activations; a ``(name, capacity)`` pair is a bank
    with unit costs. ``quantized``: the model is already int8 (the error when it does not fit
    then does not suggest quantizing)."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise EtbuildError(f"memory.alignment={alignment} must be a positive power of two")
    all_banks = [_as_bank(b) for b in banks]
    planned = [b for b in all_banks if b.holds & {ACTIVATIONS, SCRATCH}]
    if not planned:
        raise EtbuildError("memory.banks is empty: list at least one bank")
    storages, reuses = build_storages(program, alignment, in_place)
    if scratch_bytes:
        n = len(program.instructions)
        # Kernels may use all of it at every call: count it as read and written each time.
        storages.append(
            Storage(
                members=[],
                size=align_up(scratch_bytes, alignment),
                start=-1,
                end=n,
                pinned=True,
                reads=scratch_bytes * max(n, 1),
                writes=scratch_bytes * max(n, 1),
            )
        )
    placer = _Placer(storages, planned, alignment)
    placement = run_planner(placer, planner)
    if placement.unplaced:
        raise EtbuildError(does_not_fit_message(program, storages, planned, placement, quantized))
    bank_costs = [0.0] * len(planned)
    for st, (b, offset) in zip(storages, placement.where, strict=True):
        st.bank, st.offset = b, offset
        bank_costs[b] += st.cost(planned[b])
    scratch = next(((s.bank, s.offset, scratch_bytes) for s in storages if not s.members), None)
    location = {
        id(m): (st.bank, st.offset + m.storage_offset()) for st in storages for m in st.members
    }
    return Plan(
        storages=storages,
        bank_names=[b.name for b in planned],
        bank_sizes=placement.ends,
        lower_bound=peak_live(storages),
        alignment=alignment,
        planner=planner,
        in_place_reuses=reuses,
        bank_alignments=placer.align,
        scratch=scratch,
        location=location,
        banks=planned,
        bank_costs=bank_costs,
    )


def copy_constants(program: Program, plan: Plan, home: Bank) -> None:
    """Copy constants into the room ``plan`` leaves in banks that hold activations and read
    cheaper than ``home`` (where the constants live), cheapest bank first, while capacity
    allows. The hottest bytes go first: constants read by the most instructions, then the
    smallest. Each copy lives for the whole method, after the bank's planned tensors; the
    plan's bank sizes and locations grow to include them (its costs stay those of the
    planned tensors, which the planners compare)."""
    reads: dict[int, int] = {}
    constants: dict[int, TensorValue] = {}
    for ins in program.instructions:
        for t in {id(t): t for t in ins.tensors() if t.is_constant}.values():
            constants[id(t)] = t
            reads[id(t)] = reads.get(id(t), 0) + t.nbytes
    faster = sorted(
        (b for b, bank in enumerate(plan.banks)
         if ACTIVATIONS in bank.holds and bank.read_cost < home.read_cost),
        key=lambda b: plan.banks[b].read_cost,
    )  # fmt: skip
    order = sorted(constants.values(), key=lambda v: (-reads[id(v)] / max(v.nbytes, 1), v.nbytes))
    for v in order:
        if v.nbytes == 0:
            continue
        for b in faster:
            bank = plan.banks[b]
            offset = align_up(plan.bank_sizes[b], plan.bank_alignments[b])
            if bank.capacity is not None and offset + v.nbytes > bank.capacity:
                continue
            saved = reads[id(v)] * (home.read_cost - bank.read_cost)
            plan.copied.append(CopiedConstant(v, b, offset, reads[id(v)], saved))
            plan.location[id(v)] = (b, offset)
            plan.bank_sizes[b] = offset + v.nbytes
            break


# -- the error when it does not fit ---------------------------------------------------------


def _made_by(program: Program) -> dict[int, str]:
    """id(tensor) -> the model source line of the instruction that writes it."""
    made: dict[int, str] = {}
    for ins in program.instructions:
        for r in ins.returns:
            if isinstance(r, TensorValue) and ins.source and "<unknown" not in ins.source:
                made[id(r)] = ins.source.strip().splitlines()[-1].strip()
    return made


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f} KiB"


def does_not_fit_message(
    program: Program,
    storages: list[Storage],
    banks: list[Bank],
    placement: _Placement,
    quantized: bool = False,
) -> str:
    """The peak, each bank's capacity, the tensors alive at the peak (size and the source
    line that made them), the tensor that found no room, and what would make it fit."""
    peak, at = live_at_peak(storages)
    capacity = [b.capacity for b in banks]
    finite = None if None in capacity else sum(c for c in capacity if c is not None)
    caps = ", ".join(
        f"{b.name}={b.capacity} bytes" if b.capacity is not None else f"{b.name}=unbounded"
        for b in banks
    )
    stuck = storages[placement.unplaced[0]]
    alive = sorted((s for s in storages if s.start <= at <= s.end), key=lambda s: -s.size)
    made = _made_by(program)
    lines = [
        f"the memory plan does not fit the banks ({caps}): {stuck.name!r} ({stuck.size} bytes) "
        f"has no room. At the peak (instruction {max(at, 0)} of {len(program.instructions)}) "
        f"{peak} bytes ({_kib(peak)}) are alive"
        + (f", against {finite} bytes ({_kib(finite)}) in all banks" if finite else "")
        + ". Alive at the peak, largest first:"
    ]
    for s in alive[:8]:
        root = s.members[0].storage_root() if s.members else None
        where = made.get(id(root)) if root is not None else None
        if root is not None and where is None:  # written by its slices' producers
            where = next((made[id(m)] for m in s.members if id(m) in made), None)
        shape = f" {list(root.shape)} {root.dtype}" if root is not None else ""
        lines.append(
            f"  {s.name}{shape}: {s.size} bytes" + (f", made by: {where}" if where else "")
        )
    if len(alive) > 8:
        rest = sum(s.size for s in alive[8:])
        lines.append(f"  ... and {len(alive) - 8} more ({rest} bytes)")
    floats = any(s.members and s.members[0].dtype.is_floating_point for s in alive)
    fixes = []
    if floats and not quantized:
        fixes.append("quantize (+quant=ptq: int8 activations take a quarter of fp32's bytes)")
    fixes.append("a smaller input (model.inputs[*].shape)")
    fixes.append(
        "another bank or a bigger one (memory.banks[*].size_bytes, or +memory= a preset "
        "with more RAM)"
    )
    lines.append("To make it fit: " + "; ".join(fixes) + ".")
    return "\n".join(lines)
