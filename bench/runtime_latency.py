"""Latency of the etbuild runtime against torch eager and ExecuTorch's portable runtime.

For each model (batch 1, one thread) the same model.pte runs on the etbuild runtime and on
ExecuTorch's runtime, and the eager module runs in torch; medians over --iters runs after a
warm-up, printed as ratios measured in this one process. Then the framework tax: time per
instruction of a 1,000-instruction chain of tiny adds on both runtimes.

    python bench/runtime_latency.py [--models mobilenet resnet18] [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from etbuild import runtime
from etbuild.pipeline.config import register_configs
from etbuild.pipeline.paths import CONF_DIR
from etbuild.pipeline.runner import run_stages
from etbuild.pipeline.stages import STAGES


def median_seconds(fn, iters: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def build(overrides: list[str], run_dir: Path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides + ["pipeline.stop_after=reference"])
    return run_stages(STAGES, cfg, run_dir, stop_after="reference", log=lambda _: None)


def executorch_method(path: Path):
    try:
        from executorch.runtime import Runtime
    except ImportError:
        return None
    return Runtime.get().load_program(str(path)).load_method("forward")


def bench_model(name: str, iters: int, tmp: Path) -> None:
    ctx = build([f"model={name}"], tmp / name)
    pte = tmp / name / "model.pte"
    inputs = list(ctx.artifacts["example_inputs"])
    module = ctx.artifacts["module"]
    ours = runtime.load(str(pte))
    t_ours = median_seconds(lambda: ours.run(inputs), iters)
    with torch.no_grad():
        t_eager = median_seconds(lambda: module(*inputs), iters)
    line = (
        f"{name:<20} etbuild {t_ours * 1e3:8.2f} ms   torch eager {t_eager * 1e3:8.2f} ms"
        f"   etbuild/eager {t_ours / t_eager:5.2f}"
    )
    et = executorch_method(pte)
    if et is not None:
        t_et = median_seconds(lambda: et.execute(inputs), max(3, iters // 5))
        line += f"   executorch portable {t_et * 1e3:9.2f} ms   speedup {t_et / t_ours:6.1f}x"
    print(line, flush=True)


class AddChain(torch.nn.Module):
    """1,000 dependent tiny adds: almost all framework, almost no arithmetic."""

    def __init__(self, length: int = 1000) -> None:
        super().__init__()
        self.length = length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.length):
            x = x + float(i % 7)
        return x


def bench_framework_tax(iters: int, tmp: Path) -> None:
    overrides = [
        "model=custom",
        "model._target_=runtime_latency.AddChain",
        "model.name=add_chain",
        "model.inputs=[{name:x,shape:[4]}]",
    ]
    ctx = build(overrides, tmp / "chain")
    pte = tmp / "chain" / "model.pte"
    n = len(ctx.artifacts["program"].instructions)
    x = [torch.randn(4)]
    ours = runtime.load(str(pte))
    t_ours = median_seconds(lambda: ours.run(x), iters)
    line = f"framework tax ({n} instructions): etbuild {t_ours / n * 1e9:7.1f} ns/instruction"
    et = executorch_method(pte)
    if et is not None:
        t_et = median_seconds(lambda: et.execute(x), iters)
        line += f"   executorch {t_et / n * 1e9:7.1f} ns/instruction   ratio {t_ours / t_et:5.2f}"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet", "resnet18"])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    register_configs()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            bench_model(name, args.iters, Path(tmp))
        bench_framework_tax(args.iters, Path(tmp))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).parent))  # AddChain is importable as a _target_
    main()
