#include "platform/platform.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace etb {

__attribute__((weak)) void platform_log(LogLevel level, const char* message) {
  static const char* env = getenv("ETB_LOG");
  if (level == LogLevel::Error || env != nullptr) fprintf(stderr, "[etb] %s\n", message);
}

__attribute__((weak)) uint64_t platform_now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

__attribute__((weak)) void platform_abort() { abort(); }

}  // namespace etb
