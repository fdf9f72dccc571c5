// Helpers shared by the portable kernels: shape checks, dim wrapping, dtype dispatch.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/result.h"
#include "core/scalar.h"
#include "core/span.h"
#include "core/tensor.h"
#include "kernel/dtype_selection.h"
#include "kernel/kernel.h"
#include "selected_dtypes.h"

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

/// A tensor seen along one dim: `outer` runs of `len` steps of `inner` contiguous elements
/// (softmax, cumsum and other ops that work along a dim). Copy the fields into locals before
/// a lambda uses them: C++17 lambdas cannot capture structured bindings.
struct AlongDim {
  int64_t outer = 1, len = 1, inner = 1;
};

/// `self` along the already wrapped dim `d` (a 0-d tensor is one run of one element).
inline AlongDim along_dim(const Tensor& self, int64_t d) {
  const int64_t len = self.dim() == 0 ? 1 : self.size(int(d));
  const int64_t inner = self.dim() == 0 ? 1 : self.stride(int(d));
  return {len * inner == 0 ? 0 : self.numel() / (len * inner), len, inner};
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
    return fail(Error::InvalidArgument, "%s: %s must have %d dims, has %d", op, arg, dim, t.dim());
  return Error::Ok;
}

// ---- dtype dispatch ------------------------------------------------------------------------
// A kernel branches on a tensor's dtype through dispatch_dtype<kDtypes>, with kDtypes the
// dtypes this build selected for that argument (selected_dtypes(op, arg), generated from the
// selection): the paths of the other dtypes are discarded at compile time, and the
// generated argument check refuses those dtypes (at Method load) before the kernel runs.

/// The dtypes the portable kernels can load and store (dispatch_dtype's C++ types).
inline constexpr DtypeSet kLoadableDtypes =
    dtype_set(ScalarType::Float, ScalarType::Double, ScalarType::Long, ScalarType::Int,
              ScalarType::Short, ScalarType::Char, ScalarType::Byte, ScalarType::Bool);

/// The floating dtypes.
inline constexpr DtypeSet kFloatingDtypes =
    dtype_set(ScalarType::Half, ScalarType::Float, ScalarType::Double, ScalarType::BFloat16);

namespace internal {
/// Calls f(C{}) and returns true when kType is in kDtypes; else compiles to `return false`.
template <DtypeSet kDtypes, ScalarType kType, typename C, typename F>
inline bool call_if_selected(F& f) {
  if constexpr (dtype_in(kDtypes, kType)) {
    f(C{});
    return true;
  } else {
    (void)f;
    return false;
  }
}
}  // namespace internal

/// Calls `f(C{})`, with C the element type of `dtype` (float, double, int64_t, int32_t,
/// int16_t, int8_t, uint8_t; bool for Bool, whose elements are bytes), and returns true when
/// `dtype` is in kDtypes; returns false otherwise. Only the dtypes of kDtypes are compiled.
template <DtypeSet kDtypes, typename F>
inline bool dispatch_dtype(ScalarType dtype, F&& f) {
  using internal::call_if_selected;
  switch (dtype) {
    case ScalarType::Float: return call_if_selected<kDtypes, ScalarType::Float, float>(f);
    case ScalarType::Double: return call_if_selected<kDtypes, ScalarType::Double, double>(f);
    case ScalarType::Long: return call_if_selected<kDtypes, ScalarType::Long, int64_t>(f);
    case ScalarType::Int: return call_if_selected<kDtypes, ScalarType::Int, int32_t>(f);
    case ScalarType::Short: return call_if_selected<kDtypes, ScalarType::Short, int16_t>(f);
    case ScalarType::Char: return call_if_selected<kDtypes, ScalarType::Char, int8_t>(f);
    case ScalarType::Byte: return call_if_selected<kDtypes, ScalarType::Byte, uint8_t>(f);
    case ScalarType::Bool: return call_if_selected<kDtypes, ScalarType::Bool, bool>(f);
    default: return false;
  }
}

/// The error of a kernel reached with a dtype that this build left out (the generated
/// argument checks refuse it first, so this is a last line of defence).
Error dtype_not_built(const char* op, const char* arg, ScalarType dtype);

/// Reads element i of a tensor of `dtype` (one of kDtypes; else 0) as T.
template <typename T, DtypeSet kDtypes = kLoadableDtypes>
inline T load_as(const void* data, ScalarType dtype, int64_t i) {
  T v = T(0);
  dispatch_dtype<kDtypes & kLoadableDtypes>(dtype, [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_same<C, bool>::value)
      v = T(static_cast<const uint8_t*>(data)[i] != 0);
    else
      v = T(static_cast<const C*>(data)[i]);
  });
  return v;
}

/// Writes v (as T) to element i of a tensor of `dtype` (one of kDtypes; else nothing).
template <typename T, DtypeSet kDtypes = kLoadableDtypes>
inline void store_as(void* data, ScalarType dtype, int64_t i, T v) {
  dispatch_dtype<kDtypes & kLoadableDtypes>(dtype, [&](auto c) {
    using C = decltype(c);
    if constexpr (std::is_same<C, bool>::value)
      static_cast<uint8_t*>(data)[i] = v != T(0);
    else
      static_cast<C*>(data)[i] = C(v);
  });
}

/// True when the dtype is one the portable kernels can load and store.
inline bool is_loadable(ScalarType t) {
  return dtype_in(kLoadableDtypes, t);
}

/// Broadcast iteration plan for out = f(a, b): collapsed sizes and element strides.
struct Broadcast2 {
  int dim = 0;
  int64_t sizes[kMaxDim];
  int64_t sa[kMaxDim];
  int64_t sb[kMaxDim];
};

/// The softmax of `len` values x[k * stride] whose maximum is `max`, into
/// y[k * stride]: exp(x - max), then each divided by their sum. y may be x.
void softmax_with_max(const float* x, float* y, int64_t len, int64_t stride, float max);

/// The log-softmax of `len` values x[k * stride] whose maximum is `max`, into y[k * stride]:
/// x - max - log(sum(exp(x - max))). y may be x.
void log_softmax_with_max(const float* x, float* y, int64_t len, int64_t stride, float max);

/// The mean of x[0..n) and 1 / sqrt(variance + eps), accumulated in double (layer norm,
/// group norm). n == 0 gives mean 0 and 1 / sqrt(eps).
void mean_and_rstd(const float* x, int64_t n, double eps, float* mean, float* rstd);

/// Computes the broadcast shape of a and b into sizes/dim; fails when incompatible.
Error broadcast_shape(const Tensor& a, const Tensor& b, int64_t* sizes, int* dim, const char* op);

/// Builds a collapsed iteration plan of a and b against the (contiguous) out sizes.
void make_broadcast2(const Tensor& a, const Tensor& b, Span<const int64_t> out_sizes,
                     Broadcast2* plan);

/// Calls f(out_offset, a_offset, a_stride, b_offset, b_stride, n) for the inner rows (or
/// pieces of rows) that cover output elements [begin, end).
template <typename F>
void for_each_row(const Broadcast2& p, int64_t begin, int64_t end, F&& f) {
  if (begin >= end) return;
  if (p.dim == 0) {
    f(int64_t(0), int64_t(0), int64_t(0), int64_t(0), int64_t(0), int64_t(1));
    return;
  }
  const int last = p.dim - 1;
  const int64_t inner = p.sizes[last];
  if (inner == 0) return;
  // The index of the row that holds `begin`, and its offsets into a and b.
  int64_t idx[kMaxDim] = {};
  int64_t oa = 0, ob = 0, row = begin / inner, col = begin - (begin / inner) * inner;
  for (int d = last - 1; d >= 0; --d) {
    idx[d] = row % p.sizes[d];
    row /= p.sizes[d];
    oa += idx[d] * p.sa[d];
    ob += idx[d] * p.sb[d];
  }
  for (int64_t e = begin; e < end; col = 0) {
    const int64_t n = inner - col < end - e ? inner - col : end - e;
    f(e, oa + col * p.sa[last], p.sa[last], ob + col * p.sb[last], p.sb[last], n);
    e += n;
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

/// for_each_row over all the output elements.
template <typename F>
void for_each_row(const Broadcast2& p, F&& f) {
  int64_t total = 1;
  for (int d = 0; d < p.dim; ++d) total *= p.sizes[d];
  for_each_row(p, 0, total, f);
}

/// The pixels of one plane of t (its last two sizes multiplied) when t has 3 dims or more,
/// else 0: kernels split large planes over threads by pixels (splits_pixels).
inline int64_t plane_pixels(const Tensor& t) {
  const int d = int(t.dim());
  if (!t.is_contiguous()) return 0;  // channels-last: no planes; a split of the flat elements
  return d >= 3 ? t.size(d - 2) * t.size(d - 1) : 0;
}

/// Whether a and b have the same dim order (and so the same number of dims).
inline bool same_dim_order(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int d = 0; d < a.dim(); ++d)
    if (a.dim_order()[size_t(d)] != b.dim_order()[size_t(d)]) return false;
  return true;
}

/// For elementwise kernels, which run on the flat elements: every tensor in one dim order, and
/// in a non-contiguous one the same sizes (broadcasting is for contiguous tensors). Out of line:
/// every elementwise kernel calls it.
Error check_elementwise_dim_orders(const char* op, const Tensor& out, const Tensor& a,
                                   const Tensor* b = nullptr);

/// Elements of work a task gets at least when a kernel splits elementwise or per-row work over
/// threads: enough to outweigh waking the pool.
constexpr int64_t kParallelGrain = 16 * 1024;

/// Calls f(begin, end) on ranges that cover [0, n) units of work, each unit `unit_cost`
/// elements, split over the context's threads in tasks of at least kParallelGrain elements.
/// Every unit is computed by the same code whatever the split: results do not depend on the
/// thread count.
template <typename F>
void parallel_range(const KernelContext& ctx, int64_t n, int64_t unit_cost, F&& f) {
#if defined(ETB_BARE_METAL)  // no threads: one call, no task wrapper in the image
  (void)ctx;
  (void)unit_cost;
  if (n > 0) f(int64_t(0), n);
#else
  const int64_t cost = unit_cost > 0 ? unit_cost : 1;
  int64_t tasks = n / (kParallelGrain / cost > 0 ? kParallelGrain / cost : 1);
  const int64_t threads = ctx.num_threads(), most = threads * kTasksPerThread;
  tasks = tasks > most ? most : tasks;
  if (tasks <= 1 || n <= 1 || threads <= 1) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
  // Whole rounds of tasks (3 tasks on 2 threads left one idle for a third of the op: the
  // int8 mean over MobileNetV2's last 7x7 plane).
  tasks = (tasks + threads - 1) / threads * threads;
  tasks = tasks > n ? n : tasks;
  auto task = [&](int64_t t, int) { f(t * n / tasks, (t + 1) * n / tasks); };
  ctx.parallel_for(tasks, task);
#endif
}

/// A reduction over some dims of a tensor: which dims go, the output's sizes, and how many
/// input elements each output element reduces.
struct Reduction {
  bool reduce[kMaxDim] = {};
  int64_t osz[kMaxDim] = {};
  int od = 0;
  int64_t count = 1;
  bool innermost = true;  // the reduced dims are the last ones: each group is a contiguous run
};

/// Plans the reduction of `dims` of self (every dim when `dims` is empty), the reduced dims
/// removed or, with `keepdim`, kept as size 1; fails on a repeated or out-of-range dim.
Error plan_reduction(const Tensor& self, Span<const int64_t> dims, bool keepdim, const char* op,
                     Reduction* r);

}  // namespace native
}  // namespace etb
