// Error codes and the thread-local error message of the etbuild runtime.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>

namespace etb {

/// Every failure in the runtime is one of these codes; never an exception or a crash.
enum class [[nodiscard]] Error : uint32_t {
  Ok = 0,
  Internal = 1,
  InvalidArgument = 2,    ///< A caller-supplied value is wrong (dtype, shape, index).
  InvalidProgram = 3,     ///< The program file is malformed or inconsistent.
  NotFound = 4,           ///< A method, operator or backend does not exist.
  NotSupported = 5,       ///< Valid, but this runtime cannot do it (dtype, layout, ...).
  MemoryAllocationFailed = 6,  ///< A caller-provided allocator or buffer is too small.
  OutOfBounds = 7,        ///< An index or offset lies outside its range.
  KernelFailed = 8,       ///< A kernel rejected its arguments at run time.
  DelegateFailed = 9,     ///< A backend failed to init or execute.
  Cancelled = 10,         ///< The caller cancelled the run (Method::set_cancel_flag).
};

/// A short name of an error code ("InvalidProgram").
const char* error_name(Error e);

/// snprintf for the runtime's messages: %s %c %d %i %u %x %p %g %% with the l, ll and z size
/// modifiers. Hosted builds use the C library's; bare metal (ETB_BARE_METAL) has its own, as
/// newlib-nano's printf has no %zu, %lld or floating point and would print "zu" for a size.
int format(char* out, size_t cap, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
int vformat(char* out, size_t cap, const char* fmt, va_list ap);

/// Formats a message into the calling thread's error buffer and returns `e`, so a failure
/// can be reported in one line: `return fail(Error::InvalidArgument, "input %d ...", i);`.
Error fail(Error e, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/// Prefixes the current thread's error message with a context string ("instruction 3: ").
void prefix_error_message(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/// The message of the most recent failure on this thread ("" when none).
const char* last_error_message();

/// Clears the current thread's error message.
void clear_error_message();

}  // namespace etb

/// Returns the error of an expression that yields an Error, when it is not Ok.
#define ETB_TRY(expr)                         \
  do {                                        \
    ::etb::Error etb_err_ = (expr);           \
    if (etb_err_ != ::etb::Error::Ok) return etb_err_; \
  } while (0)

/// Fails with `code` and a message when `cond` is false.
#define ETB_CHECK(cond, code, ...)                              \
  do {                                                          \
    if (!(cond)) return ::etb::fail((code), __VA_ARGS__);       \
  } while (0)
