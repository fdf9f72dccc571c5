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

#if defined(ETB_BARE_METAL)
// Appends to out[0, cap) at *len, always leaving room for the terminator.
struct Sink {
  char* out;
  size_t cap;
  size_t len = 0;
  void put(char c) {
    if (len + 1 < cap) out[len] = c;
    ++len;
  }
  void put(const char* s) {
    while (*s != '\0') put(*s++);
  }
  void put_unsigned(unsigned long long v, unsigned base) {
    char digits[24];
    int n = 0;
    do {
      const unsigned d = unsigned(v % base);
      digits[n++] = char(d < 10 ? '0' + d : 'a' + d - 10);
      v /= base;
    } while (v != 0);
    while (n > 0) put(digits[--n]);
  }
  void put_signed(long long v) {
    if (v < 0) {
      put('-');
      put_unsigned(0ull - static_cast<unsigned long long>(v), 10);
    } else {
      put_unsigned(static_cast<unsigned long long>(v), 10);
    }
  }
  // Six significant digits, as %g gives for the values messages show (scales, sizes).
  void put_double(double v) {
    if (v != v) return put("nan");
    if (v < 0) {
      put('-');
      v = -v;
    }
    if (v > 1e18) return put("inf-or-huge");
    int exp10 = 0;
    while (v != 0 && v < 1e-4) {
      v *= 10;
      --exp10;
    }
    unsigned long long whole = static_cast<unsigned long long>(v);
    double frac = v - double(whole);
    put_unsigned(whole, 10);
    unsigned long long micro = static_cast<unsigned long long>(frac * 1e6 + 0.5);
    if (micro >= 1000000) micro = 999999;
    if (micro != 0) {
      char d[7];
      for (int i = 5; i >= 0; --i, micro /= 10) d[i] = char('0' + micro % 10);
      int end = 6;
      while (end > 0 && d[end - 1] == '0') --end;
      put('.');
      for (int i = 0; i < end; ++i) put(d[i]);
    }
    if (exp10 != 0) {
      put("e");
      put_signed(exp10);
    }
  }
};
#endif
}  // namespace

int vformat(char* out, size_t cap, const char* fmt, va_list ap) {
#if defined(ETB_BARE_METAL)
  Sink sink{out, cap};
  for (const char* p = fmt; *p != '\0'; ++p) {
    if (*p != '%') {
      sink.put(*p);
      continue;
    }
    ++p;
    int longs = 0;
    bool size = false;
    for (;; ++p) {
      if (*p == 'l') {
        ++longs;
      } else if (*p == 'z') {
        size = true;
      } else {
        break;
      }
    }
    switch (*p) {
      case 's': {
        const char* s = va_arg(ap, const char*);
        sink.put(s != nullptr ? s : "(null)");
        break;
      }
      case 'c': sink.put(char(va_arg(ap, int))); break;
      case 'd':
      case 'i':
        if (size) {
          sink.put_signed(static_cast<long long>(va_arg(ap, ptrdiff_t)));
        } else if (longs >= 2) {
          sink.put_signed(va_arg(ap, long long));
        } else if (longs == 1) {
          sink.put_signed(va_arg(ap, long));
        } else {
          sink.put_signed(va_arg(ap, int));
        }
        break;
      case 'u':
      case 'x': {
        const unsigned base = *p == 'x' ? 16 : 10;
        if (size) {
          sink.put_unsigned(va_arg(ap, size_t), base);
        } else if (longs >= 2) {
          sink.put_unsigned(va_arg(ap, unsigned long long), base);
        } else if (longs == 1) {
          sink.put_unsigned(va_arg(ap, unsigned long), base);
        } else {
          sink.put_unsigned(va_arg(ap, unsigned), base);
        }
        break;
      }
      case 'p':
        sink.put("0x");
        sink.put_unsigned(reinterpret_cast<uintptr_t>(va_arg(ap, void*)), 16);
        break;
      case 'g':
      case 'f': sink.put_double(va_arg(ap, double)); break;
      case '%': sink.put('%'); break;
      case '\0': --p; break;  // a lone '%' at the end
      default:
        sink.put('%');
        sink.put(*p);
    }
  }
  if (cap > 0) out[sink.len < cap ? sink.len : cap - 1] = '\0';
  return int(sink.len);
#else
  return vsnprintf(out, cap, fmt, ap);
#endif
}

int format(char* out, size_t cap, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vformat(out, cap, fmt, ap);
  va_end(ap);
  return n;
}

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
  vformat(g_message, kMessageSize, fmt, ap);
  va_end(ap);
  return e;
}

void prefix_error_message(const char* fmt, ...) {
  char prefix[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vformat(prefix, sizeof(prefix), fmt, ap);
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
