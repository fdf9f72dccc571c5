"""A toy delegate backend, plugged in the way any backend is (``partitioner._target_``): it
takes chains of fp32 add, sub, mul and relu whose operands have the output's shape (or one
element), and runs them in C++ one element at a time (toy_backend.cpp).

Blob ("ETOY", little-endian): u32 inputs, constants, steps, outputs; u64 elements per tensor;
each constant as u64 numel (1 or the element count) and its floats; each step as u32 op,
operand a, operand b, result; each output as u32 slot. Slots: the inputs, the constants, then
one per step, in order.
"""

from __future__ import annotations

import struct
from pathlib import Path

import torch
from torch import fx

from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.ir import Delegate
from etbuild.pipeline.partition import Partition

aten = torch.ops.aten
OPS = {aten.add.Tensor: 0, aten.sub.Tensor: 1, aten.mul.Tensor: 2, aten.relu.default: 3}
MAX_SLOTS = 256  # the C++ side's register file


class ToyBackend:
    id = "EtbToyBackend"
    runtime_dir = str(Path(__file__).resolve().parent)

    def __init__(self, max_steps: int = 64) -> None:
        self.max_steps = max_steps

    def check(self, node: fx.Node, graph) -> str | None:
        if node.target not in OPS:
            return "the toy backend runs add, sub, mul and relu only"
        out = node.meta["val"]
        if out.dtype != torch.float32:
            return f"the toy backend runs float32 only, not {out.dtype}"
        if node.kwargs.get("alpha", 1) != 1:
            return "the toy backend has no alpha"
        for a in node.args:
            v = a.meta.get("val") if isinstance(a, fx.Node) else None
            if not isinstance(v, torch.Tensor) or v.dtype != torch.float32:
                return "an operand is not a float32 tensor"
            if v.shape != out.shape and v.numel() != 1:
                return "an operand needs broadcasting"
        return None

    def preprocess(self, partition: Partition) -> Delegate:
        g = partition.graph
        slots: dict[fx.Node, int] = {}
        placeholders = [n for n in g.fx_graph.nodes if n.op == "placeholder"]
        inputs = [n for n in placeholders if n.name not in g.constants]
        consts = [n for n in placeholders if n.name in g.constants]
        for n in inputs + consts:
            slots[n] = len(slots)
        steps, numel, outputs = [], None, []
        for n in g.fx_graph.nodes:
            if n.op == "call_function":
                a = slots[n.args[0]]
                b = slots[n.args[1]] if len(n.args) > 1 else a
                slots[n] = len(slots)
                steps.append((OPS[n.target], a, b, slots[n]))
                numel = n.meta["val"].numel()
            elif n.op == "output":
                outputs = [slots[o] for o in n.args[0]]
        if len(steps) > self.max_steps or len(slots) > MAX_SLOTS:
            raise EtbuildError(f"toy backend: a partition of {len(steps)} steps is too long")
        blob = bytearray(b"ETOY")
        blob += struct.pack("<4IQ", len(inputs), len(consts), len(steps), len(outputs), numel)
        for c in consts:
            data = g.constants[c.name].to(torch.float32).contiguous().reshape(-1)
            blob += struct.pack("<Q", data.numel()) + data.numpy().tobytes()
        for step in steps:
            blob += struct.pack("<4I", *step)
        blob += struct.pack(f"<{len(outputs)}I", *outputs)
        return Delegate(self.id, bytes(blob), [("max_steps", str(self.max_steps).encode())])
