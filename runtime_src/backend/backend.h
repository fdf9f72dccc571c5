// Backends (delegates): run a preprocessed subgraph blob that a partitioner produced.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/evalue.h"
#include "core/memory_allocator.h"
#include "core/result.h"
#include "core/span.h"

namespace etb {

/// One compile spec of a delegate: a key and opaque bytes.
struct CompileSpec {
  const char* key;
  size_t key_size;
  const uint8_t* value;
  size_t value_size;
};

/// What a backend gets at init: the method's allocator for its handle state.
struct BackendInitContext {
  MemoryAllocator* allocator;
};

/// A delegate implementation. Subclasses are registered once, by id.
class Backend {
 public:
  virtual ~Backend() = default;
  /// False when the backend cannot run on this machine.
  virtual bool is_available() const = 0;
  /// Prepares the processed blob; returns an opaque handle (may live in ctx.allocator).
  virtual Result<void*> init(BackendInitContext& ctx, Span<const uint8_t> processed,
                             Span<const CompileSpec> specs) const = 0;
  /// Runs the delegate on `args` (inputs then outputs, as the program lists them).
  virtual Error execute(void* handle, Span<EValue*> args) const = 0;
  /// Releases what init acquired.
  virtual void destroy(void* handle) const = 0;
};

/// Registers `backend` under `id` (the BackendDelegate id in programs). The backend object
/// must outlive every method that uses it.
Error register_backend(const char* id, const Backend* backend);

/// The backend registered as `id`, or nullptr.
const Backend* find_backend(const char* id, size_t id_size);

}  // namespace etb
