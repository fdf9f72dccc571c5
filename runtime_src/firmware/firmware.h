// What the generated sources (pipeline/firmware.py) give the firmware: one buffer per planned
// memory bank, each in its own linker section, and the program's bytes.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// One planned memory bank: its name (as the program's bank table has it) and its buffer.
struct etb_fw_bank {
  const char* name;
  uint8_t* data;  ///< null for a bank the plan leaves empty
  size_t size;
  size_t alignment;
};

/// The banks, in the program's order (memory ids 1..n).
extern const struct etb_fw_bank etb_fw_banks[];
extern const size_t etb_fw_num_banks;
/// model.pte, embedded in flash.
extern const uint8_t etb_program[];
extern const uint8_t etb_program_end[];

/// Exit statuses of the firmware (semihosting exit code).
enum {
  ETB_FW_OK = 0,
  ETB_FW_RUNTIME_ERROR = 1,  ///< the runtime refused the program or the run failed
  ETB_FW_IO_ERROR = 2,       ///< an input or output file could not be read or written
  ETB_FW_FAULT = 3,          ///< a fault handler ran
};

#ifdef __cplusplus
}
#endif
