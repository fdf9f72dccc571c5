// etb_quantized::expand_depthwise_project.out: a MobileNetV2-style block of three int8
// convolutions run as one kernel (pipeline/quant/ops.py `expand_depthwise_project`): a
// pointwise convolution that widens C channels to E, a depthwise convolution over the E
// channels and a pointwise projection to O channels, each requantized as conv2d is.
// etb_quantized::depthwise_project.out is the same without the expansion (E = C: a
// depthwise-separable convolution, as MobileNetV1's layers and MobileNetV2's first block).
//
// The E-channel tensors between them never reach the program's memory: the kernel goes down
// the output a band of rows at a time, and for each band expands just the input rows under
// its taps into a thread's scratch (or copies them there), filters them there and projects
// the result into the output. The program's memory plan needs no room for the tensors of E
// channels (6x the block's input in MobileNetV2), and with threads, each thread reads and
// writes its own scratch where the separate convolutions hand those tensors from one core to
// the other (their splits differ: columns of a product, channels of a depthwise convolution).
// Successive bands of one thread share K - S expanded rows, which move to the front of the
// scratch instead of being expanded again. Hosted, planes below 28x28 take another way
// (run_block's channel split): each thread takes a slice of the E channels over the whole
// plane. Results are bit-identical to the separate conv2d calls: the same exact sums and the
// same requantization.
#include <cstring>
#include <numeric>

#include "kernels/portable/geometry.h"
#include "kernels/quantized/depthwise.h"
#include "kernels/quantized/depthwise_lanes.h"
#include "kernels/quantized/qgemm.h"
#include "kernels/quantized/requant.h"
#include "native_functions.h"

namespace etb {
namespace quantized {
namespace {


using Block = SeparableBlock;  // (padding rows: the zero point)

#if !defined(ETB_BARE_METAL)
// Hosted, planes smaller than this take the channel split instead of bands: a band's
// per-channel setup costs more there than its rows gain, and channel lanes beat the direct
// depthwise path the bands use. MobileNetV2 int8's 14x14 and 7x7 blocks at 2 threads, in the
// host's slow placement: the model in 0.92x the time of their separate calls (1.35-1.37 ms
// against 1.46-1.50), the same in the fast one. (Bare metal has no threads: bands, whose
// scratch is smaller.)
constexpr int64_t kMinBandPlane = 28 * 28;

// Channels of a slice: whole row tiles of the products and whole 16-channel lane blocks (so
// that the packed rows of A before a slice fill whole 64-byte lines, as
// qgemm_packed_a_bytes counts them).
int64_t slice_unit() {
  return std::lcm(qgemm_tile_rows(), int64_t(16));
}

#endif

// Checks a weight's dtype and shape [d0, d1, d2, d2] (as conv2d would find it).
Error check_weight(const Tensor& w, const char* op, const char* name, int64_t d0, int64_t d1,
                   int64_t d2) {
  if (w.dtype() != ScalarType::Char || w.dim() != 4 || w.size(0) != d0 || w.size(1) != d1 ||
      w.size(2) != d2 || w.size(3) != d2)
    return fail(Error::InvalidArgument,
                "%s: %s must be a Char (int8) tensor of shape [%lld, %lld, %lld, %lld]", op, name,
                (long long)d0, (long long)d1, (long long)d2, (long long)d2);
  return Error::Ok;
}

// Panels of B a band's product packs at a time: as many as conv.cpp's products take, hosted;
// on bare metal one, so that a band's scratch stays small (DS-CNN's pairs on a Cortex-M
// took 59 KiB with conv.cpp's group, 32 KiB of it panels).
int64_t panel_group(int64_t K) {
#if defined(ETB_BARE_METAL)
  (void)K;
  return 1;
#else
  return qgemm_panel_group(K);
#endif
}

// The block's sizes from its arguments, `we` nullptr without an expansion (quietly: false
// when they do not make a block).
bool block_of(const Tensor& input, const Tensor* we, const Tensor& wd, const Tensor& wp,
              Span<const int64_t> stride, Span<const int64_t> padding, Block* b) {
  if (input.dim() != 4 || (we != nullptr && we->dim() != 4) || wd.dim() != 4 || wp.dim() != 4)
    return false;
  *b = Block{};
  b->N = input.size(0);
  b->C = input.size(1);
  b->H = input.size(2);
  b->W = input.size(3);
  b->E = we != nullptr ? we->size(0) : b->C;
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
  while (rows < b.OH &&
         b.E * (b.in_rows(rows + 1) * b.W + (rows + 1) * b.OW) <= kSeparableBandBytes)
    ++rows;
  return rows;
}

// One convolution of the block: its weights, per-channel scales and bias, and the
// quantization of its output.
struct Conv {
  const Tensor* weight;
  const Tensor* scales;
  const Tensor* bias;
  double scale;
  int64_t zero_point, lo, hi;
};

// Takes the products' prepared weights (expansion, if any, then projection) from pctx.
Error prepare_block(PrepareContext& pctx, const Tensor& input, const Tensor* we, const Tensor& wd,
                    const Tensor& wp, Span<const int64_t> stride, Span<const int64_t> padding) {
  Block b;
  if ((we != nullptr && (!we->read_only() || we->dtype() != ScalarType::Char)) || !wp.read_only() ||
      wp.dtype() != ScalarType::Char || !block_of(input, we, wd, wp, stride, padding, &b) ||
      (we != nullptr && we->size(1) != b.C) || wp.size(1) != b.E)
    return Error::Ok;
  if (we != nullptr) prepare_weights(pctx, 1, b.E, b.C, we->data_as<int8_t>(), /*pack=*/true);
  prepare_weights(pctx, 1, b.O, b.E, wp.data_as<int8_t>(), /*pack=*/true);
  return Error::Ok;
}

// The block's kernel; `expand` nullptr: none (the input's channels are the depthwise
// convolution's). `op` names the kernel in messages.
Error run_block(KernelContext& ctx, const char* op, const Tensor& input, double input_scale,
                int64_t input_zero_point, const Conv* expand, const Conv& depthwise,
                Span<const int64_t> stride, Span<const int64_t> padding, const Conv& project,
                Tensor& out) {
  if (input.dim() != 4 || input.dtype() != ScalarType::Char || out.dtype() != ScalarType::Char)
    return fail(Error::InvalidArgument, "%s: input must be a 4-d Char (int8) tensor, out Char", op);
  const Tensor* we = expand != nullptr ? expand->weight : nullptr;
  const Tensor& wd_t = *depthwise.weight;
  const Tensor& wp_t = *project.weight;
  if ((we != nullptr && we->dim() != 4) || wd_t.dim() != 4 || wp_t.dim() != 4)
    return fail(Error::InvalidArgument, "%s: the weights must be 4-d", op);
  Block b;
  if (!block_of(input, we, wd_t, wp_t, stride, padding, &b))
    return fail(Error::InvalidArgument,
                "%s: the block needs input and expanded channels, and a depthwise convolution "
                "with a 3x3 or 5x5 kernel, one stride of 1 or 2 and one padding below the "
                "kernel size for both axes, that fits the padded input",
                op);
  // The depthwise convolution's input: the expansion's output, or the block's input.
  const double mid_scale = expand != nullptr ? expand->scale : input_scale;
  const int64_t mid_zp = expand != nullptr ? expand->zero_point : input_zero_point;
  ETB_TRY(check_scale(input_scale, op, "input_scale"));
  ETB_TRY(check_input_zp(input_zero_point, op, "input"));
  OutQuant q1, q2, q3;
  if (expand != nullptr) {
    ETB_TRY(check_weight(*we, op, "expand_weight", b.E, b.C, 1));
    ETB_TRY(check_scale(expand->scale, op, "expanded_scale"));
    ETB_TRY(check_input_zp(expand->zero_point, op, "expanded"));
    ETB_TRY(make_out_quant(expand->scale, expand->zero_point, expand->lo, expand->hi, op, &q1));
    ETB_TRY(check_channel_params(*expand->scales, expand->bias, b.E, op));
  }
  ETB_TRY(check_weight(wd_t, op, "depthwise_weight", b.E, 1, b.K));
  ETB_TRY(check_weight(wp_t, op, "project_weight", b.O, b.E, 1));
  ETB_TRY(check_scale(depthwise.scale, op, "filtered_scale"));
  ETB_TRY(check_input_zp(depthwise.zero_point, op, "filtered"));
  ETB_TRY(
      make_out_quant(depthwise.scale, depthwise.zero_point, depthwise.lo, depthwise.hi, op, &q2));
  ETB_TRY(make_out_quant(project.scale, project.zero_point, project.lo, project.hi, op, &q3));
  ETB_TRY(check_channel_params(*depthwise.scales, depthwise.bias, b.E, op));
  ETB_TRY(check_channel_params(*project.scales, project.bias, b.O, op));
  const int64_t osz[4] = {b.N, b.O, b.OH, b.OW};
  ETB_TRY(out.resize(Span<const int64_t>(osz, 4)));
  if (out.numel() == 0) return Error::Ok;

  // Multipliers and biases of the three convolutions (E, E and O channels; the first E unused
  // without an expansion), and the row sums of the products' weights when the method was not
  // prepared.
  const char* prepared = static_cast<const char*>(ctx.prepared());
  const PreparedWeights pe =
      expand != nullptr ? prepared_weights(prepared, 1, b.E, b.C) : PreparedWeights{};
  const PreparedWeights pp =
      expand == nullptr ? prepared_weights(prepared, 1, b.O, b.E)
      : pe.sums != nullptr
          ? prepared_weights(prepared + prepared_weights_bytes(1, b.E, b.C, true), 1, b.O, b.E)
          : PreparedWeights{};
  const int64_t chans = 2 * b.E + b.O;
  const size_t ae_bytes =
      expand == nullptr || pe.packed != nullptr ? 0 : qgemm_packed_a_bytes(b.E, b.C);
  const size_t ap_bytes = pp.packed != nullptr ? 0 : qgemm_packed_a_bytes(b.O, b.E);
  const size_t params_bytes =
      align64(size_t(chans) * 2 * sizeof(float)) + align64(size_t(b.E + b.O) * sizeof(int32_t));
  Result<void*> pm = ctx.allocate_temp(params_bytes + ae_bytes + ap_bytes, 64);
  if (!pm.ok()) return pm.error();
  char* base = static_cast<char*>(pm.value());
  float* mult = reinterpret_cast<float*>(base);
  float* bias = mult + chans;
  int32_t* sums = reinterpret_cast<int32_t*>(base + align64(size_t(chans) * 2 * sizeof(float)));
  const Conv* convs[3] = {expand, &depthwise, &project};
  const float xs[3] = {float(input_scale), float(mid_scale), float(depthwise.scale)};
  const int64_t first[4] = {0, b.E, 2 * b.E, chans};
  for (int i = 0; i < 3; ++i)
    for (int64_t c = first[i]; c < first[i + 1] && convs[i] != nullptr; ++c) {
      const Conv& v = *convs[i];
      mult[c] = xs[i] * v.scales->data_as<float>()[c - first[i]];
      bias[c] = v.bias != nullptr ? v.bias->data_as<float>()[c - first[i]] : 0.f;
    }
  const int8_t* wp = wp_t.data_as<int8_t>();
  if (expand != nullptr && pe.sums == nullptr)
    row_sums(ctx, b.E, b.C, we->data_as<int8_t>(), b.C, sums);
  if (pp.sums == nullptr) row_sums(ctx, b.O, b.E, wp, b.E, sums + b.E);
  int16_t* ae = reinterpret_cast<int16_t*>(base + params_bytes);
  int16_t* ap = reinterpret_cast<int16_t*>(base + params_bytes + ae_bytes);
  if (ae_bytes > 0) qgemm_pack_a(ctx, b.E, b.C, we->data_as<int8_t>(), b.C, ae);
  if (ap_bytes > 0) qgemm_pack_a(ctx, b.O, b.E, wp, b.E, ap);
  const int16_t* a_expand = pe.packed != nullptr ? pe.group(0) : ae;
  const int16_t* a_project = pp.packed != nullptr ? pp.group(0) : ap;
  const int64_t rows = band_rows(b), pitch = b.in_rows(rows) * b.W;
  const int64_t HW = b.H * b.W, OP = b.OH * b.OW;
  // The products' requantization (each band sets its output rows); the depthwise
  // convolution's multipliers and biases follow the expansion's.
  const ConvEpilogue expansion{pe.sums != nullptr ? pe.sums : sums,
                               mult,
                               bias,
                               int32_t(input_zero_point),
                               q1,
                               nullptr,
                               pitch};
  const ConvEpilogue projection{pp.sums != nullptr ? pp.sums : sums + b.E,
                                mult + 2 * b.E,
                                bias + 2 * b.E,
                                int32_t(depthwise.zero_point),
                                q3,
                                nullptr,
                                OP};

#if !defined(ETB_BARE_METAL)
  // Small planes: each thread expands and filters a slice of the E channels over the whole
  // plane and projects it into int32 partial sums, which a second loop adds up and
  // requantizes (exactly: the sums are the same integers). Two loops a block, where the
  // separate convolutions take four or five, and the E-channel tensors stay in the thread's
  // scratch.
  if (b.H * b.W < kMinBandPlane) {
    const int threads = ctx.num_threads();
    const int64_t unit = slice_unit(), units = (b.E + unit - 1) / unit;
    const int64_t slices = threads < units ? threads : units;
    const int64_t widest = (units + slices - 1) / slices * unit;
    const ConvShape dws{1,    widest, b.H, b.W,   widest, b.K, b.K, b.OH,
                        b.OW, b.S,    b.S, b.pad, b.pad,  1,   1,   widest};
    const bool lanes = depthwise_lanes_suit(dws);
    const int64_t group_e = qgemm_panel_group(b.C);
    const size_t ex_bytes = expand != nullptr ? align64(size_t(widest * HW)) : 0;
    const size_t fi_bytes = align64(size_t(widest * OP));
    const size_t dw_bytes =
        align64(lanes ? depthwise_lanes_temp_bytes(dws, 1) : depthwise_direct_temp_bytes(dws, 1));
    const size_t pe_bytes = expand != nullptr ? size_t(group_e) * qgemm_panel_bytes(b.C) : 0;
    const size_t ws_bytes = align64(qgemm_workspace_bytes(b.O, OP, b.E, 1));
    const size_t per_thread = ex_bytes + fi_bytes + dw_bytes + align64(pe_bytes) + ws_bytes;
    const size_t part_bytes = slices > 1 ? size_t(b.N * slices * b.O * OP) * sizeof(int32_t) : 0;
    Result<void*> mem = ctx.allocate_temp(per_thread * size_t(threads) + part_bytes, 64);
    if (!mem.ok()) return mem.error();
    int32_t* partials =
        reinterpret_cast<int32_t*>(static_cast<char*>(mem.value()) + per_thread * size_t(threads));
    const KernelContext serial = ctx.within_task();
    const int8_t* x = input.data_as<int8_t>();
    const int8_t* wd = wd_t.data_as<int8_t>();
    int8_t* y = out.data_as<int8_t>();
    auto slice = [&](int64_t task, int thread) {
      const int64_t n = task / slices, sl = task % slices;
      const int64_t e0 = units * sl / slices * unit;
      const int64_t e1 =
          units * (sl + 1) / slices * unit < b.E ? units * (sl + 1) / slices * unit : b.E;
      const int64_t ne = e1 - e0;
      char* mine = ctx.thread_slice(thread, mem.value(), per_thread);
      int8_t* ex = reinterpret_cast<int8_t*>(mine);
      int8_t* fi = reinterpret_cast<int8_t*>(mine + ex_bytes);
      void* dw_temp = mine + ex_bytes + fi_bytes;
      int16_t* panels = reinterpret_cast<int16_t*>(mine + ex_bytes + fi_bytes + dw_bytes);
      void* ws = mine + ex_bytes + fi_bytes + dw_bytes + align64(pe_bytes);
      const int8_t* xn = x + n * b.C * HW;
      const int8_t* src = xn + e0 * HW;  // the depthwise convolution's input channels
      if (expand != nullptr) {
        ConvEpilogue e = expansion;
        e.wsum += e0;
        e.mult += e0;
        e.bias += e0;
        e.out = ex;
        e.ldo = HW;
        qgemm_packed(ne, HW, b.C, a_expand + qgemm_packed_a_bytes(e0, b.C) / sizeof(int16_t), xn,
                     HW, 1, panels, group_e, conv_tile, &e);
        src = ex;
      }
      const ConvShape ds{1,    ne,  b.H, b.W,   ne,    b.K, b.K, b.OH,
                         b.OW, b.S, b.S, b.pad, b.pad, 1,   1,   ne};
      if (lanes)
        depthwise_lanes(serial, ds, src, int32_t(mid_zp), wd + e0 * b.K * b.K, mult + b.E + e0,
                        bias + b.E + e0, q2, fi, dw_temp);
      else
        depthwise_direct_serial(ds, src, HW, int32_t(mid_zp), wd + e0 * b.K * b.K, mult + b.E + e0,
                                bias + b.E + e0, q2, fi, OP, dw_temp);
      if (slices == 1) {  // the whole projection, requantized as it goes
        ConvEpilogue e = projection;
        e.out = y + n * b.O * OP;
        qgemm(serial, b.O, OP, b.E, wp, b.E, fi, OP, 1, ws, conv_tile, &e, a_project);
      } else {
        SumsOut o{partials + (n * slices + sl) * b.O * OP, OP};
        qgemm(serial, b.O, OP, ne, wp + e0, b.E, fi, OP, 1, ws, store_sums, &o);
      }
    };
    ctx.parallel_for(b.N * slices, slice);
    if (slices == 1) return Error::Ok;
    const int64_t rows = qgemm_tile_rows(), tiles = (b.O + rows - 1) / rows;
    auto deliver = [&](int64_t task, int) {
      const int64_t n = task / tiles, m0 = task % tiles * rows;
      const int64_t mr = b.O - m0 < rows ? b.O - m0 : rows;
      int32_t* c = partials + n * slices * b.O * OP + m0 * OP;
      for (int64_t sl = 1; sl < slices; ++sl) {
        const int32_t* p = c + sl * b.O * OP;
        for (int64_t i = 0; i < mr * OP; ++i) c[i] += p[i];
      }
      ConvEpilogue e = projection;
      e.out = y + n * b.O * OP;
      conv_tile(&e, m0, 0, mr, OP, c, OP);
    };
    ctx.parallel_for(b.N * tiles, deliver);
    return Error::Ok;
  }
#endif
  // Each thread's scratch: a band's expanded rows (E planes of `pitch` bytes), its filtered
  // rows, the depthwise convolution's planes and the products' panels of B.
  const int64_t group_e = panel_group(b.C), group_p = panel_group(b.E);
  const size_t ex_bytes = align64(size_t(b.E * pitch));
  const size_t fi_bytes = align64(size_t(b.E * rows * b.OW));
  const size_t dw_bytes = align64(depthwise_direct_temp_bytes(b.band(rows), 1));
  const size_t pe_bytes = expand != nullptr ? size_t(group_e) * qgemm_panel_bytes(b.C) : 0;
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
  const int8_t* wd = wd_t.data_as<int8_t>();
  int8_t* y = out.data_as<int8_t>();

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
        std::memset(ex + e * pitch + (lo - i0) * b.W, int8_t(mid_zp), size_t((hi - lo) * b.W));
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
      if (img1 > img0 && expand != nullptr) {
        ConvEpilogue e = expansion;
        e.out = ex + (img0 - i0) * b.W;
        qgemm_packed(b.E, (img1 - img0) * b.W, b.C, a_expand, xn + img0 * b.W, HW, 1, panels,
                     group_e, conv_tile, &e);
      } else if (img1 > img0) {  // the input's own rows
        for (int64_t e = 0; e < b.E; ++e)
          std::memcpy(ex + e * pitch + (img0 - i0) * b.W, xn + e * HW + img0 * b.W,
                      size_t((img1 - img0) * b.W));
      }
      depthwise_direct_serial(b.band(nb), ex, pitch, int32_t(mid_zp), wd, mult + b.E, bias + b.E,
                              q2, fi, nb * b.OW, dw_temp);
      ConvEpilogue e = projection;
      e.out = y + n * b.O * OP + r0 * b.OW;
      qgemm_packed(b.O, nb * b.OW, b.E, a_project, fi, nb * b.OW, 1, panels, group_p, conv_tile,
                   &e);
      prev_i0 = i0;
      prev_i1 = i1;
    }
  };
  ctx.parallel_for(b.N * runs, run);
  return Error::Ok;
}

Conv conv_of(const Tensor& weight, const Tensor& scales, const Tensor* bias, double scale,
             int64_t zero_point, int64_t lo, int64_t hi) {
  return Conv{&weight, &scales, bias, scale, zero_point, lo, hi};
}

// run_block with the depthwise convolution's and the projection's arguments as the ops list
// them, after the (optional) expansion.
Error separable(KernelContext& ctx, const char* op, const Tensor& input, double input_scale,
                int64_t input_zero_point, const Conv* expand, const Tensor& depthwise_weight,
                const Tensor& depthwise_weight_scales, const Tensor* depthwise_bias,
                Span<const int64_t> stride, Span<const int64_t> padding, double filtered_scale,
                int64_t filtered_zero_point, int64_t filtered_min, int64_t filtered_max,
                const Tensor& project_weight, const Tensor& project_weight_scales,
                const Tensor* project_bias, double output_scale, int64_t output_zero_point,
                int64_t output_min, int64_t output_max, Tensor& out) {
  const Conv depthwise = conv_of(depthwise_weight, depthwise_weight_scales, depthwise_bias,
                                 filtered_scale, filtered_zero_point, filtered_min, filtered_max);
  const Conv project = conv_of(project_weight, project_weight_scales, project_bias, output_scale,
                               output_zero_point, output_min, output_max);
  return run_block(ctx, op, input, input_scale, input_zero_point, expand, depthwise, stride,
                   padding, project, out);
}

}  // namespace

Error expand_depthwise_project_out_prepare(
    PrepareContext& pctx, const Tensor& input, double, int64_t, const Tensor& expand_weight,
    const Tensor&, const Tensor*, double, int64_t, int64_t, int64_t, const Tensor& depthwise_weight,
    const Tensor&, const Tensor*, Span<const int64_t> stride, Span<const int64_t> padding, double,
    int64_t, int64_t, int64_t, const Tensor& project_weight, const Tensor&, const Tensor*, double,
    int64_t, int64_t, int64_t, Tensor&) {
  return prepare_block(pctx, input, &expand_weight, depthwise_weight, project_weight, stride,
                       padding);
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
  const Conv expand = conv_of(expand_weight, expand_weight_scales, expand_bias, expanded_scale,
                              expanded_zero_point, expanded_min, expanded_max);
  return separable(ctx, "etb_quantized::expand_depthwise_project", input, input_scale,
                   input_zero_point, &expand, depthwise_weight, depthwise_weight_scales,
                   depthwise_bias, stride, padding, filtered_scale, filtered_zero_point,
                   filtered_min, filtered_max, project_weight, project_weight_scales, project_bias,
                   output_scale, output_zero_point, output_min, output_max, out);
}

Error depthwise_project_out_prepare(PrepareContext& pctx, const Tensor& input, double, int64_t,
                                    const Tensor& depthwise_weight, const Tensor&, const Tensor*,
                                    Span<const int64_t> stride, Span<const int64_t> padding, double,
                                    int64_t, int64_t, int64_t, const Tensor& project_weight,
                                    const Tensor&, const Tensor*, double, int64_t, int64_t, int64_t,
                                    Tensor&) {
  return prepare_block(pctx, input, nullptr, depthwise_weight, project_weight, stride, padding);
}

Error depthwise_project_out(KernelContext& ctx, const Tensor& input, double input_scale,
                            int64_t input_zero_point, const Tensor& depthwise_weight,
                            const Tensor& depthwise_weight_scales, const Tensor* depthwise_bias,
                            Span<const int64_t> stride, Span<const int64_t> padding,
                            double filtered_scale, int64_t filtered_zero_point,
                            int64_t filtered_min, int64_t filtered_max,
                            const Tensor& project_weight, const Tensor& project_weight_scales,
                            const Tensor* project_bias, double output_scale,
                            int64_t output_zero_point, int64_t output_min, int64_t output_max,
                            Tensor& out) {
  return separable(ctx, "etb_quantized::depthwise_project", input, input_scale, input_zero_point,
                   nullptr, depthwise_weight, depthwise_weight_scales, depthwise_bias, stride,
                   padding, filtered_scale, filtered_zero_point, filtered_min, filtered_max,
                   project_weight, project_weight_scales, project_bias, output_scale,
                   output_zero_point, output_min, output_max, out);
}

}  // namespace quantized
}  // namespace etb
