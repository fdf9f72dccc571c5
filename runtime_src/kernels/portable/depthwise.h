// Depthwise convolution on Float tensors (NCHW, one input channel per group).
#pragma once

#include <cstddef>

#include "kernel/kernel.h"
#include "kernels/portable/geometry.h"

namespace etb {
namespace native {

/// Bytes of (64-byte aligned) scratch that depthwise_conv_f32 needs for shape `s`.
size_t depthwise_conv_f32_scratch_bytes(const ConvShape& s);

/// out = clamp(bias + depthwise_conv(in, w)) for s.groups == s.C input channels and s.OC a
/// multiple of s.C (each input channel feeds s.OC / s.C output channels); bias may be null.
/// Every output element is written. `scratch` holds depthwise_conv_f32_scratch_bytes(s).
void depthwise_conv_f32(const ConvShape& s, const float* in, const float* w, const float* bias,
                        OutputClamp clamp, float* out, void* scratch);

}  // namespace native
}  // namespace etb
