#include "executor/program.h"

#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "executor/method.h"
#include "memory_banks_generated.h"
#include "program_generated.h"

namespace fb = etbuild::schema;
namespace fbb = etbuild::schema::banks;

namespace etb {
namespace {

constexpr size_t kHeaderOffset = 8;
constexpr size_t kMinHeaderLength = 24;

uint32_t read_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
uint64_t read_u64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

bool is_aligned(const void* p, size_t align) {
  return (reinterpret_cast<uintptr_t>(p) & (align - 1)) == 0;
}

// CRC-32 of n bytes (IEEE 802.3, reflected; the value zlib.crc32 gives).
uint32_t crc32(const uint8_t* p, size_t n) {
  static constexpr auto kTable = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

// The named data entry under which etbuild stores a program's checksums: a segment of
// "ETCS", u32 version 1, u32 count, then count CRC-32s: the flatbuffer's bytes (file offset 0
// to the program size), then each other segment in order.
constexpr const char* kChecksumsKey = "etbuild.checksums";

// The flatbuffer verifier aligns each vector's length, not its 8-byte elements: a corrupt
// file can misalign them, and reading one is undefined behaviour (a fault on some cores).
template <typename V>
bool aligned_items(const V* v) {
  return v == nullptr || is_aligned(v->data(), 8);
}

Error check_vector_alignment(const fb::Program* program) {
  bool ok = program->constant_segment() == nullptr ||
            aligned_items(program->constant_segment()->offsets());
  if (const auto* mutables = program->mutable_data_segments())
    for (const fb::SubsegmentOffsets* sub : *mutables)
      ok = ok && (sub == nullptr || aligned_items(sub->offsets()));
  const auto* plans = program->execution_plan();
  for (size_t i = 0; plans != nullptr && i < plans->size(); ++i) {
    const fb::ExecutionPlan* plan = plans->Get(flatbuffers::uoffset_t(i));
    if (plan == nullptr) continue;
    ok = ok && aligned_items(plan->non_const_buffer_sizes());
    if (plan->values() == nullptr) continue;
    for (const fb::EValue* v : *plan->values()) {
      if (v == nullptr) continue;
      if (const fb::IntList* ints = v->val_as_IntList())
        ok = ok && aligned_items(ints->items());
      else if (const fb::DoubleList* doubles = v->val_as_DoubleList())
        ok = ok && aligned_items(doubles->items());
    }
  }
  return ok ? Error::Ok
            : fail(Error::InvalidProgram,
                   "the program has a misaligned 8-byte vector (corrupt file); rebuild it or "
                   "copy it again");
}

// Checks the program's content against its checksums; Ok when it carries none (ExecuTorch's
// programs do not).
Error verify_content(const fb::Program* program, const uint8_t* data, size_t program_size,
                     const uint8_t* segments) {
  const auto* named = program->named_data();
  const auto* segs = program->segments();
  if (named == nullptr || segs == nullptr) return Error::Ok;
  const fb::NamedData* entry = nullptr;
  for (const fb::NamedData* n : *named)
    if (n->key() != nullptr && strcmp(n->key()->c_str(), kChecksumsKey) == 0) entry = n;
  if (entry == nullptr) return Error::Ok;
  const uint32_t own = entry->segment_index();
  if (own >= segs->size())
    return fail(Error::InvalidProgram, "checksums: segment %u does not exist", unsigned(own));
  const fb::DataSegment* cs = segs->Get(own);
  const uint8_t* c = segments + cs->offset();  // bounds checked with every segment
  const uint64_t count = segs->size();          // the flatbuffer and the other segments
  if (cs->size() < 12 || memcmp(c, "ETCS", 4) != 0 || read_u32(c + 4) != 1 ||
      read_u32(c + 8) != count || cs->size() < 12 + 4 * count)
    return fail(Error::InvalidProgram,
                "the program's checksum segment is malformed: the file is corrupt; rebuild it "
                "or copy it again");
  uint32_t want = read_u32(c + 12), got = crc32(data, program_size);
  if (got != want)
    return fail(Error::InvalidProgram,
                "the program's flatbuffer does not match its checksum (crc32 %08x, recorded "
                "%08x): the file is corrupt; rebuild it or copy it again",
                unsigned(got), unsigned(want));
  uint32_t k = 1;
  for (uint32_t i = 0; i < segs->size(); ++i) {
    if (i == own) continue;
    const fb::DataSegment* s = segs->Get(i);
    want = read_u32(c + 12 + 4 * k++);
    got = crc32(segments + s->offset(), size_t(s->size()));
    if (got != want)
      return fail(Error::InvalidProgram,
                  "segment %u of the program does not match its checksum (crc32 %08x, recorded "
                  "%08x): the file is corrupt; rebuild it or copy it again",
                  unsigned(i), unsigned(got), unsigned(want));
  }
  return Error::Ok;
}

// The named data entry of etbuild's memory bank table (schema/memory_banks.fbs).
constexpr const char* kBanksKey = "etbuild.memory_banks";
// The largest bank alignment a table may ask for.
constexpr uint32_t kMaxBankAlignment = 1u << 16;
constexpr size_t kMaxBankNameLength = 63;

bool is_identifier(const flatbuffers::String* s) {
  if (s == nullptr || s->size() == 0 || s->size() > kMaxBankNameLength) return false;
  for (size_t i = 0; i < s->size(); ++i) {
    const char c = s->c_str()[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

__attribute__((format(printf, 1, 2))) Error bad_bank_table(const char* format, ...) {
  char what[192];
  va_list ap;
  va_start(ap, format);
  vformat(what, sizeof(what), format, ap);
  va_end(ap);
  return fail(Error::InvalidProgram,
              "the program's memory bank table is malformed: %s; the file is corrupt or was "
              "edited, rebuild it",
              what);
}

// Checks one method's entry against its plan: as many banks as it plans, each named by a C
// identifier (no two alike), sized as planned, aligned to a power of two; the scratch region
// inside its bank.
Error check_method_banks(const fb::ExecutionPlan* plan, const fbb::MethodBanks* m) {
  const auto* planned = plan->non_const_buffer_sizes();
  const size_t nplanned = planned == nullptr || planned->size() == 0 ? 0 : planned->size() - 1;
  const auto* banks = m->banks();
  const size_t n = banks == nullptr ? 0 : banks->size();
  const char* method = m->method()->c_str();
  if (n != nplanned)
    return bad_bank_table("it lists %zu banks for method '%s', which plans %zu", n, method,
                          nplanned);
  for (size_t i = 0; i < n; ++i) {
    const fbb::MemoryBank* b = banks->Get(flatbuffers::uoffset_t(i));
    if (!is_identifier(b->name()))
      return bad_bank_table("bank %zu of method '%s' has no name or one that is not an "
                            "identifier of at most %zu characters",
                            i, method, kMaxBankNameLength);
    for (size_t j = 0; j < i; ++j)
      if (strcmp(banks->Get(flatbuffers::uoffset_t(j))->name()->c_str(), b->name()->c_str()) == 0)
        return bad_bank_table("banks %zu and %zu of method '%s' are both named '%s'", j, i,
                              method, b->name()->c_str());
    const int64_t size = planned->Get(flatbuffers::uoffset_t(i + 1));
    if (size < 0 || b->size() != uint64_t(size))
      return bad_bank_table("bank '%s' of method '%s' is %llu bytes, the plan says %lld",
                            b->name()->c_str(), method, (unsigned long long)b->size(),
                            (long long)size);
    const uint32_t a = b->alignment();
    if (a == 0 || (a & (a - 1)) != 0 || a > kMaxBankAlignment)
      return bad_bank_table("bank '%s' of method '%s' has alignment %u (a power of two up to "
                            "%u is needed)",
                            b->name()->c_str(), method, unsigned(a), unsigned(kMaxBankAlignment));
  }
  if (const fbb::ScratchRegion* sc = m->scratch()) {
    if (sc->bank() >= n)
      return bad_bank_table("the scratch region of method '%s' is in bank %u of %zu", method,
                            unsigned(sc->bank()), n);
    const uint64_t bank_size = banks->Get(sc->bank())->size();
    if (sc->offset() > bank_size || sc->size() > bank_size - sc->offset())
      return bad_bank_table("the scratch region of method '%s' (%llu bytes at %llu) exceeds "
                            "bank '%s' (%llu bytes)",
                            method, (unsigned long long)sc->size(),
                            (unsigned long long)sc->offset(),
                            banks->Get(sc->bank())->name()->c_str(),
                            (unsigned long long)bank_size);
  }
  return Error::Ok;
}

// The memory bank table, verified; null when the program has none (older files, ExecuTorch's).
Result<const fbb::MemoryBankTable*> load_bank_table(const fb::Program* program,
                                                    const uint8_t* segments) {
  const auto* named = program->named_data();
  const auto* segs = program->segments();
  if (named == nullptr) return static_cast<const fbb::MemoryBankTable*>(nullptr);
  const fb::NamedData* entry = nullptr;
  for (const fb::NamedData* n : *named) {
    if (n->key() == nullptr || strcmp(n->key()->c_str(), kBanksKey) != 0) continue;
    if (entry != nullptr) return bad_bank_table("two named data entries '%s'", kBanksKey);
    entry = n;
  }
  if (entry == nullptr) return static_cast<const fbb::MemoryBankTable*>(nullptr);
  if (segs == nullptr || entry->segment_index() >= segs->size())
    return bad_bank_table("it points at segment %u, which does not exist",
                          unsigned(entry->segment_index()));
  const fb::DataSegment* seg = segs->Get(entry->segment_index());
  const uint8_t* p = segments + seg->offset();  // bounds checked with every segment
  const size_t size = size_t(seg->size());
  if (size < 8 || size > (size_t(1) << 24) || !is_aligned(p, 8))
    return bad_bank_table("its segment is %zu bytes%s", size,
                          is_aligned(p, 8) ? "" : " and misaligned");
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 16;
  opts.max_tables = 100000;
  opts.check_alignment = true;
  flatbuffers::Verifier verifier(p, size, opts);
  if (!fbb::VerifyMemoryBankTableBuffer(verifier))
    return bad_bank_table("it fails flatbuffer verification (identifier %s)",
                          fbb::MemoryBankTableBufferHasIdentifier(p) ? "ETMB" : "not ETMB");
  const fbb::MemoryBankTable* table = fbb::GetMemoryBankTable(p);
  const auto* methods = table->methods();
  const auto* plans = program->execution_plan();
  for (size_t i = 0; methods != nullptr && i < methods->size(); ++i) {
    const fbb::MethodBanks* m = methods->Get(flatbuffers::uoffset_t(i));
    if (m->method() == nullptr) return bad_bank_table("entry %zu names no method", i);
    for (size_t j = 0; j < i; ++j)
      if (strcmp(methods->Get(flatbuffers::uoffset_t(j))->method()->c_str(),
                 m->method()->c_str()) == 0)
        return bad_bank_table("method '%s' is listed twice", m->method()->c_str());
    const fb::ExecutionPlan* plan = nullptr;
    for (size_t k = 0; plans != nullptr && k < plans->size(); ++k) {
      const fb::ExecutionPlan* candidate = plans->Get(flatbuffers::uoffset_t(k));
      if (candidate->name() != nullptr &&
          strcmp(candidate->name()->c_str(), m->method()->c_str()) == 0)
        plan = candidate;
    }
    if (plan == nullptr)
      return bad_bank_table("it lists method '%s', which the program does not have",
                            m->method()->c_str());
    ETB_TRY(check_method_banks(plan, m));
  }
  return table;
}

}  // namespace

Result<Program> Program::load(const DataLoader* loader, bool verify_checksums) {
  const size_t file_size = loader->size();
  if (file_size < kHeaderOffset + 4)
    return fail(Error::InvalidProgram, "program is %zu bytes: too small to be a program",
                file_size);
  ETB_ASSIGN_OR_RETURN(const uint8_t* head,
                       loader->load(0, file_size < 64 ? file_size : size_t(64)));
  if (memcmp(head + 4, fb::ProgramIdentifier(), 4) != 0)
    return fail(Error::InvalidProgram,
                "not a program file: identifier '%.4s' at byte 4, expected 'ET12'",
                reinterpret_cast<const char*>(head + 4));
  size_t program_size = file_size;
  size_t segment_base = file_size;
  size_t segment_size = 0;
  if (file_size >= kHeaderOffset + kMinHeaderLength &&
      memcmp(head + kHeaderOffset, "eh00", 4) == 0) {
    const uint8_t* h = head + kHeaderOffset;
    uint32_t length = read_u32(h + 4);
    if (length < kMinHeaderLength || length > 56)
      return fail(Error::InvalidProgram, "extended header length %u is invalid", unsigned(length));
    uint64_t psize = read_u64(h + 8);
    uint64_t sbase = read_u64(h + 16);
    if (psize < kHeaderOffset + length || psize > file_size)
      return fail(Error::InvalidProgram,
                  "extended header: program size %llu does not fit the %zu-byte file",
                  (unsigned long long)psize, file_size);
    program_size = size_t(psize);
    uint64_t ssize = 0;
    if (length >= 32 && file_size >= kHeaderOffset + 32) {
      ssize = read_u64(h + 24);
    } else if (sbase <= file_size) {
      ssize = file_size - sbase;
    }
    if (sbase != 0 || ssize != 0) {
      if (sbase < psize || sbase > file_size || ssize > file_size - sbase)
        return fail(Error::InvalidProgram,
                    "extended header: segments [%llu, +%llu) do not fit the %zu-byte file "
                    "after the %zu-byte program",
                    (unsigned long long)sbase, (unsigned long long)ssize, file_size,
                    program_size);
      segment_base = size_t(sbase);
      segment_size = size_t(ssize);
    }
  }
  ETB_ASSIGN_OR_RETURN(const uint8_t* data, loader->load(0, program_size));
  if (!is_aligned(data, 16))
    return fail(Error::NotSupported, "program data must be 16-byte aligned");

  flatbuffers::Verifier::Options opts;
  opts.max_depth = 64;
  opts.max_tables = 100000000;
  opts.check_alignment = true;
  flatbuffers::Verifier verifier(data, program_size, opts);
  if (!fb::VerifyProgramBuffer(verifier))
    return fail(Error::InvalidProgram, "program flatbuffer failed verification (corrupt file)");
  const fb::Program* program = fb::GetProgram(data);
  ETB_TRY(check_vector_alignment(program));

  const uint8_t* segment_ptr = nullptr;
  if (segment_size > 0) {
    ETB_ASSIGN_OR_RETURN(segment_ptr, loader->load(segment_base, segment_size));
  }
  if (program->segments() != nullptr) {
    for (size_t i = 0; i < program->segments()->size(); ++i) {
      const fb::DataSegment* s = program->segments()->Get(flatbuffers::uoffset_t(i));
      uint64_t off = s->offset(), sz = s->size();
      if (off > segment_size || sz > segment_size - off)
        return fail(Error::InvalidProgram,
                    "segment %zu [%llu, +%llu) lies outside the %zu bytes of segment data", i,
                    (unsigned long long)off, (unsigned long long)sz, segment_size);
    }
  }
  if (program->execution_plan() == nullptr || program->execution_plan()->size() == 0)
    return fail(Error::InvalidProgram, "program has no methods");
  if (verify_checksums)
    ETB_TRY(verify_content(program, data, program_size, segment_ptr));
  ETB_ASSIGN_OR_RETURN(const fbb::MemoryBankTable* banks, load_bank_table(program, segment_ptr));
  return Program(loader, program, segment_ptr, segment_size, banks);
}

size_t Program::num_methods() const { return program_->execution_plan()->size(); }

Result<const char*> Program::method_name(size_t i) const {
  if (i >= num_methods())
    return fail(Error::OutOfBounds, "method %zu: program has %zu methods", i, num_methods());
  const fb::ExecutionPlan* plan = program_->execution_plan()->Get(flatbuffers::uoffset_t(i));
  if (plan->name() == nullptr) return fail(Error::InvalidProgram, "method %zu has no name", i);
  return plan->name()->c_str();
}

namespace {

// The verifier accepts a union whose type is set but whose value is absent; reject those
// once here so later code can dereference every union member it switches on.
Error check_unions(const fb::ExecutionPlan* plan) {
  if (plan->values()) {
    size_t i = 0;
    for (const fb::EValue* v : *plan->values()) {
      if (v->val_type() != fb::KernelTypes_NONE && v->val() == nullptr)
        return fail(Error::InvalidProgram, "value %zu has a type but no content", i);
      ++i;
    }
  }
  if (plan->chains()) {
    for (const fb::Chain* c : *plan->chains()) {
      if (!c->instructions()) continue;
      size_t i = 0;
      for (const fb::Instruction* in : *c->instructions()) {
        if (in->instr_args() == nullptr)
          return fail(Error::InvalidProgram, "instruction %zu has no arguments table", i);
        ++i;
      }
    }
  }
  return Error::Ok;
}

}  // namespace

Result<const fb::ExecutionPlan*> Program::find_plan(const char* name) const {
  for (size_t i = 0; i < num_methods(); ++i) {
    const fb::ExecutionPlan* plan = program_->execution_plan()->Get(flatbuffers::uoffset_t(i));
    if (plan->name() != nullptr && strcmp(plan->name()->c_str(), name) == 0) {
      ETB_TRY(check_unions(plan));
      return plan;
    }
  }
  return fail(Error::NotFound, "program has no method named '%s'", name);
}

MethodMeta Program::meta_of(const fb::ExecutionPlan* plan) const {
  const fbb::MethodBanks* entry = nullptr;
  if (banks_ != nullptr && banks_->methods() != nullptr && plan->name() != nullptr)
    for (const fbb::MethodBanks* m : *banks_->methods())
      if (strcmp(m->method()->c_str(), plan->name()->c_str()) == 0) entry = m;
  return MethodMeta(plan, entry);
}

Result<MethodMeta> Program::method_meta(const char* name) const {
  ETB_ASSIGN_OR_RETURN(const fb::ExecutionPlan* plan, find_plan(name));
  return meta_of(plan);
}

Result<Span<const uint8_t>> Program::segment(size_t index) const {
  const auto* segs = program_->segments();
  if (segs == nullptr || index >= segs->size())
    return fail(Error::InvalidProgram, "segment %zu does not exist", index);
  const fb::DataSegment* s = segs->Get(flatbuffers::uoffset_t(index));
  return Span<const uint8_t>(segment_base_ + s->offset(), size_t(s->size()));
}

Result<Span<const uint8_t>> Program::named_data(const char* key, size_t key_size) const {
  const auto* named = program_->named_data();
  if (named != nullptr) {
    for (const fb::NamedData* n : *named) {
      const flatbuffers::String* k = n->key();
      if (k != nullptr && k->size() == key_size && memcmp(k->data(), key, key_size) == 0)
        return segment(n->segment_index());
    }
  }
  return fail(Error::NotFound, "the program has no named data '%.*s'", int(key_size), key);
}

Result<const uint8_t*> Program::constant_data(uint32_t index, size_t nbytes,
                                              size_t align) const {
  const fb::SubsegmentOffsets* cs = program_->constant_segment();
  const uint8_t* p = nullptr;
  if (cs != nullptr && cs->offsets() != nullptr && cs->offsets()->size() > 0) {
    ETB_ASSIGN_OR_RETURN(p, subsegment_entry(cs, index, nbytes, "constant", "constant segment"));
  } else {
    const auto* bufs = program_->constant_buffer();
    if (bufs == nullptr || index >= bufs->size())
      return fail(Error::InvalidProgram, "constant %u does not exist", unsigned(index));
    const auto* storage = bufs->Get(index)->storage();
    if (storage == nullptr || storage->size() < nbytes)
      return fail(Error::InvalidProgram, "constant %u is smaller than its tensor",
                  unsigned(index));
    p = storage->data();
  }
  if (nbytes > 0 && !is_aligned(p, align))
    return fail(Error::InvalidProgram, "constant %u is misaligned", unsigned(index));
  return p;
}

Result<const uint8_t*> Program::mutable_data(uint32_t index, size_t nbytes) const {
  const auto* all = program_->mutable_data_segments();
  if (all == nullptr || all->size() == 0 || all->Get(0)->offsets() == nullptr)
    return fail(Error::InvalidProgram,
                "initial data %u: the program has no mutable data segment", unsigned(index));
  return subsegment_entry(all->Get(0), index, nbytes, "initial data", "mutable data segment");
}

Result<const uint8_t*> Program::subsegment_entry(const etbuild::schema::SubsegmentOffsets* sub,
                                                 uint32_t index, size_t nbytes,
                                                 const char* what, const char* where) const {
  ETB_ASSIGN_OR_RETURN(Span<const uint8_t> seg, segment(sub->segment_index()));
  if (index >= sub->offsets()->size())
    return fail(Error::InvalidProgram, "%s %u: the %s has %u entries", what, unsigned(index),
                where, unsigned(sub->offsets()->size()));
  uint64_t off = sub->offsets()->Get(index);
  if (off > seg.size() || nbytes > seg.size() - off)
    return fail(Error::InvalidProgram, "%s %u: %zu bytes at offset %llu exceed the %zu-byte segment",
                what, unsigned(index), nbytes, (unsigned long long)off, seg.size());
  return seg.data() + off;
}

// ---- MethodMeta ------------------------------------------------------------------------

const char* MethodMeta::name() const { return plan_->name() ? plan_->name()->c_str() : ""; }
size_t MethodMeta::num_inputs() const { return plan_->inputs() ? plan_->inputs()->size() : 0; }
size_t MethodMeta::num_outputs() const {
  return plan_->outputs() ? plan_->outputs()->size() : 0;
}

Result<TensorInfo> MethodMeta::value_tensor_info(int64_t index) const {
  const auto* values = plan_->values();
  if (values == nullptr || index < 0 || size_t(index) >= values->size())
    return fail(Error::InvalidProgram, "value %lld out of range", (long long)index);
  const fb::Tensor* t = values->Get(flatbuffers::uoffset_t(index))->val_as_Tensor();
  if (t == nullptr) return fail(Error::InvalidArgument, "value %lld is not a tensor",
                                (long long)index);
  TensorInfo info;
  if (!is_valid_scalar_type(int(t->scalar_type())))
    return fail(Error::InvalidProgram, "tensor has unknown dtype %d", int(t->scalar_type()));
  info.dtype = ScalarType(t->scalar_type());
  size_t dim = t->sizes() ? t->sizes()->size() : 0;
  if (dim > size_t(kMaxDim)) return fail(Error::NotSupported, "tensor has %zu dims", dim);
  info.dim = int(dim);
  for (size_t d = 0; d < dim; ++d) info.sizes[d] = t->sizes()->Get(flatbuffers::uoffset_t(d));
  info.dynamism = ShapeDynamism(uint8_t(t->shape_dynamism()) > 2 ? 0 : t->shape_dynamism());
  return info;
}

Result<TensorInfo> MethodMeta::input_tensor_info(size_t i) const {
  if (i >= num_inputs()) return fail(Error::OutOfBounds, "input %zu out of range", i);
  return value_tensor_info(plan_->inputs()->Get(flatbuffers::uoffset_t(i)));
}

Result<TensorInfo> MethodMeta::output_tensor_info(size_t i) const {
  if (i >= num_outputs()) return fail(Error::OutOfBounds, "output %zu out of range", i);
  return value_tensor_info(plan_->outputs()->Get(flatbuffers::uoffset_t(i)));
}

size_t MethodMeta::num_memory_banks() const {
  const auto* s = plan_->non_const_buffer_sizes();
  return s == nullptr || s->size() == 0 ? 0 : s->size() - 1;
}

Result<int64_t> MethodMeta::memory_bank_size(size_t i) const {
  if (i >= num_memory_banks())
    return fail(Error::OutOfBounds, "memory bank %zu: method plans %zu banks", i,
                num_memory_banks());
  int64_t v = plan_->non_const_buffer_sizes()->Get(flatbuffers::uoffset_t(i + 1));
  if (v < 0) return fail(Error::InvalidProgram, "memory bank %zu has negative size", i);
  return v;
}

Result<const char*> MethodMeta::memory_bank_name(size_t i) const {
  // Without a table: bank0, bank1, ... (up to bank99; a method rarely plans more than two).
  static constexpr auto kNames = [] {
    std::array<std::array<char, 8>, 100> t{};
    for (size_t k = 0; k < t.size(); ++k) {
      t[k] = {'b', 'a', 'n', 'k', 0, 0, 0, 0};
      if (k >= 10) {
        t[k][4] = char('0' + k / 10);
        t[k][5] = char('0' + k % 10);
      } else {
        t[k][4] = char('0' + k);
      }
    }
    return t;
  }();
  if (i >= num_memory_banks())
    return fail(Error::OutOfBounds, "memory bank %zu: method plans %zu banks", i,
                num_memory_banks());
  if (banks_ != nullptr) return banks_->banks()->Get(flatbuffers::uoffset_t(i))->name()->c_str();
  if (i >= kNames.size())
    return fail(Error::NotSupported, "memory bank %zu has no name (the program has no bank "
                "table, and unnamed banks are named up to bank%zu)", i, kNames.size() - 1);
  return static_cast<const char*>(kNames[i].data());
}

Result<size_t> MethodMeta::memory_bank_alignment(size_t i) const {
  if (i >= num_memory_banks())
    return fail(Error::OutOfBounds, "memory bank %zu: method plans %zu banks", i,
                num_memory_banks());
  if (banks_ == nullptr) return size_t(16);
  return size_t(banks_->banks()->Get(flatbuffers::uoffset_t(i))->alignment());
}

ScratchRegion MethodMeta::scratch_region() const {
  ScratchRegion r;
  if (banks_ == nullptr || banks_->scratch() == nullptr) return r;
  r.bank = banks_->scratch()->bank();
  r.offset = size_t(banks_->scratch()->offset());
  r.size = size_t(banks_->scratch()->size());
  return r;
}

size_t MethodMeta::num_instructions() const {
  size_t n = 0;
  if (plan_->chains())
    for (const fb::Chain* c : *plan_->chains())
      if (c->instructions()) n += c->instructions()->size();
  return n;
}

size_t MethodMeta::method_allocator_bytes() const {
  constexpr size_t pad = 16;
  size_t n = 256 + sizeof(MemoryAllocator) + pad;  // the scratch region's allocator
  size_t nvalues = plan_->values() ? plan_->values()->size() : 0;
  n += nvalues * sizeof(EValue) + pad;
  n += num_inputs() * (2 + sizeof(void*)) + 3 * pad;
  if (plan_->values()) {
    for (const fb::EValue* v : *plan_->values()) {
      switch (v->val_type()) {
        case fb::KernelTypes_Tensor: {
          const fb::Tensor* t = v->val_as_Tensor();
          size_t dim = t->sizes() ? t->sizes()->size() : 0;
          n += sizeof(Tensor) + dim * 17 + 4 * pad;
          break;
        }
        case fb::KernelTypes_IntList: {
          const auto* items = v->val_as_IntList()->items();
          n += sizeof(BoxedIntList) + (items ? items->size() : 0) * 16 + 3 * pad;
          break;
        }
        case fb::KernelTypes_BoolList: {
          const auto* items = v->val_as_BoolList()->items();
          n += (items ? items->size() : 0) + pad;
          break;
        }
        case fb::KernelTypes_TensorList: {
          const auto* items = v->val_as_TensorList()->items();
          n += (items ? items->size() : 0) * sizeof(void*) + pad;
          break;
        }
        case fb::KernelTypes_OptionalTensorList: {
          const auto* items = v->val_as_OptionalTensorList()->items();
          n += (items ? items->size() : 0) * sizeof(void*) + pad;
          break;
        }
        default:
          break;
      }
    }
  }
  if (plan_->operators()) {
    n += plan_->operators()->size() * (sizeof(KernelFn) + sizeof(char*)) + 2 * pad;
    for (const fb::Operator* op : *plan_->operators())
      n += (op->name() ? op->name()->size() : 0) + (op->overload() ? op->overload()->size() : 0) +
           2 + pad;
  }
  if (plan_->delegates()) {
    n += plan_->delegates()->size() * sizeof(Method::Delegate) + pad;
    for (const fb::BackendDelegate* d : *plan_->delegates()) {
      size_t args = d->compile_specs() ? d->compile_specs()->size() : 0;
      n += args * sizeof(CompileSpec) + pad;
    }
  }
  n += num_instructions() * sizeof(Method::Instr) + pad;
  if (plan_->chains())
    for (const fb::Chain* c : *plan_->chains())
      if (c->instructions())
        for (const fb::Instruction* in : *c->instructions()) {
          const flatbuffers::Vector<int32_t>* args = nullptr;
          if (in->instr_args_type() == fb::InstructionArguments_KernelCall)
            args = in->instr_args_as_KernelCall()->args();
          else if (in->instr_args_type() == fb::InstructionArguments_DelegateCall)
            args = in->instr_args_as_DelegateCall()->args();
          n += (args ? args->size() : 0) * sizeof(EValue*) + pad;
        }
  return n;
}

}  // namespace etb
