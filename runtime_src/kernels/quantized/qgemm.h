// An int8 x int8 -> int32 GEMM for the quantized kernels. Products are summed exactly in
// int32; the caller turns each finished tile into its output (requantization) in a callback,
// so no int32 matrix is ever written to memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel/kernel.h"

namespace etb {
namespace quantized {

/// Receives one finished tile: acc[i * acc_ld + j] = sum_k A[m0 + i][k] * B[k][n0 + j] for
/// i < mr, j < nr (raw products: zero points are the callback's business).
using QTileFn = void (*)(void* ctx, int64_t m0, int64_t n0, int64_t mr, int64_t nr,
                         const int32_t* acc, int64_t acc_ld);

/// Bytes of workspace (64-byte aligned) qgemm needs for an M x N x K product on `threads`
/// threads (KernelContext::num_threads()).
size_t qgemm_workspace_bytes(int64_t M, int64_t N, int64_t K, int threads);

/// A weight matrix prepared once (by a kernel's prepare hook, at load) for every product it
/// takes part in: the row sums of its `groups` groups of M x K rows and, when packed, each
/// group's rows widened as qgemm_pack_a widens them.
struct PreparedWeights {
  const int32_t* sums = nullptr;    // groups * M row sums (nullptr: no usable block)
  const int16_t* packed = nullptr;  // group g at packed + g * group_stride, or nullptr
  size_t group_stride = 0;          // int16 elements
  /// Group g's widened rows for qgemm's `apacked`, or nullptr when not packed.
  const int16_t* group(int64_t g) const {
    return packed != nullptr ? packed + size_t(g) * group_stride : nullptr;
  }
};
/// A prepare hook's part for weights A (groups * M rows of K, row-major): takes the block
/// from `pctx` and, in the filling pass, writes the row sums and (when `pack`) the rows
/// widened.
void prepare_weights(PrepareContext& pctx, int64_t groups, int64_t M, int64_t K, const int8_t* A,
                     bool pack);
/// The block at `mem` (KernelContext::prepared()) that prepare_weights filled, or an empty
/// view when there is none or it was filled for another shape (the kernel then works from
/// the weights themselves).
PreparedWeights prepared_weights(const void* mem, int64_t groups, int64_t M, int64_t K);
/// Whether qgemm reads its A packed for a product of N columns with B's rows contiguous
/// (b_sk == 1): fewer columns take plain dot products over A itself.
bool qgemm_reads_packed_a(int64_t N);

/// C[M x N] = A[M x K] * B[K x N] in int32, delivered tile by tile to `fn`.
/// A is row-major with leading dimension lda (the weights); element (k, n) of B is
/// B[k * b_sk + n * b_sn] (so a convolution's [K x P] input and a linear layer's transposed
/// [N x K] input are both views).
/// The tiles are split over kctx's threads (by rows, or by columns when there are many),
/// so `fn` is called from several threads at once (for distinct tiles); the sums do not
/// depend on the thread count. `apacked`: A already widened by qgemm_pack_a (or a
/// PreparedWeights group), or nullptr to widen it here.
void qgemm(const KernelContext& kctx, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda,
           const int8_t* B, int64_t b_sk, int64_t b_sn, void* workspace, QTileFn fn, void* ctx,
           const int16_t* apacked = nullptr);

/// For callers that multiply one A by many Bs (a convolution's column tiles, split over the
/// threads): A widened once by qgemm_pack_a into qgemm_packed_a_bytes(M, K), then each
/// product on the calling thread by qgemm_packed with a panel of qgemm_panel_bytes(K) of its
/// own (K >= 1). Sums equal qgemm's. qgemm_packs_whole_a says whether A is small enough (qgemm
/// itself packs bigger ones in chunks of rows).
bool qgemm_packs_whole_a(int64_t M, int64_t K);
size_t qgemm_packed_a_bytes(int64_t M, int64_t K);
size_t qgemm_panel_bytes(int64_t K);
void qgemm_pack_a(const KernelContext& kctx, int64_t M, int64_t K, const int8_t* A, int64_t lda,
                  int16_t* out);
void qgemm_packed(int64_t M, int64_t N, int64_t K, const int16_t* apack, const int8_t* B,
                  int64_t b_sk, int64_t b_sn, int16_t* panel, QTileFn fn, void* ctx);

/// Row sums of A (M x K, leading dimension lda): the zero-point correction of each row; the
/// rows are split over kctx's threads.
void row_sums(const KernelContext& kctx, int64_t M, int64_t K, const int8_t* A, int64_t lda,
              int32_t* sums);

}  // namespace quantized
}  // namespace etb
