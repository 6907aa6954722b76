// lockctl inspect: one lock word and the requests the session records show on it.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "client/lockctl/commands.h"
#include "client/lockctl/json.h"

namespace lockctl {

int CmdInspect(const Common& c, const std::string& name, int64_t slot) {
  if (name.empty() == (slot < 0)) {
    std::cerr << "lockctl inspect: give exactly one of NAME or --slot N\n";
    return kExitUsage;
  }
  int code = 0;
  auto client = ConnectOrDie(c, &code);
  if (!client) return code;
  const uint64_t s = slot >= 0 ? static_cast<uint64_t>(slot) : client->SlotOf(name);
  auto st = client->Inspect(s);
  if (!st.ok()) {
    std::cerr << "lockctl: " << st.status().ToString() << "\n";
    return st.status().code() == rdmalock::ErrorCode::kInvalidArgument ? kExitUsage
                                                                       : kExitUnavailable;
  }
  auto sessions = client->Sessions();
  if (!sessions.ok()) {
    std::cerr << "lockctl: " << sessions.status().ToString() << "\n";
    return kExitUnavailable;
  }
  using Who = InspectWho;
  std::vector<Who> who;
  for (const auto& ses : *sessions) {
    for (const auto& q : ses.requests) {
      if (q.slot == s && q.status != rdmalock::RequestInfo::Status::kStale)
        who.push_back({&ses, q});
    }
  }
  std::sort(who.begin(), who.end(), [](const Who& a, const Who& b) {
    return a.request.status == b.request.status ? a.request.ticket < b.request.ticket
                                                : a.request.status > b.request.status;
  });
  const auto& v = *st;
  const char* state = v.exclusive_outstanding == 0 && v.shared_outstanding == 0 ? "free"
                      : v.exclusive_held                                        ? "held exclusive"
                      : v.shared_holders > 0                                    ? "held shared"
                                             : "held (mixed queue)";
  const uint32_t outstanding = v.exclusive_outstanding + v.shared_outstanding;
  if (c.json) {
    std::fputs(InspectJson(name, v, state, who).c_str(), stdout);
    return 0;
  }
  if (!name.empty()) std::printf("name         %s\n", name.c_str());
  if (!c.cluster_file.empty() || !c.etcd.empty()) {  // which shard answered
    rdmalock::ClusterMap map;
    std::string source;
    bool unavailable = false;
    if (!name.empty() && c.shard.empty() && LoadClusterMap(c, &map, &source, &unavailable)) {
      std::printf("shard        %s\n", map.shards[rdmalock::ShardForName(map, name)].name.c_str());
    } else if (!c.shard.empty()) {
      std::printf("shard        %s\n", c.shard.c_str());
    }
  }
  std::printf("slot         %llu\n", static_cast<unsigned long long>(v.slot));
  std::printf("state        %s\n", state);
  std::printf("exclusive    %u outstanding (tickets issued %u, released %u)\n",
              v.exclusive_outstanding, v.exclusive_issued, v.exclusive_released);
  std::printf("shared       %u outstanding (tickets issued %u, released %u)\n",
              v.shared_outstanding, v.shared_issued, v.shared_released);
  std::printf("generation   %llu (renewals %u)%s\n", static_cast<unsigned long long>(v.generation),
              v.renewals, v.frozen ? "  [frozen: awaiting counter reset]" : "");
  for (const auto& w : who) {
    std::printf("%-12s session %llu ('%s', pid %u, %s): %s, ticket %u\n",
                RequestStatusName(w.request.status),
                static_cast<unsigned long long>(w.session->session_id),
                w.session->client_name.c_str(), w.session->pid, w.session->peer.c_str(),
                ModeName(w.request.mode), w.request.ticket);
  }
  if (outstanding > who.size()) {
    std::printf("unrecorded   %zu outstanding request(s) not in any session record\n",
                static_cast<size_t>(outstanding - who.size()));
  }
  return 0;
}

}  // namespace lockctl
