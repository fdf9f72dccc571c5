"""The `etbuild` command: a Hydra app over the packaged conf/ tree."""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config import register_configs, validate
from .errors import EtbuildError
from .paths import CONF_DIR
from .toolchain import resolve as resolve_toolchain


def check_supported(cfg: DictConfig) -> None:
    """Reject settings this version composes but cannot build yet, before any work."""
    if cfg.partitioner.name != "none":
        from .partition import load_backend

        load_backend(cfg.partitioner)  # an unimportable or malformed plug-in fails now
    # The files the model and the calibration read must be usable,
    if cfg.model.checkpoint:
        from .stages.model import read_checkpoint

        read_checkpoint(cfg.model.checkpoint)
    if cfg.quant.scheme.value in ("ptq", "qat"):
        from .quant.calibration import calibration_files

        calibration_files(cfg.quant.calibration)
    # the target's toolchain (compilers, NDK, qemu) must exist before any expensive stage, and
    # the programs and pinned kernels the selection names must be readable.
    resolve_toolchain(cfg.target, need_run=cfg.pipeline.verify.enabled)
    if cfg.target.kind.value == "cortex_m" and cfg.target.get("board") is not None:
        from .firmware import load_board, placement

        board = load_board(str(cfg.target.board))
        for bank in cfg.memory.banks:  # the firmware places every bank in a board region
            placement(bank, board)
    if cfg.selection.programs or cfg.selection.operators:
        from .stages.select import configured

        configured(cfg.selection)


def check_recipe(cfg: DictConfig, recipe_file: str | None) -> None:
    """A composed config's recipe header (when it came from a recipe) must admit this etbuild."""
    if cfg.get("recipe") is None:
        return
    from .recipes import check_header

    header = OmegaConf.to_container(cfg.recipe, resolve=True)
    where = recipe_file or f"{cfg.recipe.name!s}"
    check_header(header, where, Path(recipe_file).stem if recipe_file else None)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Runs the stages' own torch computations on one thread, then restores the count.

    How torch splits a convolution or a reduction over its threads changes the low bits of
    the sums, and so calibration's ranges, the quantized program and the eager references.
    On one thread a build is the same bytes whatever the machine's core count and whatever
    the process set (a CLI run on 8 cores, a bench that set 1 thread, a sweep's workers),
    which the stage cache relies on: its keys do not, and should not, hold the thread count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build(
    cfg: DictConfig,
    run_dir: Path,
    manifest_on_early_error: bool = False,
    overrides: list[str] | None = None,
    recipe_file: str | None = None,
) -> None:
    """Run the pipeline for a composed config into ``run_dir``.

    A setting that fails its checks stops the build before any stage, leaving ``run_dir``
    untouched; with ``manifest_on_early_error`` (a sweep job, whose results the sweep reads
    from its manifest) a failed ``manifest.json`` records the error. A build that passes
    them writes ``recipe.lock.yaml`` (pipeline/lock.py; ``overrides`` and ``recipe_file``
    are recorded there) before its first stage."""
    from .lock import write_lock
    from .runner import run_stages, write_early_failure
    from .stage_cache import StageCache, cache_root, prune
    from .stages import STAGES

    try:
        check_recipe(cfg, recipe_file)
        try:
            cfg = validate(cfg)
        except EtbuildError as exc:
            if recipe_file:
                raise EtbuildError(f"{exc} (recipe {recipe_file})") from None
            raise
        check_supported(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_lock(run_dir, cfg, list(overrides or []), recipe_file)
    except Exception as exc:
        if manifest_on_early_error:
            try:
                write_early_failure(run_dir, cfg, exc)
            except OSError:
                pass  # the error itself is what the user needs to see
        raise
    stop = cfg.pipeline.stop_after
    root = cache_root(cfg)
    cache = StageCache(root) if cfg.pipeline.cache else None
    started = time.time()
    with one_torch_thread():
        ctx = run_stages(
            STAGES, cfg, run_dir, stop_after=stop.value if stop is not None else None, cache=cache
        )
    limit = cfg.build.cache_max_gb
    if limit is not None:
        used = set(cache.used) if cache is not None else set()
        used.update(ctx.artifacts.get("build_cache_entries", []))
        removed, freed = prune(root, int(limit * 1e9), keep=used, keep_since=started)
        if removed:
            print(
                f"etbuild: cache: removed {removed} least recently used entries "
                f"({freed / 1e6:.1f} MB) to stay under build.cache_max_gb={limit:g}"
            )


def version_line() -> str:
    """``etbuild --version``: etbuild's version, then the versions it runs on."""
    import importlib.metadata
    import platform

    from . import __version__

    parts = [f"python {platform.python_version()}"]
    for dist in ("torch", "torchao", "hydra-core"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} absent")
    return f"etbuild {__version__} ({', '.join(parts)})"


def _take_flag(args: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` or ``flag=VALUE`` from ``args``; returns VALUE (None: absent)."""
    for i, arg in enumerate(args):
        if arg == flag:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                raise EtbuildError(f"{flag} needs a value: {flag} NAME")
            value = args[i + 1]
            del args[i : i + 2]
            return value
        if arg.startswith(flag + "="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def _has_flag(args: list[str], *flags: str) -> bool:
    return any(a in flags or a.split("=", 1)[0] in flags for a in args)


def expand_args(args: list[str], scratch: Path) -> tuple[list[str], str | None]:
    """Turn etbuild's own flags into Hydra's: ``--recipe NAME`` (a recipe on the recipe search
    path, or a recipe file) and ``--lock FILE`` (a run's recipe.lock.yaml; its generated
    primary config goes into ``scratch``). Returns Hydra's arguments and the recipe file."""
    from .recipes import compose, find

    args = list(args)
    recipe_name = _take_flag(args, "--recipe")
    lock_path = _take_flag(args, "--lock")
    if recipe_name is None and lock_path is None:
        return args, None
    if recipe_name is not None and lock_path is not None:
        raise EtbuildError("give --recipe or --lock, not both (a lock records its recipe)")
    if _has_flag(args, "--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp"):
        raise EtbuildError(
            f"{'--recipe' if recipe_name else '--lock'} chooses the config: drop --config-dir, "
            "--config-name and --config-path"
        )
    if recipe_name is not None:
        recipe = find(recipe_name)
        # Header, composition and schema before Hydra runs, so that a mistake names the file.
        compose(recipe, validate=False)
        return [*args, "--config-dir", str(recipe.folder), "--config-name", recipe.name], str(
            recipe.path
        )
    from .lock import differences, read_lock, write_primary

    doc = read_lock(Path(lock_path))
    for line in differences(doc):
        print(f"etbuild: warning: lock {lock_path}: {line}", file=sys.stderr)
    primary = write_primary(doc, scratch)
    recipe_file = (doc.get("recipe") or {}).get("file")
    return [*args, "--config-dir", str(scratch), "--config-name", primary.stem], recipe_file


def _objectives(cfg: DictConfig, run_dir: Path) -> list[float] | None:
    """A search job's objectives (a failed job's are the penalty; pipeline/search.py), written
    to search.json too; None for a job of Hydra's basic sweeper, which reads no result."""
    from .search import job_result

    sweeper = str(HydraConfig.get().sweeper.get("_target_", ""))
    if sweeper.endswith("BasicSweeper"):
        return None
    return job_result(run_dir, cfg.search)


def _recipe_file_from_hydra(hydra_cfg: DictConfig) -> str | None:
    """The file of the primary config, when it is a recipe read from a folder."""
    name = hydra_cfg.job.config_name
    if not name or name == "config":
        return None
    for source in hydra_cfg.runtime.config_sources:
        if source.schema == "file":
            path = Path(source.path) / f"{name}.yaml"
            if path.is_file():
                return str(path)
    return None


def main() -> None:
    # Hydra's own --version names Hydra's; this is etbuild's (any position, as argparse would).
    if "--version" in sys.argv[1:]:
        print(version_line())
        return
    import os
    import tempfile

    from . import completion

    shell = completion.query_shell(sys.argv[1:])
    query = shell is not None and "COMP_LINE" in os.environ
    if query:
        choices = completion.own_choices(os.environ["COMP_LINE"])
        if choices is not None:
            print(completion.answer(choices, shell))
            return
        os.environ["COMP_LINE"], flags = completion.split_line(os.environ["COMP_LINE"])
        sys.argv[1:] += flags
    # Only a --lock run writes a config of its own (a run killed with SIGKILL leaves it behind).
    with (
        tempfile.TemporaryDirectory(prefix="etbuild-args-")
        if _has_flag(sys.argv[1:], "--lock")
        else contextlib.nullcontext("")
    ) as scratch:
        try:
            sys.argv[1:], recipe_file = expand_args(sys.argv[1:], Path(scratch))
        except EtbuildError as exc:
            if query:  # a recipe or lock that is not there yet: nothing to offer
                return
            print(f"etbuild: error: {exc}", file=sys.stderr)
            sys.exit(1)
        _main(recipe_file)


def _main(recipe_file: str | None) -> None:
    # torch 2.13's own export internals trip this deprecation; it is not the user's to fix.
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec", category=FutureWarning)
    register_configs()
    # Progress lines as they happen, also through a pipe (`etbuild ... | tee build.log`).
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    failed: list[Path] = []

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def app(cfg: DictConfig) -> list[float] | None:
        """One build; in a search (a multirun with hydra/sweeper=optuna, or another sweeper
        that reads results), its objectives (pipeline/search.py)."""
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        sweep = hydra_cfg.mode == RunMode.MULTIRUN
        from .recipes import check_starts_from_config

        try:
            check_starts_from_config(cfg)  # a --config-name recipe without etbuild's config
        except EtbuildError as exc:
            print(f"etbuild: error: {exc}", file=sys.stderr)
            sys.exit(1)
        print(f"etbuild: {cfg.model.name} -> {run_dir}")
        source = recipe_file
        if source is None and cfg.get("recipe") is not None:
            source = _recipe_file_from_hydra(hydra_cfg)
        try:
            build(
                cfg,
                run_dir,
                manifest_on_early_error=sweep,
                overrides=list(hydra_cfg.overrides.task),
                recipe_file=source,
            )
        except KeyboardInterrupt:
            print(f"etbuild: interrupted: {run_dir} (its manifest.json says so)", file=sys.stderr)
            sys.exit(130)
        except EtbuildError as exc:
            print(f"etbuild: error: {exc}", file=sys.stderr)
            if not sweep:
                sys.exit(1)
            failed.append(run_dir)  # a sweep goes on with its other jobs
            return _objectives(cfg, run_dir)
        except Exception:
            if not sweep:
                raise
            # A bug, not a setting: its traceback is for the report, and the sweep goes on
            # (the job's manifest.json records the error; the sweep results list it).
            print(f"etbuild: internal error in {run_dir}:", file=sys.stderr)
            traceback.print_exc()
            failed.append(run_dir)
            return _objectives(cfg, run_dir)
        print(f"etbuild: done: {run_dir}")
        return _objectives(cfg, run_dir) if sweep else None

    try:
        app()
    except (HydraException, OmegaConfBaseException) as exc:
        # What Hydra does not report itself (`--help` with an unknown option): the message,
        # which names the key and the options, without Hydra's traceback.
        cause = f"\n{exc.__cause__}" if exc.__cause__ is not None else ""
        print(f"etbuild: error: {exc}{cause}", file=sys.stderr)
        sys.exit(1)
    # The sweep callback (pipeline/sweep.py) has exited 1 if a job's manifest says it failed;
    # a config without the callback still fails on the jobs this process saw fail.
    if failed:
        print(f"etbuild: {len(failed)} sweep job(s) failed:", file=sys.stderr)
        for run_dir in failed:
            print(f"  {run_dir}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
