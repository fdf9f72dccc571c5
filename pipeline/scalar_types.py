"""Dtypes of the program format by torch dtype: codes and names from the program schema
(``codegen/dtypes.py`` reads ``runtime_src/schema/scalar_type.fbs``); this module adds only
the torch dtype of each name."""

from __future__ import annotations

import torch

from ..codegen.dtypes import SCALAR_TYPES as CODES_BY_NAME

# Schema name -> torch dtype, for the types torch and the runtime share.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "Byte": torch.uint8,
    "Char": torch.int8,
    "Short": torch.int16,
    "Int": torch.int32,
    "Long": torch.int64,
    "Half": torch.float16,
    "Float": torch.float32,
    "Double": torch.float64,
    "Bool": torch.bool,
    "QInt8": torch.qint8,
    "QUInt8": torch.quint8,
    "QInt32": torch.qint32,
    "BFloat16": torch.bfloat16,
    "UInt16": torch.uint16,
    "UInt32": torch.uint32,
    "UInt64": torch.uint64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {d: n for n, d in TORCH_DTYPES.items()}
SCALAR_TYPES: dict[torch.dtype, int] = {d: CODES_BY_NAME[n] for n, d in TORCH_DTYPES.items()}
DTYPES: dict[int, torch.dtype] = {code: dtype for dtype, code in SCALAR_TYPES.items()}
