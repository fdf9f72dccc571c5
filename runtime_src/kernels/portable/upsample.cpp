// Resampling of NCHW Float tensors: nearest-neighbour and bilinear upsampling (F.interpolate's
// "nearest" and "bilinear").
#include <cmath>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

// The input index that output index `o` of a dim reads, as torch computes it: the identity
// and exact doubling first, otherwise floor(o * scale) in float32 with scale = 1 / the
// user's scale factor when one was given, else in / out.
int64_t nearest_source(int64_t o, int64_t in, int64_t out, double scale_factor) {
  if (out == in) return o;
  if (out == 2 * in) return o >> 1;
  const float scale = scale_factor > 0 ? float(1.0 / scale_factor) : float(in) / float(out);
  const int64_t i = int64_t(std::floor(float(o) * scale));
  return i < in - 1 ? i : in - 1;
}

// Resizes out to the output plane OH x OW: the given sizes, else floor(in * scale factor) in
// double, as torch computes it; sh, sw are the scale factors (0 when sizes were given). A
// non-empty output needs a non-empty input plane.
Error resampled_output(const char* op, Optional<Span<const int64_t>> output_size,
                       Optional<Span<const double>> scale_factors, const Tensor& input, Tensor& out,
                       int64_t* OH, int64_t* OW, double* sh, double* sw) {
  if (input.dim() != 4)
    return fail(Error::InvalidArgument, "%s: input must be 4-d (N, C, H, W), got %d-d", op,
                input.dim());
  if (output_size.has_value == scale_factors.has_value)
    return fail(Error::InvalidArgument, "%s: give exactly one of output_size and scale_factors",
                op);
  const int64_t H = input.size(2), W = input.size(3);
  *sh = *sw = 0;
  if (output_size.has_value) {
    if (output_size.value.size() != 2)
      return fail(Error::InvalidArgument, "%s: output_size must have 2 items, got %zu", op,
                  output_size.value.size());
    *OH = output_size.value[0];
    *OW = output_size.value[1];
  } else {
    if (scale_factors.value.size() != 2)
      return fail(Error::InvalidArgument, "%s: scale_factors must have 2 items, got %zu", op,
                  scale_factors.value.size());
    *sh = scale_factors.value[0];
    *sw = scale_factors.value[1];
    if (!(*sh > 0) || !(*sw > 0) || !(double(H) * *sh < 1e15) || !(double(W) * *sw < 1e15))
      return fail(Error::InvalidArgument, "%s: scale factors must be positive and finite", op);
    *OH = int64_t(double(H) * *sh);
    *OW = int64_t(double(W) * *sw);
  }
  if (*OH <= 0 || *OW <= 0)
    return fail(Error::InvalidArgument, "%s: output size %lld x %lld must be positive", op,
                (long long)*OH, (long long)*OW);
  const int64_t osz[4] = {input.size(0), input.size(1), *OH, *OW};
  ETB_TRY(resize_to(out, osz, 4));
  if (out.numel() != 0 && (H == 0 || W == 0))
    return fail(Error::InvalidArgument, "%s: input plane %lld x %lld is empty", op, (long long)H,
                (long long)W);
  return Error::Ok;
}

}  // namespace

Error upsample_nearest2d_vec_out(KernelContext& ctx, const Tensor& input,
                                 Optional<Span<const int64_t>> output_size,
                                 Optional<Span<const double>> scale_factors, Tensor& out) {
  const char* op = "upsample_nearest2d";
  int64_t OH = 0, OW = 0;
  double sh = 0, sw = 0;
  ETB_TRY(resampled_output(op, output_size, scale_factors, input, out, &OH, &OW, &sh, &sw));
  if (out.numel() == 0) return Error::Ok;
  const int64_t H = input.size(2), W = input.size(3);
  // The source column of every output column, once.
  Result<void*> mem = ctx.allocate_temp(size_t(OW) * sizeof(int64_t));
  if (!mem.ok()) return mem.error();
  int64_t* src_w = static_cast<int64_t*>(mem.value());
  for (int64_t ow = 0; ow < OW; ++ow) src_w[ow] = nearest_source(ow, W, OW, sw);
  const float* x = input.data_as<float>();
  float* y = out.data_as<float>();
  const int64_t rows = input.size(0) * input.size(1) * OH;
  parallel_range(ctx, rows, OW, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t plane = r / OH, oh = r - plane * OH;
      const float* xr = x + (plane * H + nearest_source(oh, H, OH, sh)) * W;
      float* yr = y + r * OW;
      for (int64_t ow = 0; ow < OW; ++ow) yr[ow] = xr[src_w[ow]];
    }
  });
  return Error::Ok;
}

namespace {

// The two input taps of output index o of a dim and their weights, as torch computes them in
// float: the identity when the sizes match; else the source position (align_corners: o times
// (in - 1) / (out - 1); otherwise (o + 0.5) * scale - 0.5, at least 0, with scale = 1 / the
// user's scale factor when one was given, else in / out).
struct LinearTap {
  int64_t i0, i1;
  float l0, l1;
};

LinearTap linear_tap(int64_t o, int64_t in, int64_t out, bool align_corners, double scale_factor) {
  if (in == out) return {o, o, 1.f, 0.f};
  float src;
  if (align_corners) {
    const float scale = out > 1 ? float(in - 1) / float(out - 1) : 0.f;
    src = scale * float(o);
  } else {
    const float scale = scale_factor > 0 ? float(1.0 / scale_factor) : float(in) / float(out);
    src = scale * (float(o) + 0.5f) - 0.5f;
    src = src < 0.f ? 0.f : src;
  }
  int64_t i0 = int64_t(std::floor(src));
  i0 = i0 < in - 1 ? i0 : in - 1;
  float l1 = src - float(i0);
  l1 = l1 < 0.f ? 0.f : (l1 > 1.f ? 1.f : l1);
  return {i0, i0 + (i0 < in - 1 ? 1 : 0), 1.f - l1, l1};
}

}  // namespace

Error upsample_bilinear2d_vec_out(KernelContext& ctx, const Tensor& input,
                                  Optional<Span<const int64_t>> output_size, bool align_corners,
                                  Optional<Span<const double>> scale_factors, Tensor& out) {
  const char* op = "upsample_bilinear2d";
  int64_t OH = 0, OW = 0;
  double sh = 0, sw = 0;
  ETB_TRY(resampled_output(op, output_size, scale_factors, input, out, &OH, &OW, &sh, &sw));
  if (out.numel() == 0) return Error::Ok;
  const int64_t H = input.size(2), W = input.size(3);
  if (out.data() == input.data())
    return fail(Error::NotSupported, "%s: out may not alias input", op);
  // The taps of every output column, once.
  Result<void*> mem = ctx.allocate_temp(size_t(OW) * sizeof(LinearTap));
  if (!mem.ok()) return mem.error();
  LinearTap* tw = static_cast<LinearTap*>(mem.value());
  for (int64_t ow = 0; ow < OW; ++ow) tw[ow] = linear_tap(ow, W, OW, align_corners, sw);
  const float* x = input.data_as<float>();
  float* y = out.data_as<float>();
  const int64_t rows = input.size(0) * input.size(1) * OH;
  parallel_range(ctx, rows, OW * 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t plane = r / OH, oh = r - plane * OH;
      const LinearTap th = linear_tap(oh, H, OH, align_corners, sh);
      const float* x0 = x + (plane * H + th.i0) * W;
      const float* x1 = x + (plane * H + th.i1) * W;
      float* yr = y + r * OW;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const LinearTap& t = tw[ow];
        yr[ow] = th.l0 * (t.l0 * x0[t.i0] + t.l1 * x0[t.i1]) +
                 th.l1 * (t.l0 * x1[t.i0] + t.l1 * x1[t.i1]);
      }
    }
  });
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
