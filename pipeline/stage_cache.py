"""The stage cache: the result of each cacheable stage (model .. reference), reused by a later
run in which that stage's inputs are identical.

A stage's key hashes what it depends on (pipeline/runner.py's ``Stage`` declares it): its name;
the etbuild sources that run it (pipeline/, ops_yaml/, the program schema); the versions of
python, torch, torchao and flatbuffers; its own config slice (``Stage.config``); the digests
of the inputs it reads besides the config (``Stage.inputs``: the source file of a user
``_target_``, the checkpoint, the calibration files); and, for each artifact it reads, the key
of the stage that wrote it (Merkle-style: a stage's key covers everything before it that it
depends on). So a sweep over ``quant`` exports the model once, a change of ``memory`` reruns
the stages from ``plan`` on, and a change of ``target``, ``selection`` or ``build`` reruns
none of them. A user module that imports other local modules is keyed by its own file only;
set ``pipeline.cache=false`` while editing those.

An entry is ``<cache root>/stages/<key>/``: ``entry.json`` (the stage's manifest record, the
artifacts it wrote and how each is stored, with content hashes), ``files/`` (what it wrote to
the run directory) and ``artifacts/`` (its in-memory artifacts: an ExportedProgram through
``torch.export.save``, other data pickled together, so that objects they share stay shared).
An artifact the stage declares in ``Stage.rerun``, or that cannot be pickled (the model's
``nn.Module``, the fx-based lowered graph), is not stored: the runner runs its stage again
when a stage that runs reads it. An entry is written to a temporary folder and renamed into
place, and checked against its recorded hashes when read, so a damaged entry is a miss, never
a wrong result.

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
import io
import json
import os
import pickle
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock
from omegaconf import DictConfig, OmegaConf

from . import __version__
from .errors import EtbuildError
from .hashing import sha256_bytes, sha256_file, sha256_json, tree_digest
from .paths import OPS_YAML_DIR, PACKAGE_ROOT, RUNTIME_SRC_DIR

if TYPE_CHECKING:
    from .runner import Stage

# Settings inside a cacheable stage's config slice that only later stages read.
_UNKEYED_SETTINGS = (("quant", "min_sqnr_db"),)
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


def _code_digest() -> str:
    """The etbuild sources the stages run: pipeline/, ops_yaml/ and the program schema."""
    h = hashlib.sha256()
    tree_digest(h, PACKAGE_ROOT / "pipeline", ("**/*.py",))
    tree_digest(h, OPS_YAML_DIR, ("*.yaml",))
    tree_digest(h, RUNTIME_SRC_DIR / "schema", ("*.fbs",))
    return h.hexdigest()


def config_slice(cfg: DictConfig, paths: tuple[str, ...]) -> dict[str, Any]:
    """The config sections or dotted keys ``paths`` (resolved), less the settings only later
    stages read."""
    doc = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    for path in _UNKEYED_SETTINGS:
        node = doc
        for part in path[:-1]:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(path[-1], None)
    out: dict[str, Any] = {}
    for path in paths:
        node: Any = doc
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[path] = node
    return out


def stage_keys(stages: list[Stage], cfg: DictConfig) -> dict[str, str]:
    """The stage-cache key of each cacheable stage of ``stages`` (in run order) for ``cfg``."""
    common = {"code": _code_digest(), "tools": _tool_versions()}
    inputs = input_digests(cfg) if any(s.inputs for s in stages if s.cacheable) else {}
    producer: dict[str, str] = {}  # artifact -> the key of the last stage that writes it
    keys: dict[str, str] = {}
    for stage in stages:
        if not stage.cacheable:
            continue
        doc = {
            **common,
            "stage": stage.name,
            "config": config_slice(cfg, stage.config),
            "inputs": {name: inputs[name] for name in stage.inputs},
            "reads": {name: producer.get(name) for name in stage.reads},
        }
        keys[stage.name] = sha256_json(doc)[:32]
        for name in stage.writes:
            producer[name] = keys[stage.name]
    return keys


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


def _dump_exported(ep: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


def _load_exported(data: bytes) -> Any:
    import torch

    if b"quantized_decomposed" in data:
        import torchao.quantization.pt2e  # noqa: F401  (registers the quantized_decomposed ops)
    return torch.export.load(io.BytesIO(data))


def _is_exported(value: Any) -> bool:
    import torch

    return isinstance(value, torch.export.ExportedProgram)


@dataclass
class StoredStage:
    """A cache hit: the stage's manifest record, the files it wrote (in the entry) and its
    artifacts (``written``: every name it wrote; ``stored``: those the entry holds, read and
    checked while the entry's lock was held, decoded when first asked for)."""

    record: dict[str, Any]
    written: list[str]
    stored: dict[str, str]  # name -> codec ("export" or "pickle")
    files: dict[str, Path]
    blobs: dict[str, bytes]  # "export/<name>" or "pickle" -> its bytes
    _unpickled: dict[str, Any] | None = field(default=None, repr=False)

    def load(self, name: str) -> Any:
        if self.stored[name] == "export":
            return _load_exported(self.blobs[f"export/{name}"])
        if self._unpickled is None:
            self._unpickled = pickle.loads(self.blobs["pickle"])
        return self._unpickled[name]


def _pickle_all(values: dict[str, Any]) -> tuple[bytes | None, list[str]]:
    """``values`` pickled together (shared objects stay shared), less those that cannot be."""
    names = list(values)
    try:
        return pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL), names
    except Exception:  # noqa: BLE001 (any object may refuse, each in its own way)
        pass
    good = {}
    for name in names:
        try:
            pickle.dumps(values[name], protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001
            continue
        good[name] = values[name]
    if not good:
        return None, []
    return pickle.dumps(good, protocol=pickle.HIGHEST_PROTOCOL), list(good)


class StageCache:
    """The stage cache under ``root`` (``root/stages/<key>``), one entry per stage key.

    The runner calls ``lock(key)`` before ``load(key)``; on a miss it keeps the lock while the
    stage runs and it ``store``s the result, so concurrent runs with the same key wait for that
    result instead of computing it too. ``unlock(key)`` when done (a no-op when not held).
    ``used`` collects the entries this process read or wrote (what pruning must keep)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.used: set[Path] = set()
        self._held: dict[str, filelock.FileLock] = {}

    def entry(self, key: str) -> Path:
        return self.root / "stages" / key

    def keys(self, stages: list[Stage], cfg: DictConfig) -> dict[str, str]:
        return stage_keys(stages, cfg)

    def lock(self, key: str, note: Callable[[str], None] = print) -> None:
        """Wait for, then hold, the lock of entry ``key``."""
        if key not in self._held:
            lock = _lock(self.root, "stages", key)
            acquire(lock, f"the stage cache entry {key}", note)
            self._held[key] = lock

    def unlock(self, key: str) -> None:
        lock = self._held.pop(key, None)
        if lock is not None:
            lock.release()

    def load(self, key: str) -> StoredStage | None:
        """The stored stage, or None when absent or damaged. A hit marks the entry used."""
        entry = self.entry(key)
        try:
            doc = json.loads((entry / "entry.json").read_text())
            files = {}
            for name, digest in doc["record"]["writes"].items():
                path = entry / "files" / name
                if sha256_file(path) != digest:
                    return None
                files[name] = path
            blobs = {}
            for blob, digest in doc["blobs"].items():
                data = (entry / "artifacts" / blob).read_bytes()
                if sha256_bytes(data) != digest:
                    return None
                blobs[blob] = data
            stored = doc["stored"]
            for name, codec in stored.items():
                if (f"export/{name}" if codec == "export" else "pickle") not in blobs:
                    return None
            mark_used(entry)
            self.used.add(entry)
            return StoredStage(doc["record"], doc["written"], stored, files, blobs)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def store(
        self,
        key: str,
        stage: Stage,
        record: dict[str, Any],
        run_dir: Path,
        values: dict[str, Any],
    ) -> None:
        """Save a stage's record, files and artifacts ``values`` (with the lock held, the only
        writer of this key; without it, a concurrent identical store wins)."""
        entry = self.entry(key)
        entry.parent.mkdir(parents=True, exist_ok=True)
        if key in self._held:
            remove_stale_temporaries(entry)
        record = {k: v for k, v in record.items() if k != "cache"}
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{key}."))
        try:
            for name in record["writes"]:
                dest = tmp / "files" / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run_dir / name, dest)
            keep = {k: v for k, v in values.items() if k not in stage.rerun}
            stored: dict[str, str] = {}
            blobs: dict[str, bytes] = {}
            for name, value in keep.items():
                if _is_exported(value):
                    blobs[f"export/{name}"] = _dump_exported(value)
                    stored[name] = "export"
            data, pickled = _pickle_all({k: v for k, v in keep.items() if k not in stored})
            if data is not None:
                blobs["pickle"] = data
                stored.update(dict.fromkeys(pickled, "pickle"))
            for blob, data in blobs.items():
                dest = tmp / "artifacts" / blob
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
            doc = {
                "key": key,
                "stage": stage.name,
                "record": record,
                "written": list(values),
                "stored": stored,
                "blobs": {blob: sha256_bytes(data) for blob, data in blobs.items()},
            }
            (tmp / "entry.json").write_text(json.dumps(doc, indent=1) + "\n")
            try:
                os.replace(tmp, entry)
            except OSError:
                if self.load(key) is None:  # not an identical entry stored meanwhile
                    shutil.rmtree(entry, ignore_errors=True)
                    os.replace(tmp, entry)
            self.used.add(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
