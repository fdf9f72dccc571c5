// Kernels for ops that ExecuTorch's exporter emits and etbuild's pipeline does not
// (ops_yaml/executorch_compat.yaml): inference batch norm and the dim-order clone (which
// etbuild's channels-last programs use too: pipeline/layout.py).
#include <cmath>
#include <type_traits>

#include "kernels/portable/transpose.h"
#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {

Error native_batch_norm_legit_no_training_out(KernelContext&, const Tensor& input,
                                              const Tensor* weight, const Tensor* bias,
                                              const Tensor& running_mean,
                                              const Tensor& running_var, double momentum,
                                              double eps, Tensor& out0, Tensor& out1,
                                              Tensor& out2) {
  (void)momentum;
  if (input.dim() < 2) return fail(Error::InvalidArgument, "batch_norm: input must be >= 2-d");
  const int64_t C = input.size(1);
  auto check_c = [C](const Tensor* t) { return t == nullptr || (t->dim() == 1 && t->size(0) == C); };
  if (!check_c(weight) || !check_c(bias) || !check_c(&running_mean) || !check_c(&running_var))
    return fail(Error::InvalidArgument, "batch_norm: parameters must have %lld elements",
                (long long)C);
  ETB_TRY(out0.resize(input.sizes()));
  // Inference mode saves no statistics: out1 and out2 are empty.
  const int64_t empty = 0;
  if (out1.dim() == 1) ETB_TRY(out1.resize(Span<const int64_t>(&empty, 1)));
  if (out2.dim() == 1) ETB_TRY(out2.resize(Span<const int64_t>(&empty, 1)));
  const int64_t N = input.size(0);
  const int64_t inner = C == 0 ? 0 : input.numel() / (N * C);
  const float* x = input.data_as<float>();
  float* y = out0.data_as<float>();
  for (int64_t c = 0; c < C; ++c) {
    const float scale = float((weight ? weight->data_as<float>()[c] : 1.f) /
                              std::sqrt(double(running_var.data_as<float>()[c]) + eps));
    const float shift =
        (bias ? bias->data_as<float>()[c] : 0.f) - running_mean.data_as<float>()[c] * scale;
    for (int64_t n = 0; n < N; ++n) {
      const float* xs = x + (n * C + c) * inner;
      float* ys = y + (n * C + c) * inner;
      for (int64_t i = 0; i < inner; ++i) ys[i] = xs[i] * scale + shift;
    }
  }
  return Error::Ok;
}

namespace {

// dst[j][i] = src[i][j] for an R x Q block of an [R x ld_src] matrix into a [Q x ld_dst] one,
// in tiles that keep both sides' lines in L1; Float's through registers (transpose.h).
template <typename T>
void transpose_block(const T* src, int64_t ld_src, T* dst, int64_t ld_dst, int64_t R, int64_t Q) {
  if constexpr (std::is_same_v<T, float>) {
    transpose_f32(src, ld_src, dst, ld_dst, R, Q);
  } else {
    constexpr int64_t kTile = 16;
    for (int64_t i0 = 0; i0 < R; i0 += kTile)
      for (int64_t j0 = 0; j0 < Q; j0 += kTile) {
        const int64_t i1 = i0 + kTile < R ? i0 + kTile : R, j1 = j0 + kTile < Q ? j0 + kTile : Q;
        for (int64_t j = j0; j < j1; ++j)
          for (int64_t i = i0; i < i1; ++i) dst[j * ld_dst + i] = src[i * ld_src + j];
      }
  }
}

// NCHW <-> NHWC: per batch item a transpose of [C x HW] (to channels-last) or [HW x C]. The
// threads split the pixels, so each writes (or reads) one run of the channels-last side.
template <typename T>
void convert_channels_last(KernelContext& ctx, const Tensor& self, Tensor& out, bool to_last) {
  const int64_t N = self.size(0), C = self.size(1), HW = self.size(2) * self.size(3);
  const T* x = self.data_as<T>();
  T* y = out.data_as<T>();
  constexpr int64_t kPixels = 64;
  const int64_t blocks = (HW + kPixels - 1) / kPixels;
  auto block = [&](int64_t t, int) {
    const int64_t n = t / blocks, p0 = t % blocks * kPixels;
    const int64_t count = HW - p0 < kPixels ? HW - p0 : kPixels;
    if (to_last)
      transpose_block(x + n * C * HW + p0, HW, y + (n * HW + p0) * C, C, C, count);
    else
      transpose_block(x + (n * HW + p0) * C, C, y + n * C * HW + p0, HW, count, C);
  };
  ctx.parallel_for(N * blocks, block);
}

}  // namespace

Error clone_dim_order_out(KernelContext& ctx, const Tensor& self, bool non_blocking,
                          Optional<Span<const int64_t>> dim_order, Tensor& out) {
  (void)non_blocking;
  const char* op = "_clone_dim_order";
  const Span<const uint8_t> have = out.dim_order();
  if (dim_order.has_value) {
    if (int(dim_order.value.size()) != self.dim())
      return fail(Error::InvalidArgument, "%s: dim_order has %zu entries for a %d-d tensor", op,
                  dim_order.value.size(), self.dim());
    for (size_t i = 0; i < dim_order.value.size(); ++i)
      if (dim_order.value[i] != int64_t(have[i]))
        return fail(Error::InvalidProgram,
                    "%s: dim_order differs from the dim order of out; the program is invalid", op);
  } else if (!out.is_contiguous()) {
    return fail(Error::InvalidProgram, "%s: out must be contiguous when dim_order is None", op);
  }
  if (self.dtype() != out.dtype())
    return fail(Error::InvalidArgument, "%s: dtype changes are not supported", op);
  ETB_TRY(out.resize(self.sizes()));
  if (same_dim_order(self, out)) {
    if (out.data() != self.data() && self.nbytes() > 0)
      memmove(out.data(), self.data(), self.nbytes());
    return Error::Ok;
  }
  const bool to_last = self.is_contiguous() && out.is_channels_last();
  if (!to_last && !(self.is_channels_last() && out.is_contiguous()))
    return fail(Error::NotSupported,
                "%s: converts between contiguous and channels-last (0, 2, 3, 1) only", op);
  if (overlaps(out, self))
    return fail(Error::InvalidProgram, "%s: out overlaps self; the memory plan is invalid", op);
  switch (self.element_size()) {
    case 4: convert_channels_last<uint32_t>(ctx, self, out, to_last); break;
    case 8: convert_channels_last<uint64_t>(ctx, self, out, to_last); break;
    case 1: convert_channels_last<uint8_t>(ctx, self, out, to_last); break;
    default:
      return fail(Error::NotSupported, "%s: %s elements", op, scalar_type_name(self.dtype()));
  }
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
