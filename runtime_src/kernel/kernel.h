// Kernels: the KernelContext they run with and the registry that finds them by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/evalue.h"
#include "core/memory_allocator.h"
#include "core/result.h"
#include "core/span.h"
#include "kernel/parallel.h"

namespace etb {

/// An activation that Method load fused into a kernel call (a relu, hardtanh or clamp that
/// followed it): the kernel clamps every output element to [lo, hi], a NaN staying NaN, as
/// the activation's own kernel would have. Calls with nothing fused see (-inf, +inf).
struct OutputClamp {
  float lo = -__builtin_inff();
  float hi = __builtin_inff();
  /// True when the clamp can change a value.
  bool active() const { return lo > -__builtin_inff() || hi < __builtin_inff(); }
};

/// What a kernel sees besides its arguments: a temp allocator that is reset after the call,
/// the output clamp fused into this call, the threads it may split its work over and what its
/// prepare hook made of the call's constants at load.
class KernelContext {
 public:
  explicit KernelContext(MemoryAllocator* temp, OutputClamp clamp = OutputClamp(),
                         Parallel* parallel = nullptr, const void* prepared = nullptr)
      : temp_(temp), clamp_(clamp), parallel_(parallel), prepared_(prepared) {}
  /// Scratch memory valid until the kernel returns, or an error when none is left.
  Result<void*> allocate_temp(size_t n, size_t align = 64);
  /// The activation fused into this call (only kernels registered with fuses_clamp get one).
  const OutputClamp& output_clamp() const { return clamp_; }
  /// The memory this call's prepare hook filled at load (64-byte aligned), or nullptr when
  /// the method was not prepared or the hook took none: the kernel then works from its
  /// arguments alone.
  const void* prepared() const { return prepared_; }
  /// Threads a parallel_for may use (1: the calling thread only).
  int num_threads() const { return parallel_ != nullptr ? parallel_->num_threads() : 1; }
  /// Runs fn(ctx, task, thread) for every task in [0, n) over the threads and returns when all
  /// are done. Kernels split their output so that each element is computed the same way
  /// whatever the thread count: results are bit-identical to one thread.
  void parallel_for(int64_t n, TaskFn fn, void* ctx) const {
    if (parallel_ != nullptr && n > 1 && parallel_->num_threads() > 1) {
      parallel_->run(n, fn, ctx);
    } else {
      for (int64_t i = 0; i < n; ++i) fn(ctx, i, 0);
    }
  }
  /// parallel_for with a callable f(task, thread). Bare metal has no threads: a plain loop.
  template <typename F>
  void parallel_for(int64_t n, F& f) const {
#if defined(ETB_BARE_METAL)
    for (int64_t i = 0; i < n; ++i) f(i, 0);
#else
    parallel_for(
        n, [](void* c, int64_t task, int thread) { (*static_cast<F*>(c))(task, thread); }, &f);
#endif
  }

  /// Thread `thread`'s `per_thread` bytes of scratch for a task of this call's loops: the
  /// memory its Parallel keeps for it when that is big enough, else its slice of `base` (the
  /// call's temp memory, per_thread bytes a thread). The thread's own memory lies at the same
  /// addresses in every call, so it stays in its core's cache; a slice of temp memory lies
  /// where other kernels left their data, often in another core's cache, and each first write
  /// to one of its lines waits for that core. (MobileNetV2's int8 14x14 depthwise convolutions
  /// ran 16-22% faster at 2 threads in their threads' own memory.) Bare metal has no threads:
  /// always the slice.
  char* thread_slice(int thread, void* base, size_t per_thread) const {
    char* slice = static_cast<char*>(base) + size_t(thread) * per_thread;
#if defined(ETB_BARE_METAL)
    return slice;
#else
    if (parallel_ == nullptr || per_thread > parallel_->thread_memory_bytes()) return slice;
    char* own = parallel_->thread_memory(thread);
    return own != nullptr ? own : slice;
#endif
  }

  /// This call's context for the work inside one task of a parallel loop: the same clamp and
  /// prepared memory, no threads (the loop already has them) and no temp memory (take it
  /// before the loop).
  KernelContext within_task() const {
    return KernelContext(nullptr, clamp_, nullptr, prepared_);
  }

 private:
  MemoryAllocator* temp_;
  OutputClamp clamp_;
  Parallel* parallel_;
  const void* prepared_;
};

/// Each thread's scratch for a kernel call's loop (KernelContext::thread_slice), whose first
/// `zero_bytes` the thread zeroes itself at its first task of the loop. For work split in runs
/// whose calls leave that part zero (a padding that every run keeps): it is zeroed once a
/// thread, by the thread that uses it, not once a run nor all on the calling thread. One loop
/// only: the threads' own memory serves other kernels between loops.
class ThreadScratch {
 public:
  ThreadScratch(const KernelContext& ctx, void* base, size_t per_thread, size_t zero_bytes)
      : ctx_(ctx),
        base_(static_cast<char*>(base)),
        per_thread_(per_thread),
        zero_bytes_(zero_bytes) {
    for (int64_t& l : layout_) l = -1;
  }
  /// Thread `thread`'s slice (called only from that thread's tasks).
  char* slice(int thread) { return slice(thread, 0, zero_bytes_); }
  /// Thread `thread`'s slice for tasks whose zeros lie where `layout` (>= 0) puts them, in
  /// its first `zero_bytes`: zeroed again when the thread's last task had another layout (a
  /// depthwise band with its padding above against one with it below).
  char* slice(int thread, int64_t layout, size_t zero_bytes) {
    char* mine = ctx_.thread_slice(thread, base_, per_thread_);
    if (thread >= kTracked || layout_[thread] != layout) {  // threads past kTracked: every time
      std::memset(mine, 0, zero_bytes);
      if (thread < kTracked) layout_[thread] = layout;
    }
    return mine;
  }

 private:
  static constexpr int kTracked = 64;
  const KernelContext& ctx_;
  char* base_;
  size_t per_thread_, zero_bytes_;
  int64_t layout_[kTracked];  // the layout whose zeros each thread's slice holds (-1: none)
};

/// The memory a kernel's prepare hook fills once, at load, from a call's constant arguments
/// (weights in the layout of its micro-kernel), so that no call repeats that work.
/// Method::prepare runs every hook twice: a sizing pass without memory, in which take()
/// counts the bytes and returns nullptr, then a filling pass over memory of that size.
class PrepareContext {
 public:
  /// Sizing pass: data == nullptr. Filling pass: `capacity` bytes at `data` (64-aligned).
  PrepareContext(void* data, size_t capacity)
      : data_(static_cast<uint8_t*>(data)), capacity_(capacity) {}
  /// `n` bytes (64-byte aligned) for the hook to fill; nullptr in the sizing pass or when
  /// the memory is short (the hook then leaves this call unprepared).
  void* take(size_t n) {
    const size_t start = used_;
    used_ += (n + 63) & ~size_t(63);
    if (data_ == nullptr || used_ > capacity_) return nullptr;
    return data_ + start;
  }
  /// Bytes taken so far.
  size_t used() const { return used_; }

 private:
  uint8_t* data_;
  size_t capacity_;
  size_t used_ = 0;
};

/// A kernel's prepare hook (see PrepareContext): it may take memory only from arguments
/// that cannot change between calls (constant tensors: Tensor::read_only()), must take the
/// same bytes in both passes, and takes none when the call does not pay for it.
using KernelPrepareFn = Error (*)(PrepareContext& pctx, Span<EValue*> args);

/// A boxed kernel: arguments as the program lists them (schema args, then the return).
using KernelFn = Error (*)(KernelContext& ctx, Span<EValue*> args);

/// Checks a kernel call's arguments (count, types, dtypes the runtime is built with, tensor
/// layout) without running it. Method load calls it once per instruction with `at_load` set
/// (tensor memory is not checked then: inputs get theirs from set_input); the boxed kernel
/// runs the same check with `at_load` clear before every call.
using KernelCheckFn = Error (*)(Span<EValue*> args, bool at_load);

/// One registered kernel: "aten::add.out", its boxed entry point and its argument check.
struct Kernel {
  const char* name;
  KernelFn fn;
  KernelCheckFn check = nullptr;      // nullptr: nothing is checked at load
  bool fuses_clamp = false;           // applies KernelContext::output_clamp() to its output
  KernelPrepareFn prepare = nullptr;  // load-time preparation of constants, or nullptr
};

/// Adds kernels to the process-wide registry (a fixed-size table, no heap).
/// Registering a name twice replaces the earlier entry.
Error register_kernels(Span<const Kernel> kernels);

/// The kernel registered as `name` ("aten::add.out"), or nullptr.
KernelFn find_kernel(const char* name);

/// The registry entry of `name` (entry point and argument check), or nullptr.
const Kernel* find_kernel_entry(const char* name);

/// Every registered kernel.
Span<const Kernel> registered_kernels();

}  // namespace etb
