// etb_quantized::linear.out (int8 in, int8 out) and etb_quantized::dynamic_linear.out (fp32 in,
// activations quantized per tensor at run time, fp32 out): y = x W^T with exact int32 sums,
// per-output-channel scales (pipeline/quant/ops.py `linear`, `dynamic_linear`).
// The GEMM computes W [O x K] times x^T [K x rows] and the epilogue stores transposed. The
// weights' row sums (and, for products of more than a few rows, the widened weights) come
// from the prepare hook's block when the method was prepared at load, else from each call.
#include <cfloat>

#include "kernels/quantized/qgemm.h"
#include "kernels/quantized/requant.h"
#include "native_functions.h"

namespace etb {
namespace quantized {
namespace {

struct LinearEpilogue {
  const int32_t* wsum;
  const float* mult;
  const float* bias;
  int32_t xzp;
  OutQuant q;
  int8_t* out_q;  // int8 output (linear) or
  float* out_f;   // float output (dynamic_linear)
  int64_t ldo;    // output row length (out_features)
  bool has_bias;  // dynamic_linear adds the bias only when there is one, as the reference
};

// The epilogue is copied: the output stores may alias anything the context points to, so with
// the context itself the compiler reloads its fields for every element.
void linear_tile(void* ctx, int64_t m0, int64_t n0, int64_t mr, int64_t nr, const int32_t* acc,
                 int64_t ld) {
  const LinearEpilogue e = *static_cast<const LinearEpilogue*>(ctx);
  for (int64_t i = 0; i < mr; ++i) {
    const int64_t m = m0 + i;
    const int32_t corr = e.xzp * e.wsum[m];
    const float mu = e.mult[m], b = e.bias[m];
    for (int64_t j = 0; j < nr; ++j) {
      const float y = float(acc[i * ld + j] - corr) * mu;
      e.out_q[(n0 + j) * e.ldo + m] = quantize_one(y + b, e.q);
    }
  }
}

void dynamic_tile(void* ctx, int64_t m0, int64_t n0, int64_t mr, int64_t nr, const int32_t* acc,
                  int64_t ld) {
  const LinearEpilogue e = *static_cast<const LinearEpilogue*>(ctx);  // see linear_tile
  for (int64_t i = 0; i < mr; ++i) {
    const int64_t m = m0 + i;
    const int32_t corr = e.xzp * e.wsum[m];
    const float mu = e.mult[m], b = e.bias[m];
    for (int64_t j = 0; j < nr; ++j) {
      const float y = float(acc[i * ld + j] - corr) * mu;
      e.out_f[(n0 + j) * e.ldo + m] = e.has_bias ? y + b : y;
    }
  }
}

// Shapes of x [..., K] @ W[O, K]^T: rows, K, O; resizes out to [..., O].
Error linear_shapes(const Tensor& input, const Tensor& weight, Tensor& out, const char* op,
                    int64_t* rows, int64_t* K, int64_t* O) {
  if (weight.dim() != 2 || weight.dtype() != ScalarType::Char)
    return fail(Error::InvalidArgument, "%s: weight must be a 2-d Char tensor", op);
  if (input.dim() < 1)
    return fail(Error::InvalidArgument, "%s: input must have at least one dim", op);
  *K = weight.size(1);
  *O = weight.size(0);
  if (input.size(input.dim() - 1) != *K)
    return fail(Error::InvalidArgument, "%s: input has %lld features, weight expects %lld", op,
                (long long)input.size(input.dim() - 1), (long long)*K);
  int64_t sz[kMaxDim];
  int64_t r = 1;
  for (int d = 0; d < input.dim() - 1; ++d) {
    sz[d] = input.size(d);
    r *= sz[d];
  }
  sz[input.dim() - 1] = *O;
  *rows = r;
  return out.resize(Span<const int64_t>(sz, size_t(input.dim())));
}

// What the GEMM epilogue needs per output channel, and the GEMM's workspace, in temp memory
// (the row sums and widened weights in the prepared block when there is one).
struct ChannelParams {
  float* mult;            // input scale x weight scale
  float* bias;            // fp32 bias (0 without one)
  const int32_t* wsum;    // weight row sums, for the input zero-point correction
  const int16_t* packed;  // the weights widened for qgemm, or nullptr
  void* workspace;        // qgemm_workspace_bytes(O, rows, K, threads)
};

Error channel_params(KernelContext& ctx, const Tensor& weight, const Tensor& weight_scales,
                     const Tensor* bias, float input_scale, int64_t O, int64_t K, int64_t rows,
                     ChannelParams* c) {
  Result<void*> pm = ctx.allocate_temp(size_t(O) * (2 * sizeof(float) + sizeof(int32_t)));
  if (!pm.ok()) return pm.error();
  c->mult = static_cast<float*>(pm.value());
  c->bias = c->mult + O;
  const float* ws = weight_scales.data_as<float>();
  for (int64_t o = 0; o < O; ++o) {
    c->mult[o] = input_scale * ws[o];
    c->bias[o] = bias != nullptr ? bias->data_as<float>()[o] : 0.f;
  }
  const PreparedWeights pw = prepared_weights(ctx.prepared(), 1, O, K);
  c->packed = pw.packed;
  if (pw.sums != nullptr) {
    c->wsum = pw.sums;
  } else {
    int32_t* sums = reinterpret_cast<int32_t*>(c->bias + O);
    row_sums(ctx, O, K, weight.data_as<int8_t>(), K, sums);
    c->wsum = sums;
  }
  Result<void*> wsm = ctx.allocate_temp(qgemm_workspace_bytes(O, rows, K, ctx.num_threads()));
  if (!wsm.ok()) return wsm.error();
  c->workspace = wsm.value();
  return Error::Ok;
}

// The prepare hook of both linear kernels: the weights' row sums, and the weights widened when
// the input (its size at load: static, or the bound of a dynamic one) has rows enough for
// qgemm to read them packed.
Error prepare_linear_weights(PrepareContext& pctx, const Tensor& input, const Tensor& weight) {
  if (!weight.read_only() || weight.dim() != 2 || weight.dtype() != ScalarType::Char ||
      input.dim() < 1)
    return Error::Ok;
  int64_t rows = 1;
  for (int d = 0; d < input.dim() - 1; ++d) rows *= input.size(d);
  const int64_t O = weight.size(0), K = weight.size(1);
  prepare_weights(pctx, 1, O, K, weight.data_as<int8_t>(), qgemm_reads_packed_a(rows));
  return Error::Ok;
}

}  // namespace

Error linear_out_prepare(PrepareContext& pctx, const Tensor& input, double, int64_t,
                         const Tensor& weight, const Tensor&, const Tensor*, double, int64_t,
                         int64_t, int64_t, Tensor&) {
  return prepare_linear_weights(pctx, input, weight);
}

Error dynamic_linear_out_prepare(PrepareContext& pctx, const Tensor& input, const Tensor& weight,
                                 const Tensor&, const Tensor*, Tensor&) {
  return prepare_linear_weights(pctx, input, weight);
}

Error linear_out(KernelContext& ctx, const Tensor& input, double input_scale,
                 int64_t input_zero_point, const Tensor& weight, const Tensor& weight_scales,
                 const Tensor* bias, double output_scale, int64_t output_zero_point,
                 int64_t output_min, int64_t output_max, Tensor& out) {
  const char* op = "etb_quantized::linear";
  if (input.dtype() != ScalarType::Char || out.dtype() != ScalarType::Char)
    return fail(Error::InvalidArgument, "%s: input and out must be Char (int8)", op);
  ETB_TRY(check_scale(input_scale, op, "input_scale"));
  ETB_TRY(check_input_zp(input_zero_point, op, "input"));
  OutQuant q;
  ETB_TRY(make_out_quant(output_scale, output_zero_point, output_min, output_max, op, &q));
  int64_t rows = 0, K = 0, O = 0;
  ETB_TRY(linear_shapes(input, weight, out, op, &rows, &K, &O));
  ETB_TRY(check_channel_params(weight_scales, bias, O, op));
  if (out.numel() == 0) return Error::Ok;
  ChannelParams c;
  ETB_TRY(channel_params(ctx, weight, weight_scales, bias, float(input_scale), O, K, rows, &c));
  LinearEpilogue e{
      c.wsum,  c.mult, c.bias,         int32_t(input_zero_point), q, out.data_as<int8_t>(),
      nullptr, O,      bias != nullptr};
  qgemm(ctx, O, rows, K, weight.data_as<int8_t>(), K, input.data_as<int8_t>(), 1, K, c.workspace,
        linear_tile, &e, c.packed);
  return Error::Ok;
}

Error dynamic_linear_out(KernelContext& ctx, const Tensor& input, const Tensor& weight,
                         const Tensor& weight_scales, const Tensor* bias, Tensor& out) {
  const char* op = "etb_quantized::dynamic_linear";
  if (input.dtype() != ScalarType::Float || out.dtype() != ScalarType::Float)
    return fail(Error::InvalidArgument, "%s: input and out must be Float", op);
  int64_t rows = 0, K = 0, O = 0;
  ETB_TRY(linear_shapes(input, weight, out, op, &rows, &K, &O));
  ETB_TRY(check_channel_params(weight_scales, bias, O, op));
  if (out.numel() == 0) return Error::Ok;
  const int64_t n = input.numel();
  const float* x = input.data_as<float>();
  // Per-tensor affine int8 parameters from the range (always including 0), as the reference.
  float lo = 0.f, hi = 0.f;
  if (n > 0) {
    float mn = x[0], mx = x[0];
    for (int64_t i = 1; i < n; ++i) {
      mn = x[i] < mn ? x[i] : mn;
      mx = x[i] > mx ? x[i] : mx;
    }
    lo = mn < 0.f ? mn : 0.f;
    hi = mx > 0.f ? mx : 0.f;
  }
  if (!std::isfinite(lo) || !std::isfinite(hi))
    return fail(Error::InvalidArgument, "%s: input holds a non-finite value", op);
  float scale = (hi - lo) / 255.0f;
  scale = scale > FLT_EPSILON ? scale : FLT_EPSILON;
  float zpf = -128.0f - std::nearbyint(lo / scale);
  zpf = zpf > -128.f ? zpf : -128.f;
  zpf = zpf < 127.f ? zpf : 127.f;
  const int32_t zp = int32_t(zpf);
  Result<void*> xm = ctx.allocate_temp(size_t(n > 0 ? n : 1));
  if (!xm.ok()) return xm.error();
  int8_t* xq = static_cast<int8_t*>(xm.value());
  OutQuant q;
  q.zp = float(zp);
  for (int64_t i = 0; i < n; ++i) {
    float r = std::nearbyint(x[i] / scale) + q.zp;
    r = r > q.lo ? r : q.lo;
    r = r < q.hi ? r : q.hi;
    xq[i] = int8_t(int32_t(r));
  }
  ChannelParams c;
  ETB_TRY(channel_params(ctx, weight, weight_scales, bias, scale, O, K, rows, &c));
  LinearEpilogue e{c.wsum, c.mult,         c.bias, zp, q, nullptr, out.data_as<float>(),
                   O,      bias != nullptr};
  qgemm(ctx, O, rows, K, weight.data_as<int8_t>(), K, xq, 1, K, c.workspace, dynamic_tile, &e,
        c.packed);
  return Error::Ok;
}

}  // namespace quantized
}  // namespace etb
