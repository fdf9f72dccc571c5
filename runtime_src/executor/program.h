// Program: a verified, loaded program file; MethodMeta: what a method needs to run.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "core/error.h"
#include "core/memory_allocator.h"
#include "core/result.h"
#include "core/span.h"
#include "core/tensor.h"
#include "executor/data_loader.h"

namespace etbuild {
namespace schema {
struct Program;
struct ExecutionPlan;
struct SubsegmentOffsets;
namespace banks {
struct MemoryBankTable;
struct MethodBanks;
}  // namespace banks
}  // namespace schema
}  // namespace etbuild

namespace etb {

class Method;

/// Dtype and (upper-bound) sizes of a method input or output tensor.
struct TensorInfo {
  ScalarType dtype = ScalarType::Float;
  int dim = 0;
  int64_t sizes[kMaxDim] = {};
  ShapeDynamism dynamism = ShapeDynamism::Static;
};

/// The memory a method needs: caller-owned buffers, one per planned bank (0-based here;
/// the program's 1-based memory ids are hidden; each aligned as MethodMeta's
/// memory_bank_alignment says), an allocator for the method's own tables, and a temp
/// allocator for kernels (reset after every kernel). A null temp allocator: the kernels'
/// scratch is the plan's scratch region inside its bank (MethodMeta::scratch_region), or none.
struct MemoryManager {
  MemoryAllocator* method_allocator = nullptr;
  Span<const Span<uint8_t>> banks;
  MemoryAllocator* temp_allocator = nullptr;
};

/// The kernels' scratch memory the plan reserves inside one bank (size 0: none).
struct ScratchRegion {
  size_t bank = 0;    ///< 0-based bank index
  size_t offset = 0;  ///< bytes from the start of the bank
  size_t size = 0;    ///< bytes
};

/// Facts about one method, read without initializing it.
class MethodMeta {
 public:
  const char* name() const;
  size_t num_inputs() const;
  size_t num_outputs() const;
  /// Dtype and sizes of input i; an error when it is not a tensor.
  Result<TensorInfo> input_tensor_info(size_t i) const;
  Result<TensorInfo> output_tensor_info(size_t i) const;
  /// Number of planned memory banks.
  size_t num_memory_banks() const;
  /// Bytes planned for bank i (0-based).
  Result<int64_t> memory_bank_size(size_t i) const;
  /// True when the program names its banks (etbuild's memory bank table); false for older
  /// files and ExecuTorch's.
  bool has_memory_bank_table() const { return banks_ != nullptr; }
  /// Name of bank i: the memory config's (sram, dtcm, ...), or "bank<i>" without a table.
  Result<const char*> memory_bank_name(size_t i) const;
  /// Byte alignment bank i's buffer must have (16 without a table).
  Result<size_t> memory_bank_alignment(size_t i) const;
  /// The kernels' scratch region the plan reserves (size 0: none).
  ScratchRegion scratch_region() const;
  /// An upper bound of the bytes Method init takes from the method allocator.
  size_t method_allocator_bytes() const;
  /// Number of instructions across chains.
  size_t num_instructions() const;

 private:
  friend class Program;
  MethodMeta(const etbuild::schema::ExecutionPlan* plan,
             const etbuild::schema::banks::MethodBanks* banks)
      : plan_(plan), banks_(banks) {}
  Result<TensorInfo> value_tensor_info(int64_t value_index) const;
  const etbuild::schema::ExecutionPlan* plan_;
  const etbuild::schema::banks::MethodBanks* banks_;  // null: the program has no bank table
};

/// A loaded program. The loader must outlive the Program and its methods.
class Program : public NamedDataMap {
 public:
  /// Verifies and loads a program: flatbuffer verifier first, then the extended header
  /// and segment bounds, then (with `verify_checksums`, when the program carries them: etbuild
  /// writes a CRC-32 of the flatbuffer and of each segment) the content, in one pass, then the
  /// memory bank table when there is one (every method's banks: count, names, sizes,
  /// alignments and scratch region must agree with its plan). Constant data stays in the
  /// loader's memory.
  static Result<Program> load(const DataLoader* loader, bool verify_checksums = true);

  size_t num_methods() const;
  /// Name of method i.
  Result<const char*> method_name(size_t i) const;
  /// Meta of the named method.
  Result<MethodMeta> method_meta(const char* name) const;
  /// Initializes the named method with the caller's memory.
  Result<Method> load_method(const char* name, const MemoryManager& memory) const;

  /// `nbytes` of constant buffer `index` (bounds- and alignment-checked).
  Result<const uint8_t*> constant_data(uint32_t index, size_t nbytes, size_t align) const;
  /// `nbytes` of entry `index` of the first mutable data segment: the initial data of a
  /// planned tensor (etbuild: a constant copied into a faster bank at load). Bounds-checked.
  Result<const uint8_t*> mutable_data(uint32_t index, size_t nbytes) const;
  /// Segment `index` as a byte span (bounds-checked at load).
  Result<Span<const uint8_t>> segment(size_t index) const;
  /// The segment that named data entry `key` points at.
  Result<Span<const uint8_t>> named_data(const char* key, size_t key_size) const override;
  const etbuild::schema::Program* flatbuffer() const { return program_; }

 private:
  /// `nbytes` of entry `index` of a subsegment table (constants or initial data); `what`
  /// and `where` name them in the error.
  Result<const uint8_t*> subsegment_entry(const etbuild::schema::SubsegmentOffsets* sub,
                                          uint32_t index, size_t nbytes, const char* what,
                                          const char* where) const;
  Program(const DataLoader* loader, const etbuild::schema::Program* program,
          const uint8_t* segment_base, size_t segment_size,
          const etbuild::schema::banks::MemoryBankTable* banks)
      : loader_(loader), program_(program), segment_base_(segment_base),
        segment_size_(segment_size), banks_(banks) {}
  Result<const etbuild::schema::ExecutionPlan*> find_plan(const char* name) const;
  MethodMeta meta_of(const etbuild::schema::ExecutionPlan* plan) const;

  const DataLoader* loader_;
  const etbuild::schema::Program* program_;
  const uint8_t* segment_base_;
  size_t segment_size_;
  const etbuild::schema::banks::MemoryBankTable* banks_;  // verified at load; may be null
};

}  // namespace etb
