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

}  // namespace etb
