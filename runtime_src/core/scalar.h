// Scalar: an int, double or bool argument value (ATen's Scalar).
#pragma once

#include <cstdint>

namespace etb {

/// A dynamically typed number.
class Scalar {
 public:
  enum class Kind : uint8_t { Int, Double, Bool };
  Scalar() : kind_(Kind::Int), i_(0) {}
  explicit Scalar(int64_t v) : kind_(Kind::Int), i_(v) {}
  explicit Scalar(double v) : kind_(Kind::Double), d_(v) {}
  explicit Scalar(bool v) : kind_(Kind::Bool), b_(v) {}

  Kind kind() const { return kind_; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_double() const { return kind_ == Kind::Double; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  /// The value as a double (ints and bools convert).
  double to_double() const {
    return kind_ == Kind::Double ? d_ : kind_ == Kind::Int ? double(i_) : (b_ ? 1.0 : 0.0);
  }
  /// The value as an int64 (doubles truncate).
  int64_t to_int() const {
    return kind_ == Kind::Int ? i_ : kind_ == Kind::Double ? int64_t(d_) : (b_ ? 1 : 0);
  }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double d_;
    bool b_;
  };
};

/// An optional argument (ATen's `T?`).
template <typename T>
struct Optional {
  bool has_value = false;
  T value{};
  Optional() = default;
  Optional(T v) : has_value(true), value(v) {}  // NOLINT: implicit
};

}  // namespace etb
