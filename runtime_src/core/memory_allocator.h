// MemoryAllocator: a bump allocator over a caller-provided buffer (no heap).
#pragma once

#include <cstddef>
#include <cstdint>

namespace etb {

/// Hands out aligned pieces of one caller-owned buffer; reset() frees everything at once.
class MemoryAllocator {
 public:
  MemoryAllocator() = default;
  MemoryAllocator(void* base, size_t size) : base_(static_cast<uint8_t*>(base)), size_(size) {}

  /// `n` bytes aligned to `align` (a power of two), or nullptr when the buffer is full.
  void* allocate(size_t n, size_t align = 16) {
    uintptr_t p = reinterpret_cast<uintptr_t>(base_) + used_;
    uintptr_t aligned = (p + (align - 1)) & ~uintptr_t(align - 1);
    size_t pad = size_t(aligned - p);
    if (base_ == nullptr || pad > size_ - used_ || n > size_ - used_ - pad) return nullptr;
    used_ += pad + n;
    if (used_ > peak_) peak_ = used_;
    return reinterpret_cast<void*>(aligned);
  }
  /// `count` objects of type T (uninitialized), or nullptr.
  template <typename T>
  T* allocate_array(size_t count) {
    if (count > (~size_t(0)) / sizeof(T)) return nullptr;
    return static_cast<T*>(allocate(count * sizeof(T) == 0 ? 1 : count * sizeof(T), alignof(T)));
  }
  /// Frees every allocation.
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t size() const { return size_; }

 private:
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  size_t used_ = 0;
  size_t peak_ = 0;
};

}  // namespace etb
