"""Memory-aware scheduling: reorder independent instructions to lower the peak memory.

The exported order follows the model's ``forward``; on graphs with branches (residual
shortcuts, U-Net skips, attention heads) another valid order may keep fewer tensors alive at
once. An order is valid when every instruction still comes after the ones it depends on:
those that write what it reads, read what it writes, or write what it writes (tensors are
compared by storage, so views count as their base). Sizes come from each program value's
upper-bound shape.

``min_peak_order`` tries the exported order and a list schedule that, among the ready
instructions, runs the one that grows the live memory least (freeing the most), and keeps
whichever gives the lower peak after storage sharing; ties keep the exported order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .ir import Program, SymValue
from .planner import build_storages, in_place_candidates, peak_live, reads_and_writes


@dataclass
class Schedule:
    """The chosen instruction order and the peaks (bytes) before and after reordering."""

    program: Program
    peak_before: int
    peak_after: int

    @property
    def reordered(self) -> bool:
        return self.peak_after < self.peak_before


def _sym_values(args: list) -> list[SymValue]:
    out: list[SymValue] = []
    stack = list(args)
    while stack:
        a = stack.pop()
        if isinstance(a, SymValue):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            stack.extend(a)
    return out


def _dependencies(program: Program) -> list[set[int]]:
    """For each instruction, the indices of the instructions that must run before it."""
    last_writer: dict[int, int] = {}
    readers_since_write: dict[int, list[int]] = {}
    deps: list[set[int]] = []
    for i, ins in enumerate(program.instructions):
        read, written = reads_and_writes(ins)
        read_keys = {id(t.storage_root()) for t in read}
        read_keys |= {id(s) for s in _sym_values(list(ins.args))}
        write_keys = {id(t.storage_root()) for t in written}
        write_keys |= {id(r) for r in ins.returns if isinstance(r, SymValue)}
        need: set[int] = set()
        for k in read_keys:
            if k in last_writer:
                need.add(last_writer[k])
        for k in write_keys:
            if k in last_writer:
                need.add(last_writer[k])
            need.update(readers_since_write.get(k, []))
        for k in read_keys:
            readers_since_write.setdefault(k, []).append(i)
        for k in write_keys:
            last_writer[k] = i
            readers_since_write[k] = []
        need.discard(i)
        deps.append(need)
    return deps


def _least_growth_order(program: Program, in_place: bool) -> list[int]:
    """A list schedule: among ready instructions, the one that raises the peak least (the live
    bytes while it runs: everything live plus its new outputs), then the one whose outputs add
    the fewest bytes net of the inputs it is the last reader of (ties: the exported order).

    Net growth alone is not enough: in a downsampling bottleneck block, the shortcut's
    projection frees the block input (the most net) but runs beside the reduced branch; the
    strided 3x3 first keeps the peak lower, and the projection follows before the expansion.
    With ``in_place``, an elementwise op over an input it is the last reader of adds nothing
    while it runs (the planner will write its output over that input)."""
    instructions = program.instructions
    deps = _dependencies(program)
    users: list[list[int]] = [[] for _ in instructions]
    for i, need in enumerate(deps):
        for d in need:
            users[d].append(i)
    size: dict[int, int] = {}
    readers_left: dict[int, int] = {}
    pinned = {id(v.storage_root()) for v in program.outputs}
    rw = [reads_and_writes(ins) for ins in instructions]
    for read, written in rw:
        for t in read + written:
            root = t.storage_root()
            size[id(root)] = root.nbytes
        for key in {id(t.storage_root()) for t in read}:
            readers_left[key] = readers_left.get(key, 0) + 1

    inputs = {id(v.storage_root()) for v in program.inputs}

    def new_bytes(i: int) -> int:
        """The bytes instruction ``i``'s outputs add to the live set."""
        return sum(size[k] for k in {id(t.storage_root()) for t in rw[i][1]} - live)

    def running_bytes(i: int) -> int:
        """The bytes live while ``i`` runs: 0 more when it overwrites an input it kills."""
        new = new_bytes(i)
        if in_place and any(
            readers_left[k] == 1 and k not in pinned and k not in inputs and size[k] == new
            for k in (id(c.storage_root()) for c in in_place_candidates(instructions[i]))
        ):
            return now
        return now + new

    def growth(i: int) -> int:
        freed = sum(
            size[k]
            for k in {id(t.storage_root()) for t in rw[i][0]}
            if readers_left[k] == 1 and k not in pinned
        )
        return new_bytes(i) - freed

    live: set[int] = {id(v.storage_root()) for v in program.inputs}
    waiting = [len(d) for d in deps]
    ready = {i for i, n in enumerate(waiting) if n == 0}
    order: list[int] = []
    now = sum(size.get(k, 0) for k in live)  # bytes live between instructions
    peak = now
    while ready:
        i = min(ready, key=lambda i: (max(peak, running_bytes(i)), growth(i), i))
        peak = max(peak, running_bytes(i))
        now += new_bytes(i)
        ready.remove(i)
        order.append(i)
        read, written = rw[i]
        live |= {id(t.storage_root()) for t in written}
        for k in {id(t.storage_root()) for t in read}:
            readers_left[k] -= 1
            if readers_left[k] == 0 and k not in pinned and k in live:
                live.discard(k)
                now -= size[k]
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.add(u)
    return order


def _peak(program: Program, alignment: int, in_place: bool) -> int:
    return peak_live(build_storages(program, alignment, in_place)[0])


def min_peak_order(program: Program, alignment: int, in_place: bool) -> Schedule:
    """The exported order or a reordering with a lower peak, whichever is lower."""
    before = _peak(program, alignment, in_place)
    order = _least_growth_order(program, in_place)
    assert len(order) == len(program.instructions), "the dependency graph has a cycle"
    candidate = dataclasses.replace(program, instructions=[program.instructions[i] for i in order])
    after = _peak(candidate, alignment, in_place)
    if after < before:
        return Schedule(candidate, before, after)
    return Schedule(program, before, before)


def program_order(program: Program, alignment: int, in_place: bool) -> Schedule:
    peak = _peak(program, alignment, in_place)
    return Schedule(program, peak, peak)
