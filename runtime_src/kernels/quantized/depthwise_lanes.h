// int8 depthwise convolution on channel lanes (NCHW): a vector's lanes are 8 (AVX2) or 16
// (AVX-512) channels of one pixel, not pixels of one channel (see depthwise_lanes.cpp).
// conv.cpp takes this way where it is the faster one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel/kernel.h"
#include "kernels/portable/geometry.h"
#include "kernels/quantized/requant.h"

namespace etb {
namespace quantized {

/// Whether depthwise shape `s` runs on channel lanes: any kernel, stride, dilation and padding
/// whose scratch stays small; among the shapes depthwise_direct takes, only small planes,
/// where the planes' per-channel costs dominate. Depends on the plane, kernel, stride and
/// dilation only (not on N or C). AVX2 and AVX-512 (with AVX512BW) only.
bool depthwise_lanes_suit(const ConvShape& s);

/// Bytes of scratch memory depthwise_lanes needs for shape `s` on `threads`.
size_t depthwise_lanes_temp_bytes(const ConvShape& s, int threads);

/// depthwise_direct (depthwise.h) on channel lanes, for a shape depthwise_lanes_suit takes:
/// the same arguments and the same results, bit for bit. The threads of ctx split the blocks
/// of 8 or 16 output channels.
void depthwise_lanes(const KernelContext& ctx, const ConvShape& s, const int8_t* x, int32_t xzp,
                     const int8_t* w, const float* mult, const float* bias, const OutQuant& q,
                     int8_t* y, void* temp);

}  // namespace quantized
}  // namespace etb
