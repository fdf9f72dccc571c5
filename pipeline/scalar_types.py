"""ScalarType codes of the program format (ExecuTorch's numbering, c10's), by torch dtype."""

from __future__ import annotations

import torch

SCALAR_TYPES: dict[torch.dtype, int] = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.bool: 11,
    torch.qint8: 12,
    torch.quint8: 13,
    torch.qint32: 14,
    torch.bfloat16: 15,
    torch.uint16: 27,
    torch.uint32: 28,
    torch.uint64: 29,
}
DTYPES: dict[int, torch.dtype] = {code: dtype for dtype, code in SCALAR_TYPES.items()}
