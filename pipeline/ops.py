"""The operator registry: what ``ops_yaml/`` says the runtime has, as torch sees it.

The YAML is loaded and checked by the operator database (``codegen/opdb.py``), the same loader
codegen uses; this module adds each entry's torch schema and torch dtypes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from ..codegen.opdb import CodegenError, OpEntry, load_entries
from .errors import EtbuildError
from .paths import OPS_YAML_DIR
from .scalar_types import TORCH_DTYPES


@dataclass(frozen=True)
class OpDef:
    """One operator the runtime provides."""

    qualified_name: str  # "aten::convolution"
    overload: str  # "out" ("" for a default overload)
    schema: torch._C.FunctionSchema
    dtypes: dict[str, tuple[torch.dtype, ...]]  # argument name -> supported dtypes
    in_place: tuple[str, ...]
    source: str  # yaml file it came from
    # tensor argument -> the dim orders it may have besides contiguous (ops_yaml `dim_orders`)
    dim_orders: dict[str, tuple[tuple[int, ...], ...]]

    @property
    def key(self) -> str:
        return f"{self.qualified_name}.{self.overload}" if self.overload else self.qualified_name


def _opdef(entry: OpEntry) -> OpDef:
    where = f"{entry.source}: {entry.schema.key}"
    try:
        schema = torch._C.parse_schema(entry.schema.text)
    except RuntimeError as exc:
        raise EtbuildError(f"{where}: torch cannot parse the schema: {exc}") from None
    dtypes = {}
    for arg, names in entry.dtypes.items():
        missing = [n for n in names if n not in TORCH_DTYPES]
        if missing:
            raise EtbuildError(f"{where} argument {arg}: torch has no dtype {', '.join(missing)}")
        dtypes[arg] = tuple(TORCH_DTYPES[n] for n in names)
    return OpDef(
        schema.name,
        schema.overload_name,
        schema,
        dtypes,
        entry.in_place,
        entry.source,
        entry.dim_orders,
    )


@functools.lru_cache(maxsize=4)
def load_ops(ops_dir: Path = OPS_YAML_DIR) -> dict[str, OpDef]:
    """All ops in ``ops_dir``, keyed by "ns::name.overload"."""
    try:
        entries = load_entries(ops_dir)
    except CodegenError as exc:
        raise EtbuildError(f"ops_yaml: {exc}") from None
    return {op.key: op for op in map(_opdef, entries)}


def ops_yaml_digest(ops_dir: Path = OPS_YAML_DIR) -> str:
    """A hash of the operator YAML, for the manifest."""
    import hashlib

    from .runner import tree_digest

    h = hashlib.sha256()
    tree_digest(h, ops_dir, ("*.yaml",))
    return h.hexdigest()


def _schema_key(op: torch._ops.OpOverload) -> str:
    schema = op._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


# Arguments that describe a new tensor's storage (full_like, _to_copy): an out variant takes
# them from its out tensor instead.
TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _inputs_signature(schema: torch._C.FunctionSchema) -> list[tuple[str, str]]:
    return [
        (a.name, str(a.type))
        for a in schema.arguments
        if not a.is_out and a.name not in TENSOR_OPTIONS
    ]


@functools.cache
def out_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The ``.out`` overload of a functional ATen op, or None when ATen has none.

    An out variant has the functional op's arguments (less the tensor options), then
    keyword-only mutable ``out`` tensors, one per return.
    """
    schema = op._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return op  # already an out (or in-place) variant
    packet = op.overloadpacket
    want = _inputs_signature(schema)
    for name in packet.overloads():
        cand = getattr(packet, name)._schema
        outs = [a for a in cand.arguments if a.is_out]
        if outs and len(outs) == len(schema.returns) and _inputs_signature(cand) == want:
            return getattr(packet, name)
    return None


def kernel_key_for(op: torch._ops.OpOverload) -> str | None:
    """The ops_yaml key that would run ``op`` (its out variant), or None if ATen has none."""
    out = out_variant(op)
    return _schema_key(out) if out is not None else None
