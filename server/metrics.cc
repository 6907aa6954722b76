#include "server/metrics.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace rdmalock::lockd {

std::string_view EndReasonLabel(EndReason r) {
  switch (r) {
    case EndReason::kDisconnected:
      return "disconnected";
    case EndReason::kConnectFailed:
      return "connect_failed";
    case EndReason::kHeartbeatTimeout:
      return "heartbeat_timeout";
    case EndReason::kQpError:
      return "qp_error";
    case EndReason::kForced:
      return "forced";
    case EndReason::kCount:
      break;
  }
  return "unknown";
}

Status ParseHostPort(const std::string& address, std::string* host, uint16_t* port) {
  const auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kConfig, "'" + address + "' " + why + " (want HOST:PORT, e.g. " +
                                         "127.0.0.1:9477 or [::1]:9477)");
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("has no host and port");
  std::string h = address.substr(0, colon);
  const std::string p = address.substr(colon + 1);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return bad("has an unclosed IPv6 bracket");
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return bad("has an IPv6 host without brackets");
  }
  unsigned v = 0;
  const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (p.empty() || ec != std::errc() || end != p.data() + p.size() || v < 1 || v > 65535) {
    return bad("has a port that is not in 1..65535");
  }
  *host = h;
  *port = static_cast<uint16_t>(v);
  return Status::Ok();
}

void PromText::Family(std::string_view name, std::string_view type, std::string_view help) {
  family_ = name;
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += help;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void PromText::Begin(std::string_view labels) {
  out_ += family_;
  if (!labels.empty()) {
    out_ += '{';
    out_ += labels;
    out_ += '}';
  }
  out_ += ' ';
}

void PromText::Sample(uint64_t value, std::string_view labels) {
  Begin(labels);
  out_ += std::to_string(value);
  out_ += '\n';
}

void PromText::Sample(double value, std::string_view labels) {
  Begin(labels);
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  out_.append(buf, ec == std::errc() ? end : buf);
  out_ += '\n';
}

std::string PromText::Escape(std::string_view v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      o += '\\';
      o += c;
    } else if (c == '\n') {
      o += "\\n";
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace rdmalock::lockd
