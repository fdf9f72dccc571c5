"""Generates the unboxing wrappers and kernel registration of the etbuild runtime from the
operator database (``opdb.py``). PyYAML only, no torch: the build runs it before the package
is installed.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from .opdb import Arg, CodegenError, OpEntry, Schema, load_entries
from .sources import kernel_sources


def _selected_dtypes(raw: object) -> dict[str, list[str]]:
    """The ``dtypes`` of one selection entry as {argument: [dtype names]}.

    Arguments may name anything (tensor arguments, Scalar arguments with the scalar's type,
    names ops_yaml does not know); the caller keeps only the tensor arguments of ops_yaml.
    An argument listed without a value restricts nothing."""
    dtypes = raw.get("dtypes") if isinstance(raw, dict) else None
    if not isinstance(dtypes, dict):
        return {}
    out: dict[str, list[str]] = {}
    for arg, names in dtypes.items():
        if names is None:
            continue
        out[str(arg)] = [str(n) for n in ([names] if isinstance(names, str) else names)]
    return out


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
        want = _selected_dtypes(ops[key])
        dtypes = {a: [d for d in ds if d in want.get(a, ds)] for a, ds in e.dtypes.items()}
        out.append(
            OpEntry(
                e.schema,
                e.kernel_name,
                dtypes,
                supported=e.dtypes,
                fuses_clamp=e.fuses_clamp,
                prepares=e.prepares,
                in_place=e.in_place,
                dim_orders=e.dim_orders,
                source=e.source,
                kernel_source=e.kernel_source,
            )
        )
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
    "float[]?": (
        "Optional<Span<const double>>",
        "({v}.is_double_list() || {v}.is_none())",
        "({v}.is_double_list() ? Optional<Span<const double>>({v}.to_double_list()) "
        ": Optional<Span<const double>>())",
    ),
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
    # torch.memory_format as the program stores it: 0 contiguous, 1 preserve, 2 channels last.
    "MemoryFormat?": (
        "Optional<int64_t>",
        "({v}.is_int() || {v}.is_none())",
        "({v}.is_int() ? Optional<int64_t>({v}.to_int()) : Optional<int64_t>())",
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


def _signature(entry: OpEntry, prepare: bool = False) -> str:
    """The kernel's C++ declaration, or (``prepare``) its load-time hook's: the same
    arguments after a PrepareContext."""
    s = entry.schema
    params = ["PrepareContext& pctx" if prepare else "KernelContext& ctx"]
    for a in s.args:
        params.append(f"{_type_info(s, a)[0]} {a.name}")
    kind = _return_kind(s)
    if kind == "int":
        params.append("int64_t& result")
    elif kind == "scalar":
        params.append("Scalar& result")
    name = _func_name(entry) + ("_prepare" if prepare else "")
    return f"Error {name}({', '.join(params)})"


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
                if e.prepares:
                    lines.append(f"/// {e.schema.key}: what a call makes of its constants at load")
                    lines.append(_signature(e, prepare=True) + ";")
        lines += ["", f"}}  // namespace {ns}", ""]
    lines += ["}  // namespace etb", ""]
    return "\n".join(lines)


def _cpp_dtype_set(dtypes: list[str]) -> str:
    return "dtype_set(" + ", ".join(f"ScalarType::{d}" for d in dtypes) + ")"


def _check_name(schema: Schema) -> str:
    return _wrapper_name(schema) + "_check"


def _is_tensor_type(arg: Arg) -> bool:
    return _norm_type(arg.type) in ("Tensor", "Tensor?", "Tensor[]", "Tensor?[]")


def _arg_spec(entry: OpEntry, arg: Arg) -> str:
    """The TensorArgSpec of one tensor argument: its selected dtypes come from the table in
    selected_dtypes.h (the same one the kernels compile against), so the check refuses
    exactly the dtype paths that were left out."""
    key = entry.schema.key
    supported = entry.supported_dtypes(arg.name)
    if supported is None:  # ops_yaml lists no dtypes for it: no restriction
        selected = supported_set = "kAllDtypes"
    else:
        selected = f'selected_dtypes("{key}", "{arg.name}")'
        supported_set = _cpp_dtype_set(supported)
    write = "true" if arg.is_write and _norm_type(arg.type) == "Tensor" else "false"
    # The dim orders it may have besides contiguous: each one's length, then its dims; 0 ends.
    orders = [n for o in entry.dim_orders.get(arg.name, ()) for n in (len(o), *o)] + [0]
    return (
        f"  static constexpr uint8_t k_{arg.name}_orders[] = {{{', '.join(map(str, orders))}}};\n"
        f"  static constexpr TensorArgSpec k_{arg.name}{{\n"
        f'      "{key}", "{arg.name}", {selected},\n'
        f"      {supported_set}, {write}, k_{arg.name}_orders}};"
    )


def gen_check(entry: OpEntry) -> str:
    """The argument check of one op, shared by Method load (at_load) and the boxed wrapper."""
    s = entry.schema
    kind = _return_kind(s)
    nargs = len(s.args) + (0 if kind == "none" else 1)
    out = [
        f"// {s.key}: the number and types of the values, the tensors' dtypes and layout.",
        f"Error {_check_name(s)}(Span<EValue*> args, bool at_load) {{",
    ]
    out += [_arg_spec(entry, a) for a in s.args if _is_tensor_type(a)]
    if not any(_is_tensor_type(a) for a in s.args):
        out.append("  (void)at_load;")
    out += [
        f"  if (args.size() != {nargs})",
        f'    return fail(Error::InvalidProgram, "{s.key} takes {nargs} values, got %zu", '
        "args.size());",
    ]
    for i, a in enumerate(s.args):
        _, check, _ = _type_info(s, a)
        v = f"(*args[{i}])"
        t = _norm_type(a.type)
        out.append(f"  if (!{check.format(v=v)})")
        out.append(
            f"    return fail(Error::InvalidProgram, \"{s.key}: argument '{a.name}' "
            f'(#{i}) must be {a.type}, got %s", tag_name({v}.tag()));'
        )
        if t == "Tensor":
            out.append(f"  ETB_TRY(check_tensor_arg({v}.to_tensor(), k_{a.name}, at_load));")
        elif t == "Tensor?":
            out.append(
                f"  if ({v}.is_tensor()) "
                f"ETB_TRY(check_tensor_arg({v}.to_tensor(), k_{a.name}, at_load));"
            )
        elif t in ("Tensor[]", "Tensor?[]"):
            out.append(f"  for (Tensor* p : {v}.to_tensor_list())")
            out.append(f"    if (p != nullptr) ETB_TRY(check_tensor_arg(*p, k_{a.name}, at_load));")
    out += _disjoint_checks(entry)
    r = f"(*args[{len(s.args)}])"
    ret = {
        "tensor": ("is_tensor", "a Tensor"),
        "tensor_list": ("is_tensor_list", "a TensorList"),
        "int": ("is_int", "an Int"),
        "scalar": ("is_scalar", "a Scalar"),
    }.get(kind)
    if ret is not None:
        out.append(f"  if (!{r}.{ret[0]}())")
        out.append(
            f'    return fail(Error::InvalidProgram, "{s.key}: return value must be '
            f'{ret[1]}, got %s", tag_name({r}.tag()));'
        )
    out.append("  return Error::Ok;")
    out.append("}")
    return "\n".join(out)


def _disjoint_checks(entry: OpEntry) -> list[str]:
    """Every output against every other tensor argument: they must not share memory, except
    an ``in_place`` input that is exactly the output's memory (a malformed memory plan would
    otherwise have the kernel read what it has already overwritten)."""
    s = entry.schema
    lines: list[str] = []
    for i, o in enumerate(s.args):
        if not (o.is_write and _norm_type(o.type) == "Tensor"):
            continue
        for j, a in enumerate(s.args):
            if j == i or (a.is_write and j > i) or not _is_tensor_type(a):
                continue  # two outputs are compared once
            v, t = f"(*args[{j}])", _norm_type(a.type)
            src = "*p" if t in ("Tensor[]", "Tensor?[]") else f"{v}.to_tensor()"
            may_alias = "true" if a.name in entry.in_place else "false"
            check = (
                f"ETB_TRY(check_disjoint((*args[{i}]).to_tensor(), k_{o.name}, {src}, "
                f"k_{a.name}, {may_alias}));"
            )
            if t == "Tensor":
                lines.append(f"  {check}")
            elif t == "Tensor?":
                lines.append(f"  if ({v}.is_tensor()) {check}")
            else:
                lines.append(f"  for (Tensor* p : {v}.to_tensor_list())")
                lines.append(f"    if (p != nullptr) {check}")
    return lines


def _unboxed_args(s: Schema, out: list[str]) -> list[str]:
    """The C++ arguments of an unboxed call from ``args``; declares (appends to ``out``) the
    local that receives an int or Scalar return."""
    call = [_type_info(s, a)[2].format(v=f"(*args[{i}])") for i, a in enumerate(s.args)]
    kind = _return_kind(s)
    if kind == "int":
        out.append("  int64_t result = 0;")
        call.append("result")
    elif kind == "scalar":
        out.append("  Scalar result;")
        call.append("result")
    return call


def gen_wrapper(entry: OpEntry) -> str:
    """The boxed kernel: the op's check, then the unboxed call."""
    s = entry.schema
    kind = _return_kind(s)
    out = [
        gen_check(entry),
        "",
        f"Error {_wrapper_name(s)}(KernelContext& ctx, Span<EValue*> args) {{",
        f"  ETB_TRY({_check_name(s)}(args, false));",
    ]
    call = _unboxed_args(s, out)
    r = f"(*args[{len(s.args)}])"
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
    if entry.prepares:
        out += ["", gen_prepare_wrapper(entry)]
    return "\n".join(out)


def _prepare_wrapper_name(schema: Schema) -> str:
    return _wrapper_name(schema) + "_prepare"


def gen_prepare_wrapper(entry: OpEntry) -> str:
    """The boxed prepare hook: the op's load-time check, then the unboxed hook."""
    s = entry.schema
    out = [
        f"Error {_prepare_wrapper_name(s)}(PrepareContext& pctx, Span<EValue*> args) {{",
        f"  ETB_TRY({_check_name(s)}(args, true));",
    ]
    call = _unboxed_args(s, out)
    joined = ",\n      ".join(["pctx"] + call)
    ns, name = _kernel_ns_name(entry)
    out.append(f"  return {ns}::{name}_prepare(\n      {joined});")
    out.append("}")
    return "\n".join(out)


_REGISTRATION_PRELUDE = r"""namespace etb {
namespace {

// One tensor argument of an op: the dtypes this runtime is built with (the selection's,
// from selected_dtypes.h), the ones ops_yaml lists, and whether the op writes it.
struct TensorArgSpec {
  const char* op;
  const char* arg;
  DtypeSet selected;
  DtypeSet supported;
  bool write;
  const uint8_t* orders;  // dim orders besides contiguous: length, dims, ...; 0 ends the list
};

// Whether `t`'s dim order is contiguous or one of `orders` (TensorArgSpec::orders).
[[maybe_unused]] bool dim_order_taken(const Tensor& t, const uint8_t* orders) {
  if (t.is_contiguous()) return true;
  for (const uint8_t* o = orders; *o != 0; o += 1 + *o) {
    if (*o != t.dim()) continue;
    bool same = true;
    for (int d = 0; d < t.dim(); ++d) same = same && o[1 + d] == t.dim_order()[size_t(d)];
    if (same) return true;
  }
  return false;
}

// "(0, 2, 3, 1)" into buf.
[[maybe_unused]] const char* format_dim_order(const uint8_t* dims, int n, char* buf, size_t len) {
  size_t used = size_t(snprintf(buf, len, "("));
  for (int d = 0; d < n && used < len; ++d)
    used += size_t(snprintf(buf + used, len - used, d ? ", %d" : "%d", int(dims[d])));
  if (used < len) snprintf(buf + used, len - used, ")");
  return buf;
}

// Checks one tensor argument: a dtype this runtime is built with, a dim order its kernel takes,
// writable when written and, when not at load (inputs get their memory later), data present.
// (Unused when the selection has no operator: a program that runs in delegates only.)
[[maybe_unused]] Error check_tensor_arg(const Tensor& t, const TensorArgSpec& a,
                                        bool at_load) {
  if (!dtype_in(a.selected, t.dtype())) {
    char names[128];
    if (dtype_in(a.supported, t.dtype()))
      return fail(Error::NotSupported,
                  "%s: argument '%s' has dtype %s, which this runtime was not built with "
                  "(selected: %s); rebuild the runtime with this program's "
                  "selected_operators.yaml",
                  a.op, a.arg, scalar_type_name(t.dtype()),
                  format_dtype_set(a.selected, names, sizeof(names)));
    return fail(Error::NotSupported, "%s: argument '%s' has dtype %s; this kernel supports %s",
                a.op, a.arg, scalar_type_name(t.dtype()),
                format_dtype_set(a.supported, names, sizeof(names)));
  }
  if (!dim_order_taken(t, a.orders)) {
    char order[64], takes[128];
    size_t used = size_t(snprintf(takes, sizeof(takes), "contiguous"));
    for (const uint8_t* o = a.orders; *o != 0 && used < sizeof(takes); o += 1 + *o) {
      char one[64];
      used += size_t(snprintf(takes + used, sizeof(takes) - used, " or %s",
                              format_dim_order(o + 1, *o, one, sizeof(one))));
    }
    return fail(Error::NotSupported, "%s: argument '%s' has dim order %s; this kernel takes %s",
                a.op, a.arg, format_dim_order(t.dim_order().data(), t.dim(), order, sizeof(order)),
                takes);
  }
  if (a.write && t.read_only())
    return fail(Error::InvalidProgram, "%s: argument '%s' is a constant and cannot be written",
                a.op, a.arg);
  if (!at_load && !a.write && t.nbytes() > t.capacity_bytes())
    return fail(Error::InvalidProgram, "%s: argument '%s' has no memory for its %lld elements",
                a.op, a.arg, (long long)t.numel());
  return Error::Ok;
}

// True when `out` is exactly `src`'s memory: the same data and dtype, and the same sizes
// unless `out` is dynamic (the kernel resizes it to its result, here still the last run's).
[[maybe_unused]] bool is_in_place(const Tensor& out, const Tensor& src) {
  if (out.data() != src.data() || out.dtype() != src.dtype()) return false;
  if (out.dynamism() != ShapeDynamism::Static) return out.dim() == src.dim();
  if (out.dim() != src.dim()) return false;
  for (int d = 0; d < out.dim(); ++d)
    if (out.size(d) != src.size(d)) return false;
  return true;
}

// Checks that output `out` shares no memory with argument `src`: only an input the op may
// overwrite (`may_alias`, ops_yaml `in_place`) may be the output's very memory. A memory plan
// that breaks this is the program's fault, not the kernel's.
[[maybe_unused]] Error check_disjoint(const Tensor& out, const TensorArgSpec& o,
                                      const Tensor& src, const TensorArgSpec& a,
                                      bool may_alias) {
  if (!overlaps(out, src) || (may_alias && is_in_place(out, src))) return Error::Ok;
  return fail(Error::InvalidProgram,
              "%s: output '%s' overlaps argument '%s' in memory; the program's memory plan is "
              "invalid (rebuild the program with etbuild)",
              o.op, o.arg, a.arg);
}
"""


def gen_registration(entries: list[OpEntry]) -> str:
    lines = [
        HEADER,
        '#include "register_kernels.h"',
        "",
        "#include <cstdio>",
        "",
        '#include "core/error.h"',
        '#include "native_functions.h"',
        '#include "selected_dtypes.h"',
        "",
        _REGISTRATION_PRELUDE,
    ]
    for e in entries:
        lines.append(gen_wrapper(e))
        lines.append("")
    lines.append("const Kernel kKernels[] = {")
    for e in entries:
        w = _wrapper_name(e.schema)
        fuses = "true" if e.fuses_clamp else "false"
        prep = f"&{_prepare_wrapper_name(e.schema)}" if e.prepares else "nullptr"
        lines.append(f'    {{"{e.schema.key}", &{w}, &{_check_name(e.schema)}, {fuses}, {prep}}},')
    if not entries:
        lines.append('    {"", nullptr, nullptr, false, nullptr},')
    lines += [
        "};",
        "",
        "}  // namespace",
        "",
        "// The delegate backends linked into this build (register_backends.cpp, which CMake",
        "// generates from ETB_BACKEND_DIRS).",
        "Error register_all_backends();",
        "",
        "Error register_all_kernels() {",
        f"  ETB_TRY(register_kernels(Span<const Kernel>(kKernels, {len(entries)})));",
        "  return register_all_backends();",
        "}",
        "",
        "}  // namespace etb",
        "",
    ]
    return "\n".join(lines)


def gen_selected_dtypes(entries: list[OpEntry], selected: list[OpEntry] | None) -> str:
    """selected_dtypes.h: the compile-time (op, tensor argument) -> dtypes table.

    Every op of ops_yaml is listed (so a kernel's lookup of its own op always compiles); an op
    the selection leaves out has no dtypes, and without a selection every op has all the
    dtypes ops_yaml lists."""
    chosen = None if selected is None else {e.schema.key: e for e in selected}
    rows = []
    for e in entries:
        for a in e.schema.args:
            if a.name not in e.dtypes:
                continue
            if chosen is None:
                dtypes = e.dtypes[a.name]
            else:
                dtypes = chosen[e.schema.key].dtypes[a.name] if e.schema.key in chosen else []
            rows.append(f'    {{"{e.schema.key}", "{a.name}", {_cpp_dtype_set(dtypes)}}},')
    if not rows:  # no zero-length arrays
        rows.append('    {"", "", dtype_set()},')
    source = "every dtype ops_yaml lists" if selected is None else "selected_operators.yaml"
    return SELECTED_DTYPES_H.format(
        selective="false" if selected is None else "true", source=source, rows="\n".join(rows)
    )


SELECTED_DTYPES_H = (
    HEADER
    + """#pragma once

#include "kernel/dtype_selection.h"

namespace etb {{

/// True when the runtime is built from a selection (selected_operators.yaml).
inline constexpr bool kDtypeSelectiveBuild = {selective};

/// Per operator and tensor argument, the dtypes this runtime is built with ({source}).
/// Operators outside the selection have none.
inline constexpr DtypeTableEntry kSelectedDtypes[] = {{
{rows}
}};

/// The dtypes this runtime is built with for `op`'s tensor argument `arg`. In a constant
/// expression (`if constexpr`, a constexpr variable, a template argument) an (op, arg) that
/// ops_yaml does not list fails to compile.
constexpr DtypeSet selected_dtypes(const char* op, const char* arg) {{
  return find_dtypes(kSelectedDtypes, op, arg);
}}

/// True when this runtime is built with `op`'s argument `arg` in `dtype`.
constexpr bool dtype_selected(const char* op, const char* arg, ScalarType dtype) {{
  return dtype_in(selected_dtypes(op, arg), dtype);
}}

}}  // namespace etb
"""
)


REGISTER_H = (
    HEADER
    + """#pragma once

#include "core/error.h"

namespace etb {

/// Registers every generated kernel and every delegate backend linked into the build. Call
/// once before loading methods; no static initializers do this implicitly.
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
    chosen = None
    if selected is not None:
        chosen = apply_selection(entries, yaml.safe_load(selected.read_text()))
    registered = entries if chosen is None else chosen
    files = {
        "native_functions.h": gen_declarations(registered),
        "register_kernels.h": REGISTER_H,
        "register_kernels.cpp": gen_registration(registered),
        "selected_dtypes.h": gen_selected_dtypes(entries, chosen),
    }
    written = []
    for name, text in files.items():
        if write_if_changed(out_dir / name, text):
            written.append(out_dir / name)
    return written


def selected_entries(ops_dir: Path, selected: Path | None) -> list[OpEntry]:
    """The entries a build registers: all, or the selection's."""
    entries = load_entries(ops_dir)
    if selected is None:
        return entries
    return apply_selection(entries, yaml.safe_load(selected.read_text()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="etbuild.codegen", description=__doc__)
    p.add_argument("--ops-yaml", type=Path, required=True, help="folder of operator YAML")
    p.add_argument("--out", type=Path, default=None, help="output folder")
    p.add_argument(
        "--selected",
        type=Path,
        default=None,
        help="selected_operators.yaml: generate only these ops",
    )
    p.add_argument(
        "--list-sources",
        type=Path,
        default=None,
        metavar="RUNTIME_SRC",
        help="print the kernel sources (under RUNTIME_SRC) the ops need, one a line, and stop",
    )
    args = p.parse_args(argv)
    if args.out is None and args.list_sources is None:
        p.error("one of --out and --list-sources is required")
    try:
        if args.list_sources is not None:
            entries = selected_entries(args.ops_yaml, args.selected)
            print("\n".join(kernel_sources(entries, args.list_sources)))
            return 0
        generate(args.ops_yaml, args.out, args.selected)
    except (CodegenError, OSError, yaml.YAMLError) as exc:
        print(f"etbuild.codegen: error: {exc}")
        return 1
    return 0
