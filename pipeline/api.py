"""The Python API: ``etbuild.build`` and ``etbuild.sweep``, the command line on Hydra's
compose API.

``build(overrides, recipe=None, run_dir=None)`` composes the config exactly as
``etbuild [--recipe NAME] OVERRIDES`` does, runs the pipeline into ``run_dir`` (default
``outputs/<date>/<time>_<model>/`` under the current directory, as the command) and returns a
:class:`BuildResult`. A mistake or a failed build raises :class:`EtbuildError` with the
message the command prints.

``sweep(overrides, recipe=None, sweep_dir=None)`` expands comma-separated values (and a
recipe's ``hydra.sweeper.params``) as Hydra's basic sweeper does, builds the jobs one after
the other in this process into ``sweep_dir/<n>_<model>/`` (default
``multirun/<date>/<time>/``), writes ``sweep.md``, ``sweep.csv`` and ``pareto.png``
(pipeline/sweep.py) and returns a :class:`SweepResult`; when a job failed it raises
:class:`SweepFailed` (an ``EtbuildError`` whose ``result`` holds the results) after writing
them. Hydra's other sweepers and launchers (``hydra/sweeper=optuna``, ``hydra/launcher=...``)
are the command's: run ``etbuild -m`` for them.
"""

from __future__ import annotations

import datetime
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import EtbuildError


@dataclass
class BuildResult:
    """One build: where it went, whether it succeeded, and its manifest's ``metrics``."""

    run_dir: Path
    status: str
    overrides: list[str] = field(default_factory=list)
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    def _file(self, name: str) -> Path | None:
        path = self.run_dir / name
        return path if path.is_file() else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def model_pte(self) -> Path | None:
        return self._file("model.pte")

    @property
    def report(self) -> Path | None:
        return self._file("report.md")

    @property
    def manifest(self) -> Path | None:
        return self._file("manifest.json")

    @property
    def lock(self) -> Path | None:
        return self._file("recipe.lock.yaml")

    @classmethod
    def from_run_dir(cls, run_dir: Path, overrides: Sequence[str] = ()) -> BuildResult:
        """A build's result as its ``manifest.json`` records it."""
        try:
            manifest = json.loads((run_dir / "manifest.json").read_text())
        except (OSError, ValueError):
            return cls(run_dir, "no manifest", list(overrides), "no readable manifest.json")
        return cls(
            run_dir,
            str(manifest.get("status", "unknown")),
            list(overrides),
            manifest.get("error"),
            manifest.get("metrics") or {},
        )


@dataclass
class SweepResult:
    """A sweep: every job's result, the Pareto front, and the summary files."""

    sweep_dir: Path
    results: list[BuildResult]
    front: list[BuildResult]
    sweep_md: Path
    sweep_csv: Path
    pareto_png: Path

    @property
    def failed(self) -> list[BuildResult]:
        return [r for r in self.results if not r.ok]


class SweepFailed(EtbuildError):
    """A sweep in which some job failed; ``result`` holds every job's result."""

    def __init__(self, message: str, result: SweepResult) -> None:
        super().__init__(message)
        self.result = result


def _reject_hydra_overrides(overrides: Sequence[str]) -> None:
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key.startswith(("hydra.", "hydra/")) or key == "hydra":
            raise EtbuildError(
                f"override {o!r}: Hydra's own settings (hydra.*, hydra/launcher, hydra/sweeper) "
                "belong to the etbuild command; the Python API takes run_dir / sweep_dir, and "
                "etbuild -m runs other sweepers and launchers"
            )


def _recipe(recipe: str | None):
    from .recipes import find

    return find(recipe) if recipe is not None else None


def _now_dir(root: str, model: str | None) -> Path:
    now = datetime.datetime.now()
    day, time = now.strftime("%Y-%m-%d"), now.strftime("%H-%M-%S")
    return Path(root) / day / (f"{time}_{model}" if model else time)


def _build_one(
    recipe: Any,
    overrides: list[str],
    run_dir: Path | None,
    in_sweep: bool = False,
) -> BuildResult:
    from . import cli
    from .recipes import compose

    cfg = compose(recipe, overrides, validate=False)  # cli.build validates, naming the recipe
    if run_dir is None:
        run_dir = _now_dir("outputs", str(cfg.model.name))
    run_dir = Path(run_dir).absolute()
    recipe_file = str(recipe.path) if recipe is not None else None
    with warnings.catch_warnings():
        # torch 2.13's own export internals trip this deprecation (as in the command).
        warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec", category=FutureWarning)
        cli.build(
            cfg,
            run_dir,
            manifest_on_early_error=in_sweep,
            overrides=overrides,
            recipe_file=recipe_file,
        )
    return BuildResult.from_run_dir(run_dir, overrides)


def build(
    overrides: Sequence[str] = (),
    recipe: str | None = None,
    run_dir: str | Path | None = None,
) -> BuildResult:
    """Build one config (``etbuild [--recipe RECIPE] OVERRIDES``) into ``run_dir``."""
    overrides = [str(o) for o in overrides]
    _reject_hydra_overrides(overrides)
    if len(job_overrides(overrides)) > 1:
        raise EtbuildError(
            f"overrides {overrides} list several values (a sweep): call etbuild.sweep"
        )
    from .config import register_configs

    register_configs()
    return _build_one(_recipe(recipe), overrides, Path(run_dir) if run_dir else None)


def _sweep_params(recipe: Any) -> list[str]:
    """A recipe's ``hydra.sweeper.params`` as overrides (``key=values``)."""
    if recipe is None:
        return []
    from omegaconf import OmegaConf

    from .recipes import compose

    cfg = compose(recipe, [], return_hydra_config=True, validate=False)
    sweeper = str(OmegaConf.select(cfg, "hydra.sweeper._target_") or "")
    if sweeper and not sweeper.endswith("BasicSweeper"):
        raise EtbuildError(
            f"recipe {recipe.path} uses the sweeper {sweeper}; etbuild.sweep runs Hydra's basic "
            f"sweeper only: run it with etbuild -m --recipe {recipe.name}"
        )
    params = OmegaConf.select(cfg, "hydra.sweeper.params")
    if not params:
        return []
    return [f"{k}={v}" for k, v in OmegaConf.to_container(params, resolve=False).items()]


def job_overrides(overrides: Sequence[str], recipe: Any = None) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper expands them (the command line wins over
    a recipe's ``hydra.sweeper.params`` for the same key)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from .recipes import hydra_message

    parser = OverridesParser.create()
    try:
        given = parser.parse_overrides(list(overrides))
        keys = {o.get_key_element() for o in given}
        params = [o for o in parser.parse_overrides(_sweep_params(recipe))]
        merged = [o for o in params if o.get_key_element() not in keys] + given
        batches = BasicSweeper.split_arguments(merged, None)
    except HydraException as exc:
        raise EtbuildError(hydra_message(exc)) from None
    return [list(job) for batch in batches for job in batch]


def sweep(
    overrides: Sequence[str] = (),
    recipe: str | None = None,
    sweep_dir: str | Path | None = None,
) -> SweepResult:
    """Build every combination (``etbuild -m [--recipe RECIPE] OVERRIDES``), one after the
    other, into ``sweep_dir``; write and return the sweep's results."""
    from .config import register_configs
    from .recipes import compose
    from .runner import write_atomic
    from .sweep import summarize, write_results

    overrides = [str(o) for o in overrides]
    _reject_hydra_overrides(overrides)
    register_configs()
    rec = _recipe(recipe)
    jobs = job_overrides(overrides, rec)
    root = Path(sweep_dir) if sweep_dir is not None else _now_dir("multirun", None)
    root = root.absolute()
    dirs: list[Path] = []
    results: list[BuildResult] = []
    for num, job in enumerate(jobs):
        cfg = compose(rec, job, validate=False)
        run_dir = root / f"{num}_{cfg.model.name}"
        hydra_dir = run_dir / ".hydra"
        write_atomic(hydra_dir / "overrides.yaml", yaml.safe_dump(job).encode())
        write_atomic(
            hydra_dir / "hydra.yaml", yaml.safe_dump({"hydra": {"job": {"num": num}}}).encode()
        )
        print(f"etbuild: job {num}: {' '.join(job) or '(no overrides)'} -> {run_dir}")
        try:
            _build_one(rec, job, run_dir, in_sweep=True)
        except EtbuildError as exc:
            print(f"etbuild: error: {exc}")
        except Exception as exc:  # a bug: the job's manifest records it, the sweep goes on
            print(f"etbuild: internal error in {run_dir}: {exc!r}")
        dirs.append(run_dir)
        results.append(BuildResult.from_run_dir(run_dir, job))
    summary = summarize(root, dirs)
    md, csv_path, png = write_results(summary)
    on_front = {j.run_dir for j in summary.front}
    result = SweepResult(
        root, results, [r for r in results if r.run_dir in on_front], md, csv_path, png
    )
    if result.failed:
        lines = [f"{len(result.failed)} sweep job(s) failed:"]
        for r in result.failed:
            first = (r.error or r.status).strip().splitlines()
            lines.append(f"  {r.run_dir}: {first[0] if first else r.status}")
        raise SweepFailed("\n".join(lines), result)
    return result
