// Comparisons (eq, ne, lt, le, gt, ge; tensor-tensor with broadcasting and tensor-scalar) into
// Bool tensors, and where(condition, self, other) with broadcasting of all three.
#include <type_traits>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

enum class Cmp { Eq, Ne, Lt, Le, Gt, Ge };

template <Cmp OP, typename C>
inline bool compare(C a, C b) {
  switch (OP) {
    case Cmp::Eq: return a == b;
    case Cmp::Ne: return a != b;
    case Cmp::Lt: return a < b;
    case Cmp::Le: return a <= b;
    case Cmp::Gt: return a > b;
    case Cmp::Ge: return a >= b;
  }
  return false;
}

constexpr const char* cmp_name(Cmp op) {
  switch (op) {
    case Cmp::Eq: return "eq";
    case Cmp::Ne: return "ne";
    case Cmp::Lt: return "lt";
    case Cmp::Le: return "le";
    case Cmp::Gt: return "gt";
    case Cmp::Ge: return "ge";
  }
  return "";
}

// The operator a comparison kernel implements, whose dtype selection it compiles for.
constexpr const char* cmp_key(Cmp op, bool scalar) {
  switch (op) {
    case Cmp::Eq: return scalar ? "aten::eq.Scalar_out" : "aten::eq.Tensor_out";
    case Cmp::Ne: return scalar ? "aten::ne.Scalar_out" : "aten::ne.Tensor_out";
    case Cmp::Lt: return scalar ? "aten::lt.Scalar_out" : "aten::lt.Tensor_out";
    case Cmp::Le: return scalar ? "aten::le.Scalar_out" : "aten::le.Tensor_out";
    case Cmp::Gt: return scalar ? "aten::gt.Scalar_out" : "aten::gt.Tensor_out";
    case Cmp::Ge: return scalar ? "aten::ge.Scalar_out" : "aten::ge.Tensor_out";
  }
  return "";
}

// The element type a dtype's data is read as: Bool elements are bytes.
template <typename C>
using Elem = typename std::conditional<std::is_same<C, bool>::value, uint8_t, C>::type;

// The dtypes the comparisons take.
constexpr DtypeSet kCmpDtypes =
    dtype_set(ScalarType::Float, ScalarType::Long, ScalarType::Int, ScalarType::Bool);

template <Cmp OP>
Error compare_tensor(const KernelContext& ctx, const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* key = cmp_key(OP, false);
  constexpr DtypeSet kA = selected_dtypes(key, "self") & kCmpDtypes;
  constexpr DtypeSet kB = selected_dtypes(key, "other") & kCmpDtypes;
  const char* op = cmp_name(OP);
  ETB_TRY(expect_dtype(out, ScalarType::Bool, op, "out"));
  int64_t sizes[kMaxDim];
  int dim = 0;
  ETB_TRY(broadcast_shape(a, b, sizes, &dim, op));
  ETB_TRY(resize_to(out, sizes, dim));
  if (!dtype_in(kA, a.dtype())) return dtype_not_built(key, "self", a.dtype());
  if (!dtype_in(kB, b.dtype())) return dtype_not_built(key, "other", b.dtype());
  if (out.numel() == 0) return Error::Ok;
  Broadcast2 p;
  make_broadcast2(a, b, out.sizes(), &p);
  uint8_t* o = static_cast<uint8_t*>(out.data());
  auto rows = [&](auto&& row) {
    parallel_range(ctx, out.numel(), 1, [&](int64_t s, int64_t e) { for_each_row(p, s, e, row); });
  };
  if (a.dtype() == b.dtype()) {  // one dtype: compare the elements as they are
    const bool done = dispatch_dtype<kA & kB>(a.dtype(), [&](auto c) {
      using T = Elem<decltype(c)>;
      const T* x = static_cast<const T*>(a.data());
      const T* y = static_cast<const T*>(b.data());
      rows([&](int64_t oo, int64_t oa, int64_t sa, int64_t ob, int64_t sb, int64_t n) {
        if (sa == 1 && sb == 1) {
          for (int64_t i = 0; i < n; ++i) o[oo + i] = compare<OP>(x[oa + i], y[ob + i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[oo + i] = compare<OP>(x[oa + i * sa], y[ob + i * sb]);
        }
      });
    });
    if (done) return Error::Ok;
  }
  // Mixed dtypes compare in the promoted type: Float when either is, else int64.
  const bool as_float = is_floating(a.dtype()) || is_floating(b.dtype());
  const void* ad = a.data();
  const void* bd = b.data();
  const ScalarType at = a.dtype(), bt = b.dtype();
  rows([&](int64_t oo, int64_t oa, int64_t sa, int64_t ob, int64_t sb, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (as_float)
        o[oo + i] = compare<OP>(load_as<float, kA>(ad, at, oa + i * sa),
                                load_as<float, kB>(bd, bt, ob + i * sb));
      else
        o[oo + i] = compare<OP>(load_as<int64_t, kA>(ad, at, oa + i * sa),
                                load_as<int64_t, kB>(bd, bt, ob + i * sb));
    }
  });
  return Error::Ok;
}

// self against a number, compared as torch does: a Float tensor against the number as a
// float; an integer or Bool tensor against an integer as int64, against a float as float.
template <Cmp OP>
Error compare_scalar(const KernelContext& ctx, const Tensor& self, const Scalar& other,
                     Tensor& out) {
  constexpr const char* key = cmp_key(OP, true);
  constexpr DtypeSet kA = selected_dtypes(key, "self") & kCmpDtypes;
  const char* op = cmp_name(OP);
  ETB_TRY(expect_dtype(out, ScalarType::Bool, op, "out"));
  if (!other.is_int() && !other.is_double() && !other.is_bool())
    return fail(Error::InvalidArgument, "%s: other must be a number", op);
  ETB_TRY(out.resize(self.sizes()));
  uint8_t* o = static_cast<uint8_t*>(out.data());
  const bool built = dispatch_dtype<kA>(self.dtype(), [&](auto c) {
    using T = Elem<decltype(c)>;
    const T* x = static_cast<const T*>(self.data());
    auto run = [&](auto s) {
      using C = decltype(s);
      parallel_range(ctx, self.numel(), 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) o[i] = compare<OP>(C(x[i]), s);
      });
    };
    if (std::is_floating_point<T>::value || other.is_double())
      run(float(other.to_double()));
    else
      run(int64_t(other.to_int()));
  });
  if (!built) return dtype_not_built(key, "self", self.dtype());
  return Error::Ok;
}

// A broadcast of three operands against the (contiguous) output: sizes and, per operand,
// element strides (0 along its broadcast dims).
struct Broadcast3 {
  int dim = 0;
  int64_t sizes[kMaxDim];
  int64_t st[3][kMaxDim];
};

Error make_broadcast3(const Tensor* const t[3], const char* op, Broadcast3* p) {
  int n = 0;
  for (int k = 0; k < 3; ++k) n = t[k]->dim() > n ? t[k]->dim() : n;
  p->dim = n;
  for (int i = 0; i < n; ++i) {
    int64_t s = 1;
    for (int k = 0; k < 3; ++k) {
      const int j = t[k]->dim() - n + i;
      const int64_t z = j >= 0 ? t[k]->size(j) : 1;
      if (z != 1 && s != 1 && z != s) {
        char x[160];
        return fail(Error::InvalidArgument, "%s: sizes %s do not broadcast at dim %d", op,
                    format_sizes(t[k]->sizes(), x, sizeof(x)), i);
      }
      s = z == 1 ? s : z;
    }
    p->sizes[i] = s;
  }
  for (int k = 0; k < 3; ++k) {
    int64_t stride = 1;
    for (int i = n - 1; i >= 0; --i) {
      const int j = t[k]->dim() - n + i;
      const int64_t z = j >= 0 ? t[k]->size(j) : 1;
      p->st[k][i] = z == 1 ? 0 : stride;
      stride *= z;
    }
  }
  return Error::Ok;
}

// Calls f(out_offset, offsets[3], n) for every row of the last dim in rows [begin, end).
template <typename F>
void for_each_row3(const Broadcast3& p, int64_t begin, int64_t end, F&& f) {
  const int last = p.dim - 1;
  const int64_t inner = p.dim == 0 ? 1 : p.sizes[last];
  int64_t idx[kMaxDim] = {};
  int64_t off[3] = {0, 0, 0};
  int64_t r = begin;
  for (int d = last - 1; d >= 0; --d) {
    idx[d] = r % p.sizes[d];
    r /= p.sizes[d];
    for (int k = 0; k < 3; ++k) off[k] += idx[d] * p.st[k][d];
  }
  for (int64_t row = begin; row < end; ++row) {
    f(row * inner, off, inner);
    for (int d = last - 1; d >= 0; --d) {
      for (int k = 0; k < 3; ++k) off[k] += p.st[k][d];
      if (++idx[d] < p.sizes[d]) break;
      for (int k = 0; k < 3; ++k) off[k] -= p.st[k][d] * p.sizes[d];
      idx[d] = 0;
    }
  }
}

}  // namespace

#define ETB_COMPARE_KERNELS(name, OP)                                                  \
  Error name##_tensor_out(KernelContext& ctx, const Tensor& self, const Tensor& other, \
                          Tensor& out) {                                               \
    return compare_tensor<OP>(ctx, self, other, out);                                  \
  }                                                                                    \
  Error name##_scalar_out(KernelContext& ctx, const Tensor& self, const Scalar& other, \
                          Tensor& out) {                                               \
    return compare_scalar<OP>(ctx, self, other, out);                                  \
  }

ETB_COMPARE_KERNELS(eq, Cmp::Eq)
ETB_COMPARE_KERNELS(ne, Cmp::Ne)
ETB_COMPARE_KERNELS(lt, Cmp::Lt)
ETB_COMPARE_KERNELS(le, Cmp::Le)
ETB_COMPARE_KERNELS(gt, Cmp::Gt)
ETB_COMPARE_KERNELS(ge, Cmp::Ge)

#undef ETB_COMPARE_KERNELS

Error where_self_out(KernelContext& ctx, const Tensor& condition, const Tensor& self,
                     const Tensor& other, Tensor& out) {
  const char* op = "where";
  constexpr const char* key = "aten::where.self_out";
  ETB_TRY(expect_dtype(condition, ScalarType::Bool, op, "condition"));
  const bool same = self.dtype() == out.dtype() && other.dtype() == out.dtype();
  if (!is_floating(out.dtype()) && (is_floating(self.dtype()) || is_floating(other.dtype())))
    return fail(Error::InvalidArgument, "%s: result type Float can't be cast to the output %s", op,
                scalar_type_name(out.dtype()));
  const Tensor* const ts[3] = {&condition, &self, &other};
  Broadcast3 p;
  ETB_TRY(make_broadcast3(ts, op, &p));
  ETB_TRY(resize_to(out, p.sizes, p.dim));
  if (out.numel() == 0) return Error::Ok;
  constexpr DtypeSet kSelf = selected_dtypes(key, "self") & kLoadableDtypes;
  constexpr DtypeSet kOther = selected_dtypes(key, "other") & kLoadableDtypes;
  constexpr DtypeSet kOut = selected_dtypes(key, "out") & kLoadableDtypes;
  if (!dtype_in(kSelf, self.dtype())) return dtype_not_built(key, "self", self.dtype());
  if (!dtype_in(kOther, other.dtype())) return dtype_not_built(key, "other", other.dtype());
  const uint8_t* c = static_cast<const uint8_t*>(condition.data());
  const int64_t inner = p.dim == 0 ? 1 : p.sizes[p.dim - 1];
  const int64_t rows = out.numel() / inner;
  const bool built = dispatch_dtype<kOut>(out.dtype(), [&](auto tag) {
    using T = Elem<decltype(tag)>;
    constexpr bool kBoolOut = std::is_same<decltype(tag), bool>::value;
    using C = typename std::conditional<std::is_floating_point<T>::value, double, int64_t>::type;
    T* o = static_cast<T*>(out.data());
    const T* x = static_cast<const T*>(self.data());
    const T* y = static_cast<const T*>(other.data());
    const void* xd = self.data();
    const void* yd = other.data();
    const ScalarType xt = self.dtype(), yt = other.dtype();
    parallel_range(ctx, rows, inner, [&](int64_t b, int64_t e) {
      for_each_row3(p, b, e, [&](int64_t oo, const int64_t* off, int64_t n) {
        const int64_t sc = p.dim == 0 ? 0 : p.st[0][p.dim - 1];
        const int64_t sx = p.dim == 0 ? 0 : p.st[1][p.dim - 1];
        const int64_t sy = p.dim == 0 ? 0 : p.st[2][p.dim - 1];
        if (same) {
          for (int64_t i = 0; i < n; ++i)
            o[oo + i] = c[off[0] + i * sc] ? x[off[1] + i * sx] : y[off[2] + i * sy];
        } else {
          for (int64_t i = 0; i < n; ++i) {
            const C v = c[off[0] + i * sc] ? load_as<C, kSelf>(xd, xt, off[1] + i * sx)
                                           : load_as<C, kOther>(yd, yt, off[2] + i * sy);
            o[oo + i] = kBoolOut ? T(v != C(0)) : T(v);
          }
        }
      });
    });
  });
  if (!built) return dtype_not_built(key, "out", out.dtype());
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
