// Method: an initialized execution plan that runs its instructions.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "core/error.h"
#include "core/evalue.h"
#include "core/memory_allocator.h"
#include "core/result.h"
#include "core/span.h"
#include "kernel/kernel.h"

namespace etb {

class Program;
struct MemoryManager;

/// One profiled instruction: its name ("aten::add.out", "delegate", "move", ...) and time.
struct ProfileEvent {
  const char* name;
  uint64_t duration_ns;
};

/// An initialized method. Create with Program::load_method.
class Method {
 public:
  Method(Method&& o) noexcept;
  Method(const Method&) = delete;
  Method& operator=(const Method&) = delete;
  Method& operator=(Method&&) = delete;
  ~Method();

  size_t num_inputs() const { return num_inputs_; }
  size_t num_outputs() const { return num_outputs_; }

  /// Sets tensor input i: dtype and rank must match, sizes must equal (static) or lie
  /// within the bound (dynamic). Planned inputs are copied; unplanned inputs reference
  /// `data`, which must stay alive until execute() returns.
  Error set_input(size_t i, ScalarType dtype, Span<const int64_t> sizes, const void* data,
                  size_t nbytes);
  /// Sets a scalar (Int, Double or Bool) input i.
  Error set_input_scalar(size_t i, const EValue& v);
  /// The value of input i (for its expected type and sizes).
  Result<const EValue*> input(size_t i) const;
  /// Runs every instruction.
  Error execute();
  /// Output i after execute().
  Result<const EValue*> output(size_t i) const;

  /// Bytes of memory prepare() wants: what the kernels' prepare hooks make of the program's
  /// constants (weights packed for their micro-kernels). 0 when no call has anything to
  /// prepare.
  size_t prepared_bytes() const { return prepared_bytes_; }
  /// The most kernel scratch (temp allocator) bytes any instruction has used since load: the
  /// size a fixed scratch reservation (memory.scratch_bytes) needs for this build's kernels.
  size_t scratch_peak() const { return temp_ != nullptr ? temp_->peak() : 0; }
  /// Has every kernel call with a prepare hook fill its part of `memory` (prepared_bytes()
  /// bytes, 64-byte aligned, kept alive and unchanged as long as the method runs), so that
  /// no call repeats that work. Optional: an unprepared method computes the same outputs,
  /// each call doing the work itself (a bare-metal app may keep the RAM instead).
  /// Not while execute() runs.
  Error prepare(Span<uint8_t> memory);

  /// Threads the kernels may split their work over (nullptr: the calling thread only, the
  /// default). The Parallel must outlive the calls to execute(), and run one call at a time
  /// (the kernels keep per-thread scratch in its threads' memory): methods that run at once
  /// need a Parallel each.
  void set_parallel(Parallel* parallel) { parallel_ = parallel; }

  /// Most instructions one execute() runs before it stops with an error, so that a program
  /// whose jumps loop forever cannot hang its caller. 0 restores the default, derived from the
  /// program: its instruction count when no jump goes backwards (nothing can repeat), else
  /// kLoopBudgetFactor times that.
  void set_instruction_budget(uint64_t budget) {
    budget_ = budget != 0 ? budget : default_budget_;
  }
  uint64_t instruction_budget() const { return budget_; }

  /// A flag another thread may set to stop a running execute(): it is checked before each
  /// instruction, and execute() then returns Error::Cancelled (outputs undefined). nullptr:
  /// none (the default). The flag must outlive the calls to execute().
  void set_cancel_flag(const std::atomic<bool>* flag) { cancel_ = flag; }
  static constexpr uint64_t kLoopBudgetFactor = uint64_t(1) << 16;

  /// Records per-instruction times into `events` (up to `capacity`) on each execute();
  /// pass nullptr to turn profiling off (the default).
  void set_profiler(ProfileEvent* events, size_t capacity) {
    profile_ = events;
    profile_capacity_ = capacity;
    profile_count_ = 0;
  }
  /// Events recorded by the last execute().
  Span<const ProfileEvent> profile() const {
    return Span<const ProfileEvent>(profile_, profile_count_);
  }

  /// Instruction kinds. Fused: an activation that load fused into the kernel call before it
  /// (it runs as part of that call; nothing is left to do).
  enum class Kind : uint8_t { Kernel, Delegate, Move, JumpFalse, Free, Fused };
  /// One resolved instruction.
  struct Instr {
    Kind kind;
    int32_t a;  // op/delegate index, move_from, cond value, free value
    int32_t b;  // move_to, jump destination
    EValue** args;
    uint32_t num_args;
    OutputClamp clamp;     // kernel calls: the activation fused into the call
    const void* prepared;  // kernel calls: what the prepare hook filled, or nullptr
  };
  /// A resolved delegate.
  struct Delegate {
    const Backend* backend;
    void* handle;
  };

 private:
  friend class Program;
  Method() = default;

  EValue* values_ = nullptr;
  size_t num_values_ = 0;
  const int32_t* inputs_ = nullptr;
  size_t num_inputs_ = 0;
  const int32_t* outputs_ = nullptr;
  size_t num_outputs_ = 0;
  bool* input_set_ = nullptr;
  const int64_t** input_bounds_ = nullptr;
  bool* input_planned_ = nullptr;  // per input: has planned memory (else bound to caller data)  // per input: the program's (upper-bound) sizes
  Instr* instrs_ = nullptr;
  size_t num_instrs_ = 0;
  KernelFn* kernels_ = nullptr;
  const char** op_names_ = nullptr;
  size_t num_ops_ = 0;
  Delegate* delegates_ = nullptr;
  size_t num_delegates_ = 0;
  MemoryAllocator* temp_ = nullptr;
  Parallel* parallel_ = nullptr;
  ProfileEvent* profile_ = nullptr;
  size_t profile_capacity_ = 0;
  size_t profile_count_ = 0;
  uint64_t default_budget_ = 0;
  uint64_t budget_ = 0;
  const std::atomic<bool>* cancel_ = nullptr;
  size_t prepared_bytes_ = 0;
};

}  // namespace etb
