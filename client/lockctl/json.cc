#include "client/lockctl/json.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "common/host_port.h"

namespace lockctl {

std::string JsonText(const Json& j) {
  // ensure_ascii off: valid UTF-8 is kept as it is; replace: each invalid sequence becomes U+FFFD.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string JsonLine(const Json& j) { return JsonText(j) + '\n'; }

std::string JsonString(std::string_view in) { return JsonText(Json(std::string(in))); }

double Fixed(double v, int decimals) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof(buf)) return v;  // huge: nothing to round
  return std::strtod(buf, nullptr);
}

std::string FormatTime(uint64_t unix_ns) {
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000ull);
  char buf[64];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

const char* RequestStatusName(rdmalock::RequestInfo::Status s) {
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

const char* ModeName(rdmalock::LockMode m) {
  return m == rdmalock::LockMode::kShared ? "shared" : "exclusive";
}

std::string ClientsJson(const std::vector<rdmalock::SessionInfo>& sessions, uint64_t me) {
  Json out = Json::array();
  for (const auto& s : sessions) {
    Json requests = Json::array();
    for (const auto& q : s.requests) {
      requests.push_back({{"slot", q.slot},
                          {"mode", ModeName(q.mode)},
                          {"status", RequestStatusName(q.status)},
                          {"ticket", q.ticket}});
    }
    out.push_back({{"session", s.session_id},
                   {"name", s.client_name},
                   {"pid", s.pid},
                   {"peer", s.peer},
                   {"since", FormatTime(s.since_unix_ns)},
                   {"heartbeat_age_ms", static_cast<long long>(s.heartbeat_age.count())},
                   {"lockd_loopback", s.lockd_loopback},
                   {"this_lockctl", s.session_id == me},
                   {"requests", std::move(requests)}});
  }
  return JsonLine(out);
}

std::string InspectJson(const std::string& name, const rdmalock::SlotState& v, const char* state,
                        const std::vector<InspectWho>& who) {
  const uint32_t outstanding = v.exclusive_outstanding + v.shared_outstanding;
  Json requests = Json::array();
  for (const auto& w : who) {
    requests.push_back({{"session", w.session->session_id},
                        {"name", w.session->client_name},
                        {"pid", w.session->pid},
                        {"peer", w.session->peer},
                        {"status", RequestStatusName(w.request.status)},
                        {"mode", ModeName(w.request.mode)},
                        {"ticket", w.request.ticket}});
  }
  const Json out = {
      {"name", name},
      {"slot", v.slot},
      {"state", state},
      {"exclusive_outstanding", v.exclusive_outstanding},
      {"shared_outstanding", v.shared_outstanding},
      {"maxX", v.exclusive_issued},
      {"maxS", v.shared_issued},
      {"nX", v.exclusive_released},
      {"nS", v.shared_released},
      {"generation", v.generation},
      {"renewals", v.renewals},
      {"frozen", v.frozen},
      {"unrecorded",
       outstanding > who.size() ? static_cast<uint32_t>(outstanding - who.size()) : 0u},
      {"requests", std::move(requests)}};
  return JsonLine(out);
}

std::string ShardAddress(const rdmalock::ShardSpec& s) {
  return s.server.empty() ? std::string() : rdmalock::JoinHostPort(s.server, s.port);
}

std::string ClusterJson(const std::string& cluster, const rdmalock::ClusterMap& map,
                        const std::vector<std::vector<std::string>>& members) {
  Json shards = Json::array();
  for (size_t i = 0; i < map.shards.size(); ++i) {
    const auto& s = map.shards[i];
    Json primary = nullptr;
    if (!s.server.empty()) primary = ShardAddress(s);
    Json m = Json::array();
    if (i < members.size()) {
      for (const auto& member : members[i]) m.push_back(member);
    }
    shards.push_back(
        {{"name", s.name}, {"primary", std::move(primary)}, {"members", std::move(m)}});
  }
  return JsonLine(Json{{"cluster", cluster}, {"shards", std::move(shards)}});
}

}  // namespace lockctl
