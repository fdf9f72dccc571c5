"""Lock files: ``recipe.lock.yaml`` in every run directory, and rebuilding from one.

A lock records what a build was made from: the fully resolved config, the digests of the
inputs besides the config (the source file of each user ``_target_``, the checkpoint, the
calibration files; pipeline/stage_cache.py computes them, for its cache key as well), the
versions of the tools the results depend on, the recipe (name, version, file) and the
command-line overrides. ``etbuild --lock RUN/recipe.lock.yaml`` builds the locked config
again, warning (one line each) about every tool version and input digest that differs now;
with the same tools and inputs, the program (``model.pte``) is byte-identical.

The rebuild composes a generated primary config: etbuild's ``config`` with the ``custom``
model (no zoo defaults to merge into), then the locked config over it.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from .errors import EtbuildError

LOCK_NAME = "recipe.lock.yaml"
LOCK_FORMAT = 1
PRIMARY_NAME = "etbuild_lock_primary"
_HEADER = "# etbuild lock file. Rebuild this run with: etbuild --lock {path}\n"


def lock_document(
    cfg: DictConfig, overrides: list[str], recipe_file: str | None = None
) -> dict[str, Any]:
    """The lock of a validated config."""
    from .stage_cache import input_digests, tool_versions

    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    config.pop("hydra", None)
    header = config.get("recipe")
    recipe = None
    if header:
        recipe = {"name": header.get("name"), "version": header.get("version")}
        if recipe_file:
            recipe["file"] = recipe_file
    return {
        "lock_format": LOCK_FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "recipe": recipe,
        "overrides": list(overrides),
        "tools": tool_versions(),
        "inputs": input_digests(cfg),
        "config": config,
    }


def write_lock(
    run_dir: Path, cfg: DictConfig, overrides: list[str], recipe_file: str | None = None
) -> Path:
    from .runner import write_atomic

    path = run_dir / LOCK_NAME
    doc = lock_document(cfg, overrides, recipe_file)
    text = _HEADER.format(path=path) + yaml.safe_dump(doc, sort_keys=False)
    write_atomic(path, text.encode())
    return path


def read_lock(path: Path) -> dict[str, Any]:
    """A lock file's document, checked for its format."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise EtbuildError(f"cannot read lock file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise EtbuildError(
            f"lock file {path} is not valid YAML ({getattr(exc, 'problem', exc)}); use the "
            f"{LOCK_NAME} a run wrote"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise EtbuildError(
            f"{path} is not an etbuild lock file (it has no config: block); use the "
            f"{LOCK_NAME} a run wrote"
        )
    fmt = doc.get("lock_format")
    if fmt != LOCK_FORMAT:
        raise EtbuildError(
            f"lock file {path} has lock_format {fmt!r}; this etbuild reads lock_format "
            f"{LOCK_FORMAT}: rebuild it with the etbuild that wrote it"
        )
    return doc


def _digest_part(value: Any) -> str:
    """The content part of an input digest (a source digest is "<file> <sha256>": the file's
    place may differ between machines, its content is what counts)."""
    text = str(value or "")
    if not text or text.startswith(("missing", "unresolved")):
        return text
    return text.rsplit(" ", 1)[-1]


def differences(doc: dict[str, Any]) -> list[str]:
    """One line per tool version and input digest that differs from the lock now."""
    from .stage_cache import input_digests, tool_versions

    out = []
    locked_tools = doc.get("tools") or {}
    now_tools = tool_versions()
    for name in sorted(set(locked_tools) | set(now_tools)):
        then, now = locked_tools.get(name), now_tools.get(name)
        if then != now:
            out.append(f"{name} is {now or 'absent'} here, the lock was made with {then or 'none'}")
    try:
        now_inputs = input_digests(OmegaConf.create(doc["config"]))
    except Exception as exc:  # a config the rebuild will reject with its own message
        return [*out, f"cannot compute the input digests of the locked config: {exc}"]
    locked_inputs = doc.get("inputs") or {}
    for name in sorted(set(locked_inputs) | set(now_inputs)):
        then, now = locked_inputs.get(name), now_inputs.get(name)
        if _digest_part(then) != _digest_part(now):
            out.append(f"input {name} differs from the lock ({then or 'none'} -> {now or 'none'})")
    return out


def primary_config(doc: dict[str, Any]) -> str:
    """The YAML of a primary config that composes to the locked config."""
    head = {"defaults": ["config", {"override /model": "custom"}, "_self_"]}
    return (
        "# Generated by `etbuild --lock`: the locked config over etbuild's own.\n"
        + yaml.safe_dump(head, sort_keys=False)
        + yaml.safe_dump(doc["config"], sort_keys=False)
    )


def write_primary(doc: dict[str, Any], folder: Path) -> Path:
    path = folder / f"{PRIMARY_NAME}.yaml"
    path.write_text(primary_config(doc))
    return path
