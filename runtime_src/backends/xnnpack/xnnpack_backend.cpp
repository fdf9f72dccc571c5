// The XNNPACK delegate ("XnnpackBackend", ExecuTorch's id and blob format): runs the XNNPACK
// subgraphs that partitioner.py writes, and those ExecuTorch's XnnpackPartitioner writes, on
// the XNNPACK library of the system or of target.xnnpack_root.
//
// Blobs place NCHW<->NHWC transposes around convolutions (StaticTranspose nodes), which the
// subgraph API of older XNNPACK releases (Debian's) cannot express. So a blob runs as steps:
// each run of consecutive XNNPACK nodes is one XNNPACK runtime, and each transpose runs here
// between them. Values that cross steps live in buffers the handle owns (with the slack
// XNNPACK may read past the end); delegate inputs that XNNPACK reads are copied there first.
// Shapes are static: every call's tensors must have the sizes the blob was made for.
//
// Threads: a build with this delegate gives its methods a pthreadpool (create_parallel), the
// library XNNPACK runs on, so the runtime's kernels and XNNPACK share one set of threads.
#include <pthread.h>
#include <pthreadpool.h>
#include <xnnpack.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "backend/backend.h"
#include "platform/thread_pool.h"
#include "xnngraph_generated.h"

namespace etb {
namespace {

namespace xs = etbuild::schema::xnnpack;

constexpr size_t kHeaderSize = 30;  // the fields of the blob header, without its padding
constexpr uint64_t kNamed = std::numeric_limits<uint64_t>::max();  // constant in named data

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}

// The flatbuffer and the constant region of a blob.
struct BlobParts {
  Span<const uint8_t> flatbuffer;
  Span<const uint8_t> constants;
};

Result<BlobParts> split_blob(Span<const uint8_t> blob) {
  if (blob.size() < kHeaderSize || memcmp(blob.data() + 4, "XH00", 4) != 0)
    return BlobParts{blob, {}};  // no header: the whole blob is the flatbuffer (old blobs)
  const uint8_t* p = blob.data();
  const uint64_t header = read_le<uint16_t>(p + 8), fb_off = read_le<uint32_t>(p + 10),
                 fb_size = read_le<uint32_t>(p + 14), c_off = read_le<uint32_t>(p + 18),
                 c_size = read_le<uint64_t>(p + 22), n = blob.size();
  if (header < kHeaderSize || fb_off < header || fb_off > n || fb_size > n - fb_off || c_off > n ||
      c_size > n - c_off)
    return fail(Error::InvalidProgram,
                "xnnpack: the blob header is malformed (flatbuffer [%llu, +%llu), constants "
                "[%llu, +%llu) in %llu bytes)",
                (unsigned long long)fb_off, (unsigned long long)fb_size, (unsigned long long)c_off,
                (unsigned long long)c_size, (unsigned long long)n);
  return BlobParts{Span<const uint8_t>(p + fb_off, size_t(fb_size)),
                   Span<const uint8_t>(p + c_off, size_t(c_size))};
}

size_t dtype_size(xnn_datatype t) {
  switch (t) {
    case xnn_datatype_fp32:
    case xnn_datatype_qint32:
    case xnn_datatype_qcint32: return 4;
    case xnn_datatype_fp16: return 2;
    case xnn_datatype_qint8:
    case xnn_datatype_quint8:
    case xnn_datatype_qcint8: return 1;
    default: return 0;
  }
}

// The program dtype a delegate argument of this XNNPACK dtype must have.
ScalarType arg_dtype(xnn_datatype t) {
  switch (t) {
    case xnn_datatype_fp32: return ScalarType::Float;
    case xnn_datatype_fp16: return ScalarType::Half;
    case xnn_datatype_qint8: return ScalarType::Char;
    case xnn_datatype_quint8: return ScalarType::Byte;
    default: return ScalarType::Int;
  }
}

// One value of the blob, resolved.
struct Value {
  const xs::XNNTensorValue* tensor = nullptr;
  const xs::XNNQuantizedTensorValue* quantized = nullptr;  // null: not quantized
  xnn_datatype dtype = xnn_datatype_invalid;
  size_t num_dims = 0;
  size_t dims[XNN_MAX_TENSOR_DIMS] = {};
  size_t nbytes = 0;
  const void* data = nullptr;     // constants
  const float* scales = nullptr;  // per-channel quantization
  int producer = -1;              // step that writes it; -1: a delegate input or constant
  int arg = -1;                   // delegate argument (external id), -1: none
  bool input = false, output = false;
  bool read_by_other_step = false;  // read by a step other than its producer
  bool read_by_xnnpack = false;
  uint8_t* buffer = nullptr;  // owned memory, when the value needs its own
};

// A run of XNNPACK nodes, or one transpose run here.
struct Step {
  bool host = false;
  uint32_t first = 0, last = 0;  // nodes [first, last)
  // XNNPACK steps: the subgraph (kept to rebuild the runtime for another thread count), the
  // runtime, and which value each external id of the subgraph is.
  xnn_subgraph_t subgraph = nullptr;
  xnn_runtime_t runtime = nullptr;
  std::vector<uint32_t> externals;
  std::vector<xnn_external_value> bound;  // what setup was last called with
  // Transposes: value in -> value out, permutation.
  uint32_t in = 0, out = 0, num_dims = 0;
  size_t perm[XNN_MAX_TENSOR_DIMS] = {};
};

struct Handle {
  std::vector<Value> values;
  std::vector<Step> steps;
  std::vector<uint32_t> args;  // external id -> value
  std::unique_ptr<uint8_t[]> arena;
  // The threads the runtimes were created for: nullptr (the calling thread), the method's
  // pthreadpool, or own_pool when the method's threads are not a pthreadpool.
  pthreadpool_t pool = nullptr;
  pthreadpool_t own_pool = nullptr;

  ~Handle() {
    for (Step& s : steps) {
      if (s.runtime != nullptr) xnn_delete_runtime(s.runtime);
      if (s.subgraph != nullptr) xnn_delete_subgraph(s.subgraph);
    }
    if (own_pool != nullptr) pthreadpool_destroy(own_pool);
  }
};

// A method's threads as a pthreadpool. Tasks get the index of the thread they run on, as
// Parallel promises: 0 on the thread that called run(), 1.. on the pool's workers (each
// worker takes the next index the first time it runs a task of this pool).
class PthreadpoolParallel final : public Parallel {
 public:
  explicit PthreadpoolParallel(pthreadpool_t pool)
      : pool_(pool), threads_(int(pthreadpool_get_threads_count(pool))), memory_(threads_) {}
  ~PthreadpoolParallel() override { pthreadpool_destroy(pool_); }
  PthreadpoolParallel(const PthreadpoolParallel&) = delete;
  PthreadpoolParallel& operator=(const PthreadpoolParallel&) = delete;

  int num_threads() const override { return threads_; }
  void* native_handle(const char* library) const override {
    return strcmp(library, "pthreadpool") == 0 ? pool_ : nullptr;
  }
  char* thread_memory(int thread) const override { return memory_.of(thread); }
  size_t thread_memory_bytes() const override { return memory_.bytes(); }
  void run(int64_t n, TaskFn fn, void* ctx) override {
    if (n <= 0) return;
    Loop loop{this, fn, ctx, pthread_self()};
    pthreadpool_parallelize_1d(pool_, &run_task, &loop, size_t(n), 0);
  }

 private:
  struct Loop {
    PthreadpoolParallel* pool;
    TaskFn fn;
    void* ctx;
    pthread_t caller;
  };
  static void run_task(void* arg, size_t task) {
    const Loop& loop = *static_cast<const Loop*>(arg);
    loop.fn(loop.ctx, int64_t(task), loop.pool->thread_index(loop.caller));
  }
  int thread_index(pthread_t caller) {
    if (pthread_equal(pthread_self(), caller)) return 0;
    // A worker thread belongs to one pool for its whole life.
    thread_local const PthreadpoolParallel* owner = nullptr;
    thread_local int index = 0;
    if (owner != this) {
      owner = this;
      index = next_worker_.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    return index;
  }

  pthreadpool_t pool_;
  int threads_;
  ThreadMemory memory_;
  std::atomic<int> next_worker_{0};
};

const char* status_name(xnn_status s) {
  switch (s) {
    case xnn_status_success: return "success";
    case xnn_status_uninitialized: return "uninitialized";
    case xnn_status_invalid_parameter: return "invalid parameter";
    case xnn_status_invalid_state: return "invalid state";
    case xnn_status_unsupported_parameter: return "unsupported parameter";
    case xnn_status_unsupported_hardware: return "unsupported hardware";
    case xnn_status_out_of_memory: return "out of memory";
    default: return "unknown status";
  }
}

// The bytes of constant `index`: in the blob's constant region, in the program's named data,
// or (old blobs) inside the flatbuffer.
Result<Span<const uint8_t>> constant(const xs::XNNGraph* g, const BlobParts& blob,
                                     const NamedDataMap* named, uint32_t index) {
  if (g->constant_data() != nullptr && index < g->constant_data()->size()) {
    const xs::ConstantDataOffset* c = g->constant_data()->Get(index);
    if (c->named_key() != nullptr) {
      if (named == nullptr)
        return fail(Error::InvalidProgram,
                    "xnnpack: constant %u is named data, which this "
                    "program has none of",
                    unsigned(index));
      Result<Span<const uint8_t>> data =
          named->named_data(c->named_key()->c_str(), c->named_key()->size());
      if (!data.ok()) {
        prefix_error_message("xnnpack: constant %u: ", unsigned(index));
        return data.error();
      }
      if (data.value().size() < c->size())
        return fail(Error::InvalidProgram, "xnnpack: constant %u has %zu bytes, expected %llu",
                    unsigned(index), data.value().size(), (unsigned long long)c->size());
      return data.value();
    }
    if (c->offset() == kNamed || c->offset() > blob.constants.size() ||
        c->size() > blob.constants.size() - c->offset())
      return fail(Error::InvalidProgram,
                  "xnnpack: constant %u [%llu, +%llu) lies outside the "
                  "blob's %zu constant bytes",
                  unsigned(index), (unsigned long long)c->offset(), (unsigned long long)c->size(),
                  blob.constants.size());
    return Span<const uint8_t>(blob.constants.data() + c->offset(), size_t(c->size()));
  }
  if (g->constant_buffer() != nullptr && index < g->constant_buffer()->size()) {
    const auto* storage = g->constant_buffer()->Get(index)->storage();
    if (storage != nullptr) return Span<const uint8_t>(storage->data(), storage->size());
  }
  return fail(Error::InvalidProgram, "xnnpack: constant %u does not exist", unsigned(index));
}

// Reads value `v` of the blob into `out`.
Error resolve_value(const xs::XNNGraph* g, const BlobParts& blob, const NamedDataMap* named,
                    const xs::XValue* xv, size_t v, Value* out) {
  if (xv->xvalue_union_type() == xs::XValueUnion_XNNTensorValue) {
    out->tensor = xv->xvalue_union_as_XNNTensorValue();
  } else if (xv->xvalue_union_type() == xs::XValueUnion_XNNQuantizedTensorValue) {
    out->quantized = xv->xvalue_union_as_XNNQuantizedTensorValue();
    out->tensor = out->quantized->tensor_value();
  }
  const xs::XNNTensorValue* t = out->tensor;
  if (t == nullptr) return fail(Error::InvalidProgram, "xnnpack: value %zu is not a tensor", v);
  out->dtype = static_cast<xnn_datatype>(t->datatype());
  const size_t esize = dtype_size(out->dtype);
  if (esize == 0)
    return fail(Error::NotSupported,
                "xnnpack: value %zu has XNNPACK datatype %d, which this "
                "backend does not run (fp32, fp16 and 8-bit quantized with int32 bias only)",
                v, int(t->datatype()));
  if (t->dims() == nullptr || t->dims()->size() > XNN_MAX_TENSOR_DIMS ||
      t->num_dims() != t->dims()->size())
    return fail(Error::InvalidProgram, "xnnpack: value %zu has malformed dims", v);
  out->num_dims = t->dims()->size();
  uint64_t numel = 1;
  for (size_t d = 0; d < out->num_dims; ++d) {
    out->dims[d] = t->dims()->Get(flatbuffers::uoffset_t(d));
    numel *= out->dims[d];
    if (numel > (uint64_t(1) << 40))
      return fail(Error::InvalidProgram, "xnnpack: value %zu is implausibly large", v);
  }
  out->nbytes = size_t(numel) * esize;
  if (t->constant_buffer_idx() != 0) {
    Span<const uint8_t> bytes;
    ETB_ASSIGN_OR_RETURN(bytes, constant(g, blob, named, t->constant_buffer_idx()));
    if (bytes.size() < out->nbytes)
      return fail(Error::InvalidProgram,
                  "xnnpack: value %zu needs %zu bytes, its constant has "
                  "%zu",
                  v, out->nbytes, bytes.size());
    out->data = bytes.data();
  }
  if (out->quantized != nullptr &&
      out->quantized->quant_params_type() == xs::XNNQuantParams_PerChannelQuant) {
    const xs::PerChannelQuant* q = out->quantized->quant_params_as_PerChannelQuant();
    const int channel_dim = q->channel_dim();
    if (channel_dim < 0 || size_t(channel_dim) >= out->num_dims)
      return fail(Error::InvalidProgram, "xnnpack: value %zu: channel dim %d", v, channel_dim);
    const size_t channels = out->dims[channel_dim];
    if (q->scale() != nullptr && q->scale()->size() > 0) {
      if (q->scale()->size() != channels)
        return fail(Error::InvalidProgram, "xnnpack: value %zu has %u scales for %zu channels", v,
                    unsigned(q->scale()->size()), channels);
      out->scales = q->scale()->data();
    } else {
      Span<const uint8_t> bytes;
      ETB_ASSIGN_OR_RETURN(bytes, constant(g, blob, named, q->scale_buffer_idx()));
      if (q->num_scales() != channels || bytes.size() < channels * sizeof(float) ||
          reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0)
        return fail(Error::InvalidProgram, "xnnpack: value %zu: scales do not fit %zu channels", v,
                    channels);
      out->scales = reinterpret_cast<const float*>(bytes.data());
    }
  } else if (out->quantized != nullptr &&
             out->quantized->quant_params_type() != xs::XNNQuantParams_PerTensorQuant) {
    return fail(Error::NotSupported,
                "xnnpack: value %zu uses dynamic or blockwise "
                "quantization, which this backend does not run",
                v);
  }
  if (t->flags() & XNN_VALUE_FLAG_EXTERNAL_INPUT) out->input = true;
  if (t->flags() & XNN_VALUE_FLAG_EXTERNAL_OUTPUT) out->output = true;
  return Error::Ok;
}

// The value ids node `n` reads and writes (XNNPACK's id_out numbering).
struct NodeIo {
  uint32_t in[3] = {XNN_INVALID_VALUE_ID, XNN_INVALID_VALUE_ID, XNN_INVALID_VALUE_ID};
  uint32_t out = XNN_INVALID_VALUE_ID;
};

// A node of one input whose table is T.
template <typename T>
NodeIo one_input(const xs::XNode* n) {
  const T* t = static_cast<const T*>(n->xnode_union());
  NodeIo io;
  io.in[0] = t->input_id(), io.out = t->output_id();
  return io;
}

Result<NodeIo> node_io(const xs::XNode* n, size_t i) {
  NodeIo io;
  switch (n->xnode_union_type()) {
    case xs::XNodeUnion_XNNAdd:
    case xs::XNodeUnion_XNNDiv:
    case xs::XNodeUnion_XNNMinimum:
    case xs::XNodeUnion_XNNMaximum:
    case xs::XNodeUnion_XNNMultiply:
    case xs::XNodeUnion_XNNSubtract:
    case xs::XNodeUnion_XNNPReLU: {
      const auto* b = static_cast<const xs::_XNNNode2x1*>(n->xnode_union());
      io.in[0] = b->input1_id(), io.in[1] = b->input2_id(), io.out = b->output_id();
      return io;
    }
    case xs::XNodeUnion_XNNSoftmax:
    case xs::XNodeUnion_XNNSigmoid:
    case xs::XNodeUnion_XNNClamp:
    case xs::XNodeUnion_XNNFloor:
    case xs::XNodeUnion_XNNConvert:
    case xs::XNodeUnion_XNNGlobalAvgPooling2d:
    case xs::XNodeUnion_XNNSquareRoot:
    case xs::XNodeUnion_XNNCeiling:
    case xs::XNodeUnion_XNNHardswish:
    case xs::XNodeUnion_XNNNegate:
    case xs::XNodeUnion_XNNSquare:
    case xs::XNodeUnion_XNNAbs: return one_input<xs::_XNNNode1x1>(n);
    case xs::XNodeUnion_XNNConv2d:
    case xs::XNodeUnion_XNNDepthwiseConv2d:
    case xs::XNodeUnion_XNNConvTranspose2d: {
      const auto* c = static_cast<const xs::_XNNNodeConv*>(n->xnode_union());
      io.in[0] = c->input1_id(), io.in[1] = c->filter_id(), io.in[2] = c->bias_id();
      io.out = c->output_id();
      return io;
    }
    case xs::XNodeUnion_XNNFullyConnected: {
      const auto* f = n->xnode_union_as_XNNFullyConnected();
      io.in[0] = f->input1_id(), io.in[1] = f->filter_id(), io.in[2] = f->bias_id();
      io.out = f->output_id();
      return io;
    }
    case xs::XNodeUnion_XNNAvgPooling2d:
    case xs::XNodeUnion_XNNMaxPooling2d: return one_input<xs::_XNNPooling2D>(n);
    case xs::XNodeUnion_XNNStaticTranspose: return one_input<xs::XNNStaticTranspose>(n);
    case xs::XNodeUnion_XNNStaticReshape: return one_input<xs::XNNStaticReshape>(n);
    case xs::XNodeUnion_XNNStaticConstantPad: return one_input<xs::XNNStaticConstantPad>(n);
    case xs::XNodeUnion_XNNStaticResizeBilinear2D:
      return one_input<xs::XNNStaticResizeBilinear2D>(n);
    case xs::XNodeUnion_XNNLeakyReLU: return one_input<xs::XNNLeakyReLU>(n);
    case xs::XNodeUnion_XNNELU: return one_input<xs::XNNELU>(n);
    default:
      return fail(Error::NotSupported,
                  "xnnpack: node %zu is %s, which this backend does not run on the XNNPACK "
                  "library it was built with; build the program with etbuild's "
                  "+partitioner=xnnpack, which only delegates what this backend runs",
                  i, xs::EnumNameXNodeUnion(n->xnode_union_type()));
  }
}

// Adds node `n` to `sg`; `id` maps the blob's value ids to the subgraph's.
xnn_status define_node(xnn_subgraph_t sg, const xs::XNode* n, const std::vector<uint32_t>& id) {
  auto v = [&](uint32_t blob_id) {
    return blob_id == XNN_INVALID_VALUE_ID ? XNN_INVALID_VALUE_ID : id[blob_id];
  };
  float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
  if (n->output_min_max() != nullptr) {
    lo = n->output_min_max()->output_min();
    hi = n->output_min_max()->output_max();
  }
  switch (n->xnode_union_type()) {
    case xs::XNodeUnion_XNNAdd:
    case xs::XNodeUnion_XNNSubtract:
    case xs::XNodeUnion_XNNMultiply:
    case xs::XNodeUnion_XNNDiv: {
      const auto* b = static_cast<const xs::_XNNNode2x1*>(n->xnode_union());
      auto* fn = n->xnode_union_type() == xs::XNodeUnion_XNNAdd        ? xnn_define_add2
                 : n->xnode_union_type() == xs::XNodeUnion_XNNSubtract ? xnn_define_subtract
                 : n->xnode_union_type() == xs::XNodeUnion_XNNMultiply ? xnn_define_multiply2
                                                                       : xnn_define_divide;
      return fn(sg, lo, hi, v(b->input1_id()), v(b->input2_id()), v(b->output_id()), b->flags());
    }
    case xs::XNodeUnion_XNNMinimum:
    case xs::XNodeUnion_XNNMaximum: {
      const auto* b = static_cast<const xs::_XNNNode2x1*>(n->xnode_union());
      auto* fn = n->xnode_union_type() == xs::XNodeUnion_XNNMinimum ? xnn_define_minimum2
                                                                    : xnn_define_maximum2;
      return fn(sg, v(b->input1_id()), v(b->input2_id()), v(b->output_id()), b->flags());
    }
    case xs::XNodeUnion_XNNPReLU: {
      const auto* b = n->xnode_union_as_XNNPReLU();
      return xnn_define_prelu(sg, v(b->input1_id()), v(b->input2_id()), v(b->output_id()),
                              b->flags());
    }
    case xs::XNodeUnion_XNNSoftmax:
    case xs::XNodeUnion_XNNSigmoid:
    case xs::XNodeUnion_XNNFloor:
    case xs::XNodeUnion_XNNConvert:
    case xs::XNodeUnion_XNNSquareRoot:
    case xs::XNodeUnion_XNNCeiling:
    case xs::XNodeUnion_XNNHardswish:
    case xs::XNodeUnion_XNNNegate:
    case xs::XNodeUnion_XNNSquare:
    case xs::XNodeUnion_XNNAbs: {
      const auto* u = static_cast<const xs::_XNNNode1x1*>(n->xnode_union());
      xnn_status (*fn)(xnn_subgraph_t, uint32_t, uint32_t, uint32_t) = nullptr;
      switch (n->xnode_union_type()) {
        case xs::XNodeUnion_XNNSoftmax: fn = xnn_define_softmax; break;
        case xs::XNodeUnion_XNNSigmoid: fn = xnn_define_sigmoid; break;
        case xs::XNodeUnion_XNNFloor: fn = xnn_define_floor; break;
        case xs::XNodeUnion_XNNConvert: fn = xnn_define_convert; break;
        case xs::XNodeUnion_XNNSquareRoot: fn = xnn_define_square_root; break;
        case xs::XNodeUnion_XNNCeiling: fn = xnn_define_ceiling; break;
        case xs::XNodeUnion_XNNHardswish: fn = xnn_define_hardswish; break;
        case xs::XNodeUnion_XNNNegate: fn = xnn_define_negate; break;
        case xs::XNodeUnion_XNNSquare: fn = xnn_define_square; break;
        default: fn = xnn_define_abs; break;
      }
      return fn(sg, v(u->input_id()), v(u->output_id()), u->flags());
    }
    case xs::XNodeUnion_XNNClamp: {
      const auto* u = n->xnode_union_as_XNNClamp();
      return xnn_define_clamp(sg, lo, hi, v(u->input_id()), v(u->output_id()), u->flags());
    }
    case xs::XNodeUnion_XNNGlobalAvgPooling2d: {
      const auto* u = n->xnode_union_as_XNNGlobalAvgPooling2d();
      return xnn_define_global_average_pooling_2d(sg, lo, hi, v(u->input_id()), v(u->output_id()),
                                                  u->flags());
    }
    case xs::XNodeUnion_XNNConv2d: {
      const auto* c = n->xnode_union_as_XNNConv2d();
      return xnn_define_convolution_2d(
          sg, c->padding_top(), c->padding_right(), c->padding_bottom(), c->padding_left(),
          c->kernel_height(), c->kernel_width(), c->subsampling_height(), c->subsampling_width(),
          c->dilation_height(), c->dilation_width(), c->groups(), c->group_input_channels(),
          c->group_output_channels(), lo, hi, v(c->input1_id()), v(c->filter_id()), v(c->bias_id()),
          v(c->output_id()), c->flags());
    }
    case xs::XNodeUnion_XNNDepthwiseConv2d: {
      const auto* c = n->xnode_union_as_XNNDepthwiseConv2d();
      if (c->group_input_channels() == 0) return xnn_status_invalid_parameter;
      return xnn_define_depthwise_convolution_2d(
          sg, c->padding_top(), c->padding_right(), c->padding_bottom(), c->padding_left(),
          c->kernel_height(), c->kernel_width(), c->subsampling_height(), c->subsampling_width(),
          c->dilation_height(), c->dilation_width(),
          c->group_output_channels() / c->group_input_channels(), c->groups(), lo, hi,
          v(c->input1_id()), v(c->filter_id()), v(c->bias_id()), v(c->output_id()), c->flags());
    }
    case xs::XNodeUnion_XNNConvTranspose2d: {
      const auto* c = n->xnode_union_as_XNNConvTranspose2d();
      return xnn_define_deconvolution_2d(
          sg, c->padding_top(), c->padding_right(), c->padding_bottom(), c->padding_left(),
          c->adjustment_height(), c->adjustment_width(), c->kernel_height(), c->kernel_width(),
          c->subsampling_height(), c->subsampling_width(), c->dilation_height(),
          c->dilation_width(), c->groups(), c->group_input_channels(), c->group_output_channels(),
          lo, hi, v(c->input1_id()), v(c->filter_id()), v(c->bias_id()), v(c->output_id()),
          c->flags());
    }
    case xs::XNodeUnion_XNNFullyConnected: {
      const auto* f = n->xnode_union_as_XNNFullyConnected();
      return xnn_define_fully_connected(sg, lo, hi, v(f->input1_id()), v(f->filter_id()),
                                        v(f->bias_id()), v(f->output_id()), f->flags());
    }
    case xs::XNodeUnion_XNNAvgPooling2d: {
      const auto* p = n->xnode_union_as_XNNAvgPooling2d();
      return xnn_define_average_pooling_2d(
          sg, p->padding_top(), p->padding_right(), p->padding_bottom(), p->padding_left(),
          p->pooling_height(), p->pooling_width(), p->stride_height(), p->stride_width(), lo, hi,
          v(p->input_id()), v(p->output_id()), p->flags());
    }
    case xs::XNodeUnion_XNNMaxPooling2d: {
      const auto* p = n->xnode_union_as_XNNMaxPooling2d();
      return xnn_define_max_pooling_2d(sg, p->padding_top(), p->padding_right(),
                                       p->padding_bottom(), p->padding_left(), p->pooling_height(),
                                       p->pooling_width(), p->stride_height(), p->stride_width(),
                                       p->dilation_height(), p->dilation_width(), lo, hi,
                                       v(p->input_id()), v(p->output_id()), p->flags());
    }
    case xs::XNodeUnion_XNNStaticReshape: {
      const auto* r = n->xnode_union_as_XNNStaticReshape();
      size_t shape[XNN_MAX_TENSOR_DIMS];
      if (r->new_shape() == nullptr || r->new_shape()->size() > XNN_MAX_TENSOR_DIMS)
        return xnn_status_invalid_parameter;
      for (size_t d = 0; d < r->new_shape()->size(); ++d)
        shape[d] = r->new_shape()->Get(flatbuffers::uoffset_t(d));
      return xnn_define_static_reshape(sg, r->new_shape()->size(), shape, v(r->input_id()),
                                       v(r->output_id()), r->flags());
    }
    case xs::XNodeUnion_XNNStaticConstantPad: {
      const auto* p = n->xnode_union_as_XNNStaticConstantPad();
      size_t pre[XNN_MAX_TENSOR_DIMS] = {}, post[XNN_MAX_TENSOR_DIMS] = {};
      if (p->pre_paddings() == nullptr || p->post_paddings() == nullptr ||
          p->pre_paddings()->size() > XNN_MAX_TENSOR_DIMS ||
          p->post_paddings()->size() > XNN_MAX_TENSOR_DIMS)
        return xnn_status_invalid_parameter;
      for (size_t d = 0; d < p->pre_paddings()->size(); ++d)
        pre[d] = p->pre_paddings()->Get(flatbuffers::uoffset_t(d));
      for (size_t d = 0; d < p->post_paddings()->size(); ++d)
        post[d] = p->post_paddings()->Get(flatbuffers::uoffset_t(d));
      return xnn_define_static_constant_pad(sg, pre, post, p->padding_value(), v(p->input_id()),
                                            v(p->output_id()), p->flags());
    }
    case xs::XNodeUnion_XNNStaticResizeBilinear2D: {
      const auto* r = n->xnode_union_as_XNNStaticResizeBilinear2D();
      return xnn_define_static_resize_bilinear_2d(sg, r->new_height(), r->new_width(),
                                                  v(r->input_id()), v(r->output_id()), r->flags());
    }
    case xs::XNodeUnion_XNNLeakyReLU: {
      const auto* r = n->xnode_union_as_XNNLeakyReLU();
      return xnn_define_leaky_relu(sg, r->negative_slope(), v(r->input_id()), v(r->output_id()),
                                   r->flags());
    }
    case xs::XNodeUnion_XNNELU: {
      const auto* r = n->xnode_union_as_XNNELU();
      return xnn_define_elu(sg, r->alpha(), v(r->input_id()), v(r->output_id()), r->flags());
    }
    default: return xnn_status_unsupported_parameter;
  }
}

// Defines value `v` in `sg` (external id `ext`, or XNN_INVALID_VALUE_ID) and returns its id.
xnn_status define_value(xnn_subgraph_t sg, const Value& v, uint32_t ext, uint32_t flags,
                        uint32_t* id) {
  if (v.quantized == nullptr)
    return xnn_define_tensor_value(sg, v.dtype, v.num_dims, v.dims, v.data, ext, flags, id);
  if (v.scales != nullptr) {
    const auto* q = v.quantized->quant_params_as_PerChannelQuant();
    return xnn_define_channelwise_quantized_tensor_value(sg, v.dtype, v.scales, v.num_dims,
                                                         size_t(q->channel_dim()), v.dims, v.data,
                                                         ext, flags, id);
  }
  const auto* q = v.quantized->quant_params_as_PerTensorQuant();
  return xnn_define_quantized_tensor_value(sg, v.dtype, q->zero_point(), q->scale(), v.num_dims,
                                           v.dims, v.data, ext, flags, id);
}

// Builds step `s`'s subgraph from its nodes.
Error build_subgraph(const xs::XNNGraph* g, Handle* h, int index) {
  Step& s = h->steps[size_t(index)];
  std::vector<uint32_t> id(h->values.size(), XNN_INVALID_VALUE_ID);
  std::vector<uint32_t> used;
  for (uint32_t i = s.first; i < s.last; ++i) {
    NodeIo io = node_io(g->xnodes()->Get(i), i).value();
    for (uint32_t v : {io.in[0], io.in[1], io.in[2], io.out})
      if (v != XNN_INVALID_VALUE_ID && id[v] == XNN_INVALID_VALUE_ID) {
        id[v] = 0;
        used.push_back(v);
      }
  }
  s.externals.clear();
  for (uint32_t v : used) {  // the externals: read from or written for other steps
    const Value& val = h->values[v];
    if (val.data == nullptr &&
        (val.producer != index || val.read_by_other_step || val.arg >= 0 || val.output))
      s.externals.push_back(v);
  }
  xnn_status st = xnn_create_subgraph(uint32_t(s.externals.size()), 0, &s.subgraph);
  if (st != xnn_status_success)
    return fail(Error::MemoryAllocationFailed, "xnnpack: create_subgraph: %s", status_name(st));
  for (uint32_t v : used) {
    const Value& val = h->values[v];
    uint32_t ext = XNN_INVALID_VALUE_ID, flags = 0;
    for (size_t e = 0; e < s.externals.size(); ++e)
      if (s.externals[e] == v) {
        ext = uint32_t(e);
        flags =
            val.producer == index ? XNN_VALUE_FLAG_EXTERNAL_OUTPUT : XNN_VALUE_FLAG_EXTERNAL_INPUT;
      }
    st = define_value(s.subgraph, val, ext, flags, &id[v]);
    if (st != xnn_status_success)
      return fail(Error::NotSupported, "xnnpack: value %u (datatype %d) cannot be defined: %s",
                  unsigned(v), int(val.dtype), status_name(st));
  }
  for (uint32_t i = s.first; i < s.last; ++i) {
    const xs::XNode* n = g->xnodes()->Get(i);
    st = define_node(s.subgraph, n, id);
    if (st != xnn_status_success)
      return fail(Error::NotSupported,
                  "xnnpack: node %u (%s) is refused by the XNNPACK library: %s (an operator or "
                  "dtype this XNNPACK release does not have)",
                  unsigned(i), xs::EnumNameXNodeUnion(n->xnode_union_type()), status_name(st));
  }
  return Error::Ok;
}

// (Re)creates the runtimes of every XNNPACK step on `pool` (nullptr: the calling thread).
Error create_runtimes(Handle* h, pthreadpool_t pool) {
  h->pool = pool;
  for (size_t i = 0; i < h->steps.size(); ++i) {
    Step& s = h->steps[i];
    if (s.host) continue;
    if (s.runtime != nullptr) xnn_delete_runtime(s.runtime);
    s.runtime = nullptr;
    s.bound.clear();
    xnn_status st = xnn_create_runtime_v2(s.subgraph, h->pool, 0, &s.runtime);
    if (st != xnn_status_success)
      return fail(Error::NotSupported,
                  "xnnpack: nodes %u-%u: the XNNPACK library cannot create their runtime: %s "
                  "(an operator or quantization this XNNPACK release does not support)",
                  unsigned(s.first), unsigned(s.last - 1), status_name(st));
  }
  return Error::Ok;
}

// Transposes a tensor of `esize`-byte elements: out[i] = in[perm(i)].
void transpose(const uint8_t* in, uint8_t* out, const size_t* in_dims, const size_t* perm,
               size_t num_dims, size_t esize) {
  size_t in_stride[XNN_MAX_TENSOR_DIMS] = {}, out_dims[XNN_MAX_TENSOR_DIMS] = {};
  size_t numel = 1;
  for (size_t d = num_dims; d-- > 0;) {
    in_stride[d] = numel;
    numel *= in_dims[d];
  }
  for (size_t d = 0; d < num_dims; ++d) out_dims[d] = in_dims[perm[d]];
  // Walk the output in order, moving the input offset by the permuted strides.
  size_t idx[XNN_MAX_TENSOR_DIMS] = {}, src = 0;
  const size_t last = num_dims - 1, inner = out_dims[last], step = in_stride[perm[last]];
  for (size_t o = 0; o < numel; o += inner) {
    size_t p = src;
    if (esize == 4) {
      for (size_t k = 0; k < inner; ++k, p += step) memcpy(out + (o + k) * 4, in + p * 4, 4);
    } else if (esize == 1) {
      for (size_t k = 0; k < inner; ++k, p += step) out[o + k] = in[p];
    } else {
      for (size_t k = 0; k < inner; ++k, p += step)
        memcpy(out + (o + k) * esize, in + p * esize, esize);
    }
    for (size_t d = last; d-- > 0;) {  // next row: carry through the outer dims
      src += in_stride[perm[d]];
      if (++idx[d] < out_dims[d]) break;
      src -= in_stride[perm[d]] * out_dims[d];
      idx[d] = 0;
    }
  }
}

// Parses and checks the blob; builds the steps and their subgraphs.
Error build(const xs::XNNGraph* g, const BlobParts& blob, const NamedDataMap* named, Handle* h) {
  if (g->xvalues() == nullptr || g->xnodes() == nullptr)
    return fail(Error::InvalidProgram, "xnnpack: the blob has no values or no nodes");
  // Values, indexed by their id_out (which the nodes use).
  const size_t nvalues = g->xvalues()->size();
  h->values.assign(nvalues, Value{});
  std::vector<bool> seen(nvalues, false);
  for (size_t i = 0; i < nvalues; ++i) {
    Value v;
    ETB_TRY(resolve_value(g, blob, named, g->xvalues()->Get(flatbuffers::uoffset_t(i)), i, &v));
    const uint32_t id = v.tensor->id_out();
    if (id >= nvalues || seen[id])
      return fail(Error::InvalidProgram, "xnnpack: value %zu has id %u", i, unsigned(id));
    seen[id] = true;
    h->values[id] = v;
  }
  // Externals: the delegate call passes args[external_id].
  const uint32_t num_externs = g->num_externs();
  if (num_externs > nvalues)
    return fail(Error::InvalidProgram, "xnnpack: %u externals", unsigned(num_externs));
  h->args.assign(num_externs, XNN_INVALID_VALUE_ID);
  for (uint32_t id = 0; id < nvalues; ++id) {
    Value& v = h->values[id];
    if (!v.input && !v.output) continue;
    const uint32_t e = v.tensor->external_id();
    if (e >= num_externs || h->args[e] != XNN_INVALID_VALUE_ID || v.data != nullptr)
      return fail(Error::InvalidProgram, "xnnpack: value %u has external id %u", unsigned(id),
                  unsigned(e));
    h->args[e] = id;
    v.arg = int(e);
  }
  for (uint32_t e = 0; e < num_externs; ++e)
    if (h->args[e] == XNN_INVALID_VALUE_ID)
      return fail(Error::InvalidProgram, "xnnpack: no value has external id %u", unsigned(e));
  // Steps: runs of XNNPACK nodes, cut at each transpose.
  const uint32_t nnodes = g->xnodes()->size();
  for (uint32_t i = 0; i < nnodes; ++i) {
    const xs::XNode* n = g->xnodes()->Get(i);
    NodeIo io;
    ETB_ASSIGN_OR_RETURN(io, node_io(n, i));
    for (uint32_t v : {io.in[0], io.in[1], io.in[2], io.out})
      if (v != XNN_INVALID_VALUE_ID && v >= nvalues)
        return fail(Error::InvalidProgram, "xnnpack: node %u names value %u", unsigned(i),
                    unsigned(v));
    if (io.out == XNN_INVALID_VALUE_ID || io.in[0] == XNN_INVALID_VALUE_ID)
      return fail(Error::InvalidProgram, "xnnpack: node %u lacks its input or output", unsigned(i));
    const bool host = n->xnode_union_type() == xs::XNodeUnion_XNNStaticTranspose;
    if (host || h->steps.empty() || h->steps.back().host) {
      h->steps.emplace_back();
      h->steps.back().host = host;
      h->steps.back().first = i;
    }
    Step& s = h->steps.back();
    s.last = i + 1;
    const int step = int(h->steps.size() - 1);
    Value& out = h->values[io.out];
    if (out.producer >= 0 || out.data != nullptr || out.input)
      return fail(Error::InvalidProgram, "xnnpack: value %u is written twice", unsigned(io.out));
    out.producer = step;
    for (uint32_t v : {io.in[0], io.in[1], io.in[2]}) {
      if (v == XNN_INVALID_VALUE_ID) continue;
      Value& in = h->values[v];
      if (in.producer != step) in.read_by_other_step = true;
      if (!host) in.read_by_xnnpack = true;
    }
    if (host) {
      const auto* t = n->xnode_union_as_XNNStaticTranspose();
      const Value& in = h->values[io.in[0]];
      if (t->perm() == nullptr || t->perm()->size() != in.num_dims || out.num_dims != in.num_dims ||
          in.dtype != out.dtype || in.data != nullptr)
        return fail(Error::InvalidProgram, "xnnpack: transpose node %u is malformed", unsigned(i));
      uint32_t used = 0;
      for (size_t d = 0; d < in.num_dims; ++d) {
        const uint32_t p = t->perm()->Get(flatbuffers::uoffset_t(d));
        if (p >= in.num_dims || (used & (1u << p)) || out.dims[d] != in.dims[p])
          return fail(Error::InvalidProgram, "xnnpack: transpose node %u has a bad permutation",
                      unsigned(i));
        used |= 1u << p;
        s.perm[d] = p;
      }
      s.in = io.in[0], s.out = io.out, s.num_dims = uint32_t(in.num_dims);
    }
  }
  // A value read before it is written would be garbage.
  for (uint32_t id = 0; id < nvalues; ++id) {
    const Value& v = h->values[id];
    if (v.output && v.producer < 0)
      return fail(Error::InvalidProgram, "xnnpack: output value %u is never written", unsigned(id));
  }
  // Owned buffers: values passed between steps, and delegate inputs XNNPACK reads (it may
  // read XNN_EXTRA_BYTES past a buffer's end, which a program's tensor need not allow).
  size_t total = 0;
  std::vector<size_t> offset(nvalues, SIZE_MAX);
  for (uint32_t id = 0; id < nvalues; ++id) {
    const Value& v = h->values[id];
    if (v.data != nullptr) continue;
    const bool crossing = v.producer >= 0 && v.read_by_other_step && !v.output;
    const bool padded_input = v.input && v.read_by_xnnpack;
    const bool read_back = v.output && v.read_by_xnnpack;  // an output later steps read
    if (crossing || padded_input || read_back) {
      offset[id] = total;
      total += (v.nbytes + XNN_EXTRA_BYTES + 63) / 64 * 64;
    }
  }
  if (total > 0) {
    h->arena.reset(new (std::nothrow) uint8_t[total + 64]);
    if (!h->arena)
      return fail(Error::MemoryAllocationFailed, "xnnpack: %zu bytes of buffers", total);
    uint8_t* base = h->arena.get() + (64 - reinterpret_cast<uintptr_t>(h->arena.get()) % 64);
    for (uint32_t id = 0; id < nvalues; ++id)
      if (offset[id] != SIZE_MAX) h->values[id].buffer = base + offset[id];
  }
  for (size_t i = 0; i < h->steps.size(); ++i)
    if (!h->steps[i].host) ETB_TRY(build_subgraph(g, h, int(i)));
  return create_runtimes(h, nullptr);
}

// The pool the runtimes run on for the method's threads: the method's own when they are a
// pthreadpool, else one of the handle's, sized to match (an app that gave the method a
// ThreadPool of its own).
Result<pthreadpool_t> pool_for(Handle* h, const Parallel* parallel) {
  const int threads = parallel != nullptr ? parallel->num_threads() : 1;
  if (threads <= 1) return pthreadpool_t(nullptr);
  if (void* shared = parallel->native_handle("pthreadpool"))
    return static_cast<pthreadpool_t>(shared);
  if (h->own_pool != nullptr && int(pthreadpool_get_threads_count(h->own_pool)) != threads) {
    if (h->pool == h->own_pool) ETB_TRY(create_runtimes(h, nullptr));  // off the old pool
    pthreadpool_destroy(h->own_pool);
    h->own_pool = nullptr;
  }
  if (h->own_pool == nullptr) {
    h->own_pool = pthreadpool_create(size_t(threads));
    if (h->own_pool == nullptr)
      return fail(Error::MemoryAllocationFailed, "xnnpack: cannot start %d threads", threads);
  }
  return h->own_pool;
}

class XnnpackBackend final : public Backend {
 public:
  bool is_available() const override {
    static const bool ok = xnn_initialize(nullptr) == xnn_status_success;
    return ok;
  }

  Result<void*> init(BackendInitContext& ctx, Span<const uint8_t> processed,
                     Span<const CompileSpec>) const override {
    BlobParts blob;
    ETB_ASSIGN_OR_RETURN(blob, split_blob(processed));
    flatbuffers::Verifier verifier(blob.flatbuffer.data(), blob.flatbuffer.size());
    if (blob.flatbuffer.size() < 8 ||
        (!flatbuffers::BufferHasIdentifier(blob.flatbuffer.data(), "XN00") &&
         !flatbuffers::BufferHasIdentifier(blob.flatbuffer.data(), "XN01")) ||
        !verifier.VerifyBuffer<xs::XNNGraph>(nullptr))
      return fail(Error::InvalidProgram,
                  "xnnpack: the delegate blob is not a valid XNNGraph flatbuffer");
    const xs::XNNGraph* g = flatbuffers::GetRoot<xs::XNNGraph>(blob.flatbuffer.data());
    std::unique_ptr<Handle> h(new (std::nothrow) Handle());
    if (!h) return fail(Error::MemoryAllocationFailed, "xnnpack: handle");
    ETB_TRY(build(g, blob, ctx.named_data, h.get()));
    return static_cast<void*>(h.release());
  }

  Error execute(BackendExecuteContext& ctx, void* handle, Span<EValue*> args) const override {
    Handle* h = static_cast<Handle*>(handle);
    pthreadpool_t pool;
    ETB_ASSIGN_OR_RETURN(pool, pool_for(h, ctx.parallel));
    if (pool != h->pool) ETB_TRY(create_runtimes(h, pool));
    if (args.size() != h->args.size())
      return fail(Error::InvalidArgument, "xnnpack: %zu arguments, the blob has %zu", args.size(),
                  h->args.size());
    // Check every argument against its value; copy inputs XNNPACK reads into their buffers.
    for (size_t e = 0; e < args.size(); ++e) {
      const Value& v = h->values[h->args[e]];
      if (!args[e]->is_tensor())
        return fail(Error::InvalidArgument, "xnnpack: argument %zu is not a tensor", e);
      Tensor& t = args[e]->to_tensor();
      bool same = t.dtype() == arg_dtype(v.dtype) && size_t(t.dim()) == v.num_dims;
      for (size_t d = 0; same && d < v.num_dims; ++d) same = size_t(t.size(int(d))) == v.dims[d];
      if (!same || t.data() == nullptr)
        return fail(Error::InvalidArgument,
                    "xnnpack: argument %zu does not have the dtype and static sizes the blob "
                    "was built for (%zu dims, first %zu)",
                    e, v.num_dims, v.num_dims ? v.dims[0] : size_t(0));
      // An output must not share memory with any other argument (the delegate writes it
      // while it reads them).
      for (size_t o = 0; o < e; ++o)
        if ((v.output || h->values[h->args[o]].output) && overlaps(t, args[o]->to_tensor()))
          return fail(Error::InvalidProgram,
                      "xnnpack: arguments %zu and %zu overlap in memory and one is an output; "
                      "the program's memory plan is invalid (rebuild the program with etbuild)",
                      o, e);
      if (v.input && v.buffer != nullptr) memcpy(v.buffer, t.data(), v.nbytes);
    }
    auto ptr = [&](uint32_t id) -> uint8_t* {
      const Value& v = h->values[id];
      if (v.buffer != nullptr) return v.buffer;
      return static_cast<uint8_t*>(args[size_t(v.arg)]->to_tensor().data());
    };
    for (Step& s : h->steps) {
      if (s.host) {
        const Value& in = h->values[s.in];
        transpose(ptr(s.in), ptr(s.out), in.dims, s.perm, s.num_dims, dtype_size(in.dtype));
        continue;
      }
      bool changed = s.bound.size() != s.externals.size();
      if (changed) s.bound.resize(s.externals.size());
      for (size_t e = 0; e < s.externals.size(); ++e) {
        void* p = ptr(s.externals[e]);
        if (s.bound[e].data != p) changed = true;
        s.bound[e] = xnn_external_value{uint32_t(e), p};
      }
      if (changed) {
        xnn_status st = xnn_setup_runtime(s.runtime, s.bound.size(), s.bound.data());
        if (st != xnn_status_success) {
          s.bound.clear();
          return fail(Error::DelegateFailed, "xnnpack: setup of nodes %u-%u: %s", unsigned(s.first),
                      unsigned(s.last - 1), status_name(st));
        }
      }
      xnn_status st = xnn_invoke_runtime(s.runtime);
      if (st != xnn_status_success)
        return fail(Error::DelegateFailed, "xnnpack: nodes %u-%u failed: %s", unsigned(s.first),
                    unsigned(s.last - 1), status_name(st));
    }
    // Outputs that live in an owned buffer (later steps read them) go to their argument.
    for (size_t e = 0; e < args.size(); ++e) {
      const Value& v = h->values[h->args[e]];
      if (v.output && v.buffer != nullptr) memcpy(args[e]->to_tensor().data(), v.buffer, v.nbytes);
    }
    return Error::Ok;
  }

  void destroy(void* handle) const override { delete static_cast<Handle*>(handle); }

  Parallel* create_parallel(int threads) const override {
    if (threads <= 1) return nullptr;
    pthreadpool_t pool = pthreadpool_create(size_t(threads));
    if (pool == nullptr) return nullptr;
    Parallel* p = new (std::nothrow) PthreadpoolParallel(pool);
    if (p == nullptr) pthreadpool_destroy(pool);
    return p;
  }
};

const XnnpackBackend kXnnpackBackend;

}  // namespace

Error register_xnnpack_backend() {
  return register_backend("XnnpackBackend", &kXnnpackBackend);
}

}  // namespace etb
