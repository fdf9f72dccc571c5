// etb_quantized::expand_depthwise_project.out: a MobileNetV2-style block of three int8
// convolutions run as one kernel (pipeline/quant/ops.py `expand_depthwise_project`): a
// pointwise convolution that widens C channels to E, a depthwise convolution over the E
// channels and a pointwise projection to O channels, each requantized as conv2d is.
//
// The E-channel tensors between them never reach the program's memory: the kernel goes down
// the output a band of rows at a time, and for each band expands just the input rows under
// its taps into a thread's scratch, filters them there and projects the result into the
// output. The program's memory plan needs no room for the two tensors of E channels (6x the
// block's input in MobileNetV2), and with threads, each thread reads and writes its own
// scratch where the separate convolutions hand those tensors from one core to the other
// (their splits differ: columns of a product, channels of a depthwise convolution).
// Successive bands of one thread share K - S expanded rows, which move to the front of the
// scratch instead of being expanded again. Results are bit-identical to the three conv2d
// calls: the same exact sums and the same requantization.
#include <cstring>

#include "kernels/portable/geometry.h"
#include "kernels/quantized/depthwise.h"
#include "kernels/quantized/qgemm.h"
#include "kernels/quantized/requant.h"
#include "native_functions.h"

namespace etb {
namespace quantized {
namespace {

constexpr const char* kOp = "etb_quantized::expand_depthwise_project";

// A band's expanded and filtered rows within this budget: on hosts, inside a core's L2 with
// room to spare (Zen 5's 1 MiB; a phone's big core has 512 KiB to 1 MiB). Each band costs a
// setup per channel, so bands as big as the cache allows: MobileNetV2 int8's fused blocks at
// one thread (AVX-512) took 1.06x and 1.12x the three convolutions' time (two runs) in bands
// of 160 KiB, 0.99x and 1.01x in bands of 384 KiB. On bare metal, little RAM.
#if defined(ETB_BARE_METAL)
constexpr int64_t kBandBytes = 16 * 1024;
#else
constexpr int64_t kBandBytes = 384 * 1024;
#endif

// The block's sizes.
struct Block {
  int64_t N, C, H, W;  // input
  int64_t E, O;        // expanded and output channels
  int64_t K, S, pad;   // the depthwise kernel (square), stride and padding (both axes)
  int64_t OH, OW;
  // Expanded rows under b output rows.
  int64_t in_rows(int64_t b) const { return (b - 1) * S + K; }
  // The depthwise convolution of a band of b output rows over its in_rows(b) expanded rows
  // (whose padding rows, if any, the band holds as rows of the zero point).
  ConvShape band(int64_t b) const {
    return ConvShape{1, E, in_rows(b), W, E, K, K, b, OW, S, S, 0, pad, 1, 1, E};
  }
};

// One convolution's requantization: per-channel multipliers float32(x_scale) * w_scale[c],
// biases and the weights' row sums (for the input zero point's correction).
struct Requant {
  const float* mult;
  const float* bias;
  const int32_t* wsum;
  int32_t xzp;
  OutQuant q;
  ConvEpilogue epilogue(int8_t* out, int64_t ldo) const {
    return ConvEpilogue{wsum, mult, bias, xzp, q, out, ldo};
  }
};

// Checks a weight's dtype and shape [d0, d1, d2, d2] (as conv2d would find it).
Error check_weight(const Tensor& w, const char* name, int64_t d0, int64_t d1, int64_t d2) {
  if (w.dtype() != ScalarType::Char || w.dim() != 4 || w.size(0) != d0 || w.size(1) != d1 ||
      w.size(2) != d2 || w.size(3) != d2)
    return fail(Error::InvalidArgument,
                "%s: %s must be a Char (int8) tensor of shape [%lld, %lld, %lld, %lld]", kOp, name,
                (long long)d0, (long long)d1, (long long)d2, (long long)d2);
  return Error::Ok;
}

// The square, equal-on-both-axes value of an int[] argument of 1 or 2 items.
bool square_item(Span<const int64_t> v, int64_t* out) {
  int64_t a, b;
  if (!pair_items(v, 0, 0, &a, &b) || a != b) return false;
  *out = a;
  return true;
}

// The block's sizes from its arguments (quietly: false when they do not make a block).
bool block_of(const Tensor& input, const Tensor& we, const Tensor& wd, const Tensor& wp,
              Span<const int64_t> stride, Span<const int64_t> padding, Block* b) {
  if (input.dim() != 4 || we.dim() != 4 || wd.dim() != 4 || wp.dim() != 4) return false;
  *b = Block{};
  b->N = input.size(0);
  b->C = input.size(1);
  b->H = input.size(2);
  b->W = input.size(3);
  b->E = we.size(0);
  b->O = wp.size(0);
  b->K = wd.size(2);
  if (!square_item(stride, &b->S) || !square_item(padding, &b->pad) || b->S < 1 || b->pad < 0 ||
      b->K < 1 || b->C < 1 || b->E < 1 || b->H + 2 * b->pad < b->K || b->W + 2 * b->pad < b->K)
    return false;
  b->OH = (b->H + 2 * b->pad - b->K) / b->S + 1;
  b->OW = (b->W + 2 * b->pad - b->K) / b->S + 1;
  return depthwise_direct_supported(b->band(b->OH));
}

// The most output rows a band: as many as the budget holds (at least one).
int64_t band_rows(const Block& b) {
  int64_t rows = 1;
  while (rows < b.OH && b.E * (b.in_rows(rows + 1) * b.W + (rows + 1) * b.OW) <= kBandBytes) ++rows;
  return rows;
}

}  // namespace

Error expand_depthwise_project_out_prepare(
    PrepareContext& pctx, const Tensor& input, double, int64_t, const Tensor& expand_weight,
    const Tensor&, const Tensor*, double, int64_t, int64_t, int64_t, const Tensor& depthwise_weight,
    const Tensor&, const Tensor*, Span<const int64_t> stride, Span<const int64_t> padding, double,
    int64_t, int64_t, int64_t, const Tensor& project_weight, const Tensor&, const Tensor*, double,
    int64_t, int64_t, int64_t, Tensor&) {
  Block b;
  if (!expand_weight.read_only() || !project_weight.read_only() ||
      expand_weight.dtype() != ScalarType::Char || project_weight.dtype() != ScalarType::Char ||
      !block_of(input, expand_weight, depthwise_weight, project_weight, stride, padding, &b) ||
      expand_weight.size(1) != b.C || project_weight.size(1) != b.E)
    return Error::Ok;
  prepare_weights(pctx, 1, b.E, b.C, expand_weight.data_as<int8_t>(), /*pack=*/true);
  prepare_weights(pctx, 1, b.O, b.E, project_weight.data_as<int8_t>(), /*pack=*/true);
  return Error::Ok;
}

Error expand_depthwise_project_out(
    KernelContext& ctx, const Tensor& input, double input_scale, int64_t input_zero_point,
    const Tensor& expand_weight, const Tensor& expand_weight_scales, const Tensor* expand_bias,
    double expanded_scale, int64_t expanded_zero_point, int64_t expanded_min, int64_t expanded_max,
    const Tensor& depthwise_weight, const Tensor& depthwise_weight_scales,
    const Tensor* depthwise_bias, Span<const int64_t> stride, Span<const int64_t> padding,
    double filtered_scale, int64_t filtered_zero_point, int64_t filtered_min, int64_t filtered_max,
    const Tensor& project_weight, const Tensor& project_weight_scales, const Tensor* project_bias,
    double output_scale, int64_t output_zero_point, int64_t output_min, int64_t output_max,
    Tensor& out) {
  if (input.dim() != 4 || input.dtype() != ScalarType::Char || out.dtype() != ScalarType::Char)
    return fail(Error::InvalidArgument, "%s: input must be a 4-d Char (int8) tensor, out Char",
                kOp);
  if (expand_weight.dim() != 4 || depthwise_weight.dim() != 4 || project_weight.dim() != 4)
    return fail(Error::InvalidArgument, "%s: the three weights must be 4-d", kOp);
  Block b;
  if (!block_of(input, expand_weight, depthwise_weight, project_weight, stride, padding, &b))
    return fail(Error::InvalidArgument,
                "%s: the block needs input and expanded channels, and a depthwise convolution "
                "with a 3x3 or 5x5 kernel, one stride of 1 or 2 and one padding below the "
                "kernel size for both axes, that fits the padded input",
                kOp);
  ETB_TRY(check_weight(expand_weight, "expand_weight", b.E, b.C, 1));
  ETB_TRY(check_weight(depthwise_weight, "depthwise_weight", b.E, 1, b.K));
  ETB_TRY(check_weight(project_weight, "project_weight", b.O, b.E, 1));
  ETB_TRY(check_scale(input_scale, kOp, "input_scale"));
  ETB_TRY(check_scale(expanded_scale, kOp, "expanded_scale"));
  ETB_TRY(check_scale(filtered_scale, kOp, "filtered_scale"));
  ETB_TRY(check_input_zp(input_zero_point, kOp, "input"));
  ETB_TRY(check_input_zp(expanded_zero_point, kOp, "expanded"));
  ETB_TRY(check_input_zp(filtered_zero_point, kOp, "filtered"));
  OutQuant q1, q2, q3;
  ETB_TRY(
      make_out_quant(expanded_scale, expanded_zero_point, expanded_min, expanded_max, kOp, &q1));
  ETB_TRY(
      make_out_quant(filtered_scale, filtered_zero_point, filtered_min, filtered_max, kOp, &q2));
  ETB_TRY(make_out_quant(output_scale, output_zero_point, output_min, output_max, kOp, &q3));
  ETB_TRY(check_channel_params(expand_weight_scales, expand_bias, b.E, kOp));
  ETB_TRY(check_channel_params(depthwise_weight_scales, depthwise_bias, b.E, kOp));
  ETB_TRY(check_channel_params(project_weight_scales, project_bias, b.O, kOp));
  const int64_t osz[4] = {b.N, b.O, b.OH, b.OW};
  ETB_TRY(out.resize(Span<const int64_t>(osz, 4)));
  if (out.numel() == 0) return Error::Ok;

  // Multipliers and biases of the three convolutions (E, E and O channels), and the row sums
  // of the two products' weights when the method was not prepared.
  const PreparedWeights pe = prepared_weights(ctx.prepared(), 1, b.E, b.C);
  const PreparedWeights pp = pe.sums == nullptr
                                 ? PreparedWeights{}
                                 : prepared_weights(static_cast<const char*>(ctx.prepared()) +
                                                        prepared_weights_bytes(1, b.E, b.C, true),
                                                    1, b.O, b.E);
  const int64_t chans = 2 * b.E + b.O;
  const size_t ae_bytes = pe.packed != nullptr ? 0 : qgemm_packed_a_bytes(b.E, b.C);
  const size_t ap_bytes = pp.packed != nullptr ? 0 : qgemm_packed_a_bytes(b.O, b.E);
  const size_t params_bytes =
      align64(size_t(chans) * 2 * sizeof(float)) + align64(size_t(b.E + b.O) * sizeof(int32_t));
  Result<void*> pm = ctx.allocate_temp(params_bytes + ae_bytes + ap_bytes, 64);
  if (!pm.ok()) return pm.error();
  char* base = static_cast<char*>(pm.value());
  float* mult = reinterpret_cast<float*>(base);
  float* bias = mult + chans;
  int32_t* sums = reinterpret_cast<int32_t*>(base + align64(size_t(chans) * 2 * sizeof(float)));
  const Tensor* biases[3] = {expand_bias, depthwise_bias, project_bias};
  const Tensor* scales[3] = {&expand_weight_scales, &depthwise_weight_scales,
                             &project_weight_scales};
  const float xs[3] = {float(input_scale), float(expanded_scale), float(filtered_scale)};
  const int64_t first[4] = {0, b.E, 2 * b.E, chans};
  for (int i = 0; i < 3; ++i)
    for (int64_t c = first[i]; c < first[i + 1]; ++c) {
      mult[c] = xs[i] * scales[i]->data_as<float>()[c - first[i]];
      bias[c] = biases[i] != nullptr ? biases[i]->data_as<float>()[c - first[i]] : 0.f;
    }
  const int8_t* we = expand_weight.data_as<int8_t>();
  const int8_t* wp = project_weight.data_as<int8_t>();
  if (pe.sums == nullptr) row_sums(ctx, b.E, b.C, we, b.C, sums);
  if (pp.sums == nullptr) row_sums(ctx, b.O, b.E, wp, b.E, sums + b.E);
  int16_t* ae = reinterpret_cast<int16_t*>(base + params_bytes);
  int16_t* ap = reinterpret_cast<int16_t*>(base + params_bytes + ae_bytes);
  if (pe.packed == nullptr) qgemm_pack_a(ctx, b.E, b.C, we, b.C, ae);
  if (pp.packed == nullptr) qgemm_pack_a(ctx, b.O, b.E, wp, b.E, ap);
  const int16_t* a_expand = pe.packed != nullptr ? pe.group(0) : ae;
  const int16_t* a_project = pp.packed != nullptr ? pp.group(0) : ap;
  const Requant expand{mult, bias, pe.sums != nullptr ? pe.sums : sums, int32_t(input_zero_point),
                       q1};
  const Requant filter{mult + b.E, bias + b.E, nullptr, int32_t(expanded_zero_point), q2};
  const Requant project{mult + 2 * b.E, bias + 2 * b.E, pp.sums != nullptr ? pp.sums : sums + b.E,
                        int32_t(filtered_zero_point), q3};

  // Each thread's scratch: a band's expanded rows (E planes of `pitch` bytes), its filtered
  // rows, the depthwise convolution's planes and the products' panels of B.
  const int64_t rows = band_rows(b), pitch = b.in_rows(rows) * b.W;
  const int64_t group_e = qgemm_panel_group(b.C), group_p = qgemm_panel_group(b.E);
  const size_t ex_bytes = align64(size_t(b.E * pitch));
  const size_t fi_bytes = align64(size_t(b.E * rows * b.OW));
  const size_t dw_bytes = align64(depthwise_direct_temp_bytes(b.band(rows), 1));
  const size_t pe_bytes = size_t(group_e) * qgemm_panel_bytes(b.C);
  const size_t pp_bytes = size_t(group_p) * qgemm_panel_bytes(b.E);
  const size_t per_thread =
      ex_bytes + fi_bytes + dw_bytes + (pe_bytes > pp_bytes ? pe_bytes : pp_bytes);
  const int threads = ctx.num_threads();
  Result<void*> tm = ctx.allocate_temp(per_thread * size_t(threads), 64);
  if (!tm.ok()) return tm.error();
  // One run of output rows a thread (of each image): a run expands the K - S rows above its
  // first band again, which the run before it expands too. With two runs a thread (a thread
  // done early could take part of a slow one's work) MobileNetV2 int8 ran 1.03x slower at 2
  // threads.
  const int64_t runs = threads < b.OH ? threads : b.OH;
  const int8_t* x = input.data_as<int8_t>();
  const int8_t* wd = depthwise_weight.data_as<int8_t>();
  int8_t* y = out.data_as<int8_t>();
  const int64_t HW = b.H * b.W, OP = b.OH * b.OW;
  const int8_t mid_zp = int8_t(expanded_zero_point);

  auto run = [&](int64_t task, int thread) {
    const int64_t n = task / runs, r = task % runs;
    const int64_t r_begin = b.OH * r / runs, r_end = b.OH * (r + 1) / runs;
    char* mine = ctx.thread_slice(thread, tm.value(), per_thread);
    int8_t* ex = reinterpret_cast<int8_t*>(mine);
    int8_t* fi = ex + ex_bytes;
    void* dw_temp = mine + ex_bytes + fi_bytes;
    int16_t* panels = reinterpret_cast<int16_t*>(mine + ex_bytes + fi_bytes + dw_bytes);
    const int8_t* xn = x + n * b.C * HW;
    // Expanded rows [lo, hi) of the band starting at row i0 hold the zero point (padding).
    auto pad_rows = [&](int64_t i0, int64_t lo, int64_t hi) {
      for (int64_t e = 0; e < b.E && lo < hi; ++e)
        std::memset(ex + e * pitch + (lo - i0) * b.W, mid_zp, size_t((hi - lo) * b.W));
    };
    // The run in the fewest bands of at most `rows` rows, their sizes within one of each other
    // (a last band of a row or two would cost a band's setup for little work).
    const int64_t bands = (r_end - r_begin + rows - 1) / rows;
    int64_t prev_i0 = 0, prev_i1 = 0;
    for (int64_t i = 0; i < bands; ++i) {
      const int64_t r0 = r_begin + (r_end - r_begin) * i / bands;
      const int64_t nb = r_begin + (r_end - r_begin) * (i + 1) / bands - r0;
      const int64_t i0 = r0 * b.S - b.pad, i1 = i0 + b.in_rows(nb);  // expanded rows read
      int64_t j0 = i0;  // the first row to expand; those before it are the last band's
      if (r0 > r_begin) {
        j0 = prev_i1;
        for (int64_t e = 0; e < b.E; ++e)
          std::memmove(ex + e * pitch, ex + e * pitch + (i0 - prev_i0) * b.W,
                       size_t((j0 - i0) * b.W));
      }
      const int64_t img0 = j0 > 0 ? j0 : 0, img1 = i1 < b.H ? i1 : b.H;
      pad_rows(i0, j0, img0 < i1 ? img0 : i1);
      pad_rows(i0, img1 > j0 ? img1 : j0, i1);
      if (img1 > img0) {
        ConvEpilogue e = expand.epilogue(ex + (img0 - i0) * b.W, pitch);
        qgemm_packed(b.E, (img1 - img0) * b.W, b.C, a_expand, xn + img0 * b.W, HW, 1, panels,
                     group_e, conv_tile, &e);
      }
      depthwise_direct_serial(b.band(nb), ex, pitch, filter.xzp, wd, filter.mult, filter.bias,
                              filter.q, fi, nb * b.OW, dw_temp);
      ConvEpilogue e = project.epilogue(y + n * b.O * OP + r0 * b.OW, OP);
      qgemm_packed(b.O, nb * b.OW, b.E, a_project, fi, nb * b.OW, 1, panels, group_p, conv_tile,
                   &e);
      prev_i0 = i0;
      prev_i1 = i1;
    }
  };
  ctx.parallel_for(b.N * runs, run);
  return Error::Ok;
}

}  // namespace quantized
}  // namespace etb
