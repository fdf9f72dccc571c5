// Helpers shared by the portable kernels: shape checks, dim wrapping, dtype dispatch.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/result.h"
#include "core/scalar.h"
#include "core/span.h"
#include "core/tensor.h"

namespace etb {
namespace native {

/// Wraps a possibly negative dim into [0, ndim); fails when out of range.
inline Error wrap_dim(int64_t dim, int64_t ndim, int64_t* out, const char* op) {
  int64_t n = ndim <= 0 ? 1 : ndim;
  int64_t d = dim < 0 ? dim + n : dim;
  if (d < 0 || d >= n)
    return fail(Error::InvalidArgument, "%s: dim %lld out of range for a %lld-d tensor", op,
                (long long)dim, (long long)ndim);
  *out = d;
  return Error::Ok;
}

/// Resizes `out` to `dim` sizes held in `sizes`.
inline Error resize_to(Tensor& out, const int64_t* sizes, int dim) {
  return out.resize(Span<const int64_t>(sizes, size_t(dim)));
}

/// Fails unless `t` has dtype `want`.
inline Error expect_dtype(const Tensor& t, ScalarType want, const char* op, const char* arg) {
  if (t.dtype() != want)
    return fail(Error::InvalidArgument, "%s: %s has dtype %s, expected %s", op, arg,
                scalar_type_name(t.dtype()), scalar_type_name(want));
  return Error::Ok;
}

/// Fails unless `t` has `dim` dims.
inline Error expect_dim(const Tensor& t, int dim, const char* op, const char* arg) {
  if (t.dim() != dim)
    return fail(Error::InvalidArgument, "%s: %s must have %d dims, has %d", op, arg, dim,
                t.dim());
  return Error::Ok;
}

/// Reads element i of a Float/Int/Long/Bool/... tensor as T.
template <typename T>
inline T load_as(const void* data, ScalarType dtype, int64_t i) {
  switch (dtype) {
    case ScalarType::Float: return T(static_cast<const float*>(data)[i]);
    case ScalarType::Double: return T(static_cast<const double*>(data)[i]);
    case ScalarType::Long: return T(static_cast<const int64_t*>(data)[i]);
    case ScalarType::Int: return T(static_cast<const int32_t*>(data)[i]);
    case ScalarType::Short: return T(static_cast<const int16_t*>(data)[i]);
    case ScalarType::Char: return T(static_cast<const int8_t*>(data)[i]);
    case ScalarType::Byte: return T(static_cast<const uint8_t*>(data)[i]);
    case ScalarType::Bool: return T(static_cast<const uint8_t*>(data)[i] != 0);
    default: return T(0);
  }
}

/// Writes v (as T) to element i of a tensor of `dtype`.
template <typename T>
inline void store_as(void* data, ScalarType dtype, int64_t i, T v) {
  switch (dtype) {
    case ScalarType::Float: static_cast<float*>(data)[i] = float(v); break;
    case ScalarType::Double: static_cast<double*>(data)[i] = double(v); break;
    case ScalarType::Long: static_cast<int64_t*>(data)[i] = int64_t(v); break;
    case ScalarType::Int: static_cast<int32_t*>(data)[i] = int32_t(v); break;
    case ScalarType::Short: static_cast<int16_t*>(data)[i] = int16_t(v); break;
    case ScalarType::Char: static_cast<int8_t*>(data)[i] = int8_t(v); break;
    case ScalarType::Byte: static_cast<uint8_t*>(data)[i] = uint8_t(v); break;
    case ScalarType::Bool: static_cast<uint8_t*>(data)[i] = v != T(0); break;
    default: break;
  }
}

/// True when the dtype is one the portable kernels can load and store.
inline bool is_loadable(ScalarType t) {
  switch (t) {
    case ScalarType::Float: case ScalarType::Double: case ScalarType::Long:
    case ScalarType::Int: case ScalarType::Short: case ScalarType::Char:
    case ScalarType::Byte: case ScalarType::Bool:
      return true;
    default:
      return false;
  }
}

/// Broadcast iteration plan for out = f(a, b): collapsed sizes and element strides.
struct Broadcast2 {
  int dim = 0;
  int64_t sizes[kMaxDim];
  int64_t sa[kMaxDim];
  int64_t sb[kMaxDim];
};

/// Computes the broadcast shape of a and b into sizes/dim; fails when incompatible.
Error broadcast_shape(const Tensor& a, const Tensor& b, int64_t* sizes, int* dim,
                      const char* op);

/// Builds a collapsed iteration plan of a and b against the (contiguous) out sizes.
void make_broadcast2(const Tensor& a, const Tensor& b, Span<const int64_t> out_sizes,
                     Broadcast2* plan);

/// Calls f(out_offset, a_offset, a_stride, b_offset, b_stride, n) for each inner row.
template <typename F>
void for_each_row(const Broadcast2& p, F&& f) {
  if (p.dim == 0) {
    f(int64_t(0), int64_t(0), int64_t(0), int64_t(0), int64_t(0), int64_t(1));
    return;
  }
  const int last = p.dim - 1;
  const int64_t inner = p.sizes[last];
  int64_t outer = 1;
  for (int d = 0; d < last; ++d) outer *= p.sizes[d];
  if (inner == 0) return;
  int64_t idx[kMaxDim] = {};
  int64_t oa = 0, ob = 0;
  for (int64_t o = 0; o < outer; ++o) {
    f(o * inner, oa, p.sa[last], ob, p.sb[last], inner);
    for (int d = last - 1; d >= 0; --d) {
      oa += p.sa[d];
      ob += p.sb[d];
      if (++idx[d] < p.sizes[d]) break;
      oa -= p.sa[d] * p.sizes[d];
      ob -= p.sb[d] * p.sizes[d];
      idx[d] = 0;
    }
  }
}

}  // namespace native
}  // namespace etb
