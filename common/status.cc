#include "rdmalock/status.h"

namespace rdmalock {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kBusy:
      return "busy";
    case ErrorCode::kLockLost:
      return "lock lost";
    case ErrorCode::kNotHeld:
      return "not held";
    case ErrorCode::kConnection:
      return "connection";
    case ErrorCode::kRejected:
      return "rejected";
    case ErrorCode::kProtocol:
      return "protocol";
    case ErrorCode::kResource:
      return "resource";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kConfig:
      return "config";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out(ErrorCodeName(code_));
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

}  // namespace rdmalock
