// Reductions and pooling on Float tensors: softmax and log-softmax, layer norm, mean, variance,
// amax/amin, average and max pools.
#include <algorithm>
#include <cmath>

#include "kernels/portable/geometry.h"
#include "kernels/portable/util.h"
#include "kernels/simd.h"
#include "native_functions.h"

namespace etb {
namespace native {

namespace {

// softmax (kLog false) or log-softmax (kLog true) of self along dim into out.
template <bool kLog>
Error softmax_along(const KernelContext& ctx, const char* op, const Tensor& self, int64_t dim,
                    bool half_to_float, Tensor& out) {
  if (half_to_float) return fail(Error::NotSupported, "%s: half_to_float is not supported", op);
  int64_t d = 0;
  ETB_TRY(wrap_dim(dim, self.dim(), &d, op));
  ETB_TRY(out.resize(self.sizes()));
  if (self.numel() == 0) return Error::Ok;
  const AlongDim along = along_dim(self, d);
  const int64_t outer = along.outer, len = along.len, inner = along.inner;
  const float* x = self.data_as<float>();
  float* y = out.data_as<float>();
  // Each (outer, inner) pair is one softmax over `len` elements: the threads split them.
  parallel_range(ctx, outer * inner, len, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t o = u / inner, i = u - (u / inner) * inner;
      const float* xs = x + o * len * inner + i;
      float* ys = y + o * len * inner + i;
      float m = -INFINITY;
      for (int64_t k = 0; k < len; ++k) m = xs[k * inner] > m ? xs[k * inner] : m;
      if (kLog)
        log_softmax_with_max(xs, ys, len, inner, m);
      else
        softmax_with_max(xs, ys, len, inner, m);
    }
  });
  return Error::Ok;
}

}  // namespace

Error softmax_out(KernelContext& ctx, const Tensor& self, int64_t dim, bool half_to_float,
                  Tensor& out) {
  return softmax_along<false>(ctx, "softmax", self, dim, half_to_float, out);
}

Error log_softmax_out(KernelContext& ctx, const Tensor& self, int64_t dim, bool half_to_float,
                      Tensor& out) {
  return softmax_along<true>(ctx, "log_softmax", self, dim, half_to_float, out);
}

Error native_layer_norm_out(KernelContext& ctx, const Tensor& input,
                            Span<const int64_t> normalized_shape, const Tensor* weight,
                            const Tensor* bias, double eps, Tensor& out0, Tensor& out1,
                            Tensor& out2) {
  const int k = int(normalized_shape.size());
  if (k < 1 || k > input.dim())
    return fail(Error::InvalidArgument, "layer_norm: normalized_shape has %d dims, input %d", k,
                input.dim());
  int64_t M = 1;
  for (int i = 0; i < k; ++i) {
    if (normalized_shape[size_t(i)] != input.size(input.dim() - k + i))
      return fail(Error::InvalidArgument, "layer_norm: normalized_shape does not match input");
    M *= normalized_shape[size_t(i)];
  }
  if (weight != nullptr && weight->numel() != M)
    return fail(Error::InvalidArgument, "layer_norm: weight must have %lld elements", (long long)M);
  if (bias != nullptr && bias->numel() != M)
    return fail(Error::InvalidArgument, "layer_norm: bias must have %lld elements", (long long)M);
  ETB_TRY(out0.resize(input.sizes()));
  int64_t stat[kMaxDim];
  for (int i = 0; i < input.dim(); ++i) stat[i] = i < input.dim() - k ? input.size(i) : 1;
  ETB_TRY(resize_to(out1, stat, input.dim()));
  ETB_TRY(resize_to(out2, stat, input.dim()));
  ETB_TRY(expect_dtype(out1, ScalarType::Float, "layer_norm", "out1"));
  ETB_TRY(expect_dtype(out2, ScalarType::Float, "layer_norm", "out2"));
  const int64_t rows = M == 0 ? 0 : input.numel() / M;
  const float* x = input.data_as<float>();
  float* y = out0.data_as<float>();
  const float* w = weight ? weight->data_as<float>() : nullptr;
  const float* b = bias ? bias->data_as<float>() : nullptr;
  float* means = out1.data_as<float>();
  float* rstds = out2.data_as<float>();
  parallel_range(ctx, rows, M, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * M;
      float* yr = y + r * M;
      float mean, rstd;
      mean_and_rstd(xr, M, eps, &mean, &rstd);
      for (int64_t i = 0; i < M; ++i) {
        float v = (xr[i] - mean) * rstd;
        if (w) v *= w[i];
        if (b) v += b[i];
        yr[i] = v;
      }
      means[r] = mean;
      rstds[r] = rstd;
    }
  });
  return Error::Ok;
}

namespace {

// Where a reduction's groups lie in the input: output element o's group starts at base(o)
// and its j-th element is at base(o) + step(j).
class GroupOffsets {
 public:
  GroupOffsets(const Tensor& self, const Reduction& r) : self_(self), innermost_(r.innermost) {
    for (int i = 0; i < self.dim(); ++i) {
      if (r.reduce[i])
        red_[nr_++] = i;
      else
        kept_[nk_++] = i;
    }
  }
  int64_t base(int64_t o) const { return offset(kept_, nk_, o); }
  int64_t step(int64_t j) const { return innermost_ ? j : offset(red_, nr_, j); }

 private:
  // The input offset of the index-th combination of the dims ds (outermost first).
  int64_t offset(const int* ds, int n, int64_t index) const {
    int64_t off = 0;
    for (int k = n - 1; k >= 0; --k) {
      off += (index % self_.size(ds[k])) * self_.stride(ds[k]);
      index /= self_.size(ds[k]);
    }
    return off;
  }

  const Tensor& self_;
  bool innermost_;
  int kept_[kMaxDim], red_[kMaxDim], nk_ = 0, nr_ = 0;
};

// amax / amin: the largest (smallest) element of each reduced group; NaN wins, as in torch.
template <bool kMax>
Error extremum(const KernelContext& ctx, const char* op, const Tensor& self,
               Span<const int64_t> dims, bool keepdim, Tensor& out) {
  Reduction r;
  ETB_TRY(plan_reduction(self, dims, keepdim, op, &r));
  if (r.count == 0)
    return fail(Error::InvalidArgument, "%s: cannot reduce over a dim of size 0", op);
  ETB_TRY(resize_to(out, r.osz, r.od));
  const float* x = self.data_as<float>();
  float* y = out.data_as<float>();
  const GroupOffsets groups(self, r);
  parallel_range(ctx, out.numel(), r.count, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int64_t base = groups.base(o);
      float best = x[base];
      for (int64_t j = 1; j < r.count; ++j) {
        const float v = x[base + groups.step(j)];
        // v replaces best when it is NaN or beyond best, unless best is already NaN.
        if (best == best && (kMax ? !(v <= best) : !(v >= best))) best = v;
      }
      y[o] = best;
    }
  });
  return Error::Ok;
}

// any: true where some element of the group is not zero (NaN counts as true, as in torch).
Error any_over(const KernelContext& ctx, const Tensor& self, Span<const int64_t> dims, bool keepdim,
               const char* key, Tensor& out) {
  constexpr DtypeSet kSelf =
      (selected_dtypes("aten::any.out", "self") | selected_dtypes("aten::any.dims_out", "self") |
       selected_dtypes("aten::any.all_out", "self")) &
      kLoadableDtypes;
  ETB_TRY(expect_dtype(out, ScalarType::Bool, "any", "out"));
  if (!dtype_in(kSelf, self.dtype())) return dtype_not_built(key, "self", self.dtype());
  Reduction r;
  ETB_TRY(plan_reduction(self, dims, keepdim, "any", &r));
  ETB_TRY(resize_to(out, r.osz, r.od));
  const void* x = self.data();
  const ScalarType st = self.dtype();
  uint8_t* y = static_cast<uint8_t*>(out.data());
  const GroupOffsets groups(self, r);
  parallel_range(ctx, out.numel(), r.count, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int64_t base = groups.base(o);
      bool found = false;
      for (int64_t j = 0; j < r.count && !found; ++j)
        found = load_as<double, kSelf>(x, st, base + groups.step(j)) != 0.0;
      y[o] = found;
    }
  });
  return Error::Ok;
}

}  // namespace

Error any_out(KernelContext& ctx, const Tensor& self, int64_t dim, bool keepdim, Tensor& out) {
  return any_over(ctx, self, Span<const int64_t>(&dim, 1), keepdim, "aten::any.out", out);
}

Error any_dims_out(KernelContext& ctx, const Tensor& self, Optional<Span<const int64_t>> dim,
                   bool keepdim, Tensor& out) {
  // No dims (None or []) reduces every dim.
  return any_over(ctx, self, dim.has_value ? dim.value : Span<const int64_t>(), keepdim,
                  "aten::any.dims_out", out);
}

Error any_all_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return any_over(ctx, self, Span<const int64_t>(), false, "aten::any.all_out", out);
}

Error amax_out(KernelContext& ctx, const Tensor& self, Span<const int64_t> dim, bool keepdim,
               Tensor& out) {
  return extremum<true>(ctx, "amax", self, dim, keepdim, out);
}

Error amin_out(KernelContext& ctx, const Tensor& self, Span<const int64_t> dim, bool keepdim,
               Tensor& out) {
  return extremum<false>(ctx, "amin", self, dim, keepdim, out);
}

namespace {

// sum and mean over `dim` (every dim when absent); the mean divides by the group size.
template <bool kMean>
Error sum_or_mean(const KernelContext& ctx, const Tensor& self, Optional<Span<const int64_t>> dim,
                  bool keepdim, Optional<ScalarType> dtype, Tensor& out) {
  const char* op = kMean ? "mean" : "sum";
  if (dtype.has_value && dtype.value != ScalarType::Float)
    return fail(Error::NotSupported, "%s: dtype %s is not supported", op,
                scalar_type_name(dtype.value));
  const int nd = self.dim();
  Reduction plan;
  ETB_TRY(
      plan_reduction(self, dim.has_value ? dim.value : Span<const int64_t>(), keepdim, op, &plan));
  const bool* reduce = plan.reduce;
  const int64_t count = plan.count;
  ETB_TRY(resize_to(out, plan.osz, plan.od));
  const float* x = self.data_as<float>();
  float* y = out.data_as<float>();
  const int64_t on = out.numel();
  if (self.is_channels_last()) {
    // [N][H][W][C] over the plane (a global average pool): each task a run of channels of
    // one batch item, summed in doubles pixel by pixel, as the fast path below sums a plane.
    if (reduce[0] || reduce[1] || !reduce[2] || !reduce[3])
      return fail(Error::NotSupported,
                  "%s: a channels-last input reduces over its plane (dims 2 and 3) only", op);
    const int64_t C = self.size(1), HW = count;
    constexpr int64_t kRun = 64;
    const int64_t runs = (C + kRun - 1) / kRun;
    parallel_range(ctx, self.size(0) * runs, HW * kRun, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t n = t / runs, c0 = t % runs * kRun, cn = C - c0 < kRun ? C - c0 : kRun;
        double sums[kRun] = {};
        const float* xn = x + n * HW * C + c0;
        for (int64_t p = 0; p < HW; ++p)
          for (int64_t c = 0; c < cn; ++c) sums[c] += xn[p * C + c];
        for (int64_t c = 0; c < cn; ++c)
          y[n * C + c0 + c] = !kMean ? float(sums[c]) : HW == 0 ? NAN : float(sums[c] / double(HW));
      }
    });
    return Error::Ok;
  }
  if (plan.innermost) {  // fast path, one output per thread task element: split over threads
    parallel_range(ctx, on, count, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        double s = 0;
        const float* xr = x + o * count;
        for (int64_t i = 0; i < count; ++i) s += xr[i];
        y[o] = !kMean ? float(s) : count == 0 ? NAN : float(s / double(count));
      }
    });
    return Error::Ok;
  }
  // General path: walk the input once, accumulating into the output index.
  int64_t ostride[kMaxDim];
  int64_t st = 1;
  for (int i = nd - 1; i >= 0; --i) {
    ostride[i] = reduce[i] ? 0 : st;
    if (!reduce[i]) st *= self.size(i);
  }
  for (int64_t o = 0; o < on; ++o) y[o] = 0.f;
  int64_t idx[kMaxDim] = {};
  int64_t off = 0;
  const int64_t n = self.numel();
  for (int64_t i = 0; i < n; ++i) {
    y[off] += x[i];
    for (int d = nd - 1; d >= 0; --d) {
      off += ostride[d];
      if (++idx[d] < self.size(d)) break;
      off -= ostride[d] * self.size(d);
      idx[d] = 0;
    }
  }
  if (kMean) {
    const float r = count == 0 ? NAN : 1.f / float(count);
    for (int64_t o = 0; o < on; ++o) y[o] *= r;
  }
  return Error::Ok;
}

}  // namespace

// torch.max(x) / torch.min(x): over every element (an empty dim list reduces them all).
Error max_unary_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return extremum<true>(ctx, "max", self, Span<const int64_t>(), false, out);
}

Error min_unary_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  return extremum<false>(ctx, "min", self, Span<const int64_t>(), false, out);
}

Error mean_out(KernelContext& ctx, const Tensor& self, Optional<Span<const int64_t>> dim,
               bool keepdim, Optional<ScalarType> dtype, Tensor& out) {
  return sum_or_mean<true>(ctx, self, dim, keepdim, dtype, out);
}

Error sum_intlist_out(KernelContext& ctx, const Tensor& self, Optional<Span<const int64_t>> dim,
                      bool keepdim, Optional<ScalarType> dtype, Tensor& out) {
  return sum_or_mean<false>(ctx, self, dim, keepdim, dtype, out);
}

Error var_correction_out(KernelContext& ctx, const Tensor& self, Optional<Span<const int64_t>> dim,
                         Optional<Scalar> correction, bool keepdim, Tensor& out) {
  const char* op = "var";
  if (correction.has_value && !correction.value.is_int() && !correction.value.is_double())
    return fail(Error::InvalidArgument, "%s: correction must be a number", op);
  const double corr = correction.has_value ? correction.value.to_double() : 1.0;
  Reduction plan;
  ETB_TRY(
      plan_reduction(self, dim.has_value ? dim.value : Span<const int64_t>(), keepdim, op, &plan));
  ETB_TRY(resize_to(out, plan.osz, plan.od));
  const int64_t count = plan.count;
  // torch's divisor: max(0, count - correction); 0 gives NaN (or inf), as in torch.
  const double divisor = double(count) - corr > 0 ? double(count) - corr : 0.0;
  const float* x = self.data_as<float>();
  float* y = out.data_as<float>();
  const int64_t on = out.numel();
  if (plan.innermost) {  // each output reduces a contiguous run: two passes over it
    parallel_range(ctx, on, count, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        const float* xr = x + o * count;
        double s = 0;
        for (int64_t i = 0; i < count; ++i) s += xr[i];
        const double mean = s / double(count);
        double m2 = 0;
        for (int64_t i = 0; i < count; ++i) {
          const double dv = double(xr[i]) - mean;
          m2 += dv * dv;
        }
        y[o] = float(m2 / divisor);
      }
    });
    return Error::Ok;
  }
  // General path: walk the input in order twice (sums, then squared deviations), accumulating
  // into per-output doubles.
  Result<void*> mem = ctx.allocate_temp(size_t(on) * 2 * sizeof(double));
  if (!mem.ok()) return mem.error();
  double* mean = static_cast<double*>(mem.value());
  double* m2 = mean + on;
  for (int64_t o = 0; o < on; ++o) mean[o] = m2[o] = 0;
  const int nd = self.dim();
  int64_t ostride[kMaxDim];
  int64_t st = 1;
  for (int i = nd - 1; i >= 0; --i) {
    ostride[i] = plan.reduce[i] ? 0 : st;
    if (!plan.reduce[i]) st *= self.size(i);
  }
  const int64_t n = self.numel();
  for (int pass = 0; pass < 2; ++pass) {
    int64_t idx[kMaxDim] = {};
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (pass == 0) {
        mean[off] += x[i];
      } else {
        const double dv = double(x[i]) - mean[off];
        m2[off] += dv * dv;
      }
      for (int d = nd - 1; d >= 0; --d) {
        off += ostride[d];
        if (++idx[d] < self.size(d)) break;
        off -= ostride[d] * self.size(d);
        idx[d] = 0;
      }
    }
    if (pass == 0)
      for (int64_t o = 0; o < on; ++o) mean[o] /= double(count);
  }
  for (int64_t o = 0; o < on; ++o) y[o] = float(m2[o] / divisor);
  return Error::Ok;
}

namespace {

// Splits a 3-d or 4-d input into planes of H x W.
Error planes_of(const Tensor& t, const char* op, int64_t* planes, int64_t* H, int64_t* W) {
  if (t.dim() != 3 && t.dim() != 4)
    return fail(Error::InvalidArgument, "%s: input must be 3-d or 4-d, got %d-d", op, t.dim());
  *H = t.size(t.dim() - 2);
  *W = t.size(t.dim() - 1);
  *planes = t.dim() == 4 ? t.size(0) * t.size(1) : t.size(0);
  return Error::Ok;
}

Error resize_pooled(const Tensor& in, Tensor& out, int64_t oh, int64_t ow) {
  int64_t sz[4];
  for (int i = 0; i < in.dim() - 2; ++i) sz[i] = in.size(i);
  sz[in.dim() - 2] = oh;
  sz[in.dim() - 1] = ow;
  return resize_to(out, sz, in.dim());
}

struct Pool2d {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
};

Error parse_pool(const char* op, Span<const int64_t> k, Span<const int64_t> s,
                 Span<const int64_t> p, Span<const int64_t> d, Pool2d* o) {
  if (k.size() == 0 || !pair_items(k, 1, 1, &o->kh, &o->kw) ||
      !pair_items(s, o->kh, o->kw, &o->sh, &o->sw) || !pair_items(p, 0, 0, &o->ph, &o->pw) ||
      !pair_items(d, 1, 1, &o->dh, &o->dw))
    return fail(Error::InvalidArgument,
                "%s: kernel/stride/padding/dilation must have 1 or 2 "
                "items",
                op);
  constexpr int64_t kLimit = int64_t(1) << 30;
  if (o->kh > kLimit || o->kw > kLimit || o->sh > kLimit || o->sw > kLimit || o->dh > kLimit ||
      o->dw > kLimit)
    return fail(Error::InvalidArgument, "%s: kernel, stride or dilation too large", op);
  if (o->kh < 1 || o->kw < 1 || o->sh < 1 || o->sw < 1 || o->dh < 1 || o->dw < 1 || o->ph < 0 ||
      o->pw < 0 || o->ph * 2 > o->kh || o->pw * 2 > o->kw)
    return fail(Error::InvalidArgument, "%s: invalid kernel, stride, padding or dilation", op);
  return Error::Ok;
}

}  // namespace

Error adaptive_avg_pool2d_out(KernelContext& ctx, const Tensor& self,
                              Span<const int64_t> output_size, Tensor& out) {
  int64_t planes = 0, H = 0, W = 0;
  ETB_TRY(planes_of(self, "adaptive_avg_pool2d", &planes, &H, &W));
  if (output_size.size() != 2 || output_size[0] < 0 || output_size[1] < 0)
    return fail(Error::InvalidArgument, "adaptive_avg_pool2d: output_size must be 2 sizes");
  const int64_t OH = output_size[0], OW = output_size[1];
  if (OH > (int64_t(1) << 30) || OW > (int64_t(1) << 30))
    return fail(Error::InvalidArgument, "adaptive_avg_pool2d: output_size too large");
  if ((OH > 0 || OW > 0) && (H == 0 || W == 0))
    return fail(Error::InvalidArgument, "adaptive_avg_pool2d: empty input");
  ETB_TRY(resize_pooled(self, out, OH, OW));
  const float* x = self.data_as<float>();
  float* y = out.data_as<float>();
  parallel_range(ctx, planes, H * W, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* xp = x + p * H * W;
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t h0 = (oh * H) / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t w0 = (ow * W) / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
          float s = 0.f;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) s += xp[h * W + w];
          y[(p * OH + oh) * OW + ow] = s / float((h1 - h0) * (w1 - w0));
        }
      }
    }
  });
  return Error::Ok;
}

Error avg_pool2d_out(KernelContext& ctx, const Tensor& self, Span<const int64_t> kernel_size,
                     Span<const int64_t> stride, Span<const int64_t> padding, bool ceil_mode,
                     bool count_include_pad, Optional<int64_t> divisor_override, Tensor& out) {
  int64_t planes = 0, H = 0, W = 0;
  ETB_TRY(planes_of(self, "avg_pool2d", &planes, &H, &W));
  Pool2d q;
  ETB_TRY(parse_pool("avg_pool2d", kernel_size, stride, padding, Span<const int64_t>(), &q));
  if (divisor_override.has_value && divisor_override.value == 0)
    return fail(Error::InvalidArgument, "avg_pool2d: divisor_override must be nonzero");
  const int64_t OH = pooled_size(H, q.kh, q.ph, q.sh, 1, ceil_mode);
  const int64_t OW = pooled_size(W, q.kw, q.pw, q.sw, 1, ceil_mode);
  if (OH <= 0 || OW <= 0) return fail(Error::InvalidArgument, "avg_pool2d: output would be empty");
  ETB_TRY(resize_pooled(self, out, OH, OW));
  const float* x = self.data_as<float>();
  float* y = out.data_as<float>();
  parallel_range(ctx, planes, H * W, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* xp = x + p * H * W;
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t h0 = oh * q.sh - q.ph, w0 = ow * q.sw - q.pw;
          int64_t h1 = h0 + q.kh < H + q.ph ? h0 + q.kh : H + q.ph;
          int64_t w1 = w0 + q.kw < W + q.pw ? w0 + q.kw : W + q.pw;
          const int64_t pool = (h1 - h0) * (w1 - w0);
          h0 = h0 < 0 ? 0 : h0;
          w0 = w0 < 0 ? 0 : w0;
          h1 = h1 > H ? H : h1;
          w1 = w1 > W ? W : w1;
          float s = 0.f;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) s += xp[h * W + w];
          int64_t div = divisor_override.has_value ? divisor_override.value
                        : count_include_pad        ? pool
                                                   : (h1 - h0) * (w1 - w0);
          y[(p * OH + oh) * OW + ow] = div == 0 ? 0.f : s / float(div);
        }
      }
    }
  });
  return Error::Ok;
}

// The taps [lo, hi) of a pooling window starting at `start` (dilation `dil`, `k` taps) that
// fall inside [0, size): the loops over them need no bounds checks.
namespace {
inline int64_t tap_lo(int64_t start, int64_t dil) {
  return start < 0 ? (-start + dil - 1) / dil : 0;
}
inline int64_t tap_hi(int64_t start, int64_t dil, int64_t k, int64_t size) {
  if (start >= size) return 0;
  const int64_t n = (size - start + dil - 1) / dil;
  return n < k ? n : k;
}
// Output ow of one row of a max pool: the largest tap and its index in the plane; a NaN wins
// (the last one), as in torch. Written without branches: a branch per tap on random data
// mispredicts half the time.
template <typename I>
void scalar_max(const float* xp, int64_t W, const Pool2d& q, int64_t h0, int64_t kh_lo,
                int64_t kh_hi, int64_t ow, float* y_row, I* idx_row) {
  const int64_t w0 = ow * q.sw - q.pw;
  const int64_t kw_lo = tap_lo(w0, q.dw), kw_hi = tap_hi(w0, q.dw, q.kw, W);
  float m = -INFINITY;
  int64_t mi = -1;
  for (int64_t kh = kh_lo; kh < kh_hi; ++kh) {
    const int64_t h = h0 + kh * q.dh;
    for (int64_t kw = kw_lo; kw < kw_hi; ++kw) {
      const int64_t w = w0 + kw * q.dw;
      const float v = xp[h * W + w];
      const bool take = (v > m) | (v != v) | (mi < 0);
      m = take ? v : m;
      mi = take ? h * W + w : mi;
    }
  }
  y_row[ow] = m;
  idx_row[ow] = I(mi);
}

}  // namespace

Error max_pool2d_with_indices_out(KernelContext& ctx, const Tensor& self,
                                  Span<const int64_t> kernel_size, Span<const int64_t> stride,
                                  Span<const int64_t> padding, Span<const int64_t> dilation,
                                  bool ceil_mode, Tensor& out, Tensor& indices) {
  int64_t planes = 0, H = 0, W = 0;
  ETB_TRY(planes_of(self, "max_pool2d", &planes, &H, &W));
  Pool2d q;
  ETB_TRY(parse_pool("max_pool2d", kernel_size, stride, padding, dilation, &q));
  const int64_t OH = pooled_size(H, q.kh, q.ph, q.sh, q.dh, ceil_mode);
  const int64_t OW = pooled_size(W, q.kw, q.pw, q.sw, q.dw, ceil_mode);
  if (OH <= 0 || OW <= 0) return fail(Error::InvalidArgument, "max_pool2d: output would be empty");
  ETB_TRY(resize_pooled(self, out, OH, OW));
  ETB_TRY(resize_pooled(self, indices, OH, OW));
  // Indices of the integer dtypes this build selected.
  constexpr DtypeSet kIndices = selected_dtypes("aten::max_pool2d_with_indices.out", "indices") &
                                dtype_set(ScalarType::Long, ScalarType::Int);
  const float* x = self.data_as<float>();
  float* y = out.data_as<float>();
  // Vectors of kL adjacent outputs where every tap is inside the row (stride 1 or 2, no
  // column dilation); indices travel as floats, exact while a plane has < 2^24 elements.
  constexpr int64_t kL = simd::VecF::kWidth;
  const bool vector_ok = (q.sw == 1 || q.sw == 2) && q.dw == 1 && H * W < (int64_t(1) << 24);
  const int64_t over_read = q.sw - 1;             // load_even reads one float past its last lane
  const int64_t ow_a = (q.pw + q.sw - 1) / q.sw;  // first output whose window starts >= 0
  const int64_t last_in = W - q.kw - over_read + q.pw;
  const int64_t ow_b = !vector_ok || last_in < 0 ? 0 : std::min(OW, last_in / q.sw + 1);
  alignas(64) float lane_offsets[kL];
  for (int64_t i = 0; i < kL; ++i) lane_offsets[i] = float(i * q.sw);
  const bool built = dispatch_dtype<kIndices>(indices.dtype(), [&](auto c) {
    using I = decltype(c);
    I* idx = indices.data_as<I>();
    // kL outputs from ow on, whose taps of kernel rows [kh_lo, kh_hi) are all inside the plane
    // (the rows the padding leaves, as in scalar_max).
    auto vector_block = [&](const float* xp, int64_t h0, int64_t kh_lo, int64_t kh_hi, int64_t ow,
                            float* y_out, I* i_out) {
      using simd::VecF;
      const VecF lanes = VecF::load(lane_offsets);
      VecF m, mi;
      bool first = true;
      for (int64_t kh = kh_lo; kh < kh_hi; ++kh) {
        const int64_t row = (h0 + kh * q.dh) * W;
        for (int64_t kw = 0; kw < q.kw; ++kw) {
          const int64_t base = row + ow * q.sw - q.pw + kw;
          const VecF v = q.sw == 1 ? VecF::load(xp + base) : simd::load_even(xp + base);
          const VecF at = VecF::broadcast(float(base)) + lanes;
          if (first) {
            m = v;
            mi = at;
            first = false;
          } else {
            const simd::MaskF take = simd::takes_max(v, m);
            m = simd::select(take, v, m);
            mi = simd::select(take, at, mi);
          }
        }
      }
      alignas(64) float at[kL];
      m.store(y_out);
      mi.store(at);
      for (int64_t i = 0; i < kL; ++i) i_out[i] = I(at[i]);
    };
    auto plane = [&](int64_t p, int) {  // the threads split the planes
      const float* xp = x + p * H * W;
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t h0 = oh * q.sh - q.ph;
        const int64_t kh_lo = tap_lo(h0, q.dh), kh_hi = tap_hi(h0, q.dh, q.kh, H);
        const int64_t o_row = (p * OH + oh) * OW;
        int64_t ow = 0;
        if (kh_hi > kh_lo && ow_b > ow_a) {
          for (; ow < ow_a; ++ow)
            scalar_max(xp, W, q, h0, kh_lo, kh_hi, ow, y + o_row, idx + o_row);
          for (; ow + kL <= ow_b; ow += kL)
            vector_block(xp, h0, kh_lo, kh_hi, ow, y + o_row + ow, idx + o_row + ow);
          if (ow < ow_b && ow_b - kL >= ow_a) {  // the last block overlaps the one before it
            vector_block(xp, h0, kh_lo, kh_hi, ow_b - kL, y + o_row + ow_b - kL,
                         idx + o_row + ow_b - kL);
            ow = ow_b;
          }
        }
        for (; ow < OW; ++ow) scalar_max(xp, W, q, h0, kh_lo, kh_hi, ow, y + o_row, idx + o_row);
      }
    };
    ctx.parallel_for(planes, plane);
  });
  if (!built)
    return dtype_not_built("aten::max_pool2d_with_indices.out", "indices", indices.dtype());
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
