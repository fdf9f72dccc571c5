// The instruction-set intrinsics of the machine the kernels are compiled for. Every kernel
// includes them through this header, never directly: the first include of <immintrin.h> in a
// translation unit is the one that counts, and GCC 12's own AVX-512 headers trip
// -W(maybe-)uninitialized where their max/min and reductions are inlined (_mm512_undefined_*,
// GCC PR 105593), which -Werror turns into a failed build on an AVX-512 machine. The warnings
// are silenced for the lines of those headers only.
#pragma once

#if defined(__SSE2__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif
