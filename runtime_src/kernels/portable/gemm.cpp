// The GEMM packs a kKC x kNC block of B into column panels of kNR and a kMR x kKC sliver of
// A, so the micro-kernel reads both contiguously and keeps a kMR x kNR tile of C in
// registers across the depth loop (the compiler vectorizes the fixed-size j loop and
// unrolls i). Tile sizes follow the vector width the kernels are compiled for.
#include "kernels/portable/gemm.h"

namespace etb {
namespace native {
namespace {

#if defined(__AVX512F__)
constexpr int64_t kMR = 8, kNR = 32;  // 16 zmm accumulators
#elif defined(__AVX__)
constexpr int64_t kMR = 6, kNR = 16;  // 12 ymm accumulators
#else
constexpr int64_t kMR = 4, kNR = 8;
#endif
constexpr int64_t kKC = 256;  // depth of a block
constexpr int64_t kNC = 256;  // columns of a packed B block (kKC x kNC floats = 256 KB)

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

void micro_kernel(int64_t kc, const float* __restrict ap, const float* __restrict bp,
                  float* __restrict c, int64_t ldc, int64_t mr, int64_t nr) {
  float acc[kMR][kNR] = {};
  for (int64_t k = 0; k < kc; ++k) {
    const float* b = bp + k * kNR;
    const float* a = ap + k * kMR;
    for (int64_t i = 0; i < kMR; ++i)
      for (int64_t j = 0; j < kNR; ++j) acc[i][j] += a[i] * b[j];
  }
  if (mr == kMR && nr == kNR) {
    for (int64_t i = 0; i < kMR; ++i)
      for (int64_t j = 0; j < kNR; ++j) c[i * ldc + j] += acc[i][j];
  } else {
    for (int64_t i = 0; i < mr; ++i)
      for (int64_t j = 0; j < nr; ++j) c[i * ldc + j] += acc[i][j];
  }
}

// Few rows: stream B once, C row += a * B row (an axpy the compiler vectorizes).
void gemm_small_m(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m) {
    float* __restrict c = C + m * ldc;
    for (int64_t k = 0; k < K; ++k) {
      const float a = A[m * lda + k];
      const float* __restrict b = B + k * ldb;
      for (int64_t n = 0; n < N; ++n) c[n] += a * b[n];
    }
  }
}

}  // namespace

size_t sgemm_workspace_bytes() { return size_t(kKC * kNC + kKC * kMR) * sizeof(float); }

void sgemm_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, float* C, int64_t ldc, float* workspace) {
  if (M <= 2) {
    gemm_small_m(M, N, K, A, lda, B, ldb, C, ldc);
    return;
  }
  float* bpack = workspace;
  float* apack = workspace + kKC * kNC;
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kc = min64(K - k0, kKC);
    for (int64_t n0 = 0; n0 < N; n0 += kNC) {
      const int64_t nc = min64(N - n0, kNC);
      for (int64_t j0 = 0; j0 < nc; j0 += kNR) {
        const int64_t nr = min64(nc - j0, kNR);
        float* dst = bpack + j0 * kc;
        for (int64_t k = 0; k < kc; ++k) {
          const float* src = B + (k0 + k) * ldb + n0 + j0;
          int64_t j = 0;
          for (; j < nr; ++j) dst[k * kNR + j] = src[j];
          for (; j < kNR; ++j) dst[k * kNR + j] = 0.f;
        }
      }
      for (int64_t m0 = 0; m0 < M; m0 += kMR) {
        const int64_t mr = min64(M - m0, kMR);
        for (int64_t k = 0; k < kc; ++k) {
          int64_t i = 0;
          for (; i < mr; ++i) apack[k * kMR + i] = A[(m0 + i) * lda + k0 + k];
          for (; i < kMR; ++i) apack[k * kMR + i] = 0.f;
        }
        for (int64_t j0 = 0; j0 < nc; j0 += kNR)
          micro_kernel(kc, apack, bpack + j0 * kc, C + m0 * ldc + n0 + j0, ldc, mr,
                       min64(nc - j0, kNR));
      }
    }
  }
}

}  // namespace native
}  // namespace etb
