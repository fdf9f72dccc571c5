// int8 depthwise convolution on channel lanes: 8 channels at a time, lane l of every vector
// holding channel l of the block, as the fp32 kernel of portable/depthwise_lanes.cpp does and
// for the same reason: on planes (depthwise.cpp) each channel pays for its padded copy, its
// taps' setup, its flat plane's spare columns and the copy out, which on a 7x7 or 14x14
// plane cost more than its sums. Here those costs are paid once per 8 channels, and a stride
// or a dilation only changes which pixel a tap reads.
//
// For each block of 8 output channels:
// - the input rows are copied into one zero-padded plane of pixels t [Hp x Wp], a pixel being
//   8 int32 lanes x - zp: each row is read as 8 rows of 8 bytes (one per channel), widened
//   and transposed into 8 pixels;
// - an output pixel is the sum over taps of the tap's weights (a vector of 8 channels'
//   weights) times the pixel under the tap, then requantized per lane. A lane holds
//   |x - zp| <= 255, whose low int16 is the value itself, and a weight lane holds the weight
//   in its low int16 and zero above, so one vpmaddwd gives the exact int32 product;
// - the requantized pixels o [OH * OW] are transposed back, 8 at a time, and each channel's 8
//   values packed to bytes (the last group ending at the plane's end, overlapping the one
//   before).
// The sums are exact and the requantization is planes' float32 sequence (float(acc) * mu + b,
// then quantize8), so both ways give the same bits.
#include "kernels/quantized/depthwise_lanes.h"

#include <cstring>

#include "kernels/portable/depthwise_lanes.h"
#include "kernels/quantized/depthwise.h"
#include "kernels/simd.h"

namespace etb {
namespace quantized {

#if defined(ETB_SIMD_AVX2)
namespace {

constexpr int kL = 8;                              // lanes: channels per block
constexpr size_t kMaxScratch = size_t(160) << 10;  // a thread's scratch, beyond which planes
// Among the shapes the planes take, those of input planes up to this many pixels (16x16):
// measured on AVX2 against planes, MobileNetV2's 7x7 layers took 0.63 of the time, 14x14
// 0.74-0.87 (stride 2 and 1); 28x28 with stride 2 1.07-1.17 and 56x56 with stride 2 1.3-1.5.
constexpr int64_t kMaxInputs = 256;

struct Lanes {
  int64_t Hp, Wp;
  size_t t_bytes, o_bytes, w_bytes, off_bytes;
  size_t total() const { return t_bytes + o_bytes + w_bytes + off_bytes; }
};

Lanes lanes_of(const ConvShape& s) {
  Lanes L{};
  L.Hp = s.H + 2 * s.ph;
  L.Wp = s.W + 2 * s.pw;
  const int64_t KK = s.KH * s.KW;
  L.t_bytes = align64(size_t(L.Hp * L.Wp * kL) * sizeof(int32_t));
  L.o_bytes = align64(size_t(ceil_div(s.OH * s.OW, kL) * kL * kL) * sizeof(int32_t));
  L.w_bytes = align64(size_t(KK * kL) * sizeof(int32_t));
  L.off_bytes = align64(size_t(KK) * sizeof(int64_t));
  return L;
}

inline __m256i load8(const int32_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}
inline void store8(int32_t* p, __m256i v) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(p), v);
}

// simd::transpose on 8 x 8 int32 (the shuffles move bits, whatever the lanes hold).
inline void transpose8(__m256i* r) {
  simd::VecF f[kL];
  for (int l = 0; l < kL; ++l) f[l].v = _mm256_castsi256_ps(r[l]);
  simd::transpose(f);
  for (int l = 0; l < kL; ++l) r[l] = _mm256_castps_si256(f[l].v);
}

// What the output pixels of one block are computed from.
struct Block {
  const int32_t* t;    // the padded input pixels
  const int64_t* off;  // KK tap offsets into t, in int32
  const int32_t* w;    // KK weight vectors
  int64_t KK;
  __m256 mu, b;  // per lane: float32(x_scale) * w_scale, the bias
  OutQuant8 q;
};

// NP output pixels, `step` int32 apart in t from p (S > 0: step = S kL, a constant), into o.
template <int NP, int S>
inline void pixels(const Block& b, const int32_t* p, int64_t step, int32_t* o) {
  const int64_t st = S > 0 ? int64_t(S) * kL : step;
  __m256i acc[NP];
  for (int j = 0; j < NP; ++j) acc[j] = _mm256_setzero_si256();
  for (int64_t k = 0; k < b.KK; ++k) {
    const int32_t* at = p + b.off[k];
    const __m256i wv = load8(b.w + k * kL);
    for (int j = 0; j < NP; ++j)
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(load8(at + j * st), wv));
  }
  for (int j = 0; j < NP; ++j) {
    const __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[j]), b.mu), b.b);
    store8(o + j * kL, quantize8(y, b.q));
  }
}

// Every output pixel into o [OH * OW] (segments: for_each_lane_segment).
template <int S>
void output_rows(const ConvShape& s, const Lanes& L, const Block& b, int32_t* o) {
  const int64_t step = s.sw * kL;
  auto segment = [&](auto np, int64_t oh, int64_t ow) {
    pixels<decltype(np)::value, S>(b, b.t + (oh * s.sh * L.Wp + ow * s.sw) * kL, step,
                                   o + (oh * s.OW + ow) * kL);
  };
  native::for_each_lane_segment(s, segment);
}

// dst[j kL + l] = src[l][at + j] - zp for j < n, as int32: n columns of the kL byte rows
// src[l] + at, 8 at a time through a transpose (the last group ending at column n, overlapping
// the one before). A group reads 8 bytes of each row, past column n where the rows go on;
// where the last row's would pass `end`, each row is copied out as far as column n first.
// The src[l] do not decrease with l.
void widen_columns(const int8_t* const* src, int64_t at, int64_t n, const int8_t* end, __m256i zp,
                   int32_t* dst) {
  for (int64_t x0 = 0;; x0 += kL) {
    if (n >= kL && x0 > n - kL) x0 = n - kL;
    const int m = n - x0 < kL ? int(n - x0) : kL;
    const bool whole = src[kL - 1] + at + x0 + kL <= end;
    __m256i r[kL];
    for (int l = 0; l < kL; ++l) {
      int64_t bytes = 0;
      if (whole)
        std::memcpy(&bytes, src[l] + at + x0, kL);
      else
        std::memcpy(&bytes, src[l] + at + x0, size_t(m));
      r[l] = _mm256_sub_epi32(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes)), zp);
    }
    transpose8(r);
    for (int j = 0; j < m; ++j) store8(dst + (x0 + j) * kL, r[j]);
    if (x0 + m >= n) return;
  }
}

}  // namespace

bool depthwise_lanes_suit(const ConvShape& s) {
  if (s.OH < 1 || s.OW < 1 || s.groups != s.C) return false;
  if (depthwise_direct_supported(s) && s.H * s.W > kMaxInputs) return false;
  // The sizes in bytes, checked before they are multiplied out.
  const int64_t limit = int64_t(kMaxScratch / (kL * sizeof(int32_t)));
  if (s.H + 2 * s.ph > limit || s.W + 2 * s.pw > limit || s.KH * s.KW > limit ||
      s.OH * s.OW > limit || (s.H + 2 * s.ph) * (s.W + 2 * s.pw) > limit)
    return false;
  return lanes_of(s).total() <= kMaxScratch;
}

size_t depthwise_lanes_temp_bytes(const ConvShape& s, int threads) {
  return size_t(threads > 1 ? threads : 1) * lanes_of(s).total();
}

void depthwise_lanes(const KernelContext& ctx, const ConvShape& s, const int8_t* x, int32_t xzp,
                     const int8_t* w, const float* mult, const float* bias, const OutQuant& q,
                     int8_t* y, void* temp) {
  const Lanes L = lanes_of(s);
  const size_t per_thread = L.total();
  for (int t = 0; t < ctx.num_threads(); ++t)  // the padding stays zero; blocks rewrite the rest
    std::memset(static_cast<char*>(temp) + size_t(t) * per_thread, 0, L.t_bytes);
  const int64_t KK = s.KH * s.KW, HW = s.H * s.W, P = s.OH * s.OW, mult_ch = s.OC / s.C;
  const int64_t blocks = ceil_div(s.OC, int64_t(kL));
  const int8_t* x_end = x + s.N * s.C * HW;
  const __m256i zp = _mm256_set1_epi32(xzp);
  auto block = [&](int64_t task, int thread) {
    char* mem = static_cast<char*>(temp) + size_t(thread) * per_thread;
    int32_t* t = reinterpret_cast<int32_t*>(mem);
    int32_t* o = reinterpret_cast<int32_t*>(mem + L.t_bytes);
    int32_t* wv = reinterpret_cast<int32_t*>(mem + L.t_bytes + L.o_bytes);
    int64_t* off = reinterpret_cast<int64_t*>(mem + L.t_bytes + L.o_bytes + L.w_bytes);
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw)
        off[kh * s.KW + kw] = (kh * s.dh * L.Wp + kw * s.dw) * kL;
    const int64_t n = task / blocks, oc0 = task % blocks * kL;
    const int cb = int(s.OC - oc0 < kL ? s.OC - oc0 : kL);  // the block's channels
    const int8_t* src[kL];
    int8_t* dst[kL];
    alignas(32) float mu[kL], b[kL];
    for (int l = 0; l < kL; ++l) {  // spare lanes repeat the last channel
      const int64_t oc = oc0 + (l < cb ? l : cb - 1);
      src[l] = x + (n * s.C + oc / mult_ch) * HW;
      dst[l] = y + (n * s.OC + oc) * P;
      mu[l] = mult[oc];
      b[l] = bias[oc];
      for (int64_t k = 0; k < KK; ++k) wv[k * kL + l] = int32_t(uint16_t(int16_t(w[oc * KK + k])));
    }
    for (int64_t h = 0; h < s.H; ++h)
      widen_columns(src, h * s.W, s.W, x_end, zp, t + ((h + s.ph) * L.Wp + s.pw) * kL);
    const Block blk{t, off, wv, KK, _mm256_load_ps(mu), _mm256_load_ps(b), OutQuant8(q)};
    if (s.sw == 1)
      output_rows<1>(s, L, blk, o);
    else if (s.sw == 2)
      output_rows<2>(s, L, blk, o);
    else
      output_rows<0>(s, L, blk, o);
    // o [P pixels x kL] -> the block's output planes, 8 pixels at a time.
    for (int64_t p = 0;; p += kL) {
      if (P >= kL && p > P - kL) p = P - kL;
      const int m = P - p < kL ? int(P - p) : kL;
      __m256i r[kL];
      for (int l = 0; l < kL; ++l) r[l] = load8(o + (p + l) * kL);
      transpose8(r);
      for (int l = 0; l < cb; ++l) {
        alignas(8) int8_t bytes[kL];
        store_int8x8(r[l], m == kL ? dst[l] + p : bytes);
        if (m < kL) std::memcpy(dst[l] + p, bytes, size_t(m));
      }
      if (p + m >= P) break;
    }
  };
  ctx.parallel_for(s.N * blocks, block);
}

#else  // no lanes path: conv.cpp never takes it

bool depthwise_lanes_suit(const ConvShape&) {
  return false;
}

size_t depthwise_lanes_temp_bytes(const ConvShape&, int) {
  return 0;
}

void depthwise_lanes(const KernelContext&, const ConvShape&, const int8_t*, int32_t, const int8_t*,
                     const float*, const float*, const OutQuant&, int8_t*, void*) {}

#endif

}  // namespace quantized
}  // namespace etb
