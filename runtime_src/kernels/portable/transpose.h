// Float matrix transpose with SIMD blocks: the channels-last kernels' switch between a tensor's
// pixels-major and channels-major views.
#pragma once

#include <cstdint>

namespace etb {
namespace native {

/// dst[j][i] = src[i][j] for an R x Q matrix (src: R rows of leading dimension ld_src; dst:
/// Q rows of leading dimension ld_dst), in blocks of kWidth x kWidth through registers (one
/// simd::transpose each, the edges' blocks loaded and stored in part). Writes only dst's R x Q
/// entries: the caller may run it on disjoint blocks of one matrix from several threads.
void transpose_f32(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t R,
                   int64_t Q);

}  // namespace native
}  // namespace etb
