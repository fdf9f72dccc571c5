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

from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.ir import Instruction, Program, TensorValue
from etbuild.pipeline.ops import load_ops
from etbuild.pipeline.planner import Plan, align_up, plan_memory

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
        assert off % plan.alignment == 0, (v.name, off, plan.alignment)
        assert off + v.nbytes <= plan.bank_sizes[bank]
        cap = banks[bank][1]
        assert cap is None or off + align_up(v.nbytes, plan.alignment) <= cap
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
    plan = plan_memory(program, banks, 16, rng.choice(["greedy_by_size", "naive"]), rng.random() < 0.5)
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
    with pytest.raises(EtbuildError, match=r"tcm=1024, sram=2048"):
        plan_memory(program, [("tcm", 1024), ("sram", 2048)], 16, "greedy_by_size", True)
