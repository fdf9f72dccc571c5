// Requantization shared by the int8 kernels, written to match the reference semantics of
// pipeline/quant/ops.py bit for bit: float32 arithmetic in the reference's order (these
// sources are compiled with -ffp-contract=off so no multiply-add is fused), rounding half to
// even with nearbyintf in the default rounding mode, the same clamps.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/intrinsics.h"

namespace etb {
namespace quantized {

/// Output quantization: q = clamp(round(y * inv) + zp, lo, hi).
struct OutQuant {
  float inv = 1.f;  ///< float32(1 / scale), the division done in double as torchao does
  float zp = 0.f;
  float lo = -128.f;
  float hi = 127.f;
};

/// round(y * inv) + zp clamped to [lo, hi] (NaN goes to lo) as int8.
inline int8_t quantize_one(float y, const OutQuant& q) {
  float r = std::nearbyint(y * q.inv) + q.zp;
  r = r > q.lo ? r : q.lo;
  r = r < q.hi ? r : q.hi;
  return int8_t(int32_t(r));
}

#if defined(__AVX2__)
// The vector forms clamp before they round, in the units of y * inv: to [lo - zp, hi - zp],
// integers that float32 holds exactly (make_out_quant keeps |zp| <= 2^23), then round to
// nearest even while converting, and add zp as an integer. That is quantize_one's value:
// rounding is monotonic and leaves integers as they are, so clamping the rounded value to
// integer bounds and rounding the clamped value agree, and adding an integer zp commutes
// with both. A NaN goes to the lower bound as before (max returns its second operand for a
// NaN). One operation fewer than rounding, adding zp and clamping in float32, and a shorter
// chain: a GEMM tile's requantization (requantize_row) took 0.052 ns an output, not 0.062.

/// OutQuant broadcast to 8 lanes.
struct OutQuant8 {
  __m256 inv, lo, hi;  // lo and hi less zp
  __m256i zp;
  explicit OutQuant8(const OutQuant& q)
      : inv(_mm256_set1_ps(q.inv)),
        lo(_mm256_set1_ps(q.lo - q.zp)),
        hi(_mm256_set1_ps(q.hi - q.zp)),
        zp(_mm256_set1_epi32(int32_t(q.zp))) {}
};

/// quantize_one on 8 lanes, as int32 lanes within [-128, 127]. (cvtps rounds as the MXCSR
/// says, as nearbyint does: to nearest even unless the app changed it.)
inline __m256i quantize8(__m256 y, const OutQuant8& v) {
  __m256 r = _mm256_mul_ps(y, v.inv);
  r = _mm256_max_ps(r, v.lo);
  r = _mm256_min_ps(r, v.hi);
  return _mm256_add_epi32(_mm256_cvtps_epi32(r), v.zp);
}

/// Stores 8 int32 lanes that lie within [-128, 127] as 8 int8.
inline void store_int8x8(__m256i lanes, int8_t* out) {
  const __m128i w =
      _mm_packs_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packs_epi16(w, w));
}
#endif

#if defined(__AVX512F__)
/// OutQuant broadcast to 16 lanes.
struct OutQuant16 {
  __m512 inv, lo, hi;  // lo and hi less zp
  __m512i zp;
  explicit OutQuant16(const OutQuant& q)
      : inv(_mm512_set1_ps(q.inv)),
        lo(_mm512_set1_ps(q.lo - q.zp)),
        hi(_mm512_set1_ps(q.hi - q.zp)),
        zp(_mm512_set1_epi32(int32_t(q.zp))) {}
};

/// quantize8 on 16 lanes (rounding to nearest even whatever the MXCSR says, as before).
inline __m512i quantize16(__m512 y, const OutQuant16& v) {
  __m512 r = _mm512_mul_ps(y, v.inv);
  r = _mm512_max_ps(r, v.lo);
  r = _mm512_min_ps(r, v.hi);
  return _mm512_add_epi32(
      _mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), v.zp);
}
#endif

/// out[j] = quantize_one(float(acc[j] - corr) * mu + b, q) for j < n: a row of a GEMM tile
/// requantized per output channel.
inline void requantize_row(const int32_t* __restrict acc, int64_t n, int32_t corr, float mu,
                           float b, const OutQuant& q, int8_t* __restrict out) {
  int64_t j = 0;
#if defined(__AVX512F__)
  const OutQuant16 v16(q);
  const __m512i c16 = _mm512_set1_epi32(corr);
  const __m512 mu16 = _mm512_set1_ps(mu), b16 = _mm512_set1_ps(b);
  for (; j + 16 <= n; j += 16) {
    const __m512i a = _mm512_loadu_si512(acc + j);
    const __m512 y =
        _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a, c16)), mu16), b16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), _mm512_cvtepi32_epi8(quantize16(y, v16)));
  }
#endif
#if defined(__AVX2__)
  const OutQuant8 v(q);
  const __m256i c = _mm256_set1_epi32(corr);
  const __m256 muv = _mm256_set1_ps(mu), bv = _mm256_set1_ps(b);
  for (; j + 8 <= n; j += 8) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + j));
    const __m256 y =
        _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(a, c)), muv), bv);
    store_int8x8(quantize8(y, v), out + j);
  }
#endif
  for (; j < n; ++j) out[j] = quantize_one(float(acc[j] - corr) * mu + b, q);
}

/// Checks an output scale and clamp bounds and builds the OutQuant; `op` names the kernel.
inline Error make_out_quant(double scale, int64_t zp, int64_t lo, int64_t hi, const char* op,
                            OutQuant* q) {
  if (!(scale > 0) || !std::isfinite(scale))
    return fail(Error::InvalidArgument, "%s: output scale must be positive and finite, got %g", op,
                scale);
  if (zp < -(int64_t(1) << 23) || zp > (int64_t(1) << 23))  // lo - zp and hi - zp exact
    return fail(Error::InvalidArgument, "%s: output zero point %lld is out of range", op,
                (long long)zp);
  if (lo < -128 || hi > 127 || lo > hi)
    return fail(Error::InvalidArgument,
                "%s: output clamp [%lld, %lld] must lie within [-128, 127] and be ordered", op,
                (long long)lo, (long long)hi);
  q->inv = float(1.0 / scale);
  q->zp = float(zp);
  q->lo = float(lo);
  q->hi = float(hi);
  return Error::Ok;
}

/// Checks an int8 activation's zero point (the kernels subtract it in int16/int32).
inline Error check_input_zp(int64_t zp, const char* op, const char* arg) {
  if (zp < -128 || zp > 127)
    return fail(Error::InvalidArgument, "%s: %s zero point %lld is outside [-128, 127]", op, arg,
                (long long)zp);
  return Error::Ok;
}

/// Checks a quantization scale of an input.
inline Error check_scale(double scale, const char* op, const char* arg) {
  if (!(scale > 0) || !std::isfinite(scale))
    return fail(Error::InvalidArgument, "%s: %s must be positive and finite, got %g", op, arg,
                scale);
  return Error::Ok;
}

/// Checks the per-channel weight scales (`channels` Float values) and the optional bias.
inline Error check_channel_params(const Tensor& scales, const Tensor* bias, int64_t channels,
                                  const char* op) {
  if (scales.dtype() != ScalarType::Float || scales.numel() != channels || scales.dim() != 1)
    return fail(Error::InvalidArgument,
                "%s: weight_scales must be a 1-d Float tensor of %lld elements", op,
                (long long)channels);
  if (bias != nullptr &&
      (bias->dtype() != ScalarType::Float || bias->numel() != channels || bias->dim() != 1))
    return fail(Error::InvalidArgument, "%s: bias must be a 1-d Float tensor of %lld elements", op,
                (long long)channels);
  return Error::Ok;
}

/// A convolution's per-output-channel requantization of GEMM tiles (qgemm's QTileFn
/// conv_tile): output channel m's sums, less xzp * wsum[m], go to int8 row out + m * ldo.
struct ConvEpilogue {
  const int32_t* wsum;
  const float* mult;
  const float* bias;
  int32_t xzp;
  OutQuant q;
  int8_t* out;
  int64_t ldo;
};

inline void conv_tile(void* ctx, int64_t m0, int64_t n0, int64_t mr, int64_t nr, const int32_t* acc,
                      int64_t ld) {
  // A copy of the epilogue: the int8 stores may alias anything the context points to, so with
  // the context itself the compiler reloads and rebroadcasts its fields for every row.
  const ConvEpilogue e = *static_cast<const ConvEpilogue*>(ctx);
  for (int64_t i = 0; i < mr; ++i) {
    const int64_t m = m0 + i;
    requantize_row(acc + i * ld, nr, e.xzp * e.wsum[m], e.mult[m], e.bias[m], e.q,
                   e.out + m * e.ldo + n0);
  }
}

}  // namespace quantized
}  // namespace etb
