"""The memory planner on synthetic programs (etbuild.pipeline.planner).

Correctness is checked against lifetimes computed here, independently of the planner:
two tensors whose lifetimes overlap must not share bytes unless one is a view of the other, and
a tensor may only take over another's bytes at the in-place op where that other tensor dies.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from etbuild.pipeline.concat import concat_in_place
from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.ir import Instruction, Program, TensorValue
from etbuild.pipeline.ops import load_ops
from etbuild.pipeline.planner import PLANNERS, Bank, Plan, align_up, copy_constants, plan_memory
from etbuild.pipeline.schedule import min_peak_order

OPS = load_ops()
RELU = OPS["aten::relu.out"]  # in place over self
ADD = OPS["aten::add.out"]  # in place over self or other
MM = OPS["aten::mm.out"]  # never in place


# -- building synthetic programs ---------------------------------------------------------


class Builder:
    """Appends tensors and kernel calls to a Program, keeping ``values`` in definition order."""

    def __init__(self) -> None:
        self.program = Program(inputs=[], outputs=[], instructions=[], values=[])

    def _value(self, name: str, numel: int, dtype: torch.dtype = torch.float32) -> TensorValue:
        v = TensorValue(name, (numel,), dtype, sym_shape=(str(numel),))
        self.program.values.append(v)
        return v

    def input(self, name: str, numel: int) -> TensorValue:
        v = self._value(name, numel)
        v.is_input = True
        self.program.inputs.append(v)
        return v

    def const(self, name: str, numel: int) -> TensorValue:
        v = TensorValue(name, (numel,), torch.float32, data=torch.zeros(numel))
        self.program.values.append(v)
        return v

    def view(self, name: str, src: TensorValue) -> TensorValue:
        v = TensorValue(name, src.shape, src.dtype, sym_shape=src.sym_shape, alias_of=src)
        self.program.values.append(v)
        return v

    def relu(self, name: str, x: TensorValue) -> TensorValue:
        out = self._value(name, x.shape[0], x.dtype)
        self.program.instructions.append(Instruction(RELU, [x, out], [out]))
        return out

    def add(self, name: str, a: TensorValue, b: TensorValue) -> TensorValue:
        out = self._value(name, max(a.shape[0], b.shape[0]), a.dtype)
        self.program.instructions.append(Instruction(ADD, [a, b, 1, out], [out]))
        return out

    def mm(self, name: str, a: TensorValue, b: TensorValue, numel: int) -> TensorValue:
        out = self._value(name, numel)
        self.program.instructions.append(Instruction(MM, [a, b, out], [out]))
        return out

    def output(self, *values: TensorValue) -> Program:
        for v in values:
            v.is_output = True
            self.program.outputs.append(v)
        return self.program


@dataclass
class Life:
    start: int
    end: int


def lifetimes(program: Program) -> dict[int, Life]:
    """Lifetime per storage root (id), computed independently: definition to last use.

    A view extends its root's lifetime. Inputs are live from before the first instruction,
    outputs until after the last.
    """
    life: dict[int, Life] = {}

    def touch(v: TensorValue, i: int) -> None:
        root = v.storage_root()
        cur = life.setdefault(id(root), Life(i, i))
        cur.start, cur.end = min(cur.start, i), max(cur.end, i)

    for v in program.inputs:
        touch(v, -1)
    for i, ins in enumerate(program.instructions):
        for t in ins.tensors():
            if not t.is_constant:
                touch(t, i)
    for v in program.outputs:
        touch(v, len(program.instructions))
    return life


def _in_place_handoff(program: Program, dying: TensorValue, born: TensorValue) -> bool:
    """True when ``born`` is written by an in-place-capable op that reads ``dying`` as an
    in-place argument, and ``dying`` is neither a program input nor a program output."""
    root = dying.storage_root()
    if (
        root.is_input
        or root.is_output
        or any(v.is_input or v.is_output for v in program.values if v.storage_root() is root)
    ):
        return False
    for ins in program.instructions:
        if ins.returns and ins.returns[0] is born:
            names = [a.name for a in ins.op.schema.arguments]
            for name, arg in zip(names, ins.args, strict=True):
                if (
                    name in ins.op.in_place
                    and isinstance(arg, TensorValue)
                    and arg.storage_root() is root
                ):
                    return True
    return False


def check_plan(program: Program, plan: Plan, banks: list[tuple[str, int | None]]) -> None:
    """The plan's invariants, checked from the program itself."""
    life = lifetimes(program)
    planned = [v for v in program.values if not v.is_constant]
    # Every non-constant tensor has a place; views share their root's place.
    for v in planned:
        bank, off = plan.where(v)
        assert 0 <= bank < len(banks)
        align = plan.bank_alignments[bank]
        assert off % align == 0, (v.name, off, align)
        assert off + v.nbytes <= plan.bank_sizes[bank]
        cap = banks[bank][1]
        assert cap is None or off + align_up(v.nbytes, align) <= cap
        if v.alias_of is not None:
            assert plan.where(v) == plan.where(v.storage_root())
    roots = list({id(v.storage_root()): v.storage_root() for v in planned}.values())
    for i, a in enumerate(roots):
        for b in roots[i + 1 :]:
            (ba, oa), (bb, ob) = plan.where(a), plan.where(b)
            if ba != bb or oa + a.nbytes <= ob or ob + b.nbytes <= oa:
                continue  # no shared bytes
            la, lb = life[id(a)], life[id(b)]
            if la.end < lb.start or lb.end < la.start:
                continue  # never live together
            # Touching lifetimes are allowed only for an in-place handoff at that op.
            if la.end == lb.start and _in_place_handoff(program, a, b) and oa == ob:
                continue
            if lb.end == la.start and _in_place_handoff(program, b, a) and oa == ob:
                continue
            raise AssertionError(
                f"{a.name} [{oa}, {oa + a.nbytes}) live {la} and {b.name} "
                f"[{ob}, {ob + b.nbytes}) live {lb} share bytes in bank {ba}"
            )


def peak_live(program: Program, alignment: int) -> int:
    """Largest sum of aligned storage sizes live at one instruction (no in-place merging)."""
    life = lifetimes(program)
    sizes = {
        id(v): align_up(v.nbytes, alignment)
        for v in program.values
        if not v.is_constant and v.alias_of is None
    }
    points = {lf.start for lf in life.values()}
    return max(
        (sum(sizes[k] for k, lf in life.items() if lf.start <= t <= lf.end) for t in points),
        default=0,
    )


def random_program(rng: random.Random, n_instr: int, views: bool = True) -> Program:
    b = Builder()
    live = [b.input(f"in{i}", rng.choice([4, 16, 100, 256])) for i in range(rng.randint(1, 3))]
    weight = b.const("w", 64)
    for i in range(n_instr):
        kind = rng.random()
        x = rng.choice(live)
        if views and kind < 0.15:
            out = b.relu(f"t{i}", b.view(f"v{i}", x))
        elif kind < 0.45:
            out = b.relu(f"t{i}", x)
        elif kind < 0.75:
            same = [v for v in live if v.shape == x.shape]
            out = b.add(f"t{i}", x, rng.choice(same))
        elif kind < 0.85:
            out = b.add(f"t{i}", x, weight) if x.shape == weight.shape else b.relu(f"t{i}", x)
        else:
            out = b.mm(f"t{i}", x, rng.choice(live), rng.choice([4, 16, 64, 100, 1000]))
        live.append(out)
        if len(live) > 4 and rng.random() < 0.6:
            live.pop(rng.randrange(len(live) - 1))  # stop using an older value
    outs = rng.sample(live, k=min(len(live), rng.randint(1, 2)))
    return b.output(*outs)


# -- tests -------------------------------------------------------------------------------


def chain(n: int, numel: int = 256) -> Program:
    """in -> relu -> relu -> ... -> out: two buffers (or one with in-place) suffice."""
    b = Builder()
    x = b.input("x", numel)
    y = b.mm("y", x, x, numel)
    for i in range(n):
        y = b.relu(f"r{i}", y)
    z = b.mm("z", y, y, numel)
    return b.output(z)


def test_chain_reuses_memory() -> None:
    program = chain(6)
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", in_place=False)
    check_plan(program, plan, [("sram", None)])
    # x dies at the first mm; then two ping-pong buffers are live at most: 2 x 1 KiB.
    assert plan.lower_bound == 2 * 1024
    assert sum(plan.bank_sizes) == 2 * 1024
    naive = plan_memory(program, [("sram", None)], 16, "naive", in_place=False)
    check_plan(program, naive, [("sram", None)])
    assert sum(naive.bank_sizes) == (1 + 1 + 6 + 1) * 1024


def test_chain_in_place() -> None:
    program = chain(6)
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", in_place=True)
    check_plan(program, plan, [("sram", None)])
    assert plan.in_place_reuses == 6
    # every relu writes over its input: one buffer for the whole chain
    where = {plan.where(v) for v in program.values if v.name.startswith("r") or v.name == "y"}
    assert len(where) == 1
    assert plan.lower_bound <= sum(plan.bank_sizes) <= 2 * 1024


def test_unused_view_does_not_extend_lifetime() -> None:
    """A view nothing reads must not stretch its root's lifetime back to instruction 0."""
    b = Builder()
    x = b.input("x", 256)
    a = b.mm("a", x, x, 256)  # live [0, 1]
    c = b.mm("c", a, a, 256)  # live [1, 2]
    d = b.mm("d", c, c, 256)  # live [2, 3]
    b.view("d_view", d)  # never read
    program = b.output(b.mm("e", d, d, 256))
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", False)
    check_plan(program, plan, [("sram", None)])
    st = next(s for s in plan.storages if d in s.members)
    assert (st.start, st.end) == (2, 3)
    assert plan.lower_bound == peak_live(program, 16) == 2 * 1024
    assert sum(plan.bank_sizes) == 2 * 1024


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("planner", ["greedy_by_size", "naive"])
def test_random_programs_never_overlap_live_tensors(seed: int, planner: str) -> None:
    rng = random.Random(seed)
    program = random_program(rng, rng.randint(1, 40))
    alignment = rng.choice([1, 4, 16, 64, 128])
    in_place = rng.random() < 0.7
    banks = [("sram", None)]
    plan = plan_memory(program, banks, alignment, planner, in_place)
    check_plan(program, plan, banks)
    assert plan.planner == planner and plan.alignment == alignment
    if not in_place:
        assert plan.in_place_reuses == 0
        assert plan.lower_bound == peak_live(program, alignment)
    assert sum(plan.bank_sizes) >= plan.lower_bound


@pytest.mark.parametrize("seed", range(60))
def test_greedy_between_lower_bound_and_naive(seed: int) -> None:
    rng = random.Random(1000 + seed)
    program = random_program(rng, rng.randint(5, 40))
    alignment = rng.choice([16, 64])
    for in_place in (False, True):
        greedy = plan_memory(program, [("sram", None)], alignment, "greedy_by_size", in_place)
        naive = plan_memory(program, [("sram", None)], alignment, "naive", in_place)
        assert greedy.lower_bound == naive.lower_bound
        assert greedy.lower_bound <= sum(greedy.bank_sizes) <= sum(naive.bank_sizes)
        # naive gives every storage its own bytes
        assert sum(naive.bank_sizes) == sum(s.size for s in naive.storages)


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_multi_bank(seed: int) -> None:
    rng = random.Random(2000 + seed)
    program = random_program(rng, rng.randint(5, 30))
    largest = max(align_up(v.nbytes, 16) for v in program.values if not v.is_constant)
    banks = [("tcm", largest + rng.choice([0, 16, 1024])), ("sram", None)]
    plan = plan_memory(
        program, banks, 16, rng.choice(["greedy_by_size", "naive"]), rng.random() < 0.5
    )
    check_plan(program, plan, banks)
    assert plan.bank_sizes[0] <= banks[0][1]


@pytest.mark.parametrize("alignment", [1, 2, 8, 16, 32, 64, 256, 4096])
def test_alignment_respected(alignment: int) -> None:
    b = Builder()
    x = b.input("x", 3)  # 12 bytes: odd sizes force padding
    ys = [b.mm(f"y{i}", x, x, 5 + i) for i in range(5)]
    z = ys[0]
    for i, y in enumerate(ys[1:]):
        z = b.mm(f"z{i}", z, y, 7)
    program = b.output(z)
    for planner in ("greedy_by_size", "naive"):
        plan = plan_memory(program, [("sram", None)], alignment, planner, True)
        check_plan(program, plan, [("sram", None)])
        for v in program.values:
            assert plan.where(v)[1] % alignment == 0
        for st in plan.storages:
            assert st.size == align_up(st.members[0].storage_root().nbytes, alignment)


@pytest.mark.parametrize("alignment", [0, -16, 3, 24, 100])
def test_bad_alignment_is_an_error(alignment: int) -> None:
    with pytest.raises(EtbuildError, match=rf"memory\.alignment={alignment} .*power of two"):
        plan_memory(chain(2), [("sram", None)], alignment)


def test_no_banks_is_an_error() -> None:
    with pytest.raises(EtbuildError, match="memory.banks is empty"):
        plan_memory(chain(2), [], 16)


# -- in-place reuse ---------------------------------------------------------------------


def _mid(values: list[TensorValue], name: str) -> TensorValue:
    return next(v for v in values if v.name == name)


def test_in_place_when_input_dies() -> None:
    b = Builder()
    x = b.input("x", 64)
    h = b.mm("h", x, x, 64)
    r = b.relu("r", h)  # h dies here: r may take its bytes
    out = b.mm("out", r, r, 64)
    program = b.output(out)
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", True)
    check_plan(program, plan, [("sram", None)])
    assert plan.in_place_reuses == 1
    assert plan.where(h) == plan.where(r)
    off = plan_memory(program, [("sram", None)], 16, "greedy_by_size", False)
    assert off.in_place_reuses == 0
    assert off.where(h) != off.where(r)


def test_no_in_place_when_input_lives_on() -> None:
    b = Builder()
    x = b.input("x", 64)
    h = b.mm("h", x, x, 64)
    r = b.relu("r", h)
    out = b.add("out", r, h)  # h is still needed after the relu
    program = b.output(out)
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", True)
    check_plan(program, plan, [("sram", None)])
    assert plan.where(h) != plan.where(r)
    # the add may write over r or h (both die there), but never over anything else
    assert plan.in_place_reuses == 1
    assert plan.where(out) in (plan.where(h), plan.where(r))


def test_no_in_place_when_a_view_lives_on() -> None:
    b = Builder()
    x = b.input("x", 64)
    h = b.mm("h", x, x, 64)
    hv = b.view("hv", h)
    r = b.relu("r", h)
    out = b.add("out", r, hv)  # h's bytes are still read through the view
    program = b.output(out)
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", True)
    check_plan(program, plan, [("sram", None)])
    assert plan.where(h) != plan.where(r)


def test_no_in_place_over_graph_input() -> None:
    b = Builder()
    x = b.input("x", 64)
    r = b.relu("r", x)  # x dies here, but the caller owns it
    program = b.output(b.mm("out", r, r, 64))
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", True)
    check_plan(program, plan, [("sram", None)])
    assert plan.in_place_reuses == 0
    assert plan.where(x) != plan.where(r)


def test_no_in_place_over_graph_output() -> None:
    b = Builder()
    x = b.input("x", 64)
    h = b.mm("h", x, x, 64)
    r = b.relu("r", h)  # h is its last use here, but h is also a program output
    program = b.output(r, h)
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", True)
    check_plan(program, plan, [("sram", None)])
    assert plan.in_place_reuses == 0
    assert plan.where(h) != plan.where(r)


def test_in_place_output_may_be_graph_output() -> None:
    b = Builder()
    x = b.input("x", 64)
    h = b.mm("h", x, x, 64)
    r = b.relu("r", h)
    program = b.output(r)
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", True)
    check_plan(program, plan, [("sram", None)])
    assert plan.where(h) == plan.where(r)
    # the merged storage holds an output now, so the next op may not write over it
    st = next(s for s in plan.storages if r in s.members)
    assert st.pinned


def test_no_in_place_for_non_elementwise_op() -> None:
    b = Builder()
    x = b.input("x", 64)
    h = b.mm("h", x, x, 64)
    m = b.mm("m", h, x, 64)  # mm cannot write over its input
    program = b.output(b.relu("out", m))
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", True)
    check_plan(program, plan, [("sram", None)])
    assert plan.where(h) != plan.where(m)


def test_no_in_place_across_dtype_or_shape() -> None:
    b = Builder()
    x = b.input("x", 64)
    h = b.mm("h", x, x, 60)  # 240 bytes -> 256 aligned, same as 64 floats
    big = b.mm("big", x, x, 64)
    out = b.add("out", big, h)  # broadcast-ish: h has another shape than the output
    program = b.output(b.mm("y", out, out, 4))
    plan = plan_memory(program, [("sram", None)], 256, "greedy_by_size", True)
    check_plan(program, plan, [("sram", None)])
    assert plan.where(out) != plan.where(h)


def test_in_place_over_constant_is_never_done() -> None:
    b = Builder()
    w = b.const("w", 64)
    x = b.input("x", 64)
    out = b.add("out", w, x)
    program = b.output(b.mm("y", out, out, 4))
    plan = plan_memory(program, [("sram", None)], 16, "greedy_by_size", True)
    assert plan.in_place_reuses == 0
    assert id(w) not in plan.location


# -- banks --------------------------------------------------------------------------------


def _two_live(numel: int = 256) -> Program:
    b = Builder()
    x = b.input("x", numel)
    y = b.mm("y", x, x, numel)
    return b.output(b.add("z", x, y))


def test_bank_overflow_message() -> None:
    program = _two_live()  # x, y and z: 1 KiB each
    with pytest.raises(EtbuildError) as info:
        plan_memory(program, [("sram", 1500)], 16, "greedy_by_size", True)
    msg = str(info.value)
    assert "does not fit" in msg
    assert "sram=1500" in msg
    assert "1024 bytes" in msg
    assert "memory.banks[*].size_bytes" in msg


def test_bank_exactly_large_enough() -> None:
    program = _two_live()
    plan = plan_memory(program, [("sram", 2048)], 16, "greedy_by_size", True)
    check_plan(program, plan, [("sram", 2048)])
    assert plan.bank_sizes == [2048]


@pytest.mark.parametrize("planner", ["greedy_by_size", "naive"])
def test_spill_to_second_bank(planner: str) -> None:
    program = _two_live()
    banks = [("tcm", 1024), ("sram", None)]
    plan = plan_memory(program, banks, 16, planner, True)
    check_plan(program, plan, banks)
    used = {plan.where(v)[0] for v in program.values}
    assert used == {0, 1}
    assert plan.bank_sizes[0] == 1024
    assert plan.bank_sizes[1] >= 1024
    assert plan.bank_names == ["tcm", "sram"]


def test_first_bank_preferred_when_it_fits() -> None:
    program = _two_live()
    banks = [("tcm", 1 << 20), ("sram", None)]
    plan = plan_memory(program, banks, 16, "greedy_by_size", True)
    assert plan.bank_sizes[1] == 0
    assert {plan.where(v)[0] for v in program.values} == {0}


def test_overflow_of_every_bank() -> None:
    program = _two_live(1024)  # 4 KiB tensors
    with pytest.raises(EtbuildError, match=r"tcm=1024 bytes, sram=2048 bytes"):
        plan_memory(program, [("tcm", 1024), ("sram", 2048)], 16, "greedy_by_size", True)


# -- banks with costs, alignments and contents ---------------------------------------------

CAT = OPS["aten::cat.out"]


def _cost_banks(program: Program, fast_share: float) -> list[Bank]:
    """A small fast bank (a share of the peak) and an unbounded slow one, costs 1 and 4."""
    peak = plan_memory(program, [("x", None)], 16, "greedy_by_size", True).lower_bound
    return [
        Bank("tcm", capacity=max(16, int(peak * fast_share) // 16 * 16)),
        Bank("ram", capacity=None, read_cost=4.0, write_cost=4.0),
    ]


@pytest.mark.parametrize("seed", range(30))
def test_every_planner_places_validly_across_costed_banks(seed: int) -> None:
    rng = random.Random(3000 + seed)
    program = random_program(rng, rng.randint(5, 30))
    banks = _cost_banks(program, rng.choice([0.2, 0.5, 0.8]))
    pairs = [(b.name, b.capacity) for b in banks]
    for planner in PLANNERS:
        plan = plan_memory(program, banks, 16, planner, rng.random() < 0.5)
        check_plan(program, plan, pairs)
        assert plan.bank_sizes[0] <= banks[0].capacity
        # the cost is the bytes each storage moves times its bank's cost
        expect = sum(s.cost(banks[s.bank]) for s in plan.storages)
        assert plan.cost == pytest.approx(expect)


@pytest.mark.parametrize("seed", range(30))
def test_hill_climb_costs_no_more_than_either_greedy(seed: int) -> None:
    rng = random.Random(4000 + seed)
    program = random_program(rng, rng.randint(8, 30))
    banks = _cost_banks(program, 0.4)
    costs = {p: plan_memory(program, banks, 16, p, True).cost for p in PLANNERS}
    assert costs["hill_climb"] <= min(costs["greedy_by_size"], costs["greedy_by_conflicts"])


def test_hot_tensor_goes_to_the_fast_bank() -> None:
    """Two tensors compete for a fast bank with room for one (every other tensor is too big
    for it): the one read most wins."""
    b = Builder()
    x = b.input("x", 512)
    cold = b.mm("cold", x, x, 256)  # read once
    hot = b.mm("hot", x, x, 256)  # read three times
    h = hot
    for i in range(3):
        h = b.mm(f"use{i}", h, hot, 512)
    program = b.output(b.mm("out", h, cold, 512))
    banks = [Bank("tcm", capacity=1024), Bank("ram", None, read_cost=8.0, write_cost=8.0)]
    plan = plan_memory(program, banks, 16, "hill_climb", in_place=False)
    assert (plan.where(hot)[0], plan.where(cold)[0]) == (0, 1)


def test_each_bank_has_its_own_alignment() -> None:
    program = random_program(random.Random(7), 20)
    banks = [Bank("tcm", capacity=512, alignment=64), Bank("ram", None, alignment=256)]
    plan = plan_memory(program, banks, 16, "greedy_by_size", True)
    assert plan.bank_alignments == [64, 256]
    for v in program.values:
        if not v.is_constant:
            bank, offset = plan.where(v)
            assert offset % plan.bank_alignments[bank] == 0


def test_scratch_is_reserved_for_the_whole_method() -> None:
    program = chain(4)
    banks = [Bank("tcm", capacity=4096), Bank("ram", None, read_cost=2.0, write_cost=2.0)]
    plan = plan_memory(program, banks, 16, "hill_climb", True, scratch_bytes=1000)
    assert plan.scratch is not None
    bank, offset, size = plan.scratch
    assert size == 1000 and bank == 0  # used at every call: it earns the fast bank
    lo, hi = offset, offset + align_up(size, 16)
    for v in program.values:
        b, off = plan.where(v)
        assert b != bank or off + v.nbytes <= lo or off >= hi, v.name
    assert plan.lower_bound >= align_up(1000, 16)


def test_constant_and_scratch_only_banks() -> None:
    program = chain(2)
    banks = [
        Bank("flash", capacity=1 << 20, holds=frozenset({"constants"})),
        Bank("scratchpad", capacity=4096, holds=frozenset({"scratch"})),
        Bank("sram", None, holds=frozenset({"activations"})),
    ]
    plan = plan_memory(program, banks, 16, "greedy_by_size", True, scratch_bytes=512)
    assert plan.bank_names == ["scratchpad", "sram"]  # flash holds no planned memory
    assert plan.scratch == (0, 0, 512)
    assert all(plan.where(v)[0] == 1 for v in program.values)


def test_copy_constants_fills_the_room_left_in_faster_banks_hottest_first() -> None:
    """Constants go to the cheapest bank that holds activations and has room after the
    planned tensors: the most-read bytes first, then the smallest; what fits nowhere stays
    in the constants bank, and nothing is copied into a bank no cheaper than it."""
    b = Builder()
    x = b.input("x", 64)
    small = b.const("small", 16)  # 64 B, read by three instructions
    medium = b.const("medium", 64)  # 256 B, read once
    big = b.const("big", 4096)  # 16 KiB, read once: fits neither fast bank
    h = b.add("a", x, small)
    h = b.add("b", h, small)
    h = b.add("c", h, small)
    h = b.add("d", h, medium)
    program = b.output(b.add("e", h, big))
    banks = [
        Bank("tcm", capacity=1024),
        Bank("sram", capacity=4096, read_cost=2.0, write_cost=2.0),
        Bank("flash", capacity=1 << 20, read_cost=3.0, write_cost=100.0,
             holds=frozenset({"constants"})),
        Bank("psram", None, read_cost=4.0, write_cost=4.0),
    ]  # fmt: skip
    plan = plan_memory(program, banks[:2] + banks[3:], 16, "hill_climb", True)
    planned = list(plan.bank_sizes)
    cost = plan.cost
    copy_constants(program, plan, banks[2])
    where = {c.value.name: (plan.bank_names[c.bank], c.offset) for c in plan.copied}
    assert list(where) == ["small", "medium"]  # 3 reads per byte of small; 1 of medium
    assert {name: bank for name, (bank, _) in where.items()} == {"small": "tcm", "medium": "tcm"}
    # after the planned tensors, aligned, not overlapping one another
    assert where["small"][1] == align_up(planned[0], 16)
    assert where["medium"][1] == align_up(where["small"][1] + 64, 16)
    assert plan.bank_sizes[0] == where["medium"][1] + 256 <= 1024
    assert plan.bank_sizes[1:] == planned[1:]  # nothing spilled to slower banks
    assert plan.where(small) == (0, where["small"][1])
    assert all(c.value is not big for c in plan.copied)
    assert plan.tensor_bytes() == sum(planned) and plan.cost == cost
    saved = {c.value.name: c.saved for c in plan.copied}
    assert saved == {"small": 3 * 64 * (3.0 - 1.0), "medium": 256 * (3.0 - 1.0)}


def test_copy_constants_never_copies_into_a_bank_no_faster_than_the_constants() -> None:
    b = Builder()
    x = b.input("x", 64)
    program = b.output(b.add("y", x, b.const("w", 64)))
    plan = plan_memory(program, [Bank("sram", None, read_cost=3.0)], 16, "hill_climb", True)
    copy_constants(
        program, plan, Bank("flash", None, read_cost=3.0, holds=frozenset({"constants"}))
    )
    assert plan.copied == []


def test_does_not_fit_names_the_peak_tensors_and_the_fixes() -> None:
    b = Builder()
    x = b.input("x", 256)
    y = b.mm("y", x, x, 2048)
    program = b.output(b.mm("z", y, y, 256))
    program.instructions[0].source = "File model.py, line 12, in forward\n    y = self.proj(x)"
    with pytest.raises(EtbuildError) as info:
        plan_memory(program, [Bank("tcm", 4096), Bank("sram", 2048)], 16, "hill_climb")
    msg = str(info.value)
    assert "does not fit the banks (tcm=4096 bytes, sram=2048 bytes)" in msg
    assert "are alive, against 6144 bytes" in msg
    assert "y [2048] torch.float32: 8192 bytes, made by: y = self.proj(x)" in msg
    assert "+quant=ptq" in msg and "model.inputs[*].shape" in msg
    assert "memory.banks[*].size_bytes" in msg


# -- memory-aware scheduling -------------------------------------------------------------


def _check_order_valid(original: Program, scheduled: Program) -> None:
    """Every tensor is written before it is read, and no write lands before an earlier read
    of the same storage in the original order would have happened."""
    assert sorted(map(id, original.instructions)) == sorted(map(id, scheduled.instructions))
    pos = {id(ins): k for k, ins in enumerate(scheduled.instructions)}
    writer = {}
    for ins in original.instructions:
        for r in ins.returns:
            writer[id(r.storage_root())] = ins
    for ins in scheduled.instructions:
        for t in ins.tensors():
            w = writer.get(id(t.storage_root()))
            if w is not None and w is not ins and t not in ins.returns:
                assert pos[id(w)] < pos[id(ins)], f"{t.name} read before written"


@pytest.mark.parametrize("seed", range(40))
def test_min_peak_order_is_valid_and_never_worse(seed: int) -> None:
    rng = random.Random(5000 + seed)
    program = random_program(rng, rng.randint(5, 40))
    in_place = rng.random() < 0.5
    schedule = min_peak_order(program, 16, in_place)
    _check_order_valid(program, schedule.program)
    assert schedule.peak_after <= schedule.peak_before
    plan = plan_memory(schedule.program, [("sram", None)], 16, "greedy_by_size", in_place)
    check_plan(schedule.program, plan, [("sram", None)])


def test_min_peak_order_finishes_one_branch_before_the_next() -> None:
    """Two branches each expand t and reduce it again; the exported order expands both first
    (both big tensors live at once). Finishing one branch first halves the peak."""
    b = Builder()
    x = b.input("x", 64)
    t = b.mm("t", x, x, 64)
    u1 = b.mm("u1", t, t, 4096)
    u2 = b.mm("u2", t, t, 4096)
    s1 = b.mm("s1", u1, u1, 16)
    s2 = b.mm("s2", u2, u2, 16)
    program = b.output(b.add("out", s1, s2))
    schedule = min_peak_order(program, 16, in_place=False)
    assert schedule.reordered
    assert schedule.peak_before >= 2 * 4096 * 4
    assert schedule.peak_after < 4096 * 4 + 1024
    _check_order_valid(program, schedule.program)


def test_min_peak_order_computes_a_bottleneck_blocks_projection_shortcut_earlier() -> None:
    """A ResNet-50-style (v1.5) downsampling bottleneck: 1x1 reduce, strided 3x3, 1x1 expand,
    and a strided 1x1 projection of the block input on the shortcut. The exported order (the
    module's forward) runs the projection last, so the block input stays alive beside the
    expanded output. Running it after the 3x3 frees the input before the expansion: 8 -> 6.5
    units of live memory. (A basic block, as in ResNet-8/18, gains nothing from any order:
    its add needs both branch outputs, and the input lives until one of them is made.)"""
    unit = 1024
    b = Builder()
    x = b.input("x", 4 * unit)  # 256 channels at 56x56
    c1 = b.mm("reduce", x, x, 2 * unit)  # 128 channels at 56x56
    c2 = b.mm("conv3x3_stride2", c1, c1, unit // 2)  # 128 channels at 28x28
    c3 = b.mm("expand", c2, c2, 2 * unit)  # 512 channels at 28x28
    d = b.mm("projection", x, x, 2 * unit)  # the shortcut: 512 channels at 28x28
    program = b.output(b.add("out", c3, d))
    schedule = min_peak_order(program, 16, in_place=False)
    assert schedule.reordered
    assert schedule.peak_before == 8 * unit * 4
    assert schedule.peak_after == int(6.5 * unit * 4)
    names = [ins.returns[0].name for ins in schedule.program.instructions]
    assert names == ["reduce", "conv3x3_stride2", "projection", "expand", "out"]
    _check_order_valid(program, schedule.program)


# -- concatenation in place --------------------------------------------------------------


def _cat(b: Builder, name: str, parts: list[TensorValue], dim: int = 0) -> TensorValue:
    out = b._value(name, sum(p.shape[0] for p in parts))
    b.program.instructions.append(Instruction(CAT, [parts, dim, out], [out]))
    return out


def test_concat_in_place_makes_the_inputs_slices_of_the_output() -> None:
    b = Builder()
    x = b.input("x", 64)
    p = b.mm("p", x, x, 100)
    q = b.relu("q", b.mm("q0", x, x, 28))
    cat = _cat(b, "cat", [p, q])
    program = b.output(b.mm("out", cat, cat, 8))
    before = plan_memory(program, [("sram", None)], 4, "greedy_by_size", False).lower_bound
    done, n = concat_in_place(program)
    assert n == 1 and all(ins.op.key != "aten::cat.out" for ins in done.instructions)
    assert (p.alias_of, p.alias_offset) == (cat, 0)
    assert (q.alias_of, q.alias_offset) == (cat, 400)
    plan = plan_memory(done, [("sram", None)], 4, "greedy_by_size", False)
    assert plan.where(p)[1] == plan.where(cat)[1]
    assert plan.where(q)[1] == plan.where(cat)[1] + 400
    assert plan.lower_bound < before


def test_concat_stays_a_copy_when_a_slice_is_not_its_own() -> None:
    b = Builder()
    x = b.input("x", 64)
    p = b.mm("p", x, x, 100)
    program = b.output(b.mm("out", _cat(b, "cat", [p, x]), p, 8))  # x is a program input
    assert concat_in_place(program)[1] == 0 and p.alias_of is None
    b = Builder()
    x = b.input("x", 64)
    p = b.mm("p", x, x, 100)
    program = b.output(b.mm("out", _cat(b, "cat", [p, p]), x, 8))  # the same tensor twice
    assert concat_in_place(program)[1] == 0
