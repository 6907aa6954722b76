// lockctl top: the most contended locks, refreshed every interval. Reads the whole lock table
// with RDMA READs each time (lock_count x 16 bytes) and ranks slots by waiters, then by requests
// queued per second since the previous read.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/lockctl/commands.h"
#include "client/lockctl/json.h"
#include "rdmalock/proto/lock_word.h"

namespace lockctl {

int CmdTop(const Common& c, int interval_ms, int rows, int iterations,
           const std::vector<std::string>& names) {
  int code = 0;
  auto client = ConnectOrDie(c, &code);
  if (!client) return code;
  const uint64_t n = client->lock_count();
  std::unordered_map<uint64_t, std::string> label;
  for (const auto& name : names) {
    auto& l = label[client->SlotOf(name)];
    l += (l.empty() ? "" : ",") + name;
  }
  const bool tty = !c.json && isatty(STDOUT_FILENO) == 1;
  struct Prev {
    rdmalock::proto::Word0 word;
    uint32_t generation = 0;
  };
  std::vector<Prev> prev;
  auto last = std::chrono::steady_clock::now();
  for (int it = 0; iterations == 0 || it <= iterations; ++it) {
    if (it > 0) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    auto table = client->InspectRange(0, n);
    if (!table.ok()) {
      std::cerr << "lockctl: " << table.status().ToString() << "\n";
      return kExitUnavailable;
    }
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - last).count();
    last = now;
    struct Row {
      uint64_t slot;
      uint32_t holders, waiting;
      double rate;
      const char* state;
    };
    std::vector<Row> out;
    uint64_t held = 0, waiting = 0, contended = 0;
    const bool have_prev = !prev.empty();
    prev.resize(n);
    for (const auto& v : *table) {
      const rdmalock::proto::Word0 word{.max_s = v.shared_issued,
                                        .max_x = v.exclusive_issued,
                                        .n_s = v.shared_released,
                                        .n_x = v.exclusive_released};
      const auto gen = static_cast<uint32_t>(v.generation);
      const rdmalock::proto::Occupancy occ = rdmalock::proto::OccupancyOf(word);
      const uint32_t holders = occ.holders, w = occ.waiting;
      const uint32_t outstanding = occ.exclusive_outstanding + occ.shared_outstanding;
      Prev& p = prev[v.slot];
      const uint64_t queued =
          have_prev ? rdmalock::proto::RequestsBetween(p.word, p.generation, word, gen) : 0;
      p = {word, have_prev ? rdmalock::proto::GenerationSeen(p.generation, word, gen) : gen};
      if (holders > 0) ++held;
      waiting += w;
      if (w > 0) ++contended;
      if (holders == 0 && queued == 0) continue;
      const char* state = v.exclusive_held       ? "exclusive"
                          : v.shared_holders > 0 ? "shared"
                          : outstanding > 0      ? "mixed"
                                                 : "free";
      out.push_back(
          {v.slot, holders, w, secs > 0 ? static_cast<double>(queued) / secs : 0.0, state});
    }
    if (it == 0) continue;  // the first read only sets the baseline for requests/s
    std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) {
      if (a.waiting != b.waiting) return a.waiting > b.waiting;
      if (a.rate != b.rate) return a.rate > b.rate;
      return a.slot < b.slot;
    });
    if (out.size() > static_cast<size_t>(rows)) out.resize(static_cast<size_t>(rows));
    const std::time_t wall = std::time(nullptr);
    char when[32];
    std::tm tm{};
    gmtime_r(&wall, &tm);
    std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (c.json) {
      Json locks = Json::array();
      for (const auto& r : out) {
        const auto l = label.find(r.slot);
        locks.push_back({{"slot", r.slot},
                         {"names", l == label.end() ? std::string() : l->second},
                         {"state", r.state},
                         {"holders", r.holders},
                         {"waiting", r.waiting},
                         {"requests_per_s", Fixed(r.rate, 1)}});
      }
      const Json refresh = {{"time", std::string(when)}, {"interval_s", Fixed(secs, 3)},
                            {"lock_count", n},           {"held", held},
                            {"waiting", waiting},        {"contended", contended},
                            {"locks", std::move(locks)}};
      std::fputs(JsonLine(refresh).c_str(), stdout);
    } else {
      if (tty) std::printf("\033[H\033[2J");
      std::printf(
          "lockctl top  %s  %llu locks: %llu held, %llu waiting on %llu contended  (every %.1f "
          "s)\n\n",
          when, static_cast<unsigned long long>(n), static_cast<unsigned long long>(held),
          static_cast<unsigned long long>(waiting), static_cast<unsigned long long>(contended),
          interval_ms / 1000.0);
      std::printf("%-10s %-10s %8s %8s %12s  %s\n", "SLOT", "STATE", "HOLDERS", "WAITING",
                  "REQUESTS/S", "NAMES");
      for (const auto& r : out) {
        const auto l = label.find(r.slot);
        std::printf("%-10llu %-10s %8u %8u %12.1f  %s\n", static_cast<unsigned long long>(r.slot),
                    r.state, r.holders, r.waiting, r.rate,
                    l == label.end() ? "" : l->second.c_str());
      }
      if (out.empty()) std::printf("(no lock held or requested in this interval)\n");
    }
    // Nobody reads it any more (`lockctl top | head` with SIGPIPE ignored) or it cannot be
    // written: stop, instead of reading the lock table for ever (main says why and exits 74).
    if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) return 0;
  }
  return 0;
}

}  // namespace lockctl
