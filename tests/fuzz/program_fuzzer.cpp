// libFuzzer target: the bytes are a program file. It is loaded (without the checksum check,
// so that mutations reach the parsing behind it), every method is initialised with planned
// memory of the sizes it asks for (within bounds), given zero-filled inputs of the sizes its
// meta gives, and executed under a small instruction budget. Every failure must be an Error;
// a crash, a sanitizer report, a leak or a hang is a finding.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "executor/data_loader.h"
#include "executor/method.h"
#include "executor/program.h"
#include "kernel/kernel.h"
#include "register_kernels.h"

namespace {

constexpr int64_t kMaxBankBytes = int64_t(64) << 20;  // all banks of a method together
constexpr size_t kMaxMethodBytes = size_t(16) << 20;
constexpr size_t kTempBytes = size_t(4) << 20;
constexpr int64_t kMaxInputElements = int64_t(1) << 22;
constexpr uint64_t kInstructionBudget = 20000;

const bool kRegistered = etb::register_all_kernels() == etb::Error::Ok;

struct FreeDeleter {
  void operator()(uint8_t* p) const { free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

Buffer aligned(size_t n) {
  return Buffer(static_cast<uint8_t*>(aligned_alloc(64, (n + 63) / 64 * 64 + 64)));
}

void run_method(const etb::Program& program, const char* name) {
  etb::Result<etb::MethodMeta> meta = program.method_meta(name);
  if (!meta.ok()) return;
  const size_t num_banks = meta.value().num_memory_banks();
  if (num_banks > 16) return;
  std::vector<Buffer> banks;
  std::vector<etb::Span<uint8_t>> spans;
  int64_t total = 0;
  for (size_t b = 0; b < num_banks; ++b) {
    etb::Result<int64_t> size = meta.value().memory_bank_size(b);
    if (!size.ok() || size.value() < 0 || size.value() > kMaxBankBytes - total) return;
    total += size.value();
    banks.push_back(aligned(size_t(size.value())));
    spans.emplace_back(banks.back().get(), size_t(size.value()));
  }
  const size_t method_bytes = meta.value().method_allocator_bytes();
  if (method_bytes > kMaxMethodBytes) return;
  Buffer method_buffer = aligned(method_bytes), temp_buffer = aligned(kTempBytes);
  etb::MemoryAllocator method_alloc(method_buffer.get(), method_bytes);
  etb::MemoryAllocator temp_alloc(temp_buffer.get(), kTempBytes);
  etb::MemoryManager memory;
  memory.method_allocator = &method_alloc;
  memory.banks = etb::Span<const etb::Span<uint8_t>>(spans.data(), spans.size());
  memory.temp_allocator = &temp_alloc;
  etb::Result<etb::Method> method = program.load_method(name, memory);
  if (!method.ok()) return;
  etb::Method& m = method.value();
  m.set_instruction_budget(kInstructionBudget);
  std::vector<Buffer> inputs;
  for (size_t i = 0; i < m.num_inputs(); ++i) {
    etb::Result<etb::TensorInfo> info = meta.value().input_tensor_info(i);
    if (!info.ok()) {
      (void)m.set_input_scalar(i, etb::EValue(int64_t(1)));
      continue;
    }
    int64_t numel = 1;
    for (int d = 0; d < info.value().dim; ++d) {
      const int64_t s = info.value().sizes[d];
      if (s < 0 || (s > 0 && numel > kMaxInputElements / s)) return;
      numel *= s;
    }
    const size_t nbytes = size_t(numel) * etb::element_size(info.value().dtype);
    inputs.push_back(aligned(nbytes));
    memset(inputs.back().get(), 0, nbytes);
    (void)m.set_input(i, info.value().dtype,
                      etb::Span<const int64_t>(info.value().sizes, size_t(info.value().dim)),
                      inputs.back().get(), nbytes);
  }
  (void)m.execute();
}

}  // namespace

// For the structure-aware mutator (program_mutator.cpp), which renames operators to other
// registered kernels: the i-th registered kernel's name, or nullptr past the end.
extern "C" const char* etb_fuzz_kernel_name(size_t i) {
  const etb::Span<const etb::Kernel> kernels = etb::registered_kernels();
  return i < kernels.size() ? kernels[i].name : nullptr;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!kRegistered) abort();
  Buffer copy = aligned(size);  // programs are read in place and expect aligned data
  if (size > 0) memcpy(copy.get(), data, size);
  etb::BufferDataLoader loader(copy.get(), size);
  etb::Result<etb::Program> program = etb::Program::load(&loader, /*verify_checksums=*/false);
  if (!program.ok()) return 0;
  for (size_t i = 0; i < program.value().num_methods(); ++i) {
    etb::Result<const char*> name = program.value().method_name(i);
    if (name.ok()) run_method(program.value(), name.value());
  }
  return 0;
}
