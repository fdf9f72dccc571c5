// DataLoader: where program bytes come from (a file read into memory, or a caller's buffer).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/result.h"

namespace etb {

/// Gives read access to the bytes of a program. Returned pointers stay valid for the
/// loader's lifetime.
class DataLoader {
 public:
  virtual ~DataLoader() = default;
  /// `size` bytes at `offset`, bounds-checked against size().
  virtual Result<const uint8_t*> load(size_t offset, size_t size) const = 0;
  /// Total bytes available.
  virtual size_t size() const = 0;
};

/// A loader over a caller-owned buffer (which must outlive the loader; 16-byte aligned).
class BufferDataLoader final : public DataLoader {
 public:
  BufferDataLoader(const void* data, size_t size)
      : data_(static_cast<const uint8_t*>(data)), size_(size) {}
  Result<const uint8_t*> load(size_t offset, size_t size) const override {
    if (offset > size_ || size > size_ - offset)
      return fail(Error::OutOfBounds, "read of %zu bytes at %zu is past the end (%zu bytes)",
                  size, offset, size_);
    return data_ + offset;
  }
  size_t size() const override { return size_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

#if !defined(ETB_BARE_METAL)
/// A loader that reads a regular file into memory once (a mapping would fault when the file
/// shrinks later). Not in bare-metal builds (ETB_BARE_METAL: no file system); use
/// BufferDataLoader over the program in flash there.
class FileDataLoader final : public DataLoader {
 public:
  /// Opens and reads `path`.
  static Result<FileDataLoader> open(const char* path);
  FileDataLoader(FileDataLoader&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  FileDataLoader(const FileDataLoader&) = delete;
  FileDataLoader& operator=(const FileDataLoader&) = delete;
  ~FileDataLoader() override;
  Result<const uint8_t*> load(size_t offset, size_t size) const override {
    if (offset > size_ || size > size_ - offset)
      return fail(Error::OutOfBounds, "read of %zu bytes at %zu is past the end (%zu bytes)",
                  size, offset, size_);
    return data_ + offset;
  }
  size_t size() const override { return size_; }

 private:
  FileDataLoader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  const uint8_t* data_;
  size_t size_;
};
#endif  // !ETB_BARE_METAL

}  // namespace etb
