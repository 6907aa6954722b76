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

inline std::string JsonEscape(const std::string& in) {
  std::string out;
  for (char ch : in) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

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
            "%s{\"session\":%llu,\"name\":\"%s\",\"pid\":%u,\"peer\":\"%s\","
            "\"since\":\"%s\",\"heartbeat_age_ms\":%lld,\"lockd_loopback\":%s,"
            "\"this_lockctl\":%s,\"requests\":[",
            first ? "" : ",", static_cast<unsigned long long>(s.session_id),
            JsonEscape(s.client_name).c_str(), s.pid, s.peer.c_str(),
            FormatTime(s.since_unix_ns).c_str(), static_cast<long long>(s.heartbeat_age.count()),
            s.lockd_loopback ? "true" : "false", s.session_id == me ? "true" : "false");
    for (size_t i = 0; i < s.requests.size(); ++i) {
      const auto& q = s.requests[i];
      Appendf(&out, "%s{\"slot\":%llu,\"mode\":\"%s\",\"status\":\"%s\",\"ticket\":%u}",
              i ? "," : "", static_cast<unsigned long long>(q.slot), ModeName(q.mode),
              RequestStatusName(q.status), q.ticket);
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
          "{\"name\":\"%s\",\"slot\":%llu,\"state\":\"%s\",\"exclusive_outstanding\":%u,"
          "\"shared_outstanding\":%u,\"maxX\":%u,\"maxS\":%u,\"nX\":%u,\"nS\":%u,"
          "\"generation\":%llu,\"renewals\":%u,\"frozen\":%s,\"unrecorded\":%u,\"requests\":[",
          JsonEscape(name).c_str(), static_cast<unsigned long long>(v.slot), state,
          v.exclusive_outstanding, v.shared_outstanding, v.exclusive_issued, v.shared_issued,
          v.exclusive_released, v.shared_released, static_cast<unsigned long long>(v.generation),
          v.renewals, v.frozen ? "true" : "false",
          outstanding > who.size() ? static_cast<uint32_t>(outstanding - who.size()) : 0u);
  for (size_t i = 0; i < who.size(); ++i) {
    Appendf(&out,
            "%s{\"session\":%llu,\"name\":\"%s\",\"pid\":%u,\"peer\":\"%s\",\"status\":\"%s\","
            "\"mode\":\"%s\",\"ticket\":%u}",
            i ? "," : "", static_cast<unsigned long long>(who[i].session->session_id),
            JsonEscape(who[i].session->client_name).c_str(), who[i].session->pid,
            who[i].session->peer.c_str(), RequestStatusName(who[i].request.status),
            ModeName(who[i].request.mode), who[i].request.ticket);
  }
  out += "]}\n";
  return out;
}

// lockctl --etcd URL --json cluster: each shard's primary and members.
inline std::string ClusterJson(const std::string& cluster, const rdmalock::ClusterMap& map,
                               const std::vector<std::vector<std::string>>& members) {
  std::string out = "{\"cluster\":\"" + cluster + "\",\"shards\":[";
  for (size_t i = 0; i < map.shards.size(); ++i) {
    const auto& s = map.shards[i];
    out += std::string(i ? "," : "") + "{\"name\":\"" + s.name + "\",\"primary\":";
    if (s.server.empty()) {
      out += "null";
    } else {
      out += "\"" + s.server + ":" + std::to_string(s.port) + "\"";
    }
    out += ",\"members\":[";
    for (size_t k = 0; i < members.size() && k < members[i].size(); ++k) {
      out += std::string(k ? "," : "") + "\"" + members[i][k] + "\"";
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

}  // namespace lockctl
