// Status / Result<T>: the second error tier, for runtime conditions the caller must handle (a bad
// file, a bad flag, a request over a limit). The message is for a person: it names the file, the
// tensor or the field, and the expected vs actual value.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "core/check.h"

namespace tf {

enum class StatusCode {
  kOk,
  kInvalidArgument,
  kNotFound,
  kIo,
  kCorrupt,
  kUnsupported,
  kOutOfRange,
  kResourceExhausted,
  kUnavailable,
  kInternal
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  template <typename... Args>
  static Status invalid(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status not_found(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status io(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kIo, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status corrupt(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kCorrupt, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status unsupported(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kUnsupported, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  static Status out_of_range(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kOutOfRange, fmt::format(f, std::forward<Args>(args)...));
  }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corrupt: model.safetensors: tensor x: ..." — what the CLI prints.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    TF_CHECK(!std::get<Status>(v_).is_ok(), "Result built from an ok Status");
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    TF_CHECK(is_ok(), "value() of an error Result: {}", std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  T&& value() && {
    TF_CHECK(is_ok(), "value() of an error Result: {}", std::get<Status>(v_).to_string());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tf

// Propagate a non-ok Status from an expression returning Status.
#define TF_RETURN_IF_ERROR(expr)                \
  do {                                          \
    ::tf::Status tf_status_ = (expr);           \
    if (!tf_status_.is_ok()) return tf_status_; \
  } while (0)

#define TF_CONCAT_INNER(a, b) a##b
#define TF_CONCAT(a, b) TF_CONCAT_INNER(a, b)
// TF_ASSIGN_OR_RETURN(auto x, make_x()): bind the value or return the error.
#define TF_ASSIGN_OR_RETURN(lhs, expr) \
  TF_ASSIGN_OR_RETURN_IMPL(TF_CONCAT(tf_result_, __LINE__), lhs, expr)
#define TF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
