"""Re-estimation of BatchNorm running statistics for randomly initialised models."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import EtbuildError


def reestimate_batchnorm(model: nn.Module, batches: Iterable[tuple[Tensor, ...] | Tensor]) -> None:
    """Recompute every BatchNorm's running mean/var as the average over ``batches``.

    Each batch is a tuple of positional inputs (a bare tensor is taken as a 1-tuple).
    Only the BatchNorm layers run in training mode (dropout etc. stay in eval), the pass
    runs under ``torch.no_grad()``, and the model is left in eval mode.
    """
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    model.eval()
    if not bns:
        return
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative moving average over the batches
        bn.train()
    seen = 0
    try:
        with torch.no_grad():
            for batch in batches:
                model(*((batch,) if isinstance(batch, Tensor) else batch))
                seen += 1
    finally:
        for bn, momentum in zip(bns, momenta, strict=True):
            bn.momentum = momentum
        model.eval()
    if seen == 0:
        raise EtbuildError(
            "reestimate_batchnorm got no batches: pass at least one batch of example inputs"
        )
