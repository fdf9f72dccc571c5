#include "backend/backend.h"

#include <cstring>

namespace etb {
namespace {
constexpr size_t kMaxBackends = 16;
struct Entry {
  const char* id;
  const Backend* backend;
};
Entry g_backends[kMaxBackends];
size_t g_num_backends = 0;
}  // namespace

Error register_backend(const char* id, const Backend* backend) {
  for (size_t i = 0; i < g_num_backends; ++i)
    if (strcmp(g_backends[i].id, id) == 0) {
      g_backends[i].backend = backend;
      return Error::Ok;
    }
  if (g_num_backends == kMaxBackends)
    return fail(Error::MemoryAllocationFailed, "backend registry full");
  g_backends[g_num_backends++] = Entry{id, backend};
  return Error::Ok;
}

const Backend* find_backend(const char* id, size_t id_size) {
  for (size_t i = 0; i < g_num_backends; ++i)
    if (strlen(g_backends[i].id) == id_size && memcmp(g_backends[i].id, id, id_size) == 0)
      return g_backends[i].backend;
  return nullptr;
}

Parallel* create_backend_parallel(int threads) {
  for (size_t i = 0; i < g_num_backends; ++i)
    if (Parallel* p = g_backends[i].backend->create_parallel(threads)) return p;
  return nullptr;
}

}  // namespace etb
