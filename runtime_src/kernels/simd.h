// Explicit SIMD for the kernels: one small float-vector type for the instruction set the
// kernels are compiled for, written with intrinsics, so that a kernel written once against
// VecF is vectorized on every target without relying on the compiler's auto-vectorizer.
//
//   AVX-512F (16 lanes, FMA)  when __AVX512F__         x86-64-v4, or -march=native on such a CPU
//   AVX2 + FMA (8 lanes)      when __AVX2__ && __FMA__ x86-64-v3
//   SSE2 (4 lanes, mul + add) any other x86-64        x86-64, x86-64-v2
//   NEON (4 lanes, FMA)       __aarch64__             linux_aarch64, android arm64-v8a
//   scalar (1 lane)           everything else          Cortex-M and other 32-bit cores
//
// The set is chosen at compile time: a host build is compiled for the build machine (or the
// level the target names) and kernel_isa() says which path it holds.
#pragma once

#include <cstdint>

#include "kernels/intrinsics.h"

#define ETB_SIMD_INLINE inline __attribute__((always_inline))

namespace etb {
namespace simd {

#if defined(__AVX512F__)
#define ETB_SIMD_AVX512 1
inline constexpr const char kIsa[] = "avx512";
struct VecF {
  static constexpr int kWidth = 16;
  __m512 v;
  static ETB_SIMD_INLINE VecF load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static ETB_SIMD_INLINE VecF broadcast(float x) { return {_mm512_set1_ps(x)}; }
  static ETB_SIMD_INLINE VecF zero() { return {_mm512_setzero_ps()}; }
  ETB_SIMD_INLINE void store(float* p) const { _mm512_storeu_ps(p, v); }
  /// Lanes [0, n) from p, the rest zero (0 <= n <= kWidth); reads only those n floats.
  static ETB_SIMD_INLINE VecF load_partial(const float* p, int n) {
    return {_mm512_maskz_loadu_ps(__mmask16((1u << n) - 1u), p)};
  }
  /// Stores lanes [0, n) to p; writes only those n floats.
  ETB_SIMD_INLINE void store_partial(float* p, int n) const {
    _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1u), v);
  }
};
ETB_SIMD_INLINE VecF operator+(VecF a, VecF b) {
  return {_mm512_add_ps(a.v, b.v)};
}
ETB_SIMD_INLINE VecF operator*(VecF a, VecF b) {
  return {_mm512_mul_ps(a.v, b.v)};
}
/// a * b + c (one rounding where the set has FMA).
ETB_SIMD_INLINE VecF fma(VecF a, VecF b, VecF c) {
  return {_mm512_fmadd_ps(a.v, b.v, c.v)};
}
/// The sum of the lanes (in a fixed order).
ETB_SIMD_INLINE float reduce_add(VecF x) {
  return _mm512_reduce_add_ps(x.v);
}
/// max(lo, x) and min(hi, x) that return x when x is NaN (as torch's clamp does).
ETB_SIMD_INLINE VecF max_nan(VecF lo, VecF x) {
  return {_mm512_max_ps(lo.v, x.v)};
}
ETB_SIMD_INLINE VecF min_nan(VecF hi, VecF x) {
  return {_mm512_min_ps(hi.v, x.v)};
}
/// Lanes p[0], p[2], ... into even and p[1], p[3], ... into odd; reads p[0 .. 2 * kWidth).
ETB_SIMD_INLINE void load_deinterleave(const float* p, VecF* even, VecF* odd) {
  const __m512i e = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i o = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
  even->v = _mm512_permutex2var_ps(a, e, b);
  odd->v = _mm512_permutex2var_ps(a, o, b);
}
/// Transposes r[0 .. kWidth) as a kWidth x kWidth matrix: lane j of r[i] swaps with lane i of
/// r[j]. In registers: 4 x 4 blocks transposed within each 128-bit lane (unpack, shuffle),
/// then the 4 x 4 matrix of 128-bit lanes (shuffle_f32x4).
ETB_SIMD_INLINE void transpose(VecF* r) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // per lane: t[2i] = a0 b0 a1 b1, t[2i + 1] = a2 b2 a3 b3
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  for (int i = 0; i < 4; ++i) {  // per lane L: u[4i + j] = column 4L + j of rows 4i .. 4i + 3
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {  // r[4L + j] = lane L of u[j], u[4 + j], u[8 + j], u[12 + j]
    const __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44);
    const __m512 v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
    r[j].v = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[4 + j].v = _mm512_shuffle_f32x4(v0, v2, 0xDD);
    r[8 + j].v = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[12 + j].v = _mm512_shuffle_f32x4(v1, v3, 0xDD);
  }
}
/// Per lane: x > m, or x is NaN (the lanes a running maximum takes, torch's rule).
struct MaskF {
  __mmask16 m;
};
ETB_SIMD_INLINE MaskF takes_max(VecF x, VecF m) {
  return {__mmask16(_mm512_cmp_ps_mask(x.v, m.v, _CMP_GT_OQ) |
                    _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q))};
}
/// a where the mask is set, else b.
ETB_SIMD_INLINE VecF select(MaskF k, VecF a, VecF b) {
  return {_mm512_mask_blend_ps(k.m, b.v, a.v)};
}

#elif defined(__AVX2__) && defined(__FMA__)
#define ETB_SIMD_AVX2 1
inline constexpr const char kIsa[] = "avx2";
namespace detail {
// Masks for the partial loads and stores: lanes [0, n) are &kMaskTable[8 - n].
alignas(64) inline constexpr int32_t kMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                       0,  0,  0,  0,  0,  0,  0,  0};
ETB_SIMD_INLINE __m256i mask_of(int n) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&kMaskTable[8 - n]));
}
}  // namespace detail
struct VecF {
  static constexpr int kWidth = 8;
  __m256 v;
  static ETB_SIMD_INLINE VecF load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static ETB_SIMD_INLINE VecF broadcast(float x) { return {_mm256_set1_ps(x)}; }
  static ETB_SIMD_INLINE VecF zero() { return {_mm256_setzero_ps()}; }
  ETB_SIMD_INLINE void store(float* p) const { _mm256_storeu_ps(p, v); }
  static ETB_SIMD_INLINE VecF load_partial(const float* p, int n) {
    return {_mm256_maskload_ps(p, detail::mask_of(n))};
  }
  ETB_SIMD_INLINE void store_partial(float* p, int n) const {
    _mm256_maskstore_ps(p, detail::mask_of(n), v);
  }
};
ETB_SIMD_INLINE VecF operator+(VecF a, VecF b) {
  return {_mm256_add_ps(a.v, b.v)};
}
ETB_SIMD_INLINE VecF operator*(VecF a, VecF b) {
  return {_mm256_mul_ps(a.v, b.v)};
}
ETB_SIMD_INLINE VecF fma(VecF a, VecF b, VecF c) {
  return {_mm256_fmadd_ps(a.v, b.v, c.v)};
}
ETB_SIMD_INLINE float reduce_add(VecF x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x.v), _mm256_extractf128_ps(x.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
ETB_SIMD_INLINE VecF max_nan(VecF lo, VecF x) {
  return {_mm256_max_ps(lo.v, x.v)};
}
ETB_SIMD_INLINE VecF min_nan(VecF hi, VecF x) {
  return {_mm256_min_ps(hi.v, x.v)};
}
ETB_SIMD_INLINE void load_deinterleave(const float* p, VecF* even, VecF* odd) {
  // shuffle: [p0 p2 p8 p10 | p4 p6 p12 p14]; permute: [p0 p2 p4 p6 p8 p10 p12 p14]
  const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  even->v = _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
  odd->v = _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}
ETB_SIMD_INLINE void transpose(VecF* r) {
  // Pairs of rows interleaved, then pairs of pairs: 4 x 4 blocks transposed within each half;
  // then the halves exchanged.
  const __m256 t0 = _mm256_unpacklo_ps(r[0].v, r[1].v), t1 = _mm256_unpackhi_ps(r[0].v, r[1].v);
  const __m256 t2 = _mm256_unpacklo_ps(r[2].v, r[3].v), t3 = _mm256_unpackhi_ps(r[2].v, r[3].v);
  const __m256 t4 = _mm256_unpacklo_ps(r[4].v, r[5].v), t5 = _mm256_unpackhi_ps(r[4].v, r[5].v);
  const __m256 t6 = _mm256_unpacklo_ps(r[6].v, r[7].v), t7 = _mm256_unpackhi_ps(r[6].v, r[7].v);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0].v = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1].v = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2].v = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3].v = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4].v = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5].v = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6].v = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7].v = _mm256_permute2f128_ps(u3, u7, 0x31);
}
struct MaskF {
  __m256 m;
};
ETB_SIMD_INLINE MaskF takes_max(VecF x, VecF m) {
  return {_mm256_or_ps(_mm256_cmp_ps(x.v, m.v, _CMP_GT_OQ), _mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q))};
}
ETB_SIMD_INLINE VecF select(MaskF k, VecF a, VecF b) {
  return {_mm256_blendv_ps(b.v, a.v, k.m)};
}

#elif defined(__SSE2__)
#define ETB_SIMD_SSE2 1
inline constexpr const char kIsa[] = "sse2";
struct VecF {
  static constexpr int kWidth = 4;
  __m128 v;
  static ETB_SIMD_INLINE VecF load(const float* p) { return {_mm_loadu_ps(p)}; }
  static ETB_SIMD_INLINE VecF broadcast(float x) { return {_mm_set1_ps(x)}; }
  static ETB_SIMD_INLINE VecF zero() { return {_mm_setzero_ps()}; }
  ETB_SIMD_INLINE void store(float* p) const { _mm_storeu_ps(p, v); }
  static ETB_SIMD_INLINE VecF load_partial(const float* p, int n) {
    alignas(16) float t[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < n; ++i) t[i] = p[i];
    return {_mm_load_ps(t)};
  }
  ETB_SIMD_INLINE void store_partial(float* p, int n) const {
    alignas(16) float t[4];
    _mm_store_ps(t, v);
    for (int i = 0; i < n; ++i) p[i] = t[i];
  }
};
ETB_SIMD_INLINE VecF operator+(VecF a, VecF b) {
  return {_mm_add_ps(a.v, b.v)};
}
ETB_SIMD_INLINE VecF operator*(VecF a, VecF b) {
  return {_mm_mul_ps(a.v, b.v)};
}
ETB_SIMD_INLINE VecF fma(VecF a, VecF b, VecF c) {  // no FMA before x86-64-v3
  return {_mm_add_ps(_mm_mul_ps(a.v, b.v), c.v)};
}
ETB_SIMD_INLINE float reduce_add(VecF x) {
  const __m128 s = _mm_add_ps(x.v, _mm_movehl_ps(x.v, x.v));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
ETB_SIMD_INLINE VecF max_nan(VecF lo, VecF x) {
  return {_mm_max_ps(lo.v, x.v)};
}
ETB_SIMD_INLINE VecF min_nan(VecF hi, VecF x) {
  return {_mm_min_ps(hi.v, x.v)};
}
ETB_SIMD_INLINE void load_deinterleave(const float* p, VecF* even, VecF* odd) {
  const __m128 a = _mm_loadu_ps(p), b = _mm_loadu_ps(p + 4);
  even->v = _mm_shuffle_ps(a, b, 0x88);
  odd->v = _mm_shuffle_ps(a, b, 0xDD);
}
ETB_SIMD_INLINE void transpose(VecF* r) {
  const __m128 t0 = _mm_unpacklo_ps(r[0].v, r[1].v), t1 = _mm_unpacklo_ps(r[2].v, r[3].v);
  const __m128 t2 = _mm_unpackhi_ps(r[0].v, r[1].v), t3 = _mm_unpackhi_ps(r[2].v, r[3].v);
  r[0].v = _mm_movelh_ps(t0, t1);
  r[1].v = _mm_movehl_ps(t1, t0);
  r[2].v = _mm_movelh_ps(t2, t3);
  r[3].v = _mm_movehl_ps(t3, t2);
}
struct MaskF {
  __m128 m;
};
ETB_SIMD_INLINE MaskF takes_max(VecF x, VecF m) {
  return {_mm_or_ps(_mm_cmpgt_ps(x.v, m.v), _mm_cmpunord_ps(x.v, x.v))};
}
ETB_SIMD_INLINE VecF select(MaskF k, VecF a, VecF b) {  // SSE2 has no blendv
  return {_mm_or_ps(_mm_and_ps(k.m, a.v), _mm_andnot_ps(k.m, b.v))};
}

#elif defined(__aarch64__) && defined(__ARM_NEON)
#define ETB_SIMD_NEON 1
inline constexpr const char kIsa[] = "neon";
struct VecF {
  static constexpr int kWidth = 4;
  float32x4_t v;
  static ETB_SIMD_INLINE VecF load(const float* p) { return {vld1q_f32(p)}; }
  static ETB_SIMD_INLINE VecF broadcast(float x) { return {vdupq_n_f32(x)}; }
  static ETB_SIMD_INLINE VecF zero() { return {vdupq_n_f32(0.f)}; }
  ETB_SIMD_INLINE void store(float* p) const { vst1q_f32(p, v); }
  static ETB_SIMD_INLINE VecF load_partial(const float* p, int n) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0; i < n; ++i) t[i] = p[i];
    return {vld1q_f32(t)};
  }
  ETB_SIMD_INLINE void store_partial(float* p, int n) const {
    float t[4];
    vst1q_f32(t, v);
    for (int i = 0; i < n; ++i) p[i] = t[i];
  }
};
ETB_SIMD_INLINE VecF operator+(VecF a, VecF b) {
  return {vaddq_f32(a.v, b.v)};
}
ETB_SIMD_INLINE VecF operator*(VecF a, VecF b) {
  return {vmulq_f32(a.v, b.v)};
}
ETB_SIMD_INLINE VecF fma(VecF a, VecF b, VecF c) {
  return {vfmaq_f32(c.v, a.v, b.v)};
}
ETB_SIMD_INLINE float reduce_add(VecF x) {
  return vaddvq_f32(x.v);
}
// NEON's max/min return NaN when either operand is NaN.
ETB_SIMD_INLINE VecF max_nan(VecF lo, VecF x) {
  return {vmaxq_f32(lo.v, x.v)};
}
ETB_SIMD_INLINE VecF min_nan(VecF hi, VecF x) {
  return {vminq_f32(hi.v, x.v)};
}
ETB_SIMD_INLINE void load_deinterleave(const float* p, VecF* even, VecF* odd) {
  const float32x4_t a = vld1q_f32(p), b = vld1q_f32(p + 4);
  even->v = vuzp1q_f32(a, b);
  odd->v = vuzp2q_f32(a, b);
}
ETB_SIMD_INLINE void transpose(VecF* r) {
  const float32x4x2_t p = vtrnq_f32(r[0].v, r[1].v);  // [a0 b0 a2 b2], [a1 b1 a3 b3]
  const float32x4x2_t q = vtrnq_f32(r[2].v, r[3].v);  // [c0 d0 c2 d2], [c1 d1 c3 d3]
  r[0].v = vcombine_f32(vget_low_f32(p.val[0]), vget_low_f32(q.val[0]));
  r[1].v = vcombine_f32(vget_low_f32(p.val[1]), vget_low_f32(q.val[1]));
  r[2].v = vcombine_f32(vget_high_f32(p.val[0]), vget_high_f32(q.val[0]));
  r[3].v = vcombine_f32(vget_high_f32(p.val[1]), vget_high_f32(q.val[1]));
}
struct MaskF {
  uint32x4_t m;
};
ETB_SIMD_INLINE MaskF takes_max(VecF x, VecF m) {
  // x != x is true exactly for NaN.
  return {vorrq_u32(vcgtq_f32(x.v, m.v), vmvnq_u32(vceqq_f32(x.v, x.v)))};
}
ETB_SIMD_INLINE VecF select(MaskF k, VecF a, VecF b) {
  return {vbslq_f32(k.m, a.v, b.v)};
}

#else
#define ETB_SIMD_SCALAR 1
inline constexpr const char kIsa[] = "scalar";
struct VecF {
  static constexpr int kWidth = 1;
  float v;
  static ETB_SIMD_INLINE VecF load(const float* p) { return {*p}; }
  static ETB_SIMD_INLINE VecF broadcast(float x) { return {x}; }
  static ETB_SIMD_INLINE VecF zero() { return {0.f}; }
  ETB_SIMD_INLINE void store(float* p) const { *p = v; }
  static ETB_SIMD_INLINE VecF load_partial(const float* p, int n) { return {n > 0 ? *p : 0.f}; }
  ETB_SIMD_INLINE void store_partial(float* p, int n) const {
    if (n > 0) *p = v;
  }
};
ETB_SIMD_INLINE VecF operator+(VecF a, VecF b) {
  return {a.v + b.v};
}
ETB_SIMD_INLINE VecF operator*(VecF a, VecF b) {
  return {a.v * b.v};
}
ETB_SIMD_INLINE VecF fma(VecF a, VecF b, VecF c) {
  return {a.v * b.v + c.v};
}
ETB_SIMD_INLINE float reduce_add(VecF x) {
  return x.v;
}
ETB_SIMD_INLINE VecF max_nan(VecF lo, VecF x) {
  return {x.v < lo.v ? lo.v : x.v};
}
ETB_SIMD_INLINE VecF min_nan(VecF hi, VecF x) {
  return {x.v > hi.v ? hi.v : x.v};
}
ETB_SIMD_INLINE void load_deinterleave(const float* p, VecF* even, VecF* odd) {
  even->v = p[0];
  odd->v = p[1];
}
ETB_SIMD_INLINE void transpose(VecF*) {}  // a 1 x 1 matrix
struct MaskF {
  bool m;
};
ETB_SIMD_INLINE MaskF takes_max(VecF x, VecF m) {
  return {x.v > m.v || x.v != x.v};
}
ETB_SIMD_INLINE VecF select(MaskF k, VecF a, VecF b) {
  return {k.m ? a.v : b.v};
}
#endif

/// Lanes p[0], p[2], ..., p[2 * (kWidth - 1)]; reads p[0 .. 2 * kWidth).
ETB_SIMD_INLINE VecF load_even(const float* p) {
  VecF even, odd;  // (the odd lanes' shuffle is dropped as unused)
  load_deinterleave(p, &even, &odd);
  return even;
}

/// lo <= x <= hi lane by lane; a NaN lane stays NaN.
ETB_SIMD_INLINE VecF clamp(VecF x, VecF lo, VecF hi) {
  return min_nan(hi, max_nan(lo, x));
}

}  // namespace simd
}  // namespace etb
