// What lockd's GET /metrics shows: RenderMetrics turns the counters, a few constants and one
// sampling pass over the lock table into Prometheus text. Pure apart from the clock: it reads
// atomics and relaxed 8-byte loads of the lock table only, never the event loop's state (rdma_cm
// objects, the session table). Unit-tested over a lock table in plain memory
// (tests/unit/metrics_test.cc).
//
// Threading: RenderMetrics runs on the metrics server's HTTP thread, concurrently with the event
// loop. LockTableSampler's mutex mu_ guards its memory of the previous scrape (one scrape at a
// time now, but the sampler does not count on it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/sync/mutex.h"
#include "server/config.h"
#include "server/metrics.h"

namespace rdmalock::lockd {

// Occupancy from one pass of relaxed loads over the lock table (not a snapshot: clients change
// words while it reads), and a count of requests that queued since the last scrape.
class LockTableSampler {
 public:
  // `locks` is the lock table (lock_count slots), alive as long as this sampler.
  LockTableSampler(const uint8_t* locks, uint64_t lock_count)
      : locks_(locks), lock_count_(lock_count) {}
  // Appends the lock-table families to `p` and remembers this pass for the next.
  void Render(PromText& p) EXCLUDES(mu_);

 private:
  // Constant after construction.
  const uint8_t* const locks_;
  const uint64_t lock_count_;

  Mutex mu_;                                     // two HTTP workers may scrape at once
  std::vector<uint64_t> word0_ GUARDED_BY(mu_);  // word0 per slot at the last scrape
  std::vector<uint32_t> gen_ GUARDED_BY(mu_);    // word1's generation (low 32 bits) then
  uint64_t requests_ GUARDED_BY(mu_) = 0;        // requests seen queueing, summed over scrapes
  bool sampled_ GUARDED_BY(mu_) = false;
};

// What the rendering reads besides the lock table: constants and atomics only.
struct MetricsSource {
  uint64_t epoch = 0;
  const Config* config = nullptr;
  std::chrono::system_clock::time_point started_wall;
  std::chrono::system_clock::time_point grace_until_wall;  // epoch (none) without a grace period
  const Counters* counters = nullptr;
  const std::atomic<uint64_t>* connected = nullptr;  // sessions connected now
};

std::string RenderMetrics(const MetricsSource& s, LockTableSampler& sampler,
                          std::chrono::system_clock::time_point now_wall);

}  // namespace rdmalock::lockd
