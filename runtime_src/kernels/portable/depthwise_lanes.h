// Depthwise convolution on channel lanes (NCHW, Float): a vector's lanes are channels, not
// pixels (see depthwise_lanes.cpp). depthwise.cpp takes this way where it is the faster one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel/kernel.h"
#include "kernels/portable/geometry.h"

namespace etb {
namespace native {

/// Whether shape `s` runs on channel lanes: strided convolutions and small planes, where the
/// per-channel costs of the planes (depthwise.cpp) dominate, when their scratch stays small.
/// Depends only on the plane, kernel, stride and dilation (not on N or C), and only on 4- and
/// 8-lane vector sets.
bool depthwise_lanes_suit(const ConvShape& s);

/// Channels computed together: a split of the channels over threads best keeps whole blocks.
int depthwise_lanes_width();

/// Bytes of (64-byte aligned) scratch that depthwise_lanes_f32 needs for `s` (not depending on
/// N or C).
size_t depthwise_lanes_f32_scratch_bytes(const ConvShape& s);

/// depthwise_conv_f32 (depthwise.h) on channel lanes, for a shape depthwise_lanes_suit takes:
/// the same arguments and the same results, bit for bit.
void depthwise_lanes_f32(const ConvShape& s, const float* in, const float* w, const float* bias,
                         OutputClamp clamp, float* out, void* scratch);

}  // namespace native
}  // namespace etb
