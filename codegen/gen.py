"""Generates the unboxing wrappers and kernel registration of the etbuild runtime.

The schema parser here is deliberately self-contained (PyYAML only, no torch import) so the
build can run it before the package is installed.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml


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

    @property
    def key(self) -> str:
        base = f"{self.namespace}::{self.name}"
        return f"{base}.{self.overload}" if self.overload else base


@dataclass
class OpEntry:
    """One ops_yaml entry ready for generation."""

    schema: Schema
    kernel_name: str
    dtypes: dict[str, list[str]] = field(default_factory=dict)


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
    return Schema(ns or "aten", name, overload or "", tuple(args), returns)


def load_entries(ops_dir: Path) -> list[OpEntry]:
    """Every entry of ``ops_dir/*.yaml``, sorted by operator key."""
    entries: dict[str, OpEntry] = {}
    files = sorted(ops_dir.glob("*.yaml"))
    if not files:
        raise CodegenError(f"no operator YAML in {ops_dir}")
    for path in files:
        for raw in yaml.safe_load(path.read_text()) or []:
            if "func" not in raw:
                raise CodegenError(f"{path.name}: entry {raw!r} has no 'func'")
            schema = parse_schema(raw["func"])
            kernels = raw.get("kernels") or []
            if not kernels or "kernel_name" not in kernels[0]:
                raise CodegenError(f"{path.name}: {schema.key} has no kernels[0].kernel_name")
            aliases = raw.get("type_alias") or {}
            dtypes: dict[str, list[str]] = {}
            for arg, alias in (kernels[0].get("arg_meta") or {}).items():
                alias = alias[0] if isinstance(alias, list) else alias
                dtypes[arg] = list(aliases.get(alias, [alias]))
            if schema.key in entries:
                raise CodegenError(f"{path.name}: {schema.key} is listed twice")
            entries[schema.key] = OpEntry(schema, kernels[0]["kernel_name"], dtypes)
    return [entries[k] for k in sorted(entries)]


def apply_selection(entries: list[OpEntry], selected: dict) -> list[OpEntry]:
    """Keeps the selected ops; narrows each argument's dtypes to the ones selected."""
    ops = (selected or {}).get("operators", selected) or {}
    by_key = {e.schema.key: e for e in entries}
    unknown = sorted(set(ops) - set(by_key))
    if unknown:
        raise CodegenError(f"selection names ops that ops_yaml lacks: {', '.join(unknown)}")
    out = []
    for key in sorted(ops):
        e = by_key[key]
        want = (ops[key] or {}).get("dtypes", {}) if isinstance(ops[key], dict) else {}
        dtypes = {a: [d for d in ds if d in want.get(a, ds)] for a, ds in e.dtypes.items()}
        out.append(OpEntry(e.schema, e.kernel_name, dtypes))
    return out


# ---- C++ generation -------------------------------------------------------------------

# type -> (C++ parameter type, EValue check expression, unbox expression); {v} is EValue&.
_TYPES: dict[str, tuple[str, str, str]] = {
    "Tensor": ("const Tensor&", "{v}.is_tensor()", "{v}.to_tensor()"),
    "Tensor?": (
        "const Tensor*",
        "({v}.is_tensor() || {v}.is_none())",
        "({v}.is_tensor() ? {v}.tensor_ptr() : nullptr)",
    ),
    "Tensor[]": ("Span<Tensor* const>", "{v}.is_tensor_list()", "{v}.to_tensor_list()"),
    "Tensor?[]": ("Span<Tensor* const>", "{v}.is_optional_tensor_list()", "{v}.to_tensor_list()"),
    "int": ("int64_t", "{v}.is_int()", "{v}.to_int()"),
    "int?": (
        "Optional<int64_t>",
        "({v}.is_int() || {v}.is_none())",
        "({v}.is_int() ? Optional<int64_t>({v}.to_int()) : Optional<int64_t>())",
    ),
    "int[]": ("Span<const int64_t>", "{v}.is_int_list()", "{v}.to_int_list()"),
    "int[]?": (
        "Optional<Span<const int64_t>>",
        "({v}.is_int_list() || {v}.is_none())",
        "({v}.is_int_list() ? Optional<Span<const int64_t>>({v}.to_int_list()) "
        ": Optional<Span<const int64_t>>())",
    ),
    "bool": ("bool", "{v}.is_bool()", "{v}.to_bool()"),
    "bool?": (
        "Optional<bool>",
        "({v}.is_bool() || {v}.is_none())",
        "({v}.is_bool() ? Optional<bool>({v}.to_bool()) : Optional<bool>())",
    ),
    "bool[]": ("Span<const bool>", "{v}.is_bool_list()", "{v}.to_bool_list()"),
    "float": ("double", "{v}.is_double()", "{v}.to_double()"),
    "float?": (
        "Optional<double>",
        "({v}.is_double() || {v}.is_none())",
        "({v}.is_double() ? Optional<double>({v}.to_double()) : Optional<double>())",
    ),
    "float[]": ("Span<const double>", "{v}.is_double_list()", "{v}.to_double_list()"),
    "str": (
        "Span<const char>",
        "{v}.is_string()",
        "Span<const char>({v}.string_data(), {v}.string_size())",
    ),
    "Scalar": ("const Scalar&", "{v}.is_scalar()", "{v}.to_scalar()"),
    "Scalar?": (
        "Optional<Scalar>",
        "({v}.is_scalar() || {v}.is_none())",
        "({v}.is_scalar() ? Optional<Scalar>({v}.to_scalar()) : Optional<Scalar>())",
    ),
    "ScalarType": (
        "ScalarType",
        "({v}.is_int() && is_valid_scalar_type(int({v}.to_int())))",
        "ScalarType({v}.to_int())",
    ),
    "ScalarType?": (
        "Optional<ScalarType>",
        "({v}.is_none() || ({v}.is_int() && is_valid_scalar_type(int({v}.to_int()))))",
        "({v}.is_int() ? Optional<ScalarType>(ScalarType({v}.to_int())) : Optional<ScalarType>())",
    ),
}


def _norm_type(t: str) -> str:
    t = t.replace("SymInt", "int")
    t = re.sub(r"\[\d+\]", "[]", t)
    return t


def _type_info(schema: Schema, arg: Arg) -> tuple[str, str, str]:
    t = _norm_type(arg.type)
    if t not in _TYPES:
        raise CodegenError(f"{schema.key}: argument {arg.name} has unsupported type {arg.type}")
    cpp, check, unbox = _TYPES[t]
    if arg.is_write:
        if t != "Tensor":
            raise CodegenError(f"{schema.key}: mutable argument {arg.name} must be a Tensor")
        cpp, unbox = "Tensor&", "{v}.to_tensor()"
    return cpp, check, unbox


def _outs(schema: Schema) -> list[Arg]:
    return [a for a in schema.args if a.is_write]


def _return_kind(schema: Schema) -> str:
    """How the trailing return value is handled: none, tensor, tensor_list, int, scalar."""
    if not schema.returns:
        return "none"
    outs = _outs(schema)
    if outs:
        if len(schema.returns) != len(outs):
            raise CodegenError(f"{schema.key}: returns and out arguments differ in number")
        return "tensor" if len(outs) == 1 else "tensor_list"
    if len(schema.returns) != 1:
        raise CodegenError(f"{schema.key}: functional ops may return one value")
    r = _norm_type(schema.returns[0])
    if r == "int":
        return "int"
    if r == "Scalar":
        return "scalar"
    raise CodegenError(f"{schema.key}: unsupported functional return type {schema.returns[0]}")


def _kernel_ns_name(entry: OpEntry) -> tuple[str, str]:
    m = re.fullmatch(r"etb::(\w+)::(\w+)", entry.kernel_name)
    if not m:
        raise CodegenError(
            f"{entry.schema.key}: kernel_name {entry.kernel_name!r} must be etb::NAMESPACE::NAME"
        )
    return m.group(1), m.group(2)


def _func_name(entry: OpEntry) -> str:
    return _kernel_ns_name(entry)[1]


def _wrapper_name(schema: Schema) -> str:
    return "wrap_" + re.sub(r"\W", "_", schema.key)


def _signature(entry: OpEntry) -> str:
    s = entry.schema
    params = ["KernelContext& ctx"]
    for a in s.args:
        params.append(f"{_type_info(s, a)[0]} {a.name}")
    kind = _return_kind(s)
    if kind == "int":
        params.append("int64_t& result")
    elif kind == "scalar":
        params.append("Scalar& result")
    return f"Error {_func_name(entry)}({', '.join(params)})"


HEADER = "// Generated by etbuild.codegen from ops_yaml; do not edit.\n"


def gen_declarations(entries: list[OpEntry]) -> str:
    lines = [
        HEADER,
        "#pragma once",
        "",
        '#include "core/evalue.h"',
        '#include "core/result.h"',
        '#include "core/scalar.h"',
        '#include "core/span.h"',
        '#include "core/tensor.h"',
        '#include "kernel/kernel.h"',
        "",
        "namespace etb {",
        "",
    ]
    namespaces = sorted({_kernel_ns_name(e)[0] for e in entries})
    for ns in namespaces:
        lines += [f"namespace {ns} {{", ""]
        for e in entries:
            if _kernel_ns_name(e)[0] == ns:
                lines.append(f"/// {e.schema.key}")
                lines.append(_signature(e) + ";")
        lines += ["", f"}}  // namespace {ns}", ""]
    lines += ["}  // namespace etb", ""]
    return "\n".join(lines)


def _dtype_check(schema: Schema, arg: Arg, dtypes: list[str], var: str) -> list[str]:
    cond = " && ".join(f"{var}.dtype() != ScalarType::{d}" for d in dtypes) or "true"
    allowed = ", ".join(dtypes) or "none"
    return [
        f"    if ({cond})",
        f"      return fail(Error::NotSupported, \"{schema.key}: argument '{arg.name}' has "
        f'dtype %s; this kernel supports {allowed}", scalar_type_name({var}.dtype()));',
    ]


def gen_wrapper(entry: OpEntry) -> str:
    s = entry.schema
    kind = _return_kind(s)
    nargs = len(s.args) + (0 if kind == "none" else 1)
    out = [
        f"Error {_wrapper_name(s)}(KernelContext& ctx, Span<EValue*> args) {{",
        f"  if (args.size() != {nargs})",
        f'    return fail(Error::InvalidProgram, "{s.key} takes {nargs} values, got %zu", '
        "args.size());",
    ]
    call = []
    for i, a in enumerate(s.args):
        _, check, unbox = _type_info(s, a)
        v = f"(*args[{i}])"
        t = _norm_type(a.type)
        out.append(f"  if (!{check.format(v=v)})")
        out.append(
            f"    return fail(Error::InvalidProgram, \"{s.key}: argument '{a.name}' "
            f'(#{i}) must be {a.type}, got %s", tag_name({v}.tag()));'
        )
        dtypes = entry.dtypes.get(a.name)
        if t == "Tensor":
            out.append("  {")
            out.append(f"    const Tensor& t = {v}.to_tensor();")
            out.append(
                f'    ETB_TRY(check_tensor_arg(t, "{s.key}", "{a.name}", '
                f"{'true' if a.is_write else 'false'}));"
            )
            if dtypes is not None:
                out += _dtype_check(s, a, dtypes, "t")
            out.append("  }")
        elif t == "Tensor?":
            out.append(f"  if ({v}.is_tensor()) {{")
            out.append(f"    const Tensor& t = {v}.to_tensor();")
            out.append(f'    ETB_TRY(check_tensor_arg(t, "{s.key}", "{a.name}", false));')
            if dtypes is not None:
                out += _dtype_check(s, a, dtypes, "t")
            out.append("  }")
        elif t in ("Tensor[]", "Tensor?[]"):
            out.append(f"  for (Tensor* p : {v}.to_tensor_list()) {{")
            out.append("    if (p == nullptr) continue;")
            out.append("    const Tensor& t = *p;")
            out.append(f'    ETB_TRY(check_tensor_arg(t, "{s.key}", "{a.name}", false));')
            if dtypes is not None:
                out += _dtype_check(s, a, dtypes, "t")
            out.append("  }")
        call.append(unbox.format(v=v))
    r = f"(*args[{len(s.args)}])"
    if kind == "tensor":
        out.append(f"  if (!{r}.is_tensor())")
        out.append(
            f'    return fail(Error::InvalidProgram, "{s.key}: return value must be a '
            f'Tensor, got %s", tag_name({r}.tag()));'
        )
    elif kind == "tensor_list":
        out.append(f"  if (!{r}.is_tensor_list())")
        out.append(
            f'    return fail(Error::InvalidProgram, "{s.key}: return value must be a '
            f'TensorList, got %s", tag_name({r}.tag()));'
        )
    elif kind == "int":
        out.append(f"  if (!{r}.is_int())")
        out.append(
            f'    return fail(Error::InvalidProgram, "{s.key}: return value must be an '
            f'Int, got %s", tag_name({r}.tag()));'
        )
        out.append("  int64_t result = 0;")
        call.append("result")
    elif kind == "scalar":
        out.append(f"  if (!{r}.is_scalar())")
        out.append(
            f'    return fail(Error::InvalidProgram, "{s.key}: return value must be a '
            f'Scalar, got %s", tag_name({r}.tag()));'
        )
        out.append("  Scalar result;")
        call.append("result")
    joined = ",\n      ".join(["ctx"] + call)
    out.append(f"  Error e = {_kernel_ns_name(entry)[0]}::{_func_name(entry)}(\n      {joined});")
    if kind == "int":
        out.append(f"  if (e == Error::Ok) {r}.set_int(result);")
    elif kind == "scalar":
        out.append("  if (e == Error::Ok) {")
        out.append(f"    if (result.is_int()) {r}.set_int(result.to_int());")
        out.append(f"    else if (result.is_double()) {r}.set_double(result.to_double());")
        out.append(f"    else {r}.set_bool(result.to_double() != 0);")
        out.append("  }")
    out.append("  return e;")
    out.append("}")
    return "\n".join(out)


def gen_registration(entries: list[OpEntry]) -> str:
    lines = [
        HEADER,
        '#include "register_kernels.h"',
        "",
        '#include "core/error.h"',
        '#include "native_functions.h"',
        "",
        "namespace etb {",
        "namespace {",
        "",
        "// Checks every tensor argument: contiguous, data present, writable when written.",
        "Error check_tensor_arg(const Tensor& t, const char* op, const char* arg, bool write) {",
        "  if (!t.is_contiguous())",
        "    return fail(Error::NotSupported, \"%s: argument '%s' has a non-contiguous "
        'dim order", op, arg);',
        "  if (t.nbytes() > t.capacity_bytes() && !write)",
        "    return fail(Error::InvalidProgram, \"%s: argument '%s' has no memory for its "
        '%lld elements", op, arg, (long long)t.numel());',
        "  if (write && t.read_only())",
        "    return fail(Error::InvalidProgram, \"%s: argument '%s' is a constant and "
        'cannot be written", op, arg);',
        "  return Error::Ok;",
        "}",
        "",
    ]
    for e in entries:
        lines.append(gen_wrapper(e))
        lines.append("")
    lines.append("const Kernel kKernels[] = {")
    for e in entries:
        lines.append(f'    {{"{e.schema.key}", &{_wrapper_name(e.schema)}}},')
    if not entries:
        lines.append('    {"", nullptr},')
    lines += [
        "};",
        "",
        "}  // namespace",
        "",
        "Error register_all_kernels() {",
        f"  return register_kernels(Span<const Kernel>(kKernels, {len(entries)}));",
        "}",
        "",
        "}  // namespace etb",
        "",
    ]
    return "\n".join(lines)


REGISTER_H = (
    HEADER
    + """#pragma once

#include "core/error.h"

namespace etb {

/// Registers every generated kernel. Call once before loading methods; no static
/// initializers do this implicitly.
Error register_all_kernels();

}  // namespace etb
"""
)


def write_if_changed(path: Path, text: str) -> bool:
    """Writes ``text`` unless ``path`` already holds it; True when written."""
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return True


def generate(ops_dir: Path, out_dir: Path, selected: Path | None = None) -> list[Path]:
    """Generates the registration sources into ``out_dir``; returns the files written."""
    entries = load_entries(ops_dir)
    if selected is not None:
        entries = apply_selection(entries, yaml.safe_load(selected.read_text()))
    files = {
        "native_functions.h": gen_declarations(entries),
        "register_kernels.h": REGISTER_H,
        "register_kernels.cpp": gen_registration(entries),
    }
    written = []
    for name, text in files.items():
        if write_if_changed(out_dir / name, text):
            written.append(out_dir / name)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="etbuild.codegen", description=__doc__)
    p.add_argument("--ops-yaml", type=Path, required=True, help="folder of operator YAML")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument(
        "--selected",
        type=Path,
        default=None,
        help="selected_operators.yaml: generate only these ops",
    )
    args = p.parse_args(argv)
    try:
        generate(args.ops_yaml, args.out, args.selected)
    except (CodegenError, OSError, yaml.YAMLError) as exc:
        print(f"etbuild.codegen: error: {exc}")
        return 1
    return 0
