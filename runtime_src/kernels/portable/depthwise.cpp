// Depthwise convolution (see depthwise.h): one plane at a time over each tap's valid range.
#include "kernels/portable/depthwise.h"

namespace etb {
namespace native {

size_t depthwise_conv_f32_scratch_bytes(const ConvShape&) { return 0; }

void depthwise_conv_f32(const ConvShape& s, const float* in, const float* w, const float* bias,
                        OutputClamp clamp, float* out, void*) {
  const int64_t mult = s.OC / s.groups;  // output channels per input channel
  const int64_t P = s.OH * s.OW;
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t oc = 0; oc < s.OC; ++oc) {
      const int64_t ic = oc / mult;
      const float* x = in + (n * s.C + ic) * s.H * s.W;
      float* y = out + (n * s.OC + oc) * P;
      const float b = bias != nullptr ? bias[oc] : 0.f;
      for (int64_t p = 0; p < P; ++p) y[p] = b;
      depthwise_plane(s, x, w + oc * s.KH * s.KW, y);
      if (clamp.active())
        for (int64_t p = 0; p < P; ++p)
          y[p] = y[p] < clamp.lo ? clamp.lo : (y[p] > clamp.hi ? clamp.hi : y[p]);
    }
  }
}

}  // namespace native
}  // namespace etb
