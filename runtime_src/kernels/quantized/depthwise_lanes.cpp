// int8 depthwise convolution on channel lanes: kL channels at a time (8 with AVX2, 16 with
// AVX-512), lane l of every vector holding channel l of the block, as the fp32 kernel of
// portable/depthwise_lanes.cpp does and for the same reason: on planes (depthwise.cpp) each
// channel pays for its padded copy, its taps' setup, its flat plane's spare columns and the
// copy out, which on a 7x7 or 14x14 plane cost more than its sums. Here those costs are paid
// once per kL channels, and a stride or a dilation only changes which pixel a tap reads.
//
// For each block of kL output channels:
// - the input rows are copied into one zero-padded plane of pixels t [Hp x Wp], a pixel being
//   kL int32 lanes x - zp: each row is read as kL rows of kL bytes (one per channel), widened
//   and transposed into kL pixels;
// - an output pixel is the sum over taps of the tap's weights (a vector of kL channels'
//   weights) times the pixel under the tap, then requantized per lane. A lane holds
//   |x - zp| <= 255, whose low int16 is the value itself, and a weight lane holds the weight
//   in its low int16 and zero above, so one vpmaddwd gives the exact int32 product;
// - the requantized pixels o [OH * OW] are transposed back, kL at a time, and each channel's
//   kL values packed to bytes (the last group ending at the plane's end, overlapping the one
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

#if defined(ETB_SIMD_AVX2) || (defined(ETB_SIMD_AVX512) && defined(__AVX512BW__))
namespace {

// The vector of kL int32 lanes and the few operations on it that the kernel needs.
#if defined(ETB_SIMD_AVX512)
constexpr int kL = 16;
using VecI = __m512i;
using VecPs = __m512;
using OutQuantL = OutQuant16;
inline VecI load_lanes(const int32_t* p) {
  return _mm512_load_si512(p);
}
inline void store_lanes(int32_t* p, VecI v) {
  _mm512_store_si512(p, v);
}
inline VecI zero_lanes() {
  return _mm512_setzero_si512();
}
inline VecI set_lanes(int32_t v) {
  return _mm512_set1_epi32(v);
}
inline VecI add_lanes(VecI a, VecI b) {
  return _mm512_add_epi32(a, b);
}
inline VecI madd_lanes(VecI a, VecI b) {
  return _mm512_madd_epi16(a, b);
}
inline VecPs load_floats(const float* p) {
  return _mm512_load_ps(p);
}
// float(acc) * mu + b, requantized: the planes' float32 sequence, lane by lane.
inline VecI requantize_lanes(VecI acc, VecPs mu, VecPs b, const OutQuantL& q) {
  return quantize16(_mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), mu), b), q);
}
// n <= kL bytes at p, sign-extended, minus zp (lanes past n: -zp, never used).
inline VecI widen_bytes(const int8_t* p, size_t n, VecI zp) {
  __m128i v = _mm_setzero_si128();
  std::memcpy(&v, p, n);
  return _mm512_sub_epi32(_mm512_cvtepi8_epi32(v), zp);
}
// kL lanes within [-128, 127] as kL bytes.
inline void store_bytes(VecI lanes, int8_t* out) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(lanes));
}
inline VecPs as_floats(VecI v) {
  return _mm512_castsi512_ps(v);
}
inline VecI as_ints(VecPs v) {
  return _mm512_castps_si512(v);
}
#else
constexpr int kL = 8;
using VecI = __m256i;
using VecPs = __m256;
using OutQuantL = OutQuant8;
inline VecI load_lanes(const int32_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}
inline void store_lanes(int32_t* p, VecI v) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(p), v);
}
inline VecI zero_lanes() {
  return _mm256_setzero_si256();
}
inline VecI set_lanes(int32_t v) {
  return _mm256_set1_epi32(v);
}
inline VecI add_lanes(VecI a, VecI b) {
  return _mm256_add_epi32(a, b);
}
inline VecI madd_lanes(VecI a, VecI b) {
  return _mm256_madd_epi16(a, b);
}
inline VecPs load_floats(const float* p) {
  return _mm256_load_ps(p);
}
inline VecI requantize_lanes(VecI acc, VecPs mu, VecPs b, const OutQuantL& q) {
  return quantize8(_mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), mu), b), q);
}
inline VecI widen_bytes(const int8_t* p, size_t n, VecI zp) {
  int64_t bytes = 0;
  std::memcpy(&bytes, p, n);
  return _mm256_sub_epi32(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes)), zp);
}
inline void store_bytes(VecI lanes, int8_t* out) {
  store_int8x8(lanes, out);
}
inline VecPs as_floats(VecI v) {
  return _mm256_castsi256_ps(v);
}
inline VecI as_ints(VecPs v) {
  return _mm256_castps_si256(v);
}
#endif
static_assert(kL == simd::VecF::kWidth, "a block's lanes are one float vector wide");

constexpr size_t kMaxScratch = size_t(160) << 10;  // a thread's scratch, beyond which planes
// Whether lanes beat planes on a shape the planes take, as measured against planes on
// MobileNetV2's layers. AVX2: input planes up to 16x16 (its 7x7 layers took 0.63 of the time,
// 14x14 0.74-0.87 at stride 2 and 1; 28x28 with stride 2 1.07-1.17, 56x56 with stride 2
// 1.3-1.5). AVX-512, whose planes are faster: output planes up to 8x8 (its 7x7 layers 0.87-0.88,
// the 14x14 to 7x7 stride-2 layer 0.69 at 1 thread and 0.85 at 2; 14x14 stride 1 1.13-1.16).
inline bool lanes_beat_planes(const ConvShape& s) {
#if defined(ETB_SIMD_AVX512)
  return s.OH * s.OW <= 64;
#else
  return s.H * s.W <= 256;
#endif
}

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

// simd::transpose on kL x kL int32 (the shuffles move bits, whatever the lanes hold).
inline void transpose_lanes(VecI* r) {
  simd::VecF f[kL];
  for (int l = 0; l < kL; ++l) f[l].v = as_floats(r[l]);
  simd::transpose(f);
  for (int l = 0; l < kL; ++l) r[l] = as_ints(f[l].v);
}

// What the output pixels of one block are computed from.
struct Block {
  const int32_t* t;    // the padded input pixels
  const int64_t* off;  // KK tap offsets into t, in int32
  const int32_t* w;    // KK weight vectors
  int64_t KK;
  VecPs mu, b;  // per lane: float32(x_scale) * w_scale, the bias
  OutQuantL q;
};

// NP output pixels, `step` int32 apart in t from p (S > 0: step = S kL, a constant), into o.
template <int NP, int S>
inline void pixels(const Block& b, const int32_t* p, int64_t step, int32_t* o) {
  const int64_t st = S > 0 ? int64_t(S) * kL : step;
  VecI acc[NP];
  for (int j = 0; j < NP; ++j) acc[j] = zero_lanes();
  for (int64_t k = 0; k < b.KK; ++k) {
    const int32_t* at = p + b.off[k];
    const VecI wv = load_lanes(b.w + k * kL);
    for (int j = 0; j < NP; ++j)
      acc[j] = add_lanes(acc[j], madd_lanes(load_lanes(at + j * st), wv));
  }
  for (int j = 0; j < NP; ++j) store_lanes(o + j * kL, requantize_lanes(acc[j], b.mu, b.b, b.q));
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
// src[l] + at, kL at a time through a transpose (the last group ending at column n,
// overlapping the one before). A group reads kL bytes of each row, past column n where the
// rows go on; where the last row's would pass `end`, each row is read as far as column n.
// The src[l] do not decrease with l.
void widen_columns(const int8_t* const* src, int64_t at, int64_t n, const int8_t* end, VecI zp,
                   int32_t* dst) {
  for (int64_t x0 = 0;; x0 += kL) {
    if (n >= kL && x0 > n - kL) x0 = n - kL;
    const int m = n - x0 < kL ? int(n - x0) : kL;
    const bool whole = src[kL - 1] + at + x0 + kL <= end;
    VecI r[kL];
    for (int l = 0; l < kL; ++l)  // (a constant size where whole: one load)
      r[l] = whole ? widen_bytes(src[l] + at + x0, kL, zp)
                   : widen_bytes(src[l] + at + x0, size_t(m), zp);
    transpose_lanes(r);
    for (int j = 0; j < m; ++j) store_lanes(dst + (x0 + j) * kL, r[j]);
    if (x0 + m >= n) return;
  }
}

}  // namespace

bool depthwise_lanes_suit(const ConvShape& s) {
  if (s.OH < 1 || s.OW < 1 || s.groups != s.C) return false;
  if (depthwise_direct_supported(s) && !lanes_beat_planes(s)) return false;
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
  // Each thread's scratch (the padding stays zero; blocks rewrite the rest).
  ThreadScratch scratch(ctx, temp, per_thread, L.t_bytes);
  const int64_t KK = s.KH * s.KW, HW = s.H * s.W, P = s.OH * s.OW, mult_ch = s.OC / s.C;
  const int64_t blocks = ceil_div(s.OC, int64_t(kL));
  const int8_t* x_end = x + s.N * s.C * HW;
  const VecI zp = set_lanes(xzp);
  auto block = [&](int64_t task, int thread) {
    char* mem = scratch.slice(thread);
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
    alignas(64) float mu[kL], b[kL];
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
    const Block blk{t, off, wv, KK, load_floats(mu), load_floats(b), OutQuantL(q)};
    if (s.sw == 1)
      output_rows<1>(s, L, blk, o);
    else if (s.sw == 2)
      output_rows<2>(s, L, blk, o);
    else
      output_rows<0>(s, L, blk, o);
    // o [P pixels x kL] -> the block's output planes, kL pixels at a time.
    for (int64_t p = 0;; p += kL) {
      if (P >= kL && p > P - kL) p = P - kL;
      const int m = P - p < kL ? int(P - p) : kL;
      VecI r[kL];
      for (int l = 0; l < kL; ++l) r[l] = load_lanes(o + (p + l) * kL);
      transpose_lanes(r);
      for (int l = 0; l < cb; ++l) {
        alignas(16) int8_t bytes[kL];
        store_bytes(r[l], m == kL ? dst[l] + p : bytes);
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
