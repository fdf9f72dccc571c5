// Depthwise convolution on channels-last (NHWC) Float tensors (see depthwise_nhwc.h),
// explicitly vectorized (simd.h): a vector's lanes are kW consecutive channels of one pixel.
//
// Layout. in [N][H][W][C], w [KH][KW][C], out [N][OH][OW][C]: a pixel's channels are
// contiguous, and so are one tap's weights, so an output vector is the bias vector plus one
// multiply-add per tap of a weight vector and an input vector, each a plain load. Unlike the
// NCHW kernels (depthwise.cpp, depthwise_lanes.cpp) nothing is copied, padded or transposed:
// no scratch.
//
// Order. Every output is clamp(bias + the taps in row-major order (kh, then kw)), one
// simd::fma per tap that lies in the input, starting from the bias (or zero); taps in the
// padding are skipped, on every path. So an output has the same bits whichever path computed
// it, and a call's rows do not depend on which other rows the call covers (callers split the
// rows over threads).
//
// Paths. An output row's tap rows inside the input are found once: rows at the top and bottom
// run the same blocks as the others, over fewer tap rows. A block is NP pixels of a row by CB
// vectors of channels, its NP x CB sums in registers, each weight vector loaded once per tap
// for the NP pixels; a row's pixels go in groups as even as they come (NP <= kNP), and each
// group across the channels (blocks of CB vectors, then single vectors, the last kW channels
// overlapping the vector before and recomputing the same bits).
// - FixedTaps: a kernel 3 wide with stride 1 or 2 and no dilation along the row (MobileNet's
//   3x3, any KH). Per tap row the block loads each input column it reads once, a column
//   feeding every tap that lies on it (a stride-1 row of 8 pixels: 10 loads for 24
//   multiply-adds). A column in the padding at either end of the block's span (padding 1) is
//   skipped with its taps, so the border pixels are computed with the row. With 3 tap rows at
//   stride 1 (3x3 stride 1), two full-height output rows go together (R = 2): 4 input rows for
//   2 output rows instead of 6, each column feeding both rows' sums.
// - AnyTaps: other kernels (widths, strides, dilations), a load per tap and pixel, kernel
//   width, stride and dilation known at run time; the pixels whose taps all lie in the input
//   go in blocks. The others (and, with FixedTaps, pixels whose span reaches 2 or more columns
//   into the padding) go one at a time over the tap columns in range, kBorderCB vectors a
//   block so that independent sums hide the multiply-add latency. AnyTaps also takes any
//   tensor of fewer than kW channels, through partial loads and stores.
// No path reads or writes past a pixel's channels: the tensors are exactly their size.
#include "kernels/portable/depthwise_nhwc.h"

#include <type_traits>

#include "kernels/simd.h"

namespace etb {
namespace native {
namespace {

using simd::VecF;
constexpr int kW = VecF::kWidth;

// Pixels by vectors of a block. With 32 vector registers (AVX-512, NEON): 8 pixels by 1
// vector, 16 sums in row pairs (plus 9 weights and a column). With 16 (AVX2, SSE2): 4 by 2 on
// single rows, 4 by 1 in row pairs. 8 sums or more hide the multiply-add's latency.
#if defined(ETB_SIMD_AVX512) || defined(ETB_SIMD_NEON)
constexpr bool kManyRegisters = true;
constexpr int kNP = 8, kCB = 1, kPairCB = 1;
#else
constexpr bool kManyRegisters = false;
constexpr int kNP = 4, kCB = 2, kPairCB = 1;
#endif
constexpr int kBorderCB = 4;  // AnyTaps' border pixels: one at a time, 4 vectors of channels

// Keeps a loaded vector in a register. Without it GCC turns each use of a loaded input column
// into a multiply-add with a memory operand, loading the column again for each of its taps
// (x86 only: NEON's multiply-add takes no memory operand). AVX-512, 56x56x144 3x3: 1.25x the
// time without.
ETB_SIMD_INLINE void pin(VecF& v) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__AVX512F__)
  __asm__("" : "+v"(v.v));
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__SSE2__)
  __asm__("" : "+x"(v.v));
#else
  (void)v;
#endif
}

// What the blocks of a row read besides their pointers.
struct Args {
  int64_t C;
  int64_t nkh;    // tap rows inside the input (R = 1)
  int64_t xrow;   // floats from a tap row's input to the next one's: dh W C
  int64_t wrow;   // and from its weights to the next: KW C
  int64_t nkw;    // tap columns taken (AnyTaps)
  int64_t pstep;  // floats from a pixel's input to the next pixel's: sw C
  int64_t tstep;  // from a tap column's input to the next one's: dw C (AnyTaps)
  int64_t orow;   // floats from an output row to the next: OW C (R = 2)
  const float* bias;
  VecF lo, hi;
};

// Where a FixedTaps block's span of input columns meets the padding: its first column (lc = 1)
// or its last (rc = 1) lies outside the input, with every tap on it.
struct Edges {
  int lc, rc;
};

// A vector of channels: whole, or its first n lanes (P: a tensor of fewer than kW channels).
template <bool P>
ETB_SIMD_INLINE VecF load(const float* p, int n) {
  if constexpr (P) {
    return VecF::load_partial(p, n);
  } else {
    (void)n;
    return VecF::load(p);
  }
}
template <bool P>
ETB_SIMD_INLINE void store(VecF v, float* p, int n) {
  if constexpr (P) {
    v.store_partial(p, n);
  } else {
    (void)n;
    v.store(p);
  }
}

// The sums' start for channels [c, c + kW): the bias, or zero.
template <bool P>
ETB_SIMD_INLINE VecF start(const Args& a, int64_t c, int n) {
  return a.bias != nullptr ? load<P>(a.bias + c, n) : VecF::zero();
}

// The blocks: channels [c, c + CB kW) of NP pixels (of R rows), from x (the input under the
// first pixel's first tap, channel 0) and w (the weights of the first tap row in range) into o
// (the first pixel's output).

// Taps known at compile time: KW wide, stride SW and dilation DW along the row. Pixel j's tap
// kw reads column i = j SW + kw DW of the block's span, NI(NP) columns from x.
template <int KW, int SW, int DW>
struct FixedTaps {
  static constexpr int span(int np) { return (np - 1) * SW + (KW - 1) * DW + 1; }

  // Column i of an input row (xv) into the sums s of its taps in tap row wv. Each sum takes
  // its taps in the order of their columns: kw increasing.
  template <int NP, int CB>
  static ETB_SIMD_INLINE void column(int i, const VecF (&xv)[CB], const VecF (&wv)[KW][CB],
                                     VecF (&s)[NP][CB]) {
#pragma GCC unroll 8
    for (int kw = 0; kw < KW; ++kw) {
      const int d = i - kw * DW, j = d / SW;
      if (d < 0 || d % SW != 0 || j >= NP) continue;
#pragma GCC unroll 4
      for (int b = 0; b < CB; ++b) s[j][b] = simd::fma(wv[kw][b], xv[b], s[j][b]);
    }
  }

  // Column i of an input row, at p, into the sums s0 of tap row w0 (F0) and s1 of w1 (F1).
  template <int NP, int CB, bool P, bool F0, bool F1>
  static ETB_SIMD_INLINE void take(int i, const float* p, int n, const VecF (&w0)[KW][CB],
                                   VecF (&s0)[NP][CB], const VecF (&w1)[KW][CB],
                                   VecF (&s1)[NP][CB]) {
    VecF xv[CB];
#pragma GCC unroll 4
    for (int b = 0; b < CB; ++b) {
      xv[b] = load<P>(p + b * kW, n);
      pin(xv[b]);
    }
    if constexpr (F0) column<NP, CB>(i, xv, w0, s0);
    if constexpr (F1) column<NP, CB>(i, xv, w1, s1);
  }

  // An input row's span, from xr (its column e.lc), in column order; the first and last
  // columns, where they lie outside the input, are skipped with their taps.
  template <int NP, int CB, bool P, bool F0, bool F1>
  static ETB_SIMD_INLINE void feed(const float* xr, int64_t C, Edges e, int n,
                                   const VecF (&w0)[KW][CB], VecF (&s0)[NP][CB],
                                   const VecF (&w1)[KW][CB], VecF (&s1)[NP][CB]) {
    constexpr int NI = span(NP);
    if (!e.lc) take<NP, CB, P, F0, F1>(0, xr, n, w0, s0, w1, s1);
#pragma GCC unroll 32
    for (int i = 1; i < NI - 1; ++i)
      take<NP, CB, P, F0, F1>(i, xr + (i - e.lc) * C, n, w0, s0, w1, s1);
    if (!e.rc) take<NP, CB, P, F0, F1>(NI - 1, xr + (NI - 1 - e.lc) * C, n, w0, s0, w1, s1);
  }

  template <int CB, bool P>
  static ETB_SIMD_INLINE void weights(const float* w, int64_t C, int n, VecF (&wv)[KW][CB]) {
#pragma GCC unroll 8
    for (int kw = 0; kw < KW; ++kw)
#pragma GCC unroll 4
      for (int b = 0; b < CB; ++b) {
        wv[kw][b] = load<P>(w + kw * C + b * kW, n);
        if constexpr (kManyRegisters) pin(wv[kw][b]);
      }
  }

  // x: column e.lc of the span.
  template <int R, int NP, int CB, bool P>
  static ETB_SIMD_INLINE void block(const Args& a, Edges e, const float* x, const float* w,
                                    float* o, int64_t c, int n) {
    const int64_t C = a.C;
    VecF s[R][NP][CB];
#pragma GCC unroll 4
    for (int b = 0; b < CB; ++b) {
      const VecF v = start<P>(a, c + b * kW, n);
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < NP; ++j) s[r][j][b] = v;
    }
    x += c;
    w += c;
    if constexpr (R == 1) {
      for (int64_t kh = 0; kh < a.nkh; ++kh, x += a.xrow, w += a.wrow) {
        VecF wv[KW][CB];
        weights<CB, P>(w, C, n, wv);
        feed<NP, CB, P, true, false>(x, C, e, n, wv, s[0], wv, s[0]);
      }
    } else {
      // Two output rows of 3 tap rows at stride 1: input row ir feeds tap row ir of output
      // row 0 and tap row ir - 1 of row 1, so each sum still takes its tap rows in order.
      static_assert(R == 2, "row pairs only");
      // With 16 registers a tap row's weights are loaded just before the first input row
      // that needs them.
      VecF wv[3][KW][CB];
      auto tap_row = [&](int kh) { weights<CB, P>(w + kh * a.wrow, C, n, wv[kh]); };
      tap_row(0);
      if constexpr (kManyRegisters) {
        tap_row(1);
        tap_row(2);
      }
      feed<NP, CB, P, true, false>(x, C, e, n, wv[0], s[0], wv[0], s[1]);
      if constexpr (!kManyRegisters) tap_row(1);
      feed<NP, CB, P, true, true>(x + a.xrow, C, e, n, wv[1], s[0], wv[0], s[1]);
      if constexpr (!kManyRegisters) tap_row(2);
      feed<NP, CB, P, true, true>(x + 2 * a.xrow, C, e, n, wv[2], s[0], wv[1], s[1]);
      feed<NP, CB, P, false, true>(x + 3 * a.xrow, C, e, n, wv[2], s[0], wv[2], s[1]);
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j)
#pragma GCC unroll 4
        for (int b = 0; b < CB; ++b)
          store<P>(simd::clamp(s[r][j][b], a.lo, a.hi), o + r * a.orow + j * C + c + b * kW, n);
  }
};

// Taps known at run time: a.nkw tap columns, a.tstep apart; all in the input (R = 1).
struct AnyTaps {
  template <int R, int NP, int CB, bool P>
  static ETB_SIMD_INLINE void block(const Args& a, Edges, const float* x, const float* w, float* o,
                                    int64_t c, int n) {
    static_assert(R == 1, "single rows");
    const int64_t C = a.C, ps = a.pstep;
    VecF s[NP][CB];
#pragma GCC unroll 4
    for (int b = 0; b < CB; ++b) {
      const VecF v = start<P>(a, c + b * kW, n);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) s[j][b] = v;
    }
    x += c;
    w += c;
    for (int64_t kh = 0; kh < a.nkh; ++kh, x += a.xrow, w += a.wrow) {
      const float* xk = x;
      const float* wk = w;
      for (int64_t kw = 0; kw < a.nkw; ++kw, xk += a.tstep, wk += C) {
#pragma GCC unroll 4
        for (int b = 0; b < CB; ++b) {
          const VecF wv = load<P>(wk + b * kW, n);
#pragma GCC unroll 8
          for (int j = 0; j < NP; ++j)
            s[j][b] = simd::fma(wv, load<P>(xk + j * ps + b * kW, n), s[j][b]);
        }
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j)
#pragma GCC unroll 4
      for (int b = 0; b < CB; ++b)
        store<P>(simd::clamp(s[j][b], a.lo, a.hi), o + j * C + c + b * kW, n);
  }
};

// NP pixels (of R rows), every channel: blocks of CB vectors, single vectors, then the last kW
// channels; or, with fewer than kW channels (AnyTaps only), partial vectors.
template <class T, int R, int NP, int CB>
void pixels(const Args& a, Edges e, const float* x, const float* w, float* o) {
  const int64_t C = a.C;
  if constexpr (std::is_same_v<T, AnyTaps>) {
    if (C < kW) {
      T::template block<R, NP, 1, true>(a, e, x, w, o, 0, int(C));
      return;
    }
  }
  int64_t c = 0;
  for (; c + CB * kW <= C; c += CB * kW) T::template block<R, NP, CB, false>(a, e, x, w, o, c, kW);
  if constexpr (CB > 1) {
    for (; c + kW <= C; c += kW) T::template block<R, NP, 1, false>(a, e, x, w, o, c, kW);
  }
  if (c < C) T::template block<R, NP, 1, false>(a, e, x, w, o, C - kW, kW);
}

// pixels<T, R, np, CB> for a run-time np <= NP.
template <class T, int R, int NP, int CB>
ETB_SIMD_INLINE void pixels_n(int np, const Args& a, Edges e, const float* x, const float* w,
                              float* o) {
  if constexpr (NP > 1) {
    if (np < NP) return pixels_n<T, R, NP - 1, CB>(np, a, e, x, w, o);
  }
  pixels<T, R, NP, CB>(a, e, x, w, o);
}

// Tap indices [k0, k1) of K taps, d apart from `first`, that land in [0, L).
inline void taps_inside(int64_t first, int64_t L, int64_t d, int64_t K, int64_t* k0, int64_t* k1) {
  int64_t lo = first < 0 ? (-first + d - 1) / d : 0;
  int64_t hi = first >= L ? 0 : (L - first + d - 1) / d;
  if (lo > K) lo = K;
  if (hi > K) hi = K;
  if (hi < lo) hi = lo;
  *k0 = lo;
  *k1 = hi;
}

// The output rows [oh0, oh1) of batch item n with taps T.
template <class T>
class Rows {
 public:
  static constexpr bool kFixed = !std::is_same_v<T, AnyTaps>;

  Rows(const ConvShape& s, const float* in, const float* w, const float* bias, OutputClamp clamp,
       float* out, int64_t n)
      : s_(s), x_n_(in + n * s.H * s.W * s.C), w_(w), o_n_(out + n * s.OH * s.OW * s.C) {
    const int64_t C = s.C;
    a_.C = C;
    a_.xrow = s.dh * s.W * C;
    a_.wrow = s.KW * C;
    a_.pstep = s.sw * C;
    a_.tstep = s.dw * C;
    a_.orow = s.OW * C;
    a_.bias = bias;
    a_.lo = VecF::broadcast(clamp.lo);
    a_.hi = VecF::broadcast(clamp.hi);
    // The pixels that go in blocks, [ow0, ow1): with FixedTaps, those whose span of input
    // columns starts at -1 or later and ends at W or before; with AnyTaps, those whose taps
    // all lie in the input.
    const int64_t slack = kFixed ? 1 : 0, reach = (s.KW - 1) * s.dw;
    const int64_t first = s.pw - slack > 0 ? s.pw - slack : 0;
    const int64_t last = s.W - 1 + slack + s.pw - reach;  // ow sw <= last
    ow0_ = (first + s.sw - 1) / s.sw;
    ow1_ = last < 0 ? 0 : last / s.sw + 1;
    if (ow0_ > s.OW) ow0_ = s.OW;
    if (ow1_ > s.OW) ow1_ = s.OW;
    if (ow1_ < ow0_) ow1_ = ow0_;
    const int64_t m = ow1_ - ow0_;
    groups_ = m > 0 ? ceil_div(m, kNP) : 0;
    q_ = groups_ > 0 ? m / groups_ : 0;
    r_ = groups_ > 0 ? m % groups_ : 0;
  }

  void run(int64_t oh0, int64_t oh1) {
    const bool pairs = s_.KH == 3 && s_.sh == 1 && s_.dh == 1;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      if constexpr (std::is_same_v<T, FixedTaps<3, 1, 1>>) {
        if (pairs && oh + 1 < oh1 && full(oh) && full(oh + 1)) {
          row_pair(oh);
          ++oh;
          continue;
        }
      }
      row(oh);
    }
  }

 private:
  bool full(int64_t oh) const {
    const int64_t ih = oh * s_.sh - s_.ph;
    return ih >= 0 && ih + (s_.KH - 1) * s_.dh < s_.H;
  }

  // One output row: its pixels before ow0 and from ow1 on one at a time, the rest in groups.
  void row(int64_t oh) {
    const int64_t C = s_.C, ih = oh * s_.sh - s_.ph;
    int64_t kh0, kh1;
    taps_inside(ih, s_.H, s_.dh, s_.KH, &kh0, &kh1);
    a_.nkh = kh1 - kh0;
    const float* x = a_.nkh > 0 ? x_n_ + (ih + kh0 * s_.dh) * s_.W * C : x_n_;  // 1st tap row
    const float* w = w_ + kh0 * s_.KW * C;
    float* o = o_n_ + oh * s_.OW * C;
    border(x, w, o);
    groups<1>(x, w, o);
  }

  // Two full-height output rows together (3x3, stride 1), their border pixels one row at a
  // time.
  void row_pair(int64_t oh) {
    const int64_t C = s_.C;
    const float* x = x_n_ + (oh - s_.ph) * s_.W * C;
    float* o = o_n_ + oh * s_.OW * C;
    a_.nkh = 3;
    border(x, w_, o);
    border(x + a_.xrow, w_, o + a_.orow);
    groups<2>(x, w_, o);
  }

  // The pixels outside [ow0, ow1) of a row (x: its first tap row in the input).
  void border(const float* x, const float* w, float* o) {
    for (int64_t ow = 0; ow < ow0_; ++ow) pixel(ow, x, w, o);
    for (int64_t ow = ow1_; ow < s_.OW; ++ow) pixel(ow, x, w, o);
  }

  void pixel(int64_t ow, const float* x, const float* w, float* o) {
    const int64_t iw = ow * s_.sw - s_.pw;
    int64_t kw0, kw1;
    taps_inside(iw, s_.W, s_.dw, s_.KW, &kw0, &kw1);
    Args b = a_;
    b.nkw = kw1 - kw0;
    const float* xp = b.nkw > 0 ? x + (iw + kw0 * s_.dw) * s_.C : x;
    pixels<AnyTaps, 1, 1, kBorderCB>(b, Edges{0, 0}, xp, w + kw0 * s_.C, o + ow * s_.C);
  }

  // The pixels [ow0, ow1) of R rows in groups.
  template <int R>
  void groups(const float* x, const float* w, float* o) {
    const int64_t C = s_.C;
    a_.nkw = s_.KW;
    int64_t ow = ow0_;
    for (int64_t g = 0; g < groups_; ++g) {
      const int np = int(q_ + (g < r_ ? 1 : 0));
      const int64_t iw = ow * s_.sw - s_.pw;  // the span's first column
      Edges e{0, 0};
      if constexpr (kFixed) {
        e.lc = iw < 0 ? 1 : 0;
        e.rc = iw + T::span(np) > s_.W ? 1 : 0;
      }
      const float* xp = x + (iw + e.lc) * C;
      constexpr int CB = R == 2 ? kPairCB : kCB;
      pixels_n<T, R, kNP, CB>(np, a_, e, xp, w, o + ow * C);
      ow += np;
    }
  }

  const ConvShape& s_;
  const float* x_n_;  // batch item n's input
  const float* w_;
  float* o_n_;  // and its output
  Args a_;
  int64_t ow0_, ow1_, groups_, q_, r_;  // groups of q_ + 1 pixels for the first r_, then q_
};

}  // namespace

void depthwise_nhwc_f32(const ConvShape& s, const float* in, const float* w, const float* bias,
                        OutputClamp clamp, float* out, int64_t n, int64_t oh0, int64_t oh1) {
  if (oh0 >= oh1 || s.OW <= 0 || s.C <= 0) return;
  const bool fixed = s.KW == 3 && s.dw == 1 && s.C >= kW;
  if (fixed && s.sw == 1)
    Rows<FixedTaps<3, 1, 1>>(s, in, w, bias, clamp, out, n).run(oh0, oh1);
  else if (fixed && s.sw == 2)
    Rows<FixedTaps<3, 2, 1>>(s, in, w, bias, clamp, out, n).run(oh0, oh1);
  else
    Rows<AnyTaps>(s, in, w, bias, clamp, out, n).run(oh0, oh1);
}

}  // namespace native
}  // namespace etb
