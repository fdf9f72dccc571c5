// Depthwise convolution on channel lanes: kW channels at a time, with lane l of every vector
// holding channel l of the block.
//
// Why. On planes (depthwise.cpp) a vector holds kW outputs of one channel, and each channel
// pays for its padded copy, its taps' setup and its rows' ends; a strided convolution's copy
// also splits every input row into phases. On a 7x7 or 14x14 plane, or with stride 2, those
// costs are most of the time. On lanes they are paid once per kW channels, and a stride or a
// dilation only changes which pixel a tap reads.
//
// How, for each block of kW output channels (of kW input channels, or fewer with a channel
// multiplier):
// - the input planes are copied into one zero-padded plane of pixels t [Hp x Wp], a pixel
//   being a vector of the block's kW channels: each input row is read as kW rows of kW floats
//   (one per channel) and transposed (simd::transpose) into kW pixels;
// - an output pixel is the bias, plus for each tap the tap's weights (a vector: kW channels'
//   weights) times the input pixel under the tap (one aligned load), then the clamp; NP
//   pixels of an output row go together, so that NP sums are in flight;
// - the output pixels o [OH * OW] are transposed back, kW pixels at a time, into the kW
//   output planes (the last group ending at the plane's end, overlapping the one before).
// A block of fewer than kW channels (the last one) fills its spare lanes with its last
// channel's copies and stores only its own channels.
//
// Each output is computed by the same operations in the same order as on planes: the bias,
// one multiply-add per tap in row-major order (the padding's zeros included), the clamp. The
// two ways give the same bits; choosing between them is only a matter of speed.
#include "kernels/portable/depthwise_lanes.h"

#include "kernels/simd.h"

namespace etb {
namespace native {
namespace {

using simd::VecF;
constexpr int kW = VecF::kWidth;
constexpr size_t kMaxScratch = size_t(160) << 10;  // beyond this, planes
// Output planes beyond which planes are the faster way (a copy in and out per kW channels
// against a channel's costs on planes), measured on AVX2 and SSE2 (NEON, with 4 lanes too,
// follows SSE2): with 8 lanes, any strided convolution and stride 1 up to 400 outputs
// (20x20); with 4 lanes, up to 100 outputs (10x10) either way. 16 lanes (AVX-512) take the
// bounds of 8: MobileNetV2's 7x7 layers run in 0.45x their time on planes, its 14x14 ones in
// 0.8x at one thread (bench/ab.py --profile). Its 56x56 stride 2 needs more than kMaxScratch
// at 16 lanes and stays on planes: given a budget big enough, lanes took 1.2x as long.
constexpr int64_t kMaxOutputs = kW >= 8 ? 400 : 100;

// Where each part lives in scratch.
struct Lanes {
  int64_t Hp, Wp;
  size_t t_bytes, o_bytes, w_bytes, off_bytes;
  size_t total() const { return t_bytes + o_bytes + w_bytes + off_bytes; }
};

Lanes lanes_of(const ConvShape& s) {
  Lanes L{};
  L.Hp = padded_rows(s);
  L.Wp = s.W + 2 * s.pw;
  const int64_t KK = s.KH * s.KW;
  L.t_bytes = align64(size_t(L.Hp * L.Wp * kW) * sizeof(float));
  L.o_bytes = align64(size_t(ceil_div(s.OH * s.OW, kW) * kW * kW) * sizeof(float));
  L.w_bytes = align64(size_t(KK * kW) * sizeof(float));
  L.off_bytes = align64(size_t(KK) * sizeof(int64_t));
  return L;
}

// dst[j kW + l] = src[l][at + j] for j < n: n columns of the kW rows src[l] + at, kW columns at
// a time through a transpose (the last group ending at column n, overlapping the one before
// it). A group reads kW floats of each row, past column n where the rows go on; where the
// last row's kW floats would pass `end`, every row is read only as far as column n.
// The src[l] do not decrease with l.
ETB_SIMD_INLINE void transpose_columns(const float* const* src, int64_t at, int64_t n,
                                       const float* end, float* dst) {
  for (int64_t x0 = 0;; x0 += kW) {
    if (n >= kW && x0 > n - kW) x0 = n - kW;
    const int m = n - x0 < kW ? int(n - x0) : kW;
    VecF r[kW];
    if (src[kW - 1] + at + x0 + kW <= end) {
#pragma GCC unroll 16
      for (int l = 0; l < kW; ++l) r[l] = VecF::load(src[l] + at + x0);
    } else {
#pragma GCC unroll 16
      for (int l = 0; l < kW; ++l) r[l] = VecF::load_partial(src[l] + at + x0, m);
    }
    simd::transpose(r);
    float* d = dst + x0 * kW;
#pragma GCC unroll 16
    for (int j = 0; j < kW; ++j)
      if (j < m) r[j].store(d + j * kW);
    if (x0 + m >= n) return;
  }
}

// What the output pixels of one block are computed from.
struct Block {
  const float* t;      // the padded input pixels
  const int64_t* off;  // KK tap offsets into t, in floats
  const float* w;      // KK weight vectors
  int64_t KK;
  VecF bias, lo, hi;
};

// NP output pixels, `step` floats apart in t from q (S > 0: step = S kW, a constant), into o.
template <int NP, int S>
ETB_SIMD_INLINE void pixels(const Block& b, const float* q, int64_t step, float* o) {
  const int64_t st = S > 0 ? int64_t(S) * kW : step;
  VecF acc[NP];
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) acc[j] = b.bias;
  for (int64_t k = 0; k < b.KK; ++k) {
    const float* p = q + b.off[k];
    const VecF wv = VecF::load(b.w + k * kW);
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) acc[j] = simd::fma(wv, VecF::load(p + j * st), acc[j]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) simd::clamp(acc[j], b.lo, b.hi).store(o + j * kW);
}

// Every output pixel into o [OH * OW] (segments: for_each_lane_segment).
template <int S>
void output_rows(const ConvShape& s, const Lanes& L, const Block& b, float* o) {
  const int64_t step = s.sw * kW;
  auto segment = [&](auto np, int64_t oh, int64_t ow) {
    pixels<decltype(np)::value, S>(b, b.t + (oh * s.sh * L.Wp + ow * s.sw) * kW, step,
                                   o + (oh * s.OW + ow) * kW);
  };
  for_each_lane_segment(s, segment);
}

}  // namespace

bool depthwise_lanes_suit(const ConvShape& s) {
  if (kW < 4) return false;  // the scalar set: no lanes to fill
  if (s.OH < 1 || s.OW < 1) return false;
  const bool strided = s.sh > 1 || s.sw > 1;
  if (s.OH * s.OW > kMaxOutputs && !(strided && kW >= 8)) return false;
  // The sizes in bytes, checked before they are multiplied out.
  const int64_t limit = int64_t(kMaxScratch / sizeof(float));
  if (padded_rows(s) > limit || s.W + 2 * s.pw > limit || s.KH * s.KW > limit ||
      s.OH * s.OW > limit || padded_rows(s) * (s.W + 2 * s.pw) > limit)
    return false;
  return lanes_of(s).total() <= kMaxScratch;
}

int depthwise_lanes_width() {
  return kW;
}

size_t depthwise_lanes_f32_scratch_bytes(const ConvShape& s) {
  return lanes_of(s).total();
}

void depthwise_lanes_f32(const ConvShape& s, const float* in, int64_t in_stride, const float* w,
                         const float* bias, OutputClamp clamp, float* out, int64_t out_stride,
                         void* scratch) {
  const Lanes L = lanes_of(s);
  char* mem = static_cast<char*>(scratch);
  float* t = reinterpret_cast<float*>(mem);
  float* o = reinterpret_cast<float*>(mem + L.t_bytes);
  float* wv = reinterpret_cast<float*>(mem + L.t_bytes + L.o_bytes);
  int64_t* off = reinterpret_cast<int64_t*>(mem + L.t_bytes + L.o_bytes + L.w_bytes);
  // (The padding is zero, from the caller, and stays zero: each block rewrites the interior.)
  const int64_t KK = s.KH * s.KW, P = s.OH * s.OW, mult = s.OC / s.C;
  for (int64_t kh = 0; kh < s.KH; ++kh)
    for (int64_t kw = 0; kw < s.KW; ++kw) off[kh * s.KW + kw] = (kh * s.dh * L.Wp + kw * s.dw) * kW;
  const float* x_end = in + (s.N * s.C - 1) * in_stride + s.H * s.W;  // the last channel's end
  const float* w_end = w + s.OC * KK;
  Block b{t, off, wv, KK, VecF::zero(), VecF::broadcast(clamp.lo), VecF::broadcast(clamp.hi)};
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t oc0 = 0; oc0 < s.OC; oc0 += kW) {
      const int cb = int(s.OC - oc0 < kW ? s.OC - oc0 : kW);  // the block's channels
      const float* src[kW];
      const float* wsrc[kW];
      float* dst[kW];
      alignas(64) float bias_lanes[kW];
      for (int l = 0; l < kW; ++l) {
        const int64_t oc = oc0 + (l < cb ? l : cb - 1);
        src[l] = in + (n * s.C + oc / mult) * in_stride;
        wsrc[l] = w + oc * KK;
        dst[l] = out + (n * s.OC + oc) * out_stride;
        bias_lanes[l] = bias != nullptr ? bias[oc] : 0.f;
      }
      b.bias = VecF::load(bias_lanes);
      transpose_columns(wsrc, 0, KK, w_end, wv);  // [kW channels x KK taps] -> KK vectors
      for (int64_t h = 0; h < s.H; ++h)
        transpose_columns(src, h * s.W, s.W, x_end, t + ((h + s.ph) * L.Wp + s.pw) * kW);
      if (s.sw == 1)
        output_rows<1>(s, L, b, o);
      else if (s.sw == 2)
        output_rows<2>(s, L, b, o);
      else
        output_rows<0>(s, L, b, o);
      // o [P pixels x kW] -> the block's output planes, kW pixels at a time.
      for (int64_t p = 0;; p += kW) {
        if (P >= kW && p > P - kW) p = P - kW;
        const int m = P - p < kW ? int(P - p) : kW;
        VecF r[kW];
#pragma GCC unroll 16
        for (int l = 0; l < kW; ++l) r[l] = VecF::load(o + (p + l) * kW);
        simd::transpose(r);
        for (int l = 0; l < cb; ++l) {
          if (m == kW)
            r[l].store(dst[l] + p);
          else
            r[l].store_partial(dst[l] + p, m);
        }
        if (p + m >= P) break;
      }
    }
  }
}

}  // namespace native
}  // namespace etb
