// Kernels that make a tensor of another's shape: full_like (a constant) and _to_copy (a cast:
// `.float()`, `.long()`, `.to(dtype)`).
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

// The memory formats a kernel accepts: none given, contiguous (0) or preserve (1); the runtime's
// tensors are contiguous.
Error expect_contiguous_format(Optional<int64_t> memory_format, const char* op) {
  if (memory_format.has_value && memory_format.value != 0 && memory_format.value != 1)
    return fail(Error::NotSupported,
                "%s: memory format %lld is not supported (tensors are contiguous)", op,
                (long long)memory_format.value);
  return Error::Ok;
}

// v as the integer type T, as a C cast would give it where that is defined; NaN gives 0 and
// values beyond T's range saturate, where C++ leaves the result undefined.
template <typename T>
T float_to_int(double v) {
  if (v != v) return T(0);
  if (v <= double(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= double(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return T(v);
}

}  // namespace

Error full_like_out(KernelContext& ctx, const Tensor& self, const Scalar& fill_value,
                    Optional<int64_t> memory_format, Tensor& out) {
  constexpr const char* key = "aten::full_like.out";
  constexpr DtypeSet kOut = selected_dtypes(key, "out") & kLoadableDtypes;
  ETB_TRY(expect_contiguous_format(memory_format, "full_like"));
  if (!fill_value.is_int() && !fill_value.is_double() && !fill_value.is_bool())
    return fail(Error::InvalidArgument, "full_like: the fill value must be a number");
  ETB_TRY(out.resize(self.sizes()));
  const bool built = dispatch_dtype<kOut>(out.dtype(), [&](auto c) {
    using C = decltype(c);
    using T = typename std::conditional<std::is_same<C, bool>::value, uint8_t, C>::type;
    T v;
    if constexpr (std::is_same<C, bool>::value)
      v = fill_value.to_double() != 0.0;
    else if constexpr (std::is_floating_point<C>::value)
      v = T(fill_value.to_double());
    else
      v = fill_value.is_double() ? float_to_int<T>(fill_value.to_double()) : T(fill_value.to_int());
    T* o = static_cast<T*>(out.data());
    parallel_range(ctx, out.numel(), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = v;
    });
  });
  if (!built) return dtype_not_built(key, "out", out.dtype());
  return Error::Ok;
}

Error to_copy_out(KernelContext& ctx, const Tensor& self, bool non_blocking,
                  Optional<int64_t> memory_format, Tensor& out) {
  (void)non_blocking;  // a host-side copy: nothing to overlap
  constexpr const char* key = "aten::_to_copy.out";
  constexpr DtypeSet kSelf = selected_dtypes(key, "self") & kLoadableDtypes;
  constexpr DtypeSet kOut = selected_dtypes(key, "out") & kLoadableDtypes;
  ETB_TRY(expect_contiguous_format(memory_format, "_to_copy"));
  if (!dtype_in(kSelf, self.dtype())) return dtype_not_built(key, "self", self.dtype());
  ETB_TRY(out.resize(self.sizes()));
  const ScalarType st = self.dtype();
  const void* x = self.data();
  const int64_t n = self.numel();
  if (st == out.dtype()) {
    if (out.data() != x) memcpy(out.data(), x, self.nbytes());
    return Error::Ok;
  }
  const bool built = dispatch_dtype<kOut>(out.dtype(), [&](auto c) {
    using C = decltype(c);
    using T = typename std::conditional<std::is_same<C, bool>::value, uint8_t, C>::type;
    T* o = static_cast<T*>(out.data());
    parallel_range(ctx, n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        if constexpr (std::is_same<C, bool>::value) {
          o[i] = load_as<double, kSelf>(x, st, i) != 0.0;
        } else if constexpr (std::is_floating_point<C>::value) {
          // Integers convert to float as a C cast does (round to nearest).
          o[i] = is_floating(st) ? T(load_as<double, kSelf>(x, st, i))
                                 : T(load_as<int64_t, kSelf>(x, st, i));
        } else {
          // Floats truncate toward zero; integers wrap to the narrower type, as in torch.
          o[i] = is_floating(st) ? float_to_int<T>(load_as<double, kSelf>(x, st, i))
                                 : T(load_as<int64_t, kSelf>(x, st, i));
        }
      }
    });
  });
  if (!built) return dtype_not_built(key, "out", out.dtype());
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
