"""Memory banks reach the runtime by name: the emit stage's bank table (named data
``etbuild.memory_banks``, runtime_src/schema/memory_banks.fbs) gives each bank's name, size
and alignment and the kernels' scratch region; the runtime verifies it at load (a malformed
table is an error naming what is wrong), and programs without one still load (banks bank0,
bank1, ...)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from rt_helpers import build_with_executorch, compose

from etbuild.pipeline import pte

X = torch.randn(3, 8)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    ).eval()  # fmt: skip


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """The pipeline's program IR and plan (export .. emit, in-process, no stage cache), with
    the overrides of a two-bank memory config, so tests can emit variants of it."""
    from etbuild.pipeline.runner import run_stages
    from etbuild.pipeline.stages import STAGES

    run_dir = tmp_path_factory.mktemp("banks")
    cfg = compose(
        [
            "model=mlp",
            "model.dynamic_dims=[]",
            "pipeline.cache=false",
            "memory.banks=[{name:fast,size_bytes:512},{name:slow,size_bytes:null}]",
        ]
    )

    def model_stage(ctx) -> None:
        ctx.artifacts["module"] = _model()
        ctx.artifacts["example_inputs"] = (X,)

    wanted = ("export", "lower", "out_variant", "plan", "emit")
    # The zoo's model stage with this module in place of its model: the same contract.
    model = dataclasses.replace(next(s for s in STAGES if s.name == "model"), fn=model_stage)
    chosen = [model] + [s for s in STAGES if s.name in wanted]
    return run_stages(chosen, cfg, run_dir, log=lambda _line: None)


def _write(tmp_path: Path, data: bytes, name: str = "model.pte") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _named_index(data: bytes, key: str) -> int:
    f = pte.read(data)
    for named in f.program.namedData:
        k = named.key.decode() if isinstance(named.key, bytes) else named.key
        if k == key:
            return named.segmentIndex
    raise AssertionError(f"no named data {key}")


def _replace_table(data: bytes, table: bytes) -> bytes:
    """``data`` with its bank table segment replaced by ``table`` (same length), checksums
    recomputed: only the runtime's own check of the table can catch what is wrong."""
    f = pte.read(data)
    index = _named_index(data, pte.BANKS_KEY)
    seg = f.program.segments[index]
    assert len(table) == seg.size, (len(table), seg.size)
    start = f.segment_base + seg.offset
    patched = data[:start] + table + data[start + len(table) :]
    return pte.write_checksums(patched, _named_index(data, pte.CHECKSUMS_KEY))


def test_method_meta_names_the_banks_with_their_alignment(rt, stages, tmp_path):
    data = (stages.run_dir / "model.pte").read_bytes()
    (table,) = pte.bank_tables(data)
    assert table.method == "forward" and table.names == ["fast", "slow"]
    meta = rt.load(_write(tmp_path, data)).method_meta()
    assert meta["memory_bank_table"] is True
    assert meta["memory_bank_names"] == ["fast", "slow"]
    assert meta["memory_banks"] == table.sizes == list(stages.artifacts["plan"].bank_sizes)
    assert meta["memory_bank_alignments"] == [16, 16]
    assert meta["scratch"] is None
    assert meta["memory_banks"][0] > 0 and meta["memory_banks"][1] > 0  # the plan spilled


def test_the_runner_prints_the_bank_names(stages):
    import shutil
    import subprocess

    runner = shutil.which("etb_runner")
    if runner is None:
        pytest.skip("etb_runner is not on PATH")
    from etbuild.pipeline import etbt

    etbt.write(stages.run_dir / "x.etbt", X)
    out = subprocess.run(
        [runner, str(stages.run_dir / "model.pte"), "--input", str(stages.run_dir / "x.etbt")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    plan = stages.artifacts["plan"]
    assert f"memory_bank: fast {plan.bank_sizes[0]} bytes, aligned 16" in out, out
    assert f"memory_bank: slow {plan.bank_sizes[1]} bytes, aligned 16" in out, out


def test_alignment_and_scratch_region_reach_the_runtime(rt, stages, tmp_path):
    """A plan whose banks ask for 4 KiB alignment and that reserves the kernels' scratch in
    bank 1: the runtime reports both, allocates the banks so, and the kernels take their
    scratch from the region (a region too small for them is the kernels' error)."""
    import copy

    from etbuild.pipeline.stages.emit import emit_program

    def program_with_scratch(size: int) -> str:
        plan = copy.copy(stages.artifacts["plan"])
        at = plan.bank_sizes[1]
        plan.bank_sizes = [plan.bank_sizes[0], at + size]
        plan.bank_alignments = [4096, 64]
        plan.scratch = (1, at, size)
        data, _ = emit_program(stages.artifacts["program"], plan, 16, 128)
        return _write(tmp_path, data, f"scratch_{size}.pte"), at

    path, at = program_with_scratch(65536)
    prog = rt.load(path)
    meta = prog.method_meta()
    assert meta["memory_bank_alignments"] == [4096, 64]
    assert meta["scratch"] == {"bank": 1, "offset": at, "size": 65536}
    (out,) = prog.run([X])
    torch.testing.assert_close(out, _model()(X), rtol=1e-5, atol=1e-5)
    # 64 bytes: short of the first layer's GEMM workspace on every ISA (its depth times the
    # vector width less one: 224 bytes with AVX2, whose largest, 896, fits in 1 KiB).
    small, _ = program_with_scratch(64)
    with pytest.raises(rt.Error, match=r"temp allocator cannot provide \d+ bytes \(size 64,"):
        rt.load(small).run([X])


@pytest.mark.parametrize(
    "change, message",
    [
        ("identifier", "fails flatbuffer verification"),
        ("size", "bank 'fast' of method 'forward' is"),
        ("name", "has no name or one that is not an identifier"),
        ("alignment", "has alignment 24 (a power of two"),
        ("duplicate", "are both named 'fast'"),
    ],
)
def test_a_malformed_bank_table_is_an_error(rt, stages, tmp_path, change, message):
    data = (stages.run_dir / "model.pte").read_bytes()
    (table,) = pte.bank_tables(data)
    if change == "identifier":
        body = pte.encode_bank_tables([table])
        bad = body[:4] + b"XXXX" + body[8:]
    else:
        if change == "size":
            table.sizes[0] += 16
        elif change == "name":
            table.names[0] = "f-st"
        elif change == "alignment":
            table.alignments[0] = 24
        elif change == "duplicate":
            table.names[1] = "fast"
        bad = pte.encode_bank_tables([table])
    path = _write(tmp_path, _replace_table(data, bad))
    with pytest.raises(rt.Error, match="the program's memory bank table is malformed") as err:
        rt.load(path)
    assert message in str(err.value), str(err.value)


def test_a_bank_table_that_lists_another_method_or_bank_count_is_an_error(rt, stages, tmp_path):
    from etbuild.pipeline.stages.emit import emit_program

    plan = stages.artifacts["plan"]
    program = stages.artifacts["program"]
    real = pte.encode_bank_tables
    try:
        pte.encode_bank_tables = lambda tables: real(
            [pte.BankTable("backward", t.names, t.sizes, t.alignments) for t in tables]
        )
        data, _ = emit_program(program, plan, 16, 128)
        with pytest.raises(rt.Error, match="lists method 'backward', which the program does not"):
            rt.load(_write(tmp_path, data, "other_method.pte"))
        pte.encode_bank_tables = lambda tables: real(
            [pte.BankTable(t.method, t.names[:1], t.sizes[:1], t.alignments[:1]) for t in tables]
        )
        data, _ = emit_program(program, plan, 16, 128)
        with pytest.raises(rt.Error, match="lists 1 banks for method 'forward', which plans 2"):
            rt.load(_write(tmp_path, data, "one_bank.pte"))
    finally:
        pte.encode_bank_tables = real


def test_a_program_without_a_bank_table_still_loads(rt, stages, tmp_path):
    from etbuild.pipeline.stages.emit import emit_program

    data, _ = emit_program(stages.artifacts["program"], stages.artifacts["plan"], 16, 128, False)
    assert pte.bank_tables(data) is None
    prog = rt.load(_write(tmp_path, data))
    meta = prog.method_meta()
    assert meta["memory_bank_table"] is False
    assert meta["memory_bank_names"] == ["bank0", "bank1"]
    assert meta["memory_bank_alignments"] == [16, 16]
    (out,) = prog.run([X])
    torch.testing.assert_close(out, _model()(X), rtol=1e-5, atol=1e-5)


def test_executorch_programs_have_unnamed_banks(rt, tmp_path):
    pytest.importorskip("executorch")
    path = build_with_executorch(_model(), (X,), tmp_path / "et.pte")
    meta = rt.load(str(path)).method_meta()
    assert meta["memory_bank_table"] is False
    assert meta["memory_bank_names"] == [f"bank{i}" for i in range(len(meta["memory_banks"]))]


@pytest.mark.oracle
def test_executorch_runs_a_program_with_a_bank_table(stages):
    runtime = pytest.importorskip("executorch.runtime")
    data = (stages.run_dir / "model.pte").read_bytes()
    assert pte.bank_tables(data) is not None
    method = runtime.Runtime.get().load_program(data).load_method("forward")
    (out,) = method.execute([X])
    torch.testing.assert_close(out, _model()(X), rtol=1e-5, atol=1e-5)
