"""End to end over the model zoo: artifacts, the program file, rebuilds, ExecuTorch itself.

Each zoo model is built once per session in-process (``zoo_build``) and once more through the
``etbuild`` command (``cli_rebuild``), which must give byte-identical files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from etbuild_test_support import ARTIFACTS, ZOO, build_in_process, run_cli, run_in_executorch

from etbuild.pipeline import etbt, pte

pytestmark = pytest.mark.e2e

TENSOR, TENSOR_LIST, OPT_TENSOR_LIST, INT_LIST = 5, 10, 11, 7
SCALAR_TYPES = {6: torch.float32, 4: torch.int64, 3: torch.int32, 11: torch.bool, 1: torch.int8}
ITEMSIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_reference(run_dir: Path) -> dict:
    return torch.load(run_dir / "reference.pt", weights_only=True)


@pytest.fixture(scope="session")
def cli_rebuild(tmp_path_factory: pytest.TempPathFactory):
    """``cli_rebuild(model) -> run_dir``: the same default config, built by the CLI."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            base = tmp_path_factory.mktemp(f"cli_{name}")
            run_dir = base / "run"
            proc = run_cli([f"model={name}", f"hydra.run.dir={run_dir}"], base)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert f"etbuild: done: {run_dir}" in proc.stdout
            done[name] = run_dir
        return done[name]

    return get


# -- artifacts ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", ZOO)
def test_zoo_model_builds_all_artifacts(zoo_build, model: str) -> None:
    run_dir = zoo_build(model)
    for name in ARTIFACTS:
        assert (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0, name
    assert not list(run_dir.glob("*.tmp")) and not list(run_dir.glob(".*.tmp"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["error"] is None
    from etbuild.pipeline.stages import STAGES

    assert [s["name"] for s in manifest["stages"]] == [s.name for s in STAGES]
    assert manifest["config"]["model"]["name"] == model
    # Every file a stage says it wrote is on disk with that hash (the last writer wins).
    written: dict[str, str] = {}
    for stage in manifest["stages"]:
        assert stage["seconds"] >= 0
        written.update(stage["writes"])
    top = {name for name in written if not name.startswith("runtime/")}
    assert top == set(ARTIFACTS) - {"manifest.json"} | {"memory_sram.png"}  # one picture per bank
    assert {"runtime/bin/etb_runner", "runtime/lib/libetb_kernels.a"} <= set(written)
    for name, digest in written.items():
        assert sha(run_dir / name) == digest, name
    lower = next(s for s in manifest["stages"] if s["name"] == "lower")
    assert "ops_yaml" in lower["reads"]


@pytest.mark.parametrize("model", ZOO)
def test_program_round_trips_through_the_reader(zoo_build, model: str) -> None:
    run_dir = zoo_build(model)
    data = (run_dir / "model.pte").read_bytes()
    assert data[4:8] == b"ET12" and data[8:12] == b"eh00"
    pf = pte.read(data)
    prog = pf.program
    assert len(prog.executionPlan) == 1
    plan = prog.executionPlan[0]
    assert plan.name == b"forward"
    values = plan.values
    n = len(values)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    emit = next(s for s in manifest["stages"] if s["name"] == "emit")["summary"]
    assert n == emit["values"]
    instructions = plan.chains[0].instructions
    assert len(instructions) == emit["instructions"]

    # operators: exactly those of selected_operators.yaml, each used
    ops = [(o.name.decode(), o.overload.decode()) for o in plan.operators]
    assert len(set(ops)) == len(ops) == emit["operators"]
    selected = yaml.safe_load((run_dir / "selected_operators.yaml").read_text())["operators"]
    assert {f"{a}.{b}" if b else a for a, b in ops} == set(selected)
    assert sum(v["count"] for v in selected.values()) == len(instructions)

    # every index in an instruction is in range
    used_ops = set()
    for ins in instructions:
        call = ins.instrArgs
        assert 0 <= call.opIndex < len(ops)
        used_ops.add(call.opIndex)
        for a in call.args:
            assert 0 <= a < n, (ins, a)
            v = values[a]
            if v.valType in (TENSOR_LIST, OPT_TENSOR_LIST, INT_LIST):
                assert all(0 <= i < n for i in v.val.items)
    assert used_ops == set(range(len(ops)))

    # constant segment: the recorded size, every constant inside it
    seg_index = prog.constantSegment.segmentIndex
    segment = pf.segment(seg_index)
    assert len(segment) == prog.segments[seg_index].size == emit["constant_bytes"] > 0
    offsets = list(prog.constantSegment.offsets)
    assert offsets[0] == 0 and offsets == sorted(offsets)
    banks = list(plan.nonConstBufferSizes)
    mem = json.loads((run_dir / "memory_plan.json").read_text())
    assert banks == [0] + [b["planned_bytes"] for b in mem["banks"]]
    for v in values:
        if v.valType != TENSOR:
            continue
        t = v.val
        nbytes = int(np.prod(t.sizes)) * ITEMSIZE[t.scalarType] if len(t.sizes) else 0
        if t.dataBufferIdx:
            assert 0 < t.dataBufferIdx < len(offsets)
            assert offsets[t.dataBufferIdx] + nbytes <= len(segment)
        elif t.allocationInfo is not None:
            a = t.allocationInfo
            off = a.memoryOffsetLow + (a.memoryOffsetHigh << 32)
            assert 1 <= a.memoryId < len(banks)
            assert off + nbytes <= banks[a.memoryId]

    # inputs and outputs: dtypes and shapes of reference.pt (dynamic dims at their max)
    ref = load_reference(run_dir)
    dyn = {(d["input"], d["dim"]): d["max"] for d in manifest["config"]["model"]["dynamic_dims"]}
    names = [i["name"] for i in manifest["config"]["model"]["inputs"]]
    assert len(plan.inputs) == len(ref["inputs"])
    for i, (idx, expected) in enumerate(zip(plan.inputs, ref["inputs"], strict=True)):
        t = values[idx].val
        assert values[idx].valType == TENSOR
        assert SCALAR_TYPES[t.scalarType] == expected.dtype
        want = [dyn.get((names[i], d), s) for d, s in enumerate(expected.shape)]
        assert list(t.sizes) == want
        assert t.shapeDynamism == (
            1 if any((names[i], d) in dyn for d in range(expected.dim())) else 0
        )
    assert len(plan.outputs) == len(ref["outputs"])
    for idx, expected in zip(plan.outputs, ref["outputs"], strict=True):
        t = values[idx].val
        assert SCALAR_TYPES[t.scalarType] == expected.dtype
        if not dyn:
            assert list(t.sizes) == list(expected.shape)
        else:
            assert len(t.sizes) == expected.dim()


@pytest.mark.parametrize("model", ZOO)
def test_reference_outputs_are_order_one(zoo_build, model: str) -> None:
    ref = load_reference(zoo_build(model))
    assert ref["inputs"] and ref["outputs"]
    for out in ref["outputs"]:
        assert torch.isfinite(out).all()
        assert out.float().std() >= 0.1


def test_runner_profile_counts_each_threads_time_in_tasks(zoo_build, tmp_path: Path) -> None:
    """etb_runner --profile at 2 threads prints the pool's loops, each thread's ms in tasks
    (the split of a 2-thread time into work and waiting), its tasks and those it took over from
    the other's share, per timed run; at 1 thread there is no pool, and without --profile
    nothing is counted."""
    run_dir = zoo_build("mobilenet")
    (x,) = load_reference(run_dir)["inputs"]
    etbt.write(tmp_path / "x.etbt", x)
    runner = [str(run_dir / "runtime" / "bin" / "etb_runner"), str(run_dir / "model.pte"),
              "--input", str(tmp_path / "x.etbt"), "--iters", "4", "--warmup", "1"]  # fmt: skip

    def run(*args: str) -> str:
        proc = subprocess.run([*runner, *args], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = run("--threads", "2", "--profile")
    (line,) = [ln for ln in out.splitlines() if ln.startswith("task_time: ")]
    pattern = (
        r"task_time: loops_per_run=([\d.]+) ms_per_run=([\d.,]+) "
        r"tasks_per_run=([\d.,]+) taken_over_per_run=([\d.,]+)"
    )
    loops, ms, tasks, taken = re.fullmatch(pattern, line).groups()
    # Every run runs the same loops: dozens (MobileNetV2's convolutions, adds, mean, ...).
    assert float(loops).is_integer() and 30 <= float(loops) <= 500, line
    busy = [float(v) for v in ms.split(",")]
    median = float(re.search(r"latency_ms: median=([\d.]+)", out).group(1))
    assert len(busy) == 2 and sum(busy) > 0 and max(busy) < 10 * median, (line, median)
    # Every loop has a task or more; a thread takes over only tasks it did not start with.
    ran = [float(v) for v in tasks.split(",")]
    over = [float(v) for v in taken.split(",")]
    assert len(ran) == len(over) == 2 and sum(ran) >= float(loops), line
    assert all(0 <= o <= r for o, r in zip(over, ran, strict=True)), line
    assert "task_time" not in run("--threads", "1", "--profile")
    assert "task_time" not in run("--threads", "2")


# Determinism of the whole pipeline, through the command line: the model with the most kinds
# of op, the one with a dynamic batch and the transformer (the CNNs add nothing new here, and
# each rebuild costs most of a minute of CI).
@pytest.mark.parametrize("model", ["mobilenet_v3_small", "mlp", "transformer"])
def test_rebuild_through_cli_is_byte_identical(zoo_build, cli_rebuild, model: str) -> None:
    first, second = zoo_build(model), cli_rebuild(model)
    for name in ("model.pte", "memory_plan.json", "selected_operators.yaml"):
        assert sha(first / name) == sha(second / name), name
    a, b = load_reference(first), load_reference(second)
    for x, y in zip(a["inputs"] + a["outputs"], b["inputs"] + b["outputs"], strict=True):
        assert torch.equal(x, y)
    for name in ARTIFACTS:
        assert (second / name).is_file(), name


# -- memory -------------------------------------------------------------------------------


EXECUTORCH_MOBILENET_V2_BYTES = 9_936_896


def test_mobilenet_memory_plan(zoo_build) -> None:
    mem = json.loads((zoo_build("mobilenet") / "memory_plan.json").read_text())
    total, bound = mem["total_bytes"], mem["lower_bound_bytes"]
    assert total == sum(b["planned_bytes"] for b in mem["banks"])
    assert total <= 0.7 * EXECUTORCH_MOBILENET_V2_BYTES, total
    assert bound <= total <= 1.10 * bound, (total, bound)
    assert mem["planners"]["naive"]["total_bytes"] >= total


def test_mobilenet_fused_float_blocks_plan_less_memory(zoo_build, tmp_path: Path) -> None:
    """With pipeline.lower.fuse_float_blocks=true the blocks on 112x112, 56x56 and 28x28
    planes run fused (pipeline/blocks.py): their 6x-wide tensors are not planned (2,408,448
    bytes against 6,021,120 with separate calls)."""
    build_in_process(["model=mobilenet", "pipeline.lower.fuse_float_blocks=true",
                      "pipeline.stop_after=plan"], tmp_path)  # fmt: skip
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (partition,) = [s for s in manifest["stages"] if s["name"] == "partition"]
    assert partition["summary"]["blocks_fused"] == 7
    fused = json.loads((tmp_path / "memory_plan.json").read_text())["total_bytes"]
    separate = json.loads((zoo_build("mobilenet") / "memory_plan.json").read_text())
    assert fused <= 0.45 * separate["total_bytes"], (fused, separate["total_bytes"])


@pytest.mark.parametrize("model", ZOO)
def test_memory_plan_is_consistent(zoo_build, model: str) -> None:
    mem = json.loads((zoo_build(model) / "memory_plan.json").read_text())
    banks = {b["name"]: b["planned_bytes"] for b in mem["banks"]}
    assert mem["lower_bound_bytes"] <= mem["total_bytes"] == sum(banks.values())
    # one flat bank: the plan reaches the peak-live bound exactly
    assert mem["total_bytes"] == mem["lower_bound_bytes"], model
    by_storage: dict[str, list[dict]] = {}
    for t in mem["tensors"]:
        assert t["offset"] % mem["alignment"] == 0
        assert t["offset"] + t["size"] <= banks[t["bank"]]
        by_storage.setdefault(t["storage"], []).append(t)
    # storages live at the same time do not overlap
    stor = [
        (ts[0]["bank"], ts[0]["offset"], max(x["size"] for x in ts), *ts[0]["lifetime"], k)
        for k, ts in by_storage.items()
    ]
    for i, (b1, o1, s1, a1, e1, k1) in enumerate(stor):
        for b2, o2, s2, a2, e2, k2 in stor[i + 1 :]:
            if b1 == b2 and a1 <= e2 and a2 <= e1:
                assert o1 + s1 <= o2 or o2 + s2 <= o1, (k1, k2)


# -- ExecuTorch's own runtime ---------------------------------------------------------------

DYNAMIC_BATCHES = (1, 7, 16)  # the mlp's batch dim is dynamic in [1, 16]


def _mlp_dynamic_cases(run_dir: Path, out: Path) -> Path:
    """Inputs of other batch sizes and the eager outputs for them."""
    from etbuild_test_support import compose_config

    from etbuild.pipeline.stages.model import build_module

    module = build_module(compose_config(["model=mlp"]).model).eval()
    gen = torch.Generator().manual_seed(99)
    inputs = [[torch.randn(b, 64, generator=gen)] for b in DYNAMIC_BATCHES]
    with torch.no_grad():
        outputs = [[module(*x)] for x in inputs]
    # the module rebuilt here is the one that was built (same seed, same reference outputs)
    ref = load_reference(run_dir)
    with torch.no_grad():
        torch.testing.assert_close(module(*ref["inputs"]), ref["outputs"][0])
    torch.save({"inputs": inputs, "outputs": outputs}, out)
    return out


@pytest.fixture(scope="session")
def executorch_results(zoo_build, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Run every zoo model's model.pte in ExecuTorch's runtime (one subprocess, so a crash
    in the runtime is reported per model instead of killing the test session)."""
    if importlib.util.find_spec("executorch") is None:
        pytest.skip("executorch is not importable; pip install executorch==1.5.1")
    dirs = {m: str(zoo_build(m)) for m in ZOO}
    cases = _mlp_dynamic_cases(zoo_build("mlp"), tmp_path_factory.mktemp("et") / "mlp_cases.pt")
    results = run_in_executorch(list(dirs.values()), {dirs["mlp"]: cases})
    return {m: results[d] for m, d in dirs.items()}


@pytest.mark.oracle
@pytest.mark.parametrize("model", ZOO)
def test_executorch_runs_program_and_matches_eager(executorch_results, model: str) -> None:
    r = executorch_results[model]
    assert "error" not in r, r.get("error")
    assert r["n"] == r["want_n"] >= 1
    for o in r["outputs"]:
        assert o["shape"] == o["want_shape"]
        assert o["std"] >= 0.1, o
        assert o["err"] <= 1e-4 * o["scale"], o


# -- selection, report, file modes ------------------------------------------------------------


@pytest.mark.parametrize("model", ZOO)
def test_selected_dtypes_are_supported_by_ops_yaml(zoo_build, model: str) -> None:
    from etbuild.pipeline.ops import load_ops
    from etbuild.pipeline.scalar_types import DTYPE_NAMES
    from etbuild.pipeline.stages.select import SCALAR_KINDS, is_scalar_arg

    ops = load_ops()
    selected = yaml.safe_load((zoo_build(model) / "selected_operators.yaml").read_text())
    for key, entry in selected["operators"].items():
        assert key in ops, key
        assert entry["count"] >= 1
        scalars = {a.name for a in ops[key].schema.arguments if is_scalar_arg(a)}
        for arg, names in entry["dtypes"].items():
            if arg in scalars:  # the kind of scalar the program passes
                supported = set(SCALAR_KINDS.values())
            else:
                supported = {DTYPE_NAMES[d] for d in ops[key].dtypes.get(arg, ())}
            assert names and set(names) <= supported, (key, arg, names, supported)


def test_report_states_the_facts(zoo_build) -> None:
    run_dir = zoo_build("mobilenet")
    report = (run_dir / "report.md").read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    mem = json.loads((run_dir / "memory_plan.json").read_text())
    emit = next(s for s in manifest["stages"] if s["name"] == "emit")["summary"]
    assert "# etbuild report: mobilenet" in report
    assert f"| instructions | {emit['instructions']} |" in report
    assert f"{(run_dir / 'model.pte').stat().st_size:,} B" in report
    assert f"{emit['constant_bytes']:,} B" in report
    assert f"{mem['total_bytes']:,} B" in report
    assert f"{mem['lower_bound_bytes']:,} B" in report
    selected = yaml.safe_load((run_dir / "selected_operators.yaml").read_text())["operators"]
    for key, entry in selected.items():
        assert f"| `{key}` | {entry['count']} |" in report
    for stage in ("model", "export", "lower", "out_variant", "plan", "emit", "select"):
        assert f"| {stage} |" in report


def test_artifacts_are_readable_like_any_written_file(zoo_build, tmp_path: Path) -> None:
    """Artifacts get the usual mode (0666 minus the umask), like a plain open() would give:
    a bundle copied to a device or served to a team must not be owner-only."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"x")
    expected = probe.stat().st_mode & 0o777
    run_dir = zoo_build("mlp")
    for name in ARTIFACTS:
        mode = (run_dir / name).stat().st_mode & 0o777
        assert mode == expected, f"{name}: {oct(mode)} != {oct(expected)}"


@pytest.mark.oracle
def test_executorch_runs_dynamic_batch_sizes(executorch_results) -> None:
    r = executorch_results["mlp"]
    assert "error" not in r, r.get("error")
    assert len(r["cases"]) == len(DYNAMIC_BATCHES)
    for batch, outs in zip(DYNAMIC_BATCHES, r["cases"], strict=True):
        (o,) = outs
        assert o["shape"] == o["want_shape"] == [batch, 10]
        assert o["err"] <= 1e-4 * o["scale"], (batch, o)
