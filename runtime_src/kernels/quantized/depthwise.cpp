// Direct int8 depthwise convolution (see depthwise.h for the shapes it takes).
//
// Each input channel is copied once, zero point subtracted, into int16 planes whose padding
// is explicit zeros, so no tap needs a bounds check and borders cost nothing extra. The output
// plane is computed flat: output (oh, ow) is element q = oh * QW + ow of a plane of pitch
// QW >= OW, whose extra columns are computed and dropped, so even a 7x7 plane runs in full
// vectors. Tap (kh, kw) of output q is R[kh][S * q + kw], R[kh] a row of the padded input:
//   - stride 1: the padded plane P of pitch Wp = W + 2 pw, QW = Wp, R[kh] = P + kh * Wp;
//   - stride 2: the even and the odd padded rows as two planes E and O of even pitch
//     Wp = 2 QW (W + 2 pw rounded up), R[kh] = (kh even ? E : O) + (kh / 2) * Wp.
// Sums are exact in int32 (|x - zp| <= 255, |w| <= 128, at most 25 taps), so the order of the
// additions does not matter; the requantization is the float32 sequence of quantize_one.
//
// With AVX2, pairs of adjacent taps of a row are multiplied and added in one vpmaddwd (or
// accumulated with vpdpwssd under AVX512-VNNI): a 32-bit load at R[kh] + S q + 2m holds taps
// (2m, 2m + 1) of output q (the odd tap of the last pair meets a zero weight). With stride 2
// the pairs of consecutive outputs are consecutive 32-bit lanes; with stride 1 a load gives
// every other output, so even and odd outputs are summed apart and interleaved at the end.
// 16 outputs are requantized in two vectors and stored as 16 bytes into a flat int8 plane,
// whose valid columns are then copied out. With AVX-512 the same runs on 512-bit vectors, 32
// outputs a step. Elsewhere a plain C++ loop does the same sums.
#include "kernels/quantized/depthwise.h"

#include <cstring>

#include "kernels/intrinsics.h"

namespace etb {
namespace quantized {
namespace {

#if defined(__AVX512BW__)
constexpr int64_t kBlock = 32;  // outputs per vector step
#else
constexpr int64_t kBlock = 16;
#endif
constexpr int64_t kSlack = 4 * kBlock;  // zeroed int16 past each plane: room for over-reads
constexpr int64_t kMove = 16;           // bytes per move when the valid columns are copied out

inline size_t align64(size_t n) {
  return (n + 63) & ~size_t(63);
}

// Geometry of the padded planes and the flat output plane.
struct Planes {
  int64_t S, K, Hp, Wp, QW, nq;  // nq: flat outputs up to the last valid one
  int64_t rows0, rows1;          // rows of P (stride 1) or of E and O (stride 2)
};

Planes planes_of(const ConvShape& s) {
  Planes p;
  p.S = s.sh;
  p.K = s.KH;
  p.Hp = s.H + 2 * s.ph;
  const int64_t wp = s.W + 2 * s.pw;
  p.Wp = p.S == 1 ? wp : wp + (wp & 1);
  p.QW = p.Wp / p.S;
  p.nq = (s.OH - 1) * p.QW + s.OW;
  p.rows0 = p.S == 1 ? p.Hp : (p.Hp + 1) / 2;
  p.rows1 = p.S == 1 ? 0 : p.Hp / 2;
  return p;
}

// int16 elements of the padded planes.
int64_t plane_elems(const Planes& p) {
  return p.rows0 * p.Wp + kSlack + (p.S == 1 ? 0 : p.rows1 * p.Wp + kSlack);
}

#if defined(__AVX2__)
constexpr bool kVector = true;

// Taps (2m, 2m + 1) of kernel row kh as one int32 of two int16 (the odd tap past the row's
// end is zero), the operand a 32-bit lane of the padded rows is multiplied by.
inline int32_t tap_pair(const int8_t* w, int K, int kh, int m) {
  const uint32_t lo = uint16_t(int16_t(w[kh * K + 2 * m]));
  const uint32_t hi = 2 * m + 1 < K ? uint16_t(int16_t(w[kh * K + 2 * m + 1])) : 0u;
  return int32_t(lo | (hi << 16));
}

// d[i] = src[i] - zp for i < n; the last vector overlaps the previous one instead of a tail.
inline void widen_row(const int8_t* src, int64_t n, int16_t zp, int16_t* d) {
  if (n >= 16) {
    const __m256i z = _mm256_set1_epi16(zp);
    for (int64_t i = 0;; i += 16) {
      if (i + 16 > n) i = n - 16;
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                          _mm256_sub_epi16(_mm256_cvtepi8_epi16(v), z));
      if (i + 16 == n) break;
    }
  } else if (n >= 8) {
    const __m128i z = _mm_set1_epi16(zp);
    for (int64_t i = 0;; i = n - 8) {
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm_sub_epi16(_mm_cvtepi8_epi16(v), z));
      if (i == n - 8) break;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = int16_t(src[i] - zp);
  }
}

#if defined(__AVX512BW__)
inline __m512i dot_pairs(__m512i acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

// One output channel: flat int8 outputs [0, nq) rounded up to kBlock into `out`.
template <int K, int S>
void plane_simd(const int16_t* const* R, int64_t nq, const int8_t* w, float mu, float b,
                const OutQuant& q, int8_t* out) {
  constexpr int M = (K + 1) / 2;  // tap pairs per kernel row
  __m512i wv[K][M];
  for (int kh = 0; kh < K; ++kh)
    for (int m = 0; m < M; ++m) wv[kh][m] = _mm512_set1_epi32(tap_pair(w, K, kh, m));
  const __m512 muv = _mm512_set1_ps(mu), bv = _mm512_set1_ps(b);
  const OutQuant16 v(q);
  for (int64_t q0 = 0; q0 < nq; q0 += kBlock) {
    // S == 1: a0 holds outputs q0 + 0, 2, ..., 30 and a1 q0 + 1, 3, ..., 31;
    // S == 2: a0 holds outputs q0 + 0..15 and a1 q0 + 16..31.
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    for (int kh = 0; kh < K; ++kh) {
      const int16_t* r = R[kh] + S * q0;
      for (int m = 0; m < M; ++m) {
        a0 = dot_pairs(a0, _mm512_loadu_si512(r + 2 * m), wv[kh][m]);
        a1 = dot_pairs(a1, _mm512_loadu_si512(r + (S == 1 ? 1 : 32) + 2 * m), wv[kh][m]);
      }
    }
    const __m128i e0 = _mm512_cvtepi32_epi8(
        quantize16(_mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a0), muv), bv), v));
    const __m128i e1 = _mm512_cvtepi32_epi8(
        quantize16(_mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a1), muv), bv), v));
    __m128i* o = reinterpret_cast<__m128i*>(out + q0);
    if (S == 1) {  // even and odd outputs interleaved
      _mm_storeu_si128(o, _mm_unpacklo_epi8(e0, e1));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi8(e0, e1));
    } else {
      _mm_storeu_si128(o, e0);
      _mm_storeu_si128(o + 1, e1);
    }
  }
}
#else
inline __m256i dot_pairs(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

inline __m256i load16(const int16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// quantize_one(float(acc) * mu + b, q) on 8 lanes (requant.h's quantize8).
struct QuantV {
  __m256 mu, b;
  OutQuant8 q;
};

inline __m256i requant8(__m256i acc, const QuantV& v) {
  return quantize8(_mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), v.mu), v.b), v.q);
}

// One output channel: flat int8 outputs [0, nq) rounded up to kBlock into `out`.
template <int K, int S>
void plane_simd(const int16_t* const* R, int64_t nq, const int8_t* w, float mu, float b,
                const OutQuant& q, int8_t* out) {
  constexpr int M = (K + 1) / 2;  // tap pairs per kernel row
  __m256i wv[K][M];
  for (int kh = 0; kh < K; ++kh)
    for (int m = 0; m < M; ++m) wv[kh][m] = _mm256_set1_epi32(tap_pair(w, K, kh, m));
  const QuantV v{_mm256_set1_ps(mu), _mm256_set1_ps(b), OutQuant8(q)};
  for (int64_t q0 = 0; q0 < nq; q0 += kBlock) {
    // S == 1: a0 holds outputs q0 + 0, 2, ..., 14 and a1 q0 + 1, 3, ..., 15;
    // S == 2: a0 holds outputs q0 + 0..7 and a1 q0 + 8..15.
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (int kh = 0; kh < K; ++kh) {
      const int16_t* r = R[kh] + S * q0;
      for (int m = 0; m < M; ++m) {
        a0 = dot_pairs(a0, load16(r + 2 * m), wv[kh][m]);
        a1 = dot_pairs(a1, load16(r + (S == 1 ? 1 : 16) + 2 * m), wv[kh][m]);
      }
    }
    const __m256i i0 = requant8(a0, v), i1 = requant8(a1, v);
    __m256i p;  // 16 int16 in output order
    if (S == 1) {
      p = _mm256_packs_epi32(_mm256_unpacklo_epi32(i0, i1), _mm256_unpackhi_epi32(i0, i1));
    } else {
      p = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8);
    }
    const __m128i bytes =
        _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + q0), bytes);
  }
}
#endif

template <int K, int S>
void plane(const int16_t* const* R, const Planes& pl, const ConvShape& s, const int8_t* w, float mu,
           float b, const OutQuant& q, int8_t* flat, int8_t* y) {
  plane_simd<K, S>(R, pl.nq, w, mu, b, q, flat);
  // Valid columns out, in 16-byte moves while they stay inside the plane (a move past the
  // end of a row only writes rows that are copied after it).
  const int64_t OW = s.OW, P = s.OH * OW, span = (OW + kMove - 1) / kMove * kMove;
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const int8_t* src = flat + oh * pl.QW;
    int8_t* dst = y + oh * OW;
    if (oh * OW + span > P) {
      std::memcpy(dst, src, size_t(OW));
      continue;
    }
    for (int64_t i = 0; i < OW; i += kMove)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
}
#else
constexpr bool kVector = false;

// d[i] = src[i] - zp for i < n.
inline void widen_row(const int8_t* __restrict src, int64_t n, int16_t zp, int16_t* __restrict d) {
  for (int64_t i = 0; i < n; ++i) d[i] = int16_t(src[i] - zp);
}

// One output channel, straight into y: int32 sums for up to kChunk outputs of a row (a loop
// over outputs that compilers vectorize), then their requantization.
template <int K, int S>
void plane(const int16_t* const* R, const Planes& pl, const ConvShape& s, const int8_t* w, float mu,
           float b, const OutQuant& q, int8_t* /*flat*/, int8_t* y) {
  constexpr int64_t kChunk = 64;
  int32_t wk[K * K], acc[kChunk];
  for (int i = 0; i < K * K; ++i) wk[i] = w[i];
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    for (int64_t ow0 = 0; ow0 < s.OW; ow0 += kChunk) {
      const int64_t n = s.OW - ow0 < kChunk ? s.OW - ow0 : kChunk;
      const int16_t* rows[K];
      for (int kh = 0; kh < K; ++kh) rows[kh] = R[kh] + S * (oh * pl.QW + ow0);
      for (int64_t j = 0; j < n; ++j) {
        int32_t a = 0;
        for (int kh = 0; kh < K; ++kh)
          for (int kw = 0; kw < K; ++kw) a += wk[kh * K + kw] * int32_t(rows[kh][S * j + kw]);
        acc[j] = a;
      }
      int8_t* __restrict yr = y + oh * s.OW + ow0;
      for (int64_t j = 0; j < n; ++j) yr[j] = quantize_one(float(acc[j]) * mu + b, q);
    }
  }
}
#endif

using PlaneFn = void (*)(const int16_t* const*, const Planes&, const ConvShape&, const int8_t*,
                         float, float, const OutQuant&, int8_t*, int8_t*);

PlaneFn plane_fn(int64_t K, int64_t S) {
  if (K == 3) return S == 1 ? plane<3, 1> : plane<3, 2>;
  return S == 1 ? plane<5, 1> : plane<5, 2>;
}

// Scratch of one thread: the padded int16 planes and the flat int8 outputs.
size_t thread_temp_bytes(const Planes& p) {
  // The flat outputs, rounded up to whole vectors, and room for the copy's last 16-byte move.
  const size_t flat = kVector ? size_t((p.nq + kBlock - 1) / kBlock * kBlock + kMove) : 0;
  return align64(size_t(plane_elems(p)) * sizeof(int16_t)) + align64(flat);
}

// Input channel plane `xc` into output channels [oc0, oc0 + mult_ch), output channel oc at
// y + oc * y_stride, on one thread's scratch `mine` (whose padding and slack are zero).
void channel_planes(const ConvShape& s, const Planes& p, PlaneFn fn, const int8_t* xc, int16_t zp,
                    const int8_t* w, const float* mult, const float* bias, const OutQuant& q,
                    int64_t oc0, int64_t mult_ch, int8_t* y, int64_t y_stride, char* mine) {
  const int64_t elems = plane_elems(p), KK = p.K * p.K;
  int16_t* const p0 = reinterpret_cast<int16_t*>(mine);  // P, or E
  int16_t* const p1 = p0 + p.rows0 * p.Wp + kSlack;      // O
  int8_t* flat = reinterpret_cast<int8_t*>(mine) + align64(size_t(elems) * sizeof(int16_t));
  const int16_t* R[5];
  for (int64_t kh = 0; kh < p.K; ++kh)
    R[kh] = p.S == 1 ? p0 + kh * p.Wp : ((kh & 1) ? p1 : p0) + (kh / 2) * p.Wp;
  for (int64_t ih = 0; ih < s.H; ++ih) {
    const int64_t r = ih + s.ph;  // padded row
    int16_t* d = p.S == 1 ? p0 + r * p.Wp : ((r & 1) ? p1 : p0) + (r / 2) * p.Wp;
    widen_row(xc + ih * s.W, s.W, zp, d + s.pw);
  }
  for (int64_t oc = oc0; oc < oc0 + mult_ch; ++oc)
    fn(R, p, s, w + oc * KK, mult[oc], bias[oc], q, flat, y + oc * y_stride);
}

}  // namespace

bool depthwise_direct_supported(const ConvShape& s) {
  return s.KH == s.KW && (s.KH == 3 || s.KH == 5) && s.sh == s.sw && (s.sh == 1 || s.sh == 2) &&
         s.dh == 1 && s.dw == 1 && s.ph < s.KH && s.pw < s.KW && s.groups == s.C && s.OH >= 1 &&
         s.OW >= 1;
}

size_t depthwise_direct_temp_bytes(const ConvShape& s, int threads) {
  return size_t(threads > 1 ? threads : 1) * thread_temp_bytes(planes_of(s));
}

void depthwise_direct(const KernelContext& ctx, const ConvShape& s, const int8_t* x, int32_t xzp,
                      const int8_t* w, const float* mult, const float* bias, const OutQuant& q,
                      int8_t* y, void* temp) {
  const Planes p = planes_of(s);
  // Each thread's planes (their padding and slack stay zero).
  ThreadScratch planes(ctx, temp, thread_temp_bytes(p), size_t(plane_elems(p)) * sizeof(int16_t));
  const PlaneFn fn = plane_fn(p.K, p.S);
  const int64_t HW = s.H * s.W, P = s.OH * s.OW;
  const int64_t mult_ch = s.OC / s.groups;  // output channels per input channel
  // The threads split the input channels, each with its own planes.
  auto channel = [&](int64_t task, int thread) {
    const int64_t n = task / s.C, c = task % s.C;
    channel_planes(s, p, fn, x + (n * s.C + c) * HW, int16_t(xzp), w, mult, bias, q, c * mult_ch,
                   mult_ch, y + n * s.OC * P, P, planes.slice(thread));
  };
  ctx.parallel_for(s.N * s.C, channel);
}

void depthwise_direct_serial(const ConvShape& s, const int8_t* x, int64_t x_stride, int32_t xzp,
                             const int8_t* w, const float* mult, const float* bias,
                             const OutQuant& q, int8_t* y, int64_t y_stride, void* temp) {
  const Planes p = planes_of(s);
  std::memset(temp, 0, size_t(plane_elems(p)) * sizeof(int16_t));
  const PlaneFn fn = plane_fn(p.K, p.S);
  const int64_t mult_ch = s.OC / s.groups;
  for (int64_t c = 0; c < s.C; ++c)
    channel_planes(s, p, fn, x + c * x_stride, int16_t(xzp), w, mult, bias, q, c * mult_ch, mult_ch,
                   y, y_stride, static_cast<char*>(temp));
}

}  // namespace quantized
}  // namespace etb
