"""The stage runner: runs named stages in order, records what each read and wrote.

A stage is a function of (artifacts in, its config slice) -> artifacts out. In-memory
artifacts pass between stages in ``Context.artifacts``; files go to the run directory through
``Context.write``, which writes atomically (temporary file, then rename), so a failing stage
never leaves a half-written file. ``manifest.json`` records, per stage, its wall time and the
content hashes of the files it read and wrote, its summary (the facts of its progress line)
and its metrics: numbers that compare builds (program and runtime bytes, planned bytes per
bank, latency, SQNR), which the manifest also gathers under the top-level ``metrics`` (what a
sweep's results table reads; see pipeline/sweep.py).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from .errors import EtbuildError

if TYPE_CHECKING:  # stage_cache imports this module's hashing helpers
    from .stage_cache import CachedPrefix, StageCache


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(h: Any, root: Path, patterns: tuple[str, ...]) -> None:
    """Feed every file under ``root`` matching ``patterns`` (path and bytes) into ``h``."""
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0")
                h.update(path.read_bytes() + b"\0")


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


@dataclass
class StageRecord:
    """What one stage did, as recorded in manifest.json."""

    name: str
    seconds: float = 0.0
    reads: dict[str, str] = field(default_factory=dict)
    writes: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seconds": round(self.seconds, 4),
            "reads": self.reads,
            "writes": self.writes,
            "summary": self.summary,
            "metrics": self.metrics,
        }


@dataclass
class Context:
    """What a running stage sees: the config, the run directory and earlier artifacts."""

    cfg: DictConfig
    run_dir: Path
    artifacts: dict[str, Any] = field(default_factory=dict)
    records: list[StageRecord] = field(default_factory=list)

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
    """A named stage. ``cacheable`` stages form a prefix whose results the stage cache keeps;
    ``passes_on`` names the in-memory artifacts that stages after that prefix read (they
    must be JSON data so the cache can keep them)."""

    name: str
    fn: StageFn
    cacheable: bool = False
    passes_on: tuple[str, ...] = ()


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


def _restore(ctx: Context, hit: CachedPrefix, log: Callable[[str], None], total: int) -> None:
    """Put a cached prefix's files, artifacts and records in place of running its stages."""
    for name, path in hit.files.items():
        write_atomic(ctx.run_dir / name, path.read_bytes())
    ctx.artifacts.update(hit.artifacts)
    for i, d in enumerate(hit.records, 1):
        summary = {**d["summary"], "cache": "hit"}
        rec = StageRecord(d["name"], 0.0, d["reads"], d["writes"], summary, d.get("metrics", {}))
        ctx.records.append(rec)
        log(_progress_line(i, total, rec))


def _store(ctx: Context, cache: StageCache, prefix: list[Stage], log: Callable[[str], None]):
    records = [r.as_dict() for r in ctx.records[: len(prefix)]]
    artifacts = {k: ctx.artifacts[k] for s in prefix for k in s.passes_on}
    try:
        cache.store(ctx.run_dir, records, artifacts)
    except OSError as exc:  # a full or read-only cache costs the next run time, not this one
        log(f"etbuild: warning: could not store the stage cache entry {cache.entry}: {exc}")


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

    With a ``cache``, the leading cacheable stages are restored from it when it holds them,
    and stored into it when they ran (only when the run includes all of them). The manifest is
    written whether the run succeeds or fails; a failure re-raises.
    """
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
    error: BaseException | None = None
    started = time.perf_counter()
    prefix = list(itertools.takewhile(lambda s: s.cacheable, stages))
    if not prefix or len(selected) < len(prefix):
        cache = None
    hit = None
    skip = 0
    try:
        if cache is not None:
            # Held from the look-up until the prefix's results are restored (a hit) or stored
            # (a miss): a concurrent run with the same key waits, then restores them.
            cache.lock(log)
            hit = cache.load()
            if hit is not None:
                _restore(ctx, hit, log, len(selected))
                skip = len(prefix)
                cache.unlock()
    except BaseException as exc:  # an interrupt while waiting, an unusable cache folder
        if cache is not None:
            cache.unlock()
        error, skip = exc, len(selected)
    for i, stage in enumerate(selected[skip:], skip + 1):
        rec = StageRecord(stage.name)
        ctx.records.append(rec)
        t0 = time.perf_counter()
        # Everything a stage step does is inside the try, so that a Ctrl-C that lands between
        # a stage and the next (while logging or storing the cache) is still recorded.
        try:
            stage.fn(ctx)
            rec.seconds = time.perf_counter() - t0
            log(_progress_line(i, len(selected), rec))
            if cache is not None and hit is None and i == len(prefix):
                try:
                    _store(ctx, cache, prefix, log)
                finally:
                    cache.unlock()
        except BaseException as exc:
            rec.seconds = time.perf_counter() - t0
            rec.summary["failed"] = type(exc).__name__
            log(_progress_line(i, len(selected), rec))
            error = exc
            break
    if cache is not None:
        cache.unlock()  # a failure inside the prefix releases it here
    status = "ok" if error is None else "failed"
    if isinstance(error, KeyboardInterrupt):
        status = "interrupted"
    manifest = {
        "status": status,
        "error": (str(error) or type(error).__name__) if error else None,
        "run_dir": str(run_dir),
        "total_seconds": round(time.perf_counter() - started, 4),
        "tools": tool_versions(),
        "stage_cache": None if cache is None else {"key": cache.key, "hit": hit is not None},
        "argv": sys.argv[1:],
        "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "metrics": {k: v for r in ctx.records for k, v in r.metrics.items()},
        "stages": [r.as_dict() for r in ctx.records],
    }
    write_atomic(run_dir / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    if error is not None:
        raise error
    return ctx
