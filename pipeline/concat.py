"""Concatenation in place: the producers of a ``cat``'s inputs write straight into their
slices of its output, and the copy is dropped.

A U-Net's skip connections meet the upsampled path in a ``cat``; copying both inputs into a
third buffer makes that the peak of the whole model. When each input's slice of the output
is one contiguous byte range (every dimension before the cat dimension has size 1, as for
a batch-1 NCHW tensor along channels), each input becomes a view of the output at its byte
offset, so the planner gives all of them one storage and no instruction copies anything.

An input qualifies when an instruction of the program writes it (not a program input or
output, not a constant, not itself a view) and it is not already a slice of another
concatenation; every input of a cat must qualify, with the output's dtype, and no shape may
be dynamic.
"""

from __future__ import annotations

import dataclasses

from .ir import Instruction, Program, TensorValue

CAT = "aten::cat.out"


def _contiguous_slices(cat: Instruction) -> list[tuple[TensorValue, int]] | None:
    """(input, byte offset in the output) for each input, or None when the cat cannot be
    done in place."""
    tensors, dim, out = cat.args[0], cat.args[1], cat.args[-1]
    if not isinstance(out, TensorValue) or out.dynamic or out.alias_of is not None:
        return None
    rank = len(out.shape)
    dim = dim + rank if dim < 0 else dim
    outer = 1
    for s in out.shape[:dim]:
        outer *= s
    if outer != 1 or not tensors:
        return None
    slices = []
    offset = 0
    for t in tensors:
        if (
            not isinstance(t, TensorValue)
            or t.is_constant
            or t.is_input
            or t.is_output
            or t.dynamic
            or t.alias_of is not None
            or t.dtype != out.dtype
            or t.nbytes == 0
            or any(t is s for s, _ in slices)
        ):
            return None
        slices.append((t, offset))
        offset += t.nbytes
    return slices if offset == out.nbytes else None


def concat_in_place(program: Program) -> tuple[Program, int]:
    """The program with every qualifying cat done by its producers; (program, cats removed).

    The inputs of a removed cat become views of its output (their ``alias_of`` is set)."""
    written = {
        id(r) for ins in program.instructions for r in ins.returns if isinstance(r, TensorValue)
    }
    kept = []
    done = 0
    for ins in program.instructions:
        slices = (
            _contiguous_slices(ins) if isinstance(ins, Instruction) and ins.op.key == CAT else None
        )
        if slices is None or not all(id(t) in written for t, _ in slices):
            kept.append(ins)
            continue
        out = ins.args[-1]
        for t, offset in slices:
            t.alias_of, t.alias_offset = out, offset
        done += 1
    if not done:
        return program, 0
    return dataclasses.replace(program, instructions=kept), done
