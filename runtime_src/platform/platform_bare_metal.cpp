// The platform layer for bare metal (ETB_BARE_METAL): no OS, no file system, no stdio, no
// environment. Each hook is a weak symbol; a firmware overrides the ones it can serve (a UART
// or semihosting log, a cycle counter or SysTick clock, a reset or breakpoint on abort).
#include "platform/platform.h"

namespace etb {

/// Default: drops the message (a firmware defines platform_log to send it somewhere).
__attribute__((weak)) void platform_log(LogLevel level, const char* message) {
  (void)level;
  (void)message;
}

/// Default: no clock (0); profiling then records zero durations.
__attribute__((weak)) uint64_t platform_now_ns() { return 0; }

/// Default: stops here forever (a debugger shows where; a watchdog resets the device).
__attribute__((weak)) void platform_abort() {
  for (;;) {
    __asm__ volatile("");
  }
}

}  // namespace etb
