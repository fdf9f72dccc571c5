#include "core/tensor.h"

#include <cstdio>

namespace etb {

Error Tensor::resize(Span<const int64_t> new_sizes) {
  char a[160], b[160];
  if (int(new_sizes.size()) != dim_)
    return fail(Error::InvalidArgument, "cannot resize a %d-d tensor to %d dims", dim_,
                int(new_sizes.size()));
  bool same = true;
  for (int i = 0; i < dim_; ++i) same = same && new_sizes[i] == sizes_[i];
  if (same) {
    if (nbytes() > capacity_bytes_)
      return fail(Error::InvalidArgument, "tensor of sizes %s has no memory (%zu bytes)",
                  format_sizes(sizes(), a, sizeof(a)), capacity_bytes_);
    return Error::Ok;
  }
  if (dynamism_ == ShapeDynamism::Static)
    return fail(Error::InvalidArgument, "cannot resize static tensor of sizes %s to %s",
                format_sizes(sizes(), a, sizeof(a)), format_sizes(new_sizes, b, sizeof(b)));
  uint64_t n = 1;
  for (int i = 0; i < dim_; ++i) {
    if (new_sizes[i] < 0) return fail(Error::InvalidArgument, "negative size in resize");
    n *= uint64_t(new_sizes[i]);
    if (n > (uint64_t(1) << 48)) return fail(Error::InvalidArgument, "resize: too many elements");
  }
  if (n * element_size() > capacity_bytes_)
    return fail(Error::InvalidArgument,
                "cannot resize tensor to %s: needs %llu bytes, its bound is %zu bytes",
                format_sizes(new_sizes, a, sizeof(a)),
                (unsigned long long)(n * element_size()), capacity_bytes_);
  for (int i = 0; i < dim_; ++i) sizes_[i] = new_sizes[i];
  numel_ = int64_t(n);
  return Error::Ok;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const uint8_t* pa = static_cast<const uint8_t*>(a.data());
  const uint8_t* pb = static_cast<const uint8_t*>(b.data());
  if (pa == nullptr || pb == nullptr) return false;
  const size_t na = a.capacity_bytes() > a.nbytes() ? a.capacity_bytes() : a.nbytes();
  const size_t nb = b.capacity_bytes() > b.nbytes() ? b.capacity_bytes() : b.nbytes();
  if (na == 0 || nb == 0) return false;
  return pa < pb + nb && pb < pa + na;
}

const char* format_sizes(Span<const int64_t> sizes, char* buf, size_t n) {
  size_t pos = 0;
  int w = snprintf(buf, n, "[");
  pos = w > 0 ? size_t(w) : 0;
  for (size_t i = 0; i < sizes.size() && pos < n; ++i) {
    w = format(buf + pos, n - pos, i ? ", %lld" : "%lld", (long long)sizes[i]);
    if (w < 0) break;
    pos += size_t(w);
  }
  if (pos < n) snprintf(buf + pos, n - pos, "]");
  return buf;
}

}  // namespace etb
