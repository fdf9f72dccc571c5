// ARM semihosting calls for ARMv6-M/ARMv7-M: BKPT 0xAB, operation in r0, parameter block
// address in r1, result in r0.
#include "semihosting.h"

#include <string.h>

enum {
  SYS_OPEN = 0x01,
  SYS_CLOSE = 0x02,
  SYS_WRITE0 = 0x04,
  SYS_WRITE = 0x05,
  SYS_READ = 0x06,
  SYS_FLEN = 0x0C,
  SYS_EXIT_EXTENDED = 0x20,
};
// The reason code for a normal application exit (ADP_Stopped_ApplicationExit).
#define ADP_STOPPED_APPLICATION_EXIT 0x20026u

static int semihost(int op, const void* block) {
  register int r0 __asm__("r0") = op;
  register const void* r1 __asm__("r1") = block;
  __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}

int etb_sh_open(const char* path, int write) {
  // Modes: 1 = "rb", 5 = "wb".
  const uint32_t block[3] = {(uint32_t)(uintptr_t)path, write ? 5u : 1u, (uint32_t)strlen(path)};
  return semihost(SYS_OPEN, block);
}

int etb_sh_close(int handle) {
  const uint32_t block[1] = {(uint32_t)handle};
  return semihost(SYS_CLOSE, block);
}

int etb_sh_read(int handle, void* data, size_t n) {
  const uint32_t block[3] = {(uint32_t)handle, (uint32_t)(uintptr_t)data, (uint32_t)n};
  return semihost(SYS_READ, block);
}

int etb_sh_write(int handle, const void* data, size_t n) {
  const uint32_t block[3] = {(uint32_t)handle, (uint32_t)(uintptr_t)data, (uint32_t)n};
  return semihost(SYS_WRITE, block);
}

long etb_sh_flen(int handle) {
  const uint32_t block[1] = {(uint32_t)handle};
  return semihost(SYS_FLEN, block);
}

void etb_sh_puts(const char* s) { semihost(SYS_WRITE0, s); }

void etb_sh_exit(int code) {
  const uint32_t block[2] = {ADP_STOPPED_APPLICATION_EXIT, (uint32_t)code};
  semihost(SYS_EXIT_EXTENDED, block);
  for (;;) {
  }
}
