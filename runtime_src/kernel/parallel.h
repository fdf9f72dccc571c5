// Threads that kernels may split their work over. The runtime's core creates none: an app
// passes a Parallel to Method::set_parallel (platform/thread_pool.h makes one for hosted
// systems; a bare-metal build has none and every kernel runs on the calling thread).
#pragma once

#include <cstddef>
#include <cstdint>

namespace etb {

/// One task of a parallel loop: `thread` (0 for the calling thread) is below the pool's
/// num_threads(), so a kernel can give each thread its own slice of scratch memory.
using TaskFn = void (*)(void* ctx, int64_t task, int thread);

/// Tasks a kernel cuts its work into per thread, where the work has units for them. A pool
/// balances a loop by claims (a thread done with its share takes what is left of the others'),
/// so a core slowed for a while (by another process, or another tenant of the host) hands
/// tasks over. With 4 tasks a thread, the last task of a late core held the loop back by up to
/// an eighth of its work; with 16, by a thirty-second.
constexpr int64_t kTasksPerThread = 16;

/// Tasks a thread where every task reads all of a product's weights again (runs of a GEMM's
/// columns, each multiplied by every row of the weights): a pass over the weights costs more
/// than the finer balance of kTasksPerThread saves.
constexpr int64_t kWeightPassesPerThread = 4;

/// Runs of rows that a product taken in two halves of its depth gives each half (one task a
/// run): one for every two threads, so that each thread has one task of one half.
constexpr int64_t depth_half_runs(int threads) {
  return (int64_t(threads) + 1) / 2;
}

/// Planes of at least this many pixels are split over the threads by pixels, each thread a
/// band of rows or a run of columns, the same way in the convolutions (sgemm's columns, the
/// depthwise kernel's rows): a thread then reads mostly what it wrote in the layer before.
/// Split by channels (a product's rows), each thread reads half of its input from the other
/// threads' caches, which in some placements of a VM's cores (on different dies, it seems)
/// takes 2.5x as long as from its own. Smaller planes keep the channel split, under which a product's rows, the
/// depthwise channels and the halves of a product's depth line up (and a plane's columns
/// make too few tiles to share).
constexpr int64_t kPixelSplitMin = 56 * 56;

/// Whether work over planes of `pixels` pixels splits them by pixels (see kPixelSplitMin).
constexpr bool splits_pixels(int64_t pixels, int threads) {
  return threads > 1 && pixels >= kPixelSplitMin;
}

/// A set of threads that runs the tasks of one loop at a time.
class Parallel {
 public:
  virtual ~Parallel() = default;
  /// Threads that run tasks, the calling thread included (>= 1).
  virtual int num_threads() const = 0;
  /// Runs fn(ctx, task, thread) once for every task in [0, n), in any order and on any of
  /// the threads, and returns when all have finished.
  virtual void run(int64_t n, TaskFn fn, void* ctx) = 0;
  /// The handle of the threading library these threads belong to, when they belong to
  /// `library` (such as "pthreadpool"), else nullptr: a delegate built on that library then
  /// runs its own work on these threads instead of starting more.
  virtual void* native_handle(const char* library) const {
    (void)library;
    return nullptr;
  }
  /// Memory that thread `thread` keeps for the kernels' per-thread scratch (64-byte aligned,
  /// thread_memory_bytes() of it), or nullptr when these threads keep none. A task uses its
  /// thread's memory until it returns (ThreadScratch: until its loop ends), and nothing else
  /// touches it meanwhile: so one call runs on a Parallel at a time.
  virtual char* thread_memory(int thread) const {
    (void)thread;
    return nullptr;
  }
  virtual size_t thread_memory_bytes() const { return 0; }
  /// A profiling aid: switches on (or off) the counting of loops and of each thread's time in
  /// tasks, from zero; false when these threads count none. Off by default: the two clock
  /// reads around each run of tasks that a thread claims cost time of their own.
  virtual bool count_task_time(bool on) {
    (void)on;
    return false;
  }
  /// The loops run and thread `thread`'s nanoseconds in tasks since counting was switched on.
  /// A thread's time in tasks against the wall time tells work slowed down (by its data's
  /// placement, say) from threads waiting (for a loop's last task, or to be woken).
  virtual uint64_t counted_loops() const { return 0; }
  virtual uint64_t counted_task_ns(int thread) const {
    (void)thread;
    return 0;
  }
  /// The tasks thread `thread` ran since counting was switched on, and how many of them it
  /// took from another thread's share (it finished its own first): a task taken over runs
  /// on another core than its share's, so its data may be in the other core's cache.
  virtual uint64_t counted_tasks(int thread) const {
    (void)thread;
    return 0;
  }
  virtual uint64_t counted_taken_over(int thread) const {
    (void)thread;
    return 0;
  }
};

}  // namespace etb
