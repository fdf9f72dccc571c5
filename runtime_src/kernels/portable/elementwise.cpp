// Elementwise kernels: binary arithmetic with broadcasting and type promotion, and the
// unary activations.
#include <cmath>
#include <type_traits>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

enum class BinOp { Add, Sub, Mul, Div, Max, Min };

template <typename C>
inline C apply(BinOp op, C a, C b, C alpha) {
  if constexpr (std::is_integral<C>::value) {
    // Two's-complement wrap-around like ATen, without signed-overflow UB.
    using U = typename std::make_unsigned<C>::type;
    switch (op) {
      case BinOp::Add: return C(U(a) + U(alpha) * U(b));
      case BinOp::Sub: return C(U(a) - U(alpha) * U(b));
      case BinOp::Mul: return C(U(a) * U(b));
      case BinOp::Div: return b == 0 ? C(0) : C(a / b);
      case BinOp::Max: return a > b ? a : b;
      case BinOp::Min: return a < b ? a : b;
    }
  } else {
    switch (op) {
      case BinOp::Add: return a + alpha * b;
      case BinOp::Sub: return a - alpha * b;
      case BinOp::Mul: return a * b;
      case BinOp::Div: return a / b;
      // torch.maximum/minimum propagate NaN from either side.
      case BinOp::Max: return (a != a || b != b) ? a + b : (a > b ? a : b);
      case BinOp::Min: return (a != a || b != b) ? a + b : (a < b ? a : b);
    }
  }
  return a;
}

// Calls row(...) (see for_each_row) for every output element, split over ctx's threads: on
// planes of `plane` pixels that are large (splits_pixels), each thread takes a run of pixels
// of every plane, as the convolutions around split them; else runs of the elements.
template <typename F>
void parallel_rows(const KernelContext& ctx, const Broadcast2& p, int64_t numel, int64_t plane,
                   F&& row) {
  if (splits_pixels(plane, ctx.num_threads()) && numel > plane) {
    const int64_t planes = numel / plane;
    parallel_range(ctx, plane, planes, [&](int64_t b, int64_t e) {
      for (int64_t i = 0; i < planes; ++i) for_each_row(p, i * plane + b, i * plane + e, row);
    });
    return;
  }
  parallel_range(ctx, numel, 1, [&](int64_t b, int64_t e) { for_each_row(p, b, e, row); });
}

// Same-dtype fast path: out, a, b all of type T; the op is a template parameter so the inner
// loops have no branches and vectorize.
template <typename T, BinOp OP>
void binary_same(const KernelContext& ctx, const Broadcast2& p, int64_t numel, int64_t plane,
                 const T* a, const T* b, T* out, T alpha) {
  parallel_rows(ctx, p, numel, plane,
                [&](int64_t oo, int64_t oa, int64_t sa, int64_t ob, int64_t sb, int64_t n) {
                  T* o = out + oo;
                  const T* x = a + oa;
                  const T* y = b + ob;
                  if (sa == 1 && sb == 1) {
                    for (int64_t i = 0; i < n; ++i) o[i] = apply<T>(OP, x[i], y[i], alpha);
                  } else if (sa == 0 && sb == 1) {
                    const T xv = x[0];
                    for (int64_t i = 0; i < n; ++i) o[i] = apply<T>(OP, xv, y[i], alpha);
                  } else if (sa == 1 && sb == 0) {
                    const T yv = y[0];
                    for (int64_t i = 0; i < n; ++i) o[i] = apply<T>(OP, x[i], yv, alpha);
                  } else {
                    for (int64_t i = 0; i < n; ++i)
                      o[i] = apply<T>(OP, x[i * sa], y[i * sb], alpha);
                  }
                });
}

// Mixed dtypes: load each element converted to the compute type C. kA, kB and kOut are the
// dtypes the loads and stores are compiled for.
template <typename C, DtypeSet kA, DtypeSet kB, DtypeSet kOut>
void binary_mixed(const KernelContext& ctx, BinOp op, const Broadcast2& p, const Tensor& a,
                  const Tensor& b, Tensor& out, C alpha) {
  const void* ad = a.data();
  const void* bd = b.data();
  void* od = out.data();
  ScalarType at = a.dtype(), bt = b.dtype(), ot = out.dtype();
  parallel_rows(ctx, p, out.numel(), plane_pixels(out),
                [&](int64_t oo, int64_t oa, int64_t sa, int64_t ob, int64_t sb, int64_t n) {
                  for (int64_t i = 0; i < n; ++i) {
                    C x = load_as<C, kA>(ad, at, oa + i * sa);
                    C y = load_as<C, kB>(bd, bt, ob + i * sb);
                    store_as<C, kOut>(od, ot, oo + i, apply<C>(op, x, y, alpha));
                  }
                });
}

// The operator each binary kernel implements, whose dtype selection it compiles for.
constexpr const char* op_key(BinOp op) {
  switch (op) {
    case BinOp::Add: return "aten::add.out";
    case BinOp::Sub: return "aten::sub.out";
    case BinOp::Mul: return "aten::mul.out";
    case BinOp::Div: return "aten::div.out";
    case BinOp::Max: return "aten::maximum.out";
    case BinOp::Min: return "aten::minimum.out";
  }
  return "";
}

// The dtypes with a same-dtype fast path.
constexpr DtypeSet kFastDtypes = dtype_set(ScalarType::Float, ScalarType::Long, ScalarType::Int);

// True when a call with dtypes from kA, kB, kOut can miss the same-dtype fast paths (kSame):
// then the mixed path is needed.
constexpr bool needs_mixed(DtypeSet kA, DtypeSet kB, DtypeSet kOut, DtypeSet kSame) {
  if (dtype_set_empty(kA) || dtype_set_empty(kB) || dtype_set_empty(kOut)) return false;
  const bool one_dtype = kA == kB && kB == kOut && (uint32_t(kA) & (uint32_t(kA) - 1)) == 0;
  return !(one_dtype && (kA & kSame) == kA);
}

// `s` as the compute type T.
template <typename T>
T scalar_as(const Scalar& s) {
  if constexpr (std::is_floating_point<T>::value)
    return T(s.to_double());
  else
    return T(s.to_int());
}

template <BinOp OP>
Error binary(const KernelContext& ctx, const char* name, const Tensor& a, const Tensor& b,
             const Scalar& alpha, Tensor& out) {
  // The dtypes this build selected per argument: only their paths are compiled.
  constexpr DtypeSet kA = selected_dtypes(op_key(OP), "self") & kLoadableDtypes;
  constexpr DtypeSet kB = selected_dtypes(op_key(OP), "other") & kLoadableDtypes;
  constexpr DtypeSet kOut = selected_dtypes(op_key(OP), "out") & kLoadableDtypes;
  constexpr DtypeSet kSame = kA & kB & kOut & kFastDtypes;
  int64_t sizes[kMaxDim];
  int dim = 0;
  ETB_TRY(broadcast_shape(a, b, sizes, &dim, name));
  ETB_TRY(resize_to(out, sizes, dim));
  ETB_TRY(check_elementwise_dim_orders(name, out, a, &b));
  if (!is_loadable(a.dtype()) || !is_loadable(b.dtype()) || !is_loadable(out.dtype()))
    return fail(Error::NotSupported, "%s: unsupported dtype", name);
  const bool out_float = is_floating(out.dtype());
  if (!out_float && (is_floating(a.dtype()) || is_floating(b.dtype())))
    return fail(Error::InvalidArgument, "%s: result type Float can't be cast to the output %s",
                name, scalar_type_name(out.dtype()));
  if (!out_float && !alpha.is_int() && !alpha.is_bool() && (OP == BinOp::Add || OP == BinOp::Sub))
    return fail(Error::InvalidArgument, "%s: a float alpha needs a floating output", name);
  Broadcast2 p;
  make_broadcast2(a, b, out.sizes(), &p);
  if (a.dtype() == out.dtype() && b.dtype() == out.dtype()) {
    const bool done = dispatch_dtype<kSame>(out.dtype(), [&](auto c) {
      using T = decltype(c);
      binary_same<T, OP>(ctx, p, out.numel(), plane_pixels(out), a.data_as<T>(), b.data_as<T>(),
                         out.data_as<T>(), scalar_as<T>(alpha));
    });
    if (done) return Error::Ok;
  }
  if (out_float) {
    constexpr DtypeSet kFloatOut = kOut & kFloatingDtypes;
    if constexpr (needs_mixed(kA, kB, kFloatOut, kSame)) {
      binary_mixed<double, kA, kB, kFloatOut>(ctx, OP, p, a, b, out, alpha.to_double());
      return Error::Ok;
    }
  } else {
    // Integer and Bool outputs take integer inputs only (checked above).
    constexpr DtypeSet kIntA = kA & ~kFloatingDtypes, kIntB = kB & ~kFloatingDtypes;
    constexpr DtypeSet kIntOut = kOut & ~kFloatingDtypes;
    if constexpr (needs_mixed(kIntA, kIntB, kIntOut, kSame)) {
      if (out.dtype() == ScalarType::Bool) {
        if (OP != BinOp::Mul)
          return fail(Error::NotSupported, "%s: Bool output is only supported for mul", name);
        binary_mixed<int64_t, kIntA, kIntB, kIntOut>(ctx, OP, p, a, b, out, 1);
      } else {
        binary_mixed<int64_t, kIntA, kIntB, kIntOut>(ctx, OP, p, a, b, out, alpha.to_int());
      }
      return Error::Ok;
    }
  }
  // Unreachable through the generated argument check, which refuses unselected dtypes.
  if (!dtype_in(kA, a.dtype())) return dtype_not_built(op_key(OP), "self", a.dtype());
  if (!dtype_in(kB, b.dtype())) return dtype_not_built(op_key(OP), "other", b.dtype());
  return dtype_not_built(op_key(OP), "out", out.dtype());
}

// Unary float kernels: out = f(self), elementwise, out may alias self.
template <typename F>
Error unary_float(const KernelContext& ctx, const char* name, const Tensor& self, Tensor& out,
                  F f) {
  ETB_TRY(expect_dtype(self, ScalarType::Float, name, "self"));
  ETB_TRY(expect_dtype(out, ScalarType::Float, name, "out"));
  ETB_TRY(out.resize(self.sizes()));
  ETB_TRY(check_elementwise_dim_orders(name, out, self));
  const float* x = self.data_as<float>();
  float* o = out.data_as<float>();
  parallel_range(ctx, self.numel(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = f(x[i]);
  });
  return Error::Ok;
}

}  // namespace

Error add_out(KernelContext& ctx, const Tensor& self, const Tensor& other, const Scalar& alpha,
              Tensor& out) {
  return binary<BinOp::Add>(ctx, "add", self, other, alpha, out);
}

Error sub_out(KernelContext& ctx, const Tensor& self, const Tensor& other, const Scalar& alpha,
              Tensor& out) {
  if (self.dtype() == ScalarType::Bool || other.dtype() == ScalarType::Bool)
    return fail(Error::InvalidArgument, "sub: Bool tensors are not supported");
  return binary<BinOp::Sub>(ctx, "sub", self, other, alpha, out);
}

Error mul_out(KernelContext& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  return binary<BinOp::Mul>(ctx, "mul", self, other, Scalar(int64_t(1)), out);
}

Error div_out(KernelContext& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  if (!is_floating(out.dtype()))
    return fail(Error::InvalidArgument, "div: true division needs a floating output, got %s",
                scalar_type_name(out.dtype()));
  return binary<BinOp::Div>(ctx, "div", self, other, Scalar(int64_t(1)), out);
}

Error maximum_out(KernelContext& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  return binary<BinOp::Max>(ctx, "maximum", self, other, Scalar(int64_t(1)), out);
}

Error minimum_out(KernelContext& ctx, const Tensor& self, const Tensor& other, Tensor& out) {
  return binary<BinOp::Min>(ctx, "minimum", self, other, Scalar(int64_t(1)), out);
}

Error relu_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "relu", self, out, [](float v) { return v > 0.f ? v : 0.f; });
}

Error hardtanh_out(KernelContext& ctx, const Tensor& self, const Scalar& min_val,
                   const Scalar& max_val, Tensor& out) {
  const float lo = float(min_val.to_double()), hi = float(max_val.to_double());
  return unary_float(ctx, "hardtanh", self, out,
                     [lo, hi](float v) { return v < lo ? lo : (v > hi ? hi : v); });
}

Error clamp_out(KernelContext& ctx, const Tensor& self, Optional<Scalar> min, Optional<Scalar> max,
                Tensor& out) {
  if (!min.has_value && !max.has_value)
    return fail(Error::InvalidArgument, "clamp: at least one of min and max must be given");
  const float lo = min.has_value ? float(min.value.to_double()) : -INFINITY;
  const float hi = max.has_value ? float(max.value.to_double()) : INFINITY;
  return unary_float(ctx, "clamp", self, out, [lo, hi](float v) {
    if (std::isnan(v)) return v;
    float r = v < lo ? lo : v;
    return r > hi ? hi : r;
  });
}

Error gelu_out(KernelContext& ctx, const Tensor& self, Span<const char> approximate, Tensor& out) {
  const bool is_none = approximate.size() == 4 && memcmp(approximate.data(), "none", 4) == 0;
  const bool is_tanh = approximate.size() == 4 && memcmp(approximate.data(), "tanh", 4) == 0;
  if (!is_none && !is_tanh)
    return fail(Error::InvalidArgument, "gelu: approximate must be 'none' or 'tanh'");
  if (is_tanh) {
    return unary_float(ctx, "gelu", self, out, [](float v) {
      const float k = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * v * (1.f + std::tanh(k * (v + 0.044715f * v * v * v)));
    });
  }
  return unary_float(ctx, "gelu", self, out,
                     [](float v) { return 0.5f * v * (1.f + std::erf(v * 0.7071067811865476f)); });
}

Error hardswish_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "hardswish", self, out, [](float v) {
    float r = v + 3.f;
    r = r < 0.f ? 0.f : (r > 6.f ? 6.f : r);
    return v * r * (1.f / 6.f);
  });
}

Error hardsigmoid_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "hardsigmoid", self, out, [](float v) {
    float r = v + 3.f;
    r = r < 0.f ? 0.f : (r > 6.f ? 6.f : r);
    return r * (1.f / 6.f);
  });
}

Error sigmoid_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "sigmoid", self, out, [](float v) { return 1.f / (1.f + std::exp(-v)); });
}

Error tanh_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "tanh", self, out, [](float v) { return std::tanh(v); });
}

Error exp_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "exp", self, out, [](float v) { return std::exp(v); });
}

Error log_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "log", self, out, [](float v) { return std::log(v); });
}

Error sqrt_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "sqrt", self, out, [](float v) { return std::sqrt(v); });
}

Error rsqrt_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "rsqrt", self, out, [](float v) { return 1.f / std::sqrt(v); });
}

Error abs_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "abs", self, out, [](float v) { return std::fabs(v); });
}

Error neg_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "neg", self, out, [](float v) { return -v; });
}

Error sin_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "sin", self, out, [](float v) { return std::sin(v); });
}

Error cos_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "cos", self, out, [](float v) { return std::cos(v); });
}

Error erf_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "erf", self, out, [](float v) { return std::erf(v); });
}

Error reciprocal_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "reciprocal", self, out, [](float v) { return 1.f / v; });
}

Error floor_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "floor", self, out, [](float v) { return std::floor(v); });
}

Error ceil_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "ceil", self, out, [](float v) { return std::ceil(v); });
}

Error round_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  // Halves to even, as torch.round: nearbyint in the default rounding mode.
  return unary_float(ctx, "round", self, out, [](float v) { return std::nearbyint(v); });
}

Error sign_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "sign", self, out,
                     [](float v) { return v > 0.f ? 1.f : (v < 0.f ? -1.f : v); });
}

Error expm1_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "expm1", self, out, [](float v) { return std::expm1(v); });
}

Error log1p_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return unary_float(ctx, "log1p", self, out, [](float v) { return std::log1p(v); });
}

Error leaky_relu_out(KernelContext& ctx, const Tensor& self, const Scalar& negative_slope,
                     Tensor& out) {
  const float slope = float(negative_slope.to_double());
  return unary_float(ctx, "leaky_relu", self, out,
                     [slope](float v) { return v > 0.f ? v : v * slope; });
}

Error elu_out(KernelContext& ctx, const Tensor& self, const Scalar& alpha, const Scalar& scale,
              const Scalar& input_scale, Tensor& out) {
  const float a = float(alpha.to_double()), s = float(scale.to_double());
  const float in = float(input_scale.to_double());
  return unary_float(ctx, "elu", self, out,
                     [a, s, in](float v) { return v > 0.f ? s * v : s * a * std::expm1(v * in); });
}

Error pow_tensor_scalar_out(KernelContext& ctx, const Tensor& self, const Scalar& exponent,
                            Tensor& out) {
  if (!exponent.is_int() && !exponent.is_double())
    return fail(Error::InvalidArgument, "pow: the exponent must be a number");
  const double e = exponent.to_double();
  // The exponents models use most, computed as torch computes them (exactly, not by powf).
  if (e == 1.0) return unary_float(ctx, "pow", self, out, [](float v) { return v; });
  if (e == 2.0) return unary_float(ctx, "pow", self, out, [](float v) { return v * v; });
  if (e == 3.0) return unary_float(ctx, "pow", self, out, [](float v) { return v * v * v; });
  if (e == 0.5) return unary_float(ctx, "pow", self, out, [](float v) { return std::sqrt(v); });
  if (e == -1.0) return unary_float(ctx, "pow", self, out, [](float v) { return 1.f / v; });
  const float ef = float(e);
  return unary_float(ctx, "pow", self, out, [ef](float v) { return std::pow(v, ef); });
}

Error mul_scalar_out(KernelContext& ctx, const Tensor& self, const Scalar& other, Tensor& out) {
  constexpr const char* key = "aten::mul.Scalar_out";
  constexpr DtypeSet kSelf = selected_dtypes(key, "self") & kLoadableDtypes;
  constexpr DtypeSet kOut = selected_dtypes(key, "out") & kLoadableDtypes;
  if (!other.is_int() && !other.is_double() && !other.is_bool())
    return fail(Error::InvalidArgument, "mul: other must be a number");
  const ScalarType st = self.dtype(), ot = out.dtype();
  if (!dtype_in(kSelf, st)) return dtype_not_built(key, "self", st);
  if (!dtype_in(kOut, ot)) return dtype_not_built(key, "out", ot);
  if (!is_floating(ot) && (is_floating(st) || other.is_double()))
    return fail(Error::InvalidArgument, "mul: result type Float can't be cast to the output %s",
                scalar_type_name(ot));
  ETB_TRY(out.resize(self.sizes()));
  const void* x = self.data();
  void* o = out.data();
  if (is_floating(ot)) {
    // As torch: the number is cast to the float type, the product computed in it.
    const float s = float(other.to_double());
    if (st == ScalarType::Float && ot == ScalarType::Float) {
      const float* xf = self.data_as<float>();
      float* of = out.data_as<float>();
      parallel_range(ctx, self.numel(), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) of[i] = xf[i] * s;
      });
      return Error::Ok;
    }
    parallel_range(ctx, self.numel(), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        store_as<float, kOut>(o, ot, i, load_as<float, kSelf>(x, st, i) * s);
    });
    return Error::Ok;
  }
  const int64_t s = other.to_int();
  parallel_range(ctx, self.numel(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      store_as<int64_t, kOut>(o, ot, i,
                              apply<int64_t>(BinOp::Mul, load_as<int64_t, kSelf>(x, st, i), s, 0));
  });
  return Error::Ok;
}

Error logical_not_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  constexpr const char* key = "aten::logical_not.out";
  constexpr DtypeSet kSelf = selected_dtypes(key, "self") & kLoadableDtypes;
  ETB_TRY(expect_dtype(out, ScalarType::Bool, "logical_not", "out"));
  if (!dtype_in(kSelf, self.dtype())) return dtype_not_built(key, "self", self.dtype());
  ETB_TRY(out.resize(self.sizes()));
  const void* x = self.data();
  const ScalarType st = self.dtype();
  uint8_t* o = static_cast<uint8_t*>(out.data());
  // NaN is true, as in torch: only zeros become true.
  parallel_range(ctx, self.numel(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = load_as<double, kSelf>(x, st, i) == 0.0;
  });
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
