"""Seed programs for the fuzzer: small zoo programs in fp32 with a dynamic batch, in int8
(``+quant=ptq``), int8 with its weights copied into planned memory at load
(``memory.constants=copy``: a mutable data segment) and an attention model with int64 token
inputs, built by the pipeline up to ``emit``.

    python tests/fuzz/make_corpus.py DIR
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

SEEDS = {
    "mlp_fp32_dynamic": ["model=mlp", "model.args.hidden=[16,16]"],
    "mlp_int8": ["model=mlp", "+quant=ptq", "model.dynamic_dims=[]", "model.args.hidden=[16]"],
    "mlp_int8_copied_constants": [
        "model=mlp",
        "+quant=ptq",
        "model.dynamic_dims=[]",
        "model.args.hidden=[16]",
        "+memory=stm32h7",
        "memory.constants=copy",
    ],
    "mlp_fp32_static": ["model=mlp", "model.dynamic_dims=[]", "model.args.hidden=[16]"],
    "transformer_fp32": [
        "model=transformer",
        "model.args.vocab_size=50",
        "model.args.dim=16",
        "model.args.heads=2",
        "model.args.layers=1",
        "model.args.ffn_dim=32",
        "model.args.max_seq_len=8",
        "model.inputs.0.shape=[1,8]",
        "model.inputs.0.high=50",
    ],
}


def make_corpus(out: Path) -> list[Path]:
    from hydra import compose, initialize_config_dir

    from etbuild.pipeline.config import register_configs, validate
    from etbuild.pipeline.paths import CONF_DIR
    from etbuild.pipeline.runner import run_stages
    from etbuild.pipeline.stages import STAGES

    register_configs()
    out.mkdir(parents=True, exist_ok=True)
    seeds = []
    with tempfile.TemporaryDirectory(prefix="etb_corpus_") as tmp:
        for name, overrides in SEEDS.items():
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("config", overrides=[*overrides, "pipeline.cache=false"])
            run_dir = Path(tmp) / name
            run_stages(STAGES, validate(cfg), run_dir, stop_after="emit", log=lambda _: None)
            seeds.append(out / f"{name}.pte")
            shutil.copy(run_dir / "model.pte", seeds[-1])
    return seeds


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for seed in make_corpus(Path(sys.argv[1])):
        print(f"{seed} ({seed.stat().st_size} B)")
