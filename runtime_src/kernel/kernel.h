// Kernels: the KernelContext they run with and the registry that finds them by name.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/evalue.h"
#include "core/memory_allocator.h"
#include "core/result.h"
#include "core/span.h"

namespace etb {

/// What a kernel sees besides its arguments: a temp allocator that is reset after the call.
class KernelContext {
 public:
  explicit KernelContext(MemoryAllocator* temp) : temp_(temp) {}
  /// Scratch memory valid until the kernel returns, or an error when none is left.
  Result<void*> allocate_temp(size_t n, size_t align = 64);

 private:
  MemoryAllocator* temp_;
};

/// A boxed kernel: arguments as the program lists them (schema args, then the return).
using KernelFn = Error (*)(KernelContext& ctx, Span<EValue*> args);

/// One registered kernel: "aten::add.out" and its boxed entry point.
struct Kernel {
  const char* name;
  KernelFn fn;
};

/// Adds kernels to the process-wide registry (a fixed-size table, no heap).
/// Registering a name twice replaces the earlier entry.
Error register_kernels(Span<const Kernel> kernels);

/// The kernel registered as `name` ("aten::add.out"), or nullptr.
KernelFn find_kernel(const char* name);

/// Every registered kernel.
Span<const Kernel> registered_kernels();

}  // namespace etb
