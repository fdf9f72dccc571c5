// Result<T>: a value or an Error, for functions that can fail without exceptions.
#pragma once

#include <new>
#include <type_traits>
#include <utility>

#include "core/error.h"

namespace etb {

/// Holds either a T or a non-Ok Error. Check ok() before value(): value() of an error is a
/// bug in the caller, and stops the program (a trap) rather than read garbage.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(Error e) : error_(e == Error::Ok ? Error::Internal : e) {}  // NOLINT: implicit
  Result(T&& v) : error_(Error::Ok) { new (&storage_) T(std::move(v)); }  // NOLINT
  Result(const T& v) : error_(Error::Ok) { new (&storage_) T(v); }        // NOLINT
  Result(Result&& o) noexcept : error_(o.error_) {
    if (ok()) new (&storage_) T(std::move(o.value()));
  }
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
  Result& operator=(Result&&) = delete;
  ~Result() {
    if (ok()) value().~T();
  }

  /// True when a value is held.
  bool ok() const { return error_ == Error::Ok; }
  /// The error (Ok when a value is held).
  Error error() const { return error_; }
  /// The held value; only valid when ok().
  T& value() {
    if (!ok()) __builtin_trap();
    return *reinterpret_cast<T*>(&storage_);
  }
  const T& value() const {
    if (!ok()) __builtin_trap();
    return *reinterpret_cast<const T*>(&storage_);
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  Error error_;
  typename std::aligned_storage<sizeof(T), alignof(T)>::type storage_;
};

}  // namespace etb

#define ETB_CONCAT_INNER_(a, b) a##b
#define ETB_CONCAT_(a, b) ETB_CONCAT_INNER_(a, b)

/// Declares `lhs` from a Result-valued expression, returning its error when it failed.
#define ETB_ASSIGN_OR_RETURN(lhs, expr) \
  ETB_ASSIGN_OR_RETURN_IMPL_(ETB_CONCAT_(etb_res_, __LINE__), lhs, expr)
#define ETB_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.error();               \
  lhs = std::move(tmp.value())
