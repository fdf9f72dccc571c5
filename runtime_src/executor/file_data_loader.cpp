#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "executor/data_loader.h"

namespace etb {

Result<FileDataLoader> FileDataLoader::open(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(Error::NotFound, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(Error::InvalidArgument, "%s is not a regular file", path);
  }
  size_t size = size_t(st.st_size);
  if (size == 0) {
    ::close(fd);
    return fail(Error::InvalidProgram, "%s is empty", path);
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return fail(Error::Internal, "cannot map %s: %s", path, strerror(errno));
  return FileDataLoader(static_cast<const uint8_t*>(p), size);
}

FileDataLoader::~FileDataLoader() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace etb
