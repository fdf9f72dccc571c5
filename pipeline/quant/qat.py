"""Quantization-aware training steps."""

from __future__ import annotations

import torch


class DistillStep:
    """The default QAT step: match the fp32 model's outputs (MSE), plain SGD at ``lr``."""

    def __init__(self, lr: float = 1e-3) -> None:
        self.lr = lr
        self.optimizer: torch.optim.Optimizer | None = None

    def __call__(self, model, batch, teacher) -> float:
        if self.optimizer is None:
            self.optimizer = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=0.9)
        with torch.no_grad():
            target = teacher(*batch)
        loss = torch.nn.functional.mse_loss(model(*batch), target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())
