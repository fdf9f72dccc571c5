// Depthwise convolution on Float tensors (NCHW, one input channel per group).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel/kernel.h"
#include "kernels/portable/geometry.h"

namespace etb {
namespace native {

/// Bytes of (64-byte aligned) scratch that depthwise_conv_f32 needs for shape `s`: the padded
/// planes of one input channel (at most 2 MiB; 0 for larger planes, which take a plain loop),
/// or on channel lanes those of one block of channels (at most 160 KiB).
/// It does not depend on the batch or channel counts, so work split over channel ranges (a
/// ConvShape with fewer channels and the matching pointers) needs this much per thread.
size_t depthwise_conv_f32_scratch_bytes(const ConvShape& s);

/// Channels that depthwise_conv_f32 computes together for shape `s` (1 when it takes them one
/// at a time): a split of the channels over threads best cuts at multiples of it.
int64_t depthwise_conv_f32_channel_block(const ConvShape& s);

/// out = clamp(bias + depthwise_conv(in, w)) for s.groups == s.C input channels and s.OC a
/// multiple of s.C (each input channel feeds s.OC / s.C output channels); bias may be null.
/// Every output element is written; a NaN stays NaN through the clamp. `scratch` holds
/// depthwise_conv_f32_scratch_bytes(s), is 64-byte aligned and was zeroed before the first
/// call for a shape of this geometry (any batch and channel counts): each call leaves its
/// padding zero, so work split over channel ranges zeroes a thread's scratch once. Any
/// stride, padding and dilation; 3x3 and 5x5 with stride 1 or 2 take the fastest path on
/// planes, and strided convolutions and small planes run on channel lanes (depthwise_lanes.h).
void depthwise_conv_f32(const ConvShape& s, const float* in, const float* w, const float* bias,
                        OutputClamp clamp, float* out, void* scratch);

/// depthwise_conv_f32 with input channel c of image n at in + (n * s.C + c) * in_stride (an
/// s.H x s.W plane) and output channel oc at out + (n * s.OC + oc) * out_stride: a band of
/// rows of bigger planes.
void depthwise_conv_f32_strided(const ConvShape& s, const float* in, int64_t in_stride,
                                const float* w, const float* bias, OutputClamp clamp, float* out,
                                int64_t out_stride, void* scratch);

}  // namespace native
}  // namespace etb
