// Platform hooks: logging, a monotonic clock and abort. Each is a weak symbol that a
// target may override by defining a function with the same signature. platform.cpp serves
// hosted systems (stderr, ETB_LOG, clock_gettime); platform_bare_metal.cpp serves bare metal
// (ETB_BARE_METAL: no log, clock 0, abort spins), for a firmware to override.
#pragma once

#include <cstdint>

namespace etb {

/// Log severity.
enum class LogLevel : uint8_t { Debug, Info, Error };

/// Writes one log line (default: stderr for Error, nothing below unless ETB_LOG is set).
void platform_log(LogLevel level, const char* message);

/// Monotonic time in nanoseconds.
uint64_t platform_now_ns();

/// Stops the program; never returns. The runtime itself never calls this on bad input.
[[noreturn]] void platform_abort();

}  // namespace etb
