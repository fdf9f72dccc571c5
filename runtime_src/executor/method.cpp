#include "executor/method.h"

#include <cstdio>
#include <cstring>
#include <new>

#include "executor/program.h"
#include "platform/platform.h"
#include "program_generated.h"

namespace fb = etbuild::schema;

namespace etb {
namespace {

using flatbuffers::uoffset_t;

Error out_of_memory(const char* what) {
  return fail(Error::MemoryAllocationFailed,
              "method allocator too small while allocating %s (size it with "
              "MethodMeta::method_allocator_bytes())",
              what);
}

struct InitState {
  const Program* program;
  const fb::ExecutionPlan* plan;
  const MemoryManager* memory;
  MemoryAllocator* alloc;
  size_t num_values;
  size_t num_banks;
};

Error init_tensor(InitState& st, size_t index, const fb::Tensor* t, EValue* out) {
  if (!is_valid_scalar_type(int(t->scalar_type())))
    return fail(Error::InvalidProgram, "value %zu: unknown dtype code %d", index,
                int(t->scalar_type()));
  ScalarType dtype = ScalarType(t->scalar_type());
  if (t->storage_offset() != 0)
    return fail(Error::NotSupported, "value %zu: storage_offset %d is not 0", index,
                int(t->storage_offset()));
  uint8_t dyn = uint8_t(t->shape_dynamism());
  if (dyn > 1)
    return fail(Error::NotSupported, "value %zu: DYNAMIC_UNBOUND tensors are not supported",
                index);
  size_t dim = t->sizes() ? t->sizes()->size() : 0;
  if (dim > size_t(kMaxDim))
    return fail(Error::NotSupported, "value %zu: %zu dims (max %d)", index, dim, kMaxDim);
  size_t order_len = t->dim_order() ? t->dim_order()->size() : 0;
  if (order_len != dim && !(order_len == 0))
    return fail(Error::InvalidProgram, "value %zu: dim_order has %zu entries for %zu dims",
                index, order_len, dim);
  int64_t* sizes = st.alloc->allocate_array<int64_t>(dim);
  uint8_t* order = st.alloc->allocate_array<uint8_t>(dim);
  Tensor* tensor = st.alloc->allocate_array<Tensor>(1);
  if (sizes == nullptr || order == nullptr || tensor == nullptr) return out_of_memory("tensor");
  uint64_t numel = 1;
  uint32_t seen = 0;
  for (size_t d = 0; d < dim; ++d) {
    int32_t s = t->sizes()->Get(uoffset_t(d));
    if (s < 0) return fail(Error::InvalidProgram, "value %zu: negative size %d", index, int(s));
    sizes[d] = s;
    numel *= uint64_t(s);
    if (numel > (uint64_t(1) << 40))
      return fail(Error::InvalidProgram, "value %zu: tensor too large", index);
    uint8_t o = order_len ? t->dim_order()->Get(uoffset_t(d)) : uint8_t(d);
    if (o >= dim || (seen & (1u << o)))
      return fail(Error::InvalidProgram, "value %zu: dim_order is not a permutation", index);
    seen |= 1u << o;
    order[d] = o;
  }
  size_t esize = element_size(dtype);
  size_t nbytes = size_t(numel) * esize;
  void* data = nullptr;
  size_t capacity = 0;
  bool read_only = false;
  if (t->data_buffer_idx() > 0 && t->allocation_info() == nullptr) {
    ETB_ASSIGN_OR_RETURN(const uint8_t* p,
                         st.program->constant_data(t->data_buffer_idx(), nbytes, esize));
    data = const_cast<uint8_t*>(p);  // marked read-only below; kernels refuse to write it
    capacity = nbytes;
    read_only = true;
  } else if (t->allocation_info() != nullptr) {
    const fb::AllocationDetails* a = t->allocation_info();
    uint32_t id = a->memory_id();
    if (id == 0 || id > st.num_banks)
      return fail(Error::InvalidProgram, "value %zu: memory id %u, method has %zu banks", index,
                  unsigned(id), st.num_banks);
    uint64_t offset = (uint64_t(a->memory_offset_high()) << 32) | a->memory_offset_low();
    int64_t planned = st.plan->non_const_buffer_sizes()->Get(id);
    if (offset > uint64_t(planned) || nbytes > uint64_t(planned) - offset)
      return fail(Error::InvalidProgram,
                  "value %zu: %zu bytes at offset %llu exceed bank %u's %lld planned bytes",
                  index, nbytes, (unsigned long long)offset, unsigned(id - 1),
                  (long long)planned);
    uint8_t* base = st.memory->banks[id - 1].data();
    data = base + offset;
    if (nbytes > 0 && (reinterpret_cast<uintptr_t>(data) % esize) != 0)
      return fail(Error::InvalidProgram, "value %zu: offset %llu is misaligned for %s", index,
                  (unsigned long long)offset, scalar_type_name(dtype));
    capacity = nbytes;
    if (t->data_buffer_idx() > 0) {
      // Planned, with initial data: a constant copied at load into a faster bank. It stays
      // a constant (read-only) for the kernels and the prepare hooks.
      ETB_ASSIGN_OR_RETURN(const uint8_t* src,
                           st.program->mutable_data(t->data_buffer_idx(), nbytes));
      if (nbytes > 0) std::memcpy(data, src, nbytes);
      read_only = true;
    }
  }
  new (tensor) Tensor(dtype, int(dim), sizes, order, data, capacity, ShapeDynamism(dyn));
  tensor->set_read_only(read_only);
  *out = EValue(tensor);
  return Error::Ok;
}

Error check_value_index(const InitState& st, int64_t v, const char* what) {
  if (v < 0 || uint64_t(v) >= st.num_values)
    return fail(Error::InvalidProgram, "%s refers to value %lld; method has %zu values", what,
                (long long)v, st.num_values);
  return Error::Ok;
}

// Lists refer to other values; they are built after every scalar and tensor exists.
Error init_list(InitState& st, size_t index, const fb::EValue* ev, EValue* values) {
  switch (ev->val_type()) {
    case fb::KernelTypes_IntList: {
      const auto* items = ev->val_as_IntList()->items();
      size_t n = items ? items->size() : 0;
      BoxedIntList* l = st.alloc->allocate_array<BoxedIntList>(1);
      EValue** elems = st.alloc->allocate_array<EValue*>(n);
      int64_t* unboxed = st.alloc->allocate_array<int64_t>(n);
      if (!l || !elems || !unboxed) return out_of_memory("int list");
      for (size_t i = 0; i < n; ++i) {
        int64_t v = items->Get(uoffset_t(i));
        ETB_TRY(check_value_index(st, v, "int list"));
        if (!values[v].is_int())
          return fail(Error::InvalidProgram, "value %zu: int list item %lld is a %s", index,
                      (long long)v, tag_name(values[v].tag()));
        elems[i] = &values[v];
      }
      l->items = elems;
      l->unboxed = unboxed;
      l->size = n;
      values[index] = EValue::int_list(l);
      return Error::Ok;
    }
    case fb::KernelTypes_DoubleList: {
      const auto* items = ev->val_as_DoubleList()->items();
      values[index] = EValue::double_list(items ? items->data() : nullptr,
                                          items ? items->size() : 0);
      return Error::Ok;
    }
    case fb::KernelTypes_BoolList: {
      const auto* items = ev->val_as_BoolList()->items();
      size_t n = items ? items->size() : 0;
      bool* b = st.alloc->allocate_array<bool>(n);
      if (!b) return out_of_memory("bool list");
      for (size_t i = 0; i < n; ++i) b[i] = items->Get(uoffset_t(i)) != 0;
      values[index] = EValue::bool_list(b, n);
      return Error::Ok;
    }
    case fb::KernelTypes_TensorList:
    case fb::KernelTypes_OptionalTensorList: {
      bool optional = ev->val_type() == fb::KernelTypes_OptionalTensorList;
      const auto* items = optional ? ev->val_as_OptionalTensorList()->items()
                                   : ev->val_as_TensorList()->items();
      size_t n = items ? items->size() : 0;
      Tensor** ts = st.alloc->allocate_array<Tensor*>(n);
      if (!ts) return out_of_memory("tensor list");
      for (size_t i = 0; i < n; ++i) {
        int32_t v = items->Get(uoffset_t(i));
        ETB_TRY(check_value_index(st, v, "tensor list"));
        if (values[v].is_tensor()) {
          ts[i] = values[v].tensor_ptr();
        } else if (optional && values[v].is_none()) {
          ts[i] = nullptr;
        } else {
          return fail(Error::InvalidProgram, "value %zu: tensor list item %d is a %s", index,
                      int(v), tag_name(values[v].tag()));
        }
      }
      values[index] = EValue::tensor_list(ts, n, optional);
      return Error::Ok;
    }
    default:
      return Error::Ok;
  }
}

Error resolve_args(InitState& st, const flatbuffers::Vector<int32_t>* args, EValue* values,
                   Method::Instr* out) {
  size_t n = args ? args->size() : 0;
  EValue** a = st.alloc->allocate_array<EValue*>(n);
  if (!a) return out_of_memory("instruction arguments");
  for (size_t i = 0; i < n; ++i) {
    int32_t v = args->Get(uoffset_t(i));
    ETB_TRY(check_value_index(st, v, "instruction argument"));
    a[i] = &values[v];
  }
  out->args = a;
  out->num_args = uint32_t(n);
  return Error::Ok;
}

// True when kernel call `in` reads a value that a move instruction writes: that value's type
// and dtype are only known when the move has run.
bool reads_moved_value(const Method::Instr* instrs, size_t n, const Method::Instr& in,
                       const EValue* values) {
  for (size_t i = 0; i < n; ++i) {
    if (instrs[i].kind != Method::Kind::Move) continue;
    for (uint32_t k = 0; k < in.num_args; ++k)
      if (in.args[k] == &values[instrs[i].b]) return true;
  }
  return false;
}

// Runs each kernel call's generated argument check (value types, dtypes this runtime is built
// with, tensor layout) once, so that a program needing a kernel path the build left out fails
// at load, with every distinct problem in one message (the first instruction of each). Calls
// reading a moved value are checked when they run (the boxed kernel runs the same check before
// every call).
Error check_kernel_calls(const char* method, const Method::Instr* instrs, size_t n,
                         const char* const* op_names, const EValue* values) {
  bool has_moves = false;
  for (size_t i = 0; i < n; ++i) has_moves = has_moves || instrs[i].kind == Method::Kind::Move;
  char problems[1024];
  size_t len = 0, num_failed = 0, num_listed = 0;
  Error first = Error::Ok;
  problems[0] = '\0';
  for (size_t i = 0; i < n; ++i) {
    const Method::Instr& in = instrs[i];
    if (in.kind != Method::Kind::Kernel) continue;
    if (has_moves && reads_moved_value(instrs, n, in, values)) continue;
    const Kernel* k = find_kernel_entry(op_names[in.a]);
    if (k == nullptr || k->check == nullptr) continue;
    Error e = k->check(Span<EValue*>(in.args, in.num_args), /*at_load=*/true);
    if (e == Error::Ok) continue;
    ++num_failed;
    if (first == Error::Ok) first = e;
    const char* msg = last_error_message();
    if (strstr(problems, msg) != nullptr) continue;  // the same problem at another call
    ++num_listed;
    int w = format(problems + len, sizeof(problems) - len, "%sinstruction %zu: %s",
                     len ? "; " : "", i, msg);
    if (w > 0) len = len + size_t(w) < sizeof(problems) ? len + size_t(w) : sizeof(problems) - 1;
  }
  if (num_failed == 0) return Error::Ok;
  if (num_failed == num_listed) return fail(first, "method '%s': %s", method, problems);
  return fail(first, "method '%s': %s (%zu kernel calls in all)", method, problems, num_failed);
}

// ---- load-time preparation -------------------------------------------------------------
// Runs the prepare hook of every kernel call that has one, each over its own part of `memory`
// (nullptr: the sizing pass, where the hooks only count), and sets `*bytes` to the total
// taken. In the filling pass each call's `prepared` points at its part, or is nullptr when
// the hook took nothing. Calls reading a moved value are left alone: their arguments can
// change between calls.
Error run_prepare_hooks(Method::Instr* instrs, size_t n, const char* const* op_names,
                        const EValue* values, uint8_t* memory, size_t capacity, size_t* bytes) {
  bool has_moves = false;
  for (size_t i = 0; i < n; ++i) has_moves = has_moves || instrs[i].kind == Method::Kind::Move;
  size_t used = 0;
  for (size_t i = 0; i < n; ++i) {
    Method::Instr& in = instrs[i];
    if (in.kind != Method::Kind::Kernel) continue;
    const Kernel* k = find_kernel_entry(op_names[in.a]);
    if (k == nullptr || k->prepare == nullptr) continue;
    if (has_moves && reads_moved_value(instrs, n, in, values)) continue;
    const bool fill = memory != nullptr && used <= capacity;
    PrepareContext pctx(fill ? memory + used : nullptr, fill ? capacity - used : 0);
    Error e = k->prepare(pctx, Span<EValue*>(in.args, in.num_args));
    if (e != Error::Ok) {
      prefix_error_message("instruction %zu (%s): preparing: ", i, op_names[in.a]);
      return e;
    }
    if (memory != nullptr) in.prepared = pctx.used() > 0 ? memory + used : nullptr;
    used += pctx.used();
  }
  *bytes = used;
  return Error::Ok;
}

// ---- activation fusion -------------------------------------------------------------------
// A relu, hardtanh or clamp that directly follows a kernel registered with fuses_clamp, and
// reads only that kernel's output, is applied in the kernel's epilogue: the kernel writes the
// activation's output tensor, clamped, and the activation instruction becomes Fused. The
// result is the same, bit for bit; one pass over the tensor in memory is saved.

// The clamp of activation call `act` ([self, scalars..., out, return]), or false when it is not
// a fusable activation with constant bounds.
bool activation_clamp(const char* op, const Method::Instr& act, OutputClamp* clamp) {
  auto bound = [](const EValue* v, float* out) {
    if (v->is_none()) return true;
    if (v->is_double()) *out = float(v->to_double());
    else if (v->is_int()) *out = float(v->to_int());
    else return false;
    return true;
  };
  OutputClamp c;
  if (strcmp(op, "aten::relu.out") == 0 && act.num_args == 3) {
    c.lo = 0.f;
  } else if ((strcmp(op, "aten::hardtanh.out") == 0 || strcmp(op, "aten::clamp.out") == 0) &&
             act.num_args == 5) {
    if (!bound(act.args[1], &c.lo) || !bound(act.args[2], &c.hi)) return false;
    if (strcmp(op, "aten::hardtanh.out") == 0 && (act.args[1]->is_none() || act.args[2]->is_none()))
      return false;
    if (!(c.lo <= c.hi)) return false;  // clamp's min > max rule: leave it to the kernel
  } else {
    return false;
  }
  *clamp = c;
  return true;
}

// True when value v is one of the `num` values listed in `ids` (method inputs or outputs).
bool is_listed(const EValue* v, const EValue* values, const int32_t* ids, size_t num) {
  for (size_t i = 0; i < num; ++i)
    if (&values[ids[i]] == v) return true;
  return false;
}

// How many times an instruction names value v.
size_t uses_of(const EValue* v, const Method::Instr* instrs, size_t n, const EValue* values) {
  size_t uses = 0;
  for (size_t i = 0; i < n; ++i) {
    const Method::Instr& in = instrs[i];
    if (in.kind == Method::Kind::Move || in.kind == Method::Kind::JumpFalse ||
        in.kind == Method::Kind::Free) {
      uses += &values[in.a] == v;
      if (in.kind == Method::Kind::Move) uses += &values[in.b] == v;
      continue;
    }
    for (uint32_t k = 0; k < in.num_args; ++k) uses += in.args[k] == v;
  }
  return uses;
}

void fuse_activations(Method::Instr* instrs, size_t n, const char* const* op_names,
                      const EValue* values, const int32_t* inputs, size_t num_inputs,
                      const int32_t* outputs, size_t num_outputs) {
  for (size_t i = 0; i + 1 < n; ++i) {
    Method::Instr& k = instrs[i];
    Method::Instr& act = instrs[i + 1];
    if (k.kind != Method::Kind::Kernel || act.kind != Method::Kind::Kernel) continue;
    const Kernel* entry = find_kernel_entry(op_names[k.a]);
    OutputClamp clamp;
    if (entry == nullptr || !entry->fuses_clamp || k.num_args < 2 ||
        !activation_clamp(op_names[act.a], act, &clamp))
      continue;
    EValue* out = k.args[k.num_args - 2];
    EValue* act_out = act.args[act.num_args - 2];
    if (k.args[k.num_args - 1] != out || act.args[act.num_args - 1] != act_out ||
        act.args[0] != out || !out->is_tensor() || !act_out->is_tensor() ||
        out->to_tensor().dtype() != ScalarType::Float ||
        act_out->to_tensor().dtype() != ScalarType::Float ||
        act_out->to_tensor().data() == nullptr)
      continue;
    // The kernel's output must be read by the activation alone (out + return + self), no jump
    // may land on the activation, and a bound taken from a value must not change at run time.
    if (uses_of(out, instrs, n, values) != 3 || is_listed(out, values, inputs, num_inputs) ||
        is_listed(out, values, outputs, num_outputs))
      continue;
    bool ok = true;
    for (size_t j = 0; j < n && ok; ++j)
      ok = !(instrs[j].kind == Method::Kind::JumpFalse && size_t(instrs[j].b) == i + 1) &&
           !(instrs[j].kind == Method::Kind::Move &&
             (&values[instrs[j].b] == act.args[1] || &values[instrs[j].b] == act.args[2]));
    if (act.num_args == 5)
      ok = ok && !is_listed(act.args[1], values, inputs, num_inputs) &&
           !is_listed(act.args[2], values, inputs, num_inputs);
    // The activation's output was planned to live from the activation on; the kernel now
    // writes it while reading its own arguments, so it must not share memory with them
    // (unless it is the kernel's own output, written in place).
    const Tensor& dst = act_out->to_tensor();
    const bool own_output = dst.data() == out->to_tensor().data();
    for (uint32_t a = 0; a + 2 < k.num_args && ok && !own_output; ++a) {
      const EValue* v = k.args[a];
      if (v->is_tensor()) ok = !overlaps(v->to_tensor(), dst);
      else if (v->is_tensor_list()) ok = false;
    }
    if (!ok) continue;
    k.args[k.num_args - 2] = act_out;
    k.args[k.num_args - 1] = act_out;
    k.clamp = clamp;
    act.kind = Method::Kind::Fused;
  }
}

}  // namespace

Result<Method> Program::load_method(const char* name, const MemoryManager& memory) const {
  ETB_ASSIGN_OR_RETURN(const fb::ExecutionPlan* plan, find_plan(name));
  if (memory.method_allocator == nullptr)
    return fail(Error::InvalidArgument, "load_method: no method allocator");
  Method m;
  InitState st{this, plan, &memory, memory.method_allocator, 0, 0};

  // Memory banks: the caller's buffers must cover every planned size.
  const MethodMeta meta = meta_of(plan);
  st.num_banks = meta.num_memory_banks();
  if (memory.banks.size() < st.num_banks)
    return fail(Error::InvalidArgument, "method '%s' plans %zu memory banks, %zu were given",
                name, st.num_banks, memory.banks.size());
  for (size_t b = 0; b < st.num_banks; ++b) {
    ETB_ASSIGN_OR_RETURN(int64_t planned, meta.memory_bank_size(b));
    ETB_ASSIGN_OR_RETURN(const char* bank, meta.memory_bank_name(b));
    ETB_ASSIGN_OR_RETURN(size_t align, meta.memory_bank_alignment(b));
    if (align < 16) align = 16;  // the tensors' own alignment
    if (memory.banks[b].size() < uint64_t(planned))
      return fail(Error::MemoryAllocationFailed,
                  "memory bank %zu ('%s'): buffer has %zu bytes, method '%s' plans %lld", b, bank,
                  memory.banks[b].size(), name, (long long)planned);
    if (planned > 0 && (memory.banks[b].data() == nullptr ||
                        reinterpret_cast<uintptr_t>(memory.banks[b].data()) % align != 0))
      return fail(Error::InvalidArgument,
                  "memory bank %zu ('%s'): buffer must be %zu-byte aligned", b, bank, align);
  }

  // Values: scalars and tensors first, lists second.
  const auto* fvalues = plan->values();
  st.num_values = fvalues ? fvalues->size() : 0;
  EValue* values = st.alloc->allocate_array<EValue>(st.num_values);
  if (!values) return out_of_memory("values");
  for (size_t i = 0; i < st.num_values; ++i) {
    const fb::EValue* ev = fvalues->Get(uoffset_t(i));
    EValue* v = new (&values[i]) EValue();
    switch (ev->val_type()) {
      case fb::KernelTypes_NONE:
      case fb::KernelTypes_Null:
        break;
      case fb::KernelTypes_Int:
        *v = EValue(int64_t(ev->val_as_Int()->int_val()));
        break;
      case fb::KernelTypes_Bool:
        *v = EValue(bool(ev->val_as_Bool()->bool_val()));
        break;
      case fb::KernelTypes_Double:
        *v = EValue(ev->val_as_Double()->double_val());
        break;
      case fb::KernelTypes_String: {
        const auto* s = ev->val_as_String()->string_val();
        *v = EValue::string(s ? s->c_str() : "", s ? s->size() : 0);
        break;
      }
      case fb::KernelTypes_Tensor: {
        Error e = init_tensor(st, i, ev->val_as_Tensor(), v);
        if (e != Error::Ok) return e;
        break;
      }
      case fb::KernelTypes_IntList:
      case fb::KernelTypes_DoubleList:
      case fb::KernelTypes_BoolList:
      case fb::KernelTypes_TensorList:
      case fb::KernelTypes_OptionalTensorList:
        break;
      default:
        return fail(Error::InvalidProgram, "value %zu has unknown type %d", i,
                    int(ev->val_type()));
    }
  }
  for (size_t i = 0; i < st.num_values; ++i) {
    Error e = init_list(st, i, fvalues->Get(uoffset_t(i)), values);
    if (e != Error::Ok) return e;
  }
  m.values_ = values;
  m.num_values_ = st.num_values;

  // Inputs and outputs.
  const auto* ins = plan->inputs();
  const auto* outs = plan->outputs();
  m.num_inputs_ = ins ? ins->size() : 0;
  m.num_outputs_ = outs ? outs->size() : 0;
  for (size_t i = 0; i < m.num_inputs_; ++i)
    ETB_TRY(check_value_index(st, ins->Get(uoffset_t(i)), "method input"));
  for (size_t i = 0; i < m.num_outputs_; ++i)
    ETB_TRY(check_value_index(st, outs->Get(uoffset_t(i)), "method output"));
  m.inputs_ = ins ? ins->data() : nullptr;
  m.outputs_ = outs ? outs->data() : nullptr;
  m.input_set_ = st.alloc->allocate_array<bool>(m.num_inputs_);
  m.input_bounds_ = st.alloc->allocate_array<const int64_t*>(m.num_inputs_);
  m.input_planned_ = st.alloc->allocate_array<bool>(m.num_inputs_);
  if (!m.input_set_ || !m.input_bounds_ || !m.input_planned_) return out_of_memory("inputs");
  for (size_t i = 0; i < m.num_inputs_; ++i) {
    const EValue& v = values[m.inputs_[i]];
    // Planned tensors keep their last contents; others must be set before execute().
    m.input_set_[i] = !(v.is_tensor() && v.to_tensor().data() == nullptr &&
                        v.to_tensor().numel() > 0);
    m.input_bounds_[i] = nullptr;
    m.input_planned_[i] = v.is_tensor() && v.to_tensor().data() != nullptr;
    if (v.is_tensor()) {
      const Tensor& t = v.to_tensor();
      int64_t* b = st.alloc->allocate_array<int64_t>(size_t(t.dim()));
      if (!b) return out_of_memory("input bounds");
      for (int d = 0; d < t.dim(); ++d) b[d] = t.size(d);
      m.input_bounds_[i] = b;
    }
  }

  // Operators: resolve all, report every missing one at once.
  const auto* ops = plan->operators();
  m.num_ops_ = ops ? ops->size() : 0;
  m.kernels_ = st.alloc->allocate_array<KernelFn>(m.num_ops_);
  m.op_names_ = st.alloc->allocate_array<const char*>(m.num_ops_);
  if (!m.kernels_ || !m.op_names_) return out_of_memory("operators");
  char missing[1024];
  size_t missing_len = 0, num_missing = 0;
  missing[0] = '\0';
  for (size_t i = 0; i < m.num_ops_; ++i) {
    const fb::Operator* op = ops->Get(uoffset_t(i));
    const char* opname = op->name() ? op->name()->c_str() : "";
    const char* overload = op->overload() ? op->overload()->c_str() : "";
    size_t len = strlen(opname) + strlen(overload) + 2;
    char* full = st.alloc->allocate_array<char>(len);
    if (!full) return out_of_memory("operator names");
    snprintf(full, len, overload[0] ? "%s.%s" : "%s", opname, overload);
    m.op_names_[i] = full;
    m.kernels_[i] = find_kernel(full);
    if (m.kernels_[i] == nullptr) {
      bool dup = false;
      for (size_t j = 0; j < i; ++j) dup = dup || strcmp(m.op_names_[j], full) == 0;
      if (dup) continue;
      ++num_missing;
      int w = snprintf(missing + missing_len, sizeof(missing) - missing_len, "%s%s",
                       missing_len ? ", " : "", full);
      if (w > 0) missing_len = missing_len + size_t(w) < sizeof(missing) ? missing_len + size_t(w)
                                                                         : sizeof(missing) - 1;
    }
  }
  if (num_missing > 0)
    return fail(Error::NotFound, "method '%s': %zu operator(s) have no kernel: %s", name,
                num_missing, missing);

  // Delegates.
  const auto* dels = plan->delegates();
  size_t num_dels = dels ? dels->size() : 0;
  m.delegates_ = st.alloc->allocate_array<Method::Delegate>(num_dels);
  if (!m.delegates_) return out_of_memory("delegates");
  for (size_t i = 0; i < num_dels; ++i) {
    const fb::BackendDelegate* d = dels->Get(uoffset_t(i));
    const char* id = d->id() ? d->id()->c_str() : "";
    const Backend* backend = find_backend(id, d->id() ? d->id()->size() : 0);
    if (backend == nullptr)
      return fail(Error::NotFound,
                  "delegate %zu: no backend '%s' is registered in this runtime; run the "
                  "program on a runtime built for it (etbuild links the backends a program's "
                  "partitioner used)",
                  i, id);
    if (!backend->is_available())
      return fail(Error::NotSupported, "delegate %zu: backend '%s' is not available", i, id);
    const fb::BackendDelegateDataReference* ref = d->processed();
    if (ref == nullptr) return fail(Error::InvalidProgram, "delegate %zu has no data", i);
    Span<const uint8_t> blob;
    if (ref->location() == fb::DataLocation_INLINE) {
      const auto* inl = program_->backend_delegate_data();
      if (inl == nullptr || ref->index() >= inl->size() || inl->Get(ref->index())->data() == nullptr)
        return fail(Error::InvalidProgram, "delegate %zu: inline data %u missing", i,
                    unsigned(ref->index()));
      const auto* data = inl->Get(ref->index())->data();
      blob = Span<const uint8_t>(data->data(), data->size());
    } else if (ref->location() == fb::DataLocation_SEGMENT) {
      ETB_ASSIGN_OR_RETURN(blob, segment(ref->index()));
    } else {
      return fail(Error::InvalidProgram, "delegate %zu: unknown data location", i);
    }
    size_t nspecs = d->compile_specs() ? d->compile_specs()->size() : 0;
    CompileSpec* specs = st.alloc->allocate_array<CompileSpec>(nspecs);
    if (!specs) return out_of_memory("compile specs");
    for (size_t s = 0; s < nspecs; ++s) {
      const fb::CompileSpec* cs = d->compile_specs()->Get(uoffset_t(s));
      specs[s] = CompileSpec{cs->key() ? cs->key()->c_str() : "", cs->key() ? cs->key()->size() : 0,
                             cs->value() ? cs->value()->data() : nullptr,
                             cs->value() ? cs->value()->size() : 0};
    }
    BackendInitContext ctx{st.alloc, this};
    Result<void*> handle = backend->init(ctx, blob, Span<const CompileSpec>(specs, nspecs));
    if (!handle.ok()) {
      prefix_error_message("delegate %zu (%s): ", i, id);
      return handle.error();
    }
    m.delegates_[i] = Method::Delegate{backend, handle.value()};
    m.num_delegates_ = i + 1;
  }

  // Instructions of every chain, in order.
  size_t total = meta.num_instructions();
  m.instrs_ = st.alloc->allocate_array<Method::Instr>(total);
  if (!m.instrs_) return out_of_memory("instructions");
  size_t pc = 0;
  if (plan->chains()) {
    for (const fb::Chain* chain : *plan->chains()) {
      if (!chain->instructions()) continue;
      for (const fb::Instruction* in : *chain->instructions()) {
        Method::Instr& out = m.instrs_[pc];
        out = Method::Instr{Method::Kind::Free, 0, 0, nullptr, 0, OutputClamp(), nullptr};
        switch (in->instr_args_type()) {
          case fb::InstructionArguments_KernelCall: {
            const fb::KernelCall* k = in->instr_args_as_KernelCall();
            if (k->op_index() < 0 || size_t(k->op_index()) >= m.num_ops_)
              return fail(Error::InvalidProgram, "instruction %zu: operator %d out of range", pc,
                          int(k->op_index()));
            out.kind = Method::Kind::Kernel;
            out.a = k->op_index();
            ETB_TRY(resolve_args(st, k->args(), values, &out));
            break;
          }
          case fb::InstructionArguments_DelegateCall: {
            const fb::DelegateCall* d = in->instr_args_as_DelegateCall();
            if (d->delegate_index() < 0 || size_t(d->delegate_index()) >= num_dels)
              return fail(Error::InvalidProgram, "instruction %zu: delegate %d out of range", pc,
                          int(d->delegate_index()));
            out.kind = Method::Kind::Delegate;
            out.a = d->delegate_index();
            ETB_TRY(resolve_args(st, d->args(), values, &out));
            break;
          }
          case fb::InstructionArguments_MoveCall: {
            const fb::MoveCall* mv = in->instr_args_as_MoveCall();
            ETB_TRY(check_value_index(st, mv->move_from(), "move"));
            ETB_TRY(check_value_index(st, mv->move_to(), "move"));
            out.kind = Method::Kind::Move;
            out.a = mv->move_from();
            out.b = mv->move_to();
            break;
          }
          case fb::InstructionArguments_JumpFalseCall: {
            const fb::JumpFalseCall* j = in->instr_args_as_JumpFalseCall();
            ETB_TRY(check_value_index(st, j->cond_value_index(), "jump condition"));
            if (j->destination_instruction() < 0 || size_t(j->destination_instruction()) > total)
              return fail(Error::InvalidProgram, "instruction %zu: jump to %d out of range", pc,
                          int(j->destination_instruction()));
            out.kind = Method::Kind::JumpFalse;
            out.a = j->cond_value_index();
            out.b = j->destination_instruction();
            break;
          }
          case fb::InstructionArguments_FreeCall: {
            const fb::FreeCall* f = in->instr_args_as_FreeCall();
            ETB_TRY(check_value_index(st, f->value_index(), "free"));
            out.kind = Method::Kind::Free;
            out.a = f->value_index();
            break;
          }
          default:
            return fail(Error::InvalidProgram, "instruction %zu has unknown type %d", pc,
                        int(in->instr_args_type()));
        }
        ++pc;
      }
    }
  }
  m.num_instrs_ = pc;
  ETB_TRY(check_kernel_calls(name, m.instrs_, pc, m.op_names_, values));
  fuse_activations(m.instrs_, pc, m.op_names_, values, m.inputs_, m.num_inputs_, m.outputs_,
                   m.num_outputs_);
  ETB_TRY(run_prepare_hooks(m.instrs_, pc, m.op_names_, values, nullptr, 0, &m.prepared_bytes_));
  m.temp_ = memory.temp_allocator;
  const ScratchRegion scratch = meta.scratch_region();
  if (m.temp_ == nullptr && scratch.size > 0) {
    // The kernels' scratch: the region the plan reserves in its bank (checked at load to lie
    // inside the bank's planned bytes, which the caller's buffer covers).
    void* slot = st.alloc->allocate(sizeof(MemoryAllocator), alignof(MemoryAllocator));
    if (slot == nullptr) return out_of_memory("the scratch allocator");
    m.temp_ = new (slot)
        MemoryAllocator(memory.banks[scratch.bank].data() + scratch.offset, scratch.size);
  }
  bool loops = false;  // a jump back can repeat instructions
  for (size_t i = 0; i < pc; ++i)
    loops = loops || (m.instrs_[i].kind == Method::Kind::JumpFalse && size_t(m.instrs_[i].b) <= i);
  m.default_budget_ = uint64_t(pc) * (loops ? Method::kLoopBudgetFactor : 1);
  m.budget_ = m.default_budget_;
  return Result<Method>(static_cast<Method&&>(m));
}

// ---- Method ----------------------------------------------------------------------------

Method::Method(Method&& o) noexcept
    : values_(o.values_), num_values_(o.num_values_), inputs_(o.inputs_),
      num_inputs_(o.num_inputs_), outputs_(o.outputs_), num_outputs_(o.num_outputs_),
      input_set_(o.input_set_), input_bounds_(o.input_bounds_),
      input_planned_(o.input_planned_), instrs_(o.instrs_), num_instrs_(o.num_instrs_),
      kernels_(o.kernels_), op_names_(o.op_names_), num_ops_(o.num_ops_),
      delegates_(o.delegates_), num_delegates_(o.num_delegates_), temp_(o.temp_),
      parallel_(o.parallel_),
      profile_(o.profile_), profile_capacity_(o.profile_capacity_),
      profile_count_(o.profile_count_), default_budget_(o.default_budget_), budget_(o.budget_),
      cancel_(o.cancel_),
      prepared_bytes_(o.prepared_bytes_) {
  o.num_delegates_ = 0;
  o.delegates_ = nullptr;
}

Method::~Method() {
  for (size_t i = 0; i < num_delegates_; ++i)
    delegates_[i].backend->destroy(delegates_[i].handle);
}

Error Method::prepare(Span<uint8_t> memory) {
  if (prepared_bytes_ == 0) return Error::Ok;
  if (memory.size() < prepared_bytes_ || (reinterpret_cast<uintptr_t>(memory.data()) & 63) != 0)
    return fail(Error::InvalidArgument,
                "prepare: needs %zu bytes at a 64-byte aligned address (Method::prepared_bytes()), "
                "got %zu bytes at %p",
                prepared_bytes_, memory.size(), static_cast<const void*>(memory.data()));
  size_t used = 0;
  Error e = run_prepare_hooks(instrs_, num_instrs_, op_names_, values_, memory.data(),
                              memory.size(), &used);
  if (e == Error::Ok && used != prepared_bytes_)
    e = fail(Error::Internal, "prepare: the kernels took %zu bytes, %zu when sized", used,
             prepared_bytes_);
  if (e != Error::Ok)  // no call keeps memory that was half filled
    for (size_t i = 0; i < num_instrs_; ++i) instrs_[i].prepared = nullptr;
  return e;
}

Result<const EValue*> Method::input(size_t i) const {
  if (i >= num_inputs_)
    return fail(Error::InvalidArgument, "input %zu: method has %zu inputs", i, num_inputs_);
  return &values_[inputs_[i]];
}

Error Method::set_input(size_t i, ScalarType dtype, Span<const int64_t> sizes, const void* data,
                        size_t nbytes) {
  if (i >= num_inputs_)
    return fail(Error::InvalidArgument, "input %zu: method has %zu inputs", i, num_inputs_);
  EValue& v = values_[inputs_[i]];
  if (!v.is_tensor())
    return fail(Error::InvalidArgument, "input %zu: expected %s, got a tensor", i,
                tag_name(v.tag()));
  Tensor& t = v.to_tensor();
  if (t.read_only()) return fail(Error::InvalidArgument, "input %zu is a constant", i);
  if (dtype != t.dtype())
    return fail(Error::InvalidArgument, "input %zu: expected dtype %s, got %s", i,
                scalar_type_name(t.dtype()), scalar_type_name(dtype));
  char a[160], b[160];
  if (int(sizes.size()) != t.dim())
    return fail(Error::InvalidArgument, "input %zu: expected %d dims, got %zu (sizes %s)", i,
                t.dim(), sizes.size(), format_sizes(sizes, a, sizeof(a)));
  // Bounds come from the program (sizes are upper bounds for dynamic tensors).
  uint64_t numel = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0) return fail(Error::InvalidArgument, "input %zu: negative size", i);
    numel *= uint64_t(sizes[d]);
  }
  if (numel * element_size(dtype) != nbytes)
    return fail(Error::InvalidArgument, "input %zu: %zu bytes given for sizes %s", i, nbytes,
                format_sizes(sizes, a, sizeof(a)));
  if (t.dynamism() == ShapeDynamism::Static) {
    for (size_t d = 0; d < sizes.size(); ++d)
      if (sizes[d] != t.size(int(d)))
        return fail(Error::InvalidArgument, "input %zu: expected sizes %s, got %s", i,
                    format_sizes(t.sizes(), a, sizeof(a)), format_sizes(sizes, b, sizeof(b)));
  } else {
    const int64_t* bound = input_bounds_[i];
    for (size_t d = 0; d < sizes.size(); ++d)
      if (sizes[d] > bound[d])
        return fail(Error::InvalidArgument, "input %zu: sizes %s exceed the dynamic bound %s", i,
                    format_sizes(sizes, a, sizeof(a)),
                    format_sizes(Span<const int64_t>(bound, sizes.size()), b, sizeof(b)));
  }
  if (input_planned_[i] && nbytes > t.capacity_bytes()) {
    return fail(Error::InvalidArgument,
                "input %zu: sizes %s exceed the bound of the dynamic input (%zu bytes)", i,
                format_sizes(sizes, a, sizeof(a)), t.capacity_bytes());
  }
  if (!input_planned_[i]) {
    // Not planned: reference the caller's memory.
    t.set_data(const_cast<void*>(data), nbytes);
    ETB_TRY(t.resize(sizes));
  } else {
    ETB_TRY(t.resize(sizes));
    if (nbytes > 0 && data != t.data()) memcpy(t.data(), data, nbytes);
  }
  input_set_[i] = true;
  return Error::Ok;
}

Error Method::set_input_scalar(size_t i, const EValue& in) {
  if (i >= num_inputs_)
    return fail(Error::InvalidArgument, "input %zu: method has %zu inputs", i, num_inputs_);
  EValue& v = values_[inputs_[i]];
  if (v.tag() != in.tag() || !in.is_scalar())
    return fail(Error::InvalidArgument, "input %zu: expected %s, got %s", i, tag_name(v.tag()),
                tag_name(in.tag()));
  v = in;
  input_set_[i] = true;
  return Error::Ok;
}

Result<const EValue*> Method::output(size_t i) const {
  if (i >= num_outputs_)
    return fail(Error::InvalidArgument, "output %zu: method has %zu outputs", i, num_outputs_);
  return &values_[outputs_[i]];
}

Error Method::execute() {
  for (size_t i = 0; i < num_inputs_; ++i)
    if (!input_set_[i]) return fail(Error::InvalidArgument, "input %zu was not set", i);
  profile_count_ = 0;
  size_t pc = 0;
  uint64_t steps = 0;
  while (pc < num_instrs_) {
    if (++steps > budget_)
      return fail(Error::InvalidProgram,
                  "instruction %zu: the method ran %llu instructions, its budget: a jump in the "
                  "program loops (if the loop is meant to run longer, raise the budget: "
                  "etb_runner --instruction-budget N, load(path, instruction_budget=N))",
                  pc, (unsigned long long)budget_);
    if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed))
      return fail(Error::Cancelled, "instruction %zu: the run was cancelled", pc);
    const Instr& in = instrs_[pc];
    const uint64_t t0 = profile_ != nullptr ? platform_now_ns() : 0;
    size_t next = pc + 1;
    const char* name = nullptr;
    switch (in.kind) {
      case Kind::Kernel: {
        KernelContext ctx(temp_, in.clamp, parallel_, in.prepared);
        Error e = kernels_[in.a](ctx, Span<EValue*>(in.args, in.num_args));
        if (temp_ != nullptr) temp_->reset();
        if (e != Error::Ok) {
          prefix_error_message("instruction %zu (%s): ", pc, op_names_[in.a]);
          return e;
        }
        name = op_names_[in.a];
        break;
      }
      case Kind::Delegate: {
        const Delegate& d = delegates_[in.a];
        BackendExecuteContext ctx{parallel_};
        Error e = d.backend->execute(ctx, d.handle, Span<EValue*>(in.args, in.num_args));
        if (e != Error::Ok) {
          prefix_error_message("instruction %zu (delegate %d): ", pc, int(in.a));
          return e;
        }
        name = "delegate";
        break;
      }
      case Kind::Move:
        values_[in.b] = values_[in.a];
        name = "move";
        break;
      case Kind::JumpFalse: {
        const EValue& c = values_[in.a];
        if (!c.is_bool())
          return fail(Error::InvalidProgram, "instruction %zu: jump condition is a %s", pc,
                      tag_name(c.tag()));
        if (!c.to_bool()) next = size_t(in.b);
        name = "jump_false";
        break;
      }
      case Kind::Free:
        name = "free";
        break;
      case Kind::Fused:
        name = "fused";
        break;
    }
    if (profile_ != nullptr && profile_count_ < profile_capacity_)
      profile_[profile_count_++] = ProfileEvent{name, platform_now_ns() - t0};
    pc = next;
  }
  return Error::Ok;
}

}  // namespace etb
