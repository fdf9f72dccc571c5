"""Time from an instantiated model to a program file on disk: etbuild vs ExecuTorch.

etbuild: the export, lower, out_variant, plan and emit stages (model.pte written).
ExecuTorch: torch.export -> to_edge -> to_executorch -> save, the documented flow.
Both start from the same module and inputs in this process. Each flow runs once untimed (so
neither pays the other's one-time import and tracing warm-up), then `--repeat` timed times,
alternating; the best time of each is compared.

    python bench/export_time.py [--model mobilenet] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from etbuild.pipeline.config import register_configs
from etbuild.pipeline.paths import CONF_DIR
from etbuild.pipeline.runner import Context, StageRecord
from etbuild.pipeline.stages import STAGES


def etbuild_once(cfg, module, inputs, out_dir: Path) -> float:
    ctx = Context(cfg=cfg, run_dir=out_dir)
    ctx.artifacts.update(module=module, example_inputs=inputs)
    wanted = ["export", "lower", "out_variant", "plan", "emit"]
    t0 = time.perf_counter()
    for stage in STAGES:
        if stage.name in wanted:
            ctx.records.append(StageRecord(stage.name))
            stage.fn(ctx)
    elapsed = time.perf_counter() - t0
    assert (out_dir / "model.pte").stat().st_size > 0
    return elapsed


def executorch_once(module, inputs, out_dir: Path) -> float:
    import torch
    from executorch.exir import to_edge

    t0 = time.perf_counter()
    ep = torch.export.export(module, inputs)
    program = to_edge(ep).to_executorch()
    with open(out_dir / "et.pte", "wb") as f:
        program.write_to_file(f)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={args.model}"])
    setup = Context(cfg=cfg, run_dir=Path(tempfile.mkdtemp()))
    setup.records.append(StageRecord("model"))
    STAGES[0].fn(setup)
    module, inputs = setup.artifacts["module"], setup.artifacts["example_inputs"]

    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warmup"
        warm.mkdir()
        etbuild_once(cfg, module, inputs, warm)
        executorch_once(module, inputs, warm)
        for i in range(args.repeat):
            run_dir = Path(tmp) / f"run{i}"
            run_dir.mkdir()
            ours.append(etbuild_once(cfg, module, inputs, run_dir))
            theirs.append(executorch_once(module, inputs, run_dir))
            print(f"run {i}: etbuild {ours[-1]:.2f}s  executorch {theirs[-1]:.2f}s")
    best_ours, best_theirs = min(ours), min(theirs)
    print(f"model: {args.model}")
    print(f"etbuild    instantiated model -> model.pte: {best_ours:.2f}s (best of {args.repeat})")
    print(f"executorch export -> to_edge -> to_executorch -> save: {best_theirs:.2f}s")
    print(f"ratio etbuild / executorch: {best_ours / best_theirs:.2f}")


if __name__ == "__main__":
    main()
