// ARM semihosting (the debugger or emulator serves the calls: qemu-system-arm with
// -semihosting-config enable=on,target=native does them on the host's files): open, read,
// write, close, file length, console output and exit with a status code. Only for a firmware
// that runs under a debugger or an emulator: on a free-running board, BKPT 0xAB stops the core.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Opens a host file ("rb" or "wb"); a handle >= 0, or -1.
int etb_sh_open(const char* path, int write);
/// Closes a handle; 0 on success.
int etb_sh_close(int handle);
/// Reads n bytes; 0 when all were read.
int etb_sh_read(int handle, void* data, size_t n);
/// Writes n bytes; 0 when all were written.
int etb_sh_write(int handle, const void* data, size_t n);
/// The file's length in bytes, or -1.
long etb_sh_flen(int handle);
/// Writes a NUL-terminated line to the emulator's console (stderr-like).
void etb_sh_puts(const char* s);
/// Ends the emulation with exit status `code` (SYS_EXIT_EXTENDED).
__attribute__((noreturn)) void etb_sh_exit(int code);

#ifdef __cplusplus
}
#endif
