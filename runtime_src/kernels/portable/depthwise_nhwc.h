// Depthwise convolution on channels-last (NHWC) Float tensors: a vector's lanes are channels
// (see depthwise_nhwc.cpp).
#pragma once

#include <cstdint>

#include "kernel/kernel.h"              // OutputClamp
#include "kernels/portable/geometry.h"  // ConvShape

namespace etb {
namespace native {

/// Depthwise convolution (groups == C == OC: one input channel per output channel) on
/// channels-last tensors: in [N][H][W][C], w [KH][KW][C] (the weight [C, 1, KH, KW] in dim
/// order (2, 3, 1, 0)), bias [C] or nullptr, out [N][OH][OW][C]. Computes output rows
/// [oh0, oh1) of batch item n, every channel, then applies clamp. Any stride, padding,
/// dilation and kernel size that ConvShape allows (s.sh, s.sw, s.ph, s.pw, s.dh, s.dw >= 1/0).
void depthwise_nhwc_f32(const ConvShape& s, const float* in, const float* w, const float* bias,
                        OutputClamp clamp, float* out, int64_t n, int64_t oh0, int64_t oh1);

}  // namespace native
}  // namespace etb
