// The core runtime with no kernels: loads a program, initializes and runs its first method
// (which fails cleanly when the program needs kernels). Its stripped size is the runtime's
// fixed cost; bench/ reports it.
#include <cstdio>
#include <cstdlib>

#include "executor/data_loader.h"
#include "executor/method.h"
#include "executor/program.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  etb::Result<etb::FileDataLoader> loader = etb::FileDataLoader::open(argv[1]);
  if (!loader.ok()) return 1;
  etb::Result<etb::Program> program = etb::Program::load(&loader.value());
  if (!program.ok()) {
    fprintf(stderr, "%s\n", etb::last_error_message());
    return 1;
  }
  const char* name = program->method_name(0).value();
  etb::Result<etb::MethodMeta> meta = program->method_meta(name);
  if (!meta.ok()) return 1;
  static etb::Span<uint8_t> banks[8];
  size_t nbanks = meta->num_memory_banks() < 8 ? meta->num_memory_banks() : 8;
  for (size_t b = 0; b < nbanks; ++b) {
    size_t n = size_t(meta->memory_bank_size(b).value());
    banks[b] = etb::Span<uint8_t>(static_cast<uint8_t*>(aligned_alloc(64, (n + 63) / 64 * 64)), n);
  }
  size_t mbytes = meta->method_allocator_bytes();
  etb::MemoryAllocator method_alloc(aligned_alloc(64, (mbytes + 63) / 64 * 64), mbytes);
  etb::MemoryManager mm;
  mm.method_allocator = &method_alloc;
  mm.banks = etb::Span<const etb::Span<uint8_t>>(banks, nbanks);
  etb::Result<etb::Method> method = program->load_method(name, mm);
  if (!method.ok()) {
    printf("%s\n", etb::last_error_message());
    return 0;
  }
  printf("%s\n", method->execute() == etb::Error::Ok ? "ok" : etb::last_error_message());
  return 0;
}
