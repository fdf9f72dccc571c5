#include "kernel/kernel.h"

#include <cstring>

#include "core/result.h"

namespace etb {
namespace {
#ifndef ETB_MAX_KERNELS
#define ETB_MAX_KERNELS 256
#endif
Kernel g_kernels[ETB_MAX_KERNELS];
size_t g_num_kernels = 0;
}  // namespace

Result<void*> KernelContext::allocate_temp(size_t n, size_t align) {
  void* p = temp_ ? temp_->allocate(n, align) : nullptr;
  if (p == nullptr)
    return fail(Error::MemoryAllocationFailed,
                "kernel temp allocator cannot provide %zu bytes (size %zu, used %zu)", n,
                temp_ ? temp_->size() : 0, temp_ ? temp_->used() : 0);
  return p;
}

Error register_kernels(Span<const Kernel> kernels) {
  for (const Kernel& k : kernels) {
    size_t i = 0;
    while (i < g_num_kernels && strcmp(g_kernels[i].name, k.name) != 0) ++i;
    if (i == g_num_kernels) {
      if (g_num_kernels == ETB_MAX_KERNELS)
        return fail(Error::MemoryAllocationFailed, "kernel registry full (%d)", ETB_MAX_KERNELS);
      ++g_num_kernels;
    }
    g_kernels[i] = k;
  }
  return Error::Ok;
}

KernelFn find_kernel(const char* name) {
  for (size_t i = 0; i < g_num_kernels; ++i)
    if (strcmp(g_kernels[i].name, name) == 0) return g_kernels[i].fn;
  return nullptr;
}

Span<const Kernel> registered_kernels() { return Span<const Kernel>(g_kernels, g_num_kernels); }

}  // namespace etb
