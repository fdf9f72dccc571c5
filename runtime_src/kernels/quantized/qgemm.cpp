// B is packed in blocks of columns as int16 pairs along K (element pair (k, k+1) of a column
// side by side), A widened to int16 rows. The micro-kernel then multiplies a
// broadcast pair of A by a vector of B pairs and adds both products into int32 lanes in one
// instruction (vpmaddwd), holding a kMR x kNR tile of accumulators in registers across the
// whole depth. aarch64 multiplies the two halves of each pair with NEON vmlal on the same
// packing; elsewhere a plain C++ micro-kernel does. Sums are exact: |int8 * int8| <= 2^14.
//
// With AVX512-VNNI the step is four bytes, not two int16: vpdpbusd adds four products of an
// unsigned byte by a signed byte into each int32 lane, twice vpdpwssd's work per instruction.
// B (the activations) is packed as bytes x + 128 (unsigned), four consecutive k of a column
// side by side; A (the weights) stays int8, four k to a broadcast word, and each packed row
// starts with its correction 128 * sum_k A[i][k], which the tile subtracts: the sums are the
// same exact int32 values as the other paths' (modulo 2^32, where both wrap alike).
#include "kernels/quantized/qgemm.h"

#include <cstring>
#include <new>

#include "kernels/cache.h"
#include "kernels/intrinsics.h"

namespace etb {
namespace quantized {
namespace {

#if defined(__AVX512BW__)
constexpr int64_t kMR = 8, kNR = 32;  // 16 zmm accumulators
#elif defined(__AVX2__)
constexpr int64_t kMR = 6, kNR = 16;  // 12 ymm accumulators
#else
constexpr int64_t kMR = 4, kNR = 8;
#endif
// Packed B block: hosted, it stays in L2 across A slivers; bare metal (no cache to fit, little
// RAM), small.
#if defined(ETB_BARE_METAL)
constexpr int64_t kBlockBytes = 16 * 1024;
#else
constexpr int64_t kBlockBytes = 192 * 1024;
#endif
// Packed A rows: packed once per call, reused by every B block (bigger A: chunks of rows).
// Hosted, 2 MiB: ResNet18's 256-channel 3x3 weights (1.2 MiB widened) are packed whole, so
// the threads can split a convolution's column tiles. Bare metal, 32 KiB: a microcontroller's
// RAM (B is packed again for each chunk).
#if defined(ETB_BARE_METAL)
constexpr int64_t kAChunkBytes = 32 * 1024;
#else
constexpr int64_t kAChunkBytes = 2 << 20;
#endif
// Panels that cover a cache line of each of B's rows (int8 columns in a row).
constexpr int64_t kLinePanels = kNR >= 64 ? 1 : 64 / kNR;
constexpr int64_t kSmallN = 4;  // fewer columns: plain dot products
// A last panel of this many columns, at a depth of at least kDotDepth, takes dot products of
// the sliver's packed rows (in L1 from its tiles) and the column widened: a 7x7 plane's 49th
// column would cost half a tile, 8 columns' multiply-adds. (With the VNNI step's packing, a
// tile.) Dots over A itself were slower in a model: its int8 rows are a second stream of
// weights from memory.
#if defined(ETB_QGEMM_U8S8)
constexpr int64_t kDotColumns = 0, kDotDepth = 64;
#else
constexpr int64_t kDotColumns = 1, kDotDepth = 64;
#endif

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define ETB_QGEMM_U8S8 1
constexpr int64_t kStepK = 4;      // depth per 32-bit step: four bytes
constexpr int64_t kHeadWords = 1;  // a packed row of A starts with its correction
#else
constexpr int64_t kStepK = 2;  // depth per 32-bit step: an int16 pair
constexpr int64_t kHeadWords = 0;
#endif

// 32-bit steps of depth K (the last one zero-padded).
inline int64_t steps(int64_t K) {
  return (K + kStepK - 1) / kStepK;
}
// 32-bit words of a packed row of A.
inline int64_t row_words(int64_t K) {
  return kHeadWords + steps(K);
}

// Columns of B per packed block for depth K (a multiple of kNR).
int64_t block_cols(int64_t K) {
  int64_t nc = kBlockBytes / (steps(K) * 4);
  nc = (nc / kNR) * kNR;
  return nc < kNR ? kNR : nc;
}

// With threads, qgemm splits columns (runs of panels) when there are at least this many panels
// a thread, else rows.
constexpr int64_t kColumnSplitPanels = 4;

// Whether a product of N columns has threads but too few panels for them to split columns.
bool too_few_panels(int64_t N, int threads) {
  return threads > 1 && (N + kNR - 1) / kNR < kColumnSplitPanels * threads;
}

// Columns of B per packed block for an M x N x K product on `threads` threads. With threads
// and few panels (the threads then split rows, not columns: see qgemm) all of B is one block,
// so that each chunk of A takes one pack loop and one multiply loop rather than one pair per
// block (a 7x7 plane's 49 columns at depth 4608 would be 4 blocks of one panel).
// A block never holds more panels than the product has (DS-CNN's first convolution, depth 40,
// would otherwise take a 192 KiB block for its 125 columns).
int64_t b_block_cols(int64_t N, int64_t K, int threads) {
  const int64_t panels = (N + kNR - 1) / kNR;
  if (too_few_panels(N, threads)) return panels * kNR > kNR ? panels * kNR : kNR;
  return min64(block_cols(K), panels > 1 ? panels * kNR : kNR);
}

constexpr size_t align64(size_t n) {
  return (n + 63) & ~size_t(63);
}

// Rows of A packed at a time for depth K (a multiple of kMR; at most M rounded up).
int64_t chunk_rows(int64_t M, int64_t K) {
  int64_t rows = (kAChunkBytes / (row_words(K) * 4)) / kMR * kMR;
  if (rows < kMR) rows = kMR;
  const int64_t all = (M + kMR - 1) / kMR * kMR;
  return rows < all ? rows : all;
}

// The word of a column's depth rows past the end: x = 0 (A is zero there, so the products
// vanish), 0x80 as an unsigned byte with ETB_QGEMM_U8S8.
#if defined(ETB_QGEMM_U8S8)
constexpr uint32_t kZeroWord = 0x80808080u;
#else
constexpr uint32_t kZeroWord = 0;
#endif

#if defined(__SSE2__)
// 16 bytes of a row whose consecutive elements are kStep (1 or 2) bytes apart.
template <int kStep>
inline __m128i load16(const int8_t* p) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (kStep == 1) return lo;
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  const __m128i even = _mm_set1_epi16(0xff);
  return _mm_packus_epi16(_mm_and_si128(lo, even), _mm_and_si128(hi, even));
}

// pack_step's vector part, 16 columns at a time while whole loads fit: with kStep = 2 they
// reach one byte past the 16th column, so only while a 17th follows. Returns the columns done.
template <int kStep>
inline int64_t pack_step16(const int8_t* col, int64_t b_sk, int64_t ks, int64_t n, int16_t* out) {
  const int64_t end = kStep == 1 ? n : n - 1;
  int64_t j0 = 0;
#if defined(ETB_QGEMM_U8S8)
  // The step's rows (zero past the depth), interleaved bytewise into four bytes a column.
  uint8_t* __restrict d = reinterpret_cast<uint8_t*>(out);
  const __m128i flip = _mm_set1_epi8(char(0x80));
  for (; j0 + 16 <= end; j0 += 16) {
    __m128i x[4];
    for (int64_t q = 0; q < 4; ++q)
      x[q] = q < ks ? load16<kStep>(col + q * b_sk + j0 * kStep) : _mm_setzero_si128();
    const __m128i lo01 = _mm_unpacklo_epi8(x[0], x[1]), hi01 = _mm_unpackhi_epi8(x[0], x[1]);
    const __m128i lo23 = _mm_unpacklo_epi8(x[2], x[3]), hi23 = _mm_unpackhi_epi8(x[2], x[3]);
    const __m128i quads[4] = {_mm_unpacklo_epi16(lo01, lo23), _mm_unpackhi_epi16(lo01, lo23),
                              _mm_unpacklo_epi16(hi01, hi23), _mm_unpackhi_epi16(hi01, hi23)};
    for (int v = 0; v < 4; ++v)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 4 * j0 + 16 * v),
                       _mm_xor_si128(quads[v], flip));
  }
#else
  // Pairs: both rows sign-extended to int16 (unpacked with themselves, shifted right), then
  // interleaved.
  int16_t* __restrict d = out;
  for (; j0 + 16 <= end; j0 += 16) {
    const __m128i x0 = load16<kStep>(col + j0 * kStep);
    const __m128i x1 = ks > 1 ? load16<kStep>(col + b_sk + j0 * kStep) : _mm_setzero_si128();
    const __m128i w0[2] = {_mm_srai_epi16(_mm_unpacklo_epi8(x0, x0), 8),
                           _mm_srai_epi16(_mm_unpackhi_epi8(x0, x0), 8)};
    const __m128i w1[2] = {_mm_srai_epi16(_mm_unpacklo_epi8(x1, x1), 8),
                           _mm_srai_epi16(_mm_unpackhi_epi8(x1, x1), 8)};
    for (int h = 0; h < 2; ++h) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * j0 + 16 * h),
                       _mm_unpacklo_epi16(w0[h], w1[h]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * j0 + 16 * h + 8),
                       _mm_unpackhi_epi16(w0[h], w1[h]));
    }
  }
#endif
  return j0;
}
#endif

// Writes n 32-bit step words: word j holds depth rows [0, ks) of column j, element q at
// col[q * b_sk + j * b_sn] (ks <= kStepK; rows past ks as in kZeroWord).
inline void pack_step(const int8_t* col, int64_t b_sk, int64_t b_sn, int64_t ks, int64_t n,
                      int16_t* out) {
  int64_t j0 = 0;
#if defined(__SSE2__)
  if (b_sn == 1) j0 = pack_step16<1>(col, b_sk, ks, n, out);
  if (b_sn == 2) j0 = pack_step16<2>(col, b_sk, ks, n, out);
#endif
#if defined(ETB_QGEMM_U8S8)
  uint8_t* __restrict d = reinterpret_cast<uint8_t*>(out);
  for (int64_t j = j0; j < n; ++j)
    for (int64_t q = 0; q < kStepK; ++q)
      d[4 * j + q] = q < ks ? uint8_t(col[q * b_sk + j * b_sn] ^ 0x80) : uint8_t(0x80);
#else
  const int8_t* r1 = ks > 1 ? col + b_sk : col;
  for (int64_t j = j0; j < n; ++j) {
    out[2 * j] = col[j * b_sn];
    out[2 * j + 1] = ks > 1 ? int16_t(r1[j * b_sn]) : int16_t(0);
  }
#endif
}

// Panels a call of pack_b takes: one, or kLinePanels where B's rows alias in L1
// (kernels/cache.h). There a panel's reads evicted each row's line before the next panel read
// the rest of it: a 1x1 convolution 128 -> 128 on NCHW planes of 64x64 took 1.08-1.10x as
// long a pixel as on 60x60 (1.04x with AVX2), against 1.02-1.03x (0.99x) with a line's panels
// a call.
int64_t packed_panels_a_call(int64_t K, int64_t b_sk, int64_t b_sn) {
  return b_sn == 1 && rows_alias_in_l1(K, b_sk) ? kLinePanels : 1;
}

// Packs columns [n0, n0 + nc) of B into panels of kNR columns, a 32-bit step per column
// (an int16 pair, or four bytes x + 128 with ETB_QGEMM_U8S8): the steps [st_begin, st_end)
// of each panel, by default all of them. A step at a time across all the columns, so that
// each of B's rows is read in one pass over [n0, n0 + nc).
void pack_b(int64_t K, int64_t n0, int64_t nc, const int8_t* B, int64_t b_sk, int64_t b_sn,
            int16_t* out, int64_t st_begin = 0, int64_t st_end = -1) {
  const int64_t S = steps(K);
  if (st_end < 0) st_end = S;
  auto pack = [&](int64_t st, int64_t j0) {  // step st of the panel at column n0 + j0
    const int64_t nr = min64(kNR, nc - j0);
    int16_t* d = out + (j0 / kNR) * S * kNR * 2 + st * kNR * 2;
    pack_step(B + (kStepK * st) * b_sk + (n0 + j0) * b_sn, b_sk, b_sn,
              min64(kStepK, K - kStepK * st), nr, d);
    for (int64_t j = nr; j < kNR; ++j) std::memcpy(d + 2 * j, &kZeroWord, 4);
  };
  if (nc <= kNR) {  // one panel (the loop over panels cost a 1x1 convolution on 60x60 2%)
    for (int64_t st = st_begin; st < st_end; ++st) pack(st, 0);
    return;
  }
  for (int64_t st = st_begin; st < st_end; ++st)
    for (int64_t j0 = 0; j0 < nc; j0 += kNR) pack(st, j0);
}

#if defined(ETB_QGEMM_U8S8)
// Writes a packed row's correction, 128 * (the sum of the row's weights); returns where the
// row's bytes go.
inline int8_t* put_correction(int32_t sum, int16_t* d) {
  const int32_t correction = 128 * sum;
  std::memcpy(d, &correction, sizeof(correction));
  return reinterpret_cast<int8_t*>(d + 2 * kHeadWords);
}
#endif

// Packs rows [m0, m0 + mr) of A, row i at out + i * 2 * row_words(K): widened to int16 (an
// odd K gets a zero at the end of each row), so the micro-kernel broadcasts pair kp of row i
// from one int32; with ETB_QGEMM_U8S8, the correction word then the bytes, zero-padded to
// whole steps.
void pack_a(int64_t K, int64_t m0, int64_t mr, const int8_t* A, int64_t lda, int16_t* out) {
  for (int64_t i = 0; i < mr; ++i) {
    const int8_t* __restrict a = A + (m0 + i) * lda;
    int16_t* __restrict d = out + i * 2 * row_words(K);
#if defined(ETB_QGEMM_U8S8)
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += a[k];
    int8_t* bytes = put_correction(sum, d);
    std::memcpy(bytes, a, size_t(K));
    for (int64_t k = K; k < steps(K) * kStepK; ++k) bytes[k] = 0;
#else
    int64_t k = 0;
#if defined(__AVX2__)
    for (; k + 16 <= K; k += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + k), _mm256_cvtepi8_epi16(v));
    }
#endif
    for (; k < K; ++k) d[k] = a[k];
    if (K & 1) d[K] = 0;
#endif
  }
}

// Depth of a convolution's weight row in taps order: C channels in steps of kStepK (the last
// one zero-padded), each step once per tap.
inline int64_t taps_depth(int64_t C, int64_t T) {
  return steps(C) * kStepK * T;
}

// Packs rows [m0, m0 + mr) of convolution weights W [M][C][T] (C input channels, T taps) as
// pack_a packs rows of depth taps_depth(C, T), their depth in taps order: element
// (cs * T + t) * kStepK + q is W[m][cs * kStepK + q][t], zero past C. A step then holds
// kStepK channels of one tap: the word of one pixel in the input's taps layout.
void pack_taps_rows(int64_t C, int64_t T, int64_t m0, int64_t mr, const int8_t* W, int16_t* out) {
  const int64_t K = taps_depth(C, T);
  for (int64_t i = 0; i < mr; ++i) {
    const int8_t* __restrict w = W + (m0 + i) * C * T;
    auto at = [&](int64_t k) -> int8_t {
      const int64_t st = k / kStepK, c = (st / T) * kStepK + k % kStepK;
      return c < C ? w[c * T + st % T] : int8_t(0);
    };
    int16_t* __restrict d = out + i * 2 * row_words(K);
#if defined(ETB_QGEMM_U8S8)
    int32_t sum = 0;
    for (int64_t k = 0; k < C * T; ++k) sum += w[k];
    int8_t* bytes = put_correction(sum, d);
    for (int64_t k = 0; k < K; ++k) bytes[k] = at(k);
#else
    for (int64_t k = 0; k < K; ++k) d[k] = at(k);
#endif
  }
}

// The 32-bit step at p as one int32 (for a broadcast).
inline int32_t load_pair(const int16_t* p) {
  int32_t pair;
  std::memcpy(&pair, p, sizeof(pair));
  return pair;
}

// A tile of kMR rows x (kVecs * kNR / 2) columns: kVecs = 2 is the full panel, 1 its left
// half (for a last panel of at most kNR / 2 columns, which would otherwise waste half the
// multiplies on padding).
#if defined(ETB_QGEMM_U8S8)
// The accumulators are named variables, not an array: GCC 12 keeps an array of them in
// registers only by copying each around its vpdpbusd (whose accumulator is also its
// destination), two of the 16 on the stack, a store and a reload in every step's dependency
// chain; ResNet18's 3x3 layers took 1.3x as long as with this form. Inlined into its callers,
// the copies came back: it stays a function of its own.
static_assert(kMR == 8, "the VNNI micro-kernel is written for 8 rows");
template <int kVecs, class Steps>
[[gnu::noinline]] void micro_kernel(int64_t S, const int16_t* const* ar, Steps b_at,
                                    int32_t* tile) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero,
          c31 = zero, c40 = zero, c41 = zero, c50 = zero, c51 = zero, c60 = zero, c61 = zero,
          c70 = zero, c71 = zero;
  const int16_t* a[kMR];
  for (int64_t i = 0; i < kMR; ++i) a[i] = ar[i] + 2 * kHeadWords;
  for (int64_t st = 0; st < S; ++st) {
    const int16_t* bp = b_at(st);
    const __m512i b0 = _mm512_loadu_si512(bp);
    const __m512i b1 = kVecs == 2 ? _mm512_loadu_si512(bp + 32) : zero;
#define ETB_ROW(i)                                                  \
  {                                                                 \
    const __m512i ai = _mm512_set1_epi32(load_pair(a[i] + 2 * st)); \
    c##i##0 = _mm512_dpbusd_epi32(c##i##0, b0, ai);                 \
    if (kVecs == 2) c##i##1 = _mm512_dpbusd_epi32(c##i##1, b1, ai); \
  }
    ETB_ROW(0) ETB_ROW(1) ETB_ROW(2) ETB_ROW(3) ETB_ROW(4) ETB_ROW(5) ETB_ROW(6) ETB_ROW(7)
#undef ETB_ROW
  }
  const __m512i c[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                             {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
  for (int64_t i = 0; i < kMR; ++i) {
    const __m512i correction = _mm512_set1_epi32(load_pair(ar[i]));
    for (int v = 0; v < kVecs; ++v)
      _mm512_storeu_si512(tile + i * kNR + 16 * v, _mm512_sub_epi32(c[i][v], correction));
  }
}
#elif defined(__AVX512BW__)
template <int kVecs, class Steps>
void micro_kernel(int64_t Kp, const int16_t* const* ar, Steps b_at, int32_t* tile) {
  __m512i c[kMR][kVecs];
  for (int64_t i = 0; i < kMR; ++i)
    for (int v = 0; v < kVecs; ++v) c[i][v] = _mm512_setzero_si512();
  for (int64_t kp = 0; kp < Kp; ++kp) {
    const int16_t* bp = b_at(kp);
    __m512i b[kVecs];
    for (int v = 0; v < kVecs; ++v) b[v] = _mm512_loadu_si512(bp + 32 * v);
    for (int64_t i = 0; i < kMR; ++i) {
      const __m512i a = _mm512_set1_epi32(load_pair(ar[i] + 2 * kp));
      for (int v = 0; v < kVecs; ++v)
        c[i][v] = _mm512_add_epi32(c[i][v], _mm512_madd_epi16(a, b[v]));
    }
  }
  for (int64_t i = 0; i < kMR; ++i)
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_si512(tile + i * kNR + 16 * v, c[i][v]);
}
#elif defined(__AVX2__)
// Named accumulators, as in the VNNI kernel and for the same reason: with an array of them GCC
// copied every accumulator around its add in each step (and spilled a 6-row tile to the
// stack), and loaded each vector of B once per row. This form keeps the 12 in registers and
// loads B once a step: 1.3x the multiply-adds per second of the 4 x 16 array tile it replaced.
static_assert(kMR == 6, "the AVX2 micro-kernel is written for 6 rows");
template <int kVecs, class Steps>
[[gnu::noinline]] void micro_kernel(int64_t Kp, const int16_t* const* ar, Steps b_at,
                                    int32_t* tile) {
  const __m256i zero = _mm256_setzero_si256();
  __m256i c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero,
          c31 = zero, c40 = zero, c41 = zero, c50 = zero, c51 = zero;
  const int16_t *a0 = ar[0], *a1 = ar[1], *a2 = ar[2], *a3 = ar[3], *a4 = ar[4], *a5 = ar[5];
  for (int64_t kp = 0; kp < Kp; ++kp) {
    const int16_t* bp = b_at(kp);
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp));
    const __m256i b1 =
        kVecs == 2 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + 16)) : zero;
#define ETB_ROW(i)                                                                  \
  {                                                                                 \
    const __m256i ai = _mm256_set1_epi32(load_pair(a##i + 2 * kp));                 \
    c##i##0 = _mm256_add_epi32(c##i##0, _mm256_madd_epi16(ai, b0));                 \
    if (kVecs == 2) c##i##1 = _mm256_add_epi32(c##i##1, _mm256_madd_epi16(ai, b1)); \
  }
    ETB_ROW(0) ETB_ROW(1) ETB_ROW(2) ETB_ROW(3) ETB_ROW(4) ETB_ROW(5)
#undef ETB_ROW
  }
  const __m256i c[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                             {c30, c31}, {c40, c41}, {c50, c51}};
  for (int64_t i = 0; i < kMR; ++i)
    for (int v = 0; v < kVecs; ++v)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + i * kNR + 8 * v), c[i][v]);
}
#elif defined(__ARM_NEON) && defined(__aarch64__)
// kNR = 8 columns: two int32x4 accumulators a row. vld2q_s16 splits a kp step's 8 pairs into
// the 8 values of row 2kp and of row 2kp + 1 of B; each is multiplied by its element of A and
// added with vmlal (int16 x int16 -> int32).
template <int kVecs, class Steps>
void micro_kernel(int64_t Kp, const int16_t* const* ar, Steps b_at, int32_t* tile) {
  int32x4_t c[kMR][kVecs];
  for (int64_t i = 0; i < kMR; ++i)
    for (int v = 0; v < kVecs; ++v) c[i][v] = vdupq_n_s32(0);
  for (int64_t kp = 0; kp < Kp; ++kp) {
    const int16_t* bp = b_at(kp);
    const int16x8x2_t b = vld2q_s16(bp);
    for (int64_t i = 0; i < kMR; ++i) {
      const int16_t a0 = ar[i][2 * kp], a1 = ar[i][2 * kp + 1];
      c[i][0] = vmlal_n_s16(c[i][0], vget_low_s16(b.val[0]), a0);
      c[i][0] = vmlal_n_s16(c[i][0], vget_low_s16(b.val[1]), a1);
      if (kVecs == 2) {
        c[i][kVecs - 1] = vmlal_high_n_s16(c[i][kVecs - 1], b.val[0], a0);
        c[i][kVecs - 1] = vmlal_high_n_s16(c[i][kVecs - 1], b.val[1], a1);
      }
    }
  }
  for (int64_t i = 0; i < kMR; ++i)
    for (int v = 0; v < kVecs; ++v) vst1q_s32(tile + i * kNR + 4 * v, c[i][v]);
}
#else
template <int kVecs, class Steps>
void micro_kernel(int64_t Kp, const int16_t* const* ar, Steps b_at, int32_t* tile) {
  constexpr int64_t kCols = kVecs * kNR / 2;
  int32_t c[kMR][kCols] = {};
  for (int64_t kp = 0; kp < Kp; ++kp) {
    const int16_t* bp = b_at(kp);
    for (int64_t i = 0; i < kMR; ++i) {
      const int32_t a0 = ar[i][2 * kp], a1 = ar[i][2 * kp + 1];
      for (int64_t j = 0; j < kCols; ++j) c[i][j] += a0 * bp[2 * j] + a1 * bp[2 * j + 1];
    }
  }
  for (int64_t i = 0; i < kMR; ++i)
    for (int64_t j = 0; j < kCols; ++j) tile[i * kNR + j] = c[i][j];
}
#endif

// Where the micro-kernel finds B's step st (kNR words): in a packed panel, one step after
// the other; or in place in the input's taps layout, at an offset of its own per step.
struct PanelSteps {
  const int16_t* panel;
  const int16_t* operator()(int64_t st) const { return panel + st * 2 * kNR; }
};
struct TapSteps {
  const int16_t* words;    // the panel's first column in step 0's plane
  const int64_t* offsets;  // words from there to step st's
  const int16_t* operator()(int64_t st) const { return words + 2 * offsets[st]; }
};

// The sums of one sliver and one panel of which the first nr columns are delivered.
template <class Steps>
inline void multiply_tile(int64_t S, const int16_t* const* ar, Steps b_at, int64_t nr,
                          int32_t* tile) {
  if (nr <= kNR / 2) {
    micro_kernel<1>(S, ar, b_at, tile);
  } else {
    micro_kernel<2>(S, ar, b_at, tile);
  }
}

#if defined(__AVX2__)
inline int32_t hsum(__m256i v) {
  const __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i y = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(y, _mm_shuffle_epi32(y, 0xb1)));
}
#endif

// The sum of n int8 values.
inline int32_t sum_bytes(const int8_t* a, int64_t n) {
  int64_t k = 0;
  int32_t s = 0;
#if defined(__AVX2__)
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  for (; k + 16 <= n; k += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepi8_epi16(v), ones));
  }
  s = hsum(acc);
#elif defined(__ARM_NEON) && defined(__aarch64__)
  int32x4_t acc = vdupq_n_s32(0);
  for (; k + 16 <= n; k += 16) acc = vpadalq_s16(acc, vpaddlq_s8(vld1q_s8(a + k)));
  s = vaddvq_s32(acc);
#endif
  for (; k < n; ++k) s += a[k];
  return s;
}

// sum_k a[k] * b[k] (a linear layer's row times one input row).
inline int32_t dot(const int8_t* __restrict a, const int8_t* __restrict b, int64_t K) {
  int64_t k = 0;
  int32_t s = 0;
#if defined(__AVX2__)
  __m256i acc = _mm256_setzero_si256();
  for (; k + 16 <= K; k += 16) {
    const __m256i va =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k)));
    const __m256i vb =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(va, vb));
  }
  s = hsum(acc);
#elif defined(__ARM_NEON) && defined(__aarch64__)
  int32x4_t acc = vdupq_n_s32(0);
  for (; k + 16 <= K; k += 16) {
    const int8x16_t va = vld1q_s8(a + k), vb = vld1q_s8(b + k);
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(va), vget_low_s8(vb)));  // |a * b| <= 2^14
    acc = vpadalq_s16(acc, vmull_high_s8(va, vb));
  }
  s = vaddvq_s32(acc);
#endif
  for (; k < K; ++k) s += int32_t(a[k]) * int32_t(b[k]);
  return s;
}

// out[r] = sum_k a[r][k] * b[k] for 4 rows of A (a linear layer at batch 1: a matrix-vector
// product, bound by reading A). Each load of b serves the 4 rows. With VNNI, b goes unsigned
// (b + 128, as the packed path's B) and each row's sum of its own bytes, taken alongside by a
// second vpdpbusd against ones, gives back the correction 128 * sum_k a[r][k]: exact modulo
// 2^32, as everywhere here. The tail is masked: a zero byte of a adds nothing to either sum.
//
// The rows are prefetched kDotPrefetchBytes ahead. A matrix-vector product's weights are read
// once per call and are often no longer in any cache (MobileNetV2's classifier, 1.28 MB, was
// evicted by the rest of the model each inference); the hardware prefetchers alone fetched
// them at about 10 GB/s (the classifier 121-126 us at 1 thread, 34 us with these prefetches:
// the 4 rows are adjacent, so the 4 prefetches cover the stream of weights 8 KiB ahead).
constexpr int64_t kDotPrefetchBytes = 8192;
inline void dot4(const int8_t* const* a, const int8_t* b, int64_t K, int32_t* out) {
#if defined(ETB_QGEMM_U8S8)
  const __m512i flip = _mm512_set1_epi8(char(0x80)), ones = _mm512_set1_epi8(1);
  __m512i acc[4], sum[4];
  for (int r = 0; r < 4; ++r) acc[r] = sum[r] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 64) {
    const __mmask64 m = K - k >= 64 ? ~__mmask64(0) : (__mmask64(1) << (K - k)) - 1;
    const __m512i bu = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, b + k), flip);
    for (int r = 0; r < 4; ++r) {
      __builtin_prefetch(a[r] + k + kDotPrefetchBytes);
      const __m512i ar = _mm512_maskz_loadu_epi8(m, a[r] + k);
      acc[r] = _mm512_dpbusd_epi32(acc[r], bu, ar);
      sum[r] = _mm512_dpbusd_epi32(sum[r], ones, ar);
    }
  }
  for (int r = 0; r < 4; ++r)
    out[r] = _mm512_reduce_add_epi32(_mm512_sub_epi32(acc[r], _mm512_slli_epi32(sum[r], 7)));
#elif defined(__AVX2__)
  __m256i acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256i vb =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k)));
    if (k % 64 == 0)  // a line a row
      for (int r = 0; r < 4; ++r) __builtin_prefetch(a[r] + k + kDotPrefetchBytes);
    for (int r = 0; r < 4; ++r) {
      const __m256i va =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a[r] + k)));
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(va, vb));
    }
  }
  for (int r = 0; r < 4; ++r) {
    int32_t s = hsum(acc[r]);
    for (int64_t j = k; j < K; ++j) s += int32_t(a[r][j]) * int32_t(b[j]);
    out[r] = s;
  }
#else
  for (int r = 0; r < 4; ++r) out[r] = dot(a[r], b, K);
#endif
}

// sum_k a[k] * b[k] over int16 values (a row of packed A, widened, and a column of B).
inline int32_t dot_widened(const int16_t* __restrict a, const int16_t* __restrict b, int64_t K) {
  int64_t k = 0;
  int32_t s = 0;
#if defined(__AVX2__)
  __m256i acc = _mm256_setzero_si256();
  for (; k + 16 <= K; k += 16) {
    const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + k));
    const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + k));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(va, vb));
  }
  s = hsum(acc);
#elif defined(__ARM_NEON) && defined(__aarch64__)
  int32x4_t acc = vdupq_n_s32(0);
  for (; k + 8 <= K; k += 8) {
    const int16x8_t va = vld1q_s16(a + k), vb = vld1q_s16(b + k);
    acc = vmlal_s16(acc, vget_low_s16(va), vget_low_s16(vb));
    acc = vmlal_high_s16(acc, va, vb);
  }
  s = vaddvq_s32(acc);
#endif
  for (; k < K; ++k) s += int32_t(a[k]) * int32_t(b[k]);
  return s;
}

// The rows of packed A that sliver t (mr of its rows within A) reads: rows past the end
// repeat the last row (their sums are not delivered).
inline void sliver_rows(const int16_t* apack, int64_t t, int64_t mr, int64_t K,
                        const int16_t* ar[kMR]) {
  for (int64_t i = 0; i < kMR; ++i)
    ar[i] = apack + (t * kMR + (i < mr ? i : mr - 1)) * row_words(K) * 2;
}

// Columns [n_begin, n_end) of B times the M packed rows of A (rows m_base.. of the caller's
// A), on the calling thread, `group` panels of kNR columns at a time: a group is packed into
// `panels` (room for `group` panels), then every sliver of A runs over all of it. A sliver
// thus writes its rows' outputs in runs of group * kNR columns: with one panel a group, a
// product of many rows interleaves short writes to as many output rows (MobileNetV2's int8
// 16 -> 96 channel 1x1 convolution at 112x112: 96 output planes, 32 bytes each in turn),
// which the hardware prefetchers do not follow.
void multiply_panels(int64_t m_base, int64_t M, int64_t K, const int16_t* apack, int64_t n_begin,
                     int64_t n_end, const int8_t* B, int64_t b_sk, int64_t b_sn, int16_t* panels,
                     int64_t group, QTileFn fn, void* ctx) {
  const int64_t S = steps(K), unit = packed_panels_a_call(K, b_sk, b_sn);
  alignas(64) int32_t tile[kMR * kNR];
  const int16_t* ar[kMR];
  for (int64_t g0 = n_begin; g0 < n_end; g0 += group * kNR) {
    const int64_t g_end = min64(n_end, g0 + group * kNR);
    auto panel_of = [&](int64_t n0) { return panels + (n0 - g0) / kNR * S * kNR * 2; };
    for (int64_t n0 = g0; n0 < g_end; n0 += unit * kNR)
      pack_b(K, n0, min64(unit * kNR, g_end - n0), B, b_sk, b_sn, panel_of(n0));
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int64_t mr = min64(kMR, M - m0);
      sliver_rows(apack, m0 / kMR, mr, K, ar);
      for (int64_t n0 = g0; n0 < g_end; n0 += kNR) {
        const int64_t nr = min64(kNR, g_end - n0);
        multiply_tile(S, ar, PanelSteps{panel_of(n0)}, nr, tile);
        fn(ctx, m_base + m0, n0, mr, nr, tile, kNR);
      }
    }
  }
}

}  // namespace

size_t qgemm_packed_a_bytes(int64_t M, int64_t K) {
  return align64(size_t((M + kMR - 1) / kMR * kMR) * size_t(row_words(K > 0 ? K : 1)) * 4);
}

bool qgemm_packs_whole_a(int64_t M, int64_t K) {
  return chunk_rows(M, K) >= M;
}

size_t qgemm_panel_bytes(int64_t K) {
  return align64(size_t(steps(K > 0 ? K : 1)) * kNR * 4);
}

void qgemm_pack_a(const KernelContext& kctx, int64_t M, int64_t K, const int8_t* A, int64_t lda,
                  int16_t* out) {
  auto rows = [&](int64_t t, int) {
    const int64_t m0 = t * kMR;
    pack_a(K, m0, min64(kMR, M - m0), A, lda, out + t * row_words(K) * kMR * 2);
  };
  kctx.parallel_for((M + kMR - 1) / kMR, rows);
}

int64_t qgemm_panel_group(int64_t K) {
  const int64_t group = int64_t(32 * 1024 / qgemm_panel_bytes(K));
  return group > 1 ? group : 1;
}

void qgemm_packed(int64_t M, int64_t N, int64_t K, const int16_t* apack, const int8_t* B,
                  int64_t b_sk, int64_t b_sn, int16_t* panels, int64_t group, QTileFn fn,
                  void* ctx) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  multiply_panels(0, M, K, apack, 0, N, B, b_sk, b_sn, panels, group < 1 ? 1 : group, fn, ctx);
}

size_t qgemm_block_bytes() {
  return size_t(kBlockBytes);
}

int64_t qgemm_step_channels() {
  return kStepK;
}

int64_t qgemm_panel_columns() {
  return kNR;
}

int64_t qgemm_tile_rows() {
  return kMR;
}

size_t qgemm_packed_taps_bytes(int64_t M, int64_t C, int64_t T) {
  return qgemm_packed_a_bytes(M, taps_depth(C, T));
}

void qgemm_pack_taps(const KernelContext& kctx, int64_t M, int64_t C, int64_t T, const int8_t* W,
                     int16_t* out) {
  const int64_t K = taps_depth(C, T);
  auto rows = [&](int64_t t, int) {
    const int64_t m0 = t * kMR;
    pack_taps_rows(C, T, m0, min64(kMR, M - m0), W, out + t * row_words(K) * kMR * 2);
  };
  kctx.parallel_for((M + kMR - 1) / kMR, rows);
}

void qgemm_pack_pixels(const int8_t* x, int64_t c_stride, int64_t step, int64_t channels, int64_t n,
                       int32_t* out) {
  pack_step(x, c_stride, step, channels, n, reinterpret_cast<int16_t*>(out));
}

int32_t qgemm_fill_word(int8_t v) {
  int16_t pair[2];
  pack_step(&v, 0, 0, kStepK, 1, pair);
  int32_t word;
  std::memcpy(&word, pair, sizeof(word));
  return word;
}

void qgemm_taps(int64_t m_begin, int64_t m_end, int64_t C, int64_t T, const int16_t* apack,
                const int32_t* words, const int64_t* offsets, int64_t q_begin, int64_t q_end,
                int64_t block, QTileFn fn, void* ctx) {
  const int64_t K = taps_depth(C, T), S = steps(K);
  alignas(64) int32_t tile[kMR * kNR];
  const int16_t* ar[kMR];
  if (block < kNR) block = kNR;
  for (int64_t b0 = q_begin; b0 < q_end; b0 += block) {
    const int64_t b1 = min64(q_end, b0 + block);
    for (int64_t m0 = m_begin; m0 < m_end; m0 += kMR) {
      const int64_t mr = min64(kMR, m_end - m0);
      sliver_rows(apack, m0 / kMR, mr, K, ar);
      for (int64_t q0 = b0; q0 < b1; q0 += kNR) {
        const int64_t nr = min64(kNR, b1 - q0);
        multiply_tile(S, ar, TapSteps{reinterpret_cast<const int16_t*>(words + q0), offsets}, nr,
                      tile);
        fn(ctx, m0, q0, mr, nr, tile, kNR);
      }
    }
  }
}

size_t qgemm_workspace_bytes(int64_t M, int64_t N, int64_t K, int threads) {
  const size_t S = size_t(steps(K > 0 ? K : 1)), R = size_t(row_words(K > 0 ? K : 1));
  // Room for the B block of a product of any N' <= N columns.
  const int64_t few = threads > 1 ? min64(N, (kColumnSplitPanels * threads - 1) * kNR) : 0;
  const int64_t few_cols = (few + kNR - 1) / kNR * kNR, cols = b_block_cols(N, K, 1);
  return align64(size_t(few_cols > cols ? few_cols : cols) * S * 4) +
         align64(size_t(chunk_rows(M > 0 ? M : 1, K)) * R * 4) +
         align64(size_t(kDotColumns * (K > 0 ? K : 1)) * sizeof(int16_t));
}

namespace {

// qgemm_depth_halves' tasks: each half of the depth in depth_half_runs runs of whole row
// tiles, each run's product on its thread alone with a workspace of its own, of these bytes.
size_t depth_half_task_bytes(int64_t M, int64_t N, int64_t K) {
  return align64(qgemm_workspace_bytes(M, N, K - K / 2, 1));
}

size_t sums_bytes(int64_t M, int64_t N) {
  return align64(size_t(M * N) * sizeof(int32_t));
}

}  // namespace

bool qgemm_splits_depth(int64_t M, int64_t N, int64_t K, int threads) {
  return too_few_panels(N, threads) && N > kSmallN && M <= 128 && K >= 128 &&
         M * N * int64_t(sizeof(int32_t)) <= int64_t(256) << 10;
}

size_t qgemm_depth_halves_workspace_bytes(int64_t M, int64_t N, int64_t K, int threads) {
  return 2 * sums_bytes(M, N) +
         size_t(2 * depth_half_runs(threads)) * depth_half_task_bytes(M, N, K);
}

void qgemm_depth_halves(const KernelContext& kctx, int64_t M, int64_t N, int64_t K, const int8_t* A,
                        int64_t lda, const int8_t* B, int64_t b_sk, int64_t b_sn, void* workspace,
                        QTileFn fn, void* ctx) {
  if (M <= 0 || N <= 0) return;
  const int64_t K0 = K / 2, runs = depth_half_runs(kctx.num_threads());
  const int64_t row_tiles = (M + kMR - 1) / kMR;
  const int64_t run_rows = (row_tiles + runs - 1) / runs * kMR;
  char* mem = static_cast<char*>(workspace);
  int32_t* const sums[2] = {reinterpret_cast<int32_t*>(mem),
                            reinterpret_cast<int32_t*>(mem + sums_bytes(M, N))};
  char* const task_ws = mem + 2 * sums_bytes(M, N);
  const size_t task_bytes = depth_half_task_bytes(M, N, K);
  const KernelContext serial = kctx.within_task();
  auto half_product = [&](int64_t task, int thread) {
    const int64_t half = task / runs, m0 = task % runs * run_rows;
    if (m0 >= M) return;
    char* ws = kctx.thread_slice(thread, task_ws, task_bytes);
    const int64_t k0 = half == 0 ? 0 : K0, depth = half == 0 ? K0 : K - K0;
    SumsOut out{sums[half] + m0 * N, N};
    qgemm(serial, min64(run_rows, M - m0), N, depth, A + m0 * lda + k0, lda, B + k0 * b_sk, b_sk,
          b_sn, ws, store_sums, &out);
  };
  kctx.parallel_for(2 * runs, half_product);
  auto deliver = [&](int64_t t, int) {
    const int64_t m0 = t * kMR, mr = min64(kMR, M - m0);
    int32_t* c = sums[0] + m0 * N;
    const int32_t* other = sums[1] + m0 * N;
    for (int64_t i = 0; i < mr * N; ++i) c[i] += other[i];
    fn(ctx, m0, 0, mr, N, c, N);
  };
  kctx.parallel_for(row_tiles, deliver);
}

void store_sums(void* ctx, int64_t m0, int64_t n0, int64_t mr, int64_t nr, const int32_t* acc,
                int64_t acc_ld) {
  const SumsOut& o = *static_cast<const SumsOut*>(ctx);
  for (int64_t i = 0; i < mr; ++i)
    std::memcpy(o.c + (m0 + i) * o.ld + n0, acc + i * acc_ld, size_t(nr) * sizeof(int32_t));
}

void row_sums(const KernelContext& kctx, int64_t M, int64_t K, const int8_t* A, int64_t lda,
              int32_t* sums) {
  constexpr int64_t kRowsPerTask = 16;
  auto rows = [&](int64_t t, int) {
    const int64_t end = min64(M, (t + 1) * kRowsPerTask);
    for (int64_t m = t * kRowsPerTask; m < end; ++m) {
      sums[m] = sum_bytes(A + m * lda, K);
    }
  };
  kctx.parallel_for((M + kRowsPerTask - 1) / kRowsPerTask, rows);
}

namespace {
// The head of a PreparedWeights block: the shape it was filled for.
struct PreparedHeader {
  int64_t groups, M, K;
  int64_t packed;  // 1: each group's rows follow the sums, widened
  int64_t taps;    // > 0: packed in taps order (qgemm_pack_taps), K = channels * taps
};
constexpr size_t kHeaderBytes = align64(sizeof(PreparedHeader));

// Where the widened rows start in a block: after the header and the row sums.
size_t packed_offset(int64_t groups, int64_t M) {
  return kHeaderBytes + align64(size_t(groups * M) * sizeof(int32_t));
}

// Bytes of one group's packed rows.
size_t packed_group_bytes(int64_t M, int64_t K, int64_t taps) {
  return taps > 0 ? qgemm_packed_taps_bytes(M, K / taps, taps) : qgemm_packed_a_bytes(M, K);
}
}  // namespace

size_t prepared_weights_bytes(int64_t groups, int64_t M, int64_t K, bool pack, int64_t taps) {
  return align64(packed_offset(groups, M) +
                 (pack ? size_t(groups) * packed_group_bytes(M, K, taps) : 0));
}

void prepare_weights(PrepareContext& pctx, int64_t groups, int64_t M, int64_t K, const int8_t* A,
                     bool pack, int64_t taps) {
  const size_t a_bytes = packed_group_bytes(M, K, taps);
  void* mem = pctx.take(prepared_weights_bytes(groups, M, K, pack, taps));
  if (mem == nullptr) return;  // the sizing pass
  new (mem) PreparedHeader{groups, M, K, pack ? 1 : 0, taps};
  char* base = static_cast<char*>(mem);
  const KernelContext serial(nullptr);
  row_sums(serial, groups * M, K, A, K, reinterpret_cast<int32_t*>(base + kHeaderBytes));
  char* packed = base + packed_offset(groups, M);
  for (int64_t g = 0; g < groups && pack; ++g) {
    int16_t* out = reinterpret_cast<int16_t*>(packed + size_t(g) * a_bytes);
    if (taps > 0) {
      qgemm_pack_taps(serial, M, K / taps, taps, A + g * M * K, out);
    } else {
      qgemm_pack_a(serial, M, K, A + g * M * K, K, out);
    }
  }
}

PreparedWeights prepared_weights(const void* mem, int64_t groups, int64_t M, int64_t K,
                                 int64_t taps) {
  PreparedWeights w;
  const PreparedHeader* h = static_cast<const PreparedHeader*>(mem);
  if (h == nullptr || h->groups != groups || h->M != M || h->K != K) return w;
  const char* base = static_cast<const char*>(mem);
  w.sums = reinterpret_cast<const int32_t*>(base + kHeaderBytes);
  if (h->packed != 0 && h->taps == taps) {
    w.packed = reinterpret_cast<const int16_t*>(base + packed_offset(groups, M));
    w.group_stride = packed_group_bytes(M, K, taps) / sizeof(int16_t);
  }
  return w;
}

bool qgemm_reads_packed_a(int64_t N) {
  return N > kSmallN;
}

void qgemm(const KernelContext& kctx, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda,
           const int8_t* B, int64_t b_sk, int64_t b_sn, void* workspace, QTileFn fn, void* ctx,
           const int16_t* apacked) {
  if (M <= 0 || N <= 0) return;
  const int64_t row_tiles = (M + kMR - 1) / kMR;
  if (K <= 0) {
    alignas(64) int32_t tile[kMR * kNR];
    for (int64_t i = 0; i < kMR * kNR; ++i) tile[i] = 0;
    for (int64_t m0 = 0; m0 < M; m0 += kMR)
      for (int64_t n0 = 0; n0 < N; n0 += kNR)
        fn(ctx, m0, n0, min64(kMR, M - m0), min64(kNR, N - n0), tile, kNR);
    return;
  }
  // The threads split the rows of tiles; each tile is summed the same way wherever it runs.
  if (N <= kSmallN && b_sk == 1) {
    auto rows = [&](int64_t t, int) {
      alignas(64) int32_t tile[kMR * kNR];
      const int64_t m0 = t * kMR, mr = min64(kMR, M - m0);
      for (int64_t n = 0; n < N; ++n) {
        int64_t i = 0;
        for (; i + 4 <= mr; i += 4) {
          const int8_t* a[4] = {A + (m0 + i) * lda, A + (m0 + i + 1) * lda, A + (m0 + i + 2) * lda,
                                A + (m0 + i + 3) * lda};
          int32_t out[4];
          dot4(a, B + n * b_sn, K, out);
          for (int r = 0; r < 4; ++r) tile[(i + r) * kNR + n] = out[r];
        }
        for (; i < mr; ++i) tile[i * kNR + n] = dot(A + (m0 + i) * lda, B + n * b_sn, K);
      }
      fn(ctx, m0, 0, mr, N, tile, kNR);
    };
    kctx.parallel_for(row_tiles, rows);
    return;
  }
  // A is packed in chunks of rows once, then every block of B columns is packed once and
  // multiplied by every packed sliver of the chunk.
  const int64_t S = steps(K);
  const int threads = kctx.num_threads();
  // A widened ahead of time is one chunk: nothing is left to pack per chunk.
  const int64_t nc_max = b_block_cols(N, K, threads);
  const int64_t mc_max = apacked != nullptr ? M : chunk_rows(M, K);
  int16_t* bpack = static_cast<int16_t*>(workspace);
  int16_t* achunk = reinterpret_cast<int16_t*>(static_cast<char*>(workspace) +
                                               align64(size_t(nc_max) * size_t(S) * 4));
  // The columns of a narrow last panel, each as K contiguous int16 (dot products' B).
  int16_t* dot_cols =
      reinterpret_cast<int16_t*>(reinterpret_cast<char*>(achunk) +
                                 align64(size_t(chunk_rows(M, K)) * size_t(row_words(K)) * 4));
  const int16_t* apack = apacked != nullptr ? apacked : achunk;
  const int64_t panels = (N + kNR - 1) / kNR;
  const bool split_columns = threads > 1 && !too_few_panels(N, threads) && nc_max / kNR >= threads;
  for (int64_t mc0 = 0; mc0 < M; mc0 += mc_max) {
    const int64_t mc = min64(mc_max, M - mc0), slivers = (mc + kMR - 1) / kMR;
    if (apacked == nullptr) qgemm_pack_a(kctx, mc, K, A + mc0 * lda, lda, achunk);
    if (split_columns) {
      // Many columns: one loop in which the threads split runs of panels, each packing its
      // run, a group of panels at a time, into its share of the B block's memory.
      // (Each run reads every sliver of A: kWeightPassesPerThread runs a thread.)
      const int64_t runs = min64(panels, kWeightPassesPerThread * int64_t(threads));
      const int64_t group = min64((panels + runs - 1) / runs, nc_max / kNR / threads);
      const size_t group_bytes = size_t(group * S * kNR) * 4;
      auto columns = [&](int64_t r, int thread) {
        multiply_panels(mc0, mc, K, apack, panels * r / runs * kNR,
                        min64(N, panels * (r + 1) / runs * kNR), B, b_sk, b_sn,
                        reinterpret_cast<int16_t*>(kctx.thread_slice(thread, bpack, group_bytes)),
                        group, fn, ctx);
      };
      kctx.parallel_for(runs, columns);
      continue;
    }
    for (int64_t n0 = 0; n0 < N; n0 += nc_max) {
      const int64_t nc = min64(nc_max, N - n0);
      // A narrow last panel: its columns gathered for dot products instead.
      const int64_t last_nr = (nc - 1) % kNR + 1;
      const bool dots = last_nr <= kDotColumns && nc > kNR && K >= kDotDepth;
      const int64_t tiled = dots ? nc - last_nr : nc;
      if (dots)
        for (int64_t j = 0; j < last_nr; ++j)
          for (int64_t k = 0; k < K; ++k)
            dot_cols[j * K + k] = B[k * b_sk + (n0 + tiled + j) * b_sn];
      // Packing tasks are (run of steps, a call's panels), the runs outermost: with few
      // panels (a 14x14 or 7x7 plane has 7 or 2) a task a panel left one thread idle for a
      // panel, and the thread that packs a run of depth reads the channels that the kernel
      // before (split by channels) left in its core's cache.
      const int64_t unit = packed_panels_a_call(K, b_sk, b_sn);
      const int64_t pack_units = (tiled + unit * kNR - 1) / (unit * kNR);
      const int64_t want = kTasksPerThread * int64_t(threads);
      const int64_t depth_runs = threads == 1 ? 1 : min64(S, (want + pack_units - 1) / pack_units);
      auto pack = [&](int64_t t, int) {
        const int64_t panel = t % pack_units * unit, run = t / pack_units, j0 = panel * kNR;
        pack_b(K, n0 + j0, min64(unit * kNR, nc - j0), B, b_sk, b_sn, bpack + panel * S * kNR * 2,
               S * run / depth_runs, S * (run + 1) / depth_runs);
      };
      kctx.parallel_for(pack_units * depth_runs, pack);
      auto rows = [&](int64_t t, int) {
        alignas(64) int32_t tile[kMR * kNR];
        const int64_t m0 = mc0 + t * kMR, mr = min64(kMR, M - m0);
        const int16_t* ar[kMR];
        sliver_rows(apack, t, mr, K, ar);
        for (int64_t j0 = 0; j0 < tiled; j0 += kNR) {
          const int64_t nr = min64(kNR, tiled - j0);
          multiply_tile(S, ar, PanelSteps{bpack + (j0 / kNR) * S * kNR * 2}, nr, tile);
          fn(ctx, m0, n0 + j0, mr, nr, tile, kNR);
        }
        if (!dots) return;
        for (int64_t i = 0; i < mr; ++i)
          for (int64_t j = 0; j < last_nr; ++j)
            tile[i * kNR + j] = dot_widened(ar[i], dot_cols + j * K, K);
        fn(ctx, m0, n0 + tiled, mr, last_nr, tile, kNR);
      };
      kctx.parallel_for(slivers, rows);
    }
  }
}

}  // namespace quantized
}  // namespace etb
