// The int8 kernels that are not GEMMs: quantize / dequantize at fp32 boundaries, add (with
// broadcasting), mean over dims, max and average pooling and max over dims
// (pipeline/quant/ops.py).
#include <algorithm>

#include "kernels/intrinsics.h"
#include "kernels/portable/geometry.h"
#include "kernels/portable/util.h"
#include "kernels/quantized/requant.h"
#include "native_functions.h"

namespace etb {
namespace quantized {
namespace {

Error expect_char(const Tensor& t, const char* op, const char* arg) {
  if (t.dtype() != ScalarType::Char)
    return fail(Error::InvalidArgument, "%s: %s has dtype %s, expected Char (int8)", op, arg,
                scalar_type_name(t.dtype()));
  return Error::Ok;
}

// Max pooling works on rows of this many bytes at a time (stack buffers).
constexpr int64_t kPoolRowBytes = 1024;

// d[i] = max(a[i], b[i]) over n int8 lanes (d may be a).
void max_bytes(int8_t* d, const int8_t* a, const int8_t* b, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 32 <= n; i += 32) {
    const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_max_epi8(va, vb));
  }
#elif defined(__SSE4_1__)
  for (; i + 16 <= n; i += 16) {
    const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i));
    const __m128i vb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm_max_epi8(va, vb));
  }
#elif defined(__ARM_NEON)
  for (; i + 16 <= n; i += 16) vst1q_s8(d + i, vmaxq_s8(vld1q_s8(a + i), vld1q_s8(b + i)));
#endif
  for (; i < n; ++i) d[i] = a[i] > b[i] ? a[i] : b[i];
}

// The largest of n >= 1 int8 values.
int8_t max_run(const int8_t* x, int64_t n) {
  int64_t i = 0;
  int32_t m = -128;
#if defined(__AVX2__)
  if (n >= 32) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    for (i = 32; i + 32 <= n; i += 32)
      v = _mm256_max_epi8(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    __m128i h = _mm_max_epi8(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_max_epi8(h, _mm_srli_si128(h, 8));
    h = _mm_max_epi8(h, _mm_srli_si128(h, 4));
    h = _mm_max_epi8(h, _mm_srli_si128(h, 2));
    h = _mm_max_epi8(h, _mm_srli_si128(h, 1));
    m = int8_t(_mm_cvtsi128_si32(h));
  }
#elif defined(__ARM_NEON) && defined(__aarch64__)
  if (n >= 16) {
    int8x16_t v = vld1q_s8(x);
    for (i = 16; i + 16 <= n; i += 16) v = vmaxq_s8(v, vld1q_s8(x + i));
    m = vmaxvq_s8(v);
  }
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return int8_t(m);
}

// Average pooling sums spans of this many input columns at a time (a stack buffer).
constexpr int64_t kAvgSpan = 512;
// The most taps of an average pooling window: 255 x taps fits int32.
constexpr int64_t kMaxAvgTaps = int64_t(1) << 23;

// acc[t] += x[t] for t < n: one input row added to int32 column sums.
void add_row(int32_t* __restrict acc, const int8_t* __restrict x, int64_t n) {
  int64_t t = 0;
#if defined(__AVX2__)
  for (; t + 16 <= n; t += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + t));
    __m256i* a = reinterpret_cast<__m256i*>(acc + t);
    _mm256_storeu_si256(a, _mm256_add_epi32(_mm256_loadu_si256(a), _mm256_cvtepi8_epi32(v)));
    _mm256_storeu_si256(a + 1, _mm256_add_epi32(_mm256_loadu_si256(a + 1),
                                                _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
  }
#elif defined(__ARM_NEON)
  for (; t + 16 <= n; t += 16) {
    const int8x16_t v = vld1q_s8(x + t);
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_s8(vget_high_s8(v));
    vst1q_s32(acc + t, vaddw_s16(vld1q_s32(acc + t), vget_low_s16(lo)));
    vst1q_s32(acc + t + 4, vaddw_s16(vld1q_s32(acc + t + 4), vget_high_s16(lo)));
    vst1q_s32(acc + t + 8, vaddw_s16(vld1q_s32(acc + t + 8), vget_low_s16(hi)));
    vst1q_s32(acc + t + 12, vaddw_s16(vld1q_s32(acc + t + 12), vget_high_s16(hi)));
  }
#endif
  for (; t < n; ++t) acc[t] += x[t];
}

// One pooling window along an axis, as torch's avg_pool2d sees it: [lo, hi) are its taps
// inside the input, `padded` its size clipped to the padded input.
struct Window {
  int64_t lo, hi, padded;
};

inline Window window(int64_t o, int64_t size, int64_t k, int64_t stride, int64_t pad) {
  const int64_t start = o * stride - pad;
  const int64_t end = start + k < size + pad ? start + k : size + pad;
  const int64_t lo = start > 0 ? start : 0, hi = end < size ? end : size;
  return {lo, hi > lo ? hi : lo, end - start};
}

// One output of a max pool whose window starts at (h0, w0); taps outside the plane are -128.
int8_t pool_one(const int8_t* xp, int64_t H, int64_t W, int64_t h0, int64_t w0, int64_t kh,
                int64_t kw, int64_t dh, int64_t dw) {
  int32_t m = -128;
  for (int64_t i = 0; i < kh; ++i) {
    const int64_t h = h0 + i * dh;
    if (h < 0 || h >= H) continue;
    for (int64_t j = 0; j < kw; ++j) {
      const int64_t w = w0 + j * dw;
      if (w < 0 || w >= W) continue;
      const int32_t v = xp[h * W + w];
      m = v > m ? v : m;
    }
  }
  return int8_t(m);
}

}  // namespace

Error quantize_per_tensor_out(KernelContext& ctx, const Tensor& input, double scale,
                              int64_t zero_point, int64_t quant_min, int64_t quant_max,
                              Tensor& out) {
  const char* op = "etb_quantized::quantize_per_tensor";
  if (input.dtype() != ScalarType::Float)
    return fail(Error::InvalidArgument, "%s: input must be Float", op);
  ETB_TRY(expect_char(out, op, "out"));
  OutQuant q;
  ETB_TRY(make_out_quant(scale, zero_point, quant_min, quant_max, op, &q));
  ETB_TRY(out.resize(input.sizes()));
  const float* __restrict x = input.data_as<float>();
  int8_t* __restrict y = out.data_as<int8_t>();
  native::parallel_range(ctx, input.numel(), 1, [&](int64_t b, int64_t e) {
    int64_t i = b;
#if defined(__AVX2__)
    const OutQuant8 v(q);
    for (; i + 8 <= e; i += 8) store_int8x8(quantize8(_mm256_loadu_ps(x + i), v), y + i);
#endif
    for (; i < e; ++i) y[i] = quantize_one(x[i], q);
  });
  return Error::Ok;
}

Error dequantize_per_tensor_out(KernelContext& ctx, const Tensor& input, double scale,
                                int64_t zero_point, Tensor& out) {
  const char* op = "etb_quantized::dequantize_per_tensor";
  ETB_TRY(expect_char(input, op, "input"));
  if (out.dtype() != ScalarType::Float)
    return fail(Error::InvalidArgument, "%s: out must be Float", op);
  ETB_TRY(check_scale(scale, op, "scale"));
  ETB_TRY(check_input_zp(zero_point, op, "input"));
  ETB_TRY(out.resize(input.sizes()));
  const int8_t* __restrict x = input.data_as<int8_t>();
  float* __restrict y = out.data_as<float>();
  const float s = float(scale);
  const int32_t zp = int32_t(zero_point);
  native::parallel_range(ctx, input.numel(), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = float(int32_t(x[i]) - zp) * s;
  });
  return Error::Ok;
}

namespace {

#if defined(__AVX2__)
// table[v + 128] for 32 int8 values v, from the table's rows as table_lookup_out lays them
// out. vpshufb reads row entry (index & 15) where the index byte is >= 0 and gives 0 where it
// is negative. The lower half: index u = v + 128 read as signed is >= 0 exactly for u < 128;
// subtracting 16 per row (saturating, so negatives stay negative) leaves it >= 0 for rows
// 0..u/16, whose XOR-chained entries telescope to row u/16's. The upper half does the same
// from v itself (>= 0 exactly for u >= 128) over rows 8-15.
inline __m256i lookup32(const uint8_t (*rows)[16], __m256i v) {
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256i lo = _mm256_xor_si256(v, _mm256_set1_epi8(char(0x80)));  // u as a signed byte
  __m256i hi = v;
  __m256i r = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    const __m256i row_lo =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(rows[k])));
    const __m256i row_hi =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(rows[8 + k])));
    r = _mm256_xor_si256(r, _mm256_shuffle_epi8(row_lo, lo));
    r = _mm256_xor_si256(r, _mm256_shuffle_epi8(row_hi, hi));
    lo = _mm256_subs_epi8(lo, sixteen);
    hi = _mm256_subs_epi8(hi, sixteen);
  }
  return r;
}
#endif

// The sum (kMul: the product) of the two dequantized values, in float32.
template <bool kMul>
inline float combine(float a, float b) {
  return kMul ? a * b : a + b;
}
#if defined(__AVX2__)
template <bool kMul>
inline __m256 combine8(__m256 a, __m256 b) {
  return kMul ? _mm256_mul_ps(a, b) : _mm256_add_ps(a, b);
}
#endif

// add and mul: both inputs dequantized in float32, combined, quantized; with broadcasting.
template <bool kMul>
Error binary_out(KernelContext& ctx, const char* op, const Tensor& self, double self_scale,
                 int64_t self_zero_point, const Tensor& other, double other_scale,
                 int64_t other_zero_point, double output_scale, int64_t output_zero_point,
                 int64_t output_min, int64_t output_max, Tensor& out) {
  ETB_TRY(expect_char(self, op, "self"));
  ETB_TRY(expect_char(other, op, "other"));
  ETB_TRY(expect_char(out, op, "out"));
  ETB_TRY(check_scale(self_scale, op, "self_scale"));
  ETB_TRY(check_scale(other_scale, op, "other_scale"));
  ETB_TRY(check_input_zp(self_zero_point, op, "self"));
  ETB_TRY(check_input_zp(other_zero_point, op, "other"));
  OutQuant q;
  ETB_TRY(make_out_quant(output_scale, output_zero_point, output_min, output_max, op, &q));
  int64_t sizes[kMaxDim];
  int dim = 0;
  ETB_TRY(native::broadcast_shape(self, other, sizes, &dim, op));
  ETB_TRY(out.resize(Span<const int64_t>(sizes, size_t(dim))));
  if (out.numel() == 0) return Error::Ok;
  native::Broadcast2 p;
  native::make_broadcast2(self, other, out.sizes(), &p);
  const int8_t* a = self.data_as<int8_t>();
  const int8_t* b = other.data_as<int8_t>();
  int8_t* y = out.data_as<int8_t>();
  const float as = float(self_scale), bs = float(other_scale);
  const int32_t az = int32_t(self_zero_point), bz = int32_t(other_zero_point);
  // out may alias self or other elementwise (in place): each element is read before written.
  // A row reads each operand contiguously (stride 1) or as one broadcast value (stride 0:
  // a squeeze-and-excite gate) in vectors; other strides one element at a time.
  auto row = [&](int64_t oo, int64_t oa, int64_t sa, int64_t ob, int64_t sb, int64_t n) {
    int8_t* o = y + oo;
    const int8_t* x0 = a + oa;
    const int8_t* x1 = b + ob;
    int64_t i = 0;
#if defined(__AVX2__)
    if ((sa == 0 || sa == 1) && (sb == 0 || sb == 1)) {
      const OutQuant8 v(q);
      const __m256i azv = _mm256_set1_epi32(az), bzv = _mm256_set1_epi32(bz);
      const __m256 asv = _mm256_set1_ps(as), bsv = _mm256_set1_ps(bs);
      const __m256i a0 = _mm256_set1_epi32(x0[0]), b0 = _mm256_set1_epi32(x1[0]);
      for (; i + 8 <= n; i += 8) {
        const __m256i ia =
            sa == 0
                ? a0
                : _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x0 + i)));
        const __m256i ib =
            sb == 0
                ? b0
                : _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x1 + i)));
        const __m256 fa = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ia, azv)), asv);
        const __m256 fb = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ib, bzv)), bsv);
        store_int8x8(quantize8(combine8<kMul>(fa, fb), v), o + i);
      }
    }
#endif
    for (; i < n; ++i) {
      const float fa = float(int32_t(x0[i * sa]) - az) * as;
      const float fb = float(int32_t(x1[i * sb]) - bz) * bs;
      o[i] = quantize_one(combine<kMul>(fa, fb), q);
    }
  };
  // An element costs about 8 of parallel_range's units (a copied element): two
  // dequantizations, the op and a requantization. At 1 unit, MobileNetV2's int8 adds of 7.8K
  // to 25K elements were one task each, on the calling thread alone (8: 1.5% faster at 2
  // threads).
  constexpr int64_t kElementCost = 8;
  native::parallel_range(ctx, out.numel(), kElementCost,
                         [&](int64_t b, int64_t e) { native::for_each_row(p, b, e, row); });
  return Error::Ok;
}

}  // namespace

Error add_out(KernelContext& ctx, const Tensor& self, double self_scale, int64_t self_zero_point,
              const Tensor& other, double other_scale, int64_t other_zero_point,
              double output_scale, int64_t output_zero_point, int64_t output_min,
              int64_t output_max, Tensor& out) {
  return binary_out<false>(ctx, "etb_quantized::add", self, self_scale, self_zero_point, other,
                           other_scale, other_zero_point, output_scale, output_zero_point,
                           output_min, output_max, out);
}

Error mul_out(KernelContext& ctx, const Tensor& self, double self_scale, int64_t self_zero_point,
              const Tensor& other, double other_scale, int64_t other_zero_point,
              double output_scale, int64_t output_zero_point, int64_t output_min,
              int64_t output_max, Tensor& out) {
  return binary_out<true>(ctx, "etb_quantized::mul", self, self_scale, self_zero_point, other,
                          other_scale, other_zero_point, output_scale, output_zero_point,
                          output_min, output_max, out);
}

Error table_lookup_out(KernelContext& ctx, const Tensor& input, const Tensor& table, Tensor& out) {
  const char* op = "etb_quantized::table_lookup";
  ETB_TRY(expect_char(input, op, "input"));
  ETB_TRY(expect_char(table, op, "table"));
  ETB_TRY(expect_char(out, op, "out"));
  if (table.numel() != 256)
    return fail(Error::InvalidArgument, "%s: the table has %lld entries, not 256", op,
                (long long)table.numel());
  ETB_TRY(out.resize(input.sizes()));
  const int8_t* x = input.data_as<int8_t>();
  const int8_t* t = table.data_as<int8_t>() + 128;  // t[v] for v in [-128, 127]
  int8_t* y = out.data_as<int8_t>();
#if defined(__AVX2__)
  // The table as 16 rows of 16, each row XORed with the one before within its half (rows
  // 0-7, rows 8-15): see lookup32.
  alignas(32) uint8_t rows[16][16];
  const uint8_t* tu = reinterpret_cast<const uint8_t*>(table.data_as<int8_t>());
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      rows[r][c] = uint8_t(tu[16 * r + c] ^ (r % 8 != 0 ? tu[16 * (r - 1) + c] : 0));
#endif
  native::parallel_range(ctx, input.numel(), 1, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
#if defined(__AVX2__)
    for (; i + 32 <= end; i += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), lookup32(rows, v));
    }
#elif defined(__ARM_NEON) && defined(__aarch64__)
    const uint8_t* tu = reinterpret_cast<const uint8_t*>(table.data_as<int8_t>());
    const uint8x16x4_t q0 = vld1q_u8_x4(tu), q1 = vld1q_u8_x4(tu + 64);
    const uint8x16x4_t q2 = vld1q_u8_x4(tu + 128), q3 = vld1q_u8_x4(tu + 192);
    for (; i + 16 <= end; i += 16) {
      // Index x + 128; each 64-entry quarter looks up (index - 64 q), out of range gives 0
      // (vqtbl4q) or keeps the lane (vqtbx4q).
      const uint8x16_t idx = veorq_u8(vld1q_u8(reinterpret_cast<const uint8_t*>(x + i)),
                                      vdupq_n_u8(0x80));
      uint8x16_t r = vqtbl4q_u8(q0, idx);
      r = vqtbx4q_u8(r, q1, vsubq_u8(idx, vdupq_n_u8(64)));
      r = vqtbx4q_u8(r, q2, vsubq_u8(idx, vdupq_n_u8(128)));
      r = vqtbx4q_u8(r, q3, vsubq_u8(idx, vdupq_n_u8(192)));
      vst1q_u8(reinterpret_cast<uint8_t*>(y + i), r);
    }
#endif
    for (; i < end; ++i) y[i] = t[x[i]];
  });
  return Error::Ok;
}

Error mean_out(KernelContext& ctx, const Tensor& input, double input_scale,
               int64_t input_zero_point, Span<const int64_t> dim, bool keepdim, double output_scale,
               int64_t output_zero_point, Tensor& out) {
  const char* op = "etb_quantized::mean";
  ETB_TRY(expect_char(input, op, "input"));
  ETB_TRY(expect_char(out, op, "out"));
  ETB_TRY(check_scale(input_scale, op, "input_scale"));
  ETB_TRY(check_input_zp(input_zero_point, op, "input"));
  OutQuant q;
  ETB_TRY(make_out_quant(output_scale, output_zero_point, -128, 127, op, &q));
  const int nd = input.dim();
  if (dim.size() == 0)
    return fail(Error::NotSupported, "%s: an empty dim list (reduce all) is not supported", op);
  if (nd == 0) return fail(Error::NotSupported, "%s: 0-d input", op);
  native::Reduction plan;
  ETB_TRY(native::plan_reduction(input, dim, keepdim, op, &plan));
  const bool* reduced = plan.reduce;
  const int64_t count = plan.count;
  ETB_TRY(native::resize_to(out, plan.osz, plan.od));
  if (out.numel() == 0) return Error::Ok;
  if (count == 0) return fail(Error::InvalidArgument, "%s: mean over an empty dimension", op);
  const int64_t on = out.numel();
  Result<void*> mem = ctx.allocate_temp(size_t(on) * sizeof(int32_t));
  if (!mem.ok()) return mem.error();
  int32_t* acc = static_cast<int32_t*>(mem.value());
  const int8_t* x = input.data_as<int8_t>();
  const int32_t zp = int32_t(input_zero_point);
  // Trailing reduced dims: contiguous inner sums. Otherwise a strided walk of the input.
  int first_reduced = nd;
  while (first_reduced > 0 && reduced[first_reduced - 1]) --first_reduced;
  bool trailing = true;
  for (int d = 0; d < first_reduced; ++d) trailing = trailing && !reduced[d];
  if (trailing) {
    native::parallel_range(ctx, on, count, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const int8_t* __restrict xr = x + o * count;
        int32_t s = 0;
        for (int64_t i = 0; i < count; ++i) s += xr[i];
        acc[o] = int32_t(int64_t(s) - int64_t(zp) * count);
      }
    });
  } else {
    int64_t ostride[kMaxDim];
    int64_t st = 1;
    for (int d = nd - 1; d >= 0; --d) {
      ostride[d] = reduced[d] ? 0 : st;
      if (!reduced[d]) st *= input.size(d);
    }
    for (int64_t o = 0; o < on; ++o) acc[o] = 0;
    int64_t idx[kMaxDim] = {};
    int64_t off = 0;
    const int64_t n = input.numel();
    for (int64_t i = 0; i < n; ++i) {
      acc[off] += int32_t(x[i]) - zp;
      for (int d = nd - 1; d >= 0; --d) {
        off += ostride[d];
        if (++idx[d] < input.size(d)) break;
        off -= ostride[d] * input.size(d);
        idx[d] = 0;
      }
    }
  }
  const float xs = float(input_scale), fc = float(count);
  int8_t* y = out.data_as<int8_t>();
  for (int64_t o = 0; o < on; ++o) y[o] = quantize_one(float(acc[o]) * xs / fc, q);
  return Error::Ok;
}

Error max_pool2d_out(KernelContext& ctx, const Tensor& input, Span<const int64_t> kernel_size,
                     Span<const int64_t> stride, Span<const int64_t> padding,
                     Span<const int64_t> dilation, bool ceil_mode, Tensor& out) {
  const char* op = "etb_quantized::max_pool2d";
  ETB_TRY(expect_char(input, op, "input"));
  ETB_TRY(expect_char(out, op, "out"));
  if (input.dim() != 3 && input.dim() != 4)
    return fail(Error::InvalidArgument, "%s: input must be 3-d or 4-d, got %d-d", op, input.dim());
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  if (kernel_size.size() == 0 || !pair_items(kernel_size, 1, 1, &kh, &kw) ||
      !pair_items(stride, kh, kw, &sh, &sw) || !pair_items(padding, 0, 0, &ph, &pw) ||
      !pair_items(dilation, 1, 1, &dh, &dw))
    return fail(Error::InvalidArgument, "%s: kernel/stride/padding/dilation must have 1 or 2 items",
                op);
  constexpr int64_t kLimit = int64_t(1) << 30;
  if (kh > kLimit || kw > kLimit || sh > kLimit || sw > kLimit || dh > kLimit || dw > kLimit ||
      kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || ph < 0 || pw < 0 || ph * 2 > kh ||
      pw * 2 > kw)
    return fail(Error::InvalidArgument, "%s: invalid kernel, stride, padding or dilation", op);
  const int64_t H = input.size(input.dim() - 2), W = input.size(input.dim() - 1);
  const int64_t planes = input.dim() == 4 ? input.size(0) * input.size(1) : input.size(0);
  const int64_t OH = pooled_size(H, kh, ph, sh, dh, ceil_mode);
  const int64_t OW = pooled_size(W, kw, pw, sw, dw, ceil_mode);
  if (OH <= 0 || OW <= 0) return fail(Error::InvalidArgument, "%s: output would be empty", op);
  int64_t osz[4];
  for (int i = 0; i < input.dim() - 2; ++i) osz[i] = input.size(i);
  osz[input.dim() - 2] = OH;
  osz[input.dim() - 1] = OW;
  ETB_TRY(out.resize(Span<const int64_t>(osz, size_t(input.dim()))));
  const int8_t* x = input.data_as<int8_t>();
  int8_t* y = out.data_as<int8_t>();
  // Output columns per pass: their input span fits the row buffers (a huge kernel: one).
  const int64_t reach = (kw - 1) * dw;
  const int64_t chunk = reach < kPoolRowBytes ? (kPoolRowBytes - 1 - reach) / sw + 1 : 0;
  native::parallel_range(ctx, planes, OH * OW * kh * kw, [&](int64_t begin, int64_t end) {
    alignas(64) int8_t rows[kPoolRowBytes], cols[kPoolRowBytes];
    for (int64_t p = begin; p < end; ++p) {
      const int8_t* xp = x + p * H * W;
      for (int64_t oh = 0; oh < OH; ++oh) {
        int8_t* yr = y + (p * OH + oh) * OW;
        const int64_t h0 = oh * sh - ph;
        if (chunk == 0) {
          for (int64_t ow = 0; ow < OW; ++ow)
            yr[ow] = pool_one(xp, H, W, h0, ow * sw - pw, kh, kw, dh, dw);
          continue;
        }
        // The window's rows inside the plane (padding is -128, below every value).
        const int64_t i_lo = h0 >= 0 ? 0 : std::min(kh, (-h0 + dh - 1) / dh);
        const int64_t i_hi = h0 >= H ? i_lo : std::max(i_lo, std::min(kh, (H - h0 + dh - 1) / dh));
        for (int64_t ow0 = 0; ow0 < OW; ow0 += chunk) {
          const int64_t n = OW - ow0 < chunk ? OW - ow0 : chunk;
          const int64_t w0 = ow0 * sw - pw, starts = (n - 1) * sw + 1, span = starts + reach;
          // rows[t]: the largest of the window's rows at column w0 + t.
          const int64_t t_lo = w0 < 0 ? (-w0 < span ? -w0 : span) : 0;
          const int64_t t_hi = W - w0 < span ? (W - w0 > t_lo ? W - w0 : t_lo) : span;
          for (int64_t t = 0; t < t_lo; ++t) rows[t] = -128;
          for (int64_t t = t_hi; t < span; ++t) rows[t] = -128;
          if (i_lo == i_hi) {
            for (int64_t t = t_lo; t < t_hi; ++t) rows[t] = -128;
          } else {
            copy_run(rows + t_lo, xp + (h0 + i_lo * dh) * W + w0 + t_lo, t_hi - t_lo);
            for (int64_t i = i_lo + 1; i < i_hi; ++i)
              max_bytes(rows + t_lo, rows + t_lo, xp + (h0 + i * dh) * W + w0 + t_lo, t_hi - t_lo);
          }
          // The window's columns: the largest at every start; every sw-th start is an output.
          int8_t* best = sw == 1 ? yr + ow0 : cols;
          if (kw == 1) {
            for (int64_t t = 0; t < starts; ++t) best[t] = rows[t];
          } else {
            max_bytes(best, rows, rows + dw, starts);
            for (int64_t j = 2; j < kw; ++j) max_bytes(best, best, rows + j * dw, starts);
          }
          if (sw != 1)
            for (int64_t o = 0; o < n; ++o) yr[ow0 + o] = cols[o * sw];
        }
      }
    }
  });
  return Error::Ok;
}

Error avg_pool2d_out(KernelContext& ctx, const Tensor& input, double input_scale,
                     int64_t input_zero_point, Span<const int64_t> kernel_size,
                     Span<const int64_t> stride, Span<const int64_t> padding, bool ceil_mode,
                     bool count_include_pad, Optional<int64_t> divisor_override,
                     double output_scale, int64_t output_zero_point, Tensor& out) {
  const char* op = "etb_quantized::avg_pool2d";
  ETB_TRY(expect_char(input, op, "input"));
  ETB_TRY(expect_char(out, op, "out"));
  ETB_TRY(check_scale(input_scale, op, "input_scale"));
  ETB_TRY(check_input_zp(input_zero_point, op, "input"));
  OutQuant q;
  ETB_TRY(make_out_quant(output_scale, output_zero_point, -128, 127, op, &q));
  if (input.dim() != 3 && input.dim() != 4)
    return fail(Error::InvalidArgument, "%s: input must be 3-d or 4-d, got %d-d", op, input.dim());
  int64_t kh, kw, sh, sw, ph, pw;
  if (kernel_size.size() == 0 || !pair_items(kernel_size, 1, 1, &kh, &kw) ||
      !pair_items(stride, kh, kw, &sh, &sw) || !pair_items(padding, 0, 0, &ph, &pw))
    return fail(Error::InvalidArgument, "%s: kernel/stride/padding must have 1 or 2 items", op);
  constexpr int64_t kLimit = int64_t(1) << 30;
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || kh > kLimit || kw > kLimit || sh > kLimit ||
      sw > kLimit || ph < 0 || pw < 0 || ph * 2 > kh || pw * 2 > kw)
    return fail(Error::InvalidArgument, "%s: invalid kernel, stride or padding", op);
  if (kh * kw > kMaxAvgTaps)
    return fail(Error::NotSupported, "%s: a %lldx%lld window has more than %lld taps", op,
                (long long)kh, (long long)kw, (long long)kMaxAvgTaps);
  if (divisor_override.has_value && divisor_override.value == 0)
    return fail(Error::InvalidArgument, "%s: divisor_override must be nonzero", op);
  const int64_t H = input.size(input.dim() - 2), W = input.size(input.dim() - 1);
  const int64_t planes = input.dim() == 4 ? input.size(0) * input.size(1) : input.size(0);
  const int64_t OH = pooled_size(H, kh, ph, sh, 1, ceil_mode);
  const int64_t OW = pooled_size(W, kw, pw, sw, 1, ceil_mode);
  if (OH <= 0 || OW <= 0) return fail(Error::InvalidArgument, "%s: output would be empty", op);
  int64_t osz[4];
  for (int i = 0; i < input.dim() - 2; ++i) osz[i] = input.size(i);
  osz[input.dim() - 2] = OH;
  osz[input.dim() - 1] = OW;
  ETB_TRY(out.resize(Span<const int64_t>(osz, size_t(input.dim()))));
  if (out.numel() == 0) return Error::Ok;
  const int8_t* x = input.data_as<int8_t>();
  int8_t* y = out.data_as<int8_t>();
  const float xs = float(input_scale);
  const int64_t zp = input_zero_point;
  // The reference converts the override to float32 through a double.
  const float override_div = float(double(divisor_override.value));
  // One output: acc = the sum of (x - zp) over the taps inside the plane (padding is 0).
  auto pooled = [&](int64_t sum, const Window& r, const Window& c) {
    const int64_t taps = (r.hi - r.lo) * (c.hi - c.lo);
    const int32_t acc = int32_t(sum - zp * taps);
    const float div = divisor_override.has_value ? override_div
                      : count_include_pad        ? float(r.padded * c.padded)
                                                 : float(taps);
    return quantize_one(div == 0.f ? 0.f : float(acc) * xs / div, q);
  };
  // Output columns per pass: their input span fits the column sums (a huge kernel: none).
  const int64_t chunk = kw <= kAvgSpan ? (kAvgSpan - kw) / sw + 1 : 0;
  // Each task takes whole output rows, each computed alone: any thread count is exact.
  native::parallel_range(ctx, planes * OH, OW * kh * kw, [&](int64_t begin, int64_t end) {
    alignas(64) int32_t sums[kAvgSpan];
    for (int64_t row = begin; row < end; ++row) {
      const int64_t p = row / OH, oh = row - p * OH;
      const int8_t* xp = x + p * H * W;
      int8_t* yr = y + row * OW;
      const Window r = window(oh, H, kh, sh, ph);
      if (chunk == 0) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          const Window c = window(ow, W, kw, sw, pw);
          int64_t sum = 0;
          for (int64_t h = r.lo; h < r.hi; ++h)
            for (int64_t w = c.lo; w < c.hi; ++w) sum += xp[h * W + w];
          yr[ow] = pooled(sum, r, c);
        }
        continue;
      }
      for (int64_t ow0 = 0; ow0 < OW; ow0 += chunk) {
        const int64_t n = OW - ow0 < chunk ? OW - ow0 : chunk;
        // sums[t]: column first + t summed over the window's rows (0 outside the plane).
        const int64_t first = ow0 * sw - pw, span = (n - 1) * sw + kw;
        const int64_t t_lo = first < 0 ? (-first < span ? -first : span) : 0;
        const int64_t t_hi = W - first < span ? (W - first > t_lo ? W - first : t_lo) : span;
        for (int64_t t = 0; t < span; ++t) sums[t] = 0;
        for (int64_t h = r.lo; h < r.hi; ++h)
          add_row(sums + t_lo, xp + h * W + first + t_lo, t_hi - t_lo);
        for (int64_t o = 0; o < n; ++o) {
          const Window c = window(ow0 + o, W, kw, sw, pw);
          int64_t sum = 0;
          for (int64_t t = c.lo - first; t < c.hi - first; ++t) sum += sums[t];
          yr[ow0 + o] = pooled(sum, r, c);
        }
      }
    }
  });
  return Error::Ok;
}

Error amax_out(KernelContext& ctx, const Tensor& input, Span<const int64_t> dim, bool keepdim,
               Tensor& out) {
  const char* op = "etb_quantized::amax";
  ETB_TRY(expect_char(input, op, "input"));
  ETB_TRY(expect_char(out, op, "out"));
  const int nd = input.dim();
  native::Reduction plan;
  ETB_TRY(native::plan_reduction(input, dim, keepdim, op, &plan));
  const bool* reduced = plan.reduce;
  const int64_t count = plan.count;
  if (count == 0) return fail(Error::InvalidArgument, "%s: cannot reduce over a dim of size 0", op);
  ETB_TRY(native::resize_to(out, plan.osz, plan.od));
  const int64_t on = out.numel();
  if (on == 0) return Error::Ok;
  const int8_t* x = input.data_as<int8_t>();
  int8_t* y = out.data_as<int8_t>();
  if (count == 1) {  // only dims of size 1 go: the elements keep their order
    copy_run(y, x, on);
    return Error::Ok;
  }
  // Runs of adjacent dims of one kind (reduced or kept) are one block; dims of size 1 drop.
  int64_t size[kMaxDim], step[kMaxDim];
  bool red[kMaxDim];
  int nb = 0;
  for (int d = 0; d < nd; ++d) {
    if (input.size(d) == 1) continue;
    if (nb > 0 && red[nb - 1] == reduced[d]) {
      size[nb - 1] *= input.size(d);
      step[nb - 1] = input.stride(d);
    } else {
      size[nb] = input.size(d);
      step[nb] = input.stride(d);
      red[nb] = reduced[d];
      ++nb;
    }
  }
  // The innermost block: contiguous rows of `inner` outputs (kept) or runs of `run` inputs
  // that one output reduces (reduced). The other blocks index the rows (kept) and the groups
  // of runs added to them (reduced), outermost first.
  const bool rows_of_outputs = !red[nb - 1];
  const int64_t inner = rows_of_outputs ? size[nb - 1] : 1;
  const int64_t run = rows_of_outputs ? 1 : size[nb - 1];
  int64_t ksize[kMaxDim], kstep[kMaxDim], rsize[kMaxDim], rstep[kMaxDim];
  int nk = 0, nr = 0;
  for (int b = 0; b < nb - 1; ++b) {
    if (red[b]) {
      rsize[nr] = size[b];
      rstep[nr++] = step[b];
    } else {
      ksize[nk] = size[b];
      kstep[nk++] = step[b];
    }
  }
  const int64_t groups = count / run;  // runs per output
  // The input offset of kept index `index` (outermost first).
  auto kept_offset = [&](int64_t index) {
    int64_t off = 0;
    for (int k = nk - 1; k >= 0; --k) {
      off += (index % ksize[k]) * kstep[k];
      index /= ksize[k];
    }
    return off;
  };
  // Calls f(offset) for every group of the reduced blocks, in order.
  auto for_each_group = [&](auto&& f) {
    int64_t idx[kMaxDim] = {};
    int64_t off = 0;
    for (int64_t g = 0; g < groups; ++g) {
      f(off);
      for (int k = nr - 1; k >= 0; --k) {
        off += rstep[k];
        if (++idx[k] < rsize[k]) break;
        off -= rstep[k] * rsize[k];
        idx[k] = 0;
      }
    }
  };
  if (rows_of_outputs) {
    native::parallel_range(ctx, on / inner, count * inner, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int8_t* xr = x + kept_offset(r);
        int8_t* yr = y + r * inner;
        bool first = true;
        for_each_group([&](int64_t off) {
          if (first)
            copy_run(yr, xr + off, inner);
          else
            max_bytes(yr, yr, xr + off, inner);
          first = false;
        });
      }
    });
  } else {
    native::parallel_range(ctx, on, count, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        const int8_t* xo = x + kept_offset(o);
        int8_t best = -128;
        for_each_group([&](int64_t off) {
          const int8_t m = max_run(xo + off, run);
          best = m > best ? m : best;
        });
        y[o] = best;
      }
    });
  }
  return Error::Ok;
}

}  // namespace quantized
}  // namespace etb
