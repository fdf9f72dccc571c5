// kernel_isa(): which SIMD path (kernels/simd.h) the kernels of this build were compiled for.
#pragma once

namespace etb {

/// The instruction set of the kernels' explicit SIMD path, fixed when they were compiled by
/// their -march (CMake's ETB_ARCH, the config's target.march): "avx512", "avx2", "sse2",
/// "neon" or "scalar" (etb::simd::kIsa). Defined in kernels/portable/util.cpp.
const char* kernel_isa();

}  // namespace etb
