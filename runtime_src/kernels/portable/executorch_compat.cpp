// Kernels for ops that ExecuTorch's exporter emits and etbuild's pipeline does not
// (ops_yaml/executorch_compat.yaml): inference batch norm and the dim-order clone.
#include <cmath>

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

Error clone_dim_order_out(KernelContext&, const Tensor& self, bool non_blocking,
                          Optional<Span<const int64_t>> dim_order, Tensor& out) {
  (void)non_blocking;
  if (dim_order.has_value) {
    if (int(dim_order.value.size()) != self.dim())
      return fail(Error::InvalidArgument, "_clone_dim_order: dim_order has the wrong length");
    for (size_t i = 0; i < dim_order.value.size(); ++i)
      if (dim_order.value[i] != int64_t(i))
        return fail(Error::NotSupported, "_clone_dim_order: only contiguous dim order");
  }
  if (self.dtype() != out.dtype())
    return fail(Error::InvalidArgument, "_clone_dim_order: dtype changes are not supported");
  ETB_TRY(out.resize(self.sizes()));
  if (out.data() != self.data() && self.nbytes() > 0)
    memmove(out.data(), self.data(), self.nbytes());
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
