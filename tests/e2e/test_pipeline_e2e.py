"""End to end: partial runs, failures, sweeps and checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import models_for_tests
import pytest
import torch
from etbuild_test_support import ARTIFACTS, build_in_process, custom_model_overrides, run_cli

from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.zoo import mlp

pytestmark = pytest.mark.e2e


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def test_stop_after_lower_writes_manifest_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli(["model=mlp", "pipeline.stop_after=lower", f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from etbuild.pipeline.stages import STAGES

    names = [s.name for s in STAGES]
    prefix = names[: names.index("lower") + 1]
    assert f"[{len(prefix)}/{len(prefix)}] lower" in proc.stdout
    m = manifest(run_dir)
    assert m["status"] == "ok"
    assert [s["name"] for s in m["stages"]] == prefix
    for name in ARTIFACTS:
        if name != "manifest.json":
            assert not (run_dir / name).exists(), name


def test_failing_stage_leaves_no_program_and_no_temp_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [*custom_model_overrides("two_missing_ops", [("x", [2, 8])]), f"hydra.run.dir={run_dir}"]
    proc = run_cli(args, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    assert "etbuild: error:" in proc.stderr
    assert "adaptive_max_pool2d" in proc.stderr and "special_erfcx" in proc.stderr
    assert "models_for_tests.py:" in proc.stderr
    assert "failed=EtbuildError" in proc.stdout
    m = manifest(run_dir)
    assert m["status"] == "failed"
    assert "adaptive_max_pool2d" in m["error"]
    assert m["stages"][-1]["name"] == "lower"
    files = sorted(p.name for p in run_dir.iterdir() if p.name not in (".hydra", "cli.log"))
    assert files == ["manifest.json", "recipe.lock.yaml"], files
    assert not list(run_dir.rglob("*.tmp"))
    assert models_for_tests.two_missing_ops  # the target the CLI imported


def test_multirun_sweep_writes_four_complete_runs(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = run_cli(
        ["-m", "model=mlp,transformer", "memory.alignment=16,64", f"hydra.sweep.dir={sweep}"],
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(p.parent for p in sweep.glob("*/manifest.json"))
    assert len(runs) == 4, sorted(p.name for p in sweep.iterdir())
    combos = set()
    for run in runs:
        for name in ARTIFACTS:
            assert (run / name).is_file(), (run, name)
        m = manifest(run)
        assert m["status"] == "ok"
        model, alignment = m["config"]["model"]["name"], m["config"]["memory"]["alignment"]
        combos.add((model, alignment))
        mem = json.loads((run / "memory_plan.json").read_text())
        assert mem["alignment"] == alignment
        assert all(t["offset"] % alignment == 0 for t in mem["tensors"])
        assert Path(m["run_dir"]).resolve() == run.resolve()
    assert combos == {("mlp", 16), ("mlp", 64), ("transformer", 16), ("transformer", 64)}


def test_checkpoint_weights_are_used(tmp_path: Path, zoo_build) -> None:
    torch.manual_seed(4242)
    other = mlp()  # the zoo config's default args
    for p in other.parameters():
        p.data.mul_(1.5)
    ckpt = tmp_path / "weights.pt"
    torch.save(other.state_dict(), ckpt)
    run_dir = tmp_path / "run"
    build_in_process(["model=mlp", f"model.checkpoint={ckpt}"], run_dir)
    m = manifest(run_dir)
    assert m["stages"][0]["reads"]["checkpoint"]
    ref = torch.load(run_dir / "reference.pt", weights_only=True)
    seeded = torch.load(zoo_build("mlp") / "reference.pt", weights_only=True)
    # same example inputs, different weights -> different outputs
    for a, b in zip(ref["inputs"], seeded["inputs"], strict=True):
        assert torch.equal(a, b)
    assert not torch.allclose(ref["outputs"][0], seeded["outputs"][0], atol=1e-3)
    with torch.no_grad():
        expected = other.eval()(*ref["inputs"])
    torch.testing.assert_close(ref["outputs"][0], expected)
    # the program carries the checkpoint's weights, not the seeded ones
    assert (run_dir / "model.pte").read_bytes() != (zoo_build("mlp") / "model.pte").read_bytes()


def test_checkpoint_accepts_wrapped_state_dict(tmp_path: Path) -> None:
    torch.manual_seed(5)
    model = mlp()
    ckpt = tmp_path / "wrapped.pt"
    torch.save({"state_dict": model.state_dict(), "epoch": 3}, ckpt)
    ctx = build_in_process(
        ["model=mlp", f"model.checkpoint={ckpt}", "pipeline.stop_after=model"], tmp_path / "run"
    )
    loaded = ctx.artifacts["module"].state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(loaded[k], v), k


def test_bad_checkpoint_path_cli(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    run_dir = tmp_path / "run"
    proc = run_cli(
        ["model=mlp", f"model.checkpoint={missing}", f"hydra.run.dir={run_dir}"], tmp_path
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    assert f"model.checkpoint='{missing}': no such file" in proc.stderr
    # checked before any stage: nothing is written
    assert not (run_dir / "manifest.json").exists() and not (run_dir / "model.pte").exists()


def test_checkpoint_that_is_not_a_state_dict(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"this is not a torch file")
    with pytest.raises(EtbuildError, match="torch.load cannot read it"):
        build_in_process(
            ["model=mlp", f"model.checkpoint={junk}", "pipeline.stop_after=model"],
            tmp_path / "run",
        )


def test_checkpoint_for_another_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    wrong = tmp_path / "wrong.pt"
    torch.save(mlp(in_features=8).state_dict(), wrong)
    with pytest.raises(EtbuildError, match=r"(?s)does not fit the model.*size mismatch"):
        build_in_process(
            ["model=mlp", f"model.checkpoint={wrong}", "pipeline.stop_after=model"],
            tmp_path / "run",
        )


def test_sweep_goes_on_past_a_failing_job(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    wrong = tmp_path / "wrong.pt"  # a checkpoint of another width: the model stage fails
    torch.save(mlp(in_features=8).state_dict(), wrong)
    proc = run_cli(
        ["-m", "model=mlp", f"model.checkpoint=null,{wrong}", f"hydra.sweep.dir={sweep}"],
        tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    assert "1 sweep job(s) failed" in proc.stderr
    assert "does not fit the model" in proc.stderr
    # (a path-valued override puts slashes in the job's subdir name: search the whole tree)
    runs = {manifest(p.parent)["status"]: p.parent for p in sweep.rglob("manifest.json")}
    assert set(runs) == {"ok", "failed"}
    for name in ARTIFACTS:
        assert (runs["ok"] / name).is_file(), name
    assert not (runs["failed"] / "model.pte").exists()
    assert str(runs["failed"]) in proc.stderr
    # The sweep's results list the failed job with its error.
    md = (sweep / "sweep.md").read_text()
    assert "2 jobs: 1 ok, 1 failed." in md
    assert "## Failed jobs" in md and "does not fit the model" in md


def test_dynamic_batch_with_an_example_batch_of_one(tmp_path: Path) -> None:
    """torch.export fixes a size-1 dim as a constant; etbuild traces a dynamic batch whose
    example is 1 at size 2, so the program still takes every batch in [1, 16]."""
    import etbuild.runtime

    overrides = ["model=mlp", "model.inputs=[{name:features,shape:[1,64]}]"]
    module = build_in_process(overrides, tmp_path).artifacts["module"].eval()
    prog = etbuild.runtime.load(str(tmp_path / "model.pte"))
    gen = torch.Generator().manual_seed(5)
    for batch in (1, 2, 9, 16):
        x = torch.randn(batch, 64, generator=gen)
        with torch.no_grad():
            want = module(x)
        assert want.std() > 0.1
        torch.testing.assert_close(prog.run([x])[0], want, rtol=1e-4, atol=1e-4 * want.abs().max())


class HardCodedBatch(torch.nn.Module):
    def forward(self, x):
        return x.view(4, -1).relu()


def test_dynamic_dim_fixed_by_the_model_names_the_entry_and_the_fix() -> None:
    from omegaconf import OmegaConf

    from etbuild.pipeline.stages.export import export_program

    mcfg = OmegaConf.create(
        {
            "name": "hard_coded",
            "inputs": [{"name": "x", "shape": [4, 8]}],
            "dynamic_dims": [{"name": "batch", "input": "x", "dim": 0, "min": 1, "max": 16}],
        }
    )
    with pytest.raises(EtbuildError) as err:
        export_program(HardCodedBatch(), mcfg, (torch.randn(4, 8),))
    assert str(err.value).startswith(
        "model 'hard_coded': the model's code fixes a dim declared dynamic to 4 "
        "(batch = input 'x' dim 0), so it cannot vary at run time. Remove the entry from "
        "model.dynamic_dims"
    )
    mcfg.dynamic_dims[0].max = 1
    with pytest.raises(
        EtbuildError, match=r"allows sizes 1\.\.1 only: a dynamic dim needs max > m"
    ):
        export_program(HardCodedBatch(), mcfg, (torch.randn(1, 8),))
