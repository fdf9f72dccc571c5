"""Per-stage cache keys (pipeline/stage_cache.py): a sweep reruns only the stages whose inputs
differ. A sweep over `quant` exports the model once; a change of `memory` reuses every stage
before `plan`; a change of a stage's config slice misses from that stage on; and what a
restored stage hands on makes the same program as a build without the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from etbuild_test_support import build_in_process, run_cli

pytestmark = pytest.mark.e2e

STAGES = ("model", "export", "quantize", "lower", "partition", "out_variant", "plan", "emit")
PREFIX = (*STAGES, "reference")


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _hits(run_dir: Path) -> dict[str, bool]:
    return {k: v["hit"] for k, v in _manifest(run_dir)["stage_cache"]["stages"].items()}


def test_a_quant_sweep_exports_the_model_once(tmp_path: Path) -> None:
    sweep, cache = tmp_path / "sweep", tmp_path / "cache"
    proc = run_cli(
        [
            "-m",
            "model=mlp",
            "model.seed=5151",
            "+quant=none,ptq,dynamic",
            "pipeline.stop_after=reference",  # the cached stages are under test, not the build
            f"hydra.sweep.dir={sweep}",
            f"build.cache_dir={cache}",
        ],
        tmp_path,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted((p for p in sweep.iterdir() if (p / "manifest.json").exists()), key=str)
    assert len(runs) == 3
    schemes = [_manifest(r)["config"]["quant"]["scheme"] for r in runs]
    assert schemes == ["none", "ptq", "dynamic"]
    first, *later = [_hits(r) for r in runs]
    assert not any(first.values())
    for hits in later:
        # model and export come from the first job; quantize and everything after it differ
        assert [hits[s] for s in PREFIX] == [True, True] + [False] * 7, hits
    for run in runs[1:]:
        stages = {s["name"]: s for s in _manifest(run)["stages"]}
        assert stages["export"]["summary"]["cache"] == "hit"
        assert stages["export"]["seconds"] == 0.0
        # quantize needed the model's nn.Module, which the cache does not keep: the model
        # stage ran again for it (its entry still a hit), export's program was loaded
        assert "rerun_seconds" in stages["model"]["cache"]
        assert "rerun_seconds" not in stages["export"]["cache"]
    keys = [_manifest(r)["stage_cache"]["stages"] for r in runs]
    assert len({k["export"]["key"] for k in keys}) == 1
    assert len({k["quantize"]["key"] for k in keys}) == 3
    # one entry per distinct stage key: model and export once, the other stages per scheme
    assert len(list((cache / "stages").iterdir())) == 2 + 3 * 7


@pytest.fixture(scope="module")
def cached_ptq(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    base = ["model=mlp", "model.seed=5252", "+quant=ptq", "pipeline.stop_after=reference"]
    run_dir = tmp_path_factory.mktemp("reuse") / "first"
    build_in_process(base, run_dir, stage_cache=True)
    assert not any(_hits(run_dir).values())
    return run_dir, base


@pytest.mark.parametrize(
    ("override", "first_miss", "also_miss"),
    [
        ("memory.alignment=64", "plan", ("emit",)),
        ("pipeline.emit.constant_alignment=64", "emit", ()),
        # reference runs the lowered graph of a quantized model: it reads lower's result too
        (
            "pipeline.lower.attention=aten",
            "lower",
            ("partition", "out_variant", "plan", "emit", "reference"),
        ),
        ("pipeline.verify.eval_inputs=3", "reference", ()),
    ],
)
def test_a_config_slice_misses_its_stage_and_those_reading_it(
    cached_ptq: tuple[Path, list[str]],
    tmp_path: Path,
    override: str,
    first_miss: str,
    also_miss: tuple[str, ...],
) -> None:
    first, base = cached_ptq
    run_dir = tmp_path / "cached"
    build_in_process([*base, override], run_dir, stage_cache=True)
    missed = {first_miss, *also_miss}
    assert _hits(run_dir) == {s: s not in missed for s in PREFIX}
    # what the restored stages handed on (a loaded program, a remade model) makes the same
    # files as a build without the cache
    fresh = tmp_path / "fresh"
    build_in_process([*base, override], fresh)
    for name in ("model.pte", "memory_plan.json", "reference.pt"):
        assert (run_dir / name).read_bytes() == (fresh / name).read_bytes(), name
    same = [s for s in PREFIX if s not in missed]
    stages = {s["name"]: s for s in _manifest(run_dir)["stages"]}
    for name in same:
        assert stages[name]["seconds"] == 0.0, name
    assert (
        _manifest(run_dir)["stage_cache"]["stages"]["export"]["key"]
        == (_manifest(first)["stage_cache"]["stages"]["export"]["key"])
    )
