// Tensor: a typed view of memory with sizes, dim order and a capacity for resizing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/scalar_type.h"
#include "core/span.h"

namespace etb {

/// Most dimensions a tensor may have.
constexpr int kMaxDim = 16;

/// How a tensor's sizes may change at run time (the program schema's TensorShapeDynamism).
enum class ShapeDynamism : uint8_t { Static = 0, DynamicBound = 1, DynamicUnbound = 2 };

/// A tensor view. It does not own its data nor its size arrays: the method (or the caller)
/// provides them. Sizes may be resized at run time within `capacity_bytes` when the tensor
/// is dynamic.
class Tensor {
 public:
  Tensor() = default;
  /// A view of `data` with `dim` sizes/dim_order held in caller storage.
  Tensor(ScalarType dtype, int dim, int64_t* sizes, uint8_t* dim_order, void* data,
         size_t capacity_bytes, ShapeDynamism dynamism)
      : data_(data), sizes_(sizes), dim_order_(dim_order), capacity_bytes_(capacity_bytes),
        dim_(dim), dtype_(dtype), dynamism_(dynamism) {
    recompute_numel();
  }

  ScalarType dtype() const { return dtype_; }
  int dim() const { return dim_; }
  int64_t size(int d) const { return sizes_[d]; }
  Span<const int64_t> sizes() const { return Span<const int64_t>(sizes_, size_t(dim_)); }
  Span<const uint8_t> dim_order() const { return Span<const uint8_t>(dim_order_, size_t(dim_)); }
  int64_t numel() const { return numel_; }
  size_t element_size() const { return etb::element_size(dtype_); }
  size_t nbytes() const { return size_t(numel_) * element_size(); }
  /// Bytes available at data(): the planned (upper-bound) size.
  size_t capacity_bytes() const { return capacity_bytes_; }
  ShapeDynamism dynamism() const { return dynamism_; }
  /// True when dim_order is 0, 1, ..., dim-1 (row-major contiguous).
  bool is_contiguous() const {
    for (int i = 0; i < dim_; ++i)
      if (dim_order_[i] != i) return false;
    return true;
  }

  /// True for a 4-d tensor in dim order (0, 2, 3, 1): NCHW sizes, laid out [N][H][W][C].
  bool is_channels_last() const {
    return dim_ == 4 && dim_order_[0] == 0 && dim_order_[1] == 2 && dim_order_[2] == 3 &&
           dim_order_[3] == 1;
  }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data_); }
  /// Points the tensor at other memory of `capacity` bytes.
  void set_data(void* data, size_t capacity) { data_ = data; capacity_bytes_ = capacity; }
  /// True for constants: kernels must not write them.
  bool read_only() const { return read_only_; }
  void set_read_only(bool v) { read_only_ = v; }

  /// Sets new sizes: static tensors only accept their own sizes; dynamic tensors accept
  /// any sizes of the same rank whose bytes fit the capacity.
  Error resize(Span<const int64_t> new_sizes);

  /// Contiguous stride of dimension d (product of later sizes).
  int64_t stride(int d) const {
    int64_t s = 1;
    for (int i = dim_ - 1; i > d; --i) s *= sizes_[i];
    return s;
  }

 private:
  void recompute_numel() {
    int64_t n = 1;
    for (int i = 0; i < dim_; ++i) n *= sizes_[i];
    numel_ = n;
  }

  void* data_ = nullptr;
  int64_t* sizes_ = nullptr;
  uint8_t* dim_order_ = nullptr;
  size_t capacity_bytes_ = 0;
  int64_t numel_ = 1;
  int dim_ = 0;
  ScalarType dtype_ = ScalarType::Float;
  ShapeDynamism dynamism_ = ShapeDynamism::Static;
  bool read_only_ = false;
};

/// True when the memory of tensors a and b overlap: each spans its planned bytes (the larger
/// of capacity and current size) from data(); a tensor without memory or bytes overlaps nothing.
bool overlaps(const Tensor& a, const Tensor& b);

/// Formats sizes as "[2, 3, 4]" into buf (for messages); returns buf.
const char* format_sizes(Span<const int64_t> sizes, char* buf, size_t n);

}  // namespace etb
