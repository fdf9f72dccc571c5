// etb::sdpa.out: scaled dot-product attention as one kernel (the lower stage matches
// F.scaled_dot_product_attention onto it; pipeline/attention.py has the reference):
//   out = softmax(q k^T * scale + mask) v
// over the leading (batch, head) dims of q [..., L, E], k [..., S, E] and v [..., S, Ev]. A Bool
// mask keeps the scores where it is true, a Float mask is added; is_causal keeps column j <= i.
// A row with every score masked gives zeros (as torch's safe softmax). Each leading index is
// three steps: k transposed into temp memory, the L x S scores by the GEMM, each row's masked
// softmax in place, then the scores times v by the GEMM straight into the output.
#include <algorithm>
#include <cmath>

#include "kernels/portable/gemm.h"
#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

// Element strides of a mask broadcast to [lead..., L, S] (0 along its broadcast dims).
struct MaskView {
  const void* data = nullptr;
  bool is_bool = false;
  int64_t lead_stride[kMaxDim] = {};  // per leading dim of q
  int64_t row_stride = 0, col_stride = 0;
};

Error mask_view(const Tensor& mask, const Tensor& q, int64_t L, int64_t S, MaskView* m) {
  const int d = q.dim(), md = mask.dim();
  if (md > d) return fail(Error::InvalidArgument, "sdpa: attn_mask has %d dims, query %d", md, d);
  int64_t stride = 1;
  for (int i = md - 1; i >= 0; --i) {
    const int qd = d - md + i;  // the dim of [lead..., L, S] this mask dim lines up with
    const int64_t want = qd == d - 2 ? L : qd == d - 1 ? S : q.size(qd);
    const int64_t got = mask.size(i);
    if (got != want && got != 1)
      return fail(Error::InvalidArgument,
                  "sdpa: attn_mask dim %d has size %lld, which does not broadcast to %lld", i,
                  (long long)got, (long long)want);
    const int64_t s = got == 1 ? 0 : stride;
    if (qd == d - 2)
      m->row_stride = s;
    else if (qd == d - 1)
      m->col_stride = s;
    else
      m->lead_stride[qd] = s;
    stride *= got;
  }
  m->data = mask.data();
  m->is_bool = mask.dtype() == ScalarType::Bool;
  return Error::Ok;
}

// Row i of the scores: scaled, masked, softmax in place (zeros when every column is masked).
void softmax_row(float* row, int64_t i, int64_t S, float scale, bool causal, const MaskView* m,
                 int64_t mask_offset) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < S; ++j) {
    float s = row[j] * scale;
    if (causal && j > i) s = -INFINITY;
    if (m != nullptr) {
      const int64_t at = mask_offset + i * m->row_stride + j * m->col_stride;
      if (m->is_bool)
        s = static_cast<const bool*>(m->data)[at] ? s : -INFINITY;
      else
        s += static_cast<const float*>(m->data)[at];
    }
    row[j] = s;
    mx = s > mx ? s : mx;
  }
  if (mx == -INFINITY) {  // nothing to attend to
    for (int64_t j = 0; j < S; ++j) row[j] = 0.f;
    return;
  }
  softmax_with_max(row, row, S, 1, mx);
}

}  // namespace

Error sdpa_out(KernelContext& ctx, const Tensor& query, const Tensor& key, const Tensor& value,
               const Tensor* attn_mask, bool is_causal, double scale, Tensor& out) {
  const int d = query.dim();
  if (d < 2 || key.dim() != d || value.dim() != d)
    return fail(Error::InvalidArgument,
                "sdpa: query, key and value must have the same rank (>= 2), got %d, %d and %d", d,
                key.dim(), value.dim());
  const int64_t L = query.size(d - 2), E = query.size(d - 1);
  const int64_t S = key.size(d - 2), Ev = value.size(d - 1);
  if (key.size(d - 1) != E || value.size(d - 2) != S)
    return fail(Error::InvalidArgument,
                "sdpa: key must be [..., S, %lld] and value [..., S, Ev] with the same S; got key "
                "[..., %lld, %lld] and value [..., %lld, %lld]",
                (long long)E, (long long)S, (long long)key.size(d - 1),
                (long long)value.size(d - 2), (long long)Ev);
  int64_t sizes[kMaxDim];
  int64_t batch = 1;
  for (int i = 0; i < d - 2; ++i) {
    if (key.size(i) != query.size(i) || value.size(i) != query.size(i))
      return fail(Error::InvalidArgument,
                  "sdpa: dim %d is %lld in query, %lld in key and %lld in value; they must be "
                  "equal",
                  i, (long long)query.size(i), (long long)key.size(i), (long long)value.size(i));
    sizes[i] = query.size(i);
    batch *= sizes[i];
  }
  sizes[d - 2] = L;
  sizes[d - 1] = Ev;
  ETB_TRY(resize_to(out, sizes, d));
  if (out.numel() == 0) return Error::Ok;
  MaskView mask;
  if (attn_mask != nullptr) ETB_TRY(mask_view(*attn_mask, query, L, S, &mask));
  const MaskView* m = attn_mask != nullptr ? &mask : nullptr;

  // scores [L x S] = q [L x E] * kt [E x S]; y [L x Ev] = scores * v [S x Ev].
  const size_t ws_bytes =
      std::max(sgemm_workspace_bytes(L, S, E, S), sgemm_workspace_bytes(L, Ev, S, Ev));
  Result<void*> mem = ctx.allocate_temp(size_t(E * S + L * S) * sizeof(float) + 64 + ws_bytes, 64);
  if (!mem.ok()) return mem.error();
  float* kt = static_cast<float*>(mem.value());
  float* scores = kt + E * S;
  float* ws = reinterpret_cast<float*>(reinterpret_cast<char*>(mem.value()) +
                                       (size_t(E * S + L * S) * sizeof(float) + 63) / 64 * 64);
  const float* q = query.data_as<float>();
  const float* k = key.data_as<float>();
  const float* v = value.data_as<float>();
  float* y = out.data_as<float>();
  const float sc = float(scale);
  const GemmEpilogue plain;
  for (int64_t b = 0; b < batch; ++b) {
    const float* kb = k + b * S * E;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t e = 0; e < E; ++e) kt[e * S + s] = kb[s * E + e];
    sgemm(ctx, L, S, E, q + b * L * E, E, kt, S, scores, S, plain, ws);
    int64_t mask_offset = 0;  // of leading index b, dim by dim from the last
    for (int64_t i = d - 3, r = b; m != nullptr && i >= 0; --i) {
      mask_offset += (r % sizes[i]) * m->lead_stride[i];
      r /= sizes[i];
    }
    parallel_range(ctx, L, 4 * S, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        softmax_row(scores + i * S, i, S, sc, is_causal, m, mask_offset);
    });
    sgemm(ctx, L, Ev, S, scores, S, v + b * S * Ev, Ev, y + b * L * Ev, Ev, plain, ws);
  }
  return Error::Ok;
}

}  // namespace native
}  // namespace etb
