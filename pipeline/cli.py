"""The `etbuild` command: a Hydra app over the packaged conf/ tree."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .config import QuantScheme, TargetKind, register_configs
from .errors import EtbuildError
from .paths import CONF_DIR


def check_supported(cfg: DictConfig) -> None:
    """Reject settings this version composes but cannot build yet, before any work."""
    if cfg.quant.scheme != QuantScheme.none:
        raise EtbuildError(
            f"quant.scheme={cfg.quant.scheme.value} is not supported by this version of "
            "etbuild; use +quant=none (or leave quant out) for an fp32 program"
        )
    if cfg.partitioner.name != "none":
        raise EtbuildError(
            f"partitioner.name={cfg.partitioner.name!r}: no delegate partitioners exist in "
            "this version; leave partitioner out"
        )
    if cfg.target.kind != TargetKind.host:
        raise EtbuildError(
            f"target.kind={cfg.target.kind.value} is not supported by this version of "
            "etbuild; use +target=host"
        )


def build(cfg: DictConfig, run_dir: Path) -> None:
    """Run the pipeline for a composed config into ``run_dir``."""
    from .runner import run_stages
    from .stages import STAGES

    check_supported(cfg)
    stop = cfg.pipeline.stop_after
    run_stages(STAGES, cfg, run_dir, stop_after=stop.value if stop is not None else None)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _app(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    print(f"etbuild: {cfg.model.name} -> {run_dir}")
    try:
        build(cfg, run_dir)
    except EtbuildError as exc:
        print(f"etbuild: error: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"etbuild: done: {run_dir}")


def main() -> None:
    register_configs()
    _app()
