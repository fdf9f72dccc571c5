"""Fixtures for the runtime tests: the installed ``etbuild.runtime`` module and a builder that
turns an ``nn.Module`` into a program with etbuild's pipeline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from rt_helpers import build_with_pipeline


@pytest.fixture(scope="session")
def rt():
    """The installed runtime module."""
    import etbuild.runtime

    return etbuild.runtime


@pytest.fixture
def pipeline_program(tmp_path: Path) -> Callable[..., Path]:
    """``pipeline_program(module, inputs) -> model.pte`` built by etbuild's pipeline."""
    counter = iter(range(1000))

    def build(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Path:
        return build_with_pipeline(module, inputs, tmp_path / f"run{next(counter)}")

    return build
