"""Size of the tailored runtime (core + kernels + registration, stripped) against the all-ops
runtime, both measured in one build of the `build` stage for the same target and flags.

Runs the pipeline through the `build` stage for each model (into a temporary run directory;
the build cache is the usual one, `$ETBUILD_CACHE_DIR` or `~/.cache/etbuild`) and prints
the sizes and the ratio tailored / all-ops. ExecuTorch publishes 467 KB for its dtype-selective
MobileNetV2 runtime; that figure is printed for reference.

    python bench/runtime_size.py [--models mobilenet] [--target host]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from etbuild.pipeline.cli import check_supported
from etbuild.pipeline.config import register_configs, validate
from etbuild.pipeline.paths import CONF_DIR
from etbuild.pipeline.runner import run_stages
from etbuild.pipeline.stages import STAGES

EXECUTORCH_MOBILENET_V2_KB = 467


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", default="mobilenet")
    p.add_argument("--target", default="host")
    args = p.parse_args()
    register_configs()
    for model in args.models.split(","):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(
                config_name="config", overrides=[f"model={model}", f"+target={args.target}"]
            )
        cfg = validate(cfg)
        check_supported(cfg)
        with tempfile.TemporaryDirectory() as tmp:
            ctx = run_stages(STAGES, cfg, Path(tmp) / "run", stop_after="build")
        sizes = ctx.artifacts["runtime_sizes"]
        print(f"{model} ({args.target})")
        for label, key in (
            ("core", "core_bytes"),
            ("kernels", "kernels_bytes"),
            ("registration", "registration_bytes"),
            ("tailored runtime", "tailored_bytes"),
            ("all-ops runtime", "all_ops_bytes"),
        ):
            print(f"  {label:<18} {sizes[key] / 1024:8.1f} KiB")
        print(f"  tailored / all-ops: {sizes['tailored_bytes'] / sizes['all_ops_bytes']:.3f}")
        print(
            f"  tailored / ExecuTorch's published dtype-selective MobileNetV2 "
            f"({EXECUTORCH_MOBILENET_V2_KB} KB): "
            f"{sizes['tailored_bytes'] / 1000 / EXECUTORCH_MOBILENET_V2_KB:.3f}"
        )


if __name__ == "__main__":
    main()
