// libFuzzer target: lockctl's command line and its client config file (~/.config/rdmalock/
// client.yaml), parsed as lockctl parses them, without the network. The first byte picks which:
// even, the rest is argv (split at NUL bytes); odd, the rest is the config file's text, a cluster
// map, and a duration (common/duration.h: what parses prints back as the same value). Nothing may
// crash, and what is accepted must be in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "client/lockctl/args.h"
#include "common/duration.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    std::vector<std::string> words{"lockctl"};
    std::string cur;
    for (const char ch : rest) {
      if (ch == '\0') {
        words.push_back(cur);
        cur.clear();
      } else {
        cur += ch;
      }
    }
    words.push_back(cur);
    if (words.size() > 64) return 0;
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    lockctl::Args a;
    const int rc = lockctl::ParseArgs(static_cast<int>(words.size()), argv.data(), &a);
    Check(rc == -1 || rc == 0 || rc == lockctl::kExitUsage);
    if (rc == -1) {
      Check(a.common.port >= 1 && a.common.port <= 65535);
      Check(a.common.connect_timeout_ms > 0);
      Check(a.acq_timeout >= -1 && a.acq_grace >= -1);
      if (a.command == lockctl::Command::kBench) Check(lockctl::ValidateBenchOptions(a.bench) == 0);
      if (a.command == lockctl::Command::kTop) {
        Check(a.top_interval >= 50 && a.top_rows >= 1 && a.top_iterations >= 0);
      }
    }
  } else {
    lockctl::Target t;
    if (lockctl::ParseClientConfig(rest, "client.yaml", false, false, false, &t)) {
      Check(t.port >= 1 && t.port <= 65535);
      Check(t.connect_timeout_ms >= 1 && t.connect_timeout_ms <= 3600000);
      Check(t.server.empty() == t.source.empty());
    }
    // The same bytes as a duration: a value that parses is >= 0 and prints back as itself.
    for (const auto unit :
         {rdmalock::DurationUnit::kMicroseconds, rdmalock::DurationUnit::kMilliseconds,
          rdmalock::DurationUnit::kSeconds}) {
      auto ns = rdmalock::ParseDurationNs(rest, unit);
      if (!ns.ok()) continue;
      Check(*ns >= 0);
      auto back = rdmalock::ParseDurationNs(rdmalock::FormatDuration(*ns), unit);
      Check(back.ok() && *back == *ns);
    }
    // The same bytes as a cluster map: what parses is a valid map with a shard for any name.
    rdmalock::ClusterMap map;
    if (lockctl::ParseClusterMap(rest, "cluster.yaml", &map)) {
      Check(map.Validate().ok());
      Check(rdmalock::ShardForName(map, rest) < map.shards.size());
    }
  }
  return 0;
}
