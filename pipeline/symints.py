"""Symbolic-size ops: shape arithmetic that a dynamic-shape program computes at run time.

They run as kernels on Int values, under the names ExecuTorch's runtime registers.
"""

from __future__ import annotations

import operator

import torch

SYM_OPS: dict[object, str] = {
    torch.ops.aten.sym_size.int: "aten::sym_size.int",
    torch.ops.aten.sym_numel.default: "aten::sym_numel",
    operator.add: "executorch_prim::add.Scalar",
    operator.sub: "executorch_prim::sub.Scalar",
    operator.mul: "executorch_prim::mul.Scalar",
    operator.floordiv: "executorch_prim::floordiv.Scalar",
}
