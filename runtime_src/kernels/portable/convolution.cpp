// 1-d and 2-d convolution (NCHW, grouped and depthwise, and transposed) on Float tensors, and
// 2-d on channels-last (NHWC) activations (conv_channels_last).
//
// Four paths: pointwise (1x1, stride 1, no padding) is one GEMM per group, reading the
// weights and the activations in place; depthwise (one input channel per group) has its own
// kernel (depthwise.h); hosted, the taps path (below) reads the GEMM's B from a padded copy
// of the input, with no im2col; everything else packs column tiles (im2col) into temp memory
// and runs the GEMM on them. Bias and a fused activation clamp are applied in the GEMM's
// epilogue.
#include <algorithm>

#include "kernels/portable/depthwise.h"
#include "kernels/portable/depthwise_nhwc.h"
#include "kernels/portable/gemm.h"
#include "kernels/portable/geometry.h"
#include "kernels/portable/transpose.h"
#include "kernels/portable/util.h"
#include "kernels/simd.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

// Transposed convolution (nn.ConvTranspose1d/2d): every input pixel scatters its weighted
// kernel into the output. One task per (batch item, output channel), so a channel's sums run
// in the same order on any thread. Weight layout: [C, OC / groups, KH, KW].
Error conv_transpose(KernelContext& ctx, const Tensor& input, const Tensor& weight,
                     const Tensor* bias, Span<const int64_t> stride, Span<const int64_t> padding,
                     Span<const int64_t> dilation, Span<const int64_t> output_padding,
                     int64_t groups, Tensor& out) {
  const char* op = "convolution (transposed)";
  const int nd = input.dim() - 2;
  if ((nd != 1 && nd != 2) || weight.dim() != input.dim())
    return fail(Error::NotSupported, "%s: input and weight must both be 3-d or 4-d", op);
  const int64_t N = input.size(0), C = input.size(1), H = nd == 2 ? input.size(2) : 1;
  const int64_t W = input.size(nd + 1), KH = nd == 2 ? weight.size(2) : 1;
  const int64_t KW = weight.size(nd + 1);
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, oph = 0, opw = 0;
  bool ok = stride.size() <= size_t(nd) && padding.size() <= size_t(nd) &&
            dilation.size() <= size_t(nd) && output_padding.size() <= size_t(nd);
  const int last = nd - 1;  // the width's index in each list
  ok = ok && pair_item(stride, last, 1, &sw) && pair_item(padding, last, 0, &pw) &&
       pair_item(dilation, last, 1, &dw) && pair_item(output_padding, last, 0, &opw);
  if (nd == 2)
    ok = ok && pair_item(stride, 0, 1, &sh) && pair_item(padding, 0, 0, &ph) &&
         pair_item(dilation, 0, 1, &dh) && pair_item(output_padding, 0, 0, &oph);
  constexpr int64_t kLimit = int64_t(1) << 30;
  if (!ok || sh < 1 || sw < 1 || dh < 1 || dw < 1 || ph < 0 || pw < 0 || sh > kLimit ||
      sw > kLimit || dh > kLimit || dw > kLimit || ph > kLimit || pw > kLimit)
    return fail(Error::InvalidArgument,
                "%s: stride and dilation must be in [1, 2^30], padding in [0, 2^30]", op);
  if (oph < 0 || opw < 0 || (oph >= sh && oph >= dh) || (opw >= sw && opw >= dw))
    return fail(Error::InvalidArgument,
                "%s: output_padding must be smaller than the stride or the dilation", op);
  if (groups < 1 || C % groups != 0 || weight.size(0) != C)
    return fail(Error::InvalidArgument,
                "%s: weight has %lld input channels and groups=%lld, the input %lld channels", op,
                (long long)weight.size(0), (long long)groups, (long long)C);
  const int64_t cin_g = C / groups, oc_g = weight.size(1), OC = oc_g * groups;
  const int64_t OH = (H - 1) * sh - 2 * ph + dh * (KH - 1) + oph + 1;
  const int64_t OW = (W - 1) * sw - 2 * pw + dw * (KW - 1) + opw + 1;
  if (OH < 1 || OW < 1 || KH < 1 || KW < 1)
    return fail(Error::InvalidArgument, "%s: the padding leaves an empty output", op);
  if (bias != nullptr && (bias->dim() != 1 || bias->size(0) != OC))
    return fail(Error::InvalidArgument, "%s: bias must have %lld elements", op, (long long)OC);
  int64_t osz[4] = {N, OC, OH, OW};
  if (nd == 1) osz[2] = OW;
  ETB_TRY(resize_to(out, osz, nd + 2));
  const float* x = input.data_as<float>();
  const float* w = weight.data_as<float>();
  const float* b = bias != nullptr ? bias->data_as<float>() : nullptr;
  float* y = out.data_as<float>();
  const OutputClamp clamp = ctx.output_clamp();
  auto channel = [&](int64_t task, int) {
    const int64_t n = task / OC, oc = task % OC, g = oc / oc_g;
    float* yo = y + task * OH * OW;
    const float init = b != nullptr ? b[oc] : 0.f;
    for (int64_t i = 0; i < OH * OW; ++i) yo[i] = init;
    for (int64_t ic = g * cin_g; ic < (g + 1) * cin_g; ++ic) {
      const float* xc = x + (n * C + ic) * H * W;
      const float* wc = w + (ic * oc_g + oc % oc_g) * KH * KW;
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) {
          const float wv = wc[kh * KW + kw];
          const int64_t offw = kw * dw - pw;  // ow = iw * sw + offw
          // The iw whose ow is inside [0, OW).
          const int64_t lo = offw >= 0 ? 0 : (-offw + sw - 1) / sw;
          int64_t hi = OW - 1 - offw < 0 ? 0 : (OW - 1 - offw) / sw + 1;
          if (hi > W) hi = W;
          for (int64_t ih = 0; ih < H; ++ih) {
            const int64_t oh = ih * sh - ph + kh * dh;
            if (oh < 0 || oh >= OH) continue;
            const float* xr = xc + ih * W;
            float* yr = yo + oh * OW + offw;
            for (int64_t iw = lo; iw < hi; ++iw) yr[iw * sw] += wv * xr[iw];
          }
        }
    }
    if (clamp.active())
      for (int64_t i = 0; i < OH * OW; ++i) yo[i] = std::min(std::max(yo[i], clamp.lo), clamp.hi);
  };
  ctx.parallel_for(N * OC, channel);
  return Error::Ok;
}

#if !defined(ETB_BARE_METAL)
// The taps path: sgemm_rows reads B from the input's taps layout (geometry.h, padded with
// zeros) instead of an im2col copy. Its columns are the output's rows Wq apart: the product
// goes to a temp matrix, whose rows' first OW columns are then copied out. Hosted only (the
// layout holds a whole image), and only where that wins (ResNet18's layers, measured): stride
// 1 (with stride 2 the copy out and the phase planes cost more than the im2col they save),
// and where the columns dropped between rows add little to the product: not on small planes
// (a 7x7 output with a 3x3 kernel: 61 columns for 49).
bool takes_taps_path(const ConvShape& s) {
  if (s.sh != 1 || s.sw != 1) return false;
  const TapsLayout L(s);
  return 20 * L.columns(s) <= 23 * s.OH * s.OW;
}

Error conv_taps(KernelContext& ctx, const ConvShape& s, const float* x, const float* w,
                const float* bias, const GemmEpilogue& ep, float* y) {
  const TapsLayout L(s);
  const int64_t cin_g = s.C / s.groups, oc_g = s.OC / s.groups, K = cin_g * s.KH * s.KW;
  const int64_t P = s.OH * s.OW, plane = L.phases() * L.plane_size();
  // The product's columns: the Q = L.columns(s) that hold outputs, rounded up to whole vectors
  // on every ISA (4, 8 or 16 floats), so that no column goes as a dot product (those columns
  // of B are gathered, transposed, by every task whose run ends the product). The columns past
  // Q read up to 15 floats past the layout (kTapsSlack) and are never copied out.
  constexpr int64_t kTapsSlack = 16;
  const int64_t Q = (L.columns(s) + kTapsSlack - 1) / kTapsSlack * kTapsSlack;
  // Tasks: (group, run of columns, chunk of output channels), each one GEMM of its own on one
  // thread (one parallel loop, not one per block of the GEMM's); runs start at multiples of 32
  // columns, whole tiles on every ISA, so every column is summed the same way at any thread
  // count (a channel's sums do not depend on the rows beside it). Chunks are of whole row
  // tiles of this ISA: in units of 24 channels (whole tiles on every ISA), ResNet18's 256
  // went in 8 chunks of 24 to 48, one thread's half held 136 of them, and its 14x14 layers
  // ran 1.65-1.75x faster at 2 threads than at 1 (1.85-2.1x in tiles of 8 rows).
  const int threads = ctx.num_threads();
  const int64_t row_tile = sgemm_row_tile();
  const int64_t steps = (Q + 31) / 32, units = (oc_g + row_tile - 1) / row_tile;
  const TapsSplit split(threads, s.groups, steps, units, oc_g * K >= cin_g * plane);
  const int64_t runs = split.runs, chunks = split.chunks, copies = split.copies;
  const size_t copy_bytes = align64(size_t(s.C * plane + kTapsSlack) * sizeof(float));
  const size_t taps_bytes = copy_bytes * size_t(copies);
  const size_t offsets_bytes = align64(size_t(K) * sizeof(int64_t));
  const size_t product_bytes = align64(size_t(s.OC * Q) * sizeof(float));
  const size_t ws_bytes = align64(sgemm_rows_workspace_bytes(K));
  Result<void*> mem = ctx.allocate_temp(
      taps_bytes + offsets_bytes + product_bytes + ws_bytes * size_t(threads), 64);
  if (!mem.ok()) return mem.error();
  char* base = static_cast<char*>(mem.value());
  auto copy_of = [&](int64_t c) { return reinterpret_cast<float*>(base + size_t(c) * copy_bytes); };
  float* taps = copy_of(0);
  int64_t* offsets = reinterpret_cast<int64_t*>(base + taps_bytes);
  float* product = reinterpret_cast<float*>(base + taps_bytes + offsets_bytes);
  char* ws = base + taps_bytes + offsets_bytes + product_bytes;
  L.tap_offsets(s, cin_g, offsets);
  for (int64_t c = 0; c < copies; ++c)
    std::fill(copy_of(c) + s.C * plane, copy_of(c) + s.C * plane + kTapsSlack, 0.f);
  const int64_t HW = s.H * s.W;
  const KernelContext serial = ctx.within_task();
  // On a large plane whose product the threads split by columns alone, each thread fills a
  // band of the layout's rows of every plane: the rows its runs of columns read, from the
  // rows of the input that it wrote in the layer before (see splits_pixels). With copies,
  // each fills a whole copy. Else each fills whole planes.
  const int64_t fill_bands = splits_pixels(P, threads) && chunks == 1 && s.groups == 1 &&
                                     runs % threads == 0 && L.Hq >= threads
                                 ? threads
                                 : 1;
  const int64_t planes = s.C * L.phases();
  for (int64_t n = 0; n < s.N; ++n) {
    // Rows [r0, r1) of phase plane t of the layout at `layout`.
    auto fill_rows = [&](float* layout, int64_t t, int64_t r0, int64_t r1) {
      const float* xc = x + (n * s.C + t / L.phases()) * HW;
      auto interior = [&](float* d, int64_t ih, int64_t iw, int64_t count) {
        copy_strided(d, xc + ih * s.W + iw, count, s.sw);
      };
      L.fill_rows(s, t % L.phases(), 0.f, layout + t * L.plane_size(), interior, r0, r1);
    };
    auto fill = [&](int64_t task, int) {
      if (copies > 1) {  // task: a copy
        for (int64_t t = 0; t < planes; ++t) fill_rows(copy_of(task), t, 0, L.Hq);
        return;
      }
      const int64_t t = task % planes, band = task / planes;
      fill_rows(taps, t, L.Hq * band / fill_bands, L.Hq * (band + 1) / fill_bands);
    };
    ctx.parallel_for(copies > 1 ? copies : fill_bands * planes, fill);
    float* yn = y + n * s.OC * P;
    // Each task multiplies, then copies its own part of the product out (its rows' output
    // pixels among its columns): the thread that wrote the part, while it is in its cache.
    auto multiply = [&](int64_t t, int thread) {
      const int64_t c = t % chunks, r = t / chunks % runs, g = t / (chunks * runs);
      const int64_t q0 = steps * r / runs * 32, q_end = steps * (r + 1) / runs * 32;
      const int64_t q1 = q_end < Q ? q_end : Q;
      const int64_t m0 = units * c / chunks * row_tile, m_end = units * (c + 1) / chunks * row_tile;
      const int64_t m1 = m_end < oc_g ? m_end : oc_g, row = g * oc_g + m0;
      GemmEpilogue gep = ep;
      gep.bias = bias != nullptr ? bias + row : nullptr;
      const float* layout = copy_of(copies > 1 ? thread : 0);
      sgemm_rows(serial, m1 - m0, q1 - q0, K, w + row * K, K, layout + g * cin_g * plane + q0,
                 offsets, s.KH * s.KW, product + row * Q + q0, Q, gep,
                 reinterpret_cast<float*>(ctx.thread_slice(thread, ws, ws_bytes)));
      for (int64_t m = row; m < g * oc_g + m1; ++m)
        for (int64_t oh = q0 / L.Wq; oh < s.OH && oh * L.Wq < q1; ++oh) {
          const int64_t a = q0 > oh * L.Wq ? q0 : oh * L.Wq;  // columns [a, e) of row oh
          const int64_t e = q1 < oh * L.Wq + s.OW ? q1 : oh * L.Wq + s.OW;
          if (a < e) copy_run(yn + m * P + oh * s.OW + (a - oh * L.Wq), product + m * Q + a, e - a);
        }
    };
    ctx.parallel_for(s.groups * runs * chunks, multiply);
  }
  return Error::Ok;
}
#endif

// A convolution of few input channels (a network's stem: 3 of an image), groups 1, into
// channels-last output, straight from the input (channels-last or NCHW: `cs` and `ps` are the
// strides of a channel and of a pixel along a row). An im2col row would be a run of C = 3
// floats a tap, which cost more to pack than the product. The lanes are output channels: a
// step broadcasts one input value and multiply-adds a tap's vectors of weights, for a block of
// pixels of a row at once where all their taps are inside the input, else for one pixel,
// whose taps in the padding are skipped. Both sum the taps in one order (kh, kw, c), so the
// bits do not depend on which rows a call covers.
constexpr int64_t kDirectChannels = 4;

template <int NV>
void direct_chunk(const ConvShape& s, const float* x, int64_t cs, int64_t ps, const float* w,
                  const float* bias, OutputClamp clamp, float* y, int64_t oc0, int64_t oh) {
  using simd::VecF;
  // Pixels a block (up to 8): their kMR x NV accumulators, NV weights and a broadcast in the
  // vector registers (32 with AVX-512 and NEON, 16 with AVX2 and SSE2).
#if defined(ETB_SIMD_AVX512) || defined(__aarch64__)
  constexpr int kRegisters = 32;
#else
  constexpr int kRegisters = 16;
#endif
  constexpr int kW = VecF::kWidth, kMR = std::min(8, (kRegisters - NV - 1) / NV);
  const int64_t width = s.OC - oc0 < NV * kW ? s.OC - oc0 : NV * kW;
  const int last = int(width - (NV - 1) * kW);  // lanes of the last vector
  const int64_t rs = ps * s.W;                  // a row of the input
  const VecF lo = VecF::broadcast(clamp.lo), hi = VecF::broadcast(clamp.hi);
  auto load_w = [&](const float* p, int v) {
    return v + 1 < NV ? VecF::load(p + v * kW) : VecF::load_partial(p + v * kW, last);
  };
  auto init = [&](VecF* acc) {
    for (int v = 0; v < NV; ++v) acc[v] = bias != nullptr ? load_w(bias + oc0, v) : VecF::zero();
  };
  auto finish = [&](VecF* acc, float* out) {
    for (int v = 0; v < NV; ++v) {
      const VecF r = simd::clamp(acc[v], lo, hi);
      if (v + 1 < NV)
        r.store(out + v * kW);
      else
        r.store_partial(out + v * kW, last);
    }
  };
  const int64_t ih0 = oh * s.sh - s.ph;
  const bool rows_inside = ih0 >= 0 && ih0 + (s.KH - 1) * s.dh < s.H;
  float* yr = y + oh * s.OW * s.OC + oc0;
  for (int64_t ow = 0; ow < s.OW;) {
    const int64_t iw0 = ow * s.sw - s.pw;
    const bool block_inside = rows_inside && iw0 >= 0 && ow + kMR <= s.OW &&
                              iw0 + (kMR - 1) * s.sw + (s.KW - 1) * s.dw < s.W;
    if (block_inside) {
      VecF acc[kMR][NV];
      for (int m = 0; m < kMR; ++m) init(acc[m]);
      for (int64_t kh = 0; kh < s.KH; ++kh)
        for (int64_t kw = 0; kw < s.KW; ++kw) {
          const float* xt = x + (ih0 + kh * s.dh) * rs + (iw0 + kw * s.dw) * ps;
          const float* wt = w + (kh * s.KW + kw) * s.C * s.OC + oc0;
          for (int64_t c = 0; c < s.C; ++c, xt += cs, wt += s.OC) {
            VecF wv[NV];
            for (int v = 0; v < NV; ++v) wv[v] = load_w(wt, v);
            for (int m = 0; m < kMR; ++m) {
              const VecF xv = VecF::broadcast(xt[m * s.sw * ps]);
              for (int v = 0; v < NV; ++v) acc[m][v] = simd::fma(xv, wv[v], acc[m][v]);
            }
          }
        }
      for (int m = 0; m < kMR; ++m) finish(acc[m], yr + (ow + m) * s.OC);
      ow += kMR;
      continue;
    }
    VecF acc[NV];
    init(acc);
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      const int64_t ih = ih0 + kh * s.dh;
      if (ih < 0 || ih >= s.H) continue;
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const int64_t iw = iw0 + kw * s.dw;
        if (iw < 0 || iw >= s.W) continue;
        const float* xt = x + ih * rs + iw * ps;
        const float* wt = w + (kh * s.KW + kw) * s.C * s.OC + oc0;
        for (int64_t c = 0; c < s.C; ++c, xt += cs, wt += s.OC) {
          const VecF xv = VecF::broadcast(*xt);
          for (int v = 0; v < NV; ++v) acc[v] = simd::fma(xv, load_w(wt, v), acc[v]);
        }
      }
    }
    finish(acc, yr + ow * s.OC);
    ++ow;
  }
}

// Rows [oh0, oh1) of batch item n (x and y at the item), every output channel, in chunks of
// up to 4 vectors of them.
void conv_direct(const ConvShape& s, const float* x, int64_t cs, int64_t ps, const float* w,
                 const float* bias, OutputClamp clamp, float* y, int64_t oh0, int64_t oh1) {
  constexpr int64_t kW = simd::VecF::kWidth;
  for (int64_t oh = oh0; oh < oh1; ++oh)
    for (int64_t oc0 = 0; oc0 < s.OC; oc0 += 4 * kW) {
      switch ((std::min(s.OC - oc0, 4 * kW) + kW - 1) / kW) {
        case 1: direct_chunk<1>(s, x, cs, ps, w, bias, clamp, y, oc0, oh); break;
        case 2: direct_chunk<2>(s, x, cs, ps, w, bias, clamp, y, oc0, oh); break;
        case 3: direct_chunk<3>(s, x, cs, ps, w, bias, clamp, y, oc0, oh); break;
        default: direct_chunk<4>(s, x, cs, ps, w, bias, clamp, y, oc0, oh); break;
      }
    }
}

// Run r of `runs` over [0, n) in whole units of `unit` items, the last ending at n: the runs
// differ by at most one unit.
struct UnitRun {
  int64_t begin, end;
  UnitRun(int64_t n, int64_t unit, int64_t r, int64_t runs) {
    const int64_t units = ceil_div(n, unit);
    begin = std::min(units * r / runs * unit, n);
    end = std::min(units * (r + 1) / runs * unit, n);
  }
};

// Splits output rows over the threads: per batch item, bands of whole units of `unit` rows
// (kTasksPerThread a thread, where there are units for them); f(n, oh0, oh1).
template <typename F>
void parallel_row_bands(KernelContext& ctx, const ConvShape& s, int64_t unit, F&& f) {
  const int threads = ctx.num_threads();
  const int64_t units = ceil_div(s.OH, unit);
  const int64_t bands = threads == 1 ? 1 : std::min<int64_t>(units, kTasksPerThread * threads);
  auto band = [&](int64_t t, int) {
    const UnitRun rows(s.OH, unit, t % bands, bands);
    f(t / bands, rows.begin, rows.end);
  };
  ctx.parallel_for(s.N * bands, band);
}

// A small plane's convolution (groups 1) on channels-last tensors with its weight as the
// model has it, [OC][C][KH][KW] (pipeline/layout.py keeps it so on planes of few pixels): per
// batch item the NCHW product, out^T = weight x columns [K x P], then out^T transposed into
// place. The input is transposed to planes [C x H*W] first, from which a 1x1 convolution
// (stride 1, no padding) takes its columns as they are and others build them as im2col does.
// With the pixels as the GEMM's rows, as the other paths take them, each of a 7x7 plane's
// few row tiles read all the weights again (a 3x3 512 -> 512 convolution took 1.2x as long).
// The copies are SIMD transposes (transpose.h), a run of channels a thread: gathered one
// float at a time they took MobileNetV2's 7x7 layers 1.3-1.6x as long as NCHW's product.
Error conv_channels_last_small(KernelContext& ctx, const ConvShape& s, const float* x,
                               const float* w, const float* bias, float* y) {
  const int64_t HW = s.H * s.W, P = s.OH * s.OW, K = s.C * s.KH * s.KW, ld = P;
  const bool pointwise = is_pointwise(s);
  const int64_t ld_planes = pointwise ? ld : HW;
  const size_t planes_bytes = align64(size_t(s.C * ld_planes) * sizeof(float));
  const size_t cols_bytes = pointwise ? 0 : align64(size_t(K * ld) * sizeof(float));
  const size_t product_bytes = align64(size_t(s.OC * ld) * sizeof(float));
  Result<void*> mem = ctx.allocate_temp(planes_bytes + cols_bytes + product_bytes, 64);
  if (!mem.ok()) return mem.error();
  Result<void*> ws = ctx.allocate_temp(sgemm_workspace_bytes(s.OC, P, K, ld), 64);
  if (!ws.ok()) return ws.error();
  char* base = static_cast<char*>(mem.value());
  float* planes = reinterpret_cast<float*>(base);
  float* cols = pointwise ? planes : reinterpret_cast<float*>(base + planes_bytes);
  float* product = reinterpret_cast<float*>(base + planes_bytes + cols_bytes);
  GemmEpilogue ep;
  ep.init = bias != nullptr ? GemmInit::RowBias : GemmInit::Zero;
  ep.bias = bias;
  ep.clamp = ctx.output_clamp();
  // One run of whole vectors of channels a thread, in step with the product's split by
  // output channels (each thread's share of its tasks comes first).
  constexpr int64_t kW = simd::VecF::kWidth;
  const int64_t runs = ctx.num_threads();
  for (int64_t n = 0; n < s.N; ++n) {
    const float* xn = x + n * HW * s.C;
    // A run of channels: their planes, then (but for a 1x1) their im2col rows.
    auto columns = [&](int64_t r, int) {
      const UnitRun c(s.C, kW, r, runs);
      transpose_f32(xn + c.begin, s.C, planes + c.begin * ld_planes, ld_planes, HW,
                    c.end - c.begin);
      if (!pointwise)
        for (int64_t ch = c.begin; ch < c.end; ++ch)
          im2col_channel(s, planes, ch, 0, P, 0.f, cols, ld);
    };
    ctx.parallel_for(runs, columns);
    sgemm(ctx, s.OC, P, K, w, K, cols, ld, product, ld, ep, static_cast<float*>(ws.value()));
    float* yn = y + n * P * s.OC;
    auto transpose = [&](int64_t r, int) {
      const UnitRun oc(s.OC, kW, r, runs);
      transpose_f32(product + oc.begin * ld, ld, yn + oc.begin, s.OC, oc.end - oc.begin, P);
    };
    ctx.parallel_for(runs, transpose);
  }
  return Error::Ok;
}

// Channels-last (NHWC) activations, pipeline/layout.py: input [N][H][W][C], out
// [N][OH][OW][OC], weight [KH][KW][C][OC] (dim order (2, 3, 1, 0)). The paths split the
// pixels over the threads (but where noted), so each thread reads and writes one run of
// memory of each tensor (with NCHW planes, every plane held a boundary between the threads'
// data).
// - small planes, whose weight the lowering leaves as it is: conv_channels_last_small (split
//   by channels, as NCHW);
// - pointwise (1x1, stride 1, no padding): one GEMM, pixels as rows: out = x * w + bias;
// - depthwise (groups == C == OC): depthwise_nhwc.h, a band of output rows a task;
// - few input channels (a stem): conv_direct, which also takes an NCHW input (the graph's);
// - others (groups 1): the GEMM on im2col rows, whose K = KH x KW x C columns are a run of C
//   channels a tap (the weight's rows in that order). Where the weights fit in L2 each task
//   packs a block of pixels into its thread's scratch and multiplies it there; else all the
//   rows are packed first (in parallel), then each thread multiplies them by a run of the
//   output channels.
Error conv_channels_last(KernelContext& ctx, const ConvShape& s, const float* x,
                         bool x_channels_last, const float* w, bool w_taps_last, const float* bias,
                         float* y) {
  const int64_t P = s.N * s.OH * s.OW;
  const OutputClamp clamp = ctx.output_clamp();
  if (s.groups > 1) {  // depthwise
    // Bands of row pairs where the kernel takes output rows in pairs (3 tall, stride 1): in
    // bands of single rows, a 28x28 plane's layers took as long at 2 threads as at 1.
    const int64_t unit = s.KH == 3 && s.sh == 1 && s.dh == 1 ? 2 : 1;
    parallel_row_bands(ctx, s, unit, [&](int64_t n, int64_t oh0, int64_t oh1) {
      depthwise_nhwc_f32(s, x, w, bias, clamp, y, n, oh0, oh1);
    });
    return Error::Ok;
  }
  if (!w_taps_last) return conv_channels_last_small(ctx, s, x, w, bias, y);
  if (s.C <= kDirectChannels) {
    parallel_row_bands(ctx, s, 1, [&](int64_t n, int64_t oh0, int64_t oh1) {
      const int64_t item = s.C * s.H * s.W;
      const int64_t cs = x_channels_last ? 1 : s.H * s.W, ps = x_channels_last ? s.C : 1;
      conv_direct(s, x + n * item, cs, ps, w, bias, clamp, y + n * s.OH * s.OW * s.OC, oh0, oh1);
    });
    return Error::Ok;
  }
  GemmEpilogue ep;
  ep.init = bias != nullptr ? GemmInit::ColBias : GemmInit::Zero;
  ep.bias = bias;
  ep.clamp = clamp;
  const int64_t K = s.KH * s.KW * s.C;
  if (is_pointwise(s)) {
    Result<void*> ws = ctx.allocate_temp(sgemm_workspace_bytes(P, s.OC, K, s.OC), 64);
    if (!ws.ok()) return ws.error();
    sgemm(ctx, P, s.OC, K, x, K, w, s.OC, y, s.OC, ep, static_cast<float*>(ws.value()));
    return Error::Ok;
  }
  // Row p of the im2col matrix (output pixel p of the whole batch): tap (kh, kw)'s C channels
  // at columns (kh KW + kw) C, zeros where the tap falls in the padding.
  auto pack_row = [&](int64_t p, float* row) {
    const int64_t n = p / (s.OH * s.OW), oh = p / s.OW % s.OH, ow = p % s.OW;
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
      for (int64_t kw = 0; kw < s.KW; ++kw, row += s.C) {
        const int64_t iw = ow * s.sw - s.pw + kw * s.dw;
        if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W)
          std::fill(row, row + s.C, 0.f);
        else
          copy_run(row, x + ((n * s.H + ih) * s.W + iw) * s.C, s.C);
      }
    }
  };
  const int threads = ctx.num_threads();
  const int64_t weight_bytes = K * s.OC * int64_t(sizeof(float));
  if (weight_bytes > (int64_t(1) << 20)) {
    // Big weights (ResNet18's 14x14 layers): blocks of rows would each read them all again;
    // pack every row, then a GEMM whose blocking keeps a slice of them in L2.
    Result<void*> rows = ctx.allocate_temp(size_t(P * K) * sizeof(float), 64);
    if (!rows.ok()) return rows.error();
    float* a = static_cast<float*>(rows.value());
    parallel_range(ctx, P, K, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) pack_row(p, a + p * K);
    });
    if (threads > 1) {
      // With threads, each takes a run of the output channels (whole vectors on any ISA, so
      // that the last columns are the same and every sum is the one-thread sum): it reads its
      // share of the weights, and all of the rows. Split by rows, every thread read all the
      // weights: ResNet18 at 2 threads took 1.08x as long where the threads' cores share no
      // cache, 1.01x where they do.
      const int64_t runs = threads, widest = ceil_div(ceil_div(s.OC, 16), runs) * 16;
      const size_t ws_bytes = align64(sgemm_workspace_bytes(P, widest, K, s.OC));
      Result<void*> ws = ctx.allocate_temp(ws_bytes * size_t(threads), 64);
      if (!ws.ok()) return ws.error();
      const KernelContext serial = ctx.within_task();
      auto run = [&](int64_t r, int thread) {
        const UnitRun oc(s.OC, 16, r, runs);
        GemmEpilogue part = ep;
        if (bias != nullptr) part.bias = bias + oc.begin;
        sgemm(serial, P, oc.end - oc.begin, K, a, K, w + oc.begin, s.OC, y + oc.begin, s.OC, part,
              reinterpret_cast<float*>(ctx.thread_slice(thread, ws.value(), ws_bytes)));
      };
      ctx.parallel_for(runs, run);
      return Error::Ok;
    }
    Result<void*> ws = ctx.allocate_temp(sgemm_workspace_bytes(P, s.OC, K, s.OC), 64);
    if (!ws.ok()) return ws.error();
    sgemm(ctx, P, s.OC, K, a, K, w, s.OC, y, s.OC, ep, static_cast<float*>(ws.value()));
    return Error::Ok;
  }
  // Blocks of whole row tiles, of about 64 KB of rows (at least one tile).
  const int64_t tile = sgemm_row_tile();
  int64_t block = (int64_t(64) << 10) / (K * int64_t(sizeof(float))) / tile * tile;
  if (block < tile) block = tile;
  if (block > P) block = P;
  const int64_t blocks = (P + block - 1) / block;
  const size_t rows_bytes = align64(size_t(block * K) * sizeof(float));
  const size_t ws_bytes = align64(sgemm_workspace_bytes(block, s.OC, K, s.OC));
  Result<void*> tmp = ctx.allocate_temp((rows_bytes + ws_bytes) * size_t(threads), 64);
  if (!tmp.ok()) return tmp.error();
  const KernelContext serial = ctx.within_task();
  auto multiply = [&](int64_t t, int thread) {
    const int64_t p0 = t * block, rows = P - p0 < block ? P - p0 : block;
    char* mine = ctx.thread_slice(thread, tmp.value(), rows_bytes + ws_bytes);
    float* a = reinterpret_cast<float*>(mine);
    for (int64_t r = 0; r < rows; ++r) pack_row(p0 + r, a + r * K);
    sgemm(serial, rows, s.OC, K, a, K, w, s.OC, y + p0 * s.OC, s.OC, ep,
          reinterpret_cast<float*>(mine + rows_bytes));
  };
  ctx.parallel_for(blocks, multiply);
  return Error::Ok;
}

}  // namespace

Error convolution_out(KernelContext& ctx, const Tensor& input, const Tensor& weight,
                      const Tensor* bias, Span<const int64_t> stride, Span<const int64_t> padding,
                      Span<const int64_t> dilation, bool transposed,
                      Span<const int64_t> output_padding, int64_t groups, Tensor& out) {
  if (transposed)
    return conv_transpose(ctx, input, weight, bias, stride, padding, dilation, output_padding,
                          groups, out);
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
  if (input.is_channels_last() || out.is_channels_last() || !weight.is_contiguous()) {
    static constexpr uint8_t kTapsLast[] = {2, 3, 1, 0};
    bool taps_last = weight.dim() == 4;
    for (int d = 0; taps_last && d < 4; ++d)
      taps_last = weight.dim_order()[size_t(d)] == kTapsLast[d];
    const bool stem = input.is_contiguous() && groups == 1 && s.C <= kDirectChannels;
    // The weight as the model has it: the small-plane product, groups 1, channels-last input.
    const bool small = weight.is_contiguous() && groups == 1 && input.is_channels_last();
    if (!(input.is_channels_last() || stem) || !out.is_channels_last() || !(taps_last || small))
      return fail(Error::NotSupported,
                  "convolution: channels-last needs input and out in dim order (0, 2, 3, 1) and "
                  "the weight in (2, 3, 1, 0) (or contiguous, with groups 1), the input "
                  "contiguous only with at most %lld channels",
                  (long long)kDirectChannels);
    if (groups != 1 && !(groups == s.C && s.OC == s.C))
      return fail(Error::NotSupported,
                  "convolution: channels-last takes groups 1 or depthwise (one output channel "
                  "per input channel), got groups=%lld",
                  (long long)groups);
    if (out.numel() == 0) return Error::Ok;
    return conv_channels_last(ctx, s, x, input.is_channels_last(), w, taps_last,
                              bias != nullptr ? bias->data_as<float>() : nullptr, y);
  }
  if (out.numel() == 0) return Error::Ok;
  if (cin_g == 1 && groups > 1) {
    // Depthwise. On a large plane (splits_pixels) each thread takes a band of output rows of
    // every channel (one band a thread, in runs of channels, so a thread's share of the tasks
    // is its band): it reads the rows that it wrote in the product before (whose threads
    // split its columns) and writes those it reads in the next. Elsewhere the threads split
    // runs of channels. A band's outputs are computed as the whole plane's are, so the bits
    // do not depend on the threads.
    const int threads = ctx.num_threads();
    int64_t bands = splits_pixels(s.H * s.W, threads) && s.OH >= 2 * int64_t(threads) ? threads : 1;
    // Band b: output rows from r0 on, read from input rows from i0 on; its shape's H rows
    // (ph: the padding above them, in the first band alone; padded_rows: that below).
    struct Band {
      int64_t r0, i0;
      ConvShape shape;
    };
    auto band_of = [&](int64_t b) {
      Band d;
      d.r0 = s.OH * b / bands;
      const int64_t r1 = s.OH * (b + 1) / bands;
      const int64_t top = d.r0 * s.sh - s.ph, last = (r1 - 1) * s.sh - s.ph + (s.KH - 1) * s.dh;
      d.i0 = top > 0 ? top : 0;
      d.shape = s;
      d.shape.N = 1;
      d.shape.OH = r1 - d.r0;
      d.shape.ph = d.i0 - top;
      d.shape.H = (last + 1 < s.H ? last + 1 : s.H) - d.i0;
      return d;
    };
    for (int64_t b = 0; b < bands; ++b)
      if (band_of(b).shape.H < 1) bands = 1;  // a band of padding alone: the whole plane
    size_t per_thread = 0;
    for (int64_t b = 0; b < bands; ++b)
      per_thread =
          std::max(per_thread, align64(depthwise_conv_f32_scratch_bytes(band_of(b).shape)));
    const int64_t block = depthwise_conv_f32_channel_block(band_of(0).shape);
    const int64_t tasks = threads == 1 ? 1 : kTasksPerThread * threads / bands;  // a band's
    const int64_t run = ((s.C + tasks - 1) / tasks + block - 1) / block * block;
    const int64_t runs = (s.C + run - 1) / run, mult = s.OC / s.C;
    // Each thread's scratch, its padding zeroed for the band its tasks are in.
    Result<void*> scratch = ctx.allocate_temp(per_thread * size_t(threads), 64);
    if (!scratch.ok()) return scratch.error();
    ThreadScratch scratches(ctx, scratch.value(), per_thread, per_thread);
    const float* bd = bias != nullptr ? bias->data_as<float>() : nullptr;
    auto channels = [&](int64_t task, int thread) {
      const int64_t c0 = (task % runs) * run, b = task / runs % bands, n = task / (runs * bands);
      Band d = band_of(b);
      char* mine = scratches.slice(thread, b, depthwise_conv_f32_scratch_bytes(d.shape));
      d.shape.C = d.shape.groups = run < s.C - c0 ? run : s.C - c0;
      d.shape.OC = d.shape.C * mult;
      depthwise_conv_f32_strided(d.shape, x + (n * s.C + c0) * s.H * s.W + d.i0 * s.W, s.H * s.W,
                                 w + c0 * mult * s.KH * s.KW,
                                 bd != nullptr ? bd + c0 * mult : nullptr, ctx.output_clamp(),
                                 y + (n * s.OC + c0 * mult) * P + d.r0 * s.OW, P, mine);
    };
    ctx.parallel_for(s.N * bands * runs, channels);
    return Error::Ok;
  }
  const int64_t oc_g = s.OC / groups;
  const bool pointwise = is_pointwise(s);
  const int64_t K = cin_g * s.KH * s.KW;
  // Each group is out[oc_g x P] = weight[oc_g x K] * columns[K x P], bias per row.
  GemmEpilogue ep;
  ep.init = bias != nullptr ? GemmInit::RowBias : GemmInit::Zero;
  ep.clamp = ctx.output_clamp();
  const float* b = bias != nullptr ? bias->data_as<float>() : nullptr;
  if (pointwise) {
    // Hosted, few output channels over many input channels take the depth in halves (see
    // sgemm_splits_depth). Bare metal has no threads to gain from it, and its scratch region
    // is sized for the plain product.
#if defined(ETB_BARE_METAL)
    const bool halves = false;
#else
    // Not on a large plane, whose threads split the columns (splits_pixels); at any thread
    // count, as the halves sum in another order.
    const bool halves = sgemm_splits_depth(oc_g, P, K) && P < kPixelSplitMin;
#endif
    const size_t ws_bytes =
        halves ? sgemm_depth_halves_workspace_bytes(oc_g, P, K, P, ctx.num_threads())
               : sgemm_workspace_bytes(oc_g, P, K, P);
    Result<void*> ws = ctx.allocate_temp(ws_bytes, 64);
    if (!ws.ok()) return ws.error();
    auto product = halves ? sgemm_depth_halves : sgemm;
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t g = 0; g < groups; ++g) {
        ep.bias = b != nullptr ? b + g * oc_g : nullptr;
        product(ctx, oc_g, P, K, w + g * oc_g * K, K, x + (n * s.C + g * cin_g) * s.H * s.W, P,
                y + (n * s.OC + g * oc_g) * P, P, ep, static_cast<float*>(ws.value()));
      }
    return Error::Ok;
  }
#if !defined(ETB_BARE_METAL)
  if (takes_taps_path(s)) return conv_taps(ctx, s, x, w, b, ep, y);
#endif
  // im2col in column tiles of at most 256 KB, and 2 MB over all the threads' tiles.
  const int threads = ctx.num_threads();
  const int64_t tile_bytes = threads <= 8 ? int64_t(256) << 10 : (int64_t(2) << 20) / threads;
  int64_t pc = tile_bytes / int64_t(sizeof(float)) / K;
  pc = pc < 32 ? 32 : (pc / 32) * 32;
  // With threads, kWeightPassesPerThread tiles a thread where the plane has columns for them
  // (each tile reads all the weights again).
  const int64_t share = (P / (kWeightPassesPerThread * threads) + 31) / 32 * 32;
  if (threads > 1 && share >= 32 && share < pc) pc = share;
#if !defined(ETB_BARE_METAL)
  // Hosted, a small plane (ResNet18's 7x7 and 14x14 layers) is one tile: every extra tile
  // reads all the weights again, and a plane's columns of up to 1 MB still stay in L2. (Bare
  // metal keeps the tiles' bound: its scratch region is sized for them.)
  if (P * K * int64_t(sizeof(float)) <= int64_t(1) << 20) pc = P;
#endif
  if (pc > P) pc = P;
  const int64_t tiles = (P + pc - 1) / pc;
  // Hosted, a tile's rows of the im2col matrix lie a whole number of cache lines apart (a
  // 14x14 plane's 196 columns 208 floats apart): the GEMM then reads its B in place, where rows
  // off the line boundary had it copy each depth block into panels first (at 2 threads, a loop
  // more a block). Bare metal keeps the rows packed: its scratch region is sized for them.
  auto row_stride = [](int64_t cols) {
#if defined(ETB_BARE_METAL)
    return cols;
#else
    return (cols + 15) / 16 * 16;
#endif
  };
  // The GEMM's workspace for a whole tile of columns and for the last, narrower one.
  const int64_t last_cols = P - (tiles - 1) * pc;
  const size_t gemm_ws = std::max(sgemm_workspace_bytes(oc_g, pc, K, row_stride(pc)),
                                  sgemm_workspace_bytes(oc_g, last_cols, K, row_stride(last_cols)));
  if (threads == 1 || tiles >= 2 * threads) {
    // Many tiles: each task packs one column tile into its thread's buffer and multiplies it
    // there, so the whole convolution is one parallel loop (a tile's columns are computed the
    // same way on any thread).
    const size_t col_bytes = align64(size_t(K * row_stride(pc)) * sizeof(float));
    const size_t ws_bytes = align64(gemm_ws);
    Result<void*> tmp = ctx.allocate_temp((col_bytes + ws_bytes) * size_t(threads), 64);
    if (!tmp.ok()) return tmp.error();
    const KernelContext serial = ctx.within_task();
    auto tile = [&](int64_t t, int thread) {
      const int64_t p0 = (t % tiles) * pc, g = (t / tiles) % groups, n = t / (tiles * groups);
      const int64_t cols = P - p0 < pc ? P - p0 : pc;
      char* mine = ctx.thread_slice(thread, tmp.value(), col_bytes + ws_bytes);
      float* col = reinterpret_cast<float*>(mine);
      const float* xg = x + (n * s.C + g * cin_g) * s.H * s.W;
      const int64_t ld = row_stride(cols);
      for (int64_t c = 0; c < cin_g; ++c) im2col_channel(s, xg, c, p0, cols, 0.f, col, ld);
      GemmEpilogue tep = ep;
      tep.bias = b != nullptr ? b + g * oc_g : nullptr;
      sgemm(serial, oc_g, cols, K, w + g * oc_g * K, K, col, ld, y + (n * s.OC + g * oc_g) * P + p0,
            P, tep, reinterpret_cast<float*>(mine + col_bytes));
    };
    ctx.parallel_for(s.N * groups * tiles, tile);
    return Error::Ok;
  }
  // Few tiles (a small output plane): the threads split each tile's packing by channels and
  // its product by rows.
  Result<void*> tmp = ctx.allocate_temp(size_t(K * row_stride(pc)) * sizeof(float));
  if (!tmp.ok()) return tmp.error();
  float* col = static_cast<float*>(tmp.value());
  Result<void*> ws_mem = ctx.allocate_temp(gemm_ws, 64);
  if (!ws_mem.ok()) return ws_mem.error();
  float* ws = static_cast<float*>(ws_mem.value());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + (n * s.C + g * cin_g) * s.H * s.W;
      float* yg = y + (n * s.OC + g * oc_g) * P;
      ep.bias = b != nullptr ? b + g * oc_g : nullptr;
      for (int64_t p0 = 0; p0 < P; p0 += pc) {
        const int64_t cols = P - p0 < pc ? P - p0 : pc;
        const int64_t ld = row_stride(cols);
        auto pack = [&](int64_t c, int) { im2col_channel(s, xg, c, p0, cols, 0.f, col, ld); };
        ctx.parallel_for(cin_g, pack);
        sgemm(ctx, oc_g, cols, K, w + g * oc_g * K, K, col, ld, yg + p0, P, ep, ws);
      }
    }
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
