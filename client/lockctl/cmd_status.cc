// lockctl status: lockd's epoch, lock table, lease and counters.
#include <cstdio>
#include <iostream>

#include "client/lockctl/commands.h"
#include "client/lockctl/json.h"

namespace lockctl {

int CmdStatus(const Common& c) {
  int code = 0;
  auto client = ConnectOrDie(c, &code);
  if (!client) return code;
  auto info = client->Info();
  if (!info.ok()) {
    std::cerr << "lockctl: " << info.status().ToString() << "\n";
    return kExitUnavailable;
  }
  const double lease_ms = static_cast<double>(info->lease.count()) / 1e6;
  if (c.json) {
    const Json out = {{"epoch", info->epoch},
                      {"lock_count", info->lock_count},
                      {"lease_ms", Fixed(lease_ms, 3)},
                      {"stall_factor", info->stall_factor},
                      {"max_sessions", info->max_sessions},
                      {"connected_clients", info->connected_clients},
                      {"accepted_total", info->accepted_total},
                      {"rejected_total", info->rejected_total},
                      {"recoveries", info->recoveries},
                      {"grace_until_unix_ns", info->grace_until_unix_ns},
                      {"started", FormatTime(info->start_time_unix_ns)}};
    std::fputs(JsonLine(out).c_str(), stdout);
    return 0;
  }
  std::printf("epoch            %llu\n", static_cast<unsigned long long>(info->epoch));
  std::printf("started          %s\n", FormatTime(info->start_time_unix_ns).c_str());
  std::printf("locks            %llu\n", static_cast<unsigned long long>(info->lock_count));
  std::printf("lease            %.0f ms (stall factor %u: waiters recover after %.0f ms)\n",
              lease_ms, info->stall_factor, lease_ms * info->stall_factor);
  std::printf("clients          %llu connected (this lockctl included), max %llu\n",
              static_cast<unsigned long long>(info->connected_clients),
              static_cast<unsigned long long>(info->max_sessions));
  std::printf("handshakes       %llu accepted, %llu rejected\n",
              static_cast<unsigned long long>(info->accepted_total),
              static_cast<unsigned long long>(info->rejected_total));
  std::printf("recoveries       %llu session(s) ended and freed by lockd\n",
              static_cast<unsigned long long>(info->recoveries));
  if (info->grace_until_unix_ns != 0) {
    std::printf("restart grace    until %s%s\n", FormatTime(info->grace_until_unix_ns).c_str(),
                info->clock_unix_ns < info->grace_until_unix_ns ? " (in progress)" : " (over)");
  }
  return 0;
}

}  // namespace lockctl
