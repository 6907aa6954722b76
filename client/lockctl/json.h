// lockctl's --json output: the printers of the commands whose output holds strings that come
// from lockd or etcd (client names, peers, shard names and addresses), kept here so that host
// tests can feed them any bytes (issue 17, finding 14).
#pragma once

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "rdmalock/client.h"
#include "rdmalock/cluster.h"

namespace lockctl {

inline std::string FormatTime(uint64_t unix_ns) {
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000ull);
  char buf[64];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The one escaper of every string lockctl prints in --json output: the body of a JSON string
// (without its quotes) for any bytes. '"', '\' and control characters (and DEL) are escaped;
// valid UTF-8 is kept as it is; each byte that does not belong to a valid UTF-8 sequence
// (a stray continuation byte, a truncated or overlong sequence, a surrogate, 0xF5-0xFF) becomes
// U+FFFD, so the output is always valid UTF-8 and valid JSON.
inline std::string JsonEscape(std::string_view in) {
  std::string out;
  out.reserve(in.size() + 2);
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(in[i]); };
  const auto cont = [&](size_t i) { return i < in.size() && (byte(i) & 0xC0) == 0x80; };
  for (size_t i = 0; i < in.size();) {
    const unsigned char ch = byte(i);
    if (ch < 0x80) {
      switch (ch) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (ch < 0x20 || ch == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(ch));
            out += buf;
          } else {
            out += static_cast<char>(ch);
          }
      }
      ++i;
      continue;
    }
    // The length of a valid sequence starting at i, or 0 (RFC 3629's table).
    size_t len = 0;
    if (ch >= 0xC2 && ch <= 0xDF) {
      len = cont(i + 1) ? 2 : 0;
    } else if (ch >= 0xE0 && ch <= 0xEF) {
      const unsigned char lo = ch == 0xE0 ? 0xA0 : 0x80, hi = ch == 0xED ? 0x9F : 0xBF;
      len = i + 1 < in.size() && byte(i + 1) >= lo && byte(i + 1) <= hi && cont(i + 2) ? 3 : 0;
    } else if (ch >= 0xF0 && ch <= 0xF4) {
      const unsigned char lo = ch == 0xF0 ? 0x90 : 0x80, hi = ch == 0xF4 ? 0x8F : 0xBF;
      len =
          i + 1 < in.size() && byte(i + 1) >= lo && byte(i + 1) <= hi && cont(i + 2) && cont(i + 3)
              ? 4
              : 0;
    }
    if (len == 0) {
      out += "\\ufffd";
      ++i;
    } else {
      out.append(in.substr(i, len));
      i += len;
    }
  }
  return out;
}

// A JSON string: JsonEscape's output in quotes.
inline std::string JsonString(std::string_view in) { return "\"" + JsonEscape(in) + "\""; }

inline const char* RequestStatusName(rdmalock::RequestInfo::Status s) {
  switch (s) {
    case rdmalock::RequestInfo::Status::kRequesting:
      return "requesting";
    case rdmalock::RequestInfo::Status::kWaiting:
      return "waiting";
    case rdmalock::RequestInfo::Status::kHolding:
      return "holding";
    case rdmalock::RequestInfo::Status::kStale:
      return "stale";
  }
  return "?";
}

inline const char* ModeName(rdmalock::LockMode m) {
  return m == rdmalock::LockMode::kShared ? "shared" : "exclusive";
}

// Appends printf-formatted text to *out.
template <typename... A>
void Appendf(std::string* out, const char* fmt, A... a) {
  const int n = std::snprintf(nullptr, 0, fmt, a...);
  if (n <= 0) return;
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(n) + 1);
  std::snprintf(out->data() + at, static_cast<size_t>(n) + 1, fmt, a...);
  out->resize(at + static_cast<size_t>(n));
}

// lockctl --json clients; `me` is this lockctl's own session.
inline std::string ClientsJson(const std::vector<rdmalock::SessionInfo>& sessions, uint64_t me) {
  std::string out = "[";
  bool first = true;
  for (const auto& s : sessions) {
    Appendf(&out,
            "%s{\"session\":%llu,\"name\":%s,\"pid\":%u,\"peer\":%s,"
            "\"since\":%s,\"heartbeat_age_ms\":%lld,\"lockd_loopback\":%s,"
            "\"this_lockctl\":%s,\"requests\":[",
            first ? "" : ",", static_cast<unsigned long long>(s.session_id),
            JsonString(s.client_name).c_str(), s.pid, JsonString(s.peer).c_str(),
            JsonString(FormatTime(s.since_unix_ns)).c_str(),
            static_cast<long long>(s.heartbeat_age.count()), s.lockd_loopback ? "true" : "false",
            s.session_id == me ? "true" : "false");
    for (size_t i = 0; i < s.requests.size(); ++i) {
      const auto& q = s.requests[i];
      Appendf(&out, "%s{\"slot\":%llu,\"mode\":%s,\"status\":%s,\"ticket\":%u}", i ? "," : "",
              static_cast<unsigned long long>(q.slot), JsonString(ModeName(q.mode)).c_str(),
              JsonString(RequestStatusName(q.status)).c_str(), q.ticket);
    }
    out += "]}";
    first = false;
  }
  out += "]\n";
  return out;
}

// A request on the inspected lock, and the session whose record shows it.
struct InspectWho {
  const rdmalock::SessionInfo* session;
  rdmalock::RequestInfo request;
};

// lockctl --json inspect: the lock word of `name` (empty with --slot), then its requests.
inline std::string InspectJson(const std::string& name, const rdmalock::SlotState& v,
                               const char* state, const std::vector<InspectWho>& who) {
  const uint32_t outstanding = v.exclusive_outstanding + v.shared_outstanding;
  std::string out;
  Appendf(&out,
          "{\"name\":%s,\"slot\":%llu,\"state\":%s,\"exclusive_outstanding\":%u,"
          "\"shared_outstanding\":%u,\"maxX\":%u,\"maxS\":%u,\"nX\":%u,\"nS\":%u,"
          "\"generation\":%llu,\"renewals\":%u,\"frozen\":%s,\"unrecorded\":%u,\"requests\":[",
          JsonString(name).c_str(), static_cast<unsigned long long>(v.slot),
          JsonString(state).c_str(), v.exclusive_outstanding, v.shared_outstanding,
          v.exclusive_issued, v.shared_issued, v.exclusive_released, v.shared_released,
          static_cast<unsigned long long>(v.generation), v.renewals, v.frozen ? "true" : "false",
          outstanding > who.size() ? static_cast<uint32_t>(outstanding - who.size()) : 0u);
  for (size_t i = 0; i < who.size(); ++i) {
    Appendf(&out,
            "%s{\"session\":%llu,\"name\":%s,\"pid\":%u,\"peer\":%s,\"status\":%s,\"mode\":%s,"
            "\"ticket\":%u}",
            i ? "," : "", static_cast<unsigned long long>(who[i].session->session_id),
            JsonString(who[i].session->client_name).c_str(), who[i].session->pid,
            JsonString(who[i].session->peer).c_str(),
            JsonString(RequestStatusName(who[i].request.status)).c_str(),
            JsonString(ModeName(who[i].request.mode)).c_str(), who[i].request.ticket);
  }
  out += "]}\n";
  return out;
}

// lockctl --etcd URL --json cluster: each shard's primary and members.
inline std::string ClusterJson(const std::string& cluster, const rdmalock::ClusterMap& map,
                               const std::vector<std::vector<std::string>>& members) {
  std::string out = "{\"cluster\":" + JsonString(cluster) + ",\"shards\":[";
  for (size_t i = 0; i < map.shards.size(); ++i) {
    const auto& s = map.shards[i];
    out += std::string(i ? "," : "") + "{\"name\":" + JsonString(s.name) + ",\"primary\":";
    if (s.server.empty()) {
      out += "null";
    } else {
      out += JsonString(s.server + ":" + std::to_string(s.port));
    }
    out += ",\"members\":[";
    for (size_t k = 0; i < members.size() && k < members[i].size(); ++k) {
      out += std::string(k ? "," : "") + JsonString(members[i][k]);
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

}  // namespace lockctl
