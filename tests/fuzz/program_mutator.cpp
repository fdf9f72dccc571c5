// A structure-aware libFuzzer mutator for program files. With some probability it parses the
// input as a program (flatbuffer with the ET12 identifier, extended header, segment data),
// applies one structural change that keeps the flatbuffer well formed (an index moved to
// another valid value or one past the end, a tensor's shape, dtype, dim order, constant or
// planned storage changed, a value's type swapped, an instruction deleted or duplicated, an
// operator renamed to another registered kernel, a bank size or constant offset changed, ...)
// and writes the program again: the same segment data, a fresh header, checksums left stale
// (the fuzz target loads without checking them). Byte-level mutation (LLVMFuzzerMutate) does
// the rest, and everything when the input is no program.
//
// The reader and writer are flatc's object API, generated from runtime_src/schema at build
// time (tests/fuzz/CMakeLists.txt). This file includes no runtime header: the runtime's own
// generated reader shares the schema's namespace but not the object API.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "memory_banks_generated.h"
#include "program_generated.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
// Defined by the fuzz target (program_fuzzer.cpp): the i-th registered kernel's name
// ("aten::add.out"), or nullptr past the end.
extern "C" const char* etb_fuzz_kernel_name(size_t i);

namespace {

namespace fb = etbuild::schema;
namespace fbb = etbuild::schema::banks;

constexpr size_t kHeaderOffset = 8;
constexpr uint32_t kHeaderLength = 32;
constexpr size_t kSegmentAlignment = 128;
constexpr const char* kBanksKey = "etbuild.memory_banks";
// Percent of mutations that are structural when the input parses as a program.
#ifndef ETB_FUZZ_STRUCTURAL_PERCENT
#define ETB_FUZZ_STRUCTURAL_PERCENT 50
#endif
constexpr unsigned kStructuralPercent = ETB_FUZZ_STRUCTURAL_PERCENT;

uint64_t read_u64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
uint32_t read_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

// A program file taken apart: the flatbuffer's object tree and the segment data, kept as
// bytes (segment offsets are relative to its start, so it moves as one block).
struct ProgramFile {
  std::unique_ptr<fb::ProgramT> program;
  std::vector<uint8_t> segments;
};

bool verify(const uint8_t* data, size_t size, bool banks) {
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 64;
  opts.max_tables = 100000000;
  opts.check_alignment = true;
  flatbuffers::Verifier v(data, size, opts);
  return banks ? fbb::VerifyMemoryBankTableBuffer(v) : fb::VerifyProgramBuffer(v);
}

// An 8-byte aligned copy: the object API reads scalars in place.
std::vector<uint64_t> aligned_copy(const uint8_t* data, size_t size) {
  std::vector<uint64_t> out((size + 7) / 8 + 1, 0);
  if (size > 0) memcpy(out.data(), data, size);
  return out;
}

bool parse(const uint8_t* data, size_t size, ProgramFile* out) {
  if (size < kHeaderOffset + 4 || memcmp(data + 4, fb::ProgramIdentifier(), 4) != 0) return false;
  size_t program_size = size, base = size, seg_size = 0;
  if (size >= kHeaderOffset + kHeaderLength && memcmp(data + kHeaderOffset, "eh00", 4) == 0) {
    const uint32_t length = read_u32(data + kHeaderOffset + 4);
    const uint64_t psize = read_u64(data + kHeaderOffset + 8);
    const uint64_t sbase = read_u64(data + kHeaderOffset + 16);
    const uint64_t ssize = length >= 32 ? read_u64(data + kHeaderOffset + 24) : 0;
    if (psize > size || psize < kHeaderOffset + kHeaderLength) return false;
    program_size = size_t(psize);
    if (sbase >= psize && sbase <= size && ssize <= size - sbase) {
      base = size_t(sbase);
      seg_size = size_t(ssize);
    }
  }
  std::vector<uint64_t> copy = aligned_copy(data, program_size);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(copy.data());
  if (!verify(bytes, program_size, false)) return false;
  // The verifier accepts a union whose type is set but whose value is absent; the object API
  // cannot write one back, so such a program is left to the byte mutations.
  const fb::Program* root = fb::GetProgram(bytes);
  if (root->execution_plan() != nullptr)
    for (const fb::ExecutionPlan* plan : *root->execution_plan()) {
      if (plan->values() != nullptr)
        for (const fb::EValue* v : *plan->values())
          if (v->val_type() != fb::KernelTypes_NONE && v->val() == nullptr) return false;
      if (plan->chains() != nullptr)
        for (const fb::Chain* c : *plan->chains())
          if (c->instructions() != nullptr)
            for (const fb::Instruction* in : *c->instructions())
              if (in->instr_args_type() != fb::InstructionArguments_NONE &&
                  in->instr_args() == nullptr)
                return false;
    }
  out->program.reset(root->UnPack());
  out->segments.assign(data + base, data + base + seg_size);
  return true;
}

std::vector<uint8_t> serialize(const ProgramFile& file) {
  flatbuffers::FlatBufferBuilder builder(1 << 14);
  builder.Finish(fb::Program::Pack(builder, file.program.get()), fb::ProgramIdentifier());
  const uint8_t* buf = builder.GetBufferPointer();
  const size_t n = builder.GetSize();
  const uint64_t program_size = n + kHeaderLength;
  const uint64_t base =
      (program_size + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment;
  std::vector<uint8_t> out;
  out.reserve(size_t(base) + file.segments.size());
  const uint32_t root = read_u32(buf) + kHeaderLength;
  const uint8_t* r = reinterpret_cast<const uint8_t*>(&root);
  out.insert(out.end(), r, r + 4);
  out.insert(out.end(), buf + 4, buf + 8);
  uint8_t header[kHeaderLength];
  const uint64_t seg_size = file.segments.size();
  memcpy(header, "eh00", 4);
  memcpy(header + 4, &kHeaderLength, 4);
  memcpy(header + 8, &program_size, 8);
  memcpy(header + 16, &base, 8);
  memcpy(header + 24, &seg_size, 8);
  out.insert(out.end(), header, header + kHeaderLength);
  out.insert(out.end(), buf + 8, buf + n);
  out.resize(size_t(base), 0);
  out.insert(out.end(), file.segments.begin(), file.segments.end());
  return out;
}

// ---- random choices ----------------------------------------------------------------------

struct Rng {
  std::minstd_rand gen;
  explicit Rng(unsigned seed) : gen(seed) {}
  // Uniform in [0, n); 0 when n is 0.
  size_t below(size_t n) { return n == 0 ? 0 : size_t(gen() % n); }
  bool chance(unsigned percent) { return below(100) < percent; }
  template <typename T>
  T& pick(std::vector<T>& v) {
    return v[below(v.size())];
  }
};

// Integers that tend to matter: boundaries, powers of two, their neighbours.
int64_t interesting_int(Rng& rng, int64_t current) {
  static const int64_t kValues[] = {
      0,     1,     2,  3,   4,    7,         8,         15,        16,       17,   31,
      32,    63,    64, 127, 128,  255,       256,       1023,      1024,     4095, 4096,
      65535, 65536, -1, -2,  -128, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
  switch (rng.below(6)) {
    case 0: return current + 1;
    case 1: return current - 1;
    case 2: return current * 2;
    case 3: return current / 2;
    case 4: return int64_t(rng.gen()) - int64_t(rng.gen());
    default: return kValues[rng.below(sizeof(kValues) / sizeof(kValues[0]))];
  }
}

// A 32-bit wire field set from interesting_int (wrapping, as a corrupt file would).
int32_t interesting_i32(Rng& rng, int64_t current) {
  return int32_t(uint32_t(uint64_t(interesting_int(rng, current))));
}

// An index into a table of n entries: mostly a valid one, or one just outside it.
int32_t pick_index(Rng& rng, size_t n, int64_t current) {
  switch (rng.below(10)) {
    case 0: return int32_t(n);  // one past the end
    case 1: return -1;
    case 2: return int32_t(current + 1);
    case 3: return int32_t(current - 1);
    case 4: return interesting_i32(rng, current);
    default: return n == 0 ? 0 : int32_t(rng.below(n));
  }
}

// ---- the program being mutated ------------------------------------------------------------

struct Mutation {
  Rng& rng;
  ProgramFile& file;
  fb::ExecutionPlanT& plan;

  size_t num_values() const { return plan.values.size(); }
  fb::KernelTypes type_of(int64_t i) const {
    if (i < 0 || size_t(i) >= plan.values.size() || !plan.values[size_t(i)])
      return fb::KernelTypes_NONE;
    return plan.values[size_t(i)]->val.type;
  }

  // A value index to put where `current` was: half the time one of the same type (a
  // plausible program that the loader accepts), otherwise any index, or one out of range.
  int32_t value_index(int64_t current) {
    const fb::KernelTypes want = type_of(current);
    if (want != fb::KernelTypes_NONE && rng.chance(50)) {
      std::vector<int32_t> same;
      for (size_t i = 0; i < plan.values.size(); ++i)
        if (type_of(int64_t(i)) == want && int64_t(i) != current) same.push_back(int32_t(i));
      if (!same.empty()) return rng.pick(same);
    }
    return pick_index(rng, num_values(), current);
  }
  // Index of a random value of the given type, or -1.
  int64_t value_of_type(fb::KernelTypes t) {
    std::vector<int32_t> found;
    for (size_t i = 0; i < plan.values.size(); ++i)
      if (type_of(int64_t(i)) == t) found.push_back(int32_t(i));
    return found.empty() ? -1 : rng.pick(found);
  }

  std::vector<fb::InstructionT*> instructions(fb::InstructionArguments kind) {
    std::vector<fb::InstructionT*> out;
    for (auto& chain : plan.chains)
      if (chain)
        for (auto& in : chain->instructions)
          if (in && (kind == fb::InstructionArguments_NONE || in->instr_args.type == kind))
            out.push_back(in.get());
    return out;
  }
  std::vector<fb::TensorT*> tensors() {
    std::vector<fb::TensorT*> out;
    for (auto& v : plan.values)
      if (v && v->val.type == fb::KernelTypes_Tensor) out.push_back(v->val.AsTensor());
    return out;
  }
  fb::ChainT* chain() {
    if (plan.chains.empty()) return nullptr;
    return plan.chains[rng.below(plan.chains.size())].get();
  }
  // Changes, inserts, removes or duplicates one entry of an index vector.
  bool index_list(std::vector<int32_t>& v, size_t n) {
    const size_t op = rng.below(v.empty() ? 1 : 5);
    if (op == 0) {
      v.insert(v.begin() + long(rng.below(v.size() + 1)), pick_index(rng, n, 0));
    } else if (op == 1) {
      v.erase(v.begin() + long(rng.below(v.size())));
    } else if (op == 2) {
      const int32_t x = rng.pick(v);
      v.insert(v.begin() + long(rng.below(v.size() + 1)), x);
    } else {
      int32_t& x = rng.pick(v);
      x = value_index(x);
    }
    return true;
  }

  // ---- the mutations; each returns false when it has nothing to act on -------------------

  bool kernel_arg() {
    auto calls = instructions(fb::InstructionArguments_KernelCall);
    if (calls.empty()) return false;
    fb::KernelCallT* k = rng.pick(calls)->instr_args.AsKernelCall();
    if (k->args.empty() || rng.chance(15)) return index_list(k->args, num_values());
    int32_t& a = rng.pick(k->args);
    a = value_index(a);
    return true;
  }

  bool kernel_op() {
    auto calls = instructions(fb::InstructionArguments_KernelCall);
    if (calls.empty()) return false;
    fb::KernelCallT* k = rng.pick(calls)->instr_args.AsKernelCall();
    k->op_index = pick_index(rng, plan.operators.size(), k->op_index);
    return true;
  }

  // Jumps, moves, frees and delegate calls: change an operand.
  bool control_operand() {
    auto all = instructions(fb::InstructionArguments_NONE);
    std::vector<fb::InstructionT*> ctl;
    for (auto* in : all)
      if (in->instr_args.type != fb::InstructionArguments_KernelCall) ctl.push_back(in);
    if (ctl.empty()) return false;
    fb::InstructionT* in = rng.pick(ctl);
    switch (in->instr_args.type) {
      case fb::InstructionArguments_JumpFalseCall: {
        auto* j = in->instr_args.AsJumpFalseCall();
        if (rng.chance(50))
          j->cond_value_index = rng.chance(50) ? int32_t(value_of_type(fb::KernelTypes_Bool))
                                               : value_index(j->cond_value_index);
        else
          j->destination_instruction = pick_index(rng, all.size(), j->destination_instruction);
        break;
      }
      case fb::InstructionArguments_MoveCall: {
        auto* m = in->instr_args.AsMoveCall();
        int32_t& x = rng.chance(50) ? m->move_from : m->move_to;
        x = value_index(x);
        break;
      }
      case fb::InstructionArguments_FreeCall: {
        auto* f = in->instr_args.AsFreeCall();
        f->value_index = value_index(f->value_index);
        break;
      }
      case fb::InstructionArguments_DelegateCall: {
        auto* d = in->instr_args.AsDelegateCall();
        if (rng.chance(50))
          d->delegate_index = pick_index(rng, plan.delegates.size(), d->delegate_index);
        else
          index_list(d->args, num_values());
        break;
      }
      default: return false;
    }
    return true;
  }

  // Deletes, duplicates, moves an instruction, or inserts a jump, move or free.
  bool instruction_list() {
    fb::ChainT* c = chain();
    if (c == nullptr) return false;
    auto& ins = c->instructions;
    const size_t op = rng.below(ins.empty() ? 1 : 4);
    if (op == 0) {
      fb::InstructionArgumentsUnion u;
      switch (rng.below(3)) {
        case 0: {
          fb::JumpFalseCallT j;
          const int64_t b = value_of_type(fb::KernelTypes_Bool);
          j.cond_value_index =
              b >= 0 && rng.chance(70) ? int32_t(b) : pick_index(rng, num_values(), 0);
          j.destination_instruction = pick_index(rng, ins.size() + 1, 0);
          u.Set(std::move(j));
          break;
        }
        case 1: {
          fb::MoveCallT m;
          m.move_from = pick_index(rng, num_values(), 0);
          m.move_to = value_index(m.move_from);
          u.Set(std::move(m));
          break;
        }
        default: {
          fb::FreeCallT f;
          f.value_index = pick_index(rng, num_values(), 0);
          u.Set(std::move(f));
        }
      }
      auto in = std::make_unique<fb::InstructionT>();
      in->instr_args = std::move(u);
      ins.insert(ins.begin() + long(rng.below(ins.size() + 1)), std::move(in));
    } else if (op == 1) {
      ins.erase(ins.begin() + long(rng.below(ins.size())));
    } else if (op == 2) {
      const size_t from = rng.below(ins.size());
      auto copy = std::make_unique<fb::InstructionT>(*ins[from]);
      ins.insert(ins.begin() + long(rng.below(ins.size() + 1)), std::move(copy));
    } else {
      std::swap(ins[rng.below(ins.size())], ins[rng.below(ins.size())]);
    }
    return true;
  }

  bool tensor() {
    auto ts = tensors();
    if (ts.empty()) return false;
    fb::TensorT* t = rng.pick(ts);
    switch (rng.below(11)) {
      case 0:
      case 1:
        if (!t->sizes.empty() && rng.chance(75)) {
          int32_t& s = rng.pick(t->sizes);
          s = rng.chance(60) ? int32_t(rng.below(5)) : interesting_i32(rng, s);
        } else if (t->sizes.empty() || rng.chance(50)) {
          const size_t at = rng.below(t->sizes.size() + 1);
          t->sizes.insert(t->sizes.begin() + long(at), int32_t(rng.below(4)));
          if (!t->dim_order.empty() && rng.chance(80))
            t->dim_order.push_back(uint8_t(t->dim_order.size()));
        } else {
          t->sizes.erase(t->sizes.begin() + long(rng.below(t->sizes.size())));
          if (!t->dim_order.empty() && rng.chance(80)) {
            auto it = std::find(t->dim_order.begin(), t->dim_order.end(), uint8_t(t->sizes.size()));
            t->dim_order.erase(it != t->dim_order.end() ? it : t->dim_order.end() - 1);
          }
        }
        break;
      case 2:
        if (t->dim_order.size() >= 2 && rng.chance(60)) {
          std::swap(t->dim_order[rng.below(t->dim_order.size())],
                    t->dim_order[rng.below(t->dim_order.size())]);
        } else if (!t->dim_order.empty() && rng.chance(60)) {
          rng.pick(t->dim_order) = uint8_t(rng.chance(50) ? t->dim_order.size() : rng.gen());
        } else if (rng.chance(50)) {
          t->dim_order.clear();
        } else {
          t->dim_order.push_back(uint8_t(rng.below(t->dim_order.size() + 2)));
        }
        break;
      case 3: {
        static const int8_t kTypes[] = {0,  1,  2,  3,  4,  5,  6,  7,  11, 12, 13, 14, 15, 16, 17,
                                        22, 23, 24, 25, 26, 27, 28, 29, 8,  9,  10, 18, 30, -1};
        t->scalar_type = fb::ScalarType(kTypes[rng.below(sizeof(kTypes))]);
        break;
      }
      case 4: {
        const size_t n =
            file.program->constant_segment ? file.program->constant_segment->offsets.size() : 0;
        t->data_buffer_idx = uint32_t(rng.chance(20) ? 0 : pick_index(rng, n, t->data_buffer_idx));
        if (t->data_buffer_idx != 0 && rng.chance(50)) t->allocation_info.reset();
        break;
      }
      case 5:
      case 6: {
        if (!t->allocation_info || rng.chance(10)) {
          if (t->allocation_info && rng.chance(50)) {
            t->allocation_info.reset();
            break;
          }
          t->allocation_info = std::make_unique<fb::AllocationDetailsT>();
          t->allocation_info->memory_id = 1;
          if (rng.chance(70)) t->data_buffer_idx = 0;
        }
        fb::AllocationDetailsT& a = *t->allocation_info;
        const size_t banks = plan.non_const_buffer_sizes.size();
        switch (rng.below(4)) {
          case 0: a.memory_id = uint32_t(pick_index(rng, banks, a.memory_id)); break;
          case 1: {  // near the end of its bank, or anywhere
            const int64_t bank = a.memory_id < banks ? plan.non_const_buffer_sizes[a.memory_id] : 0;
            const uint64_t off = rng.chance(50)
                                     ? uint64_t(bank - int64_t(rng.below(256)))
                                     : uint64_t(interesting_int(rng, a.memory_offset_low));
            a.memory_offset_low = uint32_t(off);
            if (rng.chance(30)) a.memory_offset_high = uint32_t(off >> 32);
            break;
          }
          case 2: a.memory_offset_low = uint32_t(interesting_i32(rng, a.memory_offset_low)); break;
          default: a.memory_offset_high = rng.chance(50) ? 1u : uint32_t(rng.gen()); break;
        }
        break;
      }
      case 7: t->shape_dynamism = fb::TensorShapeDynamism(rng.below(4)); break;
      case 8: t->storage_offset = interesting_i32(rng, t->storage_offset); break;
      case 9: {  // take another tensor's shape
        fb::TensorT* o = rng.pick(ts);
        t->sizes = o->sizes;
        t->dim_order = o->dim_order;
        break;
      }
      default: {
        if (rng.chance(50))
          t->requires_grad = !t->requires_grad;
        else
          t->layout = int8_t(rng.below(3));
        if (rng.chance(30)) {
          t->extra_tensor_info = std::make_unique<fb::ExtraTensorInfoT>();
          t->extra_tensor_info->location = fb::TensorDataLocation(rng.below(3));
          t->extra_tensor_info->fully_qualified_name = "w";
        }
      }
    }
    return true;
  }

  // A fresh value of a random type, with contents that point at plausible values.
  fb::KernelTypesUnion fresh_value() {
    fb::KernelTypesUnion u;
    switch (rng.below(11)) {
      case 0: u.Set(fb::NullT()); break;
      case 1: {
        fb::IntT v;
        v.int_val = interesting_int(rng, 0);
        u.Set(std::move(v));
        break;
      }
      case 2: {
        fb::BoolT v;
        v.bool_val = rng.chance(50);
        u.Set(std::move(v));
        break;
      }
      case 3: {
        fb::DoubleT v;
        static const double kD[] = {0.0,
                                    1.0,
                                    -1.0,
                                    0.5,
                                    1e-30,
                                    1e30,
                                    std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::quiet_NaN(),
                                    -0.0};
        v.double_val = kD[rng.below(sizeof(kD) / sizeof(kD[0]))];
        u.Set(std::move(v));
        break;
      }
      case 4: {
        auto ts = tensors();
        fb::TensorT v = ts.empty() ? fb::TensorT() : fb::TensorT(*rng.pick(ts));
        if (ts.empty()) v.scalar_type = fb::ScalarType_Float;
        u.Set(std::move(v));
        break;
      }
      case 5: {
        fb::StringT v;
        v.string_val = "x";
        u.Set(std::move(v));
        break;
      }
      case 6: {
        fb::IntListT v;
        for (size_t i = rng.below(5); i > 0; --i) {
          const int64_t x = value_of_type(fb::KernelTypes_Int);
          v.items.push_back(x >= 0 && rng.chance(80) ? x : pick_index(rng, num_values(), 0));
        }
        u.Set(std::move(v));
        break;
      }
      case 7: {
        fb::DoubleListT v;
        for (size_t i = rng.below(4); i > 0; --i)
          v.items.push_back(double(interesting_int(rng, 1)));
        u.Set(std::move(v));
        break;
      }
      case 8: {
        fb::BoolListT v;
        for (size_t i = rng.below(4); i > 0; --i) v.items.push_back(rng.chance(50));
        u.Set(std::move(v));
        break;
      }
      default: {
        std::vector<int32_t> items;
        for (size_t i = rng.below(4); i > 0; --i) {
          const int64_t x =
              value_of_type(rng.chance(80) ? fb::KernelTypes_Tensor : fb::KernelTypes_Null);
          items.push_back(x >= 0 && rng.chance(80) ? int32_t(x) : pick_index(rng, num_values(), 0));
        }
        if (rng.chance(50)) {
          fb::TensorListT v;
          v.items = std::move(items);
          u.Set(std::move(v));
        } else {
          fb::OptionalTensorListT v;
          v.items = std::move(items);
          u.Set(std::move(v));
        }
      }
    }
    return u;
  }

  // Replaces a value by a copy of another or by a fresh value of another type.
  bool value_type() {
    if (plan.values.empty()) return false;
    auto& v = rng.pick(plan.values);
    if (!v) v = std::make_unique<fb::EValueT>();
    if (rng.chance(40)) {
      const auto& other = rng.pick(plan.values);
      if (other) v->val = other->val;
    } else {
      v->val = fresh_value();
    }
    return true;
  }

  // Changes a scalar value or an element of a list value.
  bool value_content() {
    if (plan.values.empty()) return false;
    std::vector<fb::EValueT*> vs;
    for (auto& v : plan.values)
      if (v && v->val.type != fb::KernelTypes_NONE && v->val.type != fb::KernelTypes_Null &&
          v->val.type != fb::KernelTypes_Tensor)
        vs.push_back(v.get());
    if (vs.empty()) return false;
    fb::KernelTypesUnion& u = rng.pick(vs)->val;
    switch (u.type) {
      case fb::KernelTypes_Int:
        u.AsInt()->int_val = interesting_int(rng, u.AsInt()->int_val);
        break;
      case fb::KernelTypes_Bool: u.AsBool()->bool_val = !u.AsBool()->bool_val; break;
      case fb::KernelTypes_Double:
        u.AsDouble()->double_val =
            rng.chance(50) ? -u.AsDouble()->double_val : double(interesting_int(rng, 0)) / 8;
        break;
      case fb::KernelTypes_String: u.AsString()->string_val += char('a' + rng.below(26)); break;
      case fb::KernelTypes_IntList: {
        auto& items = u.AsIntList()->items;
        std::vector<int32_t> idx(items.begin(), items.end());
        index_list(idx, num_values());
        items.assign(idx.begin(), idx.end());
        break;
      }
      case fb::KernelTypes_DoubleList: {
        auto& items = u.AsDoubleList()->items;
        if (items.empty() || rng.chance(30))
          items.push_back(1.0);
        else
          rng.pick(items) = double(interesting_int(rng, 0));
        break;
      }
      case fb::KernelTypes_BoolList: {
        auto& items = u.AsBoolList()->items;
        if (items.empty() || rng.chance(30))
          items.push_back(true);
        else
          items.pop_back();
        break;
      }
      case fb::KernelTypes_TensorList: index_list(u.AsTensorList()->items, num_values()); break;
      case fb::KernelTypes_OptionalTensorList:
        index_list(u.AsOptionalTensorList()->items, num_values());
        break;
      default: return false;
    }
    return true;
  }

  bool inputs_outputs() {
    const size_t which = rng.below(4);
    if (which == 0) return index_list(plan.inputs, num_values());
    if (which == 1) return index_list(plan.outputs, num_values());
    fb::ChainT* c = chain();
    if (c == nullptr) return false;
    return index_list(which == 2 ? c->inputs : c->outputs, num_values());
  }

  bool buffer_sizes() {
    auto& s = plan.non_const_buffer_sizes;
    const size_t op = rng.below(s.empty() ? 1 : 6);
    if (op == 0)
      s.push_back(int64_t(rng.below(4096)));
    else if (op == 1)
      s.pop_back();
    else {
      int64_t& x = rng.pick(s);
      x = rng.chance(30) ? x - int64_t(rng.below(64) + 1) : interesting_int(rng, x);
    }
    return true;
  }

  bool constants() {
    fb::ProgramT& p = *file.program;
    if (rng.chance(25) && !p.segments.empty()) {
      fb::DataSegmentT& s = *rng.pick(p.segments);
      uint64_t& x = rng.chance(50) ? s.offset : s.size;
      x = rng.chance(50) ? x + rng.below(3) - 1 : uint64_t(interesting_int(rng, int64_t(x)));
      return true;
    }
    if (!p.constant_segment) p.constant_segment = std::make_unique<fb::SubsegmentOffsetsT>();
    fb::SubsegmentOffsetsT& cs = *p.constant_segment;
    if (rng.chance(15)) {
      cs.segment_index = uint32_t(pick_index(rng, p.segments.size(), cs.segment_index));
      return true;
    }
    auto& o = cs.offsets;
    const size_t op = rng.below(o.empty() ? 1 : 6);
    if (op == 0)
      o.push_back(o.empty() ? 0 : o.back() + 64);
    else if (op == 1)
      o.pop_back();
    else {
      uint64_t& x = rng.pick(o);
      switch (rng.below(4)) {
        case 0: x += 1; break;
        case 1: x -= 1; break;
        case 2: x = rng.chance(50) ? x + 64 : x - 64; break;
        default: x = uint64_t(interesting_int(rng, int64_t(x)));
      }
    }
    return true;
  }

  bool operator_name() {
    if (plan.operators.empty()) return false;
    fb::OperatorT& op = *rng.pick(plan.operators);
    switch (rng.below(5)) {
      case 0:
      case 1: {  // another registered kernel: arguments that do not fit it
        size_t n = 0;
        while (etb_fuzz_kernel_name(n) != nullptr) ++n;
        if (n == 0) return false;
        const std::string full = etb_fuzz_kernel_name(rng.below(n));
        const size_t dot = full.rfind('.');
        op.name = dot == std::string::npos ? full : full.substr(0, dot);
        op.overload = dot == std::string::npos ? "" : full.substr(dot + 1);
        break;
      }
      case 2: {  // another operator of this method, or its overload
        const fb::OperatorT& other = *rng.pick(plan.operators);
        if (rng.chance(50))
          op.name = other.name;
        else
          op.overload = other.overload;
        break;
      }
      case 3: plan.operators.push_back(std::make_unique<fb::OperatorT>(op)); break;
      default:
        if (!op.name.empty() && rng.chance(50))
          op.name.pop_back();
        else
          op.overload = rng.chance(50) ? "" : "out";
    }
    return true;
  }

  // The memory bank table (a flatbuffer in a segment, found through named data): a bank's
  // size, alignment or name, the scratch region, or the entry pointing elsewhere.
  bool banks() {
    fb::ProgramT& p = *file.program;
    fb::NamedDataT* entry = nullptr;
    for (auto& n : p.named_data)
      if (n && n->key == kBanksKey) entry = n.get();
    if (entry == nullptr || entry->segment_index >= p.segments.size()) return false;
    if (rng.chance(10)) {
      entry->segment_index = uint32_t(pick_index(rng, p.segments.size(), entry->segment_index));
      return true;
    }
    fb::DataSegmentT& seg = *p.segments[entry->segment_index];
    if (seg.offset > file.segments.size() || seg.size > file.segments.size() - seg.offset)
      return false;
    std::vector<uint64_t> copy = aligned_copy(file.segments.data() + seg.offset, size_t(seg.size));
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(copy.data());
    if (!verify(bytes, size_t(seg.size), true)) return false;
    std::unique_ptr<fbb::MemoryBankTableT> table(fbb::GetMemoryBankTable(bytes)->UnPack());
    if (table->methods.empty()) return false;
    fbb::MethodBanksT& m = *rng.pick(table->methods);
    switch (rng.below(6)) {
      case 0:
      case 1:
        if (m.banks.empty())
          return false;
        else {
          fbb::MemoryBankT& b = *rng.pick(m.banks);
          if (rng.chance(60))
            b.size = uint64_t(interesting_int(rng, int64_t(b.size)));
          else if (rng.chance(70))
            b.alignment = uint32_t(interesting_int(rng, b.alignment));
          else
            b.name = rng.chance(50) ? std::string("") : b.name + "1";
        }
        break;
      case 2:
        if (!m.banks.empty() && rng.chance(50))
          m.banks.pop_back();
        else if (!m.banks.empty())
          m.banks.push_back(std::make_unique<fbb::MemoryBankT>(*m.banks[0]));
        else
          return false;
        break;
      case 3:
      case 4: {
        if (!m.scratch) m.scratch = std::make_unique<fbb::ScratchRegionT>();
        fbb::ScratchRegionT& s = *m.scratch;
        switch (rng.below(3)) {
          case 0: s.bank = uint32_t(pick_index(rng, m.banks.size(), s.bank)); break;
          case 1: s.offset = uint64_t(interesting_int(rng, int64_t(s.offset))); break;
          default: s.size = uint64_t(interesting_int(rng, int64_t(s.size)));
        }
        break;
      }
      default:
        if (rng.chance(50))
          m.scratch.reset();
        else
          m.method += "x";
    }
    flatbuffers::FlatBufferBuilder builder(1024);
    builder.Finish(fbb::MemoryBankTable::Pack(builder, table.get()),
                   fbb::MemoryBankTableIdentifier());
    // The new table goes after the segment data, 16-aligned; the old bytes stay unreferenced.
    file.segments.resize((file.segments.size() + 15) / 16 * 16, 0);
    seg.offset = file.segments.size();
    seg.size = builder.GetSize();
    file.segments.insert(file.segments.end(), builder.GetBufferPointer(),
                         builder.GetBufferPointer() + builder.GetSize());
    return true;
  }

  bool apply() {
    using Fn = bool (Mutation::*)();
    // Weighted: the instruction stream and the tensors carry most of what the loader checks.
    static const Fn kMutations[] = {
        &Mutation::kernel_arg,       &Mutation::kernel_arg,      &Mutation::kernel_arg,
        &Mutation::kernel_op,        &Mutation::control_operand, &Mutation::instruction_list,
        &Mutation::instruction_list, &Mutation::tensor,          &Mutation::tensor,
        &Mutation::tensor,           &Mutation::tensor,          &Mutation::value_type,
        &Mutation::value_type,       &Mutation::value_content,   &Mutation::value_content,
        &Mutation::inputs_outputs,   &Mutation::buffer_sizes,    &Mutation::constants,
        &Mutation::operator_name,    &Mutation::operator_name,   &Mutation::banks,
    };
    for (int attempt = 0; attempt < 8; ++attempt)
      if ((this->*kMutations[rng.below(sizeof(kMutations) / sizeof(kMutations[0]))])()) return true;
    return false;
  }
};

size_t write_back(const ProgramFile& file, uint8_t* data, size_t max_size) {
  const std::vector<uint8_t> out = serialize(file);
  if (out.size() > max_size) return 0;
  memcpy(data, out.data(), out.size());
  return out.size();
}

size_t structural_mutate(uint8_t* data, size_t size, size_t max_size, Rng& rng) {
  ProgramFile file;
  if (!parse(data, size, &file) || file.program->execution_plan.empty()) return 0;
  auto& plans = file.program->execution_plan;
  auto& plan = plans[rng.below(plans.size())];
  if (!plan) return 0;
  Mutation m{rng, file, *plan};
  if (!m.apply()) return 0;
  return write_back(file, data, max_size);
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  Rng rng(seed);
  if (rng.chance(kStructuralPercent)) {
    const size_t n = structural_mutate(data, size, max_size, rng);
    if (n > 0) return n;
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

// Crossover of two programs: a value, an instruction, an operator or a tensor's shape of the
// second put into the first; byte-level crossover is left to libFuzzer's own mutations.
extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* data1, size_t size1,
                                            const uint8_t* data2, size_t size2, uint8_t* out,
                                            size_t max_out_size, unsigned int seed) {
  Rng rng(seed);
  ProgramFile a, b;
  if (!parse(data1, size1, &a) || !parse(data2, size2, &b)) return 0;
  auto& pa = a.program->execution_plan;
  auto& pb = b.program->execution_plan;
  if (pa.empty() || pb.empty()) return 0;
  fb::ExecutionPlanT& x = *pa[rng.below(pa.size())];
  fb::ExecutionPlanT& y = *pb[rng.below(pb.size())];
  switch (rng.below(3)) {
    case 0:
      if (x.values.empty() || y.values.empty()) return 0;
      rng.pick(x.values) = std::make_unique<fb::EValueT>(*rng.pick(y.values));
      break;
    case 1: {
      if (x.chains.empty() || y.chains.empty()) return 0;
      auto& from = y.chains[rng.below(y.chains.size())]->instructions;
      auto& to = x.chains[rng.below(x.chains.size())]->instructions;
      if (from.empty()) return 0;
      to.insert(to.begin() + long(rng.below(to.size() + 1)),
                std::make_unique<fb::InstructionT>(*rng.pick(from)));
      break;
    }
    default:
      if (x.operators.empty() || y.operators.empty()) return 0;
      *rng.pick(x.operators) = *rng.pick(y.operators);
  }
  return write_back(a, out, max_out_size);
}
