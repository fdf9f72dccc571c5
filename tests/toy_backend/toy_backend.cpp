// The toy delegate backend of the tests (partitioner.py writes its blobs): fp32 elementwise
// chains of add, sub, mul and relu, evaluated one element at a time in a register file.
#include <cstring>

#include "backend/backend.h"

namespace etb {
namespace {

constexpr size_t kMaxSlots = 256;

struct Step {
  uint32_t op, a, b, out;
};

// A blob read in place: the header fields, then pointers into the blob's sections.
struct ToyGraph {
  uint32_t inputs = 0, consts = 0, steps = 0, outputs = 0;
  uint64_t numel = 0;
};

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

// Checks the whole blob; on success `g` holds its header.
Error parse(Span<const uint8_t> blob, ToyGraph* g) {
  const uint8_t* p = blob.data();
  size_t left = blob.size();
  if (left < 28 || memcmp(p, "ETOY", 4) != 0)
    return fail(Error::InvalidProgram, "toy: the blob is not an ETOY graph");
  g->inputs = read_u32(p + 4);
  g->consts = read_u32(p + 8);
  g->steps = read_u32(p + 12);
  g->outputs = read_u32(p + 16);
  g->numel = read_u64(p + 20);
  p += 28;
  left -= 28;
  const uint64_t slots = uint64_t(g->inputs) + g->consts + g->steps;
  if (slots > kMaxSlots || g->numel == 0)
    return fail(Error::InvalidProgram, "toy: %llu slots (at most %zu), %llu elements",
                (unsigned long long)slots, kMaxSlots, (unsigned long long)g->numel);
  for (uint32_t c = 0; c < g->consts; ++c) {
    if (left < 8) return fail(Error::InvalidProgram, "toy: constant %u is cut off", c);
    const uint64_t n = read_u64(p);
    if ((n != 1 && n != g->numel) || (left - 8) / 4 < n)
      return fail(Error::InvalidProgram, "toy: constant %u has %llu elements", c,
                  (unsigned long long)n);
    p += 8 + 4 * n;
    left -= 8 + 4 * n;
  }
  if (left != uint64_t(g->steps) * sizeof(Step) + uint64_t(g->outputs) * 4)
    return fail(Error::InvalidProgram, "toy: the blob's steps and outputs take %zu bytes", left);
  for (uint32_t s = 0; s < g->steps; ++s) {
    const uint32_t defined = g->inputs + g->consts + s;  // slots before this step's result
    const uint32_t op = read_u32(p), a = read_u32(p + 4), b = read_u32(p + 8);
    if (op > 3 || a >= defined || b >= defined || read_u32(p + 12) != defined)
      return fail(Error::InvalidProgram, "toy: step %u is malformed", s);
    p += sizeof(Step);
  }
  for (uint32_t o = 0; o < g->outputs; ++o)
    if (read_u32(p + 4 * o) >= slots)
      return fail(Error::InvalidProgram, "toy: output %u names no slot", o);
  return Error::Ok;
}

class ToyBackend final : public Backend {
 public:
  bool is_available() const override { return true; }

  // The handle is the (checked) blob itself: the backend keeps no state of its own.
  Result<void*> init(BackendInitContext&, Span<const uint8_t> processed,
                     Span<const CompileSpec>) const override {
    ToyGraph g;
    ETB_TRY(parse(processed, &g));
    return const_cast<uint8_t*>(processed.data());
  }

  Error execute(BackendExecuteContext&, void* handle, Span<EValue*> args) const override {
    const uint8_t* p = static_cast<const uint8_t*>(handle);
    ToyGraph g;
    g.inputs = read_u32(p + 4);
    g.consts = read_u32(p + 8);
    g.steps = read_u32(p + 12);
    g.outputs = read_u32(p + 16);
    g.numel = read_u64(p + 20);
    if (args.size() != size_t(g.inputs) + g.outputs)
      return fail(Error::InvalidArgument, "toy: %zu arguments, expected %u", args.size(),
                  g.inputs + g.outputs);
    const float* src[kMaxSlots];
    bool scalar[kMaxSlots] = {};
    for (uint32_t i = 0; i < g.inputs + g.outputs; ++i) {
      if (!args[i]->is_tensor() || args[i]->to_tensor().dtype() != ScalarType::Float)
        return fail(Error::InvalidArgument, "toy: argument %u is not a Float tensor", i);
      const int64_t n = args[i]->to_tensor().numel();
      if (uint64_t(n) != g.numel && !(i < g.inputs && n == 1))
        return fail(Error::InvalidArgument, "toy: argument %u has %lld elements, expected %llu",
                    i, (long long)n, (unsigned long long)g.numel);
      if (i < g.inputs) {
        src[i] = args[i]->to_tensor().data_as<float>();
        scalar[i] = n == 1 && g.numel != 1;
      }
    }
    const uint8_t* q = p + 28;
    for (uint32_t c = 0; c < g.consts; ++c) {
      const uint64_t n = read_u64(q);
      src[g.inputs + c] = reinterpret_cast<const float*>(q + 8);
      scalar[g.inputs + c] = n == 1 && g.numel != 1;
      q += 8 + 4 * n;
    }
    const uint8_t* steps = q;
    const uint8_t* outs = q + g.steps * sizeof(Step);
    const uint32_t loaded = g.inputs + g.consts;
    float r[kMaxSlots];
    for (uint64_t e = 0; e < g.numel; ++e) {
      for (uint32_t k = 0; k < loaded; ++k) {  // constants may be unaligned in the blob
        memcpy(&r[k], src[k] + (scalar[k] ? 0 : e), 4);
      }
      for (uint32_t s = 0; s < g.steps; ++s) {
        const uint8_t* st = steps + s * sizeof(Step);
        const float a = r[read_u32(st + 4)], b = r[read_u32(st + 8)];
        float v = 0;
        switch (read_u32(st)) {
          case 0: v = a + b; break;
          case 1: v = a - b; break;
          case 2: v = a * b; break;
          default: v = a > 0.f ? a : (a != a ? a : 0.f); break;  // relu keeps NaN
        }
        r[loaded + s] = v;
      }
      for (uint32_t o = 0; o < g.outputs; ++o)
        args[g.inputs + o]->to_tensor().data_as<float>()[e] = r[read_u32(outs + 4 * o)];
    }
    return Error::Ok;
  }

  void destroy(void*) const override {}
};

const ToyBackend kToyBackend;

}  // namespace

Error register_toy_backend() {
  return register_backend("EtbToyBackend", &kToyBackend);
}

}  // namespace etb
