// Reflection and replication padding of the last one or two dims (F.pad with mode='reflect'
// or 'replicate'): every output element copies the input element its index maps to.
#include <cstring>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

enum class PadMode { Reflect, Replicate };

// The input index that output index o (of a dim padded by `before`) reads, for a dim of n.
inline int64_t source_index(PadMode mode, int64_t o, int64_t before, int64_t n) {
  int64_t i = o - before;
  if (mode == PadMode::Replicate) return i < 0 ? 0 : (i >= n ? n - 1 : i);
  if (i < 0) i = -i;  // reflect: the edge element is not repeated
  if (i >= n) i = 2 * (n - 1) - i;
  return i;
}

// Pads the last `k` (1 or 2) dims of self by `padding` (last dim first: left, right, top,
// bottom), as torch's reflection_padNd / replication_padNd.
Error pad(const KernelContext& ctx, PadMode mode, int k, const char* op, const Tensor& self,
          Span<const int64_t> padding, Tensor& out) {
  const int nd = self.dim();
  if (self.dtype() != out.dtype())
    return fail(Error::InvalidArgument, "%s: out has dtype %s, self %s", op,
                scalar_type_name(out.dtype()), scalar_type_name(self.dtype()));
  if (int(padding.size()) != 2 * k)
    return fail(Error::InvalidArgument, "%s: %zu padding values, expected %d", op, padding.size(),
                2 * k);
  if (nd != k + 1 && nd != k + 2)
    return fail(Error::InvalidArgument, "%s: self has %d dims, expected %d or %d", op, nd, k + 1,
                k + 2);
  int64_t before[2] = {0, 0}, after[2] = {0, 0}, n[2] = {1, 1}, sz[kMaxDim];
  for (int d = 0; d < nd; ++d) sz[d] = self.size(d);
  for (int j = 0; j < k; ++j) {  // j = 0: the last dim
    const int d = nd - 1 - j;
    before[j] = padding[size_t(2 * j)];
    after[j] = padding[size_t(2 * j + 1)];
    n[j] = self.size(d);
    if (before[j] < 0 || after[j] < 0)
      return fail(Error::InvalidArgument, "%s: negative padding (%lld, %lld) of dim %d", op,
                  (long long)before[j], (long long)after[j], d);
    if (n[j] == 0) return fail(Error::InvalidArgument, "%s: cannot pad dim %d of size 0", op, d);
    if (mode == PadMode::Reflect && (before[j] >= n[j] || after[j] >= n[j]))
      return fail(Error::InvalidArgument,
                  "%s: padding (%lld, %lld) of dim %d must be smaller than its size %lld", op,
                  (long long)before[j], (long long)after[j], d, (long long)n[j]);
    sz[d] = n[j] + before[j] + after[j];
  }
  ETB_TRY(resize_to(out, sz, nd));
  if (out.data() == self.data() && out.numel() > 0)
    return fail(Error::NotSupported, "%s: out may not alias self", op);
  const int64_t ow = sz[nd - 1], oh = k == 2 ? sz[nd - 2] : 1;
  const int64_t iw = n[0], ih = n[1];
  const int64_t planes = ow * oh == 0 ? 0 : out.numel() / (ow * oh);
  const size_t es = self.element_size();
  const uint8_t* x = static_cast<const uint8_t*>(self.data());
  uint8_t* o = static_cast<uint8_t*>(out.data());
  // One task per output row: the row's middle is a copy of an input row, its edges one
  // element at a time.
  parallel_range(ctx, planes * oh, ow, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t p = r / oh, y = r % oh;
      const int64_t sy = k == 2 ? source_index(mode, y, before[1], ih) : 0;
      const uint8_t* src = x + size_t((p * ih + sy) * iw) * es;
      uint8_t* dst = o + size_t(r * ow) * es;
      for (int64_t c = 0; c < before[0]; ++c)
        memcpy(dst + size_t(c) * es, src + size_t(source_index(mode, c, before[0], iw)) * es, es);
      memcpy(dst + size_t(before[0]) * es, src, size_t(iw) * es);
      for (int64_t c = before[0] + iw; c < ow; ++c)
        memcpy(dst + size_t(c) * es, src + size_t(source_index(mode, c, before[0], iw)) * es, es);
    }
  });
  return Error::Ok;
}

}  // namespace

Error reflection_pad1d_out(KernelContext& ctx, const Tensor& self, Span<const int64_t> padding,
                           Tensor& out) {
  return pad(ctx, PadMode::Reflect, 1, "reflection_pad1d", self, padding, out);
}

Error reflection_pad2d_out(KernelContext& ctx, const Tensor& self, Span<const int64_t> padding,
                           Tensor& out) {
  return pad(ctx, PadMode::Reflect, 2, "reflection_pad2d", self, padding, out);
}

Error replication_pad1d_out(KernelContext& ctx, const Tensor& self, Span<const int64_t> padding,
                            Tensor& out) {
  return pad(ctx, PadMode::Replicate, 1, "replication_pad1d", self, padding, out);
}

Error replication_pad2d_out(KernelContext& ctx, const Tensor& self, Span<const int64_t> padding,
                            Tensor& out) {
  return pad(ctx, PadMode::Replicate, 2, "replication_pad2d", self, padding, out);
}

}  // namespace native
}  // namespace etb
