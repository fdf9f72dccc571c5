// A pool of POSIX threads for the kernels' parallel loops (hosted systems only).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "kernel/parallel.h"

namespace etb {

/// The memory a Parallel keeps for each of its threads, for the kernels' per-thread scratch
/// (Parallel::thread_memory): kBytes a thread, taken once, with the threads.
class ThreadMemory {
 public:
  /// Enough for the per-thread scratch of MobileNetV2's and ResNet18's kernels (a depthwise
  /// convolution's padded planes, a depth half's packed operands, a run's panels of B, a
  /// fused int8 block's band: up to 384 KiB of rows and its panels). MobileNetV2 int8 at 2
  /// threads in the host's slow placement: 0.97x the time with 256 KiB, whose bands fell back
  /// to temp memory.
  static constexpr size_t kBytes = size_t(512) << 10;
  explicit ThreadMemory(int threads);
  /// Thread `thread`'s memory, or nullptr when the allocation failed (the kernels then use
  /// their temp memory).
  char* of(int thread) const {
    return base_ != nullptr ? base_ + size_t(thread) * kBytes : nullptr;
  }
  size_t bytes() const { return base_ != nullptr ? kBytes : 0; }

 private:
  std::unique_ptr<char[]> block_;
  char* base_ = nullptr;  // block_ rounded up to 64 bytes
};

/// `threads` - 1 worker threads plus the thread that calls run(). Each thread of a loop of n
/// tasks starts on its own share, the t-th of `threads` equal runs of tasks, so that loops
/// that order their tasks alike (a convolution's columns, then the next one's) give each
/// thread the data it wrote itself, still in its core's cache. A thread whose share is done
/// helps with the others', and a loop is done when all of its tasks are, whether or not every
/// worker took part: a worker that the OS has not scheduled never holds the caller up.
/// Workers spin briefly after a loop (the next kernel call usually follows within
/// microseconds), then sleep. One loop runs at a time: concurrent run() calls take turns.
class ThreadPool final : public Parallel {
 public:
  /// Most threads a pool runs.
  static constexpr int kMaxThreads = 64;
  /// Starts min(max(threads, 1), kMaxThreads) - 1 workers; num_threads() says how many run
  /// (fewer when the system refuses to start a thread).
  explicit ThreadPool(int threads);
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const override { return num_workers_ + 1; }
  void run(int64_t n, TaskFn fn, void* ctx) override;
  char* thread_memory(int thread) const override { return memory_.of(thread); }
  size_t thread_memory_bytes() const override { return memory_.bytes(); }
  bool count_task_time(bool on) override;
  uint64_t counted_loops() const override { return loops_.load(std::memory_order_relaxed); }
  uint64_t counted_task_ns(int thread) const override {
    return thread >= 0 && thread < num_threads()
               ? task_ns_[thread].ns.load(std::memory_order_relaxed)
               : 0;
  }
  uint64_t counted_tasks(int thread) const override {
    return thread >= 0 && thread < num_threads()
               ? task_ns_[thread].tasks.load(std::memory_order_relaxed)
               : 0;
  }
  uint64_t counted_taken_over(int thread) const override {
    return thread >= 0 && thread < num_threads()
               ? task_ns_[thread].taken_over.load(std::memory_order_relaxed)
               : 0;
  }

 private:
  struct Worker {
    ThreadPool* pool;
    int thread;
    pthread_t handle;
  };
  static void* worker_main(void* arg);
  // Claims and runs tasks of loop `generation` until none is left (or a newer loop began):
  // its own share first, then what is left of the others'.
  void run_tasks(uint32_t generation, int thread);
  // Claims and runs tasks of share `share` of loop `generation` until none is left; false
  // when a newer loop began.
  bool run_share(uint32_t generation, int share, int thread);
  // Runs tasks [first, end) of fn on `thread`, counting their time when counting_ is on.
  void run_range(TaskFn fn, void* ctx, int64_t first, int64_t end, int thread, bool taken_over);

  Worker workers_[kMaxThreads];
  int num_workers_ = 0;
  pthread_mutex_t run_mu_;  // one loop at a time
  pthread_mutex_t mu_;      // guards sleeping and waking
  pthread_cond_t work_cv_;
  pthread_cond_t done_cv_;
  // The current loop's generation (sleeping workers wake on a new one).
  std::atomic<uint32_t> generation_{0};
  // A loop as run() publishes it.
  struct Loop {
    std::atomic<TaskFn> fn{nullptr};
    std::atomic<void*> ctx{nullptr};
    std::atomic<int64_t> n{0};
  };
  // A cache line a thread's share: the generation in the high 32 bits of `next` and the
  // share's next unclaimed task below, and the loop beside them (a worker that sees its word
  // change reads one line). Two loops by the generation's parity: run() writes the new
  // loop's while a late thread may still read the previous one's.
  struct alignas(64) Share {
    std::atomic<uint64_t> next{0};
    Loop loops[2];
  };
  Share shares_[kMaxThreads];
  std::atomic<int64_t> done_{0};  // tasks of the current loop that have finished
  // count_task_time's counts: a cache line a thread, so that counting adds no sharing.
  struct alignas(64) TaskNs {
    std::atomic<uint64_t> ns{0}, tasks{0}, taken_over{0};
  };
  std::atomic<bool> counting_{false};
  std::atomic<uint64_t> loops_{0};
  TaskNs task_ns_[kMaxThreads];
  std::atomic<bool> stop_{false};
  ThreadMemory memory_;
};

/// The threads for a method that runs on `threads` threads (nullptr for one: the calling
/// thread): a registered backend's own (Backend::create_parallel; XNNPACK's pthreadpool), so
/// that the kernels and the delegate share one set of threads, else a ThreadPool. Call it
/// after register_all_kernels().
std::unique_ptr<Parallel> make_thread_pool(int threads);

}  // namespace etb
