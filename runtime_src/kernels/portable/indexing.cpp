// Indexing with index tensors: index_select and gather. They copy elements as bytes, so they
// work for every dtype; indices are Long or Int.
#include <cstring>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

// The index dtypes, of those a kernel's `arg` selected.
#define ETB_INDEX_DTYPES(key, arg) \
  (selected_dtypes(key, arg) & dtype_set(ScalarType::Long, ScalarType::Int))

// Copies `n` elements of `es` bytes.
inline void copy_elems(uint8_t* dst, const uint8_t* src, int64_t n, size_t es) {
  if (n == 1) {
    switch (es) {
      case 1: *dst = *src; return;
      case 4: memcpy(dst, src, 4); return;
      case 8: memcpy(dst, src, 8); return;
      default: break;
    }
  }
  memcpy(dst, src, size_t(n) * es);
}

// Reads the n indices of `index` (dtype from kIdx) into `out` as int64, wrapping negative ones
// when `wrap_negative`; fails on one outside [0, size).
template <DtypeSet kIdx>
Error read_indices(const Tensor& index, int64_t size, bool wrap_negative, const char* op,
                   int64_t* out, bool* built) {
  Error err = Error::Ok;
  *built = dispatch_dtype<kIdx>(index.dtype(), [&](auto c) {
    using I = decltype(c);
    const I* p = index.data_as<I>();
    for (int64_t i = 0; i < index.numel(); ++i) {
      int64_t v = int64_t(p[i]);
      if (wrap_negative && v < 0) v += size;
      if (v < 0 || v >= size) {
        err = fail(Error::InvalidArgument, "%s: index %lld is out of range for a dim of size %lld",
                   op, (long long)p[i], (long long)size);
        return;
      }
      out[i] = v;
    }
  });
  return err;
}

// out = self with dim d replaced by the n rows idx (checked) of it: [outer, len, inner] ->
// [outer, n, inner].
void select_along(const Tensor& self, int d, const int64_t* idx, int64_t n, Tensor& out) {
  const int64_t len = self.dim() == 0 ? 1 : self.size(d);
  const int64_t inner = self.dim() == 0 ? 1 : self.stride(d);
  const int64_t outer = len * inner == 0 ? 0 : self.numel() / (len * inner);
  const size_t es = self.element_size();
  const uint8_t* x = static_cast<const uint8_t*>(self.data());
  uint8_t* o = static_cast<uint8_t*>(out.data());
  const int64_t block = inner * int64_t(es);
  for (int64_t r = 0; r < outer; ++r) {
    const uint8_t* xr = x + r * len * block;
    uint8_t* orow = o + r * n * block;
    for (int64_t j = 0; j < n; ++j) copy_elems(orow + j * block, xr + idx[j] * block, inner, es);
  }
}

Error same_dtype(const Tensor& a, const Tensor& out, const char* op) {
  if (a.dtype() != out.dtype())
    return fail(Error::InvalidArgument, "%s: out has dtype %s, self %s", op,
                scalar_type_name(out.dtype()), scalar_type_name(a.dtype()));
  return Error::Ok;
}

Error no_alias(const Tensor& a, const Tensor& out, const char* op) {
  if (a.data() == out.data() && out.numel() > 0)
    return fail(Error::NotSupported, "%s: out may not alias an input", op);
  return Error::Ok;
}

}  // namespace

Error index_select_out(KernelContext& ctx, const Tensor& self, int64_t dim, const Tensor& index,
                       Tensor& out) {
  const char* op = "index_select";
  ETB_TRY(same_dtype(self, out, op));
  if (index.dim() > 1)
    return fail(Error::InvalidArgument, "%s: index must be 0-d or 1-d, has %d dims", op,
                index.dim());
  int64_t d = 0;
  ETB_TRY(wrap_dim(dim, self.dim(), &d, op));
  const int64_t n = index.numel();
  if (self.dim() == 0 && n != 1)
    return fail(Error::InvalidArgument, "%s: a 0-d self takes one index, got %lld", op,
                (long long)n);
  int64_t sz[kMaxDim];
  for (int i = 0; i < self.dim(); ++i) sz[i] = i == d ? n : self.size(i);
  ETB_TRY(resize_to(out, sz, self.dim()));
  ETB_TRY(no_alias(self, out, op));
  Result<void*> mem = ctx.allocate_temp(size_t(n > 0 ? n : 1) * sizeof(int64_t));
  if (!mem.ok()) return mem.error();
  int64_t* idx = static_cast<int64_t*>(mem.value());
  const int64_t len = self.dim() == 0 ? 1 : self.size(int(d));
  bool built = false;
  ETB_TRY(read_indices<ETB_INDEX_DTYPES("aten::index_select.out", "index")>(index, len, false, op,
                                                                            idx, &built));
  if (!built) return dtype_not_built("aten::index_select.out", "index", index.dtype());
  select_along(self, int(d), idx, n, out);
  return Error::Ok;
}

Error gather_out(KernelContext&, const Tensor& self, int64_t dim, const Tensor& index,
                 bool sparse_grad, Tensor& out) {
  (void)sparse_grad;
  const char* op = "gather";
  ETB_TRY(same_dtype(self, out, op));
  int64_t d = 0;
  ETB_TRY(wrap_dim(dim, self.dim(), &d, op));
  const int nd = self.dim() > index.dim() ? self.dim() : index.dim();
  if (nd > 1 && index.dim() != self.dim())
    return fail(Error::InvalidArgument, "%s: index has %d dims, self %d; they must match", op,
                index.dim(), self.dim());
  for (int i = 0; i < index.dim() && i < self.dim(); ++i)
    if (i != d && index.size(i) > self.size(i))
      return fail(Error::InvalidArgument,
                  "%s: index has size %lld at dim %d, larger than self's %lld", op,
                  (long long)index.size(i), i, (long long)self.size(i));
  ETB_TRY(out.resize(index.sizes()));
  ETB_TRY(no_alias(self, out, op));
  if (out.numel() == 0) return Error::Ok;
  const int64_t len = self.dim() == 0 ? 1 : self.size(int(d));
  const int64_t dstride = self.dim() == 0 ? 0 : self.stride(int(d));
  const size_t es = self.element_size();
  const uint8_t* x = static_cast<const uint8_t*>(self.data());
  uint8_t* o = static_cast<uint8_t*>(out.data());
  const int id = index.dim();
  const int last = id - 1;
  const int64_t inner = id == 0 ? 1 : index.size(last);
  // Along the index's last dim, self moves by its own stride unless that dim is the gathered one.
  const int64_t step = id == 0 || last == d ? 0 : self.stride(last);
  constexpr DtypeSet kIdx = ETB_INDEX_DTYPES("aten::gather.out", "index");
  Error err = Error::Ok;
  const bool built = dispatch_dtype<kIdx>(index.dtype(), [&](auto c) {
    using I = decltype(c);
    const I* ip = index.data_as<I>();
    int64_t pos[kMaxDim] = {};
    int64_t base = 0;  // self's offset of the row's position in the dims other than d
    for (int64_t r = 0; r < index.numel() / inner; ++r) {
      for (int64_t j = 0; j < inner; ++j) {
        const int64_t v = int64_t(ip[r * inner + j]);
        if (v < 0 || v >= len) {
          err =
              fail(Error::InvalidArgument, "%s: index %lld is out of range for a dim of size %lld",
                   op, (long long)v, (long long)len);
          return;
        }
        copy_elems(o + (r * inner + j) * int64_t(es),
                   x + (base + j * step + v * dstride) * int64_t(es), 1, es);
      }
      for (int k = last - 1; k >= 0; --k) {
        const int64_t s = k == d ? 0 : self.stride(k);
        base += s;
        if (++pos[k] < index.size(k)) break;
        base -= s * index.size(k);
        pos[k] = 0;
      }
    }
  });
  if (!built) return dtype_not_built("aten::gather.out", "index", index.dtype());
  return err;
}

}  // namespace native
}  // namespace etb
