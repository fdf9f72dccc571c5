#include "platform/thread_pool.h"

#include <new>

#include "backend/backend.h"
#include "platform/platform.h"

namespace etb {
namespace {

// Spins of a waiting thread before it sleeps: tens of microseconds, longer than the gap
// between two kernel calls, far shorter than the gap between two runs.
constexpr int kSpins = 20000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Tasks a loop can have on the pool's threads (a share's next task takes 32 bits).
constexpr int64_t kMaxTasks = 0xffffffff;

inline uint32_t generation_of(uint64_t word) {
  return uint32_t(word >> 32);
}
inline int64_t task_of(uint64_t word) {
  return int64_t(word & 0xffffffffu);
}
// The first task of thread t's share of a loop of n tasks (t == threads: n).
inline int64_t share_begin(int64_t n, int t, int threads) {
  return n * t / threads;
}

}  // namespace

ThreadMemory::ThreadMemory(int threads) {
  const size_t n = size_t(threads > 1 ? threads : 1);
  block_.reset(new (std::nothrow) char[n * kBytes + 63]);
  if (block_ == nullptr) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(block_.get());
  base_ = block_.get() + ((64 - p % 64) % 64);
}

ThreadPool::ThreadPool(int threads) : memory_(threads < kMaxThreads ? threads : kMaxThreads) {
  pthread_mutex_init(&run_mu_, nullptr);
  pthread_mutex_init(&mu_, nullptr);
  pthread_cond_init(&work_cv_, nullptr);
  pthread_cond_init(&done_cv_, nullptr);
  if (threads > kMaxThreads) threads = kMaxThreads;
  for (int t = 1; t < threads; ++t) {
    Worker& w = workers_[num_workers_];
    w.pool = this;
    w.thread = t;
    if (pthread_create(&w.handle, nullptr, &ThreadPool::worker_main, &w) != 0) break;
    ++num_workers_;
  }
}

ThreadPool::~ThreadPool() {
  pthread_mutex_lock(&mu_);
  stop_.store(true);
  pthread_cond_broadcast(&work_cv_);
  pthread_mutex_unlock(&mu_);
  for (int i = 0; i < num_workers_; ++i) pthread_join(workers_[i].handle, nullptr);
  pthread_cond_destroy(&done_cv_);
  pthread_cond_destroy(&work_cv_);
  pthread_mutex_destroy(&mu_);
  pthread_mutex_destroy(&run_mu_);
}

void ThreadPool::run_tasks(uint32_t generation, int thread) {
  const int threads = num_workers_ + 1;
  for (int i = 0; i < threads; ++i)
    if (!run_share(generation, (thread + i) % threads, thread)) return;
}

bool ThreadPool::run_share(uint32_t generation, int share, int thread) {
  const int threads = num_workers_ + 1;
  std::atomic<uint64_t>& next = shares_[share].next;
  int64_t ran = 0, n = 0;
  bool newer = false;
  const Loop& loop = shares_[share].loops[generation & 1];
  for (;;) {
    uint64_t word = next.load(std::memory_order_acquire);
    const uint32_t g = generation_of(word);
    if (g != generation) {
      if (int32_t(g - generation) < 0) {  // run() has yet to publish this share
        cpu_relax();
        continue;
      }
      newer = true;
      break;
    }
    // The loop of this word's generation: written before the word was published (the word,
    // or a claim since, carries run()'s release), and not rewritten before two loops later,
    // when every word has changed twice. A thread that reads it for an older word (it was
    // held up for two loops) reads values that may be half rewritten, but its claim below
    // then fails.
    n = loop.n.load(std::memory_order_relaxed);
    const TaskFn fn = loop.fn.load(std::memory_order_relaxed);
    void* ctx = loop.ctx.load(std::memory_order_relaxed);
    const int64_t first = task_of(word), end = share_begin(n, share + 1, threads);
    if (first >= end) break;
    // Claim half of what is left of the share (a run of tasks), not one task: a loop of
    // thousands of small tasks (one per channel, say) then costs a few dozen claims instead
    // of one each, and the shrinking claims still let the others help at the end.
    int64_t claim = (end - first) / 2;
    if (claim < 1) claim = 1;
    if (!next.compare_exchange_weak(word, word + uint64_t(claim))) continue;
    run_range(fn, ctx, first, first + claim, thread, share != thread);
    ran += claim;
  }
  // One count per thread and share (not per claim: the threads share this word). The thread
  // that finishes the loop always wakes the caller under the mutex (once per loop).
  // Signalling only when the caller has said it sleeps would need a store-load fence on each
  // side: without one, each can miss the other's write and the caller sleeps forever.
  if (ran > 0 && done_.fetch_add(ran, std::memory_order_acq_rel) + ran == n) {
    pthread_mutex_lock(&mu_);
    pthread_cond_signal(&done_cv_);
    pthread_mutex_unlock(&mu_);
  }
  return !newer;
}

bool ThreadPool::count_task_time(bool on) {
  pthread_mutex_lock(&run_mu_);  // between loops
  loops_.store(0, std::memory_order_relaxed);
  for (int t = 0; t < num_threads(); ++t) {
    task_ns_[t].ns.store(0, std::memory_order_relaxed);
    task_ns_[t].tasks.store(0, std::memory_order_relaxed);
    task_ns_[t].taken_over.store(0, std::memory_order_relaxed);
  }
  counting_.store(on, std::memory_order_relaxed);
  pthread_mutex_unlock(&run_mu_);
  return true;
}

void ThreadPool::run_range(TaskFn fn, void* ctx, int64_t first, int64_t end, int thread,
                           bool taken_over) {
  const bool timed = counting_.load(std::memory_order_relaxed);
  const uint64_t t0 = timed ? platform_now_ns() : 0;
  for (int64_t task = first; task < end; ++task) fn(ctx, task, thread);
  if (!timed) return;
  TaskNs& mine = task_ns_[thread];
  mine.ns.fetch_add(platform_now_ns() - t0, std::memory_order_relaxed);
  mine.tasks.fetch_add(uint64_t(end - first), std::memory_order_relaxed);
  if (taken_over) mine.taken_over.fetch_add(uint64_t(end - first), std::memory_order_relaxed);
}

void ThreadPool::run(int64_t n, TaskFn fn, void* ctx) {
  if (n <= 0) return;
  if (counting_.load(std::memory_order_relaxed)) loops_.fetch_add(1, std::memory_order_relaxed);
  if (num_workers_ == 0 || n == 1 || n > kMaxTasks) {
    run_range(fn, ctx, 0, n, 0, false);
    return;
  }
  pthread_mutex_lock(&run_mu_);
  const int threads = num_workers_ + 1;
  // Each share's loop slot of this generation's parity, then its word (release): a thread
  // that reads the word finds the loop written. The previous loop's slot stays as it was for
  // a thread still looking at that loop's (all claimed) words.
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  done_.store(0, std::memory_order_relaxed);
  for (int t = 0; t < threads; ++t) {
    Loop& loop = shares_[t].loops[generation & 1];
    loop.fn.store(fn, std::memory_order_relaxed);
    loop.ctx.store(ctx, std::memory_order_relaxed);
    loop.n.store(n, std::memory_order_relaxed);
    shares_[t].next.store((uint64_t(generation) << 32) | uint64_t(share_begin(n, t, threads)),
                          std::memory_order_release);
  }
  pthread_mutex_lock(&mu_);
  generation_.store(generation, std::memory_order_release);  // wakes the workers
  pthread_cond_broadcast(&work_cv_);
  pthread_mutex_unlock(&mu_);
  run_tasks(generation, 0);
  for (int spin = 0; done_.load(std::memory_order_acquire) != n && spin < kSpins; ++spin)
    cpu_relax();
  if (done_.load(std::memory_order_acquire) != n) {
    pthread_mutex_lock(&mu_);
    while (done_.load(std::memory_order_acquire) != n) pthread_cond_wait(&done_cv_, &mu_);
    pthread_mutex_unlock(&mu_);
  }
  pthread_mutex_unlock(&run_mu_);
}

void* ThreadPool::worker_main(void* arg) {
  Worker& w = *static_cast<Worker*>(arg);
  ThreadPool& pool = *w.pool;
  // A new loop shows first in the worker's own share.
  const std::atomic<uint64_t>& mine = pool.shares_[w.thread].next;
  uint32_t seen = 0;
  for (;;) {
    bool woke = false;
    for (int spin = 0; spin < kSpins && !woke; ++spin) {
      woke = generation_of(mine.load(std::memory_order_acquire)) != seen ||
             pool.stop_.load(std::memory_order_relaxed);
      if (!woke) cpu_relax();
    }
    if (!woke) {  // sleep until run() or the destructor says otherwise
      pthread_mutex_lock(&pool.mu_);
      while (pool.generation_.load(std::memory_order_acquire) == seen &&
             !pool.stop_.load(std::memory_order_relaxed))
        pthread_cond_wait(&pool.work_cv_, &pool.mu_);
      pthread_mutex_unlock(&pool.mu_);
    }
    if (pool.stop_.load()) return nullptr;
    seen = generation_of(mine.load(std::memory_order_acquire));
    pool.run_tasks(seen, w.thread);
  }
}

std::unique_ptr<Parallel> make_thread_pool(int threads) {
  if (threads <= 1) return nullptr;
  if (Parallel* shared = create_backend_parallel(threads))
    return std::unique_ptr<Parallel>(shared);
  return std::make_unique<ThreadPool>(threads);
}

}  // namespace etb
