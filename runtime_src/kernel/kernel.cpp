#include "kernel/kernel.h"

#include <cstdio>
#include <cstring>

#include "core/result.h"
#include "kernel/dtype_selection.h"

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

const Kernel* find_kernel_entry(const char* name) {
  for (size_t i = 0; i < g_num_kernels; ++i)
    if (strcmp(g_kernels[i].name, name) == 0) return &g_kernels[i];
  return nullptr;
}

KernelFn find_kernel(const char* name) {
  const Kernel* k = find_kernel_entry(name);
  return k != nullptr ? k->fn : nullptr;
}

const char* format_dtype_set(DtypeSet s, char* buf, size_t size) {
  if (size == 0) return buf;
  buf[0] = '\0';
  size_t len = 0;
  for (int code = 0; code < 32; ++code) {
    const ScalarType t = ScalarType(code);
    if (!dtype_in(s, t) || !is_valid_scalar_type(code)) continue;
    int w = snprintf(buf + len, size - len, "%s%s", len ? ", " : "", scalar_type_name(t));
    if (w < 0) break;
    len = len + size_t(w) < size ? len + size_t(w) : size - 1;
  }
  if (len == 0) snprintf(buf, size, "none");
  return buf;
}

Span<const Kernel> registered_kernels() { return Span<const Kernel>(g_kernels, g_num_kernels); }

}  // namespace etb
