// Copy kernels for views and layout changes (view, permute, expand, slice, select, cat) and
// embedding lookup. They copy bytes, so they work for every dtype.
#include <type_traits>

#include "kernels/portable/util.h"
#include "native_functions.h"

namespace etb {
namespace native {
namespace {

Error same_dtype(const Tensor& a, const Tensor& out, const char* op) {
  if (a.dtype() != out.dtype())
    return fail(Error::InvalidArgument, "%s: out has dtype %s, self %s", op,
                scalar_type_name(out.dtype()), scalar_type_name(a.dtype()));
  return Error::Ok;
}

// Copies a strided view of `src` (sizes, element strides, element offset) into dst.
void strided_copy(const uint8_t* src, uint8_t* dst, size_t esize, int nd, const int64_t* sizes,
                  const int64_t* strides, int64_t offset) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= sizes[i];
  if (n == 0) return;
  if (nd == 0) {
    memcpy(dst, src + offset * int64_t(esize), esize);
    return;
  }
  const int last = nd - 1;
  const int64_t inner = sizes[last], istride = strides[last];
  int64_t idx[kMaxDim] = {};
  int64_t off = offset;
  for (int64_t o = 0; o < n / inner; ++o) {
    uint8_t* d = dst + o * inner * int64_t(esize);
    if (istride == 1) {
      memcpy(d, src + off * int64_t(esize), size_t(inner) * esize);
    } else {
      for (int64_t i = 0; i < inner; ++i)
        memcpy(d + i * int64_t(esize), src + (off + i * istride) * int64_t(esize), esize);
    }
    for (int d2 = last - 1; d2 >= 0; --d2) {
      off += strides[d2];
      if (++idx[d2] < sizes[d2]) break;
      off -= strides[d2] * sizes[d2];
      idx[d2] = 0;
    }
  }
}

}  // namespace

Error view_copy_out(KernelContext&, const Tensor& self, Span<const int64_t> size, Tensor& out) {
  ETB_TRY(same_dtype(self, out, "view_copy"));
  if (size.size() > size_t(kMaxDim)) return fail(Error::InvalidArgument, "view_copy: too many dims");
  int64_t sz[kMaxDim];
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] == -1) {
      if (infer >= 0) return fail(Error::InvalidArgument, "view_copy: only one -1 allowed");
      infer = int(i);
      continue;
    }
    if (size[i] < 0 || size[i] > (int64_t(1) << 40))
      return fail(Error::InvalidArgument, "view_copy: invalid size %lld", (long long)size[i]);
    sz[i] = size[i];
    known *= size[i];
  }
  if (infer >= 0) {
    if (known == 0 || self.numel() % known != 0)
      return fail(Error::InvalidArgument, "view_copy: cannot infer the -1 size");
    sz[infer] = self.numel() / known;
    known *= sz[infer];
  }
  if (known != self.numel())
    return fail(Error::InvalidArgument, "view_copy: %lld elements cannot be viewed as %lld",
                (long long)self.numel(), (long long)known);
  ETB_TRY(resize_to(out, sz, int(size.size())));
  if (out.data() != self.data() && self.nbytes() > 0)
    memmove(out.data(), self.data(), self.nbytes());
  return Error::Ok;
}

Error permute_copy_out(KernelContext&, const Tensor& self, Span<const int64_t> dims,
                       Tensor& out) {
  ETB_TRY(same_dtype(self, out, "permute_copy"));
  const int nd = self.dim();
  if (int(dims.size()) != nd)
    return fail(Error::InvalidArgument, "permute_copy: %zu dims given for a %d-d tensor",
                dims.size(), nd);
  int64_t sz[kMaxDim], st[kMaxDim];
  bool seen[kMaxDim] = {};
  for (int i = 0; i < nd; ++i) {
    int64_t d = 0;
    ETB_TRY(wrap_dim(dims[size_t(i)], nd, &d, "permute_copy"));
    if (seen[d]) return fail(Error::InvalidArgument, "permute_copy: repeated dim");
    seen[d] = true;
    sz[i] = self.size(int(d));
    st[i] = self.stride(int(d));
  }
  ETB_TRY(resize_to(out, sz, nd));
  if (out.data() == self.data() && self.numel() > 1)
    return fail(Error::NotSupported, "permute_copy: out may not alias self");
  strided_copy(static_cast<const uint8_t*>(self.data()), static_cast<uint8_t*>(out.data()),
               self.element_size(), nd, sz, st, 0);
  return Error::Ok;
}

Error flip_out(KernelContext&, const Tensor& self, Span<const int64_t> dims, Tensor& out) {
  ETB_TRY(same_dtype(self, out, "flip"));
  const int nd = self.dim();
  int64_t sz[kMaxDim], st[kMaxDim];
  for (int i = 0; i < nd; ++i) {
    sz[i] = self.size(i);
    st[i] = self.stride(i);
  }
  // A flipped dim is read from its end with the stride negated.
  int64_t offset = 0;
  bool flipped[kMaxDim] = {};
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = 0;
    ETB_TRY(wrap_dim(dims[i], nd, &d, "flip"));
    if (flipped[d]) return fail(Error::InvalidArgument, "flip: dim %lld repeated", (long long)d);
    flipped[d] = true;
    if (sz[d] > 0) offset += (sz[d] - 1) * st[d];
    st[d] = -st[d];
  }
  ETB_TRY(resize_to(out, sz, nd));
  if (out.data() == self.data() && self.numel() > 1)
    return fail(Error::NotSupported, "flip: out may not alias self");
  strided_copy(static_cast<const uint8_t*>(self.data()), static_cast<uint8_t*>(out.data()),
               self.element_size(), nd, sz, st, offset);
  return Error::Ok;
}

Error constant_pad_nd_out(KernelContext&, const Tensor& self, Span<const int64_t> pad,
                          const Scalar& value, Tensor& out) {
  ETB_TRY(same_dtype(self, out, "constant_pad_nd"));
  const int nd = self.dim();
  if (pad.size() % 2 != 0 || int(pad.size() / 2) > nd)
    return fail(Error::InvalidArgument,
                "constant_pad_nd: %zu pad values for a %d-d tensor (two per dim, at most %d)",
                pad.size(), nd, 2 * nd);
  // before[d], after[d]: elements added (or, negative, removed) at each end of dim d; pad
  // lists the last dim first.
  int64_t before[kMaxDim] = {}, after[kMaxDim] = {}, sz[kMaxDim];
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int d = nd - 1 - int(i);
    before[d] = pad[2 * i];
    after[d] = pad[2 * i + 1];
  }
  for (int d = 0; d < nd; ++d) {
    sz[d] = self.size(d) + before[d] + after[d];
    if (sz[d] < 0)
      return fail(Error::InvalidArgument, "constant_pad_nd: dim %d would have size %lld", d,
                  (long long)sz[d]);
  }
  ETB_TRY(resize_to(out, sz, nd));
  if (out.data() == self.data() && out.numel() > 0)
    return fail(Error::NotSupported, "constant_pad_nd: out may not alias self");
  constexpr DtypeSet kDtypes = selected_dtypes("aten::constant_pad_nd.out", "self") &
                               dtype_set(ScalarType::Float, ScalarType::Long, ScalarType::Int);
  const bool built = dispatch_dtype<kDtypes>(self.dtype(), [&](auto c) {
    using T = decltype(c);
    T* o = out.data_as<T>();
    const T fill = std::is_floating_point<T>::value ? T(value.to_double()) : T(value.to_int());
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = fill;
  });
  if (!built) return dtype_not_built("constant_pad_nd", "self", self.dtype());
  // The part of self that lands in out, row by row (bytes): per dim, source [lo, lo + n) at
  // out index lo + before.
  const size_t esize = self.element_size();
  int64_t lo[kMaxDim], n[kMaxDim];
  int64_t count = 1;
  for (int d = 0; d < nd; ++d) {
    lo[d] = before[d] < 0 ? -before[d] : 0;
    const int64_t hi = self.size(d) + (after[d] < 0 ? after[d] : 0);
    n[d] = hi > lo[d] ? hi - lo[d] : 0;
    count *= n[d];
  }
  const uint8_t* x = static_cast<const uint8_t*>(self.data());
  uint8_t* o = static_cast<uint8_t*>(out.data());
  if (nd == 0) {
    memcpy(o, x, esize);
    return Error::Ok;
  }
  const int last = nd - 1;
  int64_t idx[kMaxDim] = {};  // position within the copied region, leading dims
  for (int64_t row = 0; count > 0 && row < count / n[last]; ++row) {
    int64_t src = 0, dst = 0;
    for (int d = 0; d < nd; ++d) {
      const int64_t at = lo[d] + (d == last ? 0 : idx[d]);
      src = src * self.size(d) + at;
      dst = dst * sz[d] + at + before[d];
    }
    memcpy(o + dst * int64_t(esize), x + src * int64_t(esize), size_t(n[last]) * esize);
    for (int d = last - 1; d >= 0; --d) {
      if (++idx[d] < n[d]) break;
      idx[d] = 0;
    }
  }
  return Error::Ok;
}

Error expand_copy_out(KernelContext&, const Tensor& self, Span<const int64_t> size,
                      bool implicit, Tensor& out) {
  (void)implicit;
  ETB_TRY(same_dtype(self, out, "expand_copy"));
  const int nd = int(size.size());
  if (nd < self.dim() || nd > kMaxDim)
    return fail(Error::InvalidArgument, "expand_copy: %d sizes for a %d-d tensor", nd,
                self.dim());
  int64_t sz[kMaxDim], st[kMaxDim];
  for (int i = 0; i < nd; ++i) {
    const int j = i - (nd - self.dim());
    const int64_t have = j >= 0 ? self.size(j) : 1;
    int64_t want = size[size_t(i)];
    if (want == -1) {
      if (j < 0) return fail(Error::InvalidArgument, "expand_copy: -1 on a new leading dim");
      want = have;
    }
    if (want < 0 || want > (int64_t(1) << 40) || (have != want && have != 1))
      return fail(Error::InvalidArgument, "expand_copy: size %lld cannot expand to %lld",
                  (long long)have, (long long)want);
    sz[i] = want;
    st[i] = (j >= 0 && have != 1) ? self.stride(j) : 0;
  }
  ETB_TRY(resize_to(out, sz, nd));
  if (out.data() == self.data() && out.numel() > 1)
    return fail(Error::NotSupported, "expand_copy: out may not alias self");
  strided_copy(static_cast<const uint8_t*>(self.data()), static_cast<uint8_t*>(out.data()),
               self.element_size(), nd, sz, st, 0);
  return Error::Ok;
}

Error slice_copy_Tensor_out(KernelContext&, const Tensor& self, int64_t dim,
                            Optional<int64_t> start, Optional<int64_t> end, int64_t step,
                            Tensor& out) {
  ETB_TRY(same_dtype(self, out, "slice_copy"));
  if (self.dim() == 0) return fail(Error::InvalidArgument, "slice_copy: 0-d tensor");
  int64_t d = 0;
  ETB_TRY(wrap_dim(dim, self.dim(), &d, "slice_copy"));
  if (step < 1) return fail(Error::InvalidArgument, "slice_copy: step must be positive");
  const int64_t len = self.size(int(d));
  int64_t s = start.has_value ? start.value : 0;
  int64_t e = end.has_value ? end.value : len;
  if (s < 0) s += len;
  if (e < 0) e += len;
  s = s < 0 ? 0 : (s > len ? len : s);
  e = e < s ? s : (e > len ? len : e);
  const int64_t n = step >= e - s ? (e > s ? 1 : 0) : (e - s + step - 1) / step;
  int64_t sz[kMaxDim], st[kMaxDim];
  for (int i = 0; i < self.dim(); ++i) {
    sz[i] = self.size(i);
    st[i] = self.stride(i);
  }
  sz[d] = n;
  const int64_t offset = s * st[d];
  st[d] *= step;
  ETB_TRY(resize_to(out, sz, self.dim()));
  if (out.data() == self.data() && out.numel() > 0 && (offset != 0 || step != 1))
    return fail(Error::NotSupported, "slice_copy: out may not alias self");
  strided_copy(static_cast<const uint8_t*>(self.data()), static_cast<uint8_t*>(out.data()),
               self.element_size(), self.dim(), sz, st, offset);
  return Error::Ok;
}

Error select_copy_int_out(KernelContext&, const Tensor& self, int64_t dim, int64_t index,
                          Tensor& out) {
  ETB_TRY(same_dtype(self, out, "select_copy"));
  if (self.dim() == 0) return fail(Error::InvalidArgument, "select_copy: 0-d tensor");
  int64_t d = 0;
  ETB_TRY(wrap_dim(dim, self.dim(), &d, "select_copy"));
  const int64_t len = self.size(int(d));
  const int64_t i = index < 0 ? index + len : index;
  if (i < 0 || i >= len)
    return fail(Error::InvalidArgument, "select_copy: index %lld out of range for size %lld",
                (long long)index, (long long)len);
  int64_t sz[kMaxDim], st[kMaxDim];
  int od = 0;
  for (int k = 0; k < self.dim(); ++k) {
    if (k == d) continue;
    sz[od] = self.size(k);
    st[od] = self.stride(k);
    ++od;
  }
  ETB_TRY(resize_to(out, sz, od));
  if (out.data() == self.data() && out.numel() > 0 && i * self.stride(int(d)) != 0)
    return fail(Error::NotSupported, "select_copy: out may not alias self");
  strided_copy(static_cast<const uint8_t*>(self.data()), static_cast<uint8_t*>(out.data()),
               self.element_size(), od, sz, st, i * self.stride(int(d)));
  return Error::Ok;
}

Error cat_out(KernelContext&, Span<Tensor* const> tensors, int64_t dim, Tensor& out) {
  // Legacy rule: 1-d empty tensors are skipped.
  const Tensor* ref = nullptr;
  for (Tensor* t : tensors)
    if (!(t->dim() == 1 && t->numel() == 0)) {
      ref = t;
      break;
    }
  if (ref == nullptr) {
    const int64_t zero = 0;
    return resize_to(out, &zero, 1);
  }
  if (ref->dim() == 0) return fail(Error::InvalidArgument, "cat: zero-dimensional tensor");
  int64_t d = 0;
  ETB_TRY(wrap_dim(dim, ref->dim(), &d, "cat"));
  int64_t sz[kMaxDim];
  for (int i = 0; i < ref->dim(); ++i) sz[i] = ref->size(i);
  sz[d] = 0;
  for (Tensor* t : tensors) {
    if (t->dim() == 1 && t->numel() == 0) continue;
    if (t->dim() != ref->dim() || t->dtype() != out.dtype())
      return fail(Error::InvalidArgument, "cat: tensors must have the same rank and dtype");
    for (int i = 0; i < ref->dim(); ++i)
      if (i != d && t->size(i) != ref->size(i))
        return fail(Error::InvalidArgument, "cat: sizes differ outside dim %lld", (long long)d);
    sz[d] += t->size(int(d));
  }
  ETB_TRY(resize_to(out, sz, ref->dim()));
  const size_t es = out.element_size();
  int64_t outer = 1;
  for (int i = 0; i < d; ++i) outer *= sz[i];
  const int64_t inner = out.dim() == 0 ? 1 : out.stride(int(d));
  uint8_t* o = static_cast<uint8_t*>(out.data());
  int64_t col = 0;
  for (Tensor* t : tensors) {
    if (t->dim() == 1 && t->numel() == 0) continue;
    if (t->data() == out.data() && t->numel() > 0)
      return fail(Error::NotSupported, "cat: out may not alias an input");
    const int64_t chunk = t->size(int(d)) * inner;
    const uint8_t* src = static_cast<const uint8_t*>(t->data());
    for (int64_t r = 0; r < outer; ++r)
      memcpy(o + (r * sz[d] * inner + col) * int64_t(es), src + r * chunk * int64_t(es),
             size_t(chunk) * es);
    col += chunk;
  }
  return Error::Ok;
}

Error embedding_out(KernelContext&, const Tensor& weight, const Tensor& indices,
                    int64_t padding_idx, bool scale_grad_by_freq, bool sparse, Tensor& out) {
  (void)padding_idx;
  (void)scale_grad_by_freq;
  (void)sparse;
  if (weight.dim() != 2) return fail(Error::InvalidArgument, "embedding: weight must be 2-d");
  if (indices.dim() + 1 > kMaxDim) return fail(Error::InvalidArgument, "embedding: too many dims");
  ETB_TRY(same_dtype(weight, out, "embedding"));
  int64_t sz[kMaxDim];
  for (int i = 0; i < indices.dim(); ++i) sz[i] = indices.size(i);
  const int64_t rows = weight.size(0), D = weight.size(1);
  sz[indices.dim()] = D;
  ETB_TRY(resize_to(out, sz, indices.dim() + 1));
  const size_t row_bytes = size_t(D) * weight.element_size();
  const uint8_t* w = static_cast<const uint8_t*>(weight.data());
  uint8_t* o = static_cast<uint8_t*>(out.data());
  // Indices of the integer dtypes this build selected.
  constexpr DtypeSet kIndices = selected_dtypes("aten::embedding.out", "indices") &
                                dtype_set(ScalarType::Long, ScalarType::Int);
  Error err = Error::Ok;
  const bool built = dispatch_dtype<kIndices>(indices.dtype(), [&](auto c) {
    using I = decltype(c);
    const I* idx = indices.data_as<I>();
    for (int64_t i = 0; i < indices.numel(); ++i) {
      const int64_t ix = idx[i];
      if (ix < 0 || ix >= rows) {
        err = fail(Error::InvalidArgument, "embedding: index %lld out of range [0, %lld)",
                   (long long)ix, (long long)rows);
        return;
      }
      memcpy(o + size_t(i) * row_bytes, w + size_t(ix) * row_bytes, row_bytes);
    }
  });
  if (!built) return dtype_not_built("aten::embedding.out", "indices", indices.dtype());
  return err;
}

}  // namespace native

namespace prim {

Error sym_size_int(KernelContext&, const Tensor& self, int64_t dim, int64_t& result) {
  int64_t d = 0;
  ETB_TRY(native::wrap_dim(dim, self.dim(), &d, "sym_size"));
  result = self.dim() == 0 ? 1 : self.size(int(d));
  return Error::Ok;
}

namespace {
enum class PrimOp { Add, Sub, Mul, FloorDiv };

Error prim_scalar(PrimOp op, const Scalar& a, const Scalar& b, Scalar& result) {
  if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
    const int64_t x = a.to_int(), y = b.to_int();
    int64_t r = 0;
    switch (op) {
      case PrimOp::Add: r = int64_t(uint64_t(x) + uint64_t(y)); break;
      case PrimOp::Sub: r = int64_t(uint64_t(x) - uint64_t(y)); break;
      case PrimOp::Mul: r = int64_t(uint64_t(x) * uint64_t(y)); break;
      case PrimOp::FloorDiv:
        if (y == 0) return fail(Error::InvalidArgument, "floordiv: division by zero");
        if (x == INT64_MIN && y == -1) return fail(Error::InvalidArgument, "floordiv overflow");
        r = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --r;
        break;
    }
    result = Scalar(r);
    return Error::Ok;
  }
  const double x = a.to_double(), y = b.to_double();
  double r = 0;
  switch (op) {
    case PrimOp::Add: r = x + y; break;
    case PrimOp::Sub: r = x - y; break;
    case PrimOp::Mul: r = x * y; break;
    case PrimOp::FloorDiv:
      if (y == 0) return fail(Error::InvalidArgument, "floordiv: division by zero");
      r = __builtin_floor(x / y);
      break;
  }
  result = Scalar(r);
  return Error::Ok;
}
}  // namespace

Error add_scalar(KernelContext&, const Scalar& a, const Scalar& b, Scalar& result) {
  return prim_scalar(PrimOp::Add, a, b, result);
}
Error sub_scalar(KernelContext&, const Scalar& a, const Scalar& b, Scalar& result) {
  return prim_scalar(PrimOp::Sub, a, b, result);
}
Error mul_scalar(KernelContext&, const Scalar& a, const Scalar& b, Scalar& result) {
  return prim_scalar(PrimOp::Mul, a, b, result);
}
Error floordiv_scalar(KernelContext&, const Scalar& a, const Scalar& b, Scalar& result) {
  return prim_scalar(PrimOp::FloorDiv, a, b, result);
}

}  // namespace prim
}  // namespace etb
