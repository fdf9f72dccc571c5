// Span<T>: a non-owning pointer + length view.
#pragma once

#include <cstddef>

namespace etb {

/// A non-owning view of `size()` contiguous elements.
template <typename T>
class Span {
 public:
  constexpr Span() : data_(nullptr), size_(0) {}
  constexpr Span(T* data, size_t size) : data_(data), size_(size) {}
  template <size_t N>
  constexpr Span(T (&arr)[N]) : data_(arr), size_(N) {}  // NOLINT: implicit
  /// Converts Span<U> to Span<const U>.
  template <typename U>
  constexpr Span(const Span<U>& o) : data_(o.data()), size_(o.size()) {}  // NOLINT

  constexpr T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr T& operator[](size_t i) const { return data_[i]; }
  constexpr T* begin() const { return data_; }
  constexpr T* end() const { return data_ + size_; }

 private:
  T* data_;
  size_t size_;
};

}  // namespace etb
