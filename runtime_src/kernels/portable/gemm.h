// A cache-blocked single-precision GEMM used by the matmul family and convolution.
#pragma once

#include <cstddef>
#include <cstdint>

namespace etb {
namespace native {

/// Bytes of (64-byte aligned) workspace that sgemm_acc needs for its packed panels.
size_t sgemm_workspace_bytes();

/// C[M x N] += A[M x K] * B[K x N]; all row-major with leading dimensions lda, ldb, ldc.
/// `workspace` holds sgemm_workspace_bytes() bytes (kernels take it from their temp allocator).
void sgemm_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, float* C, int64_t ldc, float* workspace);

}  // namespace native
}  // namespace etb
