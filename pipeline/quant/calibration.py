"""Calibration (and QAT training) batches for quantization."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from ..errors import EtbuildError
from ..stages.model import make_inputs


def _as_tuple(value: object, source: str) -> tuple[torch.Tensor, ...]:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in value):
        return tuple(value)
    raise EtbuildError(f"{source}: a calibration batch must be a tensor or a list of tensors")


def calibration_files(cal) -> list[Path]:
    """The ``*.pt`` batches of ``quant.calibration.folder`` ([] without a folder), checked
    before any stage runs."""
    if cal._target_ and cal.folder:
        raise EtbuildError("quant.calibration: give _target_ or folder, not both")
    if not cal.folder:
        return []
    folder = Path(cal.folder).expanduser()
    if not folder.is_dir():
        raise EtbuildError(
            f"quant.calibration.folder={cal.folder!r} is not a folder; give a folder of *.pt "
            "batches, each saved with torch.save(tensor_or_list_of_tensors, 'NNN.pt')"
        )
    files = sorted(folder.glob("*.pt"))
    if not files:
        raise EtbuildError(
            f"quant.calibration.folder={cal.folder!r} holds no *.pt files; save each batch "
            "with torch.save(tensor_or_list_of_tensors, 'NNN.pt')"
        )
    return files


def _load_batch(path: Path) -> tuple[torch.Tensor, ...]:
    try:
        value = torch.load(path, weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise EtbuildError(f"calibration batch {path} cannot be loaded: {exc}") from None
    return _as_tuple(value, str(path))


def calibration_batches(qcfg, mcfg) -> list[tuple[torch.Tensor, ...]]:
    """The batches a quant config asks for (see ``CalibrationConfig``)."""
    cal = qcfg.calibration
    n = cal.num_batches
    files = calibration_files(cal)
    if files:
        return [_load_batch(f) for f in files[:n]]
    if cal._target_:
        node = {"_target_": cal._target_, "num_batches": n,
                "inputs": OmegaConf.to_container(mcfg.inputs, resolve=True)}  # fmt: skip
        try:
            batches: Iterable = instantiate(node, _convert_="all")
        except Exception as exc:  # user code
            raise EtbuildError(
                f"quant.calibration._target_={cal._target_!r} failed: {exc}"
            ) from None
        out = [_as_tuple(b, cal._target_) for _, b in zip(range(n), batches, strict=False)]
        if not out:
            raise EtbuildError(f"quant.calibration._target_={cal._target_!r} yielded no batches")
        return out
    return [make_inputs(mcfg.inputs, mcfg.seed + 5000 + i) for i in range(n)]
