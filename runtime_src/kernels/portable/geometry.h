// Spatial geometry shared by the fp32 and int8 convolution and pooling kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/span.h"
#include "kernel/parallel.h"
#include "kernels/intrinsics.h"
#include "kernels/simd.h"

namespace etb {

/// Shapes and hyper-parameters of a 2-d convolution (NCHW input, OIHW weight).
struct ConvShape {
  int64_t N, C, H, W;  // input
  int64_t OC, KH, KW;  // weight
  int64_t OH, OW;      // output
  int64_t sh, sw, ph, pw, dh, dw, groups;
};

/// A 1x1 convolution with stride 1 and no padding: each output pixel is a product of its own
/// input pixel (dilation does not matter), so the input is the GEMM's operand as it is.
inline bool is_pointwise(const ConvShape& s) {
  return s.KH == 1 && s.KW == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0;
}

/// Rows of zero-padded input that shape s's outputs read: H + 2 ph, or more for a band of a
/// plane's rows whose padding is all below it (ph = 0: the rows the band reads end past H).
inline int64_t padded_rows(const ConvShape& s) {
  const int64_t read = (s.OH - 1) * s.sh + (s.KH - 1) * s.dh + 1;
  return read > s.H + 2 * s.ph ? read : s.H + 2 * s.ph;
}

/// n rounded up to a multiple of 64 (scratch offsets that keep 64-byte alignment).
inline size_t align64(size_t n) {
  return (n + 63) & ~size_t(63);
}

/// a / b rounded up, for a >= 0 and b > 0.
inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

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

/// d[i] = src[i] for i < n. An im2col copies one output row at a time, often only 7 to 56
/// elements: bytes move inline in overlapping 16- and 8-byte pieces, not through a call.
template <typename T>
inline void copy_run(T* d, const T* src, int64_t n) {
  if constexpr (sizeof(T) == 1) {
    if (n <= 64) {
      char* dc = reinterpret_cast<char*>(d);
      const char* sc = reinterpret_cast<const char*>(src);
      if (n >= 16) {
#if defined(__SSE2__)
        for (int64_t i = 0; i + 16 < n; i += 16)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dc + i),
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + i)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dc + n - 16),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + n - 16)));
#elif defined(__ARM_NEON)
        for (int64_t i = 0; i + 16 < n; i += 16)
          vst1q_s8(reinterpret_cast<int8_t*>(dc + i),
                   vld1q_s8(reinterpret_cast<const int8_t*>(sc + i)));
        vst1q_s8(reinterpret_cast<int8_t*>(dc + n - 16),
                 vld1q_s8(reinterpret_cast<const int8_t*>(sc + n - 16)));
#else
        std::memcpy(dc, sc, size_t(n));
#endif
      } else if (n >= 8) {
        uint64_t a, b;
        std::memcpy(&a, sc, 8);
        std::memcpy(&b, sc + n - 8, 8);
        std::memcpy(dc, &a, 8);
        std::memcpy(dc + n - 8, &b, 8);
      } else {
        for (int64_t i = 0; i < n; ++i) dc[i] = sc[i];
      }
      return;
    }
  }
  std::memcpy(d, src, size_t(n) * sizeof(T));
}

/// d[i] = src[i * stride] for i < n: a copy for stride 1; for bytes and floats at stride 2
/// (the im2col of a stride-2 convolution) a SIMD gather of the even elements. Reads no
/// element past src[(n - 1) * stride].
template <typename T>
inline void copy_strided(T* d, const T* src, int64_t n, int64_t stride) {
  if (n <= 0) return;
  if (stride == 1) {
    copy_run(d, src, n);
    return;
  }
  int64_t i = 0;
  if constexpr (sizeof(T) == 1) {
    if (stride == 2) {
#if defined(__AVX2__)
      // Even bytes of each 16-byte lane to its low half, then the two low halves together.
      const __m256i even =
          _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1, 0, 2, 4, 6, 8,
                           10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
      for (; i + 17 <= n; i += 16) {  // loads src[2i, 2i + 32): 2i + 31 < 2(n - 1)
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, even), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
      }
#elif defined(__ARM_NEON)
      for (; i + 17 <= n; i += 16) {
        const int8x16x2_t v = vld2q_s8(reinterpret_cast<const int8_t*>(src + 2 * i));
        vst1q_s8(reinterpret_cast<int8_t*>(d + i), v.val[0]);
      }
#endif
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (stride == 2) {  // load_even reads one element past its last lane: while one follows
      constexpr int64_t kL = simd::VecF::kWidth;
      for (; i + kL + 1 <= n; i += kL) simd::load_even(src + 2 * i).store(d + i);
    }
  }
  for (; i < n; ++i) d[i] = src[i * stride];
}

/// Packs the rows of input channel c into columns [p0, p0 + pc) of the im2col matrix of one
/// group, col[K x ld] (rows ld >= pc elements apart), K = channels x KH x KW; taps outside the
/// input read `pad` (0, or the int8 kernels' input zero point). The channels are independent,
/// so threads can split them. Works a row segment at a time: a fill and a contiguous (or
/// strided) copy of the valid range, so the inner loops have no bounds checks.
template <typename T>
inline void im2col_channel(const ConvShape& s, const T* x, int64_t c, int64_t p0, int64_t pc, T pad,
                           T* col, int64_t ld) {
  const T* xc = x + c * s.H * s.W;
  const int64_t oh_first = p0 / s.OW, ow_first = p0 - oh_first * s.OW;
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      T* dst = col + ((c * s.KH + kh) * s.KW + kw) * ld;
      int64_t lo_all, hi_all;
      valid_range(s.OW, s.W, s.sw, s.pw, kw * s.dw, &lo_all, &hi_all);
      const int64_t off = kw * s.dw - s.pw;
      int64_t j = 0, oh = oh_first, ow0 = ow_first;
      while (j < pc) {
        const int64_t end = s.OW - ow0 < pc - j ? s.OW : ow0 + pc - j;  // row segment [ow0, end)
        const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
        T* d = dst + j - ow0;  // d[ow] for ow in [ow0, end)
        if (ih < 0 || ih >= s.H) {
          std::fill(d + ow0, d + end, pad);
        } else {
          const int64_t lo = lo_all < ow0 ? ow0 : lo_all > end ? end : lo_all;
          const int64_t hi = hi_all < lo ? lo : hi_all > end ? end : hi_all;
          for (int64_t ow = ow0; ow < lo; ++ow) d[ow] = pad;  // a padding's width: a few
          if (hi > lo) copy_strided(d + lo, xc + ih * s.W + lo * s.sw + off, hi - lo, s.sw);
          for (int64_t ow = hi; ow < end; ++ow) d[ow] = pad;
        }
        j += end - ow0;
        ++oh;
        ow0 = 0;
      }
    }
  }
}

/// The taps layout of a convolution's input, from which an implicit GEMM reads its B without
/// an im2col copy. Each plane of the input (a channel, or a group of channels packed into
/// one element) is padded and split into the stride's phases: phase plane (a, b) holds the
/// padded plane's rows i * sh + a and columns j * sw + b, Hq x Wq of them. Output (oh, ow) is
/// then column q = oh * Wq + ow of the product, and tap (kh, kw) reads element
/// q + (kh * dh / sh) * Wq + kw * dw / sw of phase plane (kh * dh % sh, kw * dw % sw): a
/// tap's columns are consecutive elements. The columns with ow >= OW are computed and
/// dropped. Only the phases some tap reads are stored, in the order of their indices.
struct TapsLayout {
  static constexpr int64_t kMaxStride = 4;
  int64_t Hq, Wq;  // a phase plane's rows and columns
  // Each phase's index among the stored ones, or -1; and the phase of each index.
  int64_t row_phase[kMaxStride], col_phase[kMaxStride];
  int64_t row_of[kMaxStride], col_of[kMaxStride];
  int64_t row_phases = 0, col_phases = 0;

  static bool supports(const ConvShape& s) { return s.sh <= kMaxStride && s.sw <= kMaxStride; }
  explicit TapsLayout(const ConvShape& s) {
    Hq = (s.H + 2 * s.ph + s.sh - 1) / s.sh;
    Wq = (s.W + 2 * s.pw + s.sw - 1) / s.sw;
    for (int64_t a = 0; a < kMaxStride; ++a) row_phase[a] = col_phase[a] = -1;
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      const int64_t a = kh * s.dh % s.sh;
      if (row_phase[a] < 0) row_of[row_phases] = a, row_phase[a] = row_phases++;
    }
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      const int64_t b = kw * s.dw % s.sw;
      if (col_phase[b] < 0) col_of[col_phases] = b, col_phase[b] = col_phases++;
    }
  }
  int64_t plane_size() const { return Hq * Wq; }
  int64_t phases() const { return row_phases * col_phases; }
  // Columns of the product: the output's rows at a stride of Wq.
  int64_t columns(const ConvShape& s) const { return (s.OH - 1) * Wq + s.OW; }
  // Where tap (kh, kw) of input plane u starts, from the first phase plane of plane 0.
  int64_t tap_offset(const ConvShape& s, int64_t u, int64_t kh, int64_t kw) const {
    const int64_t t = row_phase[kh * s.dh % s.sh] * col_phases + col_phase[kw * s.dw % s.sw];
    return (u * phases() + t) * plane_size() + kh * s.dh / s.sh * Wq + kw * s.dw / s.sw;
  }
  // The GEMM's row offsets: off[(u * KH + kh) * KW + kw] = tap_offset(s, u, kh, kw) for the
  // first `planes` input planes (a group's channels, or its words of channels).
  void tap_offsets(const ConvShape& s, int64_t planes, int64_t* off) const {
    for (int64_t u = 0; u < planes; ++u)
      for (int64_t kh = 0; kh < s.KH; ++kh)
        for (int64_t kw = 0; kw < s.KW; ++kw) *off++ = tap_offset(s, u, kh, kw);
  }
  // Fills phase plane t (< phases()) of one input plane at d: rows out of the input and the
  // padding's columns with `pad`, the rest by interior(d + j, ih, iw, n), which writes the n
  // elements of input row ih from column iw on, sw apart.
  template <typename T, typename Interior>
  void fill_plane(const ConvShape& s, int64_t t, T pad, T* d, Interior interior) const {
    fill_rows(s, t, pad, d, interior, 0, Hq);
  }
  // fill_plane's rows [i0, i1) of the phase plane alone.
  template <typename T, typename Interior>
  void fill_rows(const ConvShape& s, int64_t t, T pad, T* d, Interior interior, int64_t i0,
                 int64_t i1) const {
    const int64_t a = row_of[t / col_phases], b = col_of[t % col_phases];
    int64_t lo, hi;  // the columns j whose pixel j * sw + b - pw is in the input
    valid_range(Wq, s.W, s.sw, s.pw, b, &lo, &hi);
    d += i0 * Wq;
    for (int64_t i = i0; i < i1; ++i, d += Wq) {
      const int64_t ih = i * s.sh + a - s.ph;
      if (ih < 0 || ih >= s.H) {
        std::fill(d, d + Wq, pad);
        continue;
      }
      std::fill(d, d + lo, pad);
      if (hi > lo) interior(d + lo, ih, lo * s.sw + b - s.pw, hi - lo);
      std::fill(d + hi, d + Wq, pad);
    }
  }
};

/// How a taps-path convolution's GEMMs are split over `threads`: each of the `groups` groups
/// into `runs` runs of its column units times `chunks` chunks of its row units (output
/// channels), kWeightPassesPerThread tasks a thread where the units allow. A task reads the
/// weights of its rows and the layout of its columns, so the split starts on the operand that
/// is the bigger to read again: rows where the weights outweigh the layout (deep layers on
/// small planes), then columns where that gave too few tasks; otherwise columns, then rows.
///
/// Split by chunks of rows alone (one group), every task reads the whole layout: then each
/// thread fills a copy of its own and multiplies from that (`copies`, one a thread). From one
/// shared layout, half of what a thread read was another thread's writes, scattered over the
/// planes where no prefetcher follows: on a host whose two vCPUs sat on different dies, an
/// fp32 3x3 convolution 128 -> 128 on 28x28 took 1.17x as long at 2 threads (1.53x faster
/// than at 1, against 1.80x with a copy a thread); on one die the second fill costs ResNet18
/// 0-1.5%.
struct TapsSplit {
  int64_t runs = 1, chunks = 1, copies = 1;
  TapsSplit(int threads, int64_t groups, int64_t col_units, int64_t row_units,
            bool weights_outweigh_layout) {
    if (threads <= 1) return;
    const int64_t want = kWeightPassesPerThread * int64_t(threads);
    auto share = [&](int64_t tasks, int64_t units) {  // enough units to make `want` tasks
      const int64_t n = (want + tasks - 1) / tasks;
      return n < units ? n : units;
    };
    if (weights_outweigh_layout) {
      chunks = share(groups, row_units);
      runs = share(groups * chunks, col_units);
    } else {
      runs = share(groups, col_units);
      chunks = share(groups * runs, row_units);
    }
    if (groups == 1 && runs == 1 && chunks > 1) copies = threads;
  }
};

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

/// The square, equal-on-both-axes value of an int[] argument of 1 or 2 items.
inline bool square_item(Span<const int64_t> v, int64_t* out) {
  int64_t a, b;
  if (!pair_items(v, 0, 0, &a, &b) || a != b) return false;
  *out = a;
  return true;
}

/// The most bytes of a band's expanded and filtered rows (the expand_depthwise_project kernels,
/// Float and int8): on hosts, inside a core's L2 with room to spare (Zen 5's 1 MiB; a phone's
/// big core has 512 KiB to 1 MiB). Each band costs a setup per channel, so bands as big as the
/// cache allows: MobileNetV2 int8's fused blocks at one thread (AVX-512) took 1.06x and 1.12x
/// the three convolutions' time (two runs) in bands of 160 KiB, 0.99x and 1.01x in bands of
/// 384 KiB (fp32: the same within noise from 256 KiB to 1 MiB). On bare metal, little RAM.
#if defined(ETB_BARE_METAL)
constexpr int64_t kSeparableBandBytes = 16 * 1024;
#else
constexpr int64_t kSeparableBandBytes = 384 * 1024;
#endif

/// The sizes of a MobileNet block run as one kernel, a band of output rows at a time (the
/// expand_depthwise_project kernels, Float and int8).
struct SeparableBlock {
  int64_t N, C, H, W;  // input
  int64_t E, O;        // expanded and output channels
  int64_t K, S, pad;   // the depthwise kernel (square), stride and padding (both axes)
  int64_t OH, OW;
  /// Expanded rows under b output rows.
  int64_t in_rows(int64_t b) const { return (b - 1) * S + K; }
  /// The depthwise convolution of a band of b output rows over its in_rows(b) expanded rows
  /// (whose padding rows, if any, the band holds as rows of the padding value).
  ConvShape band(int64_t b) const {
    return ConvShape{1, E, in_rows(b), W, E, K, K, b, OW, S, S, 0, pad, 1, 1, E};
  }
};

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
