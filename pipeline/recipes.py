"""Recipes: shareable, versioned primary configs, found by name on a search path.

A recipe is a Hydra primary config (``defaults: [config, ...]`` then overrides) with a
header, a top-level ``recipe:`` block::

    recipe:
      name: mcu_int8            # the file's name without .yaml
      version: 1.0.0            # the recipe's own version (PEP 440)
      etbuild: ">=0.1,<1"       # the etbuild versions it works with (PEP 440 specifier)
      description: one line for `etbuild-recipe list`

Recipes are looked up by name, first match wins, in:

1. the recipes packaged with etbuild (``recipes/`` of the checkout or the wheel);
2. each folder of ``$ETBUILD_RECIPE_PATH`` (``os.pathsep``-separated);
3. pip-installed recipe packages: each entry point of the group ``etbuild.recipes`` names an
   importable package (``my_team_recipes = "my_team_recipes"``) whose folder holds the
   ``*.yaml`` recipes.

Hydra reads a recipe from its folder (``--config-dir``); the folder goes behind etbuild's
``conf/`` on Hydra's search path, so a recipe's ``defaults`` can use every group of ``conf/``.
(A ``pkg://`` entry of ``hydra.searchpath`` cannot hold the *primary* config in Hydra 1.3:
the primary is looked up before that search path is applied; so a recipe package is read
from the folder its package is installed in.)
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from . import __version__
from .errors import EtbuildError
from .paths import CONF_DIR, RECIPES_DIR

ENV_VAR = "ETBUILD_RECIPE_PATH"
ENTRY_POINT_GROUP = "etbuild.recipes"
HEADER_KEYS = ("name", "version", "etbuild", "description")
HEADER_EXAMPLE = (
    "recipe: {name: NAME, version: 1.0.0, etbuild: '>=0.1,<1', description: what it builds}"
)


@dataclass(frozen=True)
class RecipeFolder:
    """One entry of the recipe search path."""

    folder: Path
    origin: str  # "packaged", "ETBUILD_RECIPE_PATH", "package <dist> (<module>)"


@dataclass
class Recipe:
    """A recipe file found on the search path (or given by path)."""

    name: str
    path: Path
    origin: str
    header: dict[str, Any] | None

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def version(self) -> str:
        return str((self.header or {}).get("version", "")) or "-"

    @property
    def description(self) -> str:
        return str((self.header or {}).get("description", "") or "")


def _package_folder(module: str) -> Path | None:
    try:
        root = importlib.resources.files(module)
    except (ImportError, TypeError, ValueError):
        return None
    path = Path(str(root))
    return path if path.is_dir() else None


def search_path() -> list[RecipeFolder]:
    """The recipe folders, in lookup order (folders that do not exist are left out)."""
    out = [RecipeFolder(RECIPES_DIR, "packaged")]
    for entry in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if entry.strip():
            folder = Path(entry).expanduser().absolute()
            if folder.is_dir():
                out.append(RecipeFolder(folder, ENV_VAR))
    for ep in sorted(
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name
    ):
        module = ep.value.split(":")[0].strip()
        folder = _package_folder(module)
        if folder is not None:
            dist = ep.dist.name if ep.dist is not None else ep.name
            out.append(RecipeFolder(folder, f"package {dist} ({module})"))
    return out


def _yaml_doc(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise EtbuildError(f"cannot read recipe {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise EtbuildError(f"recipe {path}{where}: {problem}; fix the YAML syntax") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise EtbuildError(f"recipe {path} is not a mapping of settings (a YAML dict)")
    return doc


def read_header(path: Path) -> dict[str, Any] | None:
    """The ``recipe:`` block of a recipe file, or None when it has none."""
    header = _yaml_doc(path).get("recipe")
    if header is not None and not isinstance(header, dict):
        raise EtbuildError(f"recipe {path}: recipe: must be a block like {HEADER_EXAMPLE}")
    return header


def _recipe_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.glob("*.yaml")):
        if path.is_file() and path.stem != "config":
            yield path


def available() -> list[Recipe]:
    """Every recipe on the search path, first match per name only, in search-path order."""
    seen: set[str] = set()
    out = []
    for entry in search_path():
        for path in _recipe_files(entry.folder):
            if path.stem in seen:
                continue
            seen.add(path.stem)
            try:
                header = read_header(path)
            except EtbuildError:
                header = None  # listed; `etbuild-recipe validate` says what is wrong
            out.append(Recipe(path.stem, path, entry.origin, header))
    return out


def find(name: str) -> Recipe:
    """A recipe by name on the search path, or by the path of its file."""
    candidate = Path(name).expanduser()
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        if not candidate.is_file():
            raise EtbuildError(f"recipe file {name} does not exist")
        path = candidate.absolute()
        if path.stem == "config":
            raise EtbuildError(
                f"recipe {path}: a recipe may not be called 'config' (etbuild's own primary "
                "config has that name); rename the file"
            )
        return Recipe(path.stem, path, "file", read_header(path))
    for entry in search_path():
        path = entry.folder / f"{name}.yaml"
        if path.is_file() and name != "config":
            return Recipe(name, path, entry.origin, read_header(path))
    names = sorted({r.name for r in available()})
    raise EtbuildError(
        f"no recipe named {name!r} on the recipe search path (packaged, ${ENV_VAR}, packages "
        f"of the entry point group {ENTRY_POINT_GROUP}); recipes: {', '.join(names) or 'none'}"
        " (`etbuild-recipe list` shows where each comes from)"
    )


def check_header(header: Any, where: str, stem: str | None = None) -> None:
    """Check a recipe header (the ``recipe:`` block as data); ``where`` names the file."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    if header is None:
        raise EtbuildError(f"recipe {where} has no header; add a top-level {HEADER_EXAMPLE}")
    if not isinstance(header, dict):
        raise EtbuildError(f"recipe {where}: recipe: must be a block like {HEADER_EXAMPLE}")
    for key in header:
        if key not in HEADER_KEYS:
            raise EtbuildError(
                f"recipe {where}: unknown header key recipe.{key}; the header's keys are: "
                f"{', '.join(HEADER_KEYS)}"
            )
    for key in ("name", "version"):
        if header.get(key) in (None, "", "???"):
            raise EtbuildError(
                f"recipe {where}: recipe.{key} is missing; add it ({HEADER_EXAMPLE})"
            )
    name = str(header["name"])
    if stem is not None and name != stem:
        raise EtbuildError(
            f"recipe {where}: recipe.name={name!r} differs from the file's name {stem!r}; a "
            "recipe is called by its file name, so make them the same"
        )
    try:
        Version(str(header["version"]))
    except InvalidVersion:
        raise EtbuildError(
            f"recipe {where}: recipe.version={header['version']!r} is not a PEP 440 version; "
            "write one like 1.0.0"
        ) from None
    spec = header.get("etbuild")
    if spec is None:
        return
    try:
        specifiers = SpecifierSet(str(spec))
    except InvalidSpecifier:
        raise EtbuildError(
            f"recipe {where}: recipe.etbuild={spec!r} is not a PEP 440 version specifier; "
            "write one like '>=0.1,<1'"
        ) from None
    if not specifiers.contains(__version__, prereleases=True):
        raise EtbuildError(
            f"recipe {where} needs etbuild {spec} (recipe.etbuild) but this is etbuild "
            f"{__version__}: install a matching etbuild (pip install 'etbuild{spec}'), or use a "
            f"version of the recipe whose recipe.etbuild admits {__version__}"
        )


# --- composing ---------------------------------------------------------------------------


def check_starts_from_config(cfg: DictConfig) -> None:
    """A recipe whose defaults leave out etbuild's ``config`` composes without the schema, the
    model or the pipeline settings; say so rather than fail on the first missing key."""
    if cfg.get("model") is None or cfg.get("pipeline") is None:
        raise EtbuildError(
            "the composed config has no model or pipeline settings: a recipe's defaults list "
            "must start with etbuild's config (defaults: [config, <group>: <option>, "
            "override /<group>: <option>, _self_]); see the README, \"The order of a recipe's "
            'defaults"'
        )


@contextmanager
def hydra_compose_context(folder: Path | None) -> Iterator[None]:
    """Hydra's compose API with etbuild's ``conf/`` and, when given, a recipe folder (the
    recipe folder is the primary source; ``conf/`` is added through ``hydra.searchpath``)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from .config import register_configs

    register_configs()
    saved = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(
            config_dir=str(folder if folder is not None else CONF_DIR), version_base="1.3"
        ):
            yield
    finally:
        GlobalHydra.instance().clear()
        if saved is not None:
            GlobalHydra.instance().initialize(saved)


def compose_overrides(recipe: Recipe | None, overrides: Sequence[str]) -> list[str]:
    """The overrides for ``compose`` (a recipe's folder needs ``conf/`` on the search path)."""
    out = list(overrides)
    if recipe is not None:
        out.append(f"hydra.searchpath=[file://{CONF_DIR}]")
    return out


def _schema_fields(full_key: str) -> list[str] | None:
    """The keys the schema allows beside ``full_key`` (``memory.alignmnt`` -> MemoryConfig's)."""
    import dataclasses
    import typing

    from .config import EtbuildConfig

    node: Any = EtbuildConfig
    for part in full_key.split(".")[:-1]:
        if part.isdigit() or part.startswith("["):
            continue
        if not dataclasses.is_dataclass(node):
            return None
        hints = typing.get_type_hints(node)
        if part not in hints:
            return None
        node = hints[part]
        while typing.get_origin(node) is not None:  # list[X], X | None
            args = [a for a in typing.get_args(node) if a is not type(None)]
            if not args:
                return None
            node = args[-1]
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else None


def hydra_message(exc: BaseException) -> str:
    """A Hydra/OmegaConf exception's message on one line; an unknown key is named with the
    keys its section allows."""
    import re

    text = " ".join(f"{exc}".split())
    cause = exc.__cause__
    if cause is not None:
        cause_text = " ".join(str(cause).split())
        if cause_text and cause_text not in text:
            text += f": {cause_text}"
    m = re.search(r"Key '([^']+)' not in '([^']+)'.*?full_key: (\S+)", text)
    if m:
        full_key = m.group(3)
        allowed = _schema_fields(full_key)
        listed = f"; its settings are: {', '.join(allowed)}" if allowed else ""
        return f"unknown setting {full_key!r}: {m.group(2)} has no key {m.group(1)!r}{listed}"
    key = re.search(r"full_key: (\S+)", text)
    text = re.sub(r"\s*(full_key|reference_type|object_type):.*$", "", text)
    return f"{key.group(1)}: {text}" if key else text


def compose(
    recipe: Recipe | None,
    overrides: Sequence[str] = (),
    return_hydra_config: bool = False,
    validate: bool = True,
) -> DictConfig:
    """The composed config of ``recipe`` (None: etbuild's ``config``) with ``overrides``;
    schema-checked when ``validate``. Errors are EtbuildErrors naming the recipe file."""
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .config import validate as validate_config

    where = f"recipe {recipe.path}: " if recipe is not None else ""
    if recipe is not None:
        check_header(recipe.header, str(recipe.path), recipe.name)
    try:
        with hydra_compose_context(recipe.folder if recipe is not None else None):
            cfg = hydra_compose(
                config_name=recipe.name if recipe is not None else "config",
                overrides=compose_overrides(recipe, overrides),
                return_hydra_config=return_hydra_config,
            )
    except (HydraException, OmegaConfBaseException) as exc:
        fix = (
            "; fix the key or value in the recipe (or in the override that sets it)"
            if recipe is not None
            else ""
        )
        raise EtbuildError(f"{where}{hydra_message(exc)}{fix}") from None
    try:
        check_starts_from_config(cfg)
    except EtbuildError as exc:
        raise EtbuildError(f"{where}{exc}") from None
    if validate and not return_hydra_config:
        try:
            validate_config(cfg)
        except EtbuildError as exc:
            raise EtbuildError(f"{where}{exc}") from None
    return cfg


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """A composed config as plain data (interpolations resolved, enums as strings)."""
    doc = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    doc.pop("hydra", None)
    return doc


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted.key: leaf value}`` for a nested dict (lists are leaves)."""
    if isinstance(doc, dict) and doc:
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: doc}
