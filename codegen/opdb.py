"""The operator database: ``ops_yaml/*.yaml`` loaded and checked once, for codegen and the
pipeline alike.

Each entry is in ExecuTorch's ``functions.yaml`` format: ``func`` (the full ``.out`` schema; the
namespace defaults to ``aten``), optional ``type_alias`` (alias -> dtype names) and one kernel
whose ``arg_meta`` maps tensor arguments to aliases. etbuild's own keys are described at the
top of ``ops_yaml/portable.yaml`` (``in_place``, ``fuses_clamp``, ``prepare``,
``dim_orders``, ``kernel_source``). Dtype names are
the program schema's (``codegen/dtypes.py``). PyYAML only, no torch: the build runs this
before the package is installed; ``pipeline/ops.py`` adds torch's view of each entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .dtypes import SCALAR_TYPES


class CodegenError(Exception):
    """A problem in ops_yaml or the selection, with a message naming the entry."""


@dataclass(frozen=True)
class Arg:
    """One schema argument."""

    name: str
    type: str  # base type without alias annotation: "Tensor", "int[]", "Scalar?", ...
    is_write: bool  # Tensor(a!)
    kwarg_only: bool


@dataclass(frozen=True)
class Schema:
    """A parsed operator schema."""

    namespace: str
    name: str
    overload: str
    args: tuple[Arg, ...]
    returns: tuple[str, ...]
    text: str = ""  # the schema as written, namespace included: "aten::add.out(...) -> ..."

    @property
    def key(self) -> str:
        base = f"{self.namespace}::{self.name}"
        return f"{base}.{self.overload}" if self.overload else base


@dataclass
class OpEntry:
    """One ops_yaml entry ready for generation.

    ``dtypes`` are the dtypes per tensor argument that the runtime is built with (the
    selection's); ``supported`` are the ones ops_yaml lists (empty: same as ``dtypes``).
    """

    schema: Schema
    kernel_name: str
    dtypes: dict[str, list[str]] = field(default_factory=dict)
    supported: dict[str, list[str]] = field(default_factory=dict)
    fuses_clamp: bool = False  # ops_yaml `fuses_clamp`: applies a fused activation clamp
    prepares: bool = False  # ops_yaml `prepare`: has a load-time hook NAME_prepare
    in_place: tuple[str, ...] = ()  # ops_yaml `in_place`: inputs the output may overwrite
    # ops_yaml `dim_orders`: per tensor argument, the dim orders it may have besides contiguous
    dim_orders: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    source: str = ""  # the YAML file the entry is in
    kernel_source: str = ""  # ops_yaml `kernel_source`: the file defining the kernel

    def supported_dtypes(self, arg: str) -> list[str] | None:
        """ops_yaml's dtypes of tensor argument ``arg``; None when it lists none."""
        return (self.supported or self.dtypes).get(arg)


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


_ARG_RE = re.compile(
    r"^(?P<type>[A-Za-z]+)(?P<alias>\([a-z]!?\))?(?P<suffix>(\[\d*\])?\??)\s+"
    r"(?P<name>\w+)(\s*=\s*.*)?$"
)


def parse_schema(text: str) -> Schema:
    """Parses an ATen-style schema: ``ns::name.overload(args) -> returns``."""
    m = re.match(r"^\s*([\w:]+)(?:\.(\w+))?\((.*)\)\s*->\s*(.*)$", text)
    if not m:
        raise CodegenError(f"cannot parse schema {text!r}")
    qual, overload, args_text, ret_text = m.groups()
    ns, _, name = qual.rpartition("::")
    args, kwarg_only = [], False
    for part in _split_top(args_text):
        if part == "*":
            kwarg_only = True
            continue
        am = _ARG_RE.match(part)
        if not am:
            raise CodegenError(f"{text!r}: cannot parse argument {part!r}")
        alias = am.group("alias") or ""
        args.append(
            Arg(am.group("name"), am.group("type") + am.group("suffix"), "!" in alias, kwarg_only)
        )
    ret_text = ret_text.strip()
    if ret_text.startswith("("):
        ret_text = ret_text[1:-1]
    returns = tuple(re.sub(r"\(.*?\)", "", r).split()[0] for r in _split_top(ret_text) if r)
    ns = ns or "aten"
    full = text.strip() if "::" in qual else f"{ns}::{text.strip()}"
    return Schema(ns, name, overload or "", tuple(args), returns, full)


_FLAGS = ("fuses_clamp", "prepare")
_KEYS = {"func", "type_alias", "kernels", "in_place", "kernel_source", "dim_orders", *_FLAGS}


def _dim_orders(raw: object, schema: Schema, where: str) -> dict[str, tuple[tuple[int, ...], ...]]:
    """ops_yaml `dim_orders`: tensor argument -> the dim orders (permutations) it may have
    besides the contiguous one."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CodegenError(f"{where}: dim_orders must map argument names to lists of dim orders")
    tensors = {a.name for a in schema.args if a.type.startswith("Tensor")}
    out = {}
    for arg, orders in raw.items():
        if arg not in tensors:
            raise CodegenError(f"{where}: dim_orders names '{arg}', not a tensor argument")
        if not isinstance(orders, list) or not orders:
            raise CodegenError(f"{where}: dim_orders of '{arg}' must be a list of dim orders")
        for order in orders:
            if not isinstance(order, list) or sorted(order) != list(range(len(order))):
                raise CodegenError(
                    f"{where}: dim order {order!r} of '{arg}' is not a permutation of 0..n-1"
                )
        out[arg] = tuple(tuple(o) for o in orders)
    return out


def _entry(raw: object, source: str) -> OpEntry:
    """One YAML entry, checked: every name it uses must mean something."""
    if not isinstance(raw, dict) or "func" not in raw:
        raise CodegenError(f"{source}: entry {raw!r} has no 'func'")
    schema = parse_schema(raw["func"])
    where = f"{source}: {schema.key}"
    unknown_keys = sorted(set(raw) - _KEYS)
    if unknown_keys:
        raise CodegenError(
            f"{where}: unknown key(s) {', '.join(unknown_keys)} (known: {', '.join(sorted(_KEYS))})"
        )
    kernels = raw.get("kernels") or []
    if len(kernels) != 1 or "kernel_name" not in kernels[0]:
        raise CodegenError(f"{where}: needs exactly one kernel with a kernel_name")
    arg_names = {a.name for a in schema.args}
    aliases = raw.get("type_alias") or {}
    dtypes: dict[str, list[str]] = {}
    for arg, alias in (kernels[0].get("arg_meta") or {}).items():
        alias = alias[0] if isinstance(alias, list) else alias
        dtypes[arg] = list(aliases.get(alias, [alias]))
        unknown = [d for d in dtypes[arg] if d not in SCALAR_TYPES]
        if unknown:
            raise CodegenError(
                f"{where} argument {arg}: unknown dtype(s) {', '.join(map(str, unknown))} "
                f"(known, from schema/scalar_type.fbs: {', '.join(SCALAR_TYPES)})"
            )
    in_place = tuple(raw.get("in_place") or ())
    for name in [*dtypes, *in_place]:
        if name not in arg_names:
            raise CodegenError(f"{where}: '{name}' is not an argument of the schema")
    kernel_source = raw.get("kernel_source", "")
    if not isinstance(kernel_source, str):
        raise CodegenError(f"{where}: kernel_source must be a path under runtime_src/")
    flags = {}
    for key in _FLAGS:
        flags[key] = raw.get(key, False)
        if not isinstance(flags[key], bool):
            raise CodegenError(f"{where}: {key} must be true or false")
    return OpEntry(
        schema,
        kernels[0]["kernel_name"],
        dtypes,
        fuses_clamp=flags["fuses_clamp"],
        prepares=flags["prepare"],
        in_place=in_place,
        dim_orders=_dim_orders(raw.get("dim_orders"), schema, where),
        source=source,
        kernel_source=kernel_source,
    )


def load_entries(ops_dir: Path) -> list[OpEntry]:
    """Every entry of ``ops_dir/*.yaml``, sorted by operator key."""
    entries: dict[str, OpEntry] = {}
    files = sorted(ops_dir.glob("*.yaml"))
    if not files:
        raise CodegenError(f"no operator YAML in {ops_dir}")
    for path in files:
        try:
            raws = yaml.safe_load(path.read_text()) or []
        except yaml.YAMLError as exc:
            raise CodegenError(f"{path.name} is not valid YAML: {exc}") from None
        for raw in raws:
            entry = _entry(raw, path.name)
            if entry.schema.key in entries:
                raise CodegenError(f"{path.name}: {entry.schema.key} is listed twice")
            entries[entry.schema.key] = entry
    return [entries[k] for k in sorted(entries)]
