// etb_quantized::conv2d.out: int8 NCHW convolution (grouped and depthwise) with exact integer
// accumulation and per-output-channel requantization (pipeline/quant/ops.py `conv2d`).
//
// The input zero point is not subtracted per element: sum_k (x - zp) * w is computed as
// sum_k x * w - zp * sum_k w with the weight row sums (im2col pads with zp, whose term then
// cancels). The GEMM paths take the row sums and the widened weights from the prepare hook's
// block when the method was prepared (once, at load), else compute them per call. Five paths:
//   - pointwise (1x1, stride 1, no padding): one int8 GEMM per image and group;
//   - depthwise (one input channel per group) with a square 3x3 or 5x5 kernel, stride 1 or 2
//     and no dilation: depthwise.cpp, direct int16 x int16 -> int32 sums (SIMD with AVX2);
//   - other depthwise (at most 514 taps): direct loops in float32, which are exact here
//     because every partial sum is an integer below 2^24;
//   - hosted, stride at most 4, and enough channels to fill the GEMM's steps: the taps path,
//     an implicit GEMM over a copy of the input in the GEMM's own layout (no im2col);
//   - everything else: im2col column tiles (int8) and the GEMM.
#include <cstring>

#include "kernels/portable/geometry.h"
#include "kernels/quantized/depthwise.h"
#include "kernels/quantized/depthwise_lanes.h"
#include "kernels/quantized/qgemm.h"
#include "kernels/quantized/requant.h"
#include "native_functions.h"

namespace etb {
namespace quantized {
namespace {

// im2col column tiles (temp memory): hosted, big enough that the threads share few, long
// loops; bare metal, small (a microcontroller's RAM).
#if defined(ETB_BARE_METAL)
constexpr int64_t kColTileBytes = 64 * 1024;
#else
constexpr int64_t kColTileBytes = 512 * 1024;
#endif

// An output plane's P columns cut into im2col tiles, in steps of 16 columns (whole panels of
// the AVX2 GEMM tile; two panels of the AVX-512 one). Tile i holds the steps
// [steps * i / count, steps * (i + 1) / count): widths differ by at most one step, so threads
// that take equally many tiles get equally many columns (49 steps in 8 tiles: 6 or 7 steps
// each, where tiles of a fixed 7 steps made 7 tiles, 4 of them on one of 2 threads).
struct ColumnTiles {
  static constexpr int64_t kStep = 16;
  int64_t P, steps, count;

  // At most `max_cols` columns a tile. With threads: kTasksPerThread tiles a thread, of at least
  // two steps, where the plane has the steps for them, and a multiple of the thread count
  // where it has the steps for that.
  ColumnTiles(int64_t P_, int64_t max_cols, int threads) : P(P_), steps((P_ + kStep - 1) / kStep) {
    const int64_t per = max_cols / kStep > 1 ? max_cols / kStep : 1;
    count = (steps + per - 1) / per;
    if (threads > 1) {
      const int64_t most = kTasksPerThread * int64_t(threads);
      const int64_t want = most < steps / 2 ? most : steps / 2;
      if (count < want) count = want;
      const int64_t even = (count + threads - 1) / threads * threads;
      if (even <= steps) count = even;
    }
    if (count < 1) count = 1;
  }
  int64_t begin(int64_t i) const { return steps * i / count * kStep; }
  int64_t end(int64_t i) const {
    const int64_t e = steps * (i + 1) / count * kStep;
    return e < P ? e : P;
  }
  // Columns of the widest tile (the size of a tile's buffer).
  int64_t widest() const {
    const int64_t w = (steps + count - 1) / count * kStep;
    return w < P ? w : P;
  }
};

Error conv_depthwise(KernelContext& ctx, const ConvShape& s, const int8_t* x, int32_t xzp,
                     const int8_t* w, const float* mult, const float* bias, const OutQuant& q,
                     int8_t* y) {
  if (depthwise_lanes_suit(s)) {
    Result<void*> tmp = ctx.allocate_temp(depthwise_lanes_temp_bytes(s, ctx.num_threads()));
    if (!tmp.ok()) return tmp.error();
    depthwise_lanes(ctx, s, x, xzp, w, mult, bias, q, y, tmp.value());
    return Error::Ok;
  }
  if (depthwise_direct_supported(s)) {
    Result<void*> tmp = ctx.allocate_temp(depthwise_direct_temp_bytes(s, ctx.num_threads()));
    if (!tmp.ok()) return tmp.error();
    depthwise_direct(ctx, s, x, xzp, w, mult, bias, q, y, tmp.value());
    return Error::Ok;
  }
  const int64_t HW = s.H * s.W, P = s.OH * s.OW;
  Result<void*> mem = ctx.allocate_temp(size_t(HW + P) * sizeof(float));
  if (!mem.ok()) return mem.error();
  float* xf = static_cast<float*>(mem.value());
  float* acc = xf + HW;
  const int64_t mult_ch = s.OC / s.groups;  // output channels per input channel
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t oc = 0; oc < s.OC; ++oc) {
      if (oc % mult_ch == 0) {
        const int8_t* __restrict xc = x + (n * s.C + oc / mult_ch) * HW;
        for (int64_t i = 0; i < HW; ++i) xf[i] = float(int32_t(xc[i]) - xzp);
      }
      for (int64_t p = 0; p < P; ++p) acc[p] = 0.f;
      depthwise_plane(s, xf, w + oc * s.KH * s.KW, acc);
      const float mu = mult[oc], b = bias[oc];
      int8_t* __restrict yo = y + (n * s.OC + oc) * P;
      for (int64_t p = 0; p < P; ++p) yo[p] = quantize_one(acc[p] * mu + b, q);
    }
  }
  return Error::Ok;
}

// The im2col path as one parallel loop: the weights are widened once (unless `pw` has them),
// then each task packs one column tile of one image and group into its thread's buffer and
// multiplies it there.
Error conv_column_tiles(KernelContext& ctx, const ConvShape& s, const int8_t* x, int32_t xzp,
                        const int8_t* w, const PreparedWeights& pw, const int32_t* wsum,
                        const float* mult, const float* bias, const OutQuant& q,
                        const ColumnTiles& ct, int8_t* y) {
  const int64_t cin_g = s.C / s.groups, oc_g = s.OC / s.groups, K = cin_g * s.KH * s.KW;
  const int64_t P = s.OH * s.OW, tiles = ct.count, pc = ct.widest();
  // Panels a thread packs at a time, within 32 KiB: every sliver then writes group *
  // qgemm_panel_columns() outputs a row (see qgemm_packed). MobileNetV2's int8 first
  // convolution (depth 27) at 2 threads: 0.84 of its time a panel at a time with groups of 8
  // panels, and 0.92 of that again with 32 (these 32 KiB hold 36).
  const int64_t group = qgemm_panel_group(K);
  const size_t col_bytes = align64(size_t(K * pc));  // then the group's panels
  const size_t per_thread = col_bytes + size_t(group) * qgemm_panel_bytes(K);
  const int threads = ctx.num_threads();
  const size_t a_bytes = pw.packed != nullptr ? 0 : qgemm_packed_a_bytes(oc_g, K);
  Result<void*> mem =
      ctx.allocate_temp(a_bytes * size_t(s.groups) + per_thread * size_t(threads), 64);
  if (!mem.ok()) return mem.error();
  char* base = static_cast<char*>(mem.value());
  if (pw.packed == nullptr)
    for (int64_t g = 0; g < s.groups; ++g)
      qgemm_pack_a(ctx, oc_g, K, w + g * oc_g * K, K,
                   reinterpret_cast<int16_t*>(base + size_t(g) * a_bytes));
  auto packed_a = [&](int64_t g) {
    return pw.packed != nullptr ? pw.group(g)
                                : reinterpret_cast<const int16_t*>(base + size_t(g) * a_bytes);
  };
  char* scratch = base + a_bytes * size_t(s.groups);
  auto tile = [&](int64_t t, int thread) {
    const int64_t i = t % tiles, g = (t / tiles) % s.groups, n = t / (tiles * s.groups);
    const int64_t p0 = ct.begin(i), cols = ct.end(i) - p0;
    int8_t* col = reinterpret_cast<int8_t*>(ctx.thread_slice(thread, scratch, per_thread));
    const int8_t* xg = x + (n * s.C + g * cin_g) * s.H * s.W;
    for (int64_t c = 0; c < cin_g; ++c) im2col_channel(s, xg, c, p0, cols, int8_t(xzp), col, cols);
    ConvEpilogue e{wsum + g * oc_g,
                   mult + g * oc_g,
                   bias + g * oc_g,
                   xzp,
                   q,
                   y + (n * s.OC + g * oc_g) * P + p0,
                   P};
    qgemm_packed(oc_g, cols, K, packed_a(g), col, cols, 1,
                 reinterpret_cast<int16_t*>(col + col_bytes), group, conv_tile, &e);
  };
  ctx.parallel_for(s.N * s.groups * tiles, tile);
  return Error::Ok;
}

#if !defined(ETB_BARE_METAL)
// The taps path: an implicit GEMM (qgemm_taps) that reads B in place from the input's taps
// layout (geometry.h) instead of an im2col copy, each element of a plane a word of
// qgemm_step_channels() channels. Hosted only: the layout holds a whole image (bare metal
// keeps the im2col tiles, whose size it bounds). Not for the pointwise path's convolutions,
// nor where the channels fill a step's words so poorly that the padding costs more than the
// im2col copy saves (an RGB input: 3 channels in words of 4, a third more products).
bool takes_taps_path(const ConvShape& s) {
  const bool pointwise = is_pointwise(s);
  const int64_t cin_g = s.C / s.groups, step = qgemm_step_channels();
  const int64_t padded = (cin_g + step - 1) / step * step;
  return !pointwise && TapsLayout::supports(s) && 8 * padded <= 9 * cin_g;
}

#endif

// Taps a row of the prepared weights is packed for: KH * KW on the taps path, else 0.
int64_t prepared_taps([[maybe_unused]] const ConvShape& s) {
#if !defined(ETB_BARE_METAL)
  if (takes_taps_path(s)) return s.KH * s.KW;
#endif
  return 0;
}

#if !defined(ETB_BARE_METAL)
// Channel steps (words a pixel) of a group.
int64_t channel_steps(const ConvShape& s) {
  return (s.C / s.groups + qgemm_step_channels() - 1) / qgemm_step_channels();
}

// Fills the taps layout of one image's groups: plane (g, cs) holds channels
// [cs * step, cs * step + step) of group g (padding pixels: the input zero point).
void fill_taps_layout(const KernelContext& ctx, const ConvShape& s, const TapsLayout& L,
                      const int8_t* x, int8_t xzp, int32_t* words) {
  const int64_t step = qgemm_step_channels(), cin_g = s.C / s.groups, HW = s.H * s.W;
  const int64_t csteps = channel_steps(s);
  const int32_t pad = qgemm_fill_word(xzp);
  auto plane = [&](int64_t t, int) {
    const int64_t u = t / L.phases(), g = u / csteps, cs = u % csteps;
    const int64_t channels = cin_g - cs * step < step ? cin_g - cs * step : step;
    const int8_t* xc = x + (g * cin_g + cs * step) * HW;
    auto interior = [&](int32_t* d, int64_t ih, int64_t iw, int64_t n) {
      qgemm_pack_pixels(xc + ih * s.W + iw, HW, s.sw, channels, n, d);
    };
    L.fill_plane(s, t % L.phases(), pad, words + t * L.plane_size(), interior);
  };
  ctx.parallel_for(s.groups * csteps * L.phases(), plane);
}

// Delivers a tile of taps columns: each row is requantized whole (vectors, however short the
// output's rows), then its runs of columns within output rows are copied out; the columns
// past a row's OW are dropped.
struct TapsEpilogue {
  ConvEpilogue e;  // out: the image's and group's first output channel
  int64_t Wq, OW;
};

void taps_tile(void* ctx, int64_t m0, int64_t q0, int64_t mr, int64_t nr, const int32_t* acc,
               int64_t ld) {
  const TapsEpilogue t = *static_cast<const TapsEpilogue*>(ctx);  // a copy: see conv_tile
  const ConvEpilogue& e = t.e;
  constexpr int64_t kMaxPanel = 64;
  int8_t row[kMaxPanel];
  for (int64_t i = 0; i < mr; ++i) {
    const int64_t m = m0 + i;
    requantize_row(acc + i * ld, nr, e.xzp * e.wsum[m], e.mult[m], e.bias[m], e.q, row);
    for (int64_t q = q0; q < q0 + nr;) {
      const int64_t oh = q / t.Wq, ow = q - oh * t.Wq;
      if (ow >= t.OW) {
        q += t.Wq - ow;
        continue;
      }
      const int64_t run = t.OW - ow < q0 + nr - q ? t.OW - ow : q0 + nr - q;
      std::memcpy(e.out + m * e.ldo + oh * t.OW + ow, row + (q - q0), size_t(run));
      q += run;
    }
  }
}

// The taps path for every image: the layout filled, then one parallel loop over the groups'
// panels (and chunks of their rows when there are few panels).
Error conv_taps(KernelContext& ctx, const ConvShape& s, const int8_t* x, int32_t xzp,
                const int8_t* w, const PreparedWeights& pw, const int32_t* wsum, const float* mult,
                const float* bias, const OutQuant& q, int8_t* y) {
  const TapsLayout L(s);
  const int64_t cin_g = s.C / s.groups, oc_g = s.OC / s.groups, T = s.KH * s.KW;
  const int64_t csteps = channel_steps(s), S = csteps * T, Q = L.columns(s), P = s.OH * s.OW;
  const int64_t nr = qgemm_panel_columns(), mr = qgemm_tile_rows();
  const int64_t group_words = csteps * L.phases() * L.plane_size();
  const size_t weight_bytes = qgemm_packed_taps_bytes(oc_g, cin_g, T);  // a group's, packed
  const size_t a_bytes = pw.packed != nullptr ? 0 : weight_bytes;
  const int64_t all_panels = (Q + nr - 1) / nr, slivers = (oc_g + mr - 1) / mr;
  const size_t group_bytes = size_t(group_words) * sizeof(int32_t);
  // Tasks: (group, run of panels, chunk of slivers of rows), split as TapsSplit says from the
  // bytes of a group's packed weights and of its layout.
  const TapsSplit split(int(ctx.num_threads()), s.groups, all_panels, slivers,
                        weight_bytes >= group_bytes);
  const int64_t runs = split.runs, chunks = split.chunks, copies = split.copies;
  const size_t copy_bytes = align64(size_t(s.groups * group_words + nr) * sizeof(int32_t));
  const size_t words_bytes = copy_bytes * size_t(copies);
  Result<void*> mem =
      ctx.allocate_temp(words_bytes + size_t(S) * sizeof(int64_t) + a_bytes * size_t(s.groups), 64);
  if (!mem.ok()) return mem.error();
  auto copy_of = [&](int64_t c) {
    return reinterpret_cast<int32_t*>(static_cast<char*>(mem.value()) + size_t(c) * copy_bytes);
  };
  int32_t* words = copy_of(0);
  int64_t* offsets = reinterpret_cast<int64_t*>(static_cast<char*>(mem.value()) + words_bytes);
  char* a_base = reinterpret_cast<char*>(offsets + S);
  for (int64_t c = 0; c < copies; ++c)
    std::fill(copy_of(c) + s.groups * group_words, copy_of(c) + s.groups * group_words + nr, 0);
  L.tap_offsets(s, csteps, offsets);
  if (pw.packed == nullptr)
    for (int64_t g = 0; g < s.groups; ++g)
      qgemm_pack_taps(ctx, oc_g, cin_g, T, w + g * oc_g * cin_g * T,
                      reinterpret_cast<int16_t*>(a_base + size_t(g) * a_bytes));
  auto packed_a = [&](int64_t g) {
    return pw.packed != nullptr ? pw.group(g)
                                : reinterpret_cast<const int16_t*>(a_base + size_t(g) * a_bytes);
  };
  // Blocks of panels whose words (the group's layout, a share a column) stay in cache while
  // every sliver of the weights runs over them: the weights are read once a block.
  int64_t block_panels = int64_t(qgemm_block_bytes() * size_t(all_panels) / group_bytes);
  block_panels = block_panels < 1 ? 1 : block_panels > all_panels ? all_panels : block_panels;
  const KernelContext serial = ctx.within_task();
  for (int64_t n = 0; n < s.N; ++n) {
    const int8_t* xn = x + n * s.C * s.H * s.W;
    auto fill_copy = [&](int64_t c, int) {
      fill_taps_layout(serial, s, L, xn, int8_t(xzp), copy_of(c));
    };
    if (copies > 1)
      ctx.parallel_for(copies, fill_copy);
    else
      fill_taps_layout(ctx, s, L, xn, int8_t(xzp), words);
    auto task = [&](int64_t t, int thread) {
      const int64_t r = t % chunks, p = t / chunks % runs, g = t / (chunks * runs);
      TapsEpilogue te{{wsum + g * oc_g, mult + g * oc_g, bias + g * oc_g, xzp, q,
                       y + (n * s.OC + g * oc_g) * P, P},
                      L.Wq,
                      s.OW};
      const int64_t q0 = all_panels * p / runs * nr, q_end = all_panels * (p + 1) / runs * nr;
      const int64_t q1 = q_end < Q ? q_end : Q;
      const int64_t m0 = slivers * r / chunks * mr, m1 = slivers * (r + 1) / chunks * mr;
      const int32_t* layout = copy_of(copies > 1 ? thread : 0);
      qgemm_taps(m0, m1 < oc_g ? m1 : oc_g, cin_g, T, packed_a(g), layout + g * group_words,
                 offsets, q0, q1, block_panels * nr, taps_tile, &te);
    };
    ctx.parallel_for(s.groups * runs * chunks, task);
  }
  return Error::Ok;
}
#endif

// The convolution's shape from its arguments (the checks conv2d_out reports on, quietly).
bool shape_of(const Tensor& input, const Tensor& weight, int64_t groups, ConvShape* s) {
  if (input.dim() != 4 || weight.dim() != 4 || groups < 1) return false;
  s->N = input.size(0);
  s->C = input.size(1);
  s->H = input.size(2);
  s->W = input.size(3);
  s->OC = weight.size(0);
  s->KH = weight.size(2);
  s->KW = weight.size(3);
  s->groups = groups;
  return s->C % groups == 0 && s->OC % groups == 0 && weight.size(1) == s->C / groups;
}

// Whether the depthwise paths take the convolution (they read the weights as they are).
bool takes_depthwise_path(const ConvShape& s) {
  return s.C == s.groups && s.groups > 1 && s.KH * s.KW <= 514;
}

// The geometry items of the arguments (quietly: false when malformed).
bool geometry_of(Span<const int64_t> stride, Span<const int64_t> padding,
                 Span<const int64_t> dilation, ConvShape* s) {
  return pair_item(stride, 0, 1, &s->sh) && pair_item(stride, 1, 1, &s->sw) &&
         pair_item(padding, 0, 0, &s->ph) && pair_item(padding, 1, 0, &s->pw) &&
         pair_item(dilation, 0, 1, &s->dh) && pair_item(dilation, 1, 1, &s->dw);
}

}  // namespace

Error conv2d_out_prepare(PrepareContext& pctx, const Tensor& input, double, int64_t,
                         const Tensor& weight, const Tensor&, const Tensor*,
                         Span<const int64_t> stride, Span<const int64_t> padding,
                         Span<const int64_t> dilation, int64_t groups, double, int64_t, int64_t,
                         int64_t, Tensor&) {
  ConvShape s;
  if (!weight.read_only() || weight.dtype() != ScalarType::Char ||
      !shape_of(input, weight, groups, &s) || takes_depthwise_path(s) ||
      !geometry_of(stride, padding, dilation, &s))
    return Error::Ok;
  const int64_t oc_g = s.OC / groups, K = s.C / groups * s.KH * s.KW;
  prepare_weights(pctx, groups, oc_g, K, weight.data_as<int8_t>(), /*pack=*/true, prepared_taps(s));
  return Error::Ok;
}

Error conv2d_out(KernelContext& ctx, const Tensor& input, double input_scale,
                 int64_t input_zero_point, const Tensor& weight, const Tensor& weight_scales,
                 const Tensor* bias, Span<const int64_t> stride, Span<const int64_t> padding,
                 Span<const int64_t> dilation, int64_t groups, double output_scale,
                 int64_t output_zero_point, int64_t output_min, int64_t output_max, Tensor& out) {
  const char* op = "etb_quantized::conv2d";
  if (input.dim() != 4 || weight.dim() != 4)
    return fail(Error::InvalidArgument, "%s: input and weight must be 4-d, got %d-d and %d-d", op,
                input.dim(), weight.dim());
  if (input.dtype() != ScalarType::Char || weight.dtype() != ScalarType::Char ||
      out.dtype() != ScalarType::Char)
    return fail(Error::InvalidArgument, "%s: input, weight and out must be Char (int8)", op);
  ETB_TRY(check_scale(input_scale, op, "input_scale"));
  ETB_TRY(check_input_zp(input_zero_point, op, "input"));
  OutQuant q;
  ETB_TRY(make_out_quant(output_scale, output_zero_point, output_min, output_max, op, &q));
  ConvShape s;
  shape_of(input, weight, groups, &s);  // validated below, with messages
  if (!geometry_of(stride, padding, dilation, &s))
    return fail(Error::InvalidArgument, "%s: stride/padding/dilation must have 1 or 2 items", op);
  constexpr int64_t kLimit = int64_t(1) << 30;
  if (s.sh > kLimit || s.sw > kLimit || s.dh > kLimit || s.dw > kLimit || s.ph > kLimit ||
      s.pw > kLimit || s.sh < 1 || s.sw < 1 || s.dh < 1 || s.dw < 1 || s.ph < 0 || s.pw < 0)
    return fail(Error::InvalidArgument,
                "%s: stride and dilation must be in [1, 2^30], padding in [0, 2^30]", op);
  if (groups < 1 || s.C % groups != 0 || s.OC % groups != 0)
    return fail(Error::InvalidArgument,
                "%s: groups=%lld must divide %lld input and %lld output channels", op,
                (long long)groups, (long long)s.C, (long long)s.OC);
  const int64_t cin_g = s.C / groups, oc_g = s.OC / groups;
  if (weight.size(1) != cin_g)
    return fail(Error::InvalidArgument,
                "%s: weight expects %lld input channels per group, input has %lld", op,
                (long long)weight.size(1), (long long)cin_g);
  const int64_t eh = s.dh * (s.KH - 1) + 1, ew = s.dw * (s.KW - 1) + 1;
  if (s.KH < 1 || s.KW < 1 || s.H + 2 * s.ph < eh || s.W + 2 * s.pw < ew)
    return fail(Error::InvalidArgument, "%s: kernel is larger than the padded input", op);
  ETB_TRY(check_channel_params(weight_scales, bias, s.OC, op));
  s.OH = (s.H + 2 * s.ph - eh) / s.sh + 1;
  s.OW = (s.W + 2 * s.pw - ew) / s.sw + 1;
  const int64_t osz[4] = {s.N, s.OC, s.OH, s.OW};
  ETB_TRY(out.resize(Span<const int64_t>(osz, 4)));
  if (out.numel() == 0) return Error::Ok;

  // Per-channel multipliers float32(x_scale) * w_scale[c], biases and weight row sums.
  const int64_t K = cin_g * s.KH * s.KW;
  Result<void*> pm = ctx.allocate_temp(size_t(s.OC) * (2 * sizeof(float) + sizeof(int32_t)));
  if (!pm.ok()) return pm.error();
  float* mult = static_cast<float*>(pm.value());
  float* bias_f = mult + s.OC;
  int32_t* wsum_buf = reinterpret_cast<int32_t*>(bias_f + s.OC);
  const float xs = float(input_scale);
  const float* ws = weight_scales.data_as<float>();
  for (int64_t c = 0; c < s.OC; ++c) {
    mult[c] = xs * ws[c];
    bias_f[c] = bias != nullptr ? bias->data_as<float>()[c] : 0.f;
  }
  const int8_t* x = input.data_as<int8_t>();
  const int8_t* w = weight.data_as<int8_t>();
  int8_t* y = out.data_as<int8_t>();
  const int32_t xzp = int32_t(input_zero_point);

  if (takes_depthwise_path(s)) return conv_depthwise(ctx, s, x, xzp, w, mult, bias_f, q, y);

  const int64_t taps = prepared_taps(s);
  const PreparedWeights pw = prepared_weights(ctx.prepared(), groups, oc_g, K, taps);
  if (pw.sums == nullptr) row_sums(ctx, s.OC, K, w, K, wsum_buf);
  const int32_t* wsum = pw.sums != nullptr ? pw.sums : wsum_buf;
#if !defined(ETB_BARE_METAL)
  if (taps > 0) return conv_taps(ctx, s, x, xzp, w, pw, wsum, mult, bias_f, q, y);
#endif
  const int64_t P = s.OH * s.OW, HW = s.H * s.W;
  const bool pointwise = is_pointwise(s);
  int8_t* col = nullptr;
  // im2col column tiles within the tile budget (the pointwise path has none).
  const int threads = ctx.num_threads();
  int64_t max_cols = (threads <= 4 ? kColTileBytes : 4 * kColTileBytes / threads) / (K > 0 ? K : 1);
  max_cols = max_cols < 64 ? 64 : (max_cols / 64) * 64;
  const ColumnTiles ct(P, max_cols, threads);
  const int64_t pc = pointwise ? P : ct.widest();
  if (!pointwise) {
    if (threads > 1 && ct.count >= 2 * threads &&
        (pw.packed != nullptr || qgemm_packs_whole_a(s.OC, K)))
      return conv_column_tiles(ctx, s, x, xzp, w, pw, wsum, mult, bias_f, q, ct, y);
    Result<void*> tmp = ctx.allocate_temp(size_t(K * pc));
    if (!tmp.ok()) return tmp.error();
    col = static_cast<int8_t*>(tmp.value());
  }
#if defined(ETB_BARE_METAL)
  const bool halves = false;
#else
  const bool halves = pointwise && qgemm_splits_depth(oc_g, P, K, threads);
#endif
  Result<void*> wsm =
      ctx.allocate_temp(halves ? qgemm_depth_halves_workspace_bytes(oc_g, P, K, threads)
                               : qgemm_workspace_bytes(oc_g, pc, K, threads));
  if (!wsm.ok()) return wsm.error();
  void* gemm_ws = wsm.value();
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      const int8_t* xg = x + (n * s.C + g * cin_g) * HW;
      const int8_t* wg = w + g * oc_g * K;
      ConvEpilogue e{wsum + g * oc_g,
                     mult + g * oc_g,
                     bias_f + g * oc_g,
                     xzp,
                     q,
                     y + (n * s.OC + g * oc_g) * P,
                     P};
      if (halves) {
        qgemm_depth_halves(ctx, oc_g, P, K, wg, K, xg, HW, 1, gemm_ws, conv_tile, &e);
        continue;
      }
      if (pointwise) {
        qgemm(ctx, oc_g, P, K, wg, K, xg, HW, 1, gemm_ws, conv_tile, &e, pw.group(g));
        continue;
      }
      int8_t* yg = e.out;
      for (int64_t i = 0; i < ct.count; ++i) {
        const int64_t p0 = ct.begin(i), cols = ct.end(i) - p0;
        auto pack = [&](int64_t c, int) {
          im2col_channel(s, xg, c, p0, cols, int8_t(xzp), col, cols);
        };
        ctx.parallel_for(cin_g, pack);
        e.out = yg + p0;
        qgemm(ctx, oc_g, cols, K, wg, K, col, cols, 1, gemm_ws, conv_tile, &e, pw.group(g));
      }
    }
  }
  return Error::Ok;
}

}  // namespace quantized
}  // namespace etb
