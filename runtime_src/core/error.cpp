#include "core/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

// Bare metal (ETB_BARE_METAL) has one thread and no thread pointer: the buffer is a plain
// static there.
#if defined(ETB_BARE_METAL)
#define ETB_THREAD_LOCAL
#else
#define ETB_THREAD_LOCAL thread_local
#endif

namespace etb {
namespace {
constexpr size_t kMessageSize = 2048;
ETB_THREAD_LOCAL char g_message[kMessageSize];

// strnlen is POSIX, not C++17 (newlib declares it only with POSIX extensions).
size_t bounded_strlen(const char* s, size_t max) {
  size_t n = 0;
  while (n < max && s[n] != '\0') ++n;
  return n;
}
}  // namespace

const char* error_name(Error e) {
  switch (e) {
    case Error::Ok: return "Ok";
    case Error::Internal: return "Internal";
    case Error::InvalidArgument: return "InvalidArgument";
    case Error::InvalidProgram: return "InvalidProgram";
    case Error::NotFound: return "NotFound";
    case Error::NotSupported: return "NotSupported";
    case Error::MemoryAllocationFailed: return "MemoryAllocationFailed";
    case Error::OutOfBounds: return "OutOfBounds";
    case Error::KernelFailed: return "KernelFailed";
    case Error::DelegateFailed: return "DelegateFailed";
    case Error::Cancelled: return "Cancelled";
  }
  return "Unknown";
}

Error fail(Error e, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_message, kMessageSize, fmt, ap);
  va_end(ap);
  return e;
}

void prefix_error_message(const char* fmt, ...) {
  char prefix[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(prefix, sizeof(prefix), fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  size_t plen = bounded_strlen(prefix, sizeof(prefix) - 1);
  size_t mlen = bounded_strlen(g_message, kMessageSize - 1);
  if (plen + mlen >= kMessageSize) mlen = kMessageSize - 1 - plen;
  memmove(g_message + plen, g_message, mlen);
  memcpy(g_message, prefix, plen);
  g_message[plen + mlen] = '\0';
}

const char* last_error_message() { return g_message; }

void clear_error_message() { g_message[0] = '\0'; }

}  // namespace etb
