// What the kernels assume of the data caches they lay their work out for.
#pragma once

#include <cstdint>
#include <numeric>

namespace etb {

/// Whether `rows` rows of an operand, `row_bytes` apart, fall on too few sets of an L1 cache
/// with 4 KiB ways (x86, and 64 KiB 16-way or 32 KiB 8-way Arm cores alike) for a line of each
/// to stay in L1 while a kernel works across them: rows 4 KiB apart all fall on one set (of 8
/// ways or more), 1 KiB apart on four. NCHW planes of 32x32, 64x64 or 48x64 pixels are rows
/// 4-16 KiB apart in a convolution's product (fp32) and 1-4 KiB (int8); MobileNetV2's 112x112
/// planes (49 KiB as floats) over 16 channels fit.
inline bool rows_alias_in_l1(int64_t rows, int64_t row_bytes) {
  if (row_bytes % 64 != 0) return false;
  const int64_t sets = 4096 / std::gcd(row_bytes, int64_t(4096));  // of the 64 a way has
  return rows > 8 * sets;
}

}  // namespace etb
