// etbuild.runtime: Python bindings (nanobind) over the etbuild runtime.
//
//   prog = etbuild.runtime.load("model.pte", threads=1)
//   prog.method_names            -> ["forward"]
//   prog.run([x], method="forward", profile=False) -> [torch.Tensor, ...]
//   prog.last_profile            -> [(op name, seconds), ...] of the last profiled run
//   prog.method_meta("forward")  -> dict: inputs, outputs, memory_banks, instructions, ...
//   prog.init_method("forward", bank_sizes=[...])  (re)initializes with given bank sizes
//   etbuild.runtime.kernel_isa() -> "avx512" | "avx2" | "sse2" | "neon" | "scalar"
// Errors raise etbuild.runtime.Error (a RuntimeError) with the runtime's message.
// A program runs one call at a time: run() from several threads takes turns (the calls
// share the method's planned memory), and init_method() during a run is refused.
// Ctrl-C interrupts run() between instructions: called from the main thread, run() executes
// on a helper thread and checks for signals meanwhile, and cancels the run when a handler
// raises (KeyboardInterrupt).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "executor/data_loader.h"
#include "executor/method.h"
#include "executor/program.h"
#include "kernels/portable/kernel_isa.h"
#include "platform/thread_pool.h"
#include "register_kernels.h"

namespace nb = nanobind;

namespace {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Program strings may hold any bytes; keep printable ASCII so Python can decode them.
std::string printable(const char* s) {
  std::string out(s);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  return out;
}

[[noreturn]] void raise(etb::Error e) {
  std::string msg = printable(etb::last_error_message());
  if (msg.empty()) msg = etb::error_name(e);
  throw Error(msg);
}

// How often a run started from the main thread looks for signals (Ctrl-C).
constexpr auto kSignalPoll = std::chrono::milliseconds(20);

// The thread that runs a program's methods for calls made on the main thread, which in the
// meantime, with the GIL released between checks, runs Python's signal handlers every
// kSignalPoll; when one raises, the run is cancelled at its next instruction and the
// handler's exception propagates. One thread for the program's lifetime: starting a thread
// per call cost about 85 us, more than a small model's whole run. Both sides spin for up to
// kHandoffSpin before they sleep (back-to-back calls, and short runs, skip the futex wake).
class RunThread {
 public:
  ~RunThread() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Called with the GIL held; returns the run's error (its message copied to this thread's).
  etb::Error execute_interruptible(etb::Method& m) {
    std::atomic<bool> cancel{false};
    m.set_cancel_flag(&cancel);
    bool interrupted = false;
    {
      nb::gil_scoped_release release;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
        done_.store(false);
        job_.store(&m);
      }
      cv_.notify_all();
      spin_until([&] { return done_.load(std::memory_order_acquire); });
      std::unique_lock<std::mutex> lock(mu_);
      while (!done_.load()) {
        if (cv_.wait_for(lock, kSignalPoll, [&] { return done_.load(); })) break;
        if (interrupted) continue;  // cancelled: wait for the run to stop
        lock.unlock();
        {
          nb::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) {  // a handler raised: keep its exception pending
            interrupted = true;
            cancel.store(true);
          }
        }
        lock.lock();
      }
    }
    m.set_cancel_flag(nullptr);
    if (interrupted) throw nb::python_error();
    if (result_ != etb::Error::Ok) (void)etb::fail(result_, "%s", message_.c_str());
    return result_;
  }

 private:
  static constexpr auto kHandoffSpin = std::chrono::microseconds(50);

  template <class Ready>
  static void spin_until(Ready ready) {
    const auto until = std::chrono::steady_clock::now() + kHandoffSpin;
    while (!ready() && std::chrono::steady_clock::now() < until) {
    }
  }

  void serve() {
    for (;;) {
      spin_until([&] { return job_.load(std::memory_order_acquire) != nullptr; });
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || job_.load() != nullptr; });
        if (stop_) return;
      }
      etb::Method* m = job_.exchange(nullptr);
      etb::clear_error_message();
      result_ = m->execute();
      message_ = result_ != etb::Error::Ok ? etb::last_error_message() : "";
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.store(true);
      }
      cv_.notify_all();
    }
  }

  std::mutex mu_;  // guards sleeping and waking
  std::condition_variable cv_;
  std::atomic<etb::Method*> job_{nullptr};  // the method to run next
  std::atomic<bool> done_{false};           // the last job finished: result_, message_ are set
  bool stop_ = false;
  etb::Error result_ = etb::Error::Ok;
  std::string message_;
  std::thread thread_;
};

bool on_main_thread() {
  static const unsigned long main_ident = PyThread_get_thread_ident();  // at module import
  return PyThread_get_thread_ident() == main_ident;
}

void check(etb::Error e) {
  if (e != etb::Error::Ok) raise(e);
}

struct FreeDeleter {
  void operator()(void* p) const { free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

// n bytes aligned to `align` (at least 64; a power of two).
Buffer aligned_buffer(size_t n, size_t align = 64) {
  if (align < 64) align = 64;
  size_t rounded = (n + align - 1) / align * align + align;
  uint8_t* p =
      n > (size_t(1) << 46) ? nullptr : static_cast<uint8_t*>(aligned_alloc(align, rounded));
  if (p == nullptr) throw Error("cannot allocate " + std::to_string(n) + " bytes");
  return Buffer(p);
}

struct MethodState {
  std::vector<Buffer> bank_buffers;
  std::vector<etb::Span<uint8_t>> banks;
  Buffer method_buffer;
  etb::MemoryAllocator method_alloc;
  Buffer temp_buffer;
  etb::MemoryAllocator temp_alloc;
  etb::MemoryManager memory;
  Buffer prepared_buffer;  // the weights the kernels packed at load (Method::prepare)
  std::optional<etb::Method> method;
  size_t num_instructions = 0;
};

etb::ScalarType dtype_from_dlpack(nb::dlpack::dtype t, int index) {
  using C = nb::dlpack::dtype_code;
  const auto code = C(t.code);
  if (t.lanes == 1) {
    if (code == C::Float && t.bits == 32) return etb::ScalarType::Float;
    if (code == C::Float && t.bits == 64) return etb::ScalarType::Double;
    if (code == C::Float && t.bits == 16) return etb::ScalarType::Half;
    if (code == C::Bfloat && t.bits == 16) return etb::ScalarType::BFloat16;
    if (code == C::Int && t.bits == 64) return etb::ScalarType::Long;
    if (code == C::Int && t.bits == 32) return etb::ScalarType::Int;
    if (code == C::Int && t.bits == 16) return etb::ScalarType::Short;
    if (code == C::Int && t.bits == 8) return etb::ScalarType::Char;
    if (code == C::UInt && t.bits == 8) return etb::ScalarType::Byte;
    if (code == C::Bool && t.bits == 8) return etb::ScalarType::Bool;
  }
  throw Error("input " + std::to_string(index) + ": unsupported tensor dtype");
}

nb::dlpack::dtype dlpack_from_dtype(etb::ScalarType t) {
  switch (t) {
    case etb::ScalarType::Float: return nb::dtype<float>();
    case etb::ScalarType::Double: return nb::dtype<double>();
    case etb::ScalarType::Long: return nb::dtype<int64_t>();
    case etb::ScalarType::Int: return nb::dtype<int32_t>();
    case etb::ScalarType::Short: return nb::dtype<int16_t>();
    case etb::ScalarType::Char: return nb::dtype<int8_t>();
    case etb::ScalarType::Byte: return nb::dtype<uint8_t>();
    case etb::ScalarType::Bool: return nb::dtype<bool>();
    default: throw Error(std::string("output dtype ") + etb::scalar_type_name(t) +
                         " cannot be returned");
  }
}

nb::dict tensor_info_dict(const etb::TensorInfo& info) {
  nb::dict d;
  d["dtype"] = etb::scalar_type_name(info.dtype);
  std::vector<int64_t> sizes(info.sizes, info.sizes + info.dim);
  d["sizes"] = sizes;
  d["dynamic"] = info.dynamism != etb::ShapeDynamism::Static;
  return d;
}

class PyProgram {
 public:
  PyProgram(const std::string& path, int threads, int64_t instruction_budget, bool prepare)
      : budget_(uint64_t(instruction_budget)), prepare_(prepare) {
    if (threads < 1) throw Error("threads must be >= 1, got " + std::to_string(threads));
    if (instruction_budget < 0)
      throw Error("instruction_budget must be >= 1 (0: the program's default), got " +
                  std::to_string(instruction_budget));
    if (threads > etb::ThreadPool::kMaxThreads)
      throw Error("threads must be <= " + std::to_string(etb::ThreadPool::kMaxThreads) +
                  ", got " + std::to_string(threads));
    if (path.find('\0') != std::string::npos)
      throw Error("the program path contains a NUL character");
    etb::clear_error_message();
    etb::Result<etb::FileDataLoader> loader = etb::FileDataLoader::open(path.c_str());
    if (!loader.ok()) raise(loader.error());
    loader_ = std::make_unique<etb::FileDataLoader>(std::move(loader.value()));
    etb::Result<etb::Program> program = etb::Program::load(loader_.get());
    if (!program.ok()) raise(program.error());
    program_.emplace(std::move(program.value()));
    pool_ = etb::make_thread_pool(threads);
  }

  int num_threads() const { return pool_ ? pool_->num_threads() : 1; }

  std::vector<std::string> method_names() const {
    std::vector<std::string> names;
    for (size_t i = 0; i < program_->num_methods(); ++i) {
      etb::Result<const char*> n = program_->method_name(i);
      if (!n.ok()) raise(n.error());
      names.emplace_back(printable(n.value()));
    }
    return names;
  }

  nb::dict method_meta(const std::string& name) const {
    etb::Result<etb::MethodMeta> meta = program_->method_meta(name.c_str());
    if (!meta.ok()) raise(meta.error());
    nb::dict d;
    nb::list inputs, outputs;
    for (size_t i = 0; i < meta->num_inputs(); ++i) {
      etb::Result<etb::TensorInfo> info = meta->input_tensor_info(i);
      if (info.ok()) inputs.append(tensor_info_dict(info.value()));
      else inputs.append(nb::none());
    }
    for (size_t i = 0; i < meta->num_outputs(); ++i) {
      etb::Result<etb::TensorInfo> info = meta->output_tensor_info(i);
      if (info.ok()) outputs.append(tensor_info_dict(info.value()));
      else outputs.append(nb::none());
    }
    std::vector<int64_t> banks;
    std::vector<std::string> bank_names;
    std::vector<size_t> bank_alignments;
    for (size_t b = 0; b < meta->num_memory_banks(); ++b) {
      etb::Result<int64_t> n = meta->memory_bank_size(b);
      if (!n.ok()) raise(n.error());
      banks.push_back(n.value());
      etb::Result<const char*> bank_name = meta->memory_bank_name(b);
      if (!bank_name.ok()) raise(bank_name.error());
      bank_names.emplace_back(bank_name.value());
      etb::Result<size_t> align = meta->memory_bank_alignment(b);
      if (!align.ok()) raise(align.error());
      bank_alignments.push_back(align.value());
    }
    d["inputs"] = inputs;
    d["outputs"] = outputs;
    d["memory_banks"] = banks;
    d["memory_bank_names"] = bank_names;
    d["memory_bank_alignments"] = bank_alignments;
    d["memory_bank_table"] = meta->has_memory_bank_table();
    const etb::ScratchRegion scratch = meta->scratch_region();
    if (scratch.size > 0) {
      nb::dict sc;
      sc["bank"] = scratch.bank;
      sc["offset"] = scratch.offset;
      sc["size"] = scratch.size;
      d["scratch"] = sc;
    } else {
      d["scratch"] = nb::none();
    }
    d["instructions"] = meta->num_instructions();
    d["method_allocator_bytes"] = meta->method_allocator_bytes();
    return d;
  }

  void init_method(const std::string& name, std::optional<std::vector<int64_t>> bank_sizes,
                   size_t temp_bytes) {
    std::unique_lock<std::mutex> lock(run_mu_, std::try_to_lock);
    if (!lock.owns_lock())
      throw Error("cannot initialise method '" + name +
                  "' while another thread runs this program; wait for the run to return");
    init_method_locked(name, bank_sizes, temp_bytes);
  }

  nb::list run(nb::list inputs, const std::string& name, bool profile) {
    // One run at a time: the method's planned memory holds one call's inputs and values.
    std::unique_lock<std::mutex> lock = lock_runs();
    return run_locked(inputs, name, profile);
  }

  std::vector<std::pair<std::string, double>> last_profile() const { return last_profile_; }

  size_t prepared_bytes(const std::string& name) {
    std::unique_lock<std::mutex> lock = lock_runs();
    if (methods_.find(name) == methods_.end()) init_method_locked(name, std::nullopt, 8u << 20);
    const MethodState& st = *methods_[name];
    return st.prepared_buffer ? st.method->prepared_bytes() : 0;
  }

 private:
  // Takes the run lock, waiting without the GIL so that a running thread (which releases the
  // GIL while it executes) can take the GIL back and finish.
  std::unique_lock<std::mutex> lock_runs() {
    std::unique_lock<std::mutex> lock(run_mu_, std::defer_lock);
    nb::gil_scoped_release release;
    lock.lock();
    return lock;
  }

  void init_method_locked(const std::string& name,
                          std::optional<std::vector<int64_t>> bank_sizes, size_t temp_bytes) {
    methods_.erase(name);
    etb::clear_error_message();
    etb::Result<etb::MethodMeta> meta = program_->method_meta(name.c_str());
    if (!meta.ok()) raise(meta.error());
    auto st = std::make_unique<MethodState>();
    size_t nbanks = meta->num_memory_banks();
    std::vector<int64_t> sizes;
    if (bank_sizes) {
      sizes = *bank_sizes;
    } else {
      for (size_t b = 0; b < nbanks; ++b) {
        etb::Result<int64_t> n = meta->memory_bank_size(b);
        if (!n.ok()) raise(n.error());
        sizes.push_back(n.value());
      }
    }
    for (size_t b = 0; b < sizes.size(); ++b) {
      const int64_t n = sizes[b];
      if (n < 0) throw Error("bank sizes must be >= 0");
      etb::Result<size_t> align = b < nbanks ? meta->memory_bank_alignment(b) : size_t(64);
      if (!align.ok()) raise(align.error());
      st->bank_buffers.push_back(aligned_buffer(size_t(n), align.value()));
      st->banks.emplace_back(st->bank_buffers.back().get(), size_t(n));
    }
    size_t mbytes = meta->method_allocator_bytes();
    st->method_buffer = aligned_buffer(mbytes);
    st->method_alloc = etb::MemoryAllocator(st->method_buffer.get(), mbytes);
    st->temp_buffer = aligned_buffer(temp_bytes);
    st->temp_alloc = etb::MemoryAllocator(st->temp_buffer.get(), temp_bytes);
    st->memory.method_allocator = &st->method_alloc;
    st->memory.banks = etb::Span<const etb::Span<uint8_t>>(st->banks.data(), st->banks.size());
    // A plan that reserves the kernels' scratch region: the method takes it from its bank.
    st->memory.temp_allocator = meta->scratch_region().size > 0 ? nullptr : &st->temp_alloc;
    st->num_instructions = meta->num_instructions();
    etb::Result<etb::Method> m = program_->load_method(name.c_str(), st->memory);
    if (!m.ok()) raise(m.error());
    st->method.emplace(std::move(m.value()));
    const size_t prepared = st->method->prepared_bytes();
    if (prepare_ && prepared > 0) {
      st->prepared_buffer = aligned_buffer(prepared);
      etb::Error e = st->method->prepare(etb::Span<uint8_t>(st->prepared_buffer.get(), prepared));
      if (e != etb::Error::Ok) raise(e);
    }
    st->method->set_parallel(pool_.get());
    st->method->set_instruction_budget(budget_);
    methods_[name] = std::move(st);
  }

  nb::list run_locked(nb::list inputs, const std::string& name, bool profile) {
    if (methods_.find(name) == methods_.end()) init_method_locked(name, std::nullopt, 8u << 20);
    MethodState& st = *methods_[name];
    etb::Method& m = *st.method;
    etb::clear_error_message();
    if (inputs.size() != m.num_inputs())
      throw Error("method '" + name + "' takes " + std::to_string(m.num_inputs()) +
                  " inputs, got " + std::to_string(inputs.size()));
    // Keep contiguous copies alive until execute() returns (unplanned inputs reference them).
    std::vector<nb::object> keep;
    for (size_t i = 0; i < inputs.size(); ++i) {
      nb::handle h = inputs[i];
      if (nb::isinstance<nb::bool_>(h)) {
        check(m.set_input_scalar(i, etb::EValue(nb::cast<bool>(h))));
        continue;
      }
      if (nb::isinstance<nb::int_>(h)) {
        check(m.set_input_scalar(i, etb::EValue(nb::cast<int64_t>(h))));
        continue;
      }
      if (nb::isinstance<nb::float_>(h)) {
        check(m.set_input_scalar(i, etb::EValue(nb::cast<double>(h))));
        continue;
      }
      nb::object obj = nb::borrow(h);
      if (nb::hasattr(obj, "detach")) obj = obj.attr("detach")();
      if (nb::hasattr(obj, "contiguous")) obj = obj.attr("contiguous")();
      nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu> arr;
      if (!nb::try_cast(obj, arr))
        throw Error("input " + std::to_string(i) + ": expected a CPU tensor, got " +
                    std::string(nb::type_name(obj.type()).c_str()));
      keep.push_back(obj);
      etb::ScalarType dtype = dtype_from_dlpack(arr.dtype(), int(i));
      std::vector<int64_t> sizes(arr.ndim());
      for (size_t d = 0; d < arr.ndim(); ++d) sizes[d] = int64_t(arr.shape(d));
      check(m.set_input(i, dtype, etb::Span<const int64_t>(sizes.data(), sizes.size()),
                        arr.data(), arr.nbytes()));
    }
    std::vector<etb::ProfileEvent> events;
    // The method must not keep pointing at `events` however this call ends (an interrupt).
    struct ProfilerOff {
      etb::Method& m;
      ~ProfilerOff() { m.set_profiler(nullptr, 0); }
    } profiler_off{m};
    if (profile) {
      events.resize(st.num_instructions + 1);
      m.set_profiler(events.data(), events.size());
    }
    etb::Error e;
    if (on_main_thread()) {
      e = run_thread_.execute_interruptible(m);
    } else {  // only the main thread runs signal handlers
      nb::gil_scoped_release release;
      e = m.execute();
    }
    if (profile) {
      last_profile_.clear();
      for (const etb::ProfileEvent& ev : m.profile())
        last_profile_.emplace_back(printable(ev.name ? ev.name : "?"),
                                   double(ev.duration_ns) * 1e-9);
      m.set_profiler(nullptr, 0);
    }
    check(e);
    nb::module_ torch = nb::module_::import_("torch");
    nb::list outs;
    for (size_t o = 0; o < m.num_outputs(); ++o) {
      etb::Result<const etb::EValue*> r = m.output(o);
      if (!r.ok()) raise(r.error());
      const etb::EValue& v = *r.value();
      if (v.is_int()) { outs.append(nb::int_(v.to_int())); continue; }
      if (v.is_double()) { outs.append(nb::float_(v.to_double())); continue; }
      if (v.is_bool()) { outs.append(nb::bool_(v.to_bool())); continue; }
      if (v.is_none()) { outs.append(nb::none()); continue; }
      if (!v.is_tensor()) throw Error("output " + std::to_string(o) + " is a list");
      const etb::Tensor& t = v.to_tensor();
      std::vector<size_t> shape(size_t(t.dim()));
      for (int d = 0; d < t.dim(); ++d) shape[size_t(d)] = size_t(t.size(d));
      const size_t nbytes = t.nbytes();
      uint8_t* copy = static_cast<uint8_t*>(malloc(nbytes ? nbytes : 1));
      if (nbytes) memcpy(copy, t.data(), nbytes);
      nb::capsule owner(copy, [](void* p) noexcept { free(p); });
      nb::ndarray<nb::pytorch> arr(copy, shape.size(), shape.data(), owner, nullptr,
                                   dlpack_from_dtype(t.dtype()));
      outs.append(arr);
    }
    (void)torch;
    return outs;
  }

  std::mutex run_mu_;  // held by run() and init_method()
  std::unique_ptr<etb::Parallel> pool_;  // outlives the methods (declared first)
  uint64_t budget_ = 0;  // instructions a run may execute (0: the program's default)
  bool prepare_ = true;  // pack the weights for the kernels when a method is initialised
  std::unique_ptr<etb::FileDataLoader> loader_;
  std::optional<etb::Program> program_;
  std::map<std::string, std::unique_ptr<MethodState>> methods_;
  std::vector<std::pair<std::string, double>> last_profile_;
  RunThread run_thread_;  // stops before the methods it runs are destroyed (declared last)
};

}  // namespace

NB_MODULE(runtime, m) {
  m.doc() = "The etbuild runtime: load and run ExecuTorch-format programs.";
  nb::exception<Error>(m, "Error", PyExc_RuntimeError);
  (void)on_main_thread();  // remembers the importing (main) thread
  if (etb::register_all_kernels() != etb::Error::Ok)
    throw std::runtime_error(etb::last_error_message());

  nb::class_<PyProgram>(m, "Program", "A loaded program file.")
      .def_prop_ro("method_names", &PyProgram::method_names, "Names of the program's methods.")
      .def_prop_ro("num_threads", &PyProgram::num_threads,
                   "Threads the kernels split their work over (the calling one included).")
      .def("method_meta", &PyProgram::method_meta, nb::arg("name") = "forward",
           "Inputs, outputs, planned memory banks (bytes, 0-based; memory_bank_names, "
           "memory_bank_alignments, memory_bank_table: whether the program names them; scratch: "
           "the kernels' scratch region {bank, offset, size} or None) and instruction count.")
      .def("init_method", &PyProgram::init_method, nb::arg("name") = "forward",
           nb::arg("bank_sizes") = nb::none(), nb::arg("temp_bytes") = size_t(8u << 20),
           "(Re)initialize a method with buffers of the given sizes (default: as planned).")
      .def("run", &PyProgram::run, nb::arg("inputs"), nb::arg("method") = "forward",
           nb::arg("profile") = false,
           "Run a method on a list of tensors; returns a list of tensors. Calls from several "
           "threads take turns (one run at a time per program).")
      .def("prepared_bytes", &PyProgram::prepared_bytes, nb::arg("name") = "forward",
           "Bytes of weights the kernels packed when the method was initialised (0 when "
           "loaded with prepare=False or when no kernel packs any).")
      .def_prop_ro("last_profile", &PyProgram::last_profile,
                   "(op name, seconds) per instruction of the last run(profile=True).");

  m.def(
      "load",
      [](const std::string& path, int threads, int64_t instruction_budget, bool prepare) {
        return new PyProgram(path, threads, instruction_budget, prepare);
      },
      nb::arg("path"), nb::arg("threads") = 1, nb::arg("instruction_budget") = 0,
      nb::arg("prepare") = true,
      "Load a program file (read into memory); its kernels split their work over `threads`, and a "
      "run stops with an error after `instruction_budget` instructions (0: the program's "
      "default, which only a looping program can reach). With `prepare`, each method packs "
      "its weights for the kernels once, when it is initialised (more memory, faster calls).");
  m.def("registered_kernels", []() {
    std::vector<std::string> names;
    for (const etb::Kernel& k : etb::registered_kernels()) names.emplace_back(k.name);
    return names;
  }, "Names of every registered kernel.");
  m.def(
      "kernel_isa", []() { return std::string(etb::kernel_isa()); },
      "The SIMD path the kernels were compiled for: avx512, avx2, sse2, neon or scalar.");
}
