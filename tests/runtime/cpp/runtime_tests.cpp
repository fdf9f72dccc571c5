// Drives the runtime from C++ for tests/runtime/test_cpp.py:
//   etb_runtime_tests MODE PROGRAM [INPUT VALUES...]
// Modes: run (file loader), buffer (buffer loader), nokernels (no kernel registered),
// unavailable (the test backend reports itself unavailable), nobackend (none registered),
// poisoned:N (N threads whose own memory is filled with garbage before every loop, and
// which are dealt every loop's tasks in turn: each one runs some).
// Prints "output i: v0 v1 ..." per output, or "error: <message>" and exits 1.
//   etb_runtime_tests handoffs:N LOOPS
// runs LOOPS loops on a ThreadPool of N threads, timed so that the threads hand work over
// while spinning and while asleep; prints "handoffs: ok ..." or "error: ..." and exits 1.
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "executor/data_loader.h"
#include "executor/method.h"
#include "executor/program.h"
#include "platform/thread_pool.h"
#include "register_kernels.h"

namespace {

// A test delegate: out = in * scale; scale comes from the compile spec "scale" (a float), the
// processed blob must be "ETBTEST".
class ScaleBackend final : public etb::Backend {
 public:
  explicit ScaleBackend(bool available) : available_(available) {}
  bool is_available() const override { return available_; }
  etb::Result<void*> init(etb::BackendInitContext& ctx, etb::Span<const uint8_t> processed,
                          etb::Span<const etb::CompileSpec> specs) const override {
    if (processed.size() != 7 || memcmp(processed.data(), "ETBTEST", 7) != 0)
      return etb::fail(etb::Error::DelegateFailed, "ScaleBackend: bad processed blob");
    float* scale = ctx.allocator->allocate_array<float>(1);
    if (scale == nullptr) return etb::Error::MemoryAllocationFailed;
    *scale = 1.f;
    for (const etb::CompileSpec& s : specs)
      if (s.key_size == 5 && memcmp(s.key, "scale", 5) == 0 && s.value_size == 4)
        memcpy(scale, s.value, 4);
    ++inits;
    return static_cast<void*>(scale);
  }
  etb::Error execute(etb::BackendExecuteContext&, void* handle,
                     etb::Span<etb::EValue*> args) const override {
    if (args.size() != 2 || !args[0]->is_tensor() || !args[1]->is_tensor())
      return etb::fail(etb::Error::DelegateFailed, "ScaleBackend: takes (Tensor in, Tensor out)");
    const etb::Tensor& in = args[0]->to_tensor();
    etb::Tensor& out = args[1]->to_tensor();
    ETB_TRY(out.resize(in.sizes()));
    const float s = *static_cast<float*>(handle);
    for (int64_t i = 0; i < in.numel(); ++i) out.data_as<float>()[i] = in.data_as<float>()[i] * s;
    return etb::Error::Ok;
  }
  void destroy(void*) const override { ++destroys; }
  mutable int inits = 0;
  mutable int destroys = 0;

 private:
  bool available_;
};

// A ThreadPool whose threads' own memory (Parallel::thread_memory) holds garbage at the start
// of every loop: a kernel that reads its scratch before writing it, or counts on what a loop
// before left there, gives other outputs than on one thread. It also deals each loop's tasks
// out, task i to the (i mod threads)-th of them, instead of letting the threads claim them:
// on a real pool the caller may run every task of a small loop before a worker wakes, so a
// kernel's work for thread 1 (a copy of its own, say) would go untested.
class PoisonedPool final : public etb::Parallel {
 public:
  explicit PoisonedPool(int threads) : tasks_by_thread(size_t(threads), 0), pool_(threads) {}
  int num_threads() const override { return pool_.num_threads(); }
  void run(int64_t n, etb::TaskFn fn, void* ctx) override {
    for (int t = 0; t < pool_.num_threads(); ++t)
      memset(pool_.thread_memory(t), 0xA5 + t, pool_.thread_memory_bytes());
    ++loops;
    Deal deal{fn, ctx, n, pool_.num_threads(), this};
    pool_.run(pool_.num_threads(), run_share, &deal);
  }
  char* thread_memory(int thread) const override { return pool_.thread_memory(thread); }
  size_t thread_memory_bytes() const override { return pool_.thread_memory_bytes(); }
  int loops = 0;
  std::vector<int64_t> tasks_by_thread;

 private:
  struct Deal {
    etb::TaskFn fn;
    void* ctx;
    int64_t n;
    int shares;
    PoisonedPool* pool;
    std::atomic<int> started{0};
  };
  // One share a thread: each waits until every share has a thread (so that no thread takes
  // two), then runs tasks share, share + shares, ...
  static void run_share(void* p, int64_t share, int thread) {
    Deal& d = *static_cast<Deal*>(p);
    d.started.fetch_add(1);
    while (d.started.load() < d.shares) {
    }
    for (int64_t i = share; i < d.n; i += d.shares) {
      d.fn(d.ctx, i, thread);
      ++d.pool->tasks_by_thread[size_t(thread)];  // each thread its own counter
    }
  }
  etb::ThreadPool pool_;
};

int error_exit(const char* what) {
  printf("error: %s: %s\n", what, etb::last_error_message());
  return 1;
}

void sleep_us(long us) {
  timespec t{us / 1000000, (us % 1000000) * 1000};
  nanosleep(&t, nullptr);
}

void spin_us(long us) {
  timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 < us);
}

// One loop of handoffs(): each task counts its runs and takes 10 us (so that the workers
// get some); a task that a worker runs may sleep, so that the caller runs out of tasks first
// and waits (spinning, or asleep).
struct HandoffLoop {
  std::atomic<int> runs[64];
  long worker_task_us;
};

// Loops of 1 to 64 tasks, after pauses of 0 to 2 ms (the workers are still spinning, or
// asleep) and with tasks on the workers of 0 to 2 ms (the caller spins, or sleeps): every
// task must run exactly once, and a wake-up lost on either side hangs the test.
int handoffs(int threads, int loops) {
  etb::ThreadPool pool(threads);
  unsigned seed = 12345;
  auto next = [&](unsigned range) {
    seed = seed * 1103515245u + 12345u;
    return (seed >> 8) % range;
  };
  HandoffLoop loop;
  int workers_ran = 0;
  for (int i = 0; i < loops; ++i) {
    const int64_t n = 1 + int64_t(next(64));
    for (std::atomic<int>& r : loop.runs) r.store(0);
    loop.worker_task_us = i % 2 ? long(next(2000)) : 0;
    sleep_us(i % 3 ? long(next(2000)) : 0);
    pool.run(
        n,
        [](void* ctx, int64_t task, int thread) {
          HandoffLoop& l = *static_cast<HandoffLoop*>(ctx);
          spin_us(10);
          if (thread != 0 && l.worker_task_us > 0) sleep_us(l.worker_task_us);
          l.runs[task].fetch_add(1 + (thread != 0 ? 1000 : 0));
        },
        &loop);
    for (int64_t t = 0; t < 64; ++t) {
      const int ran = loop.runs[t].load() % 1000;
      if (ran != (t < n ? 1 : 0)) {
        printf("error: loop %d: task %lld of %lld ran %d times\n", i, (long long)t, (long long)n,
               ran);
        return 1;
      }
      workers_ran += loop.runs[t].load() / 1000;
    }
  }
  printf("handoffs: ok threads=%d loops=%d tasks_on_workers=%d\n", pool.num_threads(), loops,
         workers_ran);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const char* mode = argv[1];
  if (strncmp(mode, "handoffs:", 9) == 0) return handoffs(atoi(mode + 9), atoi(argv[2]));
  static ScaleBackend available(true), unavailable(false);
  if (strcmp(mode, "nokernels") != 0 && etb::register_all_kernels() != etb::Error::Ok)
    return error_exit("register");
  const etb::Backend* backend = strcmp(mode, "unavailable") == 0 ? &unavailable : &available;
  if (strcmp(mode, "nobackend") != 0 &&
      etb::register_backend("EtbTestBackend", backend) != etb::Error::Ok)
    return error_exit("register backend");

  std::vector<uint8_t> file;  // for the buffer loader: the whole file, 16-byte aligned
  alignas(16) static uint8_t storage[1 << 20];
  etb::Result<etb::FileDataLoader> fl = etb::FileDataLoader::open(argv[2]);
  if (!fl.ok()) return error_exit("open");
  etb::BufferDataLoader bl(storage, 0);
  const etb::DataLoader* loader = &fl.value();
  if (strcmp(mode, "buffer") == 0) {
    size_t n = fl->size();
    if (n > sizeof(storage)) return 2;
    memcpy(storage, fl->load(0, n).value(), n);
    bl = etb::BufferDataLoader(storage, n);
    loader = &bl;
  }
  etb::Result<etb::Program> program = etb::Program::load(loader);
  if (!program.ok()) return error_exit("load");
  etb::Result<etb::MethodMeta> meta = program->method_meta("forward");
  if (!meta.ok()) return error_exit("meta");
  std::vector<std::vector<uint8_t>> bank_store;
  std::vector<etb::Span<uint8_t>> banks;
  alignas(64) static uint8_t bank_memory[1 << 22];
  size_t used = 0;
  for (size_t b = 0; b < meta->num_memory_banks(); ++b) {
    size_t n = size_t(meta->memory_bank_size(b).value());
    if (used + n > sizeof(bank_memory)) return 2;
    banks.emplace_back(bank_memory + used, n);
    used += (n + 63) / 64 * 64;
  }
  alignas(16) static uint8_t method_mem[1 << 16];
  alignas(64) static uint8_t temp_mem[1 << 22];
  etb::MemoryAllocator method_alloc(method_mem, sizeof(method_mem));
  etb::MemoryAllocator temp_alloc(temp_mem, sizeof(temp_mem));
  etb::MemoryManager mm;
  mm.method_allocator = &method_alloc;
  mm.banks = etb::Span<const etb::Span<uint8_t>>(banks.data(), banks.size());
  mm.temp_allocator = &temp_alloc;
  {
    etb::Result<etb::Method> method = program->load_method("forward", mm);
    if (!method.ok()) return error_exit("init");
    std::vector<float> input;
    for (int i = 3; i < argc; ++i) input.push_back(float(atof(argv[i])));
    etb::Result<etb::TensorInfo> info = meta->input_tensor_info(0);
    if (!info.ok()) return error_exit("input info");
    if (method->set_input(0, etb::ScalarType::Float,
                          etb::Span<const int64_t>(info->sizes, size_t(info->dim)), input.data(),
                          input.size() * sizeof(float)) != etb::Error::Ok)
      return error_exit("input");
    etb::ProfileEvent events[16];
    method->set_profiler(events, 16);
    std::unique_ptr<PoisonedPool> pool;
    if (strncmp(mode, "poisoned:", 9) == 0) {
      pool = std::make_unique<PoisonedPool>(atoi(mode + 9));
      method->set_parallel(pool.get());
    }
    if (method->execute() != etb::Error::Ok) return error_exit("execute");
    if (pool) {
      printf("threads: %d loops: %d tasks by thread:", pool->num_threads(), pool->loops);
      for (int64_t t : pool->tasks_by_thread) printf(" %lld", (long long)t);
      printf("\n");
    }
    for (size_t o = 0; o < method->num_outputs(); ++o) {
      const etb::Tensor& t = method->output(o).value()->to_tensor();
      printf("output %zu:", o);
      for (int64_t i = 0; i < t.numel(); ++i) printf(" %.9g", double(t.data_as<float>()[i]));
      printf("\n");
    }
    printf("profile:");
    for (const etb::ProfileEvent& e : method->profile()) printf(" %s", e.name);
    printf("\n");
  }
  printf("backend: inits=%d destroys=%d\n", available.inits, available.destroys);
  return 0;
}
