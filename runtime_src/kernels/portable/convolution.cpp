// 1-d and 2-d convolution (NCHW, grouped and depthwise) on Float tensors.
//
// Three paths: pointwise (1x1, stride 1, no padding) is one GEMM per group, reading the
// weights and the activations in place; depthwise (one input channel per group) has its own
// kernel (depthwise.h); everything else packs column tiles (im2col) into temp memory and runs
// the GEMM on them. Bias and a fused activation clamp are applied in the GEMM's epilogue.
#include "kernels/portable/depthwise.h"
#include "kernels/portable/gemm.h"
#include "kernels/portable/geometry.h"
#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {

Error convolution_out(KernelContext& ctx, const Tensor& input, const Tensor& weight,
                      const Tensor* bias, Span<const int64_t> stride, Span<const int64_t> padding,
                      Span<const int64_t> dilation, bool transposed,
                      Span<const int64_t> output_padding, int64_t groups, Tensor& out) {
  (void)output_padding;
  if (transposed) return fail(Error::NotSupported, "convolution: transposed is not supported");
  const int nd = input.dim() - 2;
  if (nd != 1 && nd != 2)
    return fail(Error::NotSupported, "convolution: input must be 3-d or 4-d, got %d-d",
                input.dim());
  if (weight.dim() != input.dim())
    return fail(Error::InvalidArgument, "convolution: weight has %d dims, input %d", weight.dim(),
                input.dim());
  ConvShape s;
  s.N = input.size(0);
  s.C = input.size(1);
  s.H = nd == 2 ? input.size(2) : 1;
  s.W = input.size(nd + 1);
  s.OC = weight.size(0);
  s.KH = nd == 2 ? weight.size(2) : 1;
  s.KW = weight.size(nd + 1);
  s.groups = groups;
  bool ok = true;
  if (nd == 2) {
    ok = ok && pair_item(stride, 0, 1, &s.sh) && pair_item(stride, 1, 1, &s.sw);
    ok = ok && pair_item(padding, 0, 0, &s.ph) && pair_item(padding, 1, 0, &s.pw);
    ok = ok && pair_item(dilation, 0, 1, &s.dh) && pair_item(dilation, 1, 1, &s.dw);
  } else {
    s.sh = 1;
    s.ph = 0;
    s.dh = 1;
    ok = ok && pair_item(stride, 0, 1, &s.sw) && pair_item(padding, 0, 0, &s.pw) &&
         pair_item(dilation, 0, 1, &s.dw);
  }
  if (!ok || stride.size() > size_t(nd) || padding.size() > size_t(nd) ||
      dilation.size() > size_t(nd))
    return fail(Error::InvalidArgument, "convolution: stride/padding/dilation lists are too long");
  constexpr int64_t kLimit = int64_t(1) << 30;
  if (s.sh > kLimit || s.sw > kLimit || s.dh > kLimit || s.dw > kLimit || s.ph > kLimit ||
      s.pw > kLimit)
    return fail(Error::InvalidArgument, "convolution: stride/padding/dilation too large");
  if (s.sh < 1 || s.sw < 1 || s.dh < 1 || s.dw < 1 || s.ph < 0 || s.pw < 0)
    return fail(Error::InvalidArgument,
                "convolution: stride and dilation must be >= 1, "
                "padding >= 0");
  if (groups < 1 || s.C % groups != 0 || s.OC % groups != 0)
    return fail(Error::InvalidArgument,
                "convolution: groups=%lld must divide %lld input and "
                "%lld output channels",
                (long long)groups, (long long)s.C, (long long)s.OC);
  const int64_t cin_g = s.C / groups;
  if (weight.size(1) != cin_g)
    return fail(Error::InvalidArgument,
                "convolution: weight expects %lld input channels per group, input has %lld",
                (long long)weight.size(1), (long long)cin_g);
  const int64_t eh = s.dh * (s.KH - 1) + 1, ew = s.dw * (s.KW - 1) + 1;
  if (s.H + 2 * s.ph < eh || s.W + 2 * s.pw < ew || s.KH < 1 || s.KW < 1)
    return fail(Error::InvalidArgument, "convolution: kernel is larger than the padded input");
  s.OH = (s.H + 2 * s.ph - eh) / s.sh + 1;
  s.OW = (s.W + 2 * s.pw - ew) / s.sw + 1;
  if (bias != nullptr && (bias->dim() != 1 || bias->size(0) != s.OC))
    return fail(Error::InvalidArgument, "convolution: bias must have %lld elements",
                (long long)s.OC);
  int64_t osz[4] = {s.N, s.OC, s.OH, s.OW};
  if (nd == 1) osz[2] = s.OW;
  ETB_TRY(resize_to(out, osz, nd + 2));

  const float* x = input.data_as<float>();
  const float* w = weight.data_as<float>();
  float* y = out.data_as<float>();
  const int64_t P = s.OH * s.OW;
  if (out.numel() == 0) return Error::Ok;
  if (cin_g == 1 && groups > 1) {
    // The threads split runs of input channels (of one batch item each), each run with its own
    // scratch; a channel is computed the same way in any run.
    const int threads = ctx.num_threads();
    const size_t per_thread = (depthwise_conv_f32_scratch_bytes(s) + 63) / 64 * 64;
    Result<void*> scratch = ctx.allocate_temp(per_thread * size_t(threads), 64);
    if (!scratch.ok()) return scratch.error();
    const int64_t run = threads == 1 ? s.C : (s.C + 4 * threads - 1) / (4 * threads);
    const int64_t runs = (s.C + run - 1) / run, mult = s.OC / s.C;
    const float* bd = bias != nullptr ? bias->data_as<float>() : nullptr;
    auto channels = [&](int64_t task, int thread) {
      const int64_t n = task / runs, c0 = (task % runs) * run;
      ConvShape part = s;
      part.N = 1;
      part.C = part.groups = run < s.C - c0 ? run : s.C - c0;
      part.OC = part.C * mult;
      depthwise_conv_f32(part, x + (n * s.C + c0) * s.H * s.W, w + c0 * mult * s.KH * s.KW,
                         bd != nullptr ? bd + c0 * mult : nullptr, ctx.output_clamp(),
                         y + (n * s.OC + c0 * mult) * P,
                         static_cast<char*>(scratch.value()) + size_t(thread) * per_thread);
    };
    ctx.parallel_for(s.N * runs, channels);
    return Error::Ok;
  }
  const int64_t oc_g = s.OC / groups;
  const bool pointwise = s.KH == 1 && s.KW == 1 && s.sh == 1 && s.sw == 1 && s.ph == 0 && s.pw == 0;
  const int64_t K = cin_g * s.KH * s.KW;
  // Each group is out[oc_g x P] = weight[oc_g x K] * columns[K x P], bias per row.
  GemmEpilogue ep;
  ep.init = bias != nullptr ? GemmInit::RowBias : GemmInit::Zero;
  ep.clamp = ctx.output_clamp();
  const float* b = bias != nullptr ? bias->data_as<float>() : nullptr;
  if (pointwise) {
    Result<void*> ws = ctx.allocate_temp(sgemm_workspace_bytes(K), 64);
    if (!ws.ok()) return ws.error();
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        ep.bias = b != nullptr ? b + g * oc_g : nullptr;
        sgemm(ctx, oc_g, P, K, w + g * oc_g * K, K, x + (n * s.C + g * cin_g) * s.H * s.W, P,
              y + (n * s.OC + g * oc_g) * P, P, ep, static_cast<float*>(ws.value()));
      }
    return Error::Ok;
  }
  // im2col in column tiles of at most 256 KB, and 2 MB over all the threads' tiles.
  const int threads = ctx.num_threads();
  const int64_t tile_bytes = threads <= 8 ? int64_t(256) << 10 : (int64_t(2) << 20) / threads;
  int64_t pc = tile_bytes / int64_t(sizeof(float)) / K;
  pc = pc < 32 ? 32 : (pc / 32) * 32;
  // With threads, at least four tiles a thread where the plane has columns for them.
  const int64_t share = (P / (4 * threads) + 31) / 32 * 32;
  if (threads > 1 && share >= 32 && share < pc) pc = share;
  if (pc > P) pc = P;
  const int64_t tiles = (P + pc - 1) / pc;
  if (threads == 1 || tiles >= 2 * threads) {
    // Many tiles: each task packs one column tile into its thread's buffer and multiplies it
    // there, so the whole convolution is one parallel loop (a tile's columns are computed the
    // same way on any thread).
    const size_t col_bytes = (size_t(K * pc) * sizeof(float) + 63) / 64 * 64;
    const size_t ws_bytes = (sgemm_workspace_bytes(K) + 63) / 64 * 64;
    Result<void*> tmp = ctx.allocate_temp((col_bytes + ws_bytes) * size_t(threads), 64);
    if (!tmp.ok()) return tmp.error();
    const KernelContext serial = ctx.within_task();
    auto tile = [&](int64_t t, int thread) {
      const int64_t p0 = (t % tiles) * pc, g = (t / tiles) % groups, n = t / (tiles * groups);
      const int64_t cols = P - p0 < pc ? P - p0 : pc;
      char* mine = static_cast<char*>(tmp.value()) + size_t(thread) * (col_bytes + ws_bytes);
      float* col = reinterpret_cast<float*>(mine);
      const float* xg = x + (n * s.C + g * cin_g) * s.H * s.W;
      for (int64_t c = 0; c < cin_g; ++c) im2col_channel(s, xg, c, p0, cols, 0.f, col);
      GemmEpilogue tep = ep;
      tep.bias = b != nullptr ? b + g * oc_g : nullptr;
      sgemm(serial, oc_g, cols, K, w + g * oc_g * K, K, col, cols,
            y + (n * s.OC + g * oc_g) * P + p0, P, tep, reinterpret_cast<float*>(mine + col_bytes));
    };
    ctx.parallel_for(s.N * groups * tiles, tile);
    return Error::Ok;
  }
  // Few tiles (a small output plane): the threads split each tile's packing by channels and
  // its product by rows.
  Result<void*> tmp = ctx.allocate_temp(size_t(K * pc) * sizeof(float));
  if (!tmp.ok()) return tmp.error();
  float* col = static_cast<float*>(tmp.value());
  Result<void*> ws_mem = ctx.allocate_temp(sgemm_workspace_bytes(K), 64);
  if (!ws_mem.ok()) return ws_mem.error();
  float* ws = static_cast<float*>(ws_mem.value());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + (n * s.C + g * cin_g) * s.H * s.W;
      float* yg = y + (n * s.OC + g * oc_g) * P;
      ep.bias = b != nullptr ? b + g * oc_g : nullptr;
      for (int64_t p0 = 0; p0 < P; p0 += pc) {
        const int64_t cols = P - p0 < pc ? P - p0 : pc;
        auto pack = [&](int64_t c, int) { im2col_channel(s, xg, c, p0, cols, 0.f, col); };
        ctx.parallel_for(cin_g, pack);
        sgemm(ctx, oc_g, cols, K, w + g * oc_g * K, K, col, cols, yg + p0, P, ep, ws);
      }
    }
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
