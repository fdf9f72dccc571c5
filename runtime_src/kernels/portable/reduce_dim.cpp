// Reductions and scans along one dim: argmax / argmin, max / min with their indices
// (torch.max(x, dim)), and cumsum. A tensor is seen as [outer, len, inner] around the dim, so
// the inner loops run over contiguous elements.
#include <cmath>
#include <type_traits>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

// The layout of self around `dim` (none: the flattened tensor) and the reduced output's
// sizes: the dim removed, kept as 1 (keepdim), or every dim kept as 1 (no dim, keepdim).
Error plan_along(const Tensor& self, Optional<int64_t> dim, bool keepdim, const char* op,
                 AlongDim* a, int64_t* osz, int* od) {
  const int nd = self.dim();
  *od = 0;
  if (!dim.has_value) {
    a->len = self.numel();
    if (keepdim)
      for (int i = 0; i < nd; ++i) osz[(*od)++] = 1;
  } else {
    int64_t d = 0;
    ETB_TRY(wrap_dim(dim.value, nd, &d, op));
    if (nd > 0) {
      *a = along_dim(self, d);
      for (int i = 0; i < nd; ++i) {
        if (i != d)
          osz[(*od)++] = self.size(i);
        else if (keepdim)
          osz[(*od)++] = 1;
      }
    }
  }
  if (a->len == 0) return fail(Error::InvalidArgument, "%s: cannot reduce over an empty dim", op);
  return Error::Ok;
}

// True when v replaces best as the maximum (kMax) or minimum: beyond it, or NaN (the first
// NaN wins, as in torch); ties keep the first index.
template <bool kMax, typename T>
inline bool beats(T v, T best) {
  if constexpr (std::is_floating_point<T>::value) {
    if (best != best) return false;
    if (v != v) return true;
  }
  return kMax ? v > best : v < best;
}

// The extreme of every [len] column of x (layout a): its first index into idx and, when vals
// is not null, its value. Rows of `outer` are split over the threads.
template <bool kMax, typename T>
void arg_extreme(const KernelContext& ctx, const AlongDim& a, const T* x, int64_t* idx, T* vals) {
  parallel_range(ctx, a.outer, a.len * a.inner, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const T* xo = x + o * a.len * a.inner;
      int64_t* io = idx + o * a.inner;
      if (a.inner == 1) {
        T best = xo[0];
        int64_t at = 0;
        for (int64_t k = 1; k < a.len; ++k)
          if (beats<kMax>(xo[k], best)) {
            best = xo[k];
            at = k;
          }
        io[0] = at;
        if (vals) vals[o] = best;
        continue;
      }
      for (int64_t i = 0; i < a.inner; ++i) io[i] = 0;
      for (int64_t k = 1; k < a.len; ++k) {
        const T* xk = xo + k * a.inner;
        for (int64_t i = 0; i < a.inner; ++i)
          if (beats<kMax>(xk[i], xo[io[i] * a.inner + i])) io[i] = k;
      }
      if (vals)
        for (int64_t i = 0; i < a.inner; ++i) vals[o * a.inner + i] = xo[io[i] * a.inner + i];
    }
  });
}

// The operators of extreme_along, whose dtype selection it compiles for.
enum class Extreme { ArgMax, ArgMin, Max, Min };

constexpr const char* extreme_key(Extreme e) {
  switch (e) {
    case Extreme::ArgMax: return "aten::argmax.out";
    case Extreme::ArgMin: return "aten::argmin.out";
    case Extreme::Max: return "aten::max.dim_max";
    case Extreme::Min: return "aten::min.dim_min";
  }
  return "";
}

// argmax / argmin (values null) and max.dim / min.dim (values set) of self into indices.
template <Extreme E>
Error extreme_along(const KernelContext& ctx, const char* op, const Tensor& self,
                    Optional<int64_t> dim, bool keepdim, Tensor* values, Tensor& indices) {
  constexpr bool kMax = E == Extreme::ArgMax || E == Extreme::Max;
  constexpr const char* key = extreme_key(E);
  AlongDim a;
  int64_t osz[kMaxDim];
  int od = 0;
  ETB_TRY(plan_along(self, dim, keepdim, op, &a, osz, &od));
  ETB_TRY(expect_dtype(indices, ScalarType::Long, op, "indices"));
  ETB_TRY(resize_to(indices, osz, od));
  if (values != nullptr) {
    if (values->dtype() != self.dtype())
      return fail(Error::InvalidArgument, "%s: values have dtype %s, self %s", op,
                  scalar_type_name(values->dtype()), scalar_type_name(self.dtype()));
    ETB_TRY(resize_to(*values, osz, od));
  }
  if (indices.numel() == 0) return Error::Ok;
  constexpr DtypeSet kSelf = selected_dtypes(key, "self") &
                             dtype_set(ScalarType::Float, ScalarType::Long, ScalarType::Int);
  const bool built = dispatch_dtype<kSelf>(self.dtype(), [&](auto c) {
    using T = decltype(c);
    arg_extreme<kMax, T>(ctx, a, self.data_as<T>(), indices.data_as<int64_t>(),
                         values ? values->data_as<T>() : nullptr);
  });
  if (!built) return dtype_not_built(key, "self", self.dtype());
  return Error::Ok;
}

}  // namespace

Error argmax_out(KernelContext& ctx, const Tensor& self, Optional<int64_t> dim, bool keepdim,
                 Tensor& out) {
  return extreme_along<Extreme::ArgMax>(ctx, "argmax", self, dim, keepdim, nullptr, out);
}

Error argmin_out(KernelContext& ctx, const Tensor& self, Optional<int64_t> dim, bool keepdim,
                 Tensor& out) {
  return extreme_along<Extreme::ArgMin>(ctx, "argmin", self, dim, keepdim, nullptr, out);
}

Error max_dim_max(KernelContext& ctx, const Tensor& self, int64_t dim, bool keepdim, Tensor& values,
                  Tensor& indices) {
  return extreme_along<Extreme::Max>(ctx, "max", self, Optional<int64_t>(dim), keepdim, &values,
                                     indices);
}

Error min_dim_min(KernelContext& ctx, const Tensor& self, int64_t dim, bool keepdim, Tensor& values,
                  Tensor& indices) {
  return extreme_along<Extreme::Min>(ctx, "min", self, Optional<int64_t>(dim), keepdim, &values,
                                     indices);
}

Error cumsum_out(KernelContext& ctx, const Tensor& self, int64_t dim, Optional<ScalarType> dtype,
                 Tensor& out) {
  const char* op = "cumsum";
  // torch's result dtype: the given one, else Long for integer and Bool inputs.
  const ScalarType want = dtype.has_value             ? dtype.value
                          : is_floating(self.dtype()) ? self.dtype()
                                                      : ScalarType::Long;
  if (out.dtype() != want)
    return fail(Error::InvalidArgument, "%s: out has dtype %s, expected %s", op,
                scalar_type_name(out.dtype()), scalar_type_name(want));
  if (!is_floating(out.dtype()) && is_floating(self.dtype()))
    return fail(Error::InvalidArgument, "%s: a %s input needs a floating output, got %s", op,
                scalar_type_name(self.dtype()), scalar_type_name(out.dtype()));
  int64_t d = 0;
  ETB_TRY(wrap_dim(dim, self.dim(), &d, op));
  ETB_TRY(out.resize(self.sizes()));
  if (self.numel() == 0) return Error::Ok;
  const AlongDim along = along_dim(self, d);
  const int64_t outer = along.outer, len = along.len, inner = along.inner;
  constexpr DtypeSet kSelf = selected_dtypes("aten::cumsum.out", "self") & kLoadableDtypes;
  constexpr DtypeSet kOut =
      selected_dtypes("aten::cumsum.out", "out") & dtype_set(ScalarType::Float, ScalarType::Long);
  // The running sums of one [len, inner] block, in double for a Float output (as torch
  // accumulates on CPU), in int64 wrapping around like ATen for a Long one.
  Error err = Error::Ok;
  bool built_self = false;
  const bool built_out = dispatch_dtype<kOut>(out.dtype(), [&](auto o_tag) {
    using O = decltype(o_tag);
    using A = typename std::conditional<std::is_floating_point<O>::value, double, uint64_t>::type;
    built_self = dispatch_dtype<kSelf>(self.dtype(), [&](auto x_tag) {
      using X = decltype(x_tag);
      if constexpr (std::is_floating_point<X>::value && !std::is_floating_point<O>::value) {
        err = fail(Error::InvalidArgument, "%s: a floating input needs a floating output", op);
      } else {
        Result<void*> mem = ctx.allocate_temp(size_t(inner) * sizeof(A));
        if (!mem.ok()) {
          err = mem.error();
          return;
        }
        A* acc = static_cast<A*>(mem.value());
        const X* x = self.data_as<X>();
        O* y = out.data_as<O>();
        for (int64_t o = 0; o < outer; ++o) {
          for (int64_t i = 0; i < inner; ++i) acc[i] = A(0);
          const int64_t base = o * len * inner;
          for (int64_t k = 0; k < len; ++k) {
            const X* xr = x + base + k * inner;
            O* yr = y + base + k * inner;
            for (int64_t i = 0; i < inner; ++i) {
              if constexpr (std::is_same<X, bool>::value)
                acc[i] += A(reinterpret_cast<const uint8_t*>(xr)[i] != 0);
              else if constexpr (std::is_floating_point<O>::value)
                acc[i] += A(xr[i]);
              else
                acc[i] += uint64_t(int64_t(xr[i]));
              yr[i] = O(acc[i]);
            }
          }
        }
      }
    });
  });
  if (!built_out) return dtype_not_built("aten::cumsum.out", "out", out.dtype());
  if (!built_self) return dtype_not_built("aten::cumsum.out", "self", self.dtype());
  return err;
}

}  // namespace native
}  // namespace etb
