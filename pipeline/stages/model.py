"""The `model` stage: instantiate the configured module and make its example inputs."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ..config import DType
from ..errors import EtbuildError
from ..runner import Context, sha256_file


def make_inputs(
    specs: list[DictConfig], seed: int, batch: int | None = None
) -> tuple[torch.Tensor, ...]:
    """Random tensors following the input specs (dim 0 replaced by ``batch`` when given)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for spec in specs:
        shape = list(spec.shape)
        if batch is not None and shape:
            shape[0] = batch
        dtype = getattr(torch, DType(spec.dtype).value)  # DType's values are torch's names
        low, high = spec.low, spec.high
        if dtype.is_floating_point:
            if low is None and high is None:
                t = torch.randn(shape, generator=gen)
            elif low is None or high is None:
                raise EtbuildError(
                    f"model.inputs[{spec.name}]: give both low and high (uniform) or neither "
                    "(standard normal)"
                )
            else:
                t = torch.rand(shape, generator=gen) * (high - low) + low
            out.append(t.to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            if low is None or high is None:
                raise EtbuildError(
                    f"model.inputs[{spec.name}] has integer dtype {spec.dtype}: set its value "
                    f"range with low and high, e.g. model.inputs.0.low=0 model.inputs.0.high=100"
                )
            out.append(torch.randint(int(low), int(high), shape, generator=gen, dtype=dtype))
    return tuple(out)


def build_module(mcfg: DictConfig) -> torch.nn.Module:
    """Instantiate ``model._target_`` with ``model.args`` under ``model.seed``."""
    torch.manual_seed(mcfg.seed)
    node = {"_target_": mcfg._target_, **OmegaConf.to_container(mcfg.args, resolve=True)}
    try:
        module = instantiate(node)
    except InstantiationException as exc:
        raise EtbuildError(
            f"model._target_={mcfg._target_!r} could not be instantiated: {exc}\n"
            "Give the dotted path of an importable callable that returns a torch.nn.Module, "
            "and its keyword arguments under model.args."
        ) from None
    if not isinstance(module, torch.nn.Module):
        raise EtbuildError(
            f"model._target_={mcfg._target_!r} returned {type(module).__name__}, "
            "not a torch.nn.Module"
        )
    return module


def read_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """The state_dict in a checkpoint file (or under its "state_dict" key), checked to be a
    dict of tensors; the command calls it before any stage runs."""
    file = Path(path).expanduser()
    how = "save one with torch.save(model.state_dict(), path)"
    if not file.is_file():
        raise EtbuildError(f"model.checkpoint={path!r}: no such file; {how}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise EtbuildError(
            f"model.checkpoint={path!r}: torch.load cannot read it ({type(exc).__name__}); {how}"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise EtbuildError(
            f"model.checkpoint={path!r} holds a {type(state).__name__}, not a state_dict (names "
            f"to tensors); {how}"
        )
    return state


def load_checkpoint(module: torch.nn.Module, path: str) -> str:
    """Load a state_dict file into ``module``; returns the file's hash."""
    state = read_checkpoint(path)
    file = Path(path).expanduser()
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise EtbuildError(f"model.checkpoint={path!r} does not fit the model: {exc}") from None
    return sha256_file(file)


def has_batchnorm(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())


def run(ctx: Context) -> None:
    mcfg = ctx.cfg.model
    module = build_module(mcfg)
    if mcfg.checkpoint:
        ctx.note_read("checkpoint", load_checkpoint(module, mcfg.checkpoint))
    elif has_batchnorm(module):
        # Seeded random weights: re-estimate batch-norm statistics on random inputs so that
        # activations keep order one through depth instead of vanishing.
        from ..zoo import reestimate_batchnorm

        batches = [
            make_inputs(mcfg.inputs, mcfg.seed + 1000 + i, batch=mcfg.bn_calibration_batch_size)
            for i in range(mcfg.bn_calibration_batches)
        ]
        reestimate_batchnorm(module, batches)
    module.eval()
    inputs = make_inputs(mcfg.inputs, mcfg.seed)
    ctx.artifacts["module"] = module
    ctx.artifacts["example_inputs"] = inputs
    params = sum(p.numel() for p in module.parameters())
    ctx.summarize(model=mcfg.name, params=params)
