// Element types of tensors, numbered like c10::ScalarType / the program schema.
#pragma once

#include <cstddef>
#include <cstdint>

namespace etb {

/// The element types this runtime stores: X(name, code, bytes per element). Names and codes
/// are the program schema's (schema/scalar_type.fbs); core/scalar_type.cpp checks every entry
/// against the flatc-generated enum at compile time.
#define ETB_FOR_EACH_SCALAR_TYPE(X) \
  X(Byte, 0, 1)                     \
  X(Char, 1, 1)                     \
  X(Short, 2, 2)                    \
  X(Int, 3, 4)                      \
  X(Long, 4, 8)                     \
  X(Half, 5, 2)                     \
  X(Float, 6, 4)                    \
  X(Double, 7, 8)                   \
  X(Bool, 11, 1)                    \
  X(QInt8, 12, 1)                   \
  X(QUInt8, 13, 1)                  \
  X(QInt32, 14, 4)                  \
  X(BFloat16, 15, 2)                \
  X(UInt16, 27, 2)                  \
  X(UInt32, 28, 4)                  \
  X(UInt64, 29, 8)

/// Tensor element type; values match the program schema's ScalarType codes.
enum class ScalarType : int8_t {
#define ETB_SCALAR_TYPE_ENUMERATOR(name, code, bytes) name = code,
  ETB_FOR_EACH_SCALAR_TYPE(ETB_SCALAR_TYPE_ENUMERATOR)
#undef ETB_SCALAR_TYPE_ENUMERATOR
};

/// Bytes per element of `t`, or 0 when `t` is not a type this runtime stores.
size_t element_size(ScalarType t);

/// True for a code this runtime knows (element_size > 0).
inline bool is_valid_scalar_type(int code) {
  return element_size(static_cast<ScalarType>(code)) > 0;
}

/// The name used in messages and YAML ("Float", "Long").
const char* scalar_type_name(ScalarType t);

/// True for Half, Float, Double, BFloat16.
inline bool is_floating(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half ||
         t == ScalarType::BFloat16;
}

/// True for the integer types (not Bool).
inline bool is_integral(ScalarType t) {
  return t == ScalarType::Byte || t == ScalarType::Char || t == ScalarType::Short ||
         t == ScalarType::Int || t == ScalarType::Long || t == ScalarType::UInt16 ||
         t == ScalarType::UInt32 || t == ScalarType::UInt64;
}

}  // namespace etb
