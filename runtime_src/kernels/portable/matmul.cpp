// addmm, mm and bmm on Float tensors.
#include "kernels/portable/gemm.h"
#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

// The workspace of sgemm for [M x K] times [K x N], B row-major.
Result<float*> gemm_workspace(KernelContext& ctx, int64_t M, int64_t N, int64_t K) {
  Result<void*> ws = ctx.allocate_temp(sgemm_workspace_bytes(M, N, K, N), 64);
  if (!ws.ok()) return ws.error();
  return static_cast<float*>(ws.value());
}

// The plain product, with the call's fused clamp.
GemmEpilogue product(KernelContext& ctx) {
  GemmEpilogue ep;
  ep.clamp = ctx.output_clamp();
  return ep;
}

}  // namespace

Error mm_out(KernelContext& ctx, const Tensor& self, const Tensor& mat2, Tensor& out) {
  ETB_TRY(expect_dim(self, 2, "mm", "self"));
  ETB_TRY(expect_dim(mat2, 2, "mm", "mat2"));
  if (self.size(1) != mat2.size(0))
    return fail(Error::InvalidArgument, "mm: shapes %lldx%lld and %lldx%lld cannot be multiplied",
                (long long)self.size(0), (long long)self.size(1), (long long)mat2.size(0),
                (long long)mat2.size(1));
  const int64_t M = self.size(0), K = self.size(1), N = mat2.size(1);
  const int64_t sizes[2] = {M, N};
  ETB_TRY(resize_to(out, sizes, 2));
  ETB_ASSIGN_OR_RETURN(float* ws, gemm_workspace(ctx, M, N, K));
  sgemm(ctx, M, N, K, self.data_as<float>(), K, mat2.data_as<float>(), N, out.data_as<float>(), N,
        product(ctx), ws);
  return Error::Ok;
}

Error addmm_out(KernelContext& ctx, const Tensor& self, const Tensor& mat1, const Tensor& mat2,
                const Scalar& beta, const Scalar& alpha, Tensor& out) {
  ETB_TRY(expect_dim(mat1, 2, "addmm", "mat1"));
  ETB_TRY(expect_dim(mat2, 2, "addmm", "mat2"));
  if (mat1.size(1) != mat2.size(0))
    return fail(Error::InvalidArgument,
                "addmm: shapes %lldx%lld and %lldx%lld cannot be multiplied",
                (long long)mat1.size(0), (long long)mat1.size(1), (long long)mat2.size(0),
                (long long)mat2.size(1));
  const int64_t M = mat1.size(0), K = mat1.size(1), N = mat2.size(1);
  // self broadcasts to [M, N].
  if (self.dim() > 2) return fail(Error::InvalidArgument, "addmm: self must have <= 2 dims");
  const int64_t sm = self.dim() == 2 ? self.size(0) : 1;
  const int64_t sn = self.dim() >= 1 ? self.size(self.dim() - 1) : 1;
  if ((sm != M && sm != 1) || (sn != N && sn != 1))
    return fail(Error::InvalidArgument, "addmm: self does not broadcast to [%lld, %lld]",
                (long long)M, (long long)N);
  const int64_t sizes[2] = {M, N};
  ETB_TRY(resize_to(out, sizes, 2));
  ETB_ASSIGN_OR_RETURN(float* ws, gemm_workspace(ctx, M, N, K));
  const float b = float(beta.to_double()), a = float(alpha.to_double());
  float* c = out.data_as<float>();
  const float* s = self.data_as<float>();
  const float* m1 = mat1.data_as<float>();
  const float* m2 = mat2.data_as<float>();
  const bool aliases = static_cast<const void*>(s) == static_cast<const void*>(c);
  GemmEpilogue ep = product(ctx);
  if (a == 1.f && b == 1.f && sm == 1 && sn == N && !aliases) {  // a linear layer's bias row
    ep.init = GemmInit::ColBias;
    ep.bias = s;
    sgemm(ctx, M, N, K, m1, K, m2, N, c, N, ep, ws);
    return Error::Ok;
  }
  if (a == 1.f) {  // C = beta * self, then C += mat1 * mat2 (and the clamp)
    if (!(aliases && b == 1.f && sm == M && sn == N)) {
      if (aliases) return fail(Error::NotSupported, "addmm: out aliases a broadcast self");
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          c[i * N + j] = b == 0.f ? 0.f : b * s[(sm == 1 ? 0 : i) * sn + (sn == 1 ? 0 : j)];
    }
    ep.init = GemmInit::C;
    sgemm(ctx, M, N, K, m1, K, m2, N, c, N, ep, ws);
    return Error::Ok;
  }
  if (aliases) return fail(Error::NotSupported, "addmm: alpha != 1 with out aliasing self");
  sgemm(ctx, M, N, K, m1, K, m2, N, c, N, GemmEpilogue(), ws);
  const OutputClamp& clamp = ctx.output_clamp();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float base = b == 0.f ? 0.f : b * s[(sm == 1 ? 0 : i) * sn + (sn == 1 ? 0 : j)];
      float v = base + a * c[i * N + j];
      if (v < clamp.lo) v = clamp.lo;  // comparisons are false for NaN: it stays NaN
      if (v > clamp.hi) v = clamp.hi;
      c[i * N + j] = v;
    }
  return Error::Ok;
}

Error bmm_out(KernelContext& ctx, const Tensor& self, const Tensor& mat2, Tensor& out) {
  ETB_TRY(expect_dim(self, 3, "bmm", "self"));
  ETB_TRY(expect_dim(mat2, 3, "bmm", "mat2"));
  if (self.size(0) != mat2.size(0) || self.size(2) != mat2.size(1))
    return fail(Error::InvalidArgument, "bmm: batch or inner sizes differ");
  const int64_t B = self.size(0), M = self.size(1), K = self.size(2), N = mat2.size(2);
  const int64_t sizes[3] = {B, M, N};
  ETB_TRY(resize_to(out, sizes, 3));
  ETB_ASSIGN_OR_RETURN(float* ws, gemm_workspace(ctx, M, N, K));
  float* c = out.data_as<float>();
  for (int64_t b = 0; b < B; ++b)
    sgemm(ctx, M, N, K, self.data_as<float>() + b * M * K, K, mat2.data_as<float>() + b * K * N, N,
          c + b * M * N, N, GemmEpilogue(), ws);
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
