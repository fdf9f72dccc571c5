// Requantization shared by the int8 kernels, written to match the reference semantics of
// pipeline/quant/ops.py bit for bit: float32 arithmetic in the reference's order (these
// sources are compiled with -ffp-contract=off so no multiply-add is fused), rounding half to
// even with nearbyintf in the default rounding mode, the same clamps.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

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

/// Checks an output scale and clamp bounds and builds the OutQuant; `op` names the kernel.
inline Error make_out_quant(double scale, int64_t zp, int64_t lo, int64_t hi, const char* op,
                            OutQuant* q) {
  if (!(scale > 0) || !std::isfinite(scale))
    return fail(Error::InvalidArgument, "%s: output scale must be positive and finite, got %g", op,
                scale);
  if (zp < -(int64_t(1) << 24) || zp > (int64_t(1) << 24))
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

}  // namespace quantized
}  // namespace etb
