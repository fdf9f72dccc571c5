"""Partitioners and delegates: a backend that lives in tests/ (tests/toy_backend: a Python
partitioner and a C++ backend) plugs in through ``partitioner._target_``, with no edit to the
pipeline or the runtime. Its partitions become delegate calls whose blobs the program carries
in segments; the runtime built for the program links the backend and matches eager; the
config's filters narrow what it takes, and each refusal is reported with its reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from etbuild_test_support import build_in_process

from etbuild.pipeline.errors import EtbuildError

pytestmark = pytest.mark.e2e

MODEL = [
    "model=custom",
    "model._target_=toy_backend.model.toy_net",
    "model.name=toy_net",
    "model.inputs=[{name:x,shape:[1,3,8,8]}]",
]
TOY = ["partitioner.name=toy", "partitioner._target_=toy_backend.partitioner.ToyBackend"]


def _partitions(tmp_path: Path, *extra: str) -> dict:
    ctx = build_in_process([*MODEL, *TOY, *extra, "pipeline.stop_after=partition"], tmp_path)
    return ctx.artifacts["partitions"]


@pytest.fixture(scope="module")
def toy_build(tmp_path_factory: pytest.TempPathFactory):
    run_dir = tmp_path_factory.mktemp("toy")
    ctx = build_in_process([*MODEL, *TOY, "build.compare_all_ops=false"], run_dir)
    return run_dir, ctx


def test_the_backend_runs_its_partitions_and_the_program_matches_eager(toy_build) -> None:
    run_dir, ctx = toy_build
    parts = ctx.artifacts["partitions"]
    # conv -> [mul, add, relu, sub] -> mul (refused: it broadcasts) -> [add, relu, sub]
    assert [p["ops"] for p in parts["partitions"]] == [
        {"add": 1, "mul": 1, "relu": 1, "sub": 1},
        {"add": 1, "relu": 1, "sub": 1},
    ]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    verify = ctx.artifacts["verify"]
    assert verify["status"] == "ran" and float(verify["max_rel_error"]) <= 1e-5, verify
    # verify times the runner: the report of every host build shows the latency
    assert re.fullmatch(r"\d+\.\d+ ms median \(p10 \S+, p90 \S+; 10 runs\)", verify["latency"])
    assert f"| latency | {verify['latency']} |" in (run_dir / "report.md").read_text()
    selection = yaml.safe_load((run_dir / "selected_operators.yaml").read_text())
    assert selection["backends"] == ["EtbToyBackend"]
    assert "aten::relu.out" not in selection["operators"]  # every relu is delegated
    assert b"EtbToyBackend" in (run_dir / "runtime" / "bin" / "etb_runner").read_bytes()


def test_the_program_holds_the_delegates_and_their_blobs(toy_build) -> None:
    from etbuild.pipeline import pte
    from etbuild.schema.InstructionArguments import InstructionArguments

    run_dir, _ = toy_build
    f = pte.read((run_dir / "model.pte").read_bytes())
    (plan,) = f.program.executionPlan
    assert [d.id.decode() for d in plan.delegates] == ["EtbToyBackend"] * 2
    kinds = [i.instrArgsType for i in plan.chains[0].instructions]
    assert kinds.count(InstructionArguments.DelegateCall) == 2
    for d in plan.delegates:
        assert d.processed.location == 1  # SEGMENT
        assert f.segment(d.processed.index)[:4] == b"ETOY"
        assert [(s.key.decode(), bytes(s.value)) for s in d.compileSpecs] == [("max_steps", b"64")]


def test_the_report_shows_partitions_and_what_stayed_outside(toy_build) -> None:
    run_dir, _ = toy_build
    report = (run_dir / "report.md").read_text()
    assert "## Delegated to EtbToyBackend" in report
    assert "2 partition(s) hold" in report
    assert "| `convolution` | 1 | the toy backend runs add, sub, mul and relu only |" in report
    assert "| `mul` | 1 | an operand needs broadcasting | `Tensor.mul in ToyNet` |" in report


def test_a_runtime_without_the_backend_names_it(toy_build) -> None:
    import etbuild.runtime

    run_dir, _ = toy_build
    with pytest.raises(RuntimeError, match=r"no backend 'EtbToyBackend' is registered in this"):
        prog = etbuild.runtime.load(str(run_dir / "model.pte"))
        prog.run([torch.randn(1, 3, 8, 8)])


def test_the_filters_narrow_what_the_backend_takes(tmp_path: Path) -> None:
    only_relu = _partitions(tmp_path / "a", "partitioner.ops=[relu]")
    assert [p["ops"] for p in only_relu["partitions"]] == [{"relu": 1}, {"relu": 1}]
    assert {"op": "sub", "reason": "sub is not in partitioner.ops", "calls": 2} in [
        {k: r[k] for k in ("op", "reason", "calls")} for r in only_relu["refused"]
    ]
    big = _partitions(tmp_path / "b", "partitioner.min_partition_size=4")
    assert [p["ops"] for p in big["partitions"]] == [{"add": 1, "mul": 1, "relu": 1, "sub": 1}]
    assert any("fewer than partitioner.min_partition_size=4" in r["reason"] for r in big["refused"])
    none = _partitions(tmp_path / "c", "partitioner.dtypes=[int8]")
    assert none["partitions"] == []
    assert {r["reason"] for r in none["refused"]} >= {"dtype float32 is not in partitioner.dtypes"}
    excluded = _partitions(tmp_path / "d", "partitioner.exclude_modules=['']")
    assert excluded["partitions"] == []  # every op sits in the top-level module


def test_a_dynamic_batch_counts_flops_at_its_example_size(tmp_path: Path) -> None:
    """With a dynamic batch, op counts are symbolic; the partition report counts them at the
    example size (it used to fail formatting a symbolic share)."""
    fixed = _partitions(tmp_path / "a")
    ctx = build_in_process(
        [*MODEL, *TOY, "model.inputs=[{name:x,shape:[2,3,8,8]}]",
         "model.dynamic_dims=[{name:batch,input:x,dim:0,min:1,max:8}]",
         "pipeline.stop_after=partition"],
        tmp_path / "b",
    )  # fmt: skip
    dynamic = ctx.artifacts["partitions"]
    assert isinstance(dynamic["total_flops"], int)
    assert dynamic["total_flops"] == 2 * fixed["total_flops"]  # batch 2 against batch 1
    assert dynamic["partitions"]


def test_delegated_program_matches_the_reference_execution(tmp_path: Path) -> None:
    """The lowered graph with delegate nodes still executes in torch (the reference stage's
    view of it), and gives eager's outputs."""
    ctx = build_in_process([*MODEL, *TOY, "pipeline.stop_after=partition"], tmp_path)
    x = torch.randn(1, 3, 8, 8)
    got = ctx.artifacts["graph"].execute(x)
    with torch.no_grad():
        want = ctx.artifacts["module"](x)
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["partitioner.name=toy"], r"partitioner 'toy' has no _target_: set partitioner\._target_"),
        (
            ["partitioner.name=toy", "partitioner._target_=toy_backend.nowhere.Backend"],
            r"partitioner\._target_='toy_backend\.nowhere\.Backend' cannot be imported",
        ),
        (
            ["partitioner.name=toy", "partitioner._target_=toy_backend.model.toy_net"],
            r"returned ToyNet, which lacks id, runtime_dir, check, preprocess",
        ),
        (
            [*TOY, "+partitioner.args.steps=3"],
            r"ToyBackend\(\*\*partitioner\.args\) failed: .*unexpected keyword argument 'steps'",
        ),
        ([*TOY, "partitioner.min_partition_size=0"], r"min_partition_size=0 is not valid"),
    ],
)
def test_a_bad_partitioner_config_fails_before_any_stage(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(EtbuildError, match=message):
        build_in_process([*MODEL, *overrides], tmp_path)
    assert not (tmp_path / "model.pte").exists()
