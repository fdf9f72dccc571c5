"""The operator registry: what ``ops_yaml/`` says the runtime has.

``ops_yaml/*.yaml`` is in ExecuTorch's ``functions.yaml`` format: each entry has ``func`` (the
full ``.out`` schema; the namespace defaults to ``aten``) or ``op`` (a name only), optional
``type_alias`` (alias -> dtype names) and ``kernels`` whose ``arg_meta`` maps arguments to
aliases. etbuild adds one optional key, ``in_place``: the arguments whose storage the output
may share (elementwise ops), which the memory planner uses.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from .errors import EtbuildError
from .paths import OPS_YAML_DIR

# ExecuTorch dtype names in type_alias lists -> torch dtypes.
DTYPE_NAMES: dict[str, torch.dtype] = {
    "Byte": torch.uint8,
    "Char": torch.int8,
    "Short": torch.int16,
    "Int": torch.int32,
    "Long": torch.int64,
    "Half": torch.float16,
    "Float": torch.float32,
    "Double": torch.float64,
    "Bool": torch.bool,
    "BFloat16": torch.bfloat16,
}
DTYPE_TO_NAME = {v: k for k, v in DTYPE_NAMES.items()}


@dataclass(frozen=True)
class OpDef:
    """One operator the runtime provides."""

    qualified_name: str  # "aten::convolution"
    overload: str  # "out" ("" for a default overload)
    schema: torch._C.FunctionSchema
    dtypes: dict[str, tuple[torch.dtype, ...]]  # argument name -> supported dtypes
    in_place: tuple[str, ...]
    source: str  # yaml file it came from

    @property
    def key(self) -> str:
        return f"{self.qualified_name}.{self.overload}" if self.overload else self.qualified_name


def _parse_entry(entry: dict, source: str) -> OpDef:
    text = entry.get("func")
    if text is None:
        raise EtbuildError(f"{source}: entry {entry!r} has no 'func' schema; every op needs one")
    if "::" not in text.split("(", 1)[0]:
        text = "aten::" + text
    try:
        schema = torch._C.parse_schema(text)
    except RuntimeError as exc:
        raise EtbuildError(f"{source}: cannot parse schema {text!r}: {exc}") from None
    aliases: dict[str, list[str]] = entry.get("type_alias") or {}
    dtypes: dict[str, tuple[torch.dtype, ...]] = {}
    for kernel in entry.get("kernels") or []:
        for arg, meta in (kernel.get("arg_meta") or {}).items():
            alias = meta[0] if isinstance(meta, list) else meta
            names = aliases.get(alias, [alias])
            try:
                found = tuple(DTYPE_NAMES[n] for n in names)
            except KeyError as exc:
                raise EtbuildError(f"{source}: {schema.name}: unknown dtype {exc}") from None
            dtypes[arg] = tuple(dict.fromkeys(dtypes.get(arg, ()) + found))
    in_place = tuple(entry.get("in_place") or ())
    arg_names = {a.name for a in schema.arguments}
    for name in list(dtypes) + list(in_place):
        if name not in arg_names:
            raise EtbuildError(f"{source}: {schema.name}: '{name}' is not an argument")
    return OpDef(schema.name, schema.overload_name, schema, dtypes, in_place, source)


@functools.lru_cache(maxsize=4)
def load_ops(ops_dir: Path = OPS_YAML_DIR) -> dict[str, OpDef]:
    """All ops in ``ops_dir``, keyed by "ns::name.overload"."""
    ops: dict[str, OpDef] = {}
    files = sorted(ops_dir.glob("*.yaml"))
    if not files:
        raise EtbuildError(f"no operator YAML found in {ops_dir}; reinstall etbuild")
    for path in files:
        for entry in yaml.safe_load(path.read_text()) or []:
            op = _parse_entry(entry, path.name)
            if op.key in ops:
                raise EtbuildError(f"{path.name}: {op.key} is listed twice")
            ops[op.key] = op
    return ops


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


@functools.cache
def out_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The ``.out`` overload of a functional ATen op, or None when ATen has none.

    An out variant has the functional op's arguments, then keyword-only mutable ``out``
    tensors, one per return.
    """
    schema = op._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return op  # already an out (or in-place) variant
    packet = op.overloadpacket
    want = [(a.name, str(a.type)) for a in schema.arguments]
    for name in packet.overloads():
        cand = getattr(packet, name)
        args = cand._schema.arguments
        outs = [a for a in args if a.is_out]
        if not outs or len(outs) != len(schema.returns):
            continue
        if [(a.name, str(a.type)) for a in args if not a.is_out] == want:
            return cand
    return None


def kernel_key_for(op: torch._ops.OpOverload) -> str | None:
    """The ops_yaml key that would run ``op`` (its out variant), or None if ATen has none."""
    out = out_variant(op)
    return _schema_key(out) if out is not None else None
