// Backends (delegates): run a preprocessed subgraph blob that a partitioner produced.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/evalue.h"
#include "core/memory_allocator.h"
#include "core/result.h"
#include "core/span.h"
#include "kernel/parallel.h"

namespace etb {

/// One compile spec of a delegate: a key and opaque bytes.
struct CompileSpec {
  const char* key;
  size_t key_size;
  const uint8_t* value;
  size_t value_size;
};

/// Data a program stores by key (its named_data table, each entry a segment). ExecuTorch's
/// XNNPACK blobs keep their weights there.
class NamedDataMap {
 public:
  virtual ~NamedDataMap() = default;
  /// The bytes stored under `key`; NotFound when there are none.
  virtual Result<Span<const uint8_t>> named_data(const char* key, size_t key_size) const = 0;
};

/// What a backend gets at init: the method's allocator for its handle state, and the
/// program's named data (which outlives the method).
struct BackendInitContext {
  MemoryAllocator* allocator;
  const NamedDataMap* named_data;
};

/// What a backend gets at each execute: the threads the method's kernels use (nullptr: the
/// calling thread only). A backend runs on them when they are its threading library's (see
/// Parallel::native_handle and Backend::create_parallel), else sizes a pool of its own to
/// match.
struct BackendExecuteContext {
  Parallel* parallel;
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
  virtual Error execute(BackendExecuteContext& ctx, void* handle, Span<EValue*> args) const = 0;
  /// Releases what init acquired.
  virtual void destroy(void* handle) const = 0;
  /// `threads` threads (>= 2) on the backend's own threading library, for the method's
  /// kernels and the backend alike (the caller deletes them); nullptr when the backend has no
  /// such library or cannot start them. make_thread_pool asks the registered backends first.
  virtual Parallel* create_parallel(int threads) const {
    (void)threads;
    return nullptr;
  }
};

/// Registers `backend` under `id` (the BackendDelegate id in programs). The backend object
/// must outlive every method that uses it.
Error register_backend(const char* id, const Backend* backend);

/// The backend registered as `id`, or nullptr.
const Backend* find_backend(const char* id, size_t id_size);

/// Threads from the first registered backend that provides them (Backend::create_parallel),
/// or nullptr.
Parallel* create_backend_parallel(int threads);

}  // namespace etb
