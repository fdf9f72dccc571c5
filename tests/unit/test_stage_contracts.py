"""Stage contracts (pipeline/runner.py): a stage reads and writes only the artifacts it
declares, and with a stage cache each cacheable stage is keyed, stored and restored on its own
(pipeline/stage_cache.py), from its config slice and the keys of the stages it reads from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from etbuild.pipeline.runner import Context, ContractError, Stage, run_stages
from etbuild.pipeline.stage_cache import StageCache


def _cfg(**over):
    return OmegaConf.create({"a": {"n": 1}, "b": {"n": 2}, **over})


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _produce(ctx: Context) -> None:
    ctx.artifacts["x"] = ctx.cfg.a.n


def test_reading_an_undeclared_artifact_fails_naming_stage_and_artifact(tmp_path: Path):
    def sneaky(ctx: Context) -> None:
        ctx.artifacts["y"] = ctx.artifacts["x"] + 1

    stages = [Stage("first", _produce, writes=("x",)), Stage("second", sneaky, writes=("y",))]
    with pytest.raises(ContractError, match=r"stage 'second' reads artifact 'x', which it does"):
        run_stages(stages, _cfg(), tmp_path, log=lambda _: None)
    manifest = _manifest(tmp_path)
    assert manifest["status"] == "failed"
    assert "internal error: stage 'second' reads artifact 'x'" in manifest["error"]


def test_writing_an_undeclared_artifact_fails(tmp_path: Path):
    stages = [Stage("first", _produce, writes=("z",))]
    with pytest.raises(ContractError, match=r"stage 'first' writes artifact 'x', which it does"):
        run_stages(stages, _cfg(), tmp_path, log=lambda _: None)


def test_a_read_that_no_earlier_stage_writes_fails_before_any_stage(tmp_path: Path):
    ran = []
    stages = [
        Stage("first", lambda ctx: ran.append(1), writes=("x",)),
        Stage("second", lambda ctx: ran.append(2), reads=("w",)),
    ]
    with pytest.raises(ContractError, match=r"stage 'second' reads artifact 'w', which no earlier"):
        run_stages(stages, _cfg(), tmp_path, log=lambda _: None)
    assert ran == []


def test_a_declared_read_nothing_wrote_fails_at_run_time(tmp_path: Path):
    stages = [
        Stage("first", lambda ctx: None, writes=("x",)),  # declares x but does not write it
        Stage("second", lambda ctx: ctx.artifacts["x"], reads=("x",)),
    ]
    with pytest.raises(ContractError, match=r"stage 'second' reads artifact 'x', which no earlier"):
        run_stages(stages, _cfg(), tmp_path, log=lambda _: None)


def test_declared_reads_and_writes_pass_and_optional_reads_see_none(tmp_path: Path):
    seen = {}

    def second(ctx: Context) -> None:
        seen["x"] = ctx.artifacts["x"]
        seen["maybe"] = ctx.artifacts.get("maybe")

    stages = [
        Stage("first", _produce, writes=("x", "maybe")),
        Stage("second", second, reads=("x", "maybe")),
    ]
    ctx = run_stages(stages, _cfg(), tmp_path, log=lambda _: None)
    assert seen == {"x": 1, "maybe": None}
    assert dict(ctx.artifacts) == {"x": 1}  # after the run: a plain mapping


class _Toy:
    """Three cacheable stages: `make` (an unstorable artifact, remade on demand), `mid` (reads
    it, config a) and `last` (reads mid's result, config b); counts what really ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def make(self, ctx: Context) -> None:
        self.ran.append("make")
        ctx.artifacts["obj"] = object()  # stands for an nn.Module: not stored
        ctx.artifacts["seed"] = 10

    def mid(self, ctx: Context) -> None:
        assert ctx.artifacts["obj"] is not None  # (made again first when restored)
        self.ran.append("mid")
        ctx.artifacts["value"] = ctx.artifacts["seed"] * ctx.cfg.a.n
        ctx.write("mid.txt", str(ctx.artifacts["value"]).encode())

    def last(self, ctx: Context) -> None:
        self.ran.append("last")
        ctx.write("last.txt", str(ctx.artifacts["value"] + ctx.cfg.b.n).encode())

    def stages(self) -> list[Stage]:
        return [
            Stage("make", self.make, writes=("obj", "seed"), cacheable=True, rerun=("obj", "seed")),
            Stage("mid", self.mid, reads=("obj", "seed"), writes=("value",), config=("a",),
                  cacheable=True),
            Stage("last", self.last, reads=("value",), config=("b",), cacheable=True),
        ]  # fmt: skip

    def run(self, cache: StageCache, run_dir: Path, **over) -> dict[str, dict]:
        self.ran.clear()
        run_stages(self.stages(), _cfg(**over), run_dir, log=lambda _: None, cache=cache)
        return _manifest(run_dir)["stage_cache"]["stages"]


def test_each_stage_is_keyed_and_restored_on_its_own(tmp_path: Path):
    cache, toy = StageCache(tmp_path / "cache"), _Toy()
    first = toy.run(cache, tmp_path / "1")
    assert toy.ran == ["make", "mid", "last"]
    assert not any(s["hit"] for s in first.values())
    # Identical: nothing runs, the files come from the cache.
    again = toy.run(cache, tmp_path / "2")
    assert toy.ran == [] and all(s["hit"] for s in again.values())
    assert (tmp_path / "2/last.txt").read_text() == "12"
    assert (tmp_path / "2/mid.txt").read_text() == "10"
    # Only b changed: only `last` runs, reading mid's stored value; make is not needed.
    b = toy.run(cache, tmp_path / "3", b={"n": 5})
    assert toy.ran == ["last"]
    assert [b[n]["hit"] for n in ("make", "mid", "last")] == [True, True, False]
    assert b["mid"]["key"] == first["mid"]["key"] and b["last"]["key"] != first["last"]["key"]
    assert (tmp_path / "3/last.txt").read_text() == "15"
    # a changed: mid misses and needs make's unstored artifacts, so make runs again (its
    # entry still a hit); last misses because the value it reads has a new key.
    a = toy.run(cache, tmp_path / "4", a={"n": 3})
    assert toy.ran == ["make", "mid", "last"]
    assert [a[n]["hit"] for n in ("make", "mid", "last")] == [True, False, False]
    assert (tmp_path / "4/last.txt").read_text() == "32"
    stages = {s["name"]: s for s in _manifest(tmp_path / "4")["stages"]}
    assert "rerun_seconds" in stages["make"]["cache"]


def test_a_damaged_stage_entry_is_a_miss(tmp_path: Path):
    cache, toy = StageCache(tmp_path / "cache"), _Toy()
    first = toy.run(cache, tmp_path / "1")
    stored = tmp_path / "cache/stages" / first["mid"]["key"] / "artifacts" / "pickle"
    stored.write_bytes(stored.read_bytes()[:-3])
    again = toy.run(cache, tmp_path / "2")
    assert [again[n]["hit"] for n in ("make", "mid", "last")] == [True, False, True]
    assert toy.ran == ["make", "mid"]
    assert (tmp_path / "2/last.txt").read_text() == "12"


def test_each_cacheable_stage_reads_only_the_config_it_declares() -> None:
    """A stage's cache key covers only its declared config: every ``ctx.cfg.<key>`` its module
    reads must lie inside that slice, or a change to the key would reuse a stale result."""
    import inspect
    import re

    from etbuild.pipeline.stages import STAGES

    for stage in STAGES:
        if not stage.cacheable:
            continue
        source = inspect.getsource(inspect.getmodule(stage.fn))
        read = set(re.findall(r"ctx\.cfg\.([A-Za-z_][A-Za-z0-9_.]*)", source))
        assert read or stage.name == "out_variant", stage.name
        for key in read:
            assert any(key == c or key.startswith(c + ".") for c in stage.config), (
                f"stage {stage.name!r} reads ctx.cfg.{key}, outside its config {stage.config}"
            )
