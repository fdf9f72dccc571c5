"""Latency of int8 (``+quant=ptq``) against fp32 programs on the etbuild runtime.

For each model (batch 1, one thread) the fp32 and the int8 program are built in this process
and run on the etbuild runtime, interleaved, --iters times each after a warm-up; printed: the
minimum times, their ratio int8/fp32 measured in this one run (and the ratio of medians), the
int8 program's SQNR (dB) against the fp32 eager model over --eval inputs and the ratio of the
programs' constant bytes. --profile adds the int8 program's time per operator.

    python bench/quant_latency.py [--models mobilenet] [--iters 20] [--eval 8] [--profile]

A model is a zoo name or, for a model of your own, the overrides that select it (one argument,
split at spaces), e.g. the test architectures:

    PYTHONPATH=tests python bench/quant_latency.py --models \
      "model=custom model._target_=models_for_tests.audio_cnn model.name=audio_cnn \
       model.inputs=[{name:x,shape:[1,40,101]}]"
"""

from __future__ import annotations

import argparse
import collections
import math
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
from etbuild.pipeline.stages.model import make_inputs


def build(overrides: list[str], run_dir: Path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides + ["pipeline.stop_after=reference"])
    return run_stages(STAGES, cfg, run_dir, stop_after="reference", log=lambda _: None), cfg


def sqnr_db(signal: torch.Tensor, test: torch.Tensor) -> float:
    noise = (signal.double() - test.double()).pow(2).mean().item()
    return math.inf if noise == 0 else 10 * math.log10(signal.double().pow(2).mean().item() / noise)


def bench_model(model: str, iters: int, n_eval: int, profile: bool, tmp: Path) -> None:
    overrides = model.split() if "=" in model else [f"model={model}"]
    ctx32, _ = build(overrides, tmp / "fp32")
    ctx8, cfg = build([*overrides, "+quant=ptq"], tmp / "int8")
    name = cfg.model.name
    inputs = list(ctx32.artifacts["example_inputs"])
    fp32 = runtime.load(str(tmp / "fp32" / "model.pte"))
    int8 = runtime.load(str(tmp / "int8" / "model.pte"))
    # Interleaved runs, so drift in the machine's speed hits both alike; the minimum over the
    # runs is the least disturbed by other load on the machine (the median is printed too).
    fp32.run(inputs), int8.run(inputs)  # warm-up
    t32, t8 = [], []
    for _ in range(iters):
        for prog, times in ((fp32, t32), (int8, t8)):
            t0 = time.perf_counter()
            prog.run(inputs)
            times.append(time.perf_counter() - t0)
    t_fp32, t_int8 = min(t32), min(t8)
    med = statistics.median(t8) / statistics.median(t32)
    module = ctx32.artifacts["module"]
    got, want = [], []
    for i in range(n_eval):
        x = list(make_inputs(cfg.model.inputs, cfg.model.seed + 9000 + i)) if i else inputs
        got.append(int8.run(x)[0].flatten())
        with torch.no_grad():
            want.append(module(*x).flatten())
    sqnr = sqnr_db(torch.cat(want), torch.cat(got))
    c32 = ctx32.artifacts["emit_facts"]["constant_bytes"]
    c8 = ctx8.artifacts["emit_facts"]["constant_bytes"]
    sizes = f"   constants int8/fp32 {c8 / c32:5.1%}"
    print(
        f"{name:<18} fp32 {t_fp32 * 1e3:8.2f} ms   int8 {t_int8 * 1e3:8.2f} ms   "
        f"int8/fp32 {t_int8 / t_fp32:5.2f} ({t_fp32 / t_int8:4.2f}x faster; medians {med:4.2f})   "
        f"SQNR vs fp32 eager {sqnr:6.2f} dB over {n_eval} inputs{sizes}",
        flush=True,
    )
    if profile:
        int8.run(inputs, profile=True)
        per_op: dict[str, float] = collections.defaultdict(float)
        for op, seconds in int8.last_profile:
            per_op[op] += seconds
        total = sum(per_op.values())
        for op, seconds in sorted(per_op.items(), key=lambda kv: -kv[1]):
            print(f"    {op:<40} {seconds * 1e3:8.2f} ms  {seconds / total:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet"])
    parser.add_argument("--iters", type=int, default=21)
    parser.add_argument("--eval", type=int, default=8, help="inputs for the SQNR")
    parser.add_argument("--profile", action="store_true", help="int8 time per operator")
    args = parser.parse_args()
    torch.set_num_threads(1)
    register_configs()
    with tempfile.TemporaryDirectory() as tmp:
        for i, model in enumerate(args.models):
            bench_model(model, args.iters, args.eval, args.profile, Path(tmp) / str(i))


if __name__ == "__main__":
    main()
