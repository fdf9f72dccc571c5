// transpose.h: every block, whole or cut by an edge, goes through registers.
#include "kernels/portable/transpose.h"

#include "kernels/simd.h"

namespace etb {
namespace native {

using simd::VecF;

namespace {

constexpr int kW = VecF::kWidth;

// The block of `rows` x `cols` (each at most kW) at src, transposed to dst: rows past `rows`
// are loaded as zeros and the stores write `rows` floats of each of `cols` rows.
ETB_SIMD_INLINE void transpose_block(const float* src, int64_t ld_src, float* dst, int64_t ld_dst,
                                     int rows, int cols) {
  VecF r[kW];
  for (int i = 0; i < kW; ++i)
    r[i] = i >= rows    ? VecF::zero()
           : cols == kW ? VecF::load(src + i * ld_src)
                        : VecF::load_partial(src + i * ld_src, cols);
  simd::transpose(r);
  for (int j = 0; j < cols; ++j) {
    if (rows == kW)
      r[j].store(dst + j * ld_dst);
    else
      r[j].store_partial(dst + j * ld_dst, rows);
  }
}

}  // namespace

void transpose_f32(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t R,
                   int64_t Q) {
  // A band of kW source rows at a time: its lines stay in L1 while its blocks go out.
  for (int64_t i0 = 0; i0 < R; i0 += kW) {
    const int rows = R - i0 < kW ? int(R - i0) : kW;
    for (int64_t j0 = 0; j0 < Q; j0 += kW) {
      const int cols = Q - j0 < kW ? int(Q - j0) : kW;
      transpose_block(src + i0 * ld_src + j0, ld_src, dst + j0 * ld_dst + i0, ld_dst, rows, cols);
    }
  }
}

}  // namespace native
}  // namespace etb
