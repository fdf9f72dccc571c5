// etb_firmware for a board: runs the embedded program (model.pte in flash) once on the
// reference inputs and writes its outputs, both as .etbt files through semihosting
// (input_<i>.etbt in, output_<i>.etbt out, in the emulator's working folder). The memory banks
// are the generated buffers (banks.c: one per planned bank, each in its linker section); the
// firmware checks them against the program's bank table before it runs anything. The method's
// tables and the inputs come from the arena (what board.ld leaves of the RAM); the kernels'
// scratch memory is the plan's scratch region when it reserves one, else the rest of the arena.
// The exit status (firmware.h) says what happened; every failure prints one line first.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/memory_allocator.h"
#include "executor/data_loader.h"
#include "executor/method.h"
#include "executor/program.h"
#include "firmware.h"
#include "platform/platform.h"
#include "register_kernels.h"
#include "semihosting.h"

extern "C" uint8_t __etb_arena_start[], __etb_arena_end[];

namespace etb {

/// The runtime's log goes to the semihosting console.
void platform_log(LogLevel level, const char* message) {
  (void)level;
  etb_sh_puts("etb_firmware: ");
  etb_sh_puts(message);
  etb_sh_puts("\n");
}

}  // namespace etb

namespace {

constexpr size_t kMaxBanks = 16;

template <typename... Args>
void say(const char* format, Args... args) {
  char line[256];
  snprintf(line, sizeof(line), format, args...);
  etb_sh_puts(line);
}

int runtime_error(const char* what) {
  say("etb_firmware: %s: %s\n", what, etb::last_error_message());
  return ETB_FW_RUNTIME_ERROR;
}

// Reads input_<i>.etbt into the arena and hands it to the method; the header must give the
// dtype and rank of the method's input i.
int read_input(etb::Method& method, size_t i, etb::MemoryAllocator& arena) {
  char path[32];
  snprintf(path, sizeof(path), "input_%u.etbt", unsigned(i));
  const int fd = etb_sh_open(path, 0);
  if (fd < 0) {
    say("etb_firmware: cannot open %s (semihosting)\n", path);
    return ETB_FW_IO_ERROR;
  }
  const long length = etb_sh_flen(fd);
  uint8_t header[16];
  uint32_t version = 0, dtype = 0, ndim = 0;
  int64_t sizes[etb::kMaxDim] = {};
  const char* why = nullptr;
  if (length < 16 || etb_sh_read(fd, header, 16) != 0 || memcmp(header, "ETBT", 4) != 0) {
    why = "no ETBT header";
  } else {
    memcpy(&version, header + 4, 4);
    memcpy(&dtype, header + 8, 4);
    memcpy(&ndim, header + 12, 4);
    if (version != 1 || !etb::is_valid_scalar_type(int(dtype)) || ndim > uint32_t(etb::kMaxDim))
      why = "an unknown version, dtype or rank";
    else if (etb_sh_read(fd, sizes, 8 * ndim) != 0)
      why = "the sizes are cut short";
  }
  uint64_t nbytes = why == nullptr ? etb::element_size(etb::ScalarType(dtype)) : 0;
  for (uint32_t d = 0; why == nullptr && d < ndim; ++d) {
    if (sizes[d] < 0 || (sizes[d] != 0 && nbytes > UINT32_MAX / uint64_t(sizes[d])))
      why = "a size is negative or too large";
    else
      nbytes *= uint64_t(sizes[d]);
  }
  if (why == nullptr && uint64_t(length) != 16 + 8 * uint64_t(ndim) + nbytes)
    why = "the data length does not match the sizes";
  void* data = why == nullptr ? arena.allocate(size_t(nbytes), 16) : nullptr;
  if (why == nullptr && data == nullptr) {
    etb_sh_close(fd);
    say("etb_firmware: the arena (%u bytes) is too small for input %u (%u bytes)\n",
        unsigned(arena.size()), unsigned(i), unsigned(nbytes));
    return ETB_FW_RUNTIME_ERROR;
  }
  if (why == nullptr && nbytes > 0 && etb_sh_read(fd, data, size_t(nbytes)) != 0)
    why = "the data cannot be read";
  etb_sh_close(fd);
  if (why != nullptr) {
    say("etb_firmware: %s is not a valid .etbt file: %s\n", path, why);
    return ETB_FW_IO_ERROR;
  }
  if (method.set_input(i, etb::ScalarType(dtype), etb::Span<const int64_t>(sizes, ndim), data,
                       size_t(nbytes)) != etb::Error::Ok)
    return runtime_error("input");
  return ETB_FW_OK;
}

int write_output(size_t o, const etb::Tensor& t) {
  char path[32];
  snprintf(path, sizeof(path), "output_%u.etbt", unsigned(o));
  const int fd = etb_sh_open(path, 1);
  if (fd < 0) {
    say("etb_firmware: cannot create %s (semihosting)\n", path);
    return ETB_FW_IO_ERROR;
  }
  const uint32_t hdr[3] = {1, uint32_t(t.dtype()), uint32_t(t.dim())};
  bool ok = etb_sh_write(fd, "ETBT", 4) == 0 && etb_sh_write(fd, hdr, sizeof(hdr)) == 0;
  for (int64_t s : t.sizes()) ok = ok && etb_sh_write(fd, &s, 8) == 0;
  ok = ok && (t.nbytes() == 0 || etb_sh_write(fd, t.data(), t.nbytes()) == 0);
  ok = etb_sh_close(fd) == 0 && ok;
  if (!ok) {
    say("etb_firmware: cannot write %s (semihosting)\n", path);
    return ETB_FW_IO_ERROR;
  }
  return ETB_FW_OK;
}

}  // namespace

int main() {
  if (etb::register_all_kernels() != etb::Error::Ok) return runtime_error("register");
  etb::BufferDataLoader loader(etb_program, size_t(etb_program_end - etb_program));
  etb::Result<etb::Program> program = etb::Program::load(&loader);
  if (!program.ok()) return runtime_error("load");
  etb::Result<const char*> name = program->method_name(0);
  if (!name.ok()) return runtime_error("method");
  etb::Result<etb::MethodMeta> meta = program->method_meta(name.value());
  if (!meta.ok()) return runtime_error("method");

  // The program's banks must be the firmware's: same count, names, and room in each buffer.
  const size_t nbanks = meta->num_memory_banks();
  if (nbanks != etb_fw_num_banks || nbanks > kMaxBanks) {
    say("etb_firmware: the program plans %u memory banks, this firmware has %u (it was built "
        "for another memory plan); rebuild the firmware with this program\n",
        unsigned(nbanks), unsigned(etb_fw_num_banks));
    return ETB_FW_RUNTIME_ERROR;
  }
  static etb::Span<uint8_t> banks[kMaxBanks];
  for (size_t b = 0; b < nbanks; ++b) {
    etb::Result<const char*> bank = meta->memory_bank_name(b);
    etb::Result<int64_t> planned = meta->memory_bank_size(b);
    if (!bank.ok() || !planned.ok()) return runtime_error("memory plan");
    const etb_fw_bank& buffer = etb_fw_banks[b];
    if (strcmp(bank.value(), buffer.name) != 0 || uint64_t(planned.value()) > buffer.size) {
      say("etb_firmware: the program's memory bank %u is '%s' (%u bytes), the firmware's is "
          "'%s' (%u bytes); rebuild the firmware with this program\n",
          unsigned(b), bank.value(), unsigned(planned.value()), buffer.name,
          unsigned(buffer.size));
      return ETB_FW_RUNTIME_ERROR;
    }
    banks[b] = etb::Span<uint8_t>(buffer.data, buffer.size);
    say("memory_bank: %s %u bytes at 0x%08x\n", buffer.name, unsigned(buffer.size),
        unsigned(uintptr_t(buffer.data)));
  }

  etb::MemoryAllocator arena(__etb_arena_start, size_t(__etb_arena_end - __etb_arena_start));
  const size_t method_bytes = meta->method_allocator_bytes();
  void* method_buf = arena.allocate(method_bytes, 16);
  if (method_buf == nullptr) {
    say("etb_firmware: the arena (%u bytes) is too small for the method's tables (%u bytes)\n",
        unsigned(arena.size()), unsigned(method_bytes));
    return ETB_FW_RUNTIME_ERROR;
  }
  etb::MemoryAllocator method_alloc(method_buf, method_bytes);
  etb::MemoryAllocator temp_alloc;
  const etb::ScratchRegion scratch = meta->scratch_region();
  etb::MemoryManager mm;
  mm.method_allocator = &method_alloc;
  mm.banks = etb::Span<const etb::Span<uint8_t>>(banks, nbanks);
  // With a planned scratch region the method takes the kernels' scratch from its bank.
  mm.temp_allocator = scratch.size > 0 ? nullptr : &temp_alloc;
  etb::Result<etb::Method> method = program->load_method(name.value(), mm);
  if (!method.ok()) return runtime_error("init");

  for (size_t i = 0; i < method->num_inputs(); ++i) {
    const int status = read_input(method.value(), i, arena);
    if (status != ETB_FW_OK) return status;
  }
  if (scratch.size > 0) {
    say("scratch: %u bytes at offset %u of bank '%s'\n", unsigned(scratch.size),
        unsigned(scratch.offset), etb_fw_banks[scratch.bank].name);
  } else {  // the rest of the arena: the kernels' scratch memory
    const size_t temp_bytes = arena.size() - arena.used();
    temp_alloc = etb::MemoryAllocator(arena.allocate(temp_bytes, 1), temp_bytes);
    say("scratch: %u bytes of the arena\n", unsigned(temp_bytes));
  }

  if (method->execute() != etb::Error::Ok) return runtime_error("execute");
  for (size_t o = 0; o < method->num_outputs(); ++o) {
    const etb::EValue* v = method->output(o).value();
    if (!v->is_tensor()) continue;
    const int status = write_output(o, v->to_tensor());
    if (status != ETB_FW_OK) return status;
  }
  say("scratch_peak: %u bytes\n", unsigned(method->scratch_peak()));
  say("etb_firmware: ok, %u outputs\n", unsigned(method->num_outputs()));
  return ETB_FW_OK;
}
