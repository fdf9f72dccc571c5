// EValue: one slot of a method's value table (tensor, scalar, list, string or none).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/scalar.h"
#include "core/span.h"
#include "core/tensor.h"

namespace etb {

class EValue;

/// A list of ints whose items are other Int values (so symbolic ints update in place).
/// `get()` refreshes and returns the unboxed items.
struct BoxedIntList {
  EValue* const* items = nullptr;
  int64_t* unboxed = nullptr;
  size_t size = 0;
  Span<const int64_t> get() const;
};

/// The tag of an EValue.
enum class Tag : uint8_t {
  None,
  Int,
  Double,
  Bool,
  String,
  Tensor,
  IntList,
  DoubleList,
  BoolList,
  TensorList,
  OptionalTensorList,
};

/// The name of a tag ("Tensor") for messages.
const char* tag_name(Tag t);

/// A tagged value. Pointers refer to storage owned by the method (or the caller).
class EValue {
 public:
  EValue() : tag_(Tag::None) { u_.i = 0; }
  explicit EValue(int64_t v) : tag_(Tag::Int) { u_.i = v; }
  explicit EValue(double v) : tag_(Tag::Double) { u_.d = v; }
  explicit EValue(bool v) : tag_(Tag::Bool) { u_.b = v; }
  explicit EValue(Tensor* t) : tag_(Tag::Tensor) { u_.t = t; }
  /// A string that is not NUL-terminated.
  static EValue string(const char* p, size_t n) {
    EValue e; e.tag_ = Tag::String; e.u_.s.p = p; e.u_.s.n = n; return e;
  }
  static EValue int_list(BoxedIntList* l) { EValue e; e.tag_ = Tag::IntList; e.u_.il = l; return e; }
  static EValue double_list(const double* p, size_t n) {
    EValue e; e.tag_ = Tag::DoubleList; e.u_.dl.p = p; e.u_.dl.n = n; return e;
  }
  static EValue bool_list(const bool* p, size_t n) {
    EValue e; e.tag_ = Tag::BoolList; e.u_.bl.p = p; e.u_.bl.n = n; return e;
  }
  static EValue tensor_list(Tensor* const* p, size_t n, bool optional) {
    EValue e; e.tag_ = optional ? Tag::OptionalTensorList : Tag::TensorList;
    e.u_.tl.p = p; e.u_.tl.n = n; return e;
  }

  Tag tag() const { return tag_; }
  bool is_none() const { return tag_ == Tag::None; }
  bool is_int() const { return tag_ == Tag::Int; }
  bool is_double() const { return tag_ == Tag::Double; }
  bool is_bool() const { return tag_ == Tag::Bool; }
  bool is_scalar() const { return is_int() || is_double() || is_bool(); }
  bool is_string() const { return tag_ == Tag::String; }
  bool is_tensor() const { return tag_ == Tag::Tensor; }
  bool is_int_list() const { return tag_ == Tag::IntList; }
  bool is_double_list() const { return tag_ == Tag::DoubleList; }
  bool is_bool_list() const { return tag_ == Tag::BoolList; }
  bool is_tensor_list() const { return tag_ == Tag::TensorList; }
  bool is_optional_tensor_list() const { return tag_ == Tag::OptionalTensorList; }

  int64_t to_int() const { return u_.i; }
  double to_double() const { return u_.d; }
  bool to_bool() const { return u_.b; }
  Tensor& to_tensor() const { return *u_.t; }
  Tensor* tensor_ptr() const { return u_.t; }
  /// The value as a Scalar; only for Int, Double and Bool.
  Scalar to_scalar() const {
    return is_int() ? Scalar(u_.i) : is_double() ? Scalar(u_.d) : Scalar(u_.b);
  }
  const char* string_data() const { return u_.s.p; }
  size_t string_size() const { return u_.s.n; }
  Span<const int64_t> to_int_list() const { return u_.il->get(); }
  Span<const double> to_double_list() const { return Span<const double>(u_.dl.p, u_.dl.n); }
  Span<const bool> to_bool_list() const { return Span<const bool>(u_.bl.p, u_.bl.n); }
  /// Tensor lists; items of an optional list may be null.
  Span<Tensor* const> to_tensor_list() const { return Span<Tensor* const>(u_.tl.p, u_.tl.n); }

  /// Overwrites an Int value in place (symbolic ints).
  void set_int(int64_t v) { tag_ = Tag::Int; u_.i = v; }
  void set_double(double v) { tag_ = Tag::Double; u_.d = v; }
  void set_bool(bool v) { tag_ = Tag::Bool; u_.b = v; }

 private:
  Tag tag_;
  union {
    int64_t i;
    double d;
    bool b;
    Tensor* t;
    BoxedIntList* il;
    struct { const char* p; size_t n; } s;
    struct { const double* p; size_t n; } dl;
    struct { const bool* p; size_t n; } bl;
    struct { Tensor* const* p; size_t n; } tl;
  } u_;
};

inline Span<const int64_t> BoxedIntList::get() const {
  for (size_t i = 0; i < size; ++i) unboxed[i] = items[i]->to_int();
  return Span<const int64_t>(unboxed, size);
}

}  // namespace etb
