"""The stage cache (pipeline/stage_cache.py): a second identical run restores the stages up to
`reference` instead of running them, and any input a stage reads makes a new key for it and
the stages after it that depend on it."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from etbuild_test_support import build_in_process, run_cli

pytestmark = pytest.mark.e2e

# A seed no other test uses, so the first run here is a miss in the session's cache while the
# runtime build (same selection as every MLP build) is shared.
MLP = ["model=mlp", "model.seed=4242"]
PREFIX = ("model", "export", "quantize", "lower", "out_variant", "plan", "emit", "reference")


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _cache_hit(run_dir: Path) -> bool:
    return _manifest(run_dir)["stage_cache"]["hit"]


def _stage_keys(run_dir: Path) -> dict[str, str]:
    return {k: v["key"] for k, v in _manifest(run_dir)["stage_cache"]["stages"].items()}


def _report_without_times(run_dir: Path) -> str:
    """report.md less what is measured anew each run: stage times and the runner's latency."""
    text = (run_dir / "report.md").read_text().split("## Stage times")[0]
    return "\n".join(line for line in text.splitlines() if not line.startswith("| latency |"))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("stage_cache_first")
    build_in_process(MLP, run_dir, stage_cache=True)
    return run_dir


def test_second_identical_run_restores_every_cached_stage(first_run: Path, tmp_path: Path):
    assert not _cache_hit(first_run)
    again = tmp_path / "again"
    ctx = build_in_process(MLP, again, stage_cache=True)
    assert _cache_hit(again)
    stages = {s["name"]: s for s in _manifest(again)["stages"]}
    first = {s["name"]: s for s in _manifest(first_run)["stages"]}
    for name in PREFIX:
        assert stages[name]["summary"]["cache"] == "hit", name
        assert stages[name]["seconds"] == 0.0
        assert stages[name]["cache"] == {"key": first[name]["cache"]["key"], "hit": True}
        assert first[name]["cache"]["hit"] is False
    # Nothing ran: the in-memory graph and module of a run never exist on a hit.
    assert "module" not in ctx.artifacts and "graph" not in ctx.artifacts
    for name in ("model.pte", "reference.pt", "memory_plan.json", "selected_operators.yaml"):
        assert (again / name).read_bytes() == (first_run / name).read_bytes(), name
    assert stages["verify"]["summary"]["status"] == "ran"
    assert _report_without_times(again) == _report_without_times(first_run)
    # The files a restored stage wrote are recorded with the same hashes.
    assert stages["emit"]["writes"] == first["emit"]["writes"]


@pytest.mark.parametrize(
    "override",
    [
        "pipeline.verify.tolerance=0.001",
        "build.size_budget_kb=100000",
        "quant.min_sqnr_db=1",
        "target.threads=2",
    ],
)
def test_settings_of_later_stages_keep_the_key(first_run: Path, tmp_path: Path, override: str):
    build_in_process([*MLP, override], tmp_path / "run", stage_cache=True)
    assert (
        _manifest(tmp_path / "run")["stage_cache"]["key"]
        == _manifest(first_run)["stage_cache"]["key"]
    )
    assert _cache_hit(tmp_path / "run")


@pytest.mark.parametrize("override", ["model.seed=4243", "memory.alignment=64"])
def test_settings_of_cached_stages_change_the_key(first_run: Path, tmp_path: Path, override: str):
    build_in_process([*MLP, override], tmp_path / "run", stage_cache=True)
    assert not _cache_hit(tmp_path / "run")
    assert (
        _manifest(tmp_path / "run")["stage_cache"]["key"]
        != _manifest(first_run)["stage_cache"]["key"]
    )


def test_a_damaged_entry_is_a_miss_and_is_replaced(first_run: Path, tmp_path: Path) -> None:
    key = _stage_keys(first_run)["emit"]
    entry = Path(os.environ["ETBUILD_CACHE_DIR"]) / "stages" / key
    stored = entry / "files" / "model.pte"
    stored.write_bytes(stored.read_bytes()[:-7])  # truncated behind our back
    build_in_process(MLP, tmp_path / "run", stage_cache=True)
    assert not _cache_hit(tmp_path / "run")
    hits = {k: v["hit"] for k, v in _manifest(tmp_path / "run")["stage_cache"]["stages"].items()}
    assert [k for k, hit in hits.items() if not hit] == ["emit"]
    assert (tmp_path / "run/model.pte").read_bytes() == (first_run / "model.pte").read_bytes()
    assert stored.read_bytes() == (first_run / "model.pte").read_bytes()  # stored afresh
    build_in_process(MLP, tmp_path / "again", stage_cache=True)
    assert _cache_hit(tmp_path / "again")


def test_stop_after_a_cached_stage_uses_the_cache_up_to_it(first_run: Path, tmp_path: Path):
    build_in_process([*MLP, "pipeline.stop_after=plan"], tmp_path / "run", stage_cache=True)
    cached = _manifest(tmp_path / "run")["stage_cache"]["stages"]
    assert list(cached) == [
        "model",
        "export",
        "quantize",
        "lower",
        "partition",
        "out_variant",
        "plan",
    ]
    assert all(c["hit"] and c["key"] == _stage_keys(first_run)[n] for n, c in cached.items())
    first = (first_run / "memory_plan.json").read_bytes()
    assert (tmp_path / "run/memory_plan.json").read_bytes() == first


def test_a_build_is_the_same_whatever_torchs_thread_count(tmp_path: Path) -> None:
    """Torch's thread count changes the low bits of calibration's sums, and MobileNetV3's
    quantized program with them; the stages run on one torch thread, so a process that set 2
    (a CLI run here) and one that set 1 (a bench) build the same bytes, as the cache, keyed
    without the count, assumes. The process's count is restored after each build."""
    import torch

    before = torch.get_num_threads()
    args = ["model=mobilenet_v3_small", "+quant=ptq", "pipeline.stop_after=emit"]
    programs = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            build_in_process(args, tmp_path / str(threads))
            assert torch.get_num_threads() == threads
            programs.append((tmp_path / str(threads) / "model.pte").read_bytes())
    finally:
        torch.set_num_threads(before)
    assert programs[0] == programs[1]


def test_checkpoint_contents_are_part_of_the_key(tmp_path: Path) -> None:
    import torch

    ckpt = tmp_path / "weights.pt"
    first = build_in_process(["model=mlp", "model.seed=4244"], tmp_path / "seeded")
    state = first.artifacts["module"].state_dict()
    torch.save(state, ckpt)
    args = ["model=mlp", "model.seed=4244", f"model.checkpoint={ckpt}"]
    build_in_process(args, tmp_path / "a", stage_cache=True)
    state = {k: v * 2 for k, v in state.items()}
    torch.save(state, ckpt)
    build_in_process(args, tmp_path / "b", stage_cache=True)
    assert not _cache_hit(tmp_path / "b")
    a = torch.load(tmp_path / "a/reference.pt", weights_only=True)["outputs"][0]
    b = torch.load(tmp_path / "b/reference.pt", weights_only=True)["outputs"][0]
    assert not torch.equal(a, b)


def test_the_model_source_file_is_part_of_the_key(tmp_path: Path, monkeypatch) -> None:
    """Editing the file that defines a user's model rebuilds, from the command line too."""
    module = tmp_path / "pkg_models" / "user_net.py"
    module.parent.mkdir()
    (module.parent / "__init__.py").write_text("")

    def write(scale: float) -> None:
        module.write_text(
            textwrap.dedent(f"""
            import torch

            class Net(torch.nn.Module):
                def __init__(self, **_):
                    super().__init__()
                    self.fc = torch.nn.Linear(64, 10)

                def forward(self, x):
                    return self.fc(x) * {scale}
            """)
        )

    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    # Same-size edits within a second would otherwise reuse a stale .pyc of the old source.
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    args = [
        "model=mlp",
        "model._target_=pkg_models.user_net.Net",
        "model.name=user_net",
        "build.wheel=false",
    ]
    runs = []
    for i, scale in enumerate((1.0, 1.0, 3.0)):
        write(scale)
        run_dir = tmp_path / f"run{i}"
        proc = run_cli([*args, f"hydra.run.dir={run_dir}"], tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs.append(run_dir)
    assert [_cache_hit(r) for r in runs] == [False, True, False]
    assert "cache=hit" in (runs[1] / "report.md").read_text()


def test_the_cache_stays_under_its_size_limit(tmp_path: Path, capsys) -> None:
    """build.cache_max_gb: after a run, least recently used entries go; this run's stay."""
    cache = tmp_path / "cache"
    common = [
        f"build.cache_dir={cache}",
        "pipeline.stop_after=reference",  # the whole cached prefix, no runtime build
        "build.cache_max_gb=0.0002",  # 200 kB: less than one MLP entry (model.pte is 341 kB)
    ]
    build_in_process(["model=mlp", "model.seed=11", *common], tmp_path / "a", stage_cache=True)
    first = {p.name for p in (cache / "stages").iterdir()}
    a_keys = set(_stage_keys(tmp_path / "a").values())
    assert first == a_keys and len(a_keys) == len(PREFIX) + 1  # over the limit, but used
    capsys.readouterr()
    build_in_process(["model=mlp", "model.seed=12", *common], tmp_path / "b", stage_cache=True)
    second = {p.name for p in (cache / "stages").iterdir()}
    assert second == set(_stage_keys(tmp_path / "b").values())
    assert not second & a_keys  # the seed is in every stage's key, through the model's
    assert f"removed {len(a_keys)} least recently used entries" in capsys.readouterr().out
    # No limit: nothing is removed.
    build_in_process(
        ["model=mlp", "model.seed=11", *common, "build.cache_max_gb=null"],
        tmp_path / "c",
        stage_cache=True,
    )
    assert len(list((cache / "stages").iterdir())) == 2 * len(a_keys)
