"""The `etbuild` command: a Hydra app over the packaged conf/ tree."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .config import register_configs, validate
from .errors import EtbuildError
from .paths import CONF_DIR
from .toolchain import resolve as resolve_toolchain


def check_supported(cfg: DictConfig) -> None:
    """Reject settings this version composes but cannot build yet, before any work."""
    if cfg.partitioner.name != "none":
        raise EtbuildError(
            f"partitioner.name={cfg.partitioner.name!r}: no delegate partitioners exist in "
            "this version; leave partitioner out"
        )
    # The target's toolchain (compilers, NDK, qemu) must exist before any expensive stage, and
    # the programs and pinned kernels the selection names must be readable.
    resolve_toolchain(cfg.target, need_run=cfg.pipeline.verify.enabled)
    if cfg.selection.programs or cfg.selection.operators:
        from .stages.select import configured

        configured(cfg.selection)


def build(cfg: DictConfig, run_dir: Path) -> None:
    """Run the pipeline for a composed config into ``run_dir``."""
    from .runner import run_stages
    from .stage_cache import StageCache, cache_root, stage_cache_key
    from .stages import STAGES

    cfg = validate(cfg)
    check_supported(cfg)
    stop = cfg.pipeline.stop_after
    cache = StageCache(cache_root(cfg), stage_cache_key(cfg)) if cfg.pipeline.cache else None
    run_stages(
        STAGES, cfg, run_dir, stop_after=stop.value if stop is not None else None, cache=cache
    )


def main() -> None:
    # torch 2.13's own export internals trip this deprecation; it is not the user's to fix.
    warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec", category=FutureWarning)
    register_configs()
    failed: list[Path] = []

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def app(cfg: DictConfig) -> None:
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        print(f"etbuild: {cfg.model.name} -> {run_dir}")
        try:
            build(cfg, run_dir)
        except EtbuildError as exc:
            print(f"etbuild: error: {exc}", file=sys.stderr)
            if hydra_cfg.mode != RunMode.MULTIRUN:
                sys.exit(1)
            failed.append(run_dir)  # a sweep goes on with its other jobs
            return
        print(f"etbuild: done: {run_dir}")

    app()
    if failed:
        print(f"etbuild: {len(failed)} sweep job(s) failed:", file=sys.stderr)
        for run_dir in failed:
            print(f"  {run_dir}", file=sys.stderr)
        sys.exit(1)
