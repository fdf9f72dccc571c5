// The micro-kernel keeps a kMR x (kNV vectors) tile of C in registers across the whole
// depth: per step k it loads kNV vectors of row k of B and, for each of the kMR rows of A,
// broadcasts A[i][k] and multiply-adds it into the row's accumulators. A row of A and a row
// of B are both contiguous in the layouts the callers have (weights [OC x K] times NCHW
// activations [K x H*W]; activations [M x K] times transposed weights [K x N]), so nothing is
// packed per call. The last columns, when N is not a multiple of the tile width, go on whole
// vectors as far as they fill them (narrower tiles, B still read in place) and the last
// N % kW columns as dot products over the depth: their columns of B are copied, transposed,
// once per call. (A 7x7 plane has 49 columns: as a padded tile its last column would cost
// as much as 16.)
//
// Blocking: columns go in blocks whose K x NC slice of B stays in L2 while every row sliver
// of A runs over it (the sliver, kMR x K, stays in L1 across the block's tiles).
//
// Panels: where B's rows do not start on a vector boundary (a 7x7 or 14x14 plane: 49 or 196
// columns) and several row tiles read each tile's columns, every tile of B's row k straddles
// two cache lines, so a tile reads twice the lines its columns fill, from L2. There the
// slice is first copied into panels, one per tile of columns, each [kc x tile width] and
// contiguous: a tile then reads whole lines, one per step, in order.
#include "kernels/portable/gemm.h"

#include <numeric>
#include <type_traits>
#include <utility>

#include "kernels/cache.h"
#include "kernels/simd.h"

namespace etb {
namespace native {
namespace {

using simd::VecF;
constexpr int kW = VecF::kWidth;

// kMR x kNV vectors: the tile of a general product. kWideNV: vectors per row of the wider
// tiles used when A has one or two rows (a linear layer at batch 1): each step k then reads a
// longer contiguous run of B's row k, which is what limits a matrix-vector product.
#if defined(ETB_SIMD_AVX512)
constexpr int kMR = 8, kNV = 2, kWideNV = 4;  // 8 x 32: 16 zmm accumulators
#elif defined(ETB_SIMD_AVX2)
constexpr int kMR = 6, kNV = 2, kWideNV = 8;  // 6 x 16: 12 ymm accumulators
#elif defined(ETB_SIMD_NEON)
constexpr int kMR = 6, kNV = 4, kWideNV = 8;  // 6 x 16: 24 of the 32 q registers
#elif defined(ETB_SIMD_SSE2)
constexpr int kMR = 4, kNV = 2, kWideNV = 8;  // 4 x 8: 8 of the 16 xmm registers
#else
constexpr int kMR = 4, kNV = 4, kWideNV = 4;  // 4 x 4 scalars
#endif
constexpr int64_t kBlockBytes = 192 << 10;  // K x NC slice of B per column block

constexpr int64_t kPrefetchRows = 8;  // how far ahead the tile fetches rows of B

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Where row k of B starts: k * ldb elements on (a row-major matrix), or at an offset of its
// own (a convolution's taps: each row is a shifted window of a padded input plane). `ahead`
// is the row the tile prefetches, kPrefetchRows on.
struct StridedRows {
  const float* b;
  int64_t ldb;
  const float* row(int64_t k) const { return b + k * ldb; }
  const float* ahead(int64_t k) const { return b + (k + kPrefetchRows) * ldb; }
  StridedRows shifted(int64_t k0, int64_t n0) const { return {b + k0 * ldb + n0, ldb}; }
};
struct OffsetRows {
  const float* b;
  const int64_t* off;
  int64_t last;  // the last row's index (prefetches go no further)
  const float* row(int64_t k) const { return b + off[k]; }
  const float* ahead(int64_t k) const {
    return b + off[k + kPrefetchRows < last ? k + kPrefetchRows : last];
  }
  OffsetRows shifted(int64_t k0, int64_t n0) const { return {b + n0, off + k0, last - k0}; }
};

// What a tile needs to start and finish: the epilogue at the tile's origin, and the rows of A
// that a FetchA tile fetches ahead.
struct TileEpilogue {
  GemmInit init;
  const float* bias;  // RowBias: bias of the tile's first row; ColBias: of its first column
  bool clamp;
  float lo, hi;
  const float* next_a = nullptr;  // the next row tile's rows of A (same depth and lda)
  int next_rows = 0;
};

// C tile [MR x NV*kW] = epilogue(A[MR x K] * B[K x NV*kW]). A FetchA tile also fetches the
// next row tile's rows of A (e.next_a) into the cache, a line per step from its first step
// on: A's rows are weights, read from memory once per call, and the next row tile then finds
// them cached. (Only that tile carries the extra work and registers.)
template <int MR, int NV, class Rows, bool FetchA = false>
__attribute__((noinline)) void tile(int64_t K, const float* __restrict a, int64_t lda, Rows b,
                                    float* __restrict c, int64_t ldc, const TileEpilogue& e) {
  VecF acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      switch (e.init) {
        case GemmInit::Zero:
        default: acc[i][v] = VecF::zero(); break;
        case GemmInit::RowBias: acc[i][v] = VecF::broadcast(e.bias[i]); break;
        case GemmInit::ColBias: acc[i][v] = VecF::load(e.bias + v * kW); break;
        case GemmInit::C: acc[i][v] = VecF::load(c + i * ldc + v * kW); break;
      }
    }
  }
  const float* ap[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) ap[i] = a + i * lda;
  auto step = [&](int64_t k) __attribute__((always_inline)) {
    // Rows of B lie ldb apart (a whole activation plane for a 1x1 convolution): fetch the row
    // a few steps ahead, which the hardware prefetchers do not predict across pages.
    const float* ahead = b.ahead(k);
#pragma GCC unroll 8
    for (int line = 0; line < (NV * kW * 4 + 63) / 64; ++line)
      __builtin_prefetch(ahead + line * 16);
    const float* __restrict bk = b.row(k);
    VecF bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = VecF::load(bk + v * kW);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const VecF av = VecF::broadcast(ap[i][k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = simd::fma(av, bv[v], acc[i][v]);
    }
  };
  int64_t k = 0;
  if constexpr (FetchA) {  // the next tile's rows of A, a line per step, row by row in turn
    const int64_t lines = e.next_rows * ((K + 15) / 16);
    const float* next = e.next_a;
    for (int row = 0; k < K && k < lines; ++k) {
      __builtin_prefetch(next);
      next += lda;
      if (++row == e.next_rows) {
        row = 0;
        next += 16 - e.next_rows * lda;
      }
      step(k);
    }
  }
  for (; k < K; ++k) step(k);
  const VecF lo = VecF::broadcast(e.lo), hi = VecF::broadcast(e.hi);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      (e.clamp ? simd::clamp(acc[i][v], lo, hi) : acc[i][v]).store(c + i * ldc + v * kW);
  }
}

template <class Rows>
using TileFn = void (*)(int64_t, const float*, int64_t, Rows, float*, int64_t, const TileEpilogue&);

// The tile function for mr rows (1 <= mr <= MR) and nv vectors (1 <= nv <= NV).
template <int NV, class Rows, int... I>
constexpr TileFn<Rows> tile_for(int mr, std::integer_sequence<int, I...>) {
  constexpr TileFn<Rows> fns[] = {&tile<I + 1, NV, Rows>...};
  return fns[mr - 1];
}
template <int MR, int NV, class Rows>
TileFn<Rows> tile_fn(int mr, int nv) {
  if constexpr (NV > 1)
    if (nv < NV) return tile_fn<MR, NV - 1, Rows>(mr, nv);
  return tile_for<NV, Rows>(mr, std::make_integer_sequence<int, MR>());
}

// sums[i * J + j] = A row i . column j of B, for R rows of A and J columns of B given
// transposed (bt: J rows of ldbt, the depth contiguous), over depth K.
template <int R, int J>
__attribute__((noinline)) void dots(int64_t K, const float* __restrict a, int64_t lda,
                                    const float* __restrict bt, int64_t ldbt,
                                    float* __restrict sums) {
  VecF acc[R][J];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < J; ++j) acc[i][j] = VecF::zero();
  int64_t k = 0;
  for (; k + kW <= K; k += kW) {
    VecF bv[J];
#pragma GCC unroll 2
    for (int j = 0; j < J; ++j) bv[j] = VecF::load(bt + j * ldbt + k);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const VecF av = VecF::load(a + i * lda + k);
#pragma GCC unroll 2
      for (int j = 0; j < J; ++j) acc[i][j] = simd::fma(av, bv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const int n = int(K - k);
    VecF bv[J];
#pragma GCC unroll 2
    for (int j = 0; j < J; ++j) bv[j] = VecF::load_partial(bt + j * ldbt + k, n);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const VecF av = VecF::load_partial(a + i * lda + k, n);
#pragma GCC unroll 2
      for (int j = 0; j < J; ++j) acc[i][j] = simd::fma(av, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < J; ++j) sums[i * J + j] = simd::reduce_add(acc[i][j]);
}

// The last r (< kW) columns of an mr-row tile: C[i][j] = epilogue(A row i . column j of B),
// with bt those columns transposed ([r x ldbt], from the tile's depth on). Rows go MR at a
// time where the tile has them, columns in pairs.
template <int MR>
void dot_columns(int mr, int r, int64_t K, const float* a, int64_t lda, const float* bt,
                 int64_t ldbt, float* c, int64_t ldc, const TileEpilogue& e) {
  float sums[MR][kW];
  for (int i0 = 0; i0 < mr;) {
    const int rows = mr - i0 >= MR ? MR : 1;
    for (int j = 0; j < r; j += 2) {
      float pair[MR * 2];
      const float* ai = a + i0 * lda;
      const float* bj = bt + j * ldbt;
      const int J = r - j >= 2 ? 2 : 1;
      if (rows == MR)
        J == 2 ? dots<MR, 2>(K, ai, lda, bj, ldbt, pair) : dots<MR, 1>(K, ai, lda, bj, ldbt, pair);
      else
        J == 2 ? dots<1, 2>(K, ai, lda, bj, ldbt, pair) : dots<1, 1>(K, ai, lda, bj, ldbt, pair);
      for (int i = 0; i < rows; ++i)
        for (int jj = 0; jj < J; ++jj) sums[i0 + i][j + jj] = pair[i * J + jj];
    }
    i0 += rows;
  }
  // The epilogue on whole vectors, as a tile's.
  const VecF lo = VecF::broadcast(e.lo), hi = VecF::broadcast(e.hi);
  for (int i = 0; i < mr && i < MR; ++i) {  // (mr <= MR: said for the compiler)
    float* ci = c + i * ldc;
    VecF v = VecF::load_partial(sums[i], r);
    switch (e.init) {
      case GemmInit::Zero:
      default: break;
      case GemmInit::RowBias: v = v + VecF::broadcast(e.bias[i]); break;
      case GemmInit::ColBias: v = v + VecF::load_partial(e.bias, r); break;
      case GemmInit::C: v = v + VecF::load_partial(ci, r); break;
    }
    (e.clamp ? simd::clamp(v, lo, hi) : v).store_partial(ci, r);
  }
}

// The blocked product with tiles of up to MR rows and NV vectors, over column blocks of
// nc_block and depth blocks of kc_block (later depth blocks add to C; the clamp waits for the
// last one). The tiles are split over the threads by rows of tiles and, when there are few
// rows, by runs of columns; each tile is computed the same way wherever it runs, so the
// result does not depend on the thread count.
//
// Every parallel loop is a fork and a join, so there are as few as the cache allows: one for
// the whole product when there is one depth block or when `depth_in_task` (a matrix-vector
// product, which reads B once whatever the order); otherwise one per column and depth block,
// so that the kc x NC slice of B stays in each thread's L2 while the row tiles pass over it.
// Vectors of the widest tile of MR x NV's product: the last whole tile and its tail merged.
// AVX-512's 8 x 3 vectors (24 accumulators) fit its 32 registers; elsewhere no merging.
template <int MR, int NV>
constexpr int merged_nv() {
#if defined(ETB_SIMD_AVX512)
  return MR == 8 && NV == 2 ? 3 : NV;
#else
  return NV;
#endif
}

// A column block of nc_block columns as blocked() rounds it: whole tiles of NV vectors.
template <int NV>
int64_t whole_tiles(int64_t nc_block) {
  constexpr int kNR = NV * kW;
  return nc_block < kNR ? kNR : nc_block / kNR * kNR;
}

// `panels`, when not null, holds a kc_block x nc_block slice of B, into which each slice is
// copied as panels of whole tiles (see the top of the file) before its tiles run; only with
// B's rows in place (StridedRows) and where no tile merges the tail (AVX-512).
template <int MR, int NV, class Rows>
void blocked(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
             Rows B, float* C, int64_t ldc, const GemmEpilogue& ep, int64_t nc_block,
             int64_t kc_block, bool depth_in_task, float* workspace, float* panels = nullptr) {
  constexpr int kNR = NV * kW, kMergedNV = merged_nv<MR, NV>();
  nc_block = whole_tiles<NV>(nc_block);
  if (kc_block < 1) kc_block = 1;
  const int64_t depth_blocks = K > 0 ? (K + kc_block - 1) / kc_block : 1;
  // With threads, a product over a large plane's pixels (N) gives each thread a run of whole
  // columns (splits_pixels): column blocks of equal width, each thread a whole number of
  // them, or of their halves.
  const bool by_columns = depth_blocks == 1 && !depth_in_task && panels == nullptr &&
                          splits_pixels(N, ctx.num_threads());
  if (by_columns) {
    const int64_t blocks = (N + nc_block - 1) / nc_block;
    nc_block = ((N + blocks - 1) / blocks + kNR - 1) / kNR * kNR;
  }
  const int64_t row_tiles = (M + MR - 1) / MR;
  const int64_t col_blocks = (N + nc_block - 1) / nc_block;
  // Only the last column block can end in a partial tile, of `rem` columns: `tail_nv` whole
  // vectors read in place, then `dot_cols` (< kW) columns done as dot products, whose columns
  // of B, for the whole depth, are copied transposed into workspace [dot_cols x K]. The tasks
  // share it (read only).
  const int64_t nfull_all = N / kNR * kNR;
  const int rem = int(N - nfull_all), tail_nv = rem / kW, dot_cols = rem % kW;
  const int64_t dot_n0 = N - dot_cols;
  for (int j = 0; j < dot_cols; ++j)
    for (int64_t k = 0; k < K; ++k) workspace[j * K + k] = B.row(k)[dot_n0 + j];
  // One parallel loop where there is one slice (or B is read once whatever the order);
  // panels hold one slice, so with several column blocks each is a loop of its own.
  const bool one_loop =
      (depth_blocks == 1 && (panels == nullptr || col_blocks == 1)) || depth_in_task;
  // Copies the slice (column block cb, depth from k0) into panels: tile jt's columns at
  // panels + jt kc kNR, row k of the panel at k times its width (kNR, or the tail's
  // tail_nv vectors); the dot columns stay out.
  auto pack_slice = [&](int64_t cb, int64_t k0) {
    if constexpr (std::is_same_v<Rows, StridedRows>) {
      const int64_t n0 = cb * nc_block, kc = min64(kc_block, K - k0);
      const int64_t vec_cols = min64(nc_block, dot_n0 - n0);  // whole vectors in the block
      auto pack = [&](int64_t jt, int) {
        const int64_t width = min64(kNR, vec_cols - jt * kNR);
        const float* src = B.row(k0) + n0 + jt * kNR;
        float* dst = panels + jt * kc * kNR;
        for (int64_t k = 0; k < kc; ++k, src += B.ldb, dst += width)
          for (int64_t v = 0; v < width; v += kW) VecF::load(src + v).store(dst + v);
      };
      ctx.parallel_for((vec_cols + kNR - 1) / kNR, pack);
    }
  };
  // The tiles of column block cb that runs of columns split: the last whole tile and the tail
  // count as one where they merge (a run boundary between them would cost the merge).
  const bool tail_merges = kMergedNV > NV && tail_nv > 0 && NV + tail_nv <= kMergedNV;
  auto split_tiles = [&](int64_t cb) {
    const int64_t n0 = cb * nc_block, nc = min64(nc_block, N - n0);
    const bool merged_pair = tail_merges && n0 + nc == N && nfull_all - kNR >= n0;
    return (nc + kNR - 1) / kNR - (merged_pair ? 1 : 0);
  };
  // Enough tasks for every thread to get several. A matrix-vector product (depth in the task)
  // is bound by reading B, a run's columns of every row: with kTasksPerThread runs a thread,
  // MobileNetV2's classifier (1280 x 1000) ran one tile a run, reading 256 bytes of each row,
  // which the prefetchers follow poorly (100-107 us at 2 threads against 168 at 1); with 4
  // runs a thread, two tiles, 512 bytes (79-85 us).
  constexpr int64_t kVectorRunsPerThread = 4;
  const int64_t want =
      (depth_in_task ? kVectorRunsPerThread : kTasksPerThread) * int64_t(ctx.num_threads());
  const int64_t units = row_tiles * (one_loop ? col_blocks : 1);
  const int64_t threads = ctx.num_threads();
  // By columns: runs enough for every thread to have whole ones (threads / gcd of the blocks
  // and the threads); else runs only where the rows and blocks leave threads short of tasks.
  const int64_t col_runs =
      by_columns ? min64(split_tiles(0), threads / std::gcd(col_blocks, threads))
      : units >= want || threads == 1 ? 1
                                      : min64(split_tiles(0), (want + units - 1) / units);
  // Tiles [j_begin, j_end) of run `run` in column block `cb`, row tile `rt`, depth block `k0`.
  auto run_tiles = [&](int64_t cb, int64_t rt, int64_t run, int64_t k0) {
    const int64_t n0 = cb * nc_block, nc = min64(nc_block, N - n0);
    const int64_t col_tiles = (nc + kNR - 1) / kNR, split = split_tiles(cb);
    const int64_t j_begin = split * run / col_runs;
    const int64_t j_end = run + 1 == col_runs ? col_tiles : split * (run + 1) / col_runs;
    const int64_t kc = min64(kc_block, K - k0);
    const int64_t m0 = rt * MR;
    const int mr = int(min64(MR, M - m0));
    const TileFn<Rows> full_tile = tile_fn<MR, NV, Rows>(mr, NV);
    TileEpilogue e{k0 == 0 ? ep.init : GemmInit::C, ep.bias, k0 + kc >= K && ep.clamp.active(),
                   ep.clamp.lo, ep.clamp.hi};
    if (e.init == GemmInit::RowBias) e.bias = ep.bias + m0;
    const int next_rows = int(min64(MR, M - m0 - MR));  // of the next row tile (<= 0: none)
    // The run's last full tile fetches the next row tile's rows of A: after it, this row
    // tile's rows are not read again (fetched earlier, they would push them out of L1). Only
    // the last row tile can have fewer than MR rows, so the fetching tile has MR.
    const int64_t full_tiles = (min64(nfull_all, n0 + nc) - n0) / kNR;  // in the block
    // (Not on a convolution's taps: ResNet18's 3x3 layers were 1.05-1.14x slower with it.)
    const int64_t fetch_tile =
        std::is_same_v<Rows, StridedRows> && next_rows > 0 ? min64(j_end, full_tiles) - 1 : -1;
    const float* a = A + m0 * lda + k0;
    const Rows b = B.shifted(k0, n0);
    float* c = C + m0 * ldc + n0;
    // The tile's columns of B: in place, or its panel.
    auto tile_b = [&](int64_t jt, int64_t width) {
      if constexpr (std::is_same_v<Rows, StridedRows>)
        if (panels != nullptr) return StridedRows{panels + jt * kc * kNR, width};
      return b.shifted(0, jt * kNR);
    };
    for (int64_t jt = j_begin; jt < j_end; ++jt) {
      int64_t j = jt * kNR;
      if (e.init == GemmInit::ColBias) e.bias = ep.bias + n0 + j;
      if (n0 + j + kNR <= N) {
        // The last whole tile with the tail's vectors beside it, where registers allow (one
        // wider tile: 48 columns in one pass, not 32 then 16 at one broadcast per FMA).
        const bool merge = kMergedNV > NV && NV + tail_nv <= kMergedNV && tail_nv > 0 &&
                           n0 + j + kNR == nfull_all && jt + 1 < j_end;
        if constexpr (std::is_same_v<Rows, StridedRows>) {
          if (!merge && jt == fetch_tile) {
            e.next_a = A + (m0 + MR) * lda + k0;
            e.next_rows = next_rows;
            tile<MR, NV, Rows, true>(kc, a, lda, tile_b(jt, kNR), c + j, ldc, e);
            continue;
          }
        }
        if (!merge) {
          full_tile(kc, a, lda, tile_b(jt, kNR), c + j, ldc, e);
          continue;
        }
        tile_fn<MR, kMergedNV, Rows>(mr, NV + tail_nv)(kc, a, lda, b.shifted(0, j), c + j, ldc, e);
        j = ++jt * kNR;  // the tail tile: only its dot columns are left
      } else if (tail_nv > 0) {
        tile_fn<MR, NV, Rows>(mr, tail_nv)(kc, a, lda, tile_b(jt, tail_nv * kW), c + j, ldc, e);
      }
      if (dot_cols > 0) {
        const int64_t jd = dot_n0 - n0;
        if (e.init == GemmInit::ColBias) e.bias = ep.bias + dot_n0;
        dot_columns<MR>(mr, dot_cols, kc, a, lda, workspace + k0, K, c + jd, ldc, e);
      }
    }
  };
  if (one_loop) {
    if (panels != nullptr) pack_slice(0, 0);
    auto task = [&](int64_t t, int) {
      // By columns the row tiles are innermost, so a thread's share of the tasks (the pool
      // gives thread i the i-th share first) is whole runs of columns.
      const int64_t run = by_columns ? t / row_tiles % col_runs : t % col_runs;
      const int64_t rt = by_columns ? t % row_tiles : t / col_runs % row_tiles;
      const int64_t cb = t / (col_runs * row_tiles);
      for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kc_block) run_tiles(cb, rt, run, k0);
    };
    ctx.parallel_for(col_blocks * row_tiles * col_runs, task);
    return;
  }
  for (int64_t cb = 0; cb < col_blocks; ++cb)
    for (int64_t k0 = 0; k0 < K; k0 += kc_block) {
      if (panels != nullptr) pack_slice(cb, k0);
      auto task = [&](int64_t t, int) { run_tiles(cb, t / col_runs, t % col_runs, k0); };
      ctx.parallel_for(row_tiles * col_runs, task);
    }
}

// A general product's blocks: depth blocks of at most kMaxDepth (so a row sliver of A stays in
// L1), column blocks whose kc x nc slice of B stays in L2. Where `rows_per_plane` rows are
// windows of one plane (a convolution's taps), the slice holds kc / rows_per_plane planes.
struct GeneralBlocks {
  int64_t kc, nc;
  GeneralBlocks(int64_t K, int64_t rows_per_plane) {
    constexpr int64_t kMaxDepth = 512;
    const int64_t kblocks = (K + kMaxDepth - 1) / kMaxDepth;
    kc = kblocks > 1 ? (K + kblocks - 1) / kblocks : K;
    const int64_t planes = (kc + rows_per_plane - 1) / rows_per_plane;
    nc = kBlockBytes / (int64_t(sizeof(float)) * (planes > 0 ? planes : 1));
  }
};

// Whether sgemm copies B into panels (see the top of the file): its rows are off the vector
// boundary or alias in L1, at least four row tiles read each column tile, and no tile merges
// the tail. (Rows that alias, read in place: a 1x1 convolution 128 -> 128 on NCHW planes of
// 32x32, 64x64 or 48x64 pixels took 1.27-1.37x as long per pixel as on 60x60 or 40x40.)
bool packs_b(int64_t M, int64_t N, int64_t K, int64_t ldb) {
  constexpr int kNR = kNV * kW;
  if (kW == 1 || M <= 2 || (ldb % kW == 0 && !rows_alias_in_l1(K, ldb * int64_t(sizeof(float)))) ||
      (M + kMR - 1) / kMR < 4)
    return false;
  const int tail_nv = int(N % kNR) / kW;
  return merged_nv<kMR, kNV>() == kNV || tail_nv == 0;
}

// Floats of the panels of one slice.
int64_t panel_floats(int64_t N, int64_t K) {
  const GeneralBlocks g(K, 1);
  const int64_t nc = whole_tiles<kNV>(g.nc);
  return (K < g.kc ? K : g.kc) * (N < nc ? N : nc);
}

template <class Rows>
void general(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
             Rows B, float* C, int64_t ldc, const GemmEpilogue& ep, float* workspace,
             int64_t rows_per_plane = 1, float* panels = nullptr) {
  const GeneralBlocks g(K, rows_per_plane);
  blocked<kMR, kNV>(ctx, M, N, K, A, lda, B, C, ldc, ep, g.nc, g.kc, false, workspace, panels);
}

// The dot columns' transposed copy: K x (kW - 1) floats at most.
size_t dots_bytes(int64_t K) {
  return size_t(K > 0 ? K : 1) * (kW - 1 > 0 ? kW - 1 : 1) * sizeof(float);
}

}  // namespace

size_t sgemm_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t ldb) {
  const size_t dots = (dots_bytes(K) + 63) / 64 * 64;
  return dots + (packs_b(M, N, K, ldb) ? size_t(panel_floats(N, K)) * sizeof(float) : 0);
}

int sgemm_row_tile() {
  return kMR;
}

size_t sgemm_rows_workspace_bytes(int64_t K) {
  return dots_bytes(K);
}

void sgemm(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
           const float* B, int64_t ldb, float* C, int64_t ldc, const GemmEpilogue& ep,
           float* workspace) {
  if (M <= 0 || N <= 0) return;
  if (M > 2) {
    float* panels = nullptr;
    if (packs_b(M, N, K, ldb))
      panels = reinterpret_cast<float*>(reinterpret_cast<char*>(workspace) +
                                        (dots_bytes(K) + 63) / 64 * 64);
    general(ctx, M, N, K, A, lda, StridedRows{B, ldb}, C, ldc, ep, workspace, 1, panels);
    return;
  }
  // One or two rows of A (a matrix-vector product, bound by reading B): depth blocks that each
  // sweep the whole width, so B is read as a few long contiguous runs at a time.
  constexpr int64_t kDepthBlock = 16;
  if (M == 1)
    blocked<1, kWideNV>(ctx, M, N, K, A, lda, StridedRows{B, ldb}, C, ldc, ep, N, kDepthBlock, true,
                        workspace);
  else
    blocked<2, kWideNV / 2>(ctx, M, N, K, A, lda, StridedRows{B, ldb}, C, ldc, ep, N, kDepthBlock,
                            true, workspace);
}

namespace {

// sgemm_depth_halves' tasks: each half of the depth in depth_half_runs runs of whole row tiles
// (so the two halves start at once); a task's product runs on its thread alone, with a
// workspace of its own, of these bytes.
size_t depth_half_task_bytes(int64_t M, int64_t N, int64_t K, int64_t ldb) {
  return (sgemm_workspace_bytes(M, N, K - K / 2, ldb) + 63) / 64 * 64;
}

// The second half's product, [M x N] floats, at the start of the workspace.
size_t partial_bytes(int64_t M, int64_t N) {
  return (size_t(M * N) * sizeof(float) + 63) / 64 * 64;
}

}  // namespace

bool sgemm_splits_depth(int64_t M, int64_t N, int64_t K) {
  // The partial's bound keeps it in L2 (and well within the hosted temp memory).
  return M <= 128 && K >= 128 && M * N * int64_t(sizeof(float)) <= int64_t(512) << 10;
}

size_t sgemm_depth_halves_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t ldb,
                                          int threads) {
  return partial_bytes(M, N) +
         size_t(2 * depth_half_runs(threads)) * depth_half_task_bytes(M, N, K, ldb);
}

void sgemm_depth_halves(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const float* A,
                        int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                        const GemmEpilogue& ep, float* workspace) {
  if (M <= 0 || N <= 0) return;
  const int64_t K0 = K / 2;
  const int64_t runs = depth_half_runs(ctx.num_threads());
  const int64_t row_tiles = (M + kMR - 1) / kMR;
  const int64_t run_rows = (row_tiles + runs - 1) / runs * kMR;
  float* partial = workspace;  // [M x N], leading dimension N
  char* task_ws = reinterpret_cast<char*>(workspace) + partial_bytes(M, N);
  const size_t task_bytes = depth_half_task_bytes(M, N, K, ldb);
  // Half 0 starts from the caller's init; half 1 from zero. Neither clamps: the sum does.
  GemmEpilogue first = ep, second;
  first.clamp = OutputClamp();
  // Tasks half-major: with two threads, each takes a half (the pool gives thread t the t-th
  // share of the tasks first).
  auto product = [&](int64_t task, int thread) {
    const int64_t half = task / runs, m0 = (task % runs) * run_rows;
    if (m0 >= M) return;
    const int64_t rows = min64(run_rows, M - m0);
    float* ws = reinterpret_cast<float*>(ctx.thread_slice(thread, task_ws, task_bytes));
    const KernelContext alone = ctx.within_task();
    GemmEpilogue e = half == 0 ? first : second;
    if (e.init == GemmInit::RowBias) e.bias += m0;
    if (half == 0)
      sgemm(alone, rows, N, K0, A + m0 * lda, lda, B, ldb, C + m0 * ldc, ldc, e, ws);
    else
      sgemm(alone, rows, N, K - K0, A + m0 * lda + K0, lda, B + K0 * ldb, ldb, partial + m0 * N, N,
            e, ws);
  };
  ctx.parallel_for(2 * runs, product);
  const VecF lo = VecF::broadcast(ep.clamp.lo), hi = VecF::broadcast(ep.clamp.hi);
  const bool clamp = ep.clamp.active();
  auto sum = [&](int64_t i, int) {
    float* c = C + i * ldc;
    const float* p = partial + i * N;
    int64_t j = 0;
    for (; j + kW <= N; j += kW) {
      const VecF v = VecF::load(c + j) + VecF::load(p + j);
      (clamp ? simd::clamp(v, lo, hi) : v).store(c + j);
    }
    if (j < N) {
      const int r = int(N - j);
      const VecF v = VecF::load_partial(c + j, r) + VecF::load_partial(p + j, r);
      (clamp ? simd::clamp(v, lo, hi) : v).store_partial(c + j, r);
    }
  };
  ctx.parallel_for(M, sum);
}

void sgemm_rows(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const float* A,
                int64_t lda, const float* B, const int64_t* row_offsets, int64_t rows_per_plane,
                float* C, int64_t ldc, const GemmEpilogue& ep, float* workspace) {
  if (M <= 0 || N <= 0) return;
  general(ctx, M, N, K, A, lda, OffsetRows{B, row_offsets, K - 1}, C, ldc, ep, workspace,
          rows_per_plane);
}

}  // namespace native
}  // namespace etb
