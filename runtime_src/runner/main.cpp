// etb_runner: load a program, read inputs from .etbt files, run N iterations, print output
// checksums, the kernels' SIMD path (kernel_isa) and latency percentiles. `etb_runner --isa`
// prints only the SIMD path.
//
// Input file format (.etbt, little-endian):
//   bytes 0..3   magic "ETBT"
//   u32          version (1)
//   u32          dtype: ScalarType code (6 = Float, 4 = Long, 3 = Int, 11 = Bool, ...)
//   u32          ndim
//   i64 x ndim   sizes
//   data         numel * element_size bytes, row-major (contiguous)
// runtime_src/runner/dump_inputs.py writes these files from a bundled reference.pt.
#include <dirent.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "executor/data_loader.h"
#include "executor/method.h"
#include "executor/program.h"
#include "kernels/portable/kernel_isa.h"
#include "platform/platform.h"
#include "platform/thread_pool.h"
#include "register_kernels.h"

namespace {

struct InputFile {
  etb::ScalarType dtype;
  std::vector<int64_t> sizes;
  std::vector<uint8_t> data;
};

// Reads a .etbt file, checking the header against the file's length before allocating.
bool read_etbt(const char* path, InputFile* out) {
  FILE* f = fopen(path, "rb");
  if (f == nullptr) {
    fprintf(stderr, "etb_runner: cannot open %s\n", path);
    return false;
  }
  const char* why = nullptr;
  char magic[4];
  uint32_t hdr[3];
  if (fread(magic, 1, 4, f) != 4 || memcmp(magic, "ETBT", 4) != 0 || fread(hdr, 4, 3, f) != 3)
    why = "no ETBT header";
  else if (hdr[0] != 1)
    why = "unknown version (expected 1)";
  else if (!etb::is_valid_scalar_type(int(hdr[1])))
    why = "unknown dtype code";
  else if (hdr[2] > uint32_t(etb::kMaxDim))
    why = "too many dims";
  uint64_t nbytes = 0;
  if (why == nullptr) {
    out->dtype = etb::ScalarType(hdr[1]);
    out->sizes.resize(hdr[2]);
    if (fread(out->sizes.data(), 8, hdr[2], f) != hdr[2]) why = "the sizes are cut short";
    nbytes = etb::element_size(out->dtype);
    for (int64_t s : out->sizes) {
      if (why != nullptr) break;
      if (s < 0) why = "a size is negative";
      else if (s != 0 && nbytes > UINT64_MAX / uint64_t(s)) why = "the sizes overflow";
      else nbytes *= uint64_t(s);
    }
  }
  if (why == nullptr) {  // the data must be exactly what the header says, before allocating
    const long here = ftell(f);
    if (here < 0 || fseek(f, 0, SEEK_END) != 0) {
      why = "cannot seek";
    } else {
      const long end = ftell(f);
      if (end < here || uint64_t(end - here) != nbytes || fseek(f, here, SEEK_SET) != 0)
        why = "the data length does not match the sizes in the header";
    }
  }
  if (why == nullptr) {
    out->data.resize(size_t(nbytes));
    if (fread(out->data.data(), 1, out->data.size(), f) != out->data.size())
      why = "the data cannot be read";
  }
  fclose(f);
  if (why != nullptr) fprintf(stderr, "etb_runner: %s is not a valid .etbt file: %s\n", path, why);
  return why == nullptr;
}

bool write_etbt(const char* path, const etb::Tensor& t) {
  FILE* f = fopen(path, "wb");
  if (f == nullptr) {
    fprintf(stderr, "etb_runner: cannot write %s\n", path);
    return false;
  }
  uint32_t hdr[3] = {1, uint32_t(t.dtype()), uint32_t(t.dim())};
  bool ok = fwrite("ETBT", 1, 4, f) == 4 && fwrite(hdr, 4, 3, f) == 3;
  for (int64_t s : t.sizes()) ok = ok && fwrite(&s, 8, 1, f) == 1;
  ok = ok && fwrite(t.data(), 1, t.nbytes(), f) == t.nbytes();
  ok = (fclose(f) == 0) && ok;
  if (!ok) fprintf(stderr, "etb_runner: cannot write %s\n", path);
  return ok;
}

struct FreeDeleter {
  void operator()(void* p) const { free(p); }
};
std::vector<std::unique_ptr<uint8_t, FreeDeleter>> g_buffers;  // freed at exit

// n bytes aligned to `align` (at least 64; a power of two).
void* aligned_buffer(size_t n, size_t align = 64) {
  if (align < 64) align = 64;
  g_buffers.emplace_back(static_cast<uint8_t*>(
      n > (size_t(1) << 46) ? nullptr : aligned_alloc(align, (n + align - 1) / align * align + align)));
  return g_buffers.back().get();
}

// The usage text; --help prints it to stdout (exit 0), a bad command line to stderr (exit 2).
int usage(FILE* to = stderr) {
  fprintf(
      to,
      "usage: etb_runner PROGRAM.pte [--input FILE.etbt]... [--iters N] [--warmup N]\n"
      "                  [--method NAME] [--profile] [--output-dir DIR] [--threads N]\n"
      "                  [--instruction-budget N] [--no-prepare] [--no-checksums]\n"
      "       etb_runner --isa\n"
      "--no-prepare leaves the weights as the program stores them (less memory; each call\n"
      "             then packs its own)\n"
      "--instruction-budget stops a run after N instructions (default: from the program)\n"
      "--no-checksums skips checking the program's content against its checksums\n"
      "--output-dir writes each tensor output as DIR/output_<i>.etbt\n"
      "--isa prints the kernels' SIMD path (avx512, avx2, sse2, neon or scalar)\n"
      "--profile prints each instruction's time in the last run and, with threads, the\n"
      "          pool's loops and each thread's ms in tasks, tasks, and tasks taken over\n"
      "          from another thread's share, per timed run\n"
      "Runs the method --iters times after --warmup runs and prints each memory bank (name,\n"
      "bytes, alignment), each output's sum and hash, the kernels' SIMD path, the thread\n"
      "count and the latency (median, p10, p90).\n"
      "A .etbt file is one tensor, little-endian: \"ETBT\", u32 version 1, u32 dtype (6 Float,\n"
      "4 Long, 3 Int, 1 Char, 11 Bool), u32 ndim, ndim x i64 sizes, row-major data. A build's\n"
      "reference inputs as .etbt: python -m etbuild.pipeline.etbt RUN/reference.pt DIR\n");
  return to == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return usage(stdout);
  if (!strcmp(argv[1], "--isa")) {  // the SIMD path the kernels were compiled for (ETB_ARCH)
    if (argc != 2) return usage();
    printf("%s\n", etb::kernel_isa());
    return 0;
  }
  const char* path = argv[1];
  const char* method_name = "forward";
  std::vector<const char*> input_paths;
  int iters = 10, warmup = 1, threads = 1;
  long long budget = 0;  // 0: the program's default
  bool profile = false, prepare = true, checksums = true;
  const char* output_dir = nullptr;
  for (int i = 2; i < argc; ++i) {
    if (!strcmp(argv[i], "--input") && i + 1 < argc) input_paths.push_back(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--method") && i + 1 < argc) method_name = argv[++i];
    else if (!strcmp(argv[i], "--profile")) profile = true;
    else if (!strcmp(argv[i], "--no-prepare")) prepare = false;
    else if (!strcmp(argv[i], "--no-checksums")) checksums = false;
    else if (!strcmp(argv[i], "--output-dir") && i + 1 < argc) output_dir = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--instruction-budget") && i + 1 < argc) budget = atoll(argv[++i]);
    else return usage();
  }
  if (budget < 0) {
    fprintf(stderr, "etb_runner: --instruction-budget must be >= 1 (0: the program's default)\n");
    return 2;
  }
  if (threads < 1 || threads > etb::ThreadPool::kMaxThreads) {
    fprintf(stderr, "etb_runner: --threads must be 1 to %d\n", etb::ThreadPool::kMaxThreads);
    return 2;
  }
  if (iters < 1) iters = 1;
  if (etb::register_all_kernels() != etb::Error::Ok) return 1;
  auto die = [](const char* what) {
    fprintf(stderr, "etb_runner: %s: %s\n", what, etb::last_error_message());
    return 1;
  };
  etb::Result<etb::FileDataLoader> loader = etb::FileDataLoader::open(path);
  if (!loader.ok()) return die("open");
  etb::Result<etb::Program> program = etb::Program::load(&loader.value(), checksums);
  if (!program.ok()) return die("load");
  etb::Result<etb::MethodMeta> meta = program->method_meta(method_name);
  if (!meta.ok()) return die("method");

  std::vector<etb::Span<uint8_t>> banks;
  for (size_t b = 0; b < meta->num_memory_banks(); ++b) {
    etb::Result<int64_t> n = meta->memory_bank_size(b);
    etb::Result<const char*> bank = meta->memory_bank_name(b);
    etb::Result<size_t> align = meta->memory_bank_alignment(b);
    if (!n.ok() || !bank.ok() || !align.ok()) return die("memory plan");
    void* p = aligned_buffer(size_t(n.value()), align.value());
    if (p == nullptr) {
      fprintf(stderr, "etb_runner: cannot allocate %lld bytes for memory bank '%s'\n",
              (long long)n.value(), bank.value());
      return 1;
    }
    banks.emplace_back(static_cast<uint8_t*>(p), size_t(n.value()));
  }
  const etb::ScratchRegion scratch = meta->scratch_region();
  const size_t method_bytes = meta->method_allocator_bytes();
  const size_t temp_bytes = 8u << 20;
  void* method_buf = aligned_buffer(method_bytes);
  void* temp_buf = aligned_buffer(temp_bytes);
  if (method_buf == nullptr || temp_buf == nullptr) {
    fprintf(stderr, "etb_runner: out of memory\n");
    return 1;
  }
  etb::MemoryAllocator method_alloc(method_buf, method_bytes);
  etb::MemoryAllocator temp_alloc(temp_buf, temp_bytes);
  etb::MemoryManager mm;
  mm.method_allocator = &method_alloc;
  mm.banks = etb::Span<const etb::Span<uint8_t>>(banks.data(), banks.size());
  // A plan that reserves the kernels' scratch region: the method takes it from its bank.
  mm.temp_allocator = scratch.size > 0 ? nullptr : &temp_alloc;
  etb::Result<etb::Method> method = program->load_method(method_name, mm);
  if (!method.ok()) return die("init");
  // The memory the method runs in, once it is loaded (a program refused at load prints
  // nothing on stdout).
  for (size_t b = 0; b < banks.size(); ++b) {
    printf("memory_bank: %s %zu bytes, aligned %zu\n", meta->memory_bank_name(b).value(),
           banks[b].size(), meta->memory_bank_alignment(b).value());
  }
  if (scratch.size > 0)
    printf("scratch: %zu bytes at offset %zu of bank '%s'\n", scratch.size, scratch.offset,
           meta->memory_bank_name(scratch.bank).value());
  method->set_instruction_budget(uint64_t(budget));
  // Weights packed for the kernels once, here, rather than in every call.
  const size_t prepared_bytes = prepare ? method->prepared_bytes() : 0;
  if (prepared_bytes > 0) {
    void* p = aligned_buffer(prepared_bytes);
    if (p == nullptr) {
      fprintf(stderr, "etb_runner: out of memory for %zu bytes of prepared weights\n",
              prepared_bytes);
      return 1;
    }
    if (method->prepare(etb::Span<uint8_t>(static_cast<uint8_t*>(p), prepared_bytes)) !=
        etb::Error::Ok)
      return die("prepare");
  }
  std::unique_ptr<etb::Parallel> pool = etb::make_thread_pool(threads);
  if (pool) method->set_parallel(pool.get());

  if (input_paths.size() != method->num_inputs()) {
    fprintf(stderr, "etb_runner: method '%s' takes %zu inputs, %zu given\n", method_name,
            method->num_inputs(), input_paths.size());
    return 1;
  }
  std::vector<InputFile> inputs(input_paths.size());
  for (size_t i = 0; i < input_paths.size(); ++i)
    if (!read_etbt(input_paths[i], &inputs[i])) return 1;

  std::vector<etb::ProfileEvent> events(profile ? meta->num_instructions() + 1 : 0);
  if (profile) method->set_profiler(events.data(), events.size());
  std::vector<double> times;
  // With --profile, the pool counts its loops and each thread's time in tasks, its tasks and
  // those it took over from another's share, over the timed runs (when it counts them: a
  // delegate's pool may not).
  bool task_time = false;
  for (int it = 0; it < warmup + iters; ++it) {
    if (it == warmup && profile && pool) task_time = pool->count_task_time(true);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const InputFile& in = inputs[i];
      if (method->set_input(i, in.dtype,
                            etb::Span<const int64_t>(in.sizes.data(), in.sizes.size()),
                            in.data.data(), in.data.size()) != etb::Error::Ok)
        return die("input");
    }
    uint64_t t0 = etb::platform_now_ns();
    if (method->execute() != etb::Error::Ok) return die("execute");
    uint64_t t1 = etb::platform_now_ns();
    if (it >= warmup) times.push_back(double(t1 - t0) / 1e6);
  }
  for (size_t o = 0; o < method->num_outputs(); ++o) {
    const etb::EValue* v = method->output(o).value();
    if (!v->is_tensor()) {
      printf("output %zu: %s\n", o, etb::tag_name(v->tag()));
      continue;
    }
    const etb::Tensor& t = v->to_tensor();
    char sz[160];
    double sum = 0, asum = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double x = t.dtype() == etb::ScalarType::Float  ? double(t.data_as<float>()[i])
                 : t.dtype() == etb::ScalarType::Long ? double(t.data_as<int64_t>()[i])
                 : t.dtype() == etb::ScalarType::Int  ? double(t.data_as<int32_t>()[i])
                                                      : 0.0;
      sum += x;
      asum += x < 0 ? -x : x;
    }
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the bytes
    const uint8_t* p = static_cast<const uint8_t*>(t.data());
    for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
    printf("output %zu: %s %s sum=%.6g abs_sum=%.6g fnv1a=%016" PRIx64 "\n", o,
           etb::scalar_type_name(t.dtype()), etb::format_sizes(t.sizes(), sz, sizeof(sz)), sum,
           asum, h);
    if (output_dir != nullptr) {
      char out_path[4096];
      snprintf(out_path, sizeof(out_path), "%s/output_%zu.etbt", output_dir, o);
      if (!write_etbt(out_path, t)) return 1;
    }
  }
  std::sort(times.begin(), times.end());
  auto pct = [&](double q) { return times[size_t(q * double(times.size() - 1) + 0.5)]; };
  printf("kernel_isa: %s\n", etb::kernel_isa());
  printf("threads: %d\n", pool ? pool->num_threads() : 1);
  // Every thread the process runs (Linux): the kernels' and a delegate's work share one pool,
  // so at --threads N this is N, not N plus a delegate's own workers.
  if (DIR* tasks = opendir("/proc/self/task")) {
    int n = 0;
    while (const dirent* e = readdir(tasks)) n += e->d_name[0] != '.';
    closedir(tasks);
    printf("process_threads: %d\n", n);
  }
  printf("prepared_bytes: %zu\n", prepared_bytes);
  printf("scratch_peak: %zu\n", method->scratch_peak());
  printf("latency_ms: median=%.3f p10=%.3f p90=%.3f iters=%zu\n", pct(0.5), pct(0.1), pct(0.9),
         times.size());
  if (task_time && !times.empty()) {
    const double runs = double(times.size());
    printf("task_time: loops_per_run=%.1f ms_per_run=", double(pool->counted_loops()) / runs);
    for (int t = 0; t < pool->num_threads(); ++t)
      printf("%s%.3f", t ? "," : "", double(pool->counted_task_ns(t)) / 1e6 / runs);
    printf(" tasks_per_run=");
    for (int t = 0; t < pool->num_threads(); ++t)
      printf("%s%.1f", t ? "," : "", double(pool->counted_tasks(t)) / runs);
    printf(" taken_over_per_run=");
    for (int t = 0; t < pool->num_threads(); ++t)
      printf("%s%.1f", t ? "," : "", double(pool->counted_taken_over(t)) / runs);
    printf("\n");
  }
  if (profile) {
    for (const etb::ProfileEvent& e : method->profile())
      printf("profile: %-32s %10.3f us\n", e.name, double(e.duration_ns) / 1e3);
  }
  return 0;
}
