// Depthwise convolution on Float tensors (see depthwise.h), explicitly vectorized (simd.h), on
// planes: a vector holds kW outputs of one channel.
//
// Planes. Each input channel is copied once into zero-padded planes in scratch, so that no tap
// needs a bounds check and every tap of a run of outputs is one contiguous vector load. With
// strides (sh, sw), the padded input (Hp x Wp) is split into sh x sw phase planes: plane
// (rp, cp) holds the padded rows r = rp (mod sh) and columns c = cp (mod sw), at row r / sh
// and column c / sw, with row pitch QW = ceil(Wp / sw). Output (oh, ow) is element
// q = oh QW + ow of a flat plane of pitch QW, and its tap (kh, kw) is element q of
//   src(kh, kw) = plane((kh dh) % sh, (kw dw) % sw) + ((kh dh) / sh) QW + (kw dw) / sw,
// so the taps of consecutive outputs of a row (and, in the flat plane, across rows) are
// consecutive floats. The caller zeroes the scratch once; each channel rewrites the interior
// (whole vectors, a vector of zeros restoring the padding after a short row; see fill_planes).
//
// Blocks. Outputs are computed four vectors at a time: the accumulators start at the bias,
// take every tap with a multiply-add, are clamped (simd::clamp keeps NaN) and stored whole.
// Four independent sums keep the multiply-adds busy across their latency, so a block may
// span rows: a row of at least four vectors runs in blocks along the row, the last block
// ending at the row's end (overlapping the one before it and recomputing the same values);
// narrower rows run four, two or one at a time (one, two, three or four vectors each). A
// row narrower than a vector spills into the rows after it, which are stored later; the
// plane's last such rows go through a buffer.
//
// Flat. When a row is much narrower than a vector (1-d convolutions over H, 7x7 planes with
// 16-lane vectors), the outputs [0, (OH - 1) QW + OW) of the flat plane are computed instead,
// as one long row, into scratch, and the rows are copied out (dropping the QW - OW columns in
// between); the cheaper of the two is taken per shape.
//
// Taps. 3x3 and 5x5 kernels with stride 1 or 2 and no dilation (MobileNet, keyword spotting)
// have the kernel size and stride as template parameters: the tap offsets are constants and
// the 3x3 weights stay in registers. Any other shape (dilation, other kernel sizes, 1-d
// convolutions, other strides) runs the same blocks over a table of tap offsets made once
// per call. A shape whose planes would take more than kMaxScratch bytes takes a plain loop
// with no scratch.
//
// While a channel is computed, the next input channel is prefetched, so that copying it in
// does not wait on memory.
//
// Lanes. Strided convolutions and small planes, where the costs paid per channel above are
// most of the work, run instead on channel lanes, kW channels per vector
// (depthwise_lanes.cpp); the results are the same bits.
#include "kernels/portable/depthwise.h"

#include "kernels/portable/depthwise_lanes.h"
#include "kernels/simd.h"

namespace etb {
namespace native {
namespace {

using simd::VecF;
constexpr int kW = VecF::kWidth;
constexpr int kNV = 4;                           // vectors per block (run_rows assumes 4)
constexpr int64_t kSlack = 64;                   // zeroed floats past the planes (>= kW)
constexpr size_t kMaxScratch = size_t(2) << 20;  // beyond this, the plain loop
constexpr int64_t kMaxStride = 64;               // larger strides take the plain loop

// Geometry of the phase planes and of the flat output plane for one shape.
struct Layout {
  bool planar;              // false: the plain loop (no scratch)
  bool flat;                // compute the flat plane, then copy the rows out
  int64_t QW, PE, nplanes;  // row pitch, plane pitch, sh * sw planes
  int64_t nq;               // flat outputs up to the last valid one
  bool fixed;               // K x K, stride S, no dilation: FixedTaps (else RuntimeTaps)
  size_t plane_bytes;       // the planes and their slack, 64-byte aligned
  size_t flat_bytes;        // the flat output plane (0 when not flat)
  size_t tap_bytes;         // RuntimeTaps' offsets (0 when fixed)
  const int64_t* taps;      // those offsets, in scratch (set by depthwise_conv_f32)
};

// 3x3 and 5x5 with stride 1 or 2 on both axes and no dilation.
bool fixed_taps(const ConvShape& s) {
  return s.KH == s.KW && (s.KH == 3 || s.KH == 5) && s.sh == s.sw && (s.sh == 1 || s.sh == 2) &&
         s.dh == 1 && s.dw == 1;
}

Layout layout_of(const ConvShape& s) {
  Layout L{};
  const int64_t Hp = padded_rows(s), Wp = s.W + 2 * s.pw;
  const int64_t limit = int64_t(kMaxScratch / sizeof(float));
  if (s.sh > kMaxStride || s.sw > kMaxStride || Hp > limit || Wp > limit || s.OH < 1 || s.OW < 1)
    return L;
  L.QW = ceil_div(Wp, s.sw);
  L.PE = ceil_div(Hp, s.sh) * L.QW + kW;  // a gap after each plane (see fill_planes)
  L.nplanes = s.sh * s.sw;
  L.nq = (s.OH - 1) * L.QW + s.OW;
  const int64_t plane_floats = L.nplanes * L.PE + kSlack;
  if (plane_floats > limit) return L;
  // Vectors computed by rows, or over the flat plane plus the copy out (a copied vector costs
  // about a quarter of a computed one).
  const int64_t row_vectors = s.OH * ceil_div(s.OW, kW);
  const int64_t flat_vectors = ceil_div(L.nq, kW) + ceil_div(row_vectors, 4);
  L.flat = flat_vectors < row_vectors;
  L.plane_bytes = align64(size_t(plane_floats) * sizeof(float));
  // The copy out reads whole vectors: up to kW - 1 floats past the last computed vector.
  L.flat_bytes = L.flat ? align64(size_t(ceil_div(L.nq, kW) * kW + kW) * sizeof(float)) : 0;
  L.fixed = fixed_taps(s);
  const int64_t taps = s.KH * s.KW;  // <= Hp Wp
  if (!L.fixed && taps > limit) return L;
  L.tap_bytes = L.fixed ? 0 : align64(size_t(taps) * sizeof(int64_t));
  if (L.plane_bytes + L.flat_bytes + L.tap_bytes > kMaxScratch) return L;
  L.planar = true;
  return L;
}

// Copies input channel x [H x W] into the interior of the phase planes. Reading past a row (as
// far as x_end, the end of the input) is allowed: the vectors then write whole, spilling past
// the row's data, and a vector of zeros stored right after the data restores the padding.
// The spill lands in the padding, in later rows of the plane (rewritten after it) or in the
// gap after the plane.
void fill_planes(const ConvShape& s, const Layout& L, const float* x, const float* x_end,
                 float* planes) {
  const VecF zero = VecF::zero();
  int64_t rp = s.ph % s.sh, ri = s.ph / s.sh;  // phase and row of padded row ih + ph
  for (int64_t ih = 0; ih < s.H; ++ih) {
    const float* src = x + ih * s.W;
    float* d = planes + rp * s.sw * L.PE + ri * L.QW;  // the row in plane (rp, 0)
    if (++rp == s.sh) {
      rp = 0;
      ++ri;
    }
    if (s.sw == 1) {
      d += s.pw;
      const int64_t n = s.W;
      if (n >= kW) {
        for (int64_t i = 0;; i += kW) {
          if (i > n - kW) i = n - kW;  // the last vector overlaps the one before
          VecF::load(src + i).store(d + i);
          if (i == n - kW) break;
        }
      } else if (x_end - src >= kW) {
        VecF::load(src).store(d);
        zero.store(d + n);
      } else {
        for (int64_t i = 0; i < n; ++i) d[i] = src[i];
      }
    } else if (s.sw == 2) {
      // Even source columns e[i] = src[2i] land at column pw + 2i, odd ones o[i] = src[2i + 1]
      // at pw + 2i + 1: plane pw % 2 from column pw / 2, and the other from (pw + 1) / 2.
      float* e = d + (s.pw & 1) * L.PE + s.pw / 2;
      float* o = d + ((s.pw + 1) & 1) * L.PE + (s.pw + 1) / 2;
      const int64_t ne = (s.W + 1) / 2, no = s.W / 2;
      const int64_t reach = 2 * ceil_div(ne, kW) * kW;  // floats read
      if (x_end - src >= reach) {
        for (int64_t i = 0; i < ne; i += kW) {
          VecF ev, od;
          simd::load_deinterleave(src + 2 * i, &ev, &od);
          ev.store(e + i);
          od.store(o + i);
        }
        zero.store(e + ne);
        zero.store(o + no);
      } else {
        for (int64_t i = 0; i < no; ++i) {
          e[i] = src[2 * i];
          o[i] = src[2 * i + 1];
        }
        if (ne > no) e[no] = src[2 * no];
      }
    } else {
      int64_t cp = s.pw % s.sw, ci = s.pw / s.sw;  // phase and column of src[iw]
      for (int64_t iw = 0; iw < s.W; ++iw) {
        d[cp * L.PE + ci] = src[iw];
        if (++cp == s.sw) {
          cp = 0;
          ++ci;
        }
      }
    }
  }
}

// A block: R rows of V vectors, four independent sums in all. Vector (r, v) covers outputs
// [o, o + kW) of the flat plane and of the output, o = q + r qs + off(v) and d + r ds + off(v),
// where off(v) = v kW for v < V - 1 and off(V - 1) = last (the last vector of a row may end
// at the row's end, overlapping the one before it).
struct Block {
  int64_t q, qs;
  float* d;
  int64_t ds, last;
};

template <int V>
ETB_SIMD_INLINE int64_t offset_of(int v, int64_t last) {
  return v == V - 1 ? last : int64_t(v) * kW;
}

// Clamps the sums of a block and stores them, in order (a vector may spill into the outputs
// of a later one).
template <int R, int V>
ETB_SIMD_INLINE void store_block(const VecF* acc, VecF lo, VecF hi, const Block& b) {
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      simd::clamp(acc[r * V + v], lo, hi).store(b.d + r * b.ds + offset_of<V>(v, b.last));
}

// One tap of a block: acc[r][v] += wv * the block's inputs at p (R rows of V vectors).
template <int R, int V>
ETB_SIMD_INLINE void add_tap(VecF* acc, VecF wv, const float* p, const Block& b) {
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      acc[r * V + v] =
          simd::fma(wv, VecF::load(p + r * b.qs + offset_of<V>(v, b.last)), acc[r * V + v]);
}

// A K x K kernel with stride S (both axes) and no dilation: src(kh, kw) = rows[kh][kw % S] +
// kw / S, with rows[kh][cp] = plane(kh % S, cp) + (kh / S) * QW.
template <int K, int S>
struct FixedTaps {
  const float* rows[K * S];
  VecF w[K * K], bias, lo, hi;

  template <int R, int V>
  ETB_SIMD_INLINE void run(const Block& b) const {
    VecF acc[R * V];
#pragma GCC unroll 4
    for (int i = 0; i < R * V; ++i) acc[i] = bias;
#pragma GCC unroll 5
    for (int kh = 0; kh < K; ++kh) {
#pragma GCC unroll 5
      for (int kw = 0; kw < K; ++kw) {
        const float* p = rows[kh * S + kw % S] + kw / S + b.q;
        const VecF wv = w[kh * K + kw];
        add_tap<R, V>(acc, wv, p, b);
      }
    }
    store_block<R, V>(acc, lo, hi, b);
  }
};

// Any kernel size, stride and dilation: tap t = kh KW + kw reads planes + off[t] (the offset
// of src(kh, kw), worked out once per call into scratch).
struct RuntimeTaps {
  const float* planes;
  const int64_t* off;  // KH KW tap offsets
  const float* w;      // KH KW weights
  int64_t taps;
  VecF bias, lo, hi;

  template <int R, int V>
  ETB_SIMD_INLINE void run(const Block& b) const {
    VecF acc[R * V];
#pragma GCC unroll 4
    for (int i = 0; i < R * V; ++i) acc[i] = bias;
    const float* base = planes + b.q;
    for (int64_t t = 0; t < taps; ++t) {
      const float* p = base + off[t];
      const VecF wv = VecF::broadcast(w[t]);
      add_tap<R, V>(acc, wv, p, b);
    }
    store_block<R, V>(acc, lo, hi, b);
  }
};

// off[kh KW + kw] = offset of src(kh, kw) from the first plane (see the top of the file).
void tap_offsets(const ConvShape& s, const Layout& L, int64_t* off) {
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    const int64_t r = kh * s.dh;
    const int64_t row = (r % s.sh) * s.sw * L.PE + (r / s.sh) * L.QW;
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      const int64_t c = kw * s.dw;
      off[kh * s.KW + kw] = row + (c % s.sw) * L.PE + c / s.sw;
    }
  }
}

// Copies vectors of the flat output plane out.
struct FlatCopy {
  const float* flat;

  template <int R, int V>
  ETB_SIMD_INLINE void run(const Block& b) const {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        const int64_t o = offset_of<V>(v, b.last);
        VecF::load(flat + b.q + r * b.qs + o).store(b.d + r * b.ds + o);
      }
  }
};

// One row of v <= kNV vectors.
template <class Op>
inline void run_row(const Op& op, int v, const Block& b) {
  switch (v) {
    case 1: op.template run<1, 1>(b); break;
    case 2: op.template run<1, 2>(b); break;
    case 3: op.template run<1, 3>(b); break;
    case 4: op.template run<1, 4>(b); break;
    default: break;
  }
}

// Lines of the next input channel fetched into the cache while this one is computed, spread
// evenly over the output rows.
struct Prefetch {
  const char* p;
  const char* end;
  int64_t per_row;  // lines per output row

  void rows(int64_t n) {
    for (int64_t i = 0; i < n * per_row && p < end; ++i, p += 64) __builtin_prefetch(p);
  }
};

Prefetch prefetch_of(const float* next, int64_t n, int64_t rows) {
  const char* p = reinterpret_cast<const char*>(next);
  const int64_t lines = next != nullptr ? ceil_div(n * int64_t(sizeof(float)), 64) : 0;
  return {p, p + lines * 64, ceil_div(lines, rows)};
}

// Rows of V <= kNV vectors each (OW < kNV kW), R = kNV / V rows per block. A row's last vector
// ends at the row's end; with V == 1 a row may be narrower than a vector, which then spills
// into the rows after it (stored later), and the plane's last rows go through a buffer.
template <int R, int V, class Op>
ETB_SIMD_INLINE void run_row_blocks(const Op& op, const ConvShape& s, int64_t QW, float* y,
                                    Prefetch& pf) {
  const int64_t OW = s.OW, P = s.OH * OW;
  const int64_t last = OW > kW ? OW - kW : 0;  // where a row's last vector starts
  int64_t oh = 0;
  for (; oh + R <= s.OH && (oh + R - 1) * OW + last + kW <= P; oh += R) {
    op.template run<R, V>(Block{oh * QW, QW, y + oh * OW, OW, last});
    pf.rows(R);
  }
  if (oh == s.OH) return;
  if (s.OH < R) {  // a plane of fewer rows than a block: one row at a time
    for (; oh < s.OH; ++oh) {
      if (oh * OW + last + kW <= P) {
        run_row(op, V, Block{oh * QW, 0, y + oh * OW, 0, last});
        continue;
      }
      alignas(64) float buf[kW];  // V == 1: only its P - oh OW floats
      op.template run<1, 1>(Block{oh * QW, 0, buf, 0, 0});
      for (int64_t i = 0; i < P - oh * OW; ++i) y[oh * OW + i] = buf[i];
    }
    return;
  }
  // The last blocks end at the last row (recomputing rows of the block before them); with
  // V == 1 they go through a buffer, as their vectors would spill past the plane.
  const int64_t first = s.OH - R;
  for (; oh < s.OH; oh += R) {
    const int64_t f = oh < first ? oh : first;
    alignas(64) float buf[R * kW];
    op.template run<R, V>(Block{f * QW, QW, V > 1 ? y + f * OW : buf, OW, last});
    if (V > 1) return;  // f == first: no vector spills past its row
    const int64_t end = (oh + R < s.OH ? oh + R : s.OH) - f;  // rows [oh, f + end)
    for (int64_t i = (oh - f) * OW; i < end * OW; ++i) y[f * OW + i] = buf[i];
  }
}

// Output plane y [OH x OW] by rows: output (oh, ow) is element oh QW + ow of the flat plane.
// A row of at least kNV vectors runs in blocks along the row, the last block ending at the
// row's end (overlapping the one before it); narrower rows are taken several at a time.
template <class Op>
void run_rows(const Op& op, const ConvShape& s, int64_t QW, float* y, Prefetch pf) {
  const int64_t OW = s.OW;
  if (OW >= kNV * kW) {
    for (int64_t oh = 0; oh < s.OH; ++oh) {
      for (int64_t ow = 0;; ow += kNV * kW) {
        if (ow > OW - kNV * kW) ow = OW - kNV * kW;
        op.template run<1, kNV>(Block{oh * QW + ow, 0, y + oh * OW + ow, 0, (kNV - 1) * kW});
        if (ow == OW - kNV * kW) break;
      }
      pf.rows(1);
    }
    return;
  }
  switch (OW > kW ? ceil_div(OW, kW) : 1) {  // vectors per row
    case 1: return run_row_blocks<kNV, 1>(op, s, QW, y, pf);
    case 2: return run_row_blocks<kNV / 2, 2>(op, s, QW, y, pf);
    case 3: return run_row_blocks<1, 3>(op, s, QW, y, pf);
    default: return run_row_blocks<1, 4>(op, s, QW, y, pf);
  }
}

// One output channel y [OH x OW].
template <class Taps>
void run_channel(const Taps& t, const ConvShape& s, const Layout& L, float* flat, float* y,
                 Prefetch pf) {
  // Flat: the outputs [0, nq), rounded up to whole vectors, as one row; then the rows out.
  ConvShape f = s;
  if (L.flat) {
    f.OH = 1;
    f.OW = ceil_div(L.nq, kW) * kW;
    pf.per_row *= s.OH;
  }
  run_rows(t, f, L.flat ? 0 : L.QW, L.flat ? flat : y, pf);  // one call: inlined
  if (L.flat) run_rows(FlatCopy{flat}, s, L.QW, y, Prefetch{nullptr, nullptr, 0});
}

// What one output channel computes from the planes.
struct Channel {
  const float* w;  // KH x KW
  float bias;
  float* y;           // OH x OW
  const float* next;  // the next input channel, to prefetch (or null)
};

template <int K, int S>
void fixed_channel(const ConvShape& s, const Layout& L, const float* planes, const Channel& c,
                   OutputClamp clamp, float* flat) {
  FixedTaps<K, S> t;
  for (int kh = 0; kh < K; ++kh)
    for (int cp = 0; cp < S; ++cp)
      t.rows[kh * S + cp] = planes + ((kh % S) * S + cp) * L.PE + (kh / S) * L.QW;
  for (int i = 0; i < K * K; ++i) t.w[i] = VecF::broadcast(c.w[i]);
  t.bias = VecF::broadcast(c.bias);
  t.lo = VecF::broadcast(clamp.lo);
  t.hi = VecF::broadcast(clamp.hi);
  run_channel(t, s, L, flat, c.y, prefetch_of(c.next, s.H * s.W, s.OH));
}

void runtime_channel(const ConvShape& s, const Layout& L, const float* planes, const Channel& c,
                     OutputClamp clamp, float* flat) {
  RuntimeTaps t;
  t.planes = planes;
  t.off = L.taps;
  t.w = c.w;
  t.taps = s.KH * s.KW;
  t.bias = VecF::broadcast(c.bias);
  t.lo = VecF::broadcast(clamp.lo);
  t.hi = VecF::broadcast(clamp.hi);
  run_channel(t, s, L, flat, c.y, prefetch_of(c.next, s.H * s.W, s.OH));
}

using ChannelFn = void (*)(const ConvShape&, const Layout&, const float*, const Channel&,
                           OutputClamp, float*);

ChannelFn channel_fn(const ConvShape& s) {
  if (!fixed_taps(s)) return runtime_channel;
  if (s.KH == 3) return s.sh == 1 ? fixed_channel<3, 1> : fixed_channel<3, 2>;
  return s.sh == 1 ? fixed_channel<5, 1> : fixed_channel<5, 2>;
}

// The plain loop for shapes whose planes would not fit the scratch budget.
void plain(const ConvShape& s, const float* in, int64_t in_stride, const float* w,
           const float* bias, OutputClamp clamp, float* out, int64_t out_stride) {
  const int64_t mult = s.OC / s.C;
  const int64_t P = s.OH * s.OW;
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t oc = 0; oc < s.OC; ++oc) {
      const float* x = in + (n * s.C + oc / mult) * in_stride;
      float* y = out + (n * s.OC + oc) * out_stride;
      const float b = bias != nullptr ? bias[oc] : 0.f;
      for (int64_t p = 0; p < P; ++p) y[p] = b;
      depthwise_plane(s, x, w + oc * s.KH * s.KW, y);
      if (clamp.active())  // NaN fails both comparisons and stays
        for (int64_t p = 0; p < P; ++p)
          y[p] = y[p] < clamp.lo ? clamp.lo : (y[p] > clamp.hi ? clamp.hi : y[p]);
    }
  }
}

// Whether shape s runs on channel lanes (depthwise_lanes.cpp); never with 1-lane vectors, so
// that a scalar build (Cortex-M) links none of it.
bool on_lanes(const ConvShape& s) {
  return kW > 1 && depthwise_lanes_suit(s);
}

}  // namespace

int64_t depthwise_conv_f32_channel_block(const ConvShape& s) {
  return on_lanes(s) ? depthwise_lanes_width() : 1;
}

size_t depthwise_conv_f32_scratch_bytes(const ConvShape& s) {
  if (on_lanes(s)) return depthwise_lanes_f32_scratch_bytes(s);
  const Layout L = layout_of(s);
  return L.planar ? L.plane_bytes + L.flat_bytes + L.tap_bytes : 0;
}

void depthwise_conv_f32(const ConvShape& s, const float* in, const float* w, const float* bias,
                        OutputClamp clamp, float* out, void* scratch) {
  depthwise_conv_f32_strided(s, in, s.H * s.W, w, bias, clamp, out, s.OH * s.OW, scratch);
}

void depthwise_conv_f32_strided(const ConvShape& s, const float* in, int64_t in_stride,
                                const float* w, const float* bias, OutputClamp clamp, float* out,
                                int64_t out_stride, void* scratch) {
  if (on_lanes(s))
    return depthwise_lanes_f32(s, in, in_stride, w, bias, clamp, out, out_stride, scratch);
  Layout L = layout_of(s);
  if (!L.planar) return plain(s, in, in_stride, w, bias, clamp, out, out_stride);
  char* mem = static_cast<char*>(scratch);
  float* planes = reinterpret_cast<float*>(mem);
  float* flat = reinterpret_cast<float*>(mem + L.plane_bytes);
  int64_t* taps = reinterpret_cast<int64_t*>(mem + L.plane_bytes + L.flat_bytes);
  // (The padding and the slack are zero, from the caller, and stay zero.)
  if (!L.fixed) tap_offsets(s, L, taps);
  L.taps = taps;
  const ChannelFn fn = channel_fn(s);
  const int64_t mult = s.OC / s.C;  // output channels per input channel
  const int64_t HW = s.H * s.W, KK = s.KH * s.KW;
  const float* x_end = in + (s.N * s.C - 1) * in_stride + HW;  // the last channel's end
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t c = 0; c < s.C; ++c) {
      const float* x = in + (n * s.C + c) * in_stride;
      fill_planes(s, L, x, x_end, planes);
      const bool more = n * s.C + c + 1 < s.N * s.C;
      for (int64_t oc = c * mult; oc < (c + 1) * mult; ++oc) {
        Channel ch;
        ch.w = w + oc * KK;
        ch.bias = bias != nullptr ? bias[oc] : 0.f;
        ch.y = out + (n * s.OC + oc) * out_stride;
        ch.next = more && oc == c * mult ? x + in_stride : nullptr;
        fn(s, L, planes, ch, clamp, flat);
      }
    }
  }
}

}  // namespace native
}  // namespace etb
