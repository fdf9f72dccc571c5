// Startup code for the MPS2 AN386 (Cortex-M4): the vector table and the reset handler, which
// enables the FPU, copies .data from flash, zeroes .bss and every memory bank buffer, runs the
// C++ constructors, calls main() and ends the emulation with main's status (semihosting).
// A fault reports itself on the semihosting console and exits with ETB_FW_FAULT.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "firmware.h"
#include "semihosting.h"

extern uint32_t __etb_data_load[], __etb_data_start[], __etb_data_end[];
extern uint32_t __etb_bss_start[], __etb_bss_end[];
extern uint32_t __etb_stack_top[];
extern uint8_t __etb_heap_start[], __etb_heap_end[];

int main(void);
void __libc_init_array(void);

// -nostartfiles: the C library's init hooks have nothing to do.
void _init(void) {}
void _fini(void) {}

// The C library's heap (malloc): a fixed region of board.ld, never the arena or the stack.
void* _sbrk(ptrdiff_t increment) {
  static uint8_t* brk = __etb_heap_start;
  if (increment < 0 || increment > __etb_heap_end - brk) return (void*)-1;
  uint8_t* old = brk;
  brk += increment;
  return old;
}

void Reset_Handler(void) {
  // CPACR: full access to coprocessors 10 and 11 (the FPU), before any floating-point code.
  volatile uint32_t* cpacr = (volatile uint32_t*)0xE000ED88u;
  *cpacr |= 0xFu << 20;
  __asm__ volatile("dsb\n isb" ::: "memory");
  memcpy(__etb_data_start, __etb_data_load,
         (size_t)((uint8_t*)__etb_data_end - (uint8_t*)__etb_data_start));
  memset(__etb_bss_start, 0, (size_t)((uint8_t*)__etb_bss_end - (uint8_t*)__etb_bss_start));
  for (size_t b = 0; b < etb_fw_num_banks; ++b)
    if (etb_fw_banks[b].data != NULL) memset(etb_fw_banks[b].data, 0, etb_fw_banks[b].size);
  __libc_init_array();
  etb_sh_exit(main());
}

static void fault(const char* what) {
  etb_sh_puts("etb_firmware: fault: ");
  etb_sh_puts(what);
  etb_sh_puts("\n");
  etb_sh_exit(ETB_FW_FAULT);
}

void NMI_Handler(void) { fault("NMI"); }
void HardFault_Handler(void) { fault("HardFault"); }
void MemManage_Handler(void) { fault("MemManage"); }
void BusFault_Handler(void) { fault("BusFault"); }
void UsageFault_Handler(void) { fault("UsageFault"); }
void Default_Handler(void) { fault("unexpected exception or interrupt"); }

typedef void (*Handler)(void);

__attribute__((section(".vectors"), used)) const Handler etb_vector_table[16] = {
    (Handler)(uintptr_t)__etb_stack_top,  // initial stack pointer
    Reset_Handler,
    NMI_Handler,
    HardFault_Handler,
    MemManage_Handler,
    BusFault_Handler,
    UsageFault_Handler,
    0,
    0,
    0,
    0,
    Default_Handler,  // SVCall
    Default_Handler,  // DebugMonitor
    0,
    Default_Handler,  // PendSV
    Default_Handler,  // SysTick
};
