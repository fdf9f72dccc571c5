#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "executor/data_loader.h"

namespace etb {

Result<FileDataLoader> FileDataLoader::open(const char* path) {
  // Non-blocking, so that a FIFO or a device fails the regular-file check below instead of
  // waiting for a writer.
  int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail(Error::NotFound, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(Error::InvalidArgument, "%s is not a regular file", path);
  }
  const size_t size = size_t(st.st_size);
  if (size == 0) {
    ::close(fd);
    return fail(Error::InvalidProgram, "%s is empty", path);
  }
  // The file is read, not mapped: a mapping faults (SIGBUS) when the file shrinks after load.
  uint8_t* data = static_cast<uint8_t*>(aligned_alloc(64, (size + 63) / 64 * 64));
  if (data == nullptr) {
    ::close(fd);
    return fail(Error::MemoryAllocationFailed, "cannot allocate %zu bytes for %s", size, path);
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  ::close(fd);
  if (done != size) {
    free(data);
    return fail(Error::InvalidProgram, "%s: read %zu of its %zu bytes (did it change?)", path, done,
                size);
  }
  return FileDataLoader(data, size);
}

FileDataLoader::~FileDataLoader() {
  free(const_cast<uint8_t*>(data_));
}

}  // namespace etb
