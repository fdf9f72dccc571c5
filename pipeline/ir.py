"""The program IR between `out_variant` and `emit`: values, kernel calls and delegate calls.

Every op is already its ``.out`` form: an instruction names its ops_yaml entry and holds one
argument per schema argument (outputs included), so planning and emission need no torch graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .ops import OpDef


@dataclass(eq=False)
class TensorValue:
    """A tensor of the program: a constant, an input, or an activation the planner places.

    ``shape`` is exact for static tensors and the upper bound for dynamic ones. A value with
    ``alias_of`` shares that value's storage, ``alias_offset`` bytes into it (a view that
    needs no data movement, or a slice of a concatenation that its producer writes in place).
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    dynamic: bool = False
    sym_shape: tuple[str, ...] = ()
    data: torch.Tensor | None = None
    alias_of: TensorValue | None = None
    alias_offset: int = 0
    is_input: bool = False
    is_output: bool = False
    # The order of the dims in memory, outermost first (pipeline/layout.py); None: contiguous.
    dim_order: tuple[int, ...] | None = None

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def nbytes(self) -> int:
        numel = 1
        for s in self.shape:
            numel *= s
        return numel * self.dtype.itemsize

    def storage_offset(self) -> int:
        """Bytes from the start of the storage root to this value's data."""
        offset, v = 0, self
        while v.alias_of is not None:
            offset += v.alias_offset
            v = v.alias_of
        return offset

    def storage_root(self) -> TensorValue:
        v = self
        while v.alias_of is not None:
            v = v.alias_of
        return v


@dataclass(eq=False)
class SymValue:
    """An integer computed at run time (a dynamic size)."""

    name: str


@dataclass
class Instruction:
    """A kernel call: ``args`` has one entry per schema argument, outputs included."""

    op: OpDef
    args: list[Any]
    returns: list[TensorValue | SymValue]
    source: str = ""

    def tensors(self) -> Iterator[TensorValue]:
        """Every tensor the instruction reads or writes."""
        stack: list[Any] = list(self.args) + list(self.returns)
        while stack:
            a = stack.pop()
            if isinstance(a, TensorValue):
                yield a
            elif isinstance(a, (list, tuple)):
                stack.extend(a)


@dataclass(eq=False)
class Delegate:
    """A backend's preprocessed partition: the blob its C++ half runs.

    ``compile_specs`` are (key, bytes) pairs the backend reads at init."""

    backend_id: str
    processed: bytes
    compile_specs: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class DelegateCall:
    """A call of a delegate: ``args`` are its inputs, ``returns`` its outputs, in the order
    of the partition's placeholders and outputs."""

    delegate: Delegate
    args: list[TensorValue]
    returns: list[TensorValue]
    source: str = ""

    def tensors(self) -> Iterator[TensorValue]:
        yield from self.args
        yield from self.returns


@dataclass
class Program:
    """One method ("forward") ready for planning and emission."""

    inputs: list[TensorValue]
    outputs: list[TensorValue]
    instructions: list[Instruction | DelegateCall]
    in_spec: str = ""
    out_spec: str = ""
    values: list[TensorValue] = field(default_factory=list)  # every tensor, definition order
