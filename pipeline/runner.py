"""The stage runner: runs named stages in order, records what each read and wrote.

A stage is a function of (artifacts in, its config slice) -> artifacts out, and declares
both (``Stage.reads``, ``Stage.writes``, ``Stage.config``). In-memory artifacts pass between
stages in ``Context.artifacts``, which holds each stage to its declaration: reading or writing
an artifact the stage does not declare is an internal error naming both. Files go to the run
directory through ``Context.write``, which writes atomically (temporary file, then rename),
so a failing stage never leaves a half-written file. ``manifest.json`` records, per stage,
its wall time, whether the stage cache held it (and its key), the content hashes of the files
it read and wrote, its summary (the facts of its progress line) and its metrics: numbers that
compare builds (program and runtime bytes, planned bytes per bank, latency, SQNR), which the
manifest also gathers under the top-level ``metrics`` (what a sweep's results table reads;
see pipeline/sweep.py).

With a stage cache (pipeline/stage_cache.py), each cacheable stage has its own key; a stage
whose key is stored is not run: its files are copied into the run directory and its artifacts
are loaded when a later stage that runs reads them. An artifact the cache does not store (the
model's ``nn.Module``, the fx-based graph) is made again by running its stage, with that
stage's own inputs, when something needs it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from .errors import EtbuildError
from .hashing import sha256_bytes, sha256_file, sha256_json, tree_digest  # noqa: F401

if TYPE_CHECKING:
    from .stage_cache import StageCache, StoredStage


_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or the whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# What a run writes into its directory before renaming it into place (write_atomic, the
# runtime's copy, verify's inputs and outputs); a killed run leaves them behind.
RUN_TEMPORARIES = (".runtime.*", ".firmware.*", ".verify.*", ".*.tmp")


def remove_run_temporaries(run_dir: Path) -> None:
    """Remove what a killed earlier run left in ``run_dir``."""
    for pattern in RUN_TEMPORARIES:
        for p in run_dir.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


class ContractError(RuntimeError):
    """A stage broke its declared contract (an etbuild bug, not a user error)."""


@dataclass
class StageRecord:
    """What one stage did, as recorded in manifest.json."""

    name: str
    seconds: float = 0.0
    reads: dict[str, str] = field(default_factory=dict)
    writes: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] | None = None  # {"key", "hit"} when the stage cache was asked

    def as_dict(self) -> dict[str, Any]:
        doc = {
            "name": self.name,
            "seconds": round(self.seconds, 4),
            "reads": self.reads,
            "writes": self.writes,
            "summary": self.summary,
            "metrics": self.metrics,
        }
        if self.cache is not None:
            doc["cache"] = self.cache
        return doc


_UNSET = object()


class _Slot:
    """One artifact as one stage wrote it: its value, or how to get it (a loader)."""

    def __init__(self, value: Any = _UNSET, load: Callable[[], Any] | None = None) -> None:
        self.value = value
        self.load = load

    @property
    def ready(self) -> bool:
        return self.value is not _UNSET

    def get(self) -> Any:
        if self.value is _UNSET:
            assert self.load is not None
            self.value = self.load()
        return self.value


class Artifacts(MutableMapping):
    """The in-memory artifacts of a run, by name.

    While a stage runs, it may read only the artifacts its ``Stage.reads`` names and write only
    those its ``Stage.writes`` names; anything else raises ContractError. An artifact restored
    from the stage cache is loaded (or made again) when first read. Outside a stage (before
    or after a run) it is a plain mapping."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self._slots: dict[str, _Slot] = {k: _Slot(v) for k, v in (values or {}).items()}
        self._stage: Stage | None = None
        self._written: list[str] = []

    # -- the contract -------------------------------------------------------------------
    def _check_read(self, name: str) -> None:
        s = self._stage
        if s is not None and name not in s.reads and name not in s.writes:
            raise ContractError(
                f"internal error: stage {s.name!r} reads artifact {name!r}, which it does not "
                f"declare (reads={s.reads})"
            )

    def _check_write(self, name: str) -> None:
        s = self._stage
        if s is not None and name not in s.writes:
            raise ContractError(
                f"internal error: stage {s.name!r} writes artifact {name!r}, which it does not "
                f"declare (writes={s.writes})"
            )

    def begin(self, stage: Stage) -> None:
        self._stage, self._written = stage, []

    def end(self) -> list[str]:
        """Stop checking; the names the stage wrote."""
        self._stage = None
        return list(dict.fromkeys(self._written))

    # -- the mapping --------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        self._check_read(name)
        slot = self._slots.get(name)
        if slot is None:
            if self._stage is not None:
                raise ContractError(
                    f"internal error: stage {self._stage.name!r} reads artifact {name!r}, which "
                    "no earlier stage wrote"
                )
            raise KeyError(name)
        return slot.get()

    def get(self, name: str, default: Any = None) -> Any:
        self._check_read(name)
        slot = self._slots.get(name)
        return default if slot is None else slot.get()

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self._check_read(name)
        return name in self._slots

    def __setitem__(self, name: str, value: Any) -> None:
        self._check_write(name)
        self._slots[name] = _Slot(value)
        self._written.append(name)

    def __delitem__(self, name: str) -> None:
        self._check_write(name)
        del self._slots[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def __repr__(self) -> str:
        return f"Artifacts({sorted(self._slots)})"

    # -- the runner's side --------------------------------------------------------------
    def slots(self) -> dict[str, _Slot]:
        """A snapshot: the artifact each name holds now (the slots themselves are shared)."""
        return dict(self._slots)

    def put_lazy(self, name: str, load: Callable[[], Any]) -> None:
        self._slots[name] = _Slot(load=load)

    def drop_unloaded(self) -> None:
        """Forget the artifacts nothing read (after a run: only what was made or loaded)."""
        self._slots = {k: v for k, v in self._slots.items() if v.ready}


@dataclass
class Context:
    """What a running stage sees: the config, the run directory and earlier artifacts."""

    cfg: DictConfig
    run_dir: Path
    artifacts: Artifacts = field(default_factory=Artifacts)
    records: list[StageRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.artifacts, Artifacts):
            self.artifacts = Artifacts(dict(self.artifacts))

    @property
    def current(self) -> StageRecord:
        return self.records[-1]

    def write(self, name: str, data: bytes) -> Path:
        """Write an artifact file atomically and record its hash for the current stage."""
        path = self.run_dir / name
        write_atomic(path, data)
        self.current.writes[name] = sha256_bytes(data)
        return path

    def read(self, name: str) -> bytes:
        """Read an artifact file written earlier in this run, recording its hash."""
        data = (self.run_dir / name).read_bytes()
        self.current.reads[name] = sha256_bytes(data)
        return data

    def note_read(self, label: str, digest: str) -> None:
        """Record an input that is not a run-directory file (a checkpoint, ops_yaml, ...)."""
        self.current.reads[label] = digest

    def summarize(self, **items: Any) -> None:
        """Add key facts to the stage's progress line and manifest entry."""
        self.current.summary.update(items)

    def measure(self, **items: Any) -> None:
        """Record numbers that compare builds (JSON data) in the stage's manifest entry and
        the manifest's ``metrics``."""
        self.current.metrics.update(items)


StageFn = Callable[[Context], None]


@dataclass(frozen=True)
class Stage:
    """A named stage and its contract.

    ``reads``/``writes``: the in-memory artifacts it reads and writes (Context.artifacts
    enforces both). ``config``: the config sections or dotted keys it depends on. ``inputs``:
    the names of the input digests (pipeline/stage_cache.py's ``input_digests``: user
    ``_target_`` sources, checkpoint, calibration files) it reads. ``cacheable`` stages get a
    stage-cache key of their own from all of these; ``rerun`` names the artifacts the cache
    must not store (restoring them runs the stage again with its own inputs, so a cacheable
    stage must give the same artifacts each time it runs on the same inputs)."""

    name: str
    fn: StageFn
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    config: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    cacheable: bool = False
    rerun: tuple[str, ...] = ()


def check_contracts(stages: list[Stage]) -> None:
    """Every artifact a stage reads is written by an earlier stage; a cacheable stage reads
    only what cacheable stages write (its key is made of theirs)."""
    written: dict[str, Stage] = {}
    for stage in stages:
        for name in stage.reads:
            producer = written.get(name)
            if producer is None:
                raise ContractError(
                    f"internal error: stage {stage.name!r} reads artifact {name!r}, which no "
                    "earlier stage writes"
                )
            if stage.cacheable and not producer.cacheable:
                raise ContractError(
                    f"internal error: cacheable stage {stage.name!r} reads artifact {name!r} "
                    f"of stage {producer.name!r}, which is not cacheable"
                )
        for name in stage.writes:
            written[name] = stage


def _progress_line(index: int, total: int, rec: StageRecord) -> str:
    facts = "  ".join(f"{k}={v}" for k, v in rec.summary.items())
    return f"[{index}/{total}] {rec.name:<12} {rec.seconds:7.2f}s  {facts}".rstrip()


def tool_versions() -> dict[str, str]:
    import torch

    from . import __version__

    return {
        "etbuild": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


class _Run:
    """The bookkeeping of one run_stages call that restores stages from the cache: for each
    stage, the artifacts it saw before it ran (so that a stage can be run again later, with
    its own inputs, to make an artifact the cache does not store)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.before: dict[str, dict[str, _Slot]] = {}
        self.remade: dict[str, dict[str, Any]] = {}

    def restore(self, stage: Stage, stored: StoredStage) -> None:
        """Put a cached stage's files in the run directory and its artifacts (lazily) in
        place of running it."""
        for name, path in stored.files.items():
            write_atomic(self.ctx.run_dir / name, path.read_bytes())
        for name in stored.written:
            if name in stored.stored:
                self.ctx.artifacts.put_lazy(name, lambda n=name: stored.load(n))
            else:
                self.ctx.artifacts.put_lazy(name, lambda n=name: self.remake(stage, n))

    def remake(self, stage: Stage, name: str) -> Any:
        """Run ``stage`` again (its artifacts as it saw them; once) for its artifact ``name``."""
        if stage.name not in self.remade:
            scratch = Context(self.ctx.cfg, self.ctx.run_dir, Artifacts())
            scratch.artifacts._slots = dict(self.before[stage.name])
            scratch.records.append(StageRecord(stage.name))
            t0 = time.perf_counter()
            scratch.artifacts.begin(stage)
            try:
                stage.fn(scratch)
            finally:
                written = scratch.artifacts.end()
            self.remade[stage.name] = {k: scratch.artifacts.slots()[k].get() for k in written}
            rec = next(r for r in self.ctx.records if r.name == stage.name)
            if rec.cache is not None:
                rec.cache["rerun_seconds"] = round(time.perf_counter() - t0, 4)
        return self.remade[stage.name][name]


def _stage_cache_doc(records: list[StageRecord]) -> dict[str, Any] | None:
    asked = {r.name: r.cache for r in records if r.cache is not None}
    if not asked:
        return None
    return {
        "key": sha256_json([c["key"] for c in asked.values()])[:32],
        "hit": all(c["hit"] for c in asked.values()),
        "stages": {name: {"key": c["key"], "hit": c["hit"]} for name, c in asked.items()},
    }


def write_early_failure(run_dir: Path, cfg: DictConfig, error: BaseException) -> None:
    """manifest.json for a run that failed before its first stage (its settings' checks)."""
    try:
        config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    except Exception:  # the config itself is what failed
        config = None
    manifest = {
        "status": "failed",
        "error": str(error) or type(error).__name__,
        "run_dir": str(run_dir),
        "tools": tool_versions(),
        "stage_cache": None,
        "argv": sys.argv[1:],
        "config": config,
        "metrics": {},
        "stages": [],
    }
    write_atomic(run_dir / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())


def run_stages(
    stages: list[Stage],
    cfg: DictConfig,
    run_dir: Path,
    stop_after: str | None = None,
    log: Callable[[str], None] = print,
    cache: StageCache | None = None,
) -> Context:
    """Run ``stages`` in order (through ``stop_after``), then write manifest.json.

    With a ``cache``, each cacheable stage whose key it holds is restored instead of run, and
    each one that ran is stored. While a process looks a key up and runs and stores its stage,
    it holds that key's lock, and it takes the next stage's lock before it lets go of this
    one: concurrent runs with the same keys follow one another, so each key is computed once.
    The manifest is written whether the run succeeds or fails; a failure re-raises.
    """
    check_contracts(stages)
    names = [s.name for s in stages]
    if stop_after is not None and stop_after not in names:
        raise EtbuildError(
            f"pipeline.stop_after={stop_after!r} is not a stage; stages are: {', '.join(names)}"
        )
    selected = stages[: names.index(stop_after) + 1] if stop_after else stages
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_run_temporaries(run_dir)
    # Before any stage: a manifest left by an earlier run into this directory must not go on
    # saying "ok" beside this run's files if this run is killed.
    write_atomic(
        run_dir / "manifest.json",
        (json.dumps({"status": "running", "run_dir": str(run_dir), "argv": sys.argv[1:]}, indent=2)
         + "\n").encode(),
    )  # fmt: skip
    ctx = Context(cfg=cfg, run_dir=run_dir)
    run = _Run(ctx)
    error: BaseException | None = None
    started = time.perf_counter()
    keys: dict[str, str] = {}
    held: str | None = None  # the key whose lock this run holds
    try:
        if cache is not None:
            keys = cache.keys([s for s in selected if s.cacheable], cfg)
            if keys:  # before the first stage: a cache folder that cannot hold locks fails here
                held = next(iter(keys.values()))
                cache.lock(held, log)
    except BaseException as exc:  # an unusable cache folder, an interrupt while waiting
        error = exc
    for i, stage in enumerate(selected if error is None else [], 1):
        rec = StageRecord(stage.name)
        ctx.records.append(rec)
        run.before[stage.name] = ctx.artifacts.slots()
        t0 = time.perf_counter()
        # Everything a stage step does is inside the try, so that a Ctrl-C that lands between
        # a stage and the next (while logging or storing the cache) is still recorded.
        try:
            key = keys.get(stage.name)
            if key is not None:
                cache.lock(key, log)
                if held is not None and held != key:
                    cache.unlock(held)
                held = key
                stored = cache.load(key)
                rec.cache = {"key": key, "hit": stored is not None}
                if stored is not None:
                    run.restore(stage, stored)
                    d = stored.record
                    rec.reads, rec.writes = d["reads"], d["writes"]
                    rec.summary = {**d["summary"], "cache": "hit"}
                    rec.metrics = d.get("metrics", {})
                    log(_progress_line(i, len(selected), rec))
                    continue
            elif held is not None:
                cache.unlock(held)
                held = None
            ctx.artifacts.begin(stage)
            try:
                stage.fn(ctx)
            finally:
                written = ctx.artifacts.end()
            rec.seconds = time.perf_counter() - t0
            log(_progress_line(i, len(selected), rec))
            if key is not None:
                values = {name: ctx.artifacts.slots()[name].get() for name in written}
                try:
                    cache.store(key, stage, rec.as_dict(), run_dir, values)
                except OSError as exc:  # a full or read-only cache costs a later run time
                    log(f"etbuild: warning: could not store the stage cache entry {key}: {exc}")
        except BaseException as exc:
            rec.seconds = time.perf_counter() - t0
            rec.summary["failed"] = type(exc).__name__
            log(_progress_line(i, len(selected), rec))
            error = exc
            break
    if held is not None:
        cache.unlock(held)
    ctx.artifacts.drop_unloaded()
    status = "ok" if error is None else "failed"
    if isinstance(error, KeyboardInterrupt):
        status = "interrupted"
    manifest = {
        "status": status,
        "error": (str(error) or type(error).__name__) if error else None,
        "run_dir": str(run_dir),
        "total_seconds": round(time.perf_counter() - started, 4),
        "tools": tool_versions(),
        "stage_cache": _stage_cache_doc(ctx.records),
        "argv": sys.argv[1:],
        "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "metrics": {k: v for r in ctx.records for k, v in r.metrics.items()},
        "stages": [r.as_dict() for r in ctx.records],
    }
    write_atomic(run_dir / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    if error is not None:
        raise error
    return ctx
