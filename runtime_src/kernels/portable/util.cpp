#include "kernels/portable/util.h"

#include <cmath>

#include "kernels/portable/kernel_isa.h"
#include "kernels/simd.h"

namespace etb {
namespace native {

void softmax_with_max(const float* x, float* y, int64_t len, int64_t stride, float max) {
  float sum = 0.f;
  for (int64_t k = 0; k < len; ++k) {
    const float e = std::exp(x[k * stride] - max);
    y[k * stride] = e;
    sum += e;
  }
  const float r = 1.f / sum;
  for (int64_t k = 0; k < len; ++k) y[k * stride] *= r;
}

void log_softmax_with_max(const float* x, float* y, int64_t len, int64_t stride, float max) {
  float sum = 0.f;
  for (int64_t k = 0; k < len; ++k) sum += std::exp(x[k * stride] - max);
  const float shift = max + std::log(sum);
  for (int64_t k = 0; k < len; ++k) y[k * stride] = x[k * stride] - shift;
}

void mean_and_rstd(const float* x, int64_t n, double eps, float* mean, float* rstd) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double m = n > 0 ? sum / double(n) : 0.0;
  double var = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double dv = double(x[i]) - m;
    var += dv * dv;
  }
  *mean = float(m);
  *rstd = float(1.0 / std::sqrt((n > 0 ? var / double(n) : 0.0) + eps));
}

Error dtype_not_built(const char* op, const char* arg, ScalarType dtype) {
  return fail(Error::NotSupported,
              "%s: argument '%s' has dtype %s, which this runtime was not built with; rebuild "
              "the runtime with this program's selected_operators.yaml",
              op, arg, scalar_type_name(dtype));
}

Error broadcast_shape(const Tensor& a, const Tensor& b, int64_t* sizes, int* dim,
                      const char* op) {
  int n = a.dim() > b.dim() ? a.dim() : b.dim();
  for (int i = 0; i < n; ++i) {
    int ia = a.dim() - n + i, ib = b.dim() - n + i;
    int64_t sa = ia >= 0 ? a.size(ia) : 1;
    int64_t sb = ib >= 0 ? b.size(ib) : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      char x[160], y[160];
      return fail(Error::InvalidArgument, "%s: sizes %s and %s do not broadcast", op,
                  format_sizes(a.sizes(), x, sizeof(x)), format_sizes(b.sizes(), y, sizeof(y)));
    }
    sizes[i] = sa == 1 ? sb : sa;
  }
  *dim = n;
  return Error::Ok;
}

void make_broadcast2(const Tensor& a, const Tensor& b, Span<const int64_t> out_sizes,
                     Broadcast2* p) {
  const int n = int(out_sizes.size());
  int64_t sizes[kMaxDim], sa[kMaxDim], sb[kMaxDim];
  int64_t stride_a = 1, stride_b = 1;
  for (int i = n - 1; i >= 0; --i) {
    int ia = a.dim() - n + i, ib = b.dim() - n + i;
    int64_t za = ia >= 0 ? a.size(ia) : 1;
    int64_t zb = ib >= 0 ? b.size(ib) : 1;
    sizes[i] = out_sizes[i];
    sa[i] = za == 1 ? 0 : stride_a;
    sb[i] = zb == 1 ? 0 : stride_b;
    stride_a *= za;
    stride_b *= zb;
  }
  // Drop size-1 dims, then merge neighbours whose strides chain.
  int m = 0;
  for (int i = 0; i < n; ++i) {
    if (sizes[i] == 1) continue;
    if (m > 0 && p->sa[m - 1] == sa[i] * sizes[i] && p->sb[m - 1] == sb[i] * sizes[i]) {
      p->sizes[m - 1] *= sizes[i];
      p->sa[m - 1] = sa[i];
      p->sb[m - 1] = sb[i];
      continue;
    }
    p->sizes[m] = sizes[i];
    p->sa[m] = sa[i];
    p->sb[m] = sb[i];
    ++m;
  }
  if (m == 0) {
    p->sizes[0] = 1;
    p->sa[0] = 0;
    p->sb[0] = 0;
    m = 1;
  }
  p->dim = m;
}

Error plan_reduction(const Tensor& self, Span<const int64_t> dims, bool keepdim, const char* op,
                     Reduction* r) {
  const int nd = self.dim();
  if (dims.size() == 0) {
    for (int i = 0; i < nd; ++i) r->reduce[i] = true;
  } else {
    for (int64_t d : dims) {
      int64_t w = 0;
      ETB_TRY(wrap_dim(d, nd, &w, op));
      if (nd > 0) {
        if (r->reduce[w])
          return fail(Error::InvalidArgument, "%s: dim %lld repeated", op, (long long)d);
        r->reduce[w] = true;
      }
    }
  }
  for (int i = 0; i < nd; ++i) {
    if (r->reduce[i]) {
      r->count *= self.size(i);
      if (keepdim) r->osz[r->od++] = 1;
    } else {
      r->osz[r->od++] = self.size(i);
      if (i > 0 && r->reduce[i - 1]) r->innermost = false;  // a kept dim after a reduced one
    }
  }
  return Error::Ok;
}

Error check_elementwise_dim_orders(const char* op, const Tensor& out, const Tensor& a,
                                   const Tensor* b) {
  if (out.is_contiguous() && a.is_contiguous() && (b == nullptr || b->is_contiguous()))
    return Error::Ok;
  const bool same = same_dim_order(out, a) && (b == nullptr || same_dim_order(out, *b));
  bool sizes = same;
  for (int d = 0; same && d < out.dim(); ++d)
    sizes = sizes && a.size(d) == out.size(d) && (b == nullptr || b->size(d) == out.size(d));
  if (!same || !sizes)
    return fail(Error::NotSupported,
                "%s: a channels-last argument needs every tensor channels-last and of one shape "
                "(broadcasting takes contiguous tensors); the program is not etbuild's",
                op);
  return Error::Ok;
}

}  // namespace native

// Compiled with the kernel flags (ETB_ARCH), so it names the path the kernels took.
const char* kernel_isa() {
  return simd::kIsa;
}

}  // namespace etb
