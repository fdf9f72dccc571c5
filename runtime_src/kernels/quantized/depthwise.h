// Direct int8 depthwise convolution for the common shapes (square 3x3 or 5x5 kernel, the same
// stride of 1 or 2 on both axes, no dilation, padding smaller than the kernel): exact int32
// sums of int16 products, then the per-channel float32 requantization of requant.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel/kernel.h"
#include "kernels/portable/geometry.h"
#include "kernels/quantized/requant.h"

namespace etb {
namespace quantized {

/// Whether depthwise_direct handles depthwise shape `s` (one input channel per group, any
/// number of output channels per group).
bool depthwise_direct_supported(const ConvShape& s);

/// Bytes of scratch memory depthwise_direct needs for a supported shape `s` on `threads`.
size_t depthwise_direct_temp_bytes(const ConvShape& s, int threads);

/// y[n][oc] = requantized sum over taps of (x[n][oc / (OC / C)] - xzp) * w[oc] (NCHW int8, OIHW
/// weight with I = 1), mult[oc] = float32(x_scale) * w_scale[oc], bias[oc] (0 when none).
/// `temp` holds depthwise_direct_temp_bytes(s, ctx.num_threads()) bytes, 64-byte aligned. The
/// threads of ctx split the input channels.
void depthwise_direct(const KernelContext& ctx, const ConvShape& s, const int8_t* x, int32_t xzp,
                      const int8_t* w, const float* mult, const float* bias, const OutQuant& q,
                      int8_t* y, void* temp);

/// depthwise_direct on the calling thread for one image whose input channel c starts at
/// x + c * x_stride (rows of s.W) and whose output channel oc goes to y + oc * y_stride
/// (rows of s.OW): a band of rows of a bigger tensor. `temp` holds
/// depthwise_direct_temp_bytes(s, 1) bytes, 64-byte aligned; any contents.
void depthwise_direct_serial(const ConvShape& s, const int8_t* x, int64_t x_stride, int32_t xzp,
                             const int8_t* w, const float* mult, const float* bias,
                             const OutQuant& q, int8_t* y, int64_t y_stride, void* temp);

}  // namespace quantized
}  // namespace etb
