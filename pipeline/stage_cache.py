"""The stage cache: the results of the cacheable stage prefix (model .. reference), reused by
a later run whose inputs are identical.

The key hashes everything those stages read: the config minus the sections only later stages
read (target, selection, build, and the verify/stop settings), the etbuild sources that run
them (pipeline/, ops_yaml/, the program schema), the source file of every user ``_target_``
they call (model, calibration data, QAT train step, partitioner), the checkpoint and
calibration files, and the versions of python, torch, torchao and flatbuffers. A user module
that imports other local modules is keyed by its own file only; set ``pipeline.cache=false``
while editing those.

An entry is ``<cache root>/stages/<key>/``: ``entry.json`` (the stages' manifest records and
the artifacts they pass on) and ``files/`` (what they wrote to the run directory). It is
written to a temporary folder and renamed into place, and checked against its recorded hashes
when read, so a damaged entry is a miss, never a wrong result.

Concurrent processes on one cache directory (local, or on a shared file system) coordinate
through one lock file per entry, ``<cache root>/locks/<kind>-<key>.lock`` (``filelock``): a
process holds it from the look-up of a key until it has published the entry (a miss) or
copied what it needs out of it (a hit), so each key is computed once and no entry is read
while it is being pruned. The lock files are empty and stay (removing one that another process
waits on would let two processes hold the "same" lock).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
from omegaconf import DictConfig, OmegaConf

from . import __version__
from .errors import EtbuildError
from .paths import OPS_YAML_DIR, PACKAGE_ROOT, RUNTIME_SRC_DIR
from .runner import sha256_file, tree_digest

# Config settings that only stages after the cached prefix read.
_LATER_SECTIONS = ("target", "selection", "build")
# Sections no stage reads: the recipe's header and what a search sweeper is returned.
_UNREAD_SECTIONS = ("recipe", "search")
_LATER_SETTINGS = (
    ("pipeline", "stop_after"),
    ("pipeline", "cache"),
    ("pipeline", "verify", "enabled"),
    ("pipeline", "verify", "tolerance"),
    ("pipeline", "verify", "latency_iters"),
    ("quant", "min_sqnr_db"),
)
_TOOLS = ("torch", "torchao", "flatbuffers", "hydra-core", "omegaconf")


def cache_root(cfg: DictConfig) -> Path:
    """``build.cache_dir``, else ``$ETBUILD_CACHE_DIR``, else ``~/.cache/etbuild``."""
    if cfg.build.cache_dir:
        return Path(cfg.build.cache_dir).expanduser()
    env = os.environ.get("ETBUILD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "etbuild"


def _target_source(target: str | None) -> str:
    """The digest of the file that defines a ``_target_`` ("pkg.module.attr")."""
    if not target:
        return ""
    module = target.rpartition(".")[0] or target
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return f"unresolved {target}"  # the model stage will report it; nothing is stored
    return f"{spec.origin} {sha256_file(Path(spec.origin))}"


def _path_digest(path_text: str | None, pattern: str = "*") -> str:
    if not path_text:
        return ""
    path = Path(path_text).expanduser()
    if path.is_file():
        return sha256_file(path)
    if path.is_dir():
        return json.dumps(
            {p.name: sha256_file(p) for p in sorted(path.glob(pattern)) if p.is_file()}
        )
    return f"missing {path_text}"


def _tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "etbuild": __version__}
    for name in _TOOLS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def tool_versions() -> dict[str, str]:
    """The versions of python, etbuild and the packages a build's results depend on."""
    return _tool_versions()


def input_digests(cfg: DictConfig) -> dict[str, str]:
    """The digests of what a build reads besides its config: the source files of its user
    ``_target_``s (``"<file> <sha256>"``), the checkpoint and the calibration files."""
    quant = cfg.quant
    return {
        "model_source": _target_source(cfg.model._target_),
        "checkpoint": _path_digest(cfg.model.checkpoint),
        "calibration_source": _target_source(quant.calibration._target_),
        "calibration_files": _path_digest(quant.calibration.folder, "*.pt"),
        "train_step_source": _target_source(quant.qat.train_step.get("_target_")),
        "partitioner_source": _target_source(cfg.partitioner._target_),
    }


def stage_cache_key(cfg: DictConfig) -> str:
    """The key of the cacheable prefix's results for ``cfg``."""
    doc = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for section in _LATER_SECTIONS + _UNREAD_SECTIONS:
        doc.pop(section, None)
    for path in _LATER_SETTINGS:
        node = doc
        for part in path[:-1]:
            node = node.get(part, {})
        node.pop(path[-1], None)
    inputs = {"config": doc, "tools": _tool_versions(), **input_digests(cfg)}
    h = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode())
    tree_digest(h, PACKAGE_ROOT / "pipeline", ("**/*.py",))
    tree_digest(h, OPS_YAML_DIR, ("*.yaml",))
    tree_digest(h, RUNTIME_SRC_DIR / "schema", ("*.fbs",))
    return h.hexdigest()[:32]


def _lock(root: Path, kind: str, key: str) -> filelock.FileLock:
    path = root / "locks" / f"{kind}-{key}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EtbuildError(
            f"cannot create the cache's lock folder {path.parent}: {exc}; set build.cache_dir "
            "(or ETBUILD_CACHE_DIR) to a folder you can write"
        ) from exc
    return filelock.FileLock(str(path))


def acquire(lock: filelock.FileLock, what: str, note: Callable[[str], None] = print) -> None:
    """Take ``lock``, saying so when another process holds it (it is building ``what``)."""
    try:
        lock.acquire(timeout=0)
        return
    except filelock.Timeout:
        note(f"etbuild: waiting for another etbuild process that holds {what} ({lock.lock_file})")
    except OSError as exc:
        raise EtbuildError(
            f"cannot lock {lock.lock_file}: {exc}; set build.cache_dir (or ETBUILD_CACHE_DIR) to "
            "a folder you can write"
        ) from exc
    lock.acquire()


@contextmanager
def entry_lock(
    root: Path, kind: str, key: str, note: Callable[[str], None] = print
) -> Iterator[None]:
    """Hold the lock of cache entry ``root/kind/key`` (``kind``: ``stages`` or ``builds``)."""
    lock = _lock(root, kind, key)
    acquire(lock, f"the {kind} cache entry {key}", note)
    try:
        yield
    finally:
        lock.release()


def remove_stale_temporaries(entry: Path) -> None:
    """Remove what a killed process left while writing ``entry`` (call with its lock held:
    then no live process is writing it)."""
    for tmp in entry.parent.glob(f".{entry.name}.*"):
        shutil.rmtree(tmp, ignore_errors=True)


def mark_used(entry: Path) -> None:
    """Record that a cache entry (a stage-cache or build-cache folder) was just used."""
    os.utime(entry)


def _entry_bytes(entry: Path) -> int:
    return sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())


def prune(root: Path, max_bytes: int, keep: set[Path], keep_since: float) -> tuple[int, int]:
    """Remove the least recently used entries of ``root/stages`` and ``root/builds`` until the
    cache holds at most ``max_bytes``; ``keep`` (this run's entries), entries used at or after
    ``keep_since`` and entries whose lock another process holds (a concurrent run's) stay.
    Returns (entries removed, bytes freed)."""
    entries = [
        e
        for kind in ("stages", "builds")
        if (root / kind).is_dir()
        for e in (root / kind).iterdir()
        if e.is_dir() and not e.name.startswith(".")  # not an entry being written
    ]
    sized = sorted(((e.stat().st_mtime, _entry_bytes(e), e) for e in entries), key=lambda t: t[0])
    total = sum(size for _, size, _ in sized)
    removed = freed = 0
    for used, size, entry in sized:
        if total <= max_bytes:
            break
        if entry in keep or used >= keep_since:
            continue
        try:
            lock = _lock(root, entry.parent.name, entry.name)
            lock.acquire(timeout=0)
        except (filelock.Timeout, OSError, EtbuildError):
            continue  # a process is reading or writing it
        try:
            doomed = entry.with_name(f".{entry.name}.removing")
            try:
                os.replace(entry, doomed)  # readers see the entry whole or not at all
            except OSError:
                continue
            shutil.rmtree(doomed, ignore_errors=True)
        finally:
            lock.release()
        total -= size
        removed, freed = removed + 1, freed + size
    return removed, freed


@dataclass
class CachedPrefix:
    """A cache hit: the stages' manifest records, their passed-on artifacts, their files."""

    records: list[dict[str, Any]]
    artifacts: dict[str, Any]
    files: dict[str, Path]


class StageCache:
    """One entry of the stage cache (``root/stages/key``).

    The runner calls ``lock`` before ``load``; on a miss it keeps the lock while the stages
    run and ``store`` their results, so concurrent runs with the same key wait for those
    results instead of computing them too. ``unlock`` when done (a no-op when not held)."""

    def __init__(self, root: Path, key: str) -> None:
        self.key = key
        self.root = root
        self.entry = root / "stages" / key
        self._lock: filelock.FileLock | None = None

    def lock(self, note: Callable[[str], None] = print) -> None:
        """Wait for, then hold, this entry's lock."""
        if self._lock is None:
            lock = _lock(self.root, "stages", self.key)
            acquire(lock, f"the stage cache entry {self.key}", note)
            self._lock = lock

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def load(self) -> CachedPrefix | None:
        """The stored results, or None when absent or damaged. A hit marks the entry used."""
        try:
            doc = json.loads((self.entry / "entry.json").read_text())
            files = {}
            for rec in doc["records"]:
                for name, digest in rec["writes"].items():
                    path = self.entry / "files" / name
                    if sha256_file(path) != digest:
                        return None
                    files[name] = path
            mark_used(self.entry)
            return CachedPrefix(doc["records"], doc["artifacts"], files)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, run_dir: Path, records: list[dict[str, Any]], artifacts: dict) -> None:
        """Save the stages' records, artifacts and files (with the lock held, the only
        writer of this key; without it, a concurrent identical store wins)."""
        self.entry.parent.mkdir(parents=True, exist_ok=True)
        if self._lock is not None:
            remove_stale_temporaries(self.entry)
        tmp = Path(tempfile.mkdtemp(dir=self.entry.parent, prefix=f".{self.key}."))
        try:
            for rec in records:
                for name in rec["writes"]:
                    dest = tmp / "files" / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(run_dir / name, dest)
            doc = {"key": self.key, "records": records, "artifacts": artifacts}
            (tmp / "entry.json").write_text(json.dumps(doc, indent=1) + "\n")
            try:
                os.replace(tmp, self.entry)
            except OSError:
                if self.load() is None:  # not an identical entry stored meanwhile
                    shutil.rmtree(self.entry, ignore_errors=True)
                    os.replace(tmp, self.entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
