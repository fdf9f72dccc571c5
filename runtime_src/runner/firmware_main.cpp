// etb_firmware: a minimal bare-metal application of the runtime (ETB_BARE_METAL builds). It
// registers the selected kernels, loads a program from a buffer (BufferDataLoader: the program
// sits in flash), carves the planned memory banks, the method allocator, the input buffers and
// the kernels' temp allocator out of one statically allocated arena, and runs the method once.
// The build links it for the target (newlib-nano, stubbed system calls, --gc-sections) to
// measure what the runtime costs in flash and RAM; it is also a starting point for a firmware.
//
// The program and the arena belong to the application, which links in
//   extern "C" const uint8_t etb_program[];  extern "C" const size_t etb_program_size;
//   extern "C" uint8_t etb_arena[];          extern "C" const size_t etb_arena_size;
// (generated C arrays, `objcopy -I binary`, or linker-script symbols; etb_program and etb_arena
// 16-byte aligned). They are weak references here: without them main() returns 1 before it
// loads anything, and the image holds the runtime alone (report.md gives the program's size).
// The weak hooks etb_firmware_read_input / etb_firmware_write_output move the data.
//
// Built without ETB_FIRMWARE_KERNELS it registers no kernel: the runtime's fixed cost (the
// bare-metal counterpart of etb_size_test).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/memory_allocator.h"
#include "executor/data_loader.h"
#include "executor/method.h"
#include "executor/program.h"
#include "platform/platform.h"
#if defined(ETB_FIRMWARE_KERNELS)
#include "register_kernels.h"
#endif

extern "C" {
/// The program's bytes (model.pte) and their count; provided by the application.
extern const uint8_t etb_program[] __attribute__((weak));
extern const size_t etb_program_size __attribute__((weak));
/// Working memory for the banks, the method allocator, the inputs and the temp allocator.
extern uint8_t etb_arena[] __attribute__((weak));
extern const size_t etb_arena_size __attribute__((weak));

/// Fills tensor input `i` (`nbytes` bytes in the method's dtype and sizes); default: zeros.
__attribute__((weak)) void etb_firmware_read_input(size_t i, void* data, size_t nbytes) {
  (void)i;
  memset(data, 0, nbytes);
}

/// Receives tensor output `i` after the run; default: ignored.
__attribute__((weak)) void etb_firmware_write_output(size_t i, const void* data,
                                                     size_t nbytes) {
  (void)i;
  (void)data;
  (void)nbytes;
}
}

namespace {

constexpr size_t kMaxBanks = 8;

int failed(const char* what) {
  etb::platform_log(etb::LogLevel::Error, what);
  etb::platform_log(etb::LogLevel::Error, etb::last_error_message());
  return 1;
}

}  // namespace

int main() {
#if defined(ETB_FIRMWARE_KERNELS)
  if (etb::register_all_kernels() != etb::Error::Ok) return failed("register");
#endif
  if (&etb_program_size == nullptr || &etb_arena_size == nullptr) return 1;
  etb::BufferDataLoader loader(etb_program, etb_program_size);
  etb::Result<etb::Program> program = etb::Program::load(&loader);
  if (!program.ok()) return failed("load");
  etb::Result<const char*> name = program->method_name(0);
  if (!name.ok()) return failed("method");
  etb::Result<etb::MethodMeta> meta = program->method_meta(name.value());
  if (!meta.ok()) return failed("method");

  etb::MemoryAllocator arena(etb_arena, etb_arena_size);
  static etb::Span<uint8_t> banks[kMaxBanks];
  const size_t nbanks = meta->num_memory_banks();
  if (nbanks > kMaxBanks) return failed("too many memory banks");
  for (size_t b = 0; b < nbanks; ++b) {
    etb::Result<int64_t> n = meta->memory_bank_size(b);
    if (!n.ok()) return failed("memory plan");
    void* p = arena.allocate(size_t(n.value()), 16);
    if (p == nullptr) return failed("the arena is too small for the memory banks");
    banks[b] = etb::Span<uint8_t>(static_cast<uint8_t*>(p), size_t(n.value()));
  }
  const size_t method_bytes = meta->method_allocator_bytes();
  void* method_buf = arena.allocate(method_bytes, 16);
  if (method_buf == nullptr) return failed("the arena is too small for the method");
  etb::MemoryAllocator method_alloc(method_buf, method_bytes);
  etb::MemoryAllocator temp_alloc;
  etb::MemoryManager mm;
  mm.method_allocator = &method_alloc;
  mm.banks = etb::Span<const etb::Span<uint8_t>>(banks, nbanks);
  mm.temp_allocator = &temp_alloc;
  etb::Result<etb::Method> method = program->load_method(name.value(), mm);
  if (!method.ok()) return failed("init");

  for (size_t i = 0; i < method->num_inputs(); ++i) {
    const etb::EValue* v = method->input(i).value();
    if (!v->is_tensor()) continue;
    const etb::Tensor& t = v->to_tensor();
    void* data = arena.allocate(t.nbytes(), 16);
    if (data == nullptr) return failed("the arena is too small for the inputs");
    etb_firmware_read_input(i, data, t.nbytes());
    if (method->set_input(i, t.dtype(), t.sizes(), data, t.nbytes()) != etb::Error::Ok)
      return failed("input");
  }
  // The rest of the arena: the kernels' scratch memory.
  const size_t temp_bytes = arena.size() - arena.used();
  temp_alloc = etb::MemoryAllocator(arena.allocate(temp_bytes, 1), temp_bytes);

  if (method->execute() != etb::Error::Ok) return failed("execute");
  for (size_t o = 0; o < method->num_outputs(); ++o) {
    const etb::EValue* v = method->output(o).value();
    if (v->is_tensor())
      etb_firmware_write_output(o, v->to_tensor().data(), v->to_tensor().nbytes());
  }
  return 0;
}
