// Spatial geometry shared by the fp32 and int8 convolution and pooling kernels.
#pragma once

#include <cstdint>

#include "core/span.h"

namespace etb {

/// Shapes and hyper-parameters of a 2-d convolution (NCHW input, OIHW weight).
struct ConvShape {
  int64_t N, C, H, W;  // input
  int64_t OC, KH, KW;  // weight
  int64_t OH, OW;      // output
  int64_t sh, sw, ph, pw, dh, dw, groups;
};

/// Valid output range [lo, hi) along one axis for kernel offset `koff`, so that
/// 0 <= o * stride - pad + koff < in: inner loops over it need no bounds checks.
inline void valid_range(int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t koff,
                        int64_t* lo, int64_t* hi) {
  const int64_t l = pad - koff;  // need o * stride >= pad - koff
  int64_t a = l <= 0 ? 0 : (l + stride - 1) / stride;
  const int64_t r = in + pad - koff;  // need o * stride < in + pad - koff
  int64_t b = r <= 0 ? 0 : (r + stride - 1) / stride;
  if (b > out) b = out;
  if (a > b) a = b;
  *lo = a;
  *hi = b;
}

/// Packs the rows of input channel c into columns [p0, p0 + pc) of the im2col matrix of one
/// group, col[K x pc], K = channels x KH x KW; taps outside the input read `pad` (0, or the
/// int8 kernels' input zero point). The channels are independent, so threads can split them.
/// Works a row segment at a time: one division per output row, then a fill and a contiguous
/// (or strided) copy of the valid range, so the inner loops have no bounds checks.
template <typename T>
inline void im2col_channel(const ConvShape& s, const T* x, int64_t c, int64_t p0, int64_t pc, T pad,
                           T* col) {
  const T* xc = x + c * s.H * s.W;
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      T* dst = col + ((c * s.KH + kh) * s.KW + kw) * pc;
      int64_t lo_all, hi_all;
      valid_range(s.OW, s.W, s.sw, s.pw, kw * s.dw, &lo_all, &hi_all);
      const int64_t off = kw * s.dw - s.pw;
      int64_t j = 0, p = p0;
      while (j < pc) {
        const int64_t oh = p / s.OW, ow0 = p - oh * s.OW;
        const int64_t n = s.OW - ow0 < pc - j ? s.OW - ow0 : pc - j;
        const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
        T* d = dst + j;  // d[ow - ow0] for ow in [ow0, ow0 + n)
        if (ih < 0 || ih >= s.H) {
          for (int64_t ow = ow0; ow < ow0 + n; ++ow) d[ow - ow0] = pad;
        } else {
          const T* xr = xc + ih * s.W;
          const int64_t lo = lo_all > ow0 ? lo_all : ow0;
          const int64_t hi = hi_all < ow0 + n ? hi_all : ow0 + n;
          int64_t ow = ow0;
          for (; ow < lo && ow < ow0 + n; ++ow) d[ow - ow0] = pad;
          if (s.sw == 1) {
            for (; ow < hi; ++ow) d[ow - ow0] = xr[ow + off];
          } else {
            for (; ow < hi; ++ow) d[ow - ow0] = xr[ow * s.sw + off];
          }
          for (; ow < ow0 + n; ++ow) d[ow - ow0] = pad;
        }
        j += n;
        p += n;
      }
    }
  }
}

/// PyTorch's pooling_output_shape.
inline int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil,
                           bool ceil) {
  int64_t out = (in + 2 * pad - dil * (k - 1) - 1 + (ceil ? stride - 1 : 0)) / stride + 1;
  if (ceil && (out - 1) * stride >= in + pad) --out;
  return out;
}

/// Item `i` (0 or 1) of an int[2]-style argument: empty -> `dflt`, one item -> that item for
/// both, two items -> item `i`. False for any other length.
inline bool pair_item(Span<const int64_t> v, int i, int64_t dflt, int64_t* out) {
  if (v.size() == 0) {
    *out = dflt;
    return true;
  }
  if (v.size() == 1 || v.size() == 2) {
    *out = v[v.size() == 1 ? 0 : size_t(i)];
    return true;
  }
  return false;
}

/// Both items of an int[2]-style argument (see pair_item).
inline bool pair_items(Span<const int64_t> v, int64_t dflt0, int64_t dflt1, int64_t* a,
                       int64_t* b) {
  return pair_item(v, 0, dflt0, a) && pair_item(v, 1, dflt1, b);
}

/// One depthwise output plane: y[OH x OW] += sum over the kernel taps of k * x, for an input
/// plane x[H x W] (float) and kernel taps k[KH x KW] (float, or int8 for the int8 kernels). The
/// inner loops run over each tap's valid output range, so they have no bounds checks.
template <typename W>
inline void depthwise_plane(const ConvShape& s, const float* x, const W* k, float* y) {
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    int64_t oh_lo, oh_hi;
    valid_range(s.OH, s.H, s.sh, s.ph, kh * s.dh, &oh_lo, &oh_hi);
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      int64_t ow_lo, ow_hi;
      valid_range(s.OW, s.W, s.sw, s.pw, kw * s.dw, &ow_lo, &ow_hi);
      const float wv = float(k[kh * s.KW + kw]);
      const int64_t off = kw * s.dw - s.pw;
      for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
        const float* __restrict xr = x + (oh * s.sh - s.ph + kh * s.dh) * s.W;
        float* __restrict yr = y + oh * s.OW;
        if (s.sw == 1) {
          for (int64_t ow = ow_lo; ow < ow_hi; ++ow) yr[ow] += wv * xr[ow + off];
        } else if (s.sw == 2) {
          for (int64_t ow = ow_lo; ow < ow_hi; ++ow) yr[ow] += wv * xr[2 * ow + off];
        } else {
          for (int64_t ow = ow_lo; ow < ow_hi; ++ow) yr[ow] += wv * xr[ow * s.sw + off];
        }
      }
    }
  }
}

}  // namespace etb
