// Dtype sets and the lookup of the compile-time dtype selection table. etbuild.codegen writes
// the table (selected_dtypes.h: per operator and tensor argument, the dtypes this runtime is
// built with); kernels consult it in constant expressions, so an unselected dtype path is not
// compiled in, and the generated argument checks refuse what the build left out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/scalar_type.h"

namespace etb {

/// A set of dtypes: bit i stands for the ScalarType with code i. An enum, so that a set can
/// be a template argument (C++17 has no class-type template parameters).
enum class DtypeSet : uint32_t {};

/// The set holding `types`.
template <typename... T>
constexpr DtypeSet dtype_set(T... types) {
  uint32_t bits = 0;
  ((bits |= uint32_t(1) << unsigned(types)), ...);
  return DtypeSet(bits);
}

/// Every dtype: no restriction.
inline constexpr DtypeSet kAllDtypes = DtypeSet(~uint32_t(0));

/// True when `t` is in `s`.
constexpr bool dtype_in(DtypeSet s, ScalarType t) {
  const unsigned code = unsigned(int(t));
  return code < 32 && ((uint32_t(s) >> code) & 1u) != 0;
}

/// True when `s` holds no dtype.
constexpr bool dtype_set_empty(DtypeSet s) {
  return uint32_t(s) == 0;
}

/// Intersection.
constexpr DtypeSet operator&(DtypeSet a, DtypeSet b) {
  return DtypeSet(uint32_t(a) & uint32_t(b));
}

/// Union.
constexpr DtypeSet operator|(DtypeSet a, DtypeSet b) {
  return DtypeSet(uint32_t(a) | uint32_t(b));
}

/// Complement.
constexpr DtypeSet operator~(DtypeSet a) {
  return DtypeSet(~uint32_t(a));
}

/// One row of the dtype selection table: an operator's tensor argument and its dtypes.
struct DtypeTableEntry {
  const char* op;   // "aten::add.out"
  const char* arg;  // "self"
  DtypeSet dtypes;
};

namespace internal {

/// Compile-time string equality.
constexpr bool str_equal(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

/// Deliberately not constexpr and not defined: a table lookup of an (operator, argument) that
/// ops_yaml does not list reaches it and fails to compile.
DtypeSet unknown_operator_argument_in_dtype_table();

}  // namespace internal

/// The dtypes of `op`'s argument `arg` in `table`; meant for constant expressions, where an
/// (op, arg) missing from the table is a compile error.
template <size_t N>
constexpr DtypeSet find_dtypes(const DtypeTableEntry (&table)[N], const char* op, const char* arg) {
  for (size_t i = 0; i < N; ++i)
    if (internal::str_equal(table[i].op, op) && internal::str_equal(table[i].arg, arg))
      return table[i].dtypes;
  return internal::unknown_operator_argument_in_dtype_table();
}

/// Writes the names of the dtypes in `s` ("Float, Long", or "none") to `buf`; returns buf.
const char* format_dtype_set(DtypeSet s, char* buf, size_t size);

}  // namespace etb
