// Status and Result<T>: the error model of rdmalock. No exception crosses the SDK boundary; every
// fallible call returns one of these. Both types are cheap to move and safe to copy.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "rdmalock/export.h"

namespace rdmalock {

// What went wrong, coarse enough to branch on. Details are in Status::message().
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument,  // the caller passed something that cannot work (bad name, slot, option)
  kTimeout,          // the deadline passed before the operation could complete
  kBusy,             // a try-operation found the lock taken
  kLockLost,         // the grant is no longer valid (lease lapsed, skipped by recovery, fenced)
  kNotHeld,          // the handle does not hold the lock it was asked to release or renew
  kConnection,       // connecting to or talking to lockd failed
  kRejected,         // lockd refused the handshake (the message names the reason)
  kProtocol,         // a peer sent something that does not follow the protocol
  kResource,         // out of a resource (memory, QPs, sessions, descriptors)
  kUnsupported,      // the device or peer lacks a required capability
  kIo,               // a file or system call failed
  kConfig,           // a configuration file or value is invalid
  kInternal,         // a bug in rdmalock
};

// Human-readable name of a code, e.g. "timeout".
RDMALOCK_EXPORT std::string_view ErrorCodeName(ErrorCode code);

class [[nodiscard]] RDMALOCK_EXPORT Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  // Copies and moves touch the message only when there is one: an ok Status (the lock path
  // moves several per call) costs a code and no string copy. Defined here, inline: the layout
  // is the one the implicit members had, so the ABI is unchanged.
  Status(const Status& o) : code_(o.code_) {
    if (!o.message_.empty()) message_ = o.message_;
  }
  Status(Status&& o) noexcept : code_(o.code_) {
    if (!o.message_.empty()) message_ = std::move(o.message_);
  }
  Status& operator=(const Status& o) {
    code_ = o.code_;
    if (o.message_.empty()) {
      message_.clear();
    } else {
      message_ = o.message_;
    }
    return *this;
  }
  Status& operator=(Status&& o) noexcept {
    code_ = o.code_;
    if (o.message_.empty()) {
      message_.clear();
    } else {
      message_ = std::move(o.message_);
    }
    return *this;
  }
  ~Status() = default;

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "code: message", or "ok".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status Error(ErrorCode code, std::string message) {
  return Status(code, std::move(message));
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!status_.ok() && "Result built from an ok Status carries no value");
    if (status_.ok()) status_ = Status(ErrorCode::kInternal, "Result built from an ok Status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace rdmalock

// Propagates a non-ok Status from an expression returning Status.
#define RDMALOCK_RETURN_IF_ERROR(expr) \
  do {                                 \
    ::rdmalock::Status _st = (expr);   \
    if (!_st.ok()) return _st;         \
  } while (0)

#define RDMALOCK_CONCAT_INNER(a, b) a##b
#define RDMALOCK_CONCAT(a, b) RDMALOCK_CONCAT_INNER(a, b)
// Evaluates a Result expression; on error returns its Status, else moves the value into `lhs`.
#define RDMALOCK_ASSIGN_OR_RETURN(lhs, expr) \
  RDMALOCK_ASSIGN_OR_RETURN_IMPL(RDMALOCK_CONCAT(_res_, __LINE__), lhs, expr)
#define RDMALOCK_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
