// Normalizations over groups of channels: group norm (nn.GroupNorm) on Float tensors.
#include <cmath>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {

Error native_group_norm_out(KernelContext& ctx, const Tensor& input, const Tensor* weight,
                            const Tensor* bias, int64_t N, int64_t C, int64_t HxW, int64_t group,
                            double eps, Tensor& out0, Tensor& out1, Tensor& out2) {
  const char* op = "group_norm";
  if (input.dim() < 2)
    return fail(Error::InvalidArgument, "%s: input must have at least 2 dims (N, C, ...), has %d",
                op, input.dim());
  if (input.size(0) != N || input.size(1) != C || N * C * HxW != input.numel())
    return fail(Error::InvalidArgument,
                "%s: N=%lld, C=%lld, HxW=%lld do not match the input's %lld elements", op,
                (long long)N, (long long)C, (long long)HxW, (long long)input.numel());
  if (group <= 0 || C % group != 0)
    return fail(Error::InvalidArgument, "%s: %lld channels do not split into %lld groups", op,
                (long long)C, (long long)group);
  if (weight != nullptr && (weight->dim() != 1 || weight->numel() != C))
    return fail(Error::InvalidArgument, "%s: weight must be 1-d with %lld elements", op,
                (long long)C);
  if (bias != nullptr && (bias->dim() != 1 || bias->numel() != C))
    return fail(Error::InvalidArgument, "%s: bias must be 1-d with %lld elements", op,
                (long long)C);
  ETB_TRY(out0.resize(input.sizes()));
  const int64_t stat[2] = {N, group};
  ETB_TRY(resize_to(out1, stat, 2));
  ETB_TRY(resize_to(out2, stat, 2));
  const int64_t cpg = C / group;  // channels per group
  const int64_t M = cpg * HxW;    // elements per group
  const float* x = input.data_as<float>();
  float* y = out0.data_as<float>();
  const float* w = weight ? weight->data_as<float>() : nullptr;
  const float* b = bias ? bias->data_as<float>() : nullptr;
  float* means = out1.data_as<float>();
  float* rstds = out2.data_as<float>();
  // Each (n, g) is a contiguous run of M elements: the threads split them.
  parallel_range(ctx, N * group, M, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * M;
      float* yr = y + r * M;
      float meanf, rstd;
      mean_and_rstd(xr, M, eps, &meanf, &rstd);
      const int64_t c0 = (r % group) * cpg;
      for (int64_t c = 0; c < cpg; ++c) {
        // y = x * scale + shift per channel, with the channel's weight and bias folded in.
        const float scale = rstd * (w ? w[c0 + c] : 1.f);
        const float shift = (b ? b[c0 + c] : 0.f) - meanf * scale;
        const float* xc = xr + c * HxW;
        float* yc = yr + c * HxW;
        for (int64_t i = 0; i < HxW; ++i) yc[i] = xc[i] * scale + shift;
      }
      means[r] = meanf;
      rstds[r] = rstd;
    }
  });
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
