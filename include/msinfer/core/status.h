// Status and StatusOr<T>: how errors cross module boundaries in msinfer.
// A Status carries a code and a message that names the thing at fault
// ("plan.json: field 'plan.micro_batches' must be >= 1"). No exceptions cross
// a library boundary; user input is answered with a Status, never a crash.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "msinfer/core/logging.h"

namespace msinfer {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad flag, field or file content
  kNotFound,         // a file, model or GPU that does not exist
  kFailedPrecondition,
  kOutOfRange,
  kResourceExhausted,  // does not fit (memory, capacity)
  kUnavailable,        // a peer or device that is not there
  kDeadlineExceeded,
  kInternal,
  kUnimplemented,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: <message>", or "OK".
  std::string to_string() const;
  // Returns a copy whose message is "<prefix>: <message>".
  Status with_context(const std::string& prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status not_found(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status failed_precondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status out_of_range(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
inline Status resource_exhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
inline Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status unimplemented(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}

// Holds either a T or a non-OK Status. Accessing value() of an error aborts
// (a programmer error: check ok() first or use MSI_ASSIGN_OR_RETURN).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit by design
    MSI_CHECK(!status.ok()) << "StatusOr constructed from an OK status without a value";
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& {
    MSI_CHECK(ok()) << "value() of an error: " << status_.to_string();
    return *value_;
  }
  T& value() & {
    MSI_CHECK(ok()) << "value() of an error: " << status_.to_string();
    return *value_;
  }
  // By value, so `for (auto& x : f().value())` does not dangle.
  T value() && {
    MSI_CHECK(ok()) << "value() of an error: " << status_.to_string();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace msinfer

#define MSI_STATUS_CONCAT_INNER(a, b) a##b
#define MSI_STATUS_CONCAT(a, b) MSI_STATUS_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define MSI_RETURN_IF_ERROR(expr)                        \
  do {                                                   \
    ::msinfer::Status msi_status_ = (expr);              \
    if (!msi_status_.ok()) return msi_status_;           \
  } while (0)

// `lhs` = value of the StatusOr `rexpr`, or return its Status.
#define MSI_ASSIGN_OR_RETURN(lhs, rexpr) \
  MSI_ASSIGN_OR_RETURN_IMPL(MSI_STATUS_CONCAT(msi_statusor_, __LINE__), lhs, rexpr)
#define MSI_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
