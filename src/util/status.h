// Status and StatusOr: how errors caused by input travel through K3.
//
// Library code never aborts on bad input; it returns a Status with a one-line
// message naming the problem, and the CLI prints it and exits non-zero.
// Assertions (K3_CHECK) are only for internal invariants.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace k3 {

enum class StatusCode { kOk = 0, kInvalidArgument, kNotFound, kDataLoss, kOutOfRange, kUnimplemented, kInternal, kIo };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefix the message with context ("loading m/model.safetensors: ...").
  Status with_context(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
inline Status not_found(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status data_loss(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
inline Status out_of_range(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
inline Status unimplemented(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
inline Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status io_error(std::string m) { return Status(StatusCode::kIo, std::move(m)); }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = internal_error("StatusOr constructed from OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace k3

#define K3_CONCAT_INNER_(a, b) a##b
#define K3_CONCAT_(a, b) K3_CONCAT_INNER_(a, b)

// Return early from a function returning Status/StatusOr if expr fails.
#define K3_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::k3::Status k3_status_ = (expr);       \
    if (!k3_status_.ok()) return k3_status_; \
  } while (0)

#define K3_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// K3_ASSIGN_OR_RETURN(auto x, make_x()); unwraps a StatusOr or returns its error.
#define K3_ASSIGN_OR_RETURN(lhs, expr) K3_ASSIGN_OR_RETURN_IMPL_(K3_CONCAT_(k3_or_, __LINE__), lhs, expr)

// Internal invariant: a bug in K3 if it fails, never a consequence of input.
#define K3_CHECK(cond)                                                                  \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "k3: internal error: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
