// The single-precision GEMM behind convolution, linear and the matmul family, with the
// epilogue (bias, accumulate, clamp) done in registers before the tile is stored.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel/kernel.h"

namespace etb {
namespace native {

/// What a GEMM output tile holds before A * B is added to it.
enum class GemmInit : uint8_t {
  Zero,     // C = A * B
  RowBias,  // C[i][j] = bias[i] + (A * B)[i][j]   (a convolution's per-channel bias)
  ColBias,  // C[i][j] = bias[j] + (A * B)[i][j]   (a linear layer's bias)
  C,        // C += A * B
};

/// The epilogue of one sgemm call.
struct GemmEpilogue {
  GemmInit init = GemmInit::Zero;
  const float* bias = nullptr;  // M values (RowBias) or N values (ColBias)
  OutputClamp clamp;            // applied to the finished result
};

/// Bytes of (64-byte aligned) workspace that sgemm needs for an M x N x K product whose B has
/// leading dimension ldb.
size_t sgemm_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t ldb);

/// Rows of the micro-kernel's tile on this ISA (4, 6 or 8): a caller that splits a product's
/// rows over threads gives each thread whole tiles.
int sgemm_row_tile();

/// Bytes of (64-byte aligned) workspace that sgemm_rows needs for depth K.
size_t sgemm_rows_workspace_bytes(int64_t K);

/// C[M x N] = clamp(init + A[M x K] * B[K x N]); all row-major with leading dimensions lda,
/// ldb, ldc. A is read in place; so is B, but for the last columns of B when N is not a
/// multiple of the tile width, and, where B's rows are off the vector boundary and many rows
/// of A read them, its blocks copied into panels of whole tiles. `workspace` holds
/// sgemm_workspace_bytes(M, N, K, ldb).
/// The tiles are split over ctx's threads; the result is the same for any thread count.
void sgemm(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const float* A,
           int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
           const GemmEpilogue& epilogue, float* workspace);

/// Whether a convolution's product of M output channels over K input channels and N pixels
/// is better taken as two halves of the depth (sgemm_depth_halves) than split by rows.
/// Kernels before it leave its input split over the threads' caches by channel, which is K
/// here: with few rows, every thread of a row split reads all of B, half of it from another
/// core, while a thread of a depth half reads the channels that its core has. Decided by the
/// shape alone, so that the result is the same at any thread count.
bool sgemm_splits_depth(int64_t M, int64_t N, int64_t K);

/// Bytes of (64-byte aligned) workspace that sgemm_depth_halves needs for an M x N x K
/// product whose B has leading dimension ldb, on `threads` threads.
size_t sgemm_depth_halves_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t ldb,
                                          int threads);

/// sgemm as the sum of two products over the halves of the depth: C = init + A0 B0 and a
/// partial P = A1 B1, each on its share of the threads (runs of whole row tiles), then
/// C = clamp(C + P). The sum is the same whatever the thread count, but not the same as
/// sgemm's. `workspace` holds sgemm_depth_halves_workspace_bytes(M, N, K, ldb, threads).
void sgemm_depth_halves(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                        const GemmEpilogue& epilogue, float* workspace);

/// sgemm with B's rows where the caller puts them: row k starts at B + row_offsets[k] (K
/// entries) and its N elements are contiguous. A convolution's taps layout gives each row
/// (one input channel at one tap) as a window of a padded input plane, with no im2col copy.
/// `rows_per_plane`: how many consecutive rows are windows of one plane (a channel's taps),
/// so that a block of columns, sized to stay in cache, counts each plane once. `workspace`
/// holds sgemm_rows_workspace_bytes(K).
void sgemm_rows(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const float* A,
                int64_t lda, const float* B, const int64_t* row_offsets, int64_t rows_per_plane,
                float* C, int64_t ldc, const GemmEpilogue& epilogue, float* workspace);

}  // namespace native
}  // namespace etb
