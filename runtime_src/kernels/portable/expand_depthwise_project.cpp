// etb::expand_depthwise_project.out: a MobileNetV2-style block of three Float convolutions run
// as one kernel (pipeline/blocks.py holds the reference): a pointwise convolution that widens
// C channels to E, a depthwise convolution over the E channels and a pointwise projection to
// O channels, the first two each followed by a clamp (ReLU6 in MobileNetV2), the projection by
// the activation fused into the call (KernelContext::output_clamp). etb::depthwise_project.out
// is the same without the expansion (a depthwise-separable convolution).
//
// As the int8 kernel (kernels/quantized/expand_depthwise_project.cpp) does, this one goes down
// the output a band of rows at a time, each band's expanded and filtered rows in a thread's
// scratch, so the E-channel tensors (4.8 MB at MobileNetV2's 112x112) never reach the
// program's memory and each thread keeps the rows it made; successive bands of a thread share
// the expanded rows under both.
//
// Float sums depend on their order, so every output is summed the same way whatever the bands
// and threads: the products (sgemm) sum each column in one order, except for the last
// columns of a call that are not a whole vector (dot products, in another order). Every
// product call therefore spans rows whose pixels fill whole vectors, except a call that ends
// at the plane's last row, so that the same last pixels of the plane, and only they, are dot
// products, as in one call over the whole plane.
#include <cstring>
#include <numeric>

#include "kernels/portable/depthwise.h"
#include "kernels/portable/gemm.h"
#include "kernels/portable/geometry.h"
#include "kernels/simd.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

constexpr int64_t kVector = simd::VecF::kWidth;

// Rows of `width` pixels that fill whole vectors: a product call starting and ending on
// multiples of it has no dot-product columns.
int64_t whole_vector_rows(int64_t width) {
  return kVector / std::gcd(width, kVector);
}

int64_t round_down(int64_t v, int64_t unit) {
  return (v >= 0 ? v : v - unit + 1) / unit * unit;
}

int64_t round_up(int64_t v, int64_t unit) {
  return round_down(v + unit - 1, unit);
}

using Block = SeparableBlock;  // (padding rows: zeros)

bool is_float(const Tensor& t) {
  return t.dtype() == ScalarType::Float;
}

// Checks a weight's dtype and shape [d0, d1, d2, d2].
Error check_weight(const Tensor& w, const char* op, const char* name, int64_t d0, int64_t d1,
                   int64_t d2) {
  if (!is_float(w) || w.dim() != 4 || w.size(0) != d0 || w.size(1) != d1 || w.size(2) != d2 ||
      w.size(3) != d2)
    return fail(Error::InvalidArgument,
                "%s: %s must be a Float tensor of shape [%lld, %lld, %lld, %lld]", op, name,
                (long long)d0, (long long)d1, (long long)d2, (long long)d2);
  return Error::Ok;
}

Error check_bias(const Tensor* b, const char* op, const char* name, int64_t channels) {
  if (b != nullptr && (!is_float(*b) || b->dim() != 1 || b->size(0) != channels))
    return fail(Error::InvalidArgument, "%s: %s must be a Float tensor of %lld elements", op, name,
                (long long)channels);
  return Error::Ok;
}

// A clamp from its bounds (NaN bounds are refused: a clamp to NaN has no meaning).
Error clamp_of(double lo, double hi, const char* op, const char* name, OutputClamp* c) {
  if (!(lo <= hi))
    return fail(Error::InvalidArgument, "%s: %s_min (%g) must not exceed %s_max (%g)", op, name, lo,
                name, hi);
  c->lo = float(lo);
  c->hi = float(hi);
  return Error::Ok;
}

// One convolution of the block.
struct Conv {
  const Tensor* weight;
  const Tensor* bias;
  OutputClamp clamp;
};

GemmEpilogue epilogue_of(const Tensor* bias, OutputClamp clamp) {
  GemmEpilogue e;
  e.init = bias != nullptr ? GemmInit::RowBias : GemmInit::Zero;
  e.bias = bias != nullptr ? bias->data_as<float>() : nullptr;
  e.clamp = clamp;
  return e;
}

// The block's kernel; `expand` nullptr: none (the input's channels are the depthwise
// convolution's). `op` names the kernel in messages.
Error run_block(KernelContext& ctx, const char* op, const Tensor& input, const Conv* expand,
                const Conv& depthwise, Span<const int64_t> stride, Span<const int64_t> padding,
                const Conv& project, Tensor& out) {
  if (!is_float(input) || input.dim() != 4 || !is_float(out))
    return fail(Error::InvalidArgument, "%s: input must be a 4-d Float tensor, out Float", op);
  const Tensor& wd_t = *depthwise.weight;
  const Tensor& wp_t = *project.weight;
  Block b{};
  b.N = input.size(0);
  b.C = input.size(1);
  b.H = input.size(2);
  b.W = input.size(3);
  b.E = expand != nullptr ? expand->weight->size(0) : b.C;
  b.O = wp_t.dim() == 4 ? wp_t.size(0) : 0;
  b.K = wd_t.dim() == 4 ? wd_t.size(2) : 0;
  if (!square_item(stride, &b.S) || !square_item(padding, &b.pad) || b.S < 1 || b.pad < 0 ||
      b.pad >= b.K || b.H + 2 * b.pad < b.K || b.W + 2 * b.pad < b.K || b.C < 1 || b.E < 1)
    return fail(Error::InvalidArgument,
                "%s: the depthwise convolution needs one stride (at least 1) and one padding "
                "(below the kernel size) for both axes, and a kernel that fits the padded input",
                op);
  if (expand != nullptr) {
    ETB_TRY(check_weight(*expand->weight, op, "expand_weight", b.E, b.C, 1));
    ETB_TRY(check_bias(expand->bias, op, "expand_bias", b.E));
  }
  ETB_TRY(check_weight(wd_t, op, "depthwise_weight", b.E, 1, b.K));
  ETB_TRY(check_bias(depthwise.bias, op, "depthwise_bias", b.E));
  ETB_TRY(check_weight(wp_t, op, "project_weight", b.O, b.E, 1));
  ETB_TRY(check_bias(project.bias, op, "project_bias", b.O));
  b.OH = (b.H + 2 * b.pad - b.K) / b.S + 1;
  b.OW = (b.W + 2 * b.pad - b.K) / b.S + 1;
  const int64_t osz[4] = {b.N, b.O, b.OH, b.OW};
  ETB_TRY(out.resize(Span<const int64_t>(osz, 4)));
  if (out.numel() == 0) return Error::Ok;

  // Output rows go in units of `unit_out` and expanded rows in units of `unit_in` (whole
  // vectors of pixels, see the top of the file); a band is at most `rows` output rows.
  const int64_t unit_out = whole_vector_rows(b.OW), unit_in = whole_vector_rows(b.W);
  auto band_bytes = [&](int64_t r) {
    return b.E * int64_t(sizeof(float)) * ((b.in_rows(r) + 2 * (unit_in - 1)) * b.W + r * b.OW);
  };
  int64_t band_units = 1;
  while (band_units * unit_out < b.OH &&
         band_bytes((band_units + 1) * unit_out) <= kSeparableBandBytes)
    ++band_units;
  const int64_t rows = band_units * unit_out < b.OH ? band_units * unit_out : b.OH;
  // A band's expanded rows, from a row on a unit boundary to one past its last row rounded up
  // to one: each plane `pitch` floats. Its filtered rows: planes of `fi_stride` floats (whole
  // cache lines, so that the projection reads them in place).
  const int64_t pitch = (b.in_rows(rows) + 2 * (unit_in - 1)) * b.W;
  const int64_t fi_stride = round_up(rows * b.OW, 16);
  size_t dw_bytes = 0, ws_bytes = 0;
  for (int64_t r = 1; r <= rows; ++r) {
    const size_t d = depthwise_conv_f32_scratch_bytes(b.band(r));
    if (d > dw_bytes) dw_bytes = d;
    const size_t p = sgemm_workspace_bytes(b.O, r * b.OW, b.E, fi_stride);
    if (p > ws_bytes) ws_bytes = p;
  }
  if (expand != nullptr)
    for (int64_t r = 1; r <= pitch / b.W; ++r) {
      const size_t e = sgemm_workspace_bytes(b.E, r * b.W, b.C, b.H * b.W);
      if (e > ws_bytes) ws_bytes = e;
    }
  const size_t ex_bytes = align64(size_t(b.E * pitch) * sizeof(float));
  const size_t fi_bytes = align64(size_t(b.E * fi_stride) * sizeof(float));
  dw_bytes = align64(dw_bytes);
  const size_t per_thread = ex_bytes + fi_bytes + dw_bytes + align64(ws_bytes);
  const int threads = ctx.num_threads();
  Result<void*> tm = ctx.allocate_temp(per_thread * size_t(threads), 64);
  if (!tm.ok()) return tm.error();

  // One run of whole units a thread (of each image), as the int8 kernel's.
  const int64_t units = ceil_div(b.OH, unit_out);
  const int64_t runs = threads < units ? threads : units;
  const int64_t HW = b.H * b.W, OP = b.OH * b.OW;
  const float* x = input.data_as<float>();
  const float* we = expand != nullptr ? expand->weight->data_as<float>() : nullptr;
  const float* wd = wd_t.data_as<float>();
  const float* bd = depthwise.bias != nullptr ? depthwise.bias->data_as<float>() : nullptr;
  const float* wp = wp_t.data_as<float>();
  const GemmEpilogue expansion =
      expand != nullptr ? epilogue_of(expand->bias, expand->clamp) : GemmEpilogue{};
  const GemmEpilogue projection = epilogue_of(project.bias, ctx.output_clamp());
  const KernelContext alone = ctx.within_task();
  float* y = out.data_as<float>();

  auto run = [&](int64_t task, int thread) {
    const int64_t n = task / runs, r = task % runs;
    const int64_t u_begin = units * r / runs, u_end = units * (r + 1) / runs;
    char* mine = ctx.thread_slice(thread, tm.value(), per_thread);
    float* ex = reinterpret_cast<float*>(mine);
    float* fi = reinterpret_cast<float*>(mine + ex_bytes);
    void* dw_temp = mine + ex_bytes + fi_bytes;
    float* ws = reinterpret_cast<float*>(mine + ex_bytes + fi_bytes + dw_bytes);
    const float* xn = x + n * b.C * HW;
    // Rows [lo, hi) of the band whose first buffered row is `base` are zeros (padding).
    auto zero_rows = [&](int64_t base, int64_t lo, int64_t hi) {
      for (int64_t e = 0; e < b.E && lo < hi; ++e)
        std::memset(ex + e * pitch + (lo - base) * b.W, 0, size_t((hi - lo) * b.W) * sizeof(float));
    };
    // The run in the fewest bands of at most `rows` rows, of whole units as even as they come.
    const int64_t bands = ceil_div(u_end - u_begin, band_units);
    int64_t base = 0, held = 0;  // the buffer holds rows [base, held) (of the image, or padding)
    int64_t dw_rows = -1;        // the band height whose scratch layout dw_temp holds
    for (int64_t i = 0; i < bands; ++i) {
      const int64_t v0 = u_begin + (u_end - u_begin) * i / bands;
      const int64_t v1 = u_begin + (u_end - u_begin) * (i + 1) / bands;
      const int64_t r0 = v0 * unit_out, r1 = v1 * unit_out < b.OH ? v1 * unit_out : b.OH;
      const int64_t nb = r1 - r0;
      const int64_t i0 = r0 * b.S - b.pad, i1 = i0 + b.in_rows(nb);  // expanded rows read
      const int64_t new_base = round_down(i0, unit_in);
      if (i == 0 || held <= new_base) {
        held = new_base;
      } else if (new_base > base) {  // keep the rows this band shares with the last one
        for (int64_t e = 0; e < b.E; ++e)
          std::memmove(ex + e * pitch, ex + e * pitch + (new_base - base) * b.W,
                       size_t((held - new_base) * b.W) * sizeof(float));
      }
      base = new_base;
      if (held < i1) {
        const int64_t from = held, img0 = from > 0 ? from : 0, img1 = i1 < b.H ? i1 : b.H;
        zero_rows(base, from, img0 < i1 ? img0 : i1);
        zero_rows(base, img1 > from ? img1 : from, i1);
        if (img1 > img0 && expand != nullptr) {
          // From a unit boundary to the next one (or the plane's end): rows already held are
          // made again, the same values.
          const int64_t j0 = round_down(img0, unit_in);
          const int64_t j1 = round_up(img1, unit_in) < b.H ? round_up(img1, unit_in) : b.H;
          sgemm(alone, b.E, (j1 - j0) * b.W, b.C, we, b.C, xn + j0 * b.W, HW,
                ex + (j0 - base) * b.W, pitch, expansion, ws);
          held = j1 > i1 ? j1 : i1;
        } else {
          if (img1 > img0)  // the input's own rows
            for (int64_t e = 0; e < b.E; ++e)
              std::memcpy(ex + e * pitch + (img0 - base) * b.W, xn + e * HW + img0 * b.W,
                          size_t((img1 - img0) * b.W) * sizeof(float));
          held = i1;
        }
      }
      const ConvShape s = b.band(nb);
      if (nb != dw_rows) {  // another band height: another layout, whose padding is zeros
        std::memset(dw_temp, 0, depthwise_conv_f32_scratch_bytes(s));
        dw_rows = nb;
      }
      depthwise_conv_f32_strided(s, ex + (i0 - base) * b.W, pitch, wd, bd, depthwise.clamp, fi,
                                 fi_stride, dw_temp);
      sgemm(alone, b.O, nb * b.OW, b.E, wp, b.E, fi, fi_stride, y + n * b.O * OP + r0 * b.OW, OP,
            projection, ws);
    }
  };
  ctx.parallel_for(b.N * runs, run);
  return Error::Ok;
}

Conv conv_of(const Tensor& weight, const Tensor* bias) {
  return Conv{&weight, bias, OutputClamp()};
}

}  // namespace

Error expand_depthwise_project_out(KernelContext& ctx, const Tensor& input,
                                   const Tensor& expand_weight, const Tensor* expand_bias,
                                   double expand_min, double expand_max,
                                   const Tensor& depthwise_weight, const Tensor* depthwise_bias,
                                   Span<const int64_t> stride, Span<const int64_t> padding,
                                   double depthwise_min, double depthwise_max,
                                   const Tensor& project_weight, const Tensor* project_bias,
                                   Tensor& out) {
  const char* op = "etb::expand_depthwise_project";
  Conv expand = conv_of(expand_weight, expand_bias),
       depthwise = conv_of(depthwise_weight, depthwise_bias);
  if (expand_weight.dim() != 4)
    return fail(Error::InvalidArgument, "%s: expand_weight must be 4-d", op);
  ETB_TRY(clamp_of(expand_min, expand_max, op, "expand", &expand.clamp));
  ETB_TRY(clamp_of(depthwise_min, depthwise_max, op, "depthwise", &depthwise.clamp));
  return run_block(ctx, op, input, &expand, depthwise, stride, padding,
                   conv_of(project_weight, project_bias), out);
}

Error depthwise_project_out(KernelContext& ctx, const Tensor& input, const Tensor& depthwise_weight,
                            const Tensor* depthwise_bias, Span<const int64_t> stride,
                            Span<const int64_t> padding, double depthwise_min, double depthwise_max,
                            const Tensor& project_weight, const Tensor* project_bias, Tensor& out) {
  const char* op = "etb::depthwise_project";
  Conv depthwise = conv_of(depthwise_weight, depthwise_bias);
  ETB_TRY(clamp_of(depthwise_min, depthwise_max, op, "depthwise", &depthwise.clamp));
  return run_block(ctx, op, input, nullptr, depthwise, stride, padding,
                   conv_of(project_weight, project_bias), out);
}

}  // namespace native
}  // namespace etb
