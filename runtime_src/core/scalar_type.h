// Element types of tensors, numbered like c10::ScalarType / the program schema.
#pragma once

#include <cstddef>
#include <cstdint>

namespace etb {

/// Tensor element type; values match the program schema's ScalarType codes.
enum class ScalarType : int8_t {
  Byte = 0,
  Char = 1,
  Short = 2,
  Int = 3,
  Long = 4,
  Half = 5,
  Float = 6,
  Double = 7,
  Bool = 11,
  QInt8 = 12,
  QUInt8 = 13,
  QInt32 = 14,
  BFloat16 = 15,
  UInt16 = 27,
  UInt32 = 28,
  UInt64 = 29,
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
