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
/// widened: as qgemm_pack_a does, or, with `taps` > 0, as qgemm_pack_taps does for rows of
/// K / taps channels x `taps` taps.
void prepare_weights(PrepareContext& pctx, int64_t groups, int64_t M, int64_t K, const int8_t* A,
                     bool pack, int64_t taps = 0);
/// Bytes that prepare_weights takes for these arguments (a multiple of 64): a hook that
/// prepares two matrices finds the second block this far after the first.
size_t prepared_weights_bytes(int64_t groups, int64_t M, int64_t K, bool pack, int64_t taps = 0);
/// The block at `mem` (KernelContext::prepared()) that prepare_weights filled, or an empty
/// view when there is none or it was filled for another shape (the kernel then works from
/// the weights themselves). The packed rows are given only when they were packed for the
/// same `taps`.
PreparedWeights prepared_weights(const void* mem, int64_t groups, int64_t M, int64_t K,
                                 int64_t taps = 0);
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

/// Whether a convolution's product of M output channels over K input channels and N pixels
/// is better taken by qgemm_depth_halves than split by rows: few rows over a deep input, on
/// a plane too small for qgemm to split its columns. The kernel before it (a depthwise
/// convolution, split by channels) leaves the input split over the threads' caches by
/// channel: each thread of a depth half then reads the channels its core has, where each
/// thread of a row split reads all of them. Only with threads (the sums are exact either way).
bool qgemm_splits_depth(int64_t M, int64_t N, int64_t K, int threads);

/// Bytes of workspace (64-byte aligned) that qgemm_depth_halves needs on `threads` threads.
size_t qgemm_depth_halves_workspace_bytes(int64_t M, int64_t N, int64_t K, int threads);

/// qgemm as two products over the halves of the depth, each half on its share of the threads
/// (runs of whole row tiles) into int32 sums, then fn on the two halves' sum, a row tile a
/// task. The sums are exact: the same tiles as qgemm's.
void qgemm_depth_halves(const KernelContext& kctx, int64_t M, int64_t N, int64_t K, const int8_t* A,
                        int64_t lda, const int8_t* B, int64_t b_sk, int64_t b_sn, void* workspace,
                        QTileFn fn, void* ctx);

/// For callers that multiply one A by many Bs (a convolution's column tiles, split over the
/// threads): A widened once by qgemm_pack_a into qgemm_packed_a_bytes(M, K), then each
/// product on the calling thread by qgemm_packed with room for `group` panels of
/// qgemm_panel_bytes(K) of its own (K >= 1): it packs a group of panels, then multiplies every
/// sliver of A's rows by the whole group, so that each row's outputs are written group panels
/// wide at a time. Sums equal qgemm's. qgemm_packs_whole_a says whether A is small enough
/// (qgemm itself packs bigger ones in chunks of rows).
bool qgemm_packs_whole_a(int64_t M, int64_t K);
size_t qgemm_packed_a_bytes(int64_t M, int64_t K);
size_t qgemm_panel_bytes(int64_t K);
void qgemm_pack_a(const KernelContext& kctx, int64_t M, int64_t K, const int8_t* A, int64_t lda,
                  int16_t* out);
/// Panels of depth K that fit in 32 KiB (at least one): a `group` for qgemm_packed.
int64_t qgemm_panel_group(int64_t K);
void qgemm_packed(int64_t M, int64_t N, int64_t K, const int16_t* apack, const int8_t* B,
                  int64_t b_sk, int64_t b_sn, int16_t* panels, int64_t group, QTileFn fn,
                  void* ctx);

/// Implicit GEMM for a convolution: B is not packed but read in place from the input's "taps
/// layout", in which one 32-bit word holds qgemm_step_channels() channels of one pixel (as
/// the micro-kernel reads a step of a packed column). Each step of the depth is one tap of
/// one group of channels, so a step's columns are a run of consecutive words of that layout:
/// word (st, q) of B is words[offsets[st] + q], offsets being the caller's (the geometry).
int64_t qgemm_step_channels();
/// Columns of a panel (a multiple of 8, at most 64) and rows of a tile (at most 8).
int64_t qgemm_panel_columns();
int64_t qgemm_tile_rows();
/// Weights W [M][C][T] (C input channels x T taps a row) packed for qgemm_taps: the depth in
/// steps of qgemm_step_channels() channels of one tap, channels past C zero.
size_t qgemm_packed_taps_bytes(int64_t M, int64_t C, int64_t T);
void qgemm_pack_taps(const KernelContext& kctx, int64_t M, int64_t C, int64_t T, const int8_t* W,
                     int16_t* out);
/// Writes n words of the taps layout: word j holds `channels` (<= qgemm_step_channels())
/// channels of pixel j, channel c's value at x[c * c_stride + j * step]; the other channels
/// of the word are zero as the GEMM counts them (their weights are zero).
void qgemm_pack_pixels(const int8_t* x, int64_t c_stride, int64_t step, int64_t channels, int64_t n,
                       int32_t* out);
/// The word of a pixel whose every channel holds v (a padding pixel).
int32_t qgemm_fill_word(int8_t v);
/// Bytes of B's words that a block of columns may span and still stay in cache while every
/// sliver of A's rows runs over it (qgemm's own B blocks are this size).
size_t qgemm_block_bytes();
/// Rows [m_begin, m_end) of A (packed by qgemm_pack_taps for C x T; m_begin a multiple of
/// qgemm_tile_rows()) times columns [q_begin, q_end) of B on the calling thread, delivered to
/// `fn` a tile at a time. Sums equal qgemm's with A's rows and B's columns in that depth order.
/// The columns go in blocks of `block` (a multiple of qgemm_panel_columns()), each multiplied
/// by every row before the next: the caller sizes a block from its layout, so that the words
/// its columns read fit in qgemm_block_bytes().
/// Panels are whole: each step reads the words up to offsets[st] + q_begin + (q_end - q_begin
/// rounded up to whole panels), the columns past q_end being computed and not delivered.
void qgemm_taps(int64_t m_begin, int64_t m_end, int64_t C, int64_t T, const int16_t* apack,
                const int32_t* words, const int64_t* offsets, int64_t q_begin, int64_t q_end,
                int64_t block, QTileFn fn, void* ctx);

/// A QTileFn that stores each tile's raw sums into an int32 matrix: ctx is a SumsOut, row m0
/// of the product at c + m0 * ld (a product's part of a sum finished later).
struct SumsOut {
  int32_t* c;
  int64_t ld;
};
void store_sums(void* ctx, int64_t m0, int64_t n0, int64_t mr, int64_t nr, const int32_t* acc,
                int64_t acc_ld);

/// Row sums of A (M x K, leading dimension lda): the zero-point correction of each row; the
/// rows are split over kctx's threads.
void row_sums(const KernelContext& kctx, int64_t M, int64_t K, const int8_t* A, int64_t lda,
              int32_t* sums);

}  // namespace quantized
}  // namespace etb
