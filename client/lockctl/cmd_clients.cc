// lockctl clients: every session lockd has, with its recorded requests.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "client/lockctl/commands.h"
#include "client/lockctl/json.h"

namespace lockctl {
namespace {

std::string HeartbeatText(std::chrono::milliseconds age) {
  return age.count() < 0 ? "-" : std::to_string(age.count()) + " ms ago";
}

}  // namespace

int CmdClients(const Common& c) {
  int code = 0;
  auto client = ConnectOrDie(c, &code);
  if (!client) return code;
  auto sessions = client->Sessions();
  if (!sessions.ok()) {
    std::cerr << "lockctl: " << sessions.status().ToString() << "\n";
    return kExitUnavailable;
  }
  const uint64_t me = client->session_id();
  if (c.json) {
    std::fputs(ClientsJson(*sessions, me).c_str(), stdout);
    return 0;
  }
  std::printf("%-16s %-20s %-8s %-22s %-24s %-14s %-5s %s\n", "SESSION", "NAME", "PID", "PEER",
              "CONNECTED", "HEARTBEAT", "HELD", "WAITING");
  for (const auto& s : *sessions) {
    size_t held = 0, waiting = 0;
    for (const auto& q : s.requests) {
      if (q.status == rdmalock::RequestInfo::Status::kHolding) ++held;
      if (q.status == rdmalock::RequestInfo::Status::kWaiting ||
          q.status == rdmalock::RequestInfo::Status::kRequesting) {
        ++waiting;
      }
    }
    std::printf("%-16llu %-20s %-8u %-22s %-24s %-14s %-5zu %zu%s\n",
                static_cast<unsigned long long>(s.session_id), s.client_name.c_str(), s.pid,
                s.peer.c_str(), FormatTime(s.since_unix_ns).c_str(),
                s.lockd_loopback ? "-" : HeartbeatText(s.heartbeat_age).c_str(), held, waiting,
                s.lockd_loopback     ? "  (lockd loopback)"
                : s.session_id == me ? "  (this lockctl)"
                                     : "");
  }
  return 0;
}

}  // namespace lockctl
