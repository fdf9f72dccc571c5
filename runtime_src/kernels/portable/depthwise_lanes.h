// Depthwise convolution on channel lanes (NCHW, Float): a vector's lanes are channels, not
// pixels (see depthwise_lanes.cpp). depthwise.cpp takes this way where it is the faster one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernel/kernel.h"
#include "kernels/portable/geometry.h"

namespace etb {
namespace native {

/// How a channel-lanes kernel (fp32 here, int8 in quantized/depthwise_lanes.cpp) walks its
/// output pixels: a row at a time, in segments of NP <= 8 pixels summed together (as even as
/// they come: 7 and 7 for 14), the last segment ending at the row's end (overlapping the one
/// before). Calls f(std::integral_constant<int, NP>(), oh, ow) for each segment's first pixel.
template <int NP, class F>
void for_each_lane_segment(const ConvShape& s, F& f) {
  for (int64_t oh = 0; oh < s.OH; ++oh)
    for (int64_t ow = 0;; ow += NP) {
      if (ow > s.OW - NP) ow = s.OW - NP;
      f(std::integral_constant<int, NP>(), oh, ow);
      if (ow == s.OW - NP) break;
    }
}
template <class F>
void for_each_lane_segment(const ConvShape& s, F& f) {
  switch (ceil_div(s.OW, ceil_div(s.OW, int64_t(8)))) {
    case 1: return for_each_lane_segment<1>(s, f);
    case 2: return for_each_lane_segment<2>(s, f);
    case 3: return for_each_lane_segment<3>(s, f);
    case 4: return for_each_lane_segment<4>(s, f);
    case 5: return for_each_lane_segment<5>(s, f);
    case 6: return for_each_lane_segment<6>(s, f);
    case 7: return for_each_lane_segment<7>(s, f);
    default: return for_each_lane_segment<8>(s, f);
  }
}

/// Whether shape `s` runs on channel lanes: strided convolutions and small planes, where the
/// per-channel costs of the planes (depthwise.cpp) dominate, when their scratch stays small.
/// Depends only on the plane, kernel, stride and dilation (not on N or C); never on the scalar
/// set.
bool depthwise_lanes_suit(const ConvShape& s);

/// Channels computed together: a split of the channels over threads best keeps whole blocks.
int depthwise_lanes_width();

/// Bytes of (64-byte aligned) scratch that depthwise_lanes_f32 needs for `s` (not depending on
/// N or C).
size_t depthwise_lanes_f32_scratch_bytes(const ConvShape& s);

/// depthwise_conv_f32_strided (depthwise.h) on channel lanes, for a shape depthwise_lanes_suit
/// takes: the same arguments and the same results, bit for bit.
void depthwise_lanes_f32(const ConvShape& s, const float* in, int64_t in_stride, const float* w,
                         const float* bias, OutputClamp clamp, float* out, int64_t out_stride,
                         void* scratch);

}  // namespace native
}  // namespace etb
