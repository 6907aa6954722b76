// lockctl bench's parts, shared by its files (the interface is bench.h):
//   keys.cc       which slots a set locks (uniform or Zipf, distinct slots per set)
//   workload.cc   one process's run: its worker threads, their timing and the ClientStats delta
//   processes.cc  RunBench: the forked processes, their start together and their results' wire
//   report.cc     the merged figures: percentiles, histogram, text or JSON
//   progress.cc   the progress line on a terminal and its counters (progress.h)
// Thread-safety: KeySampler is immutable after construction (every worker thread draws from one);
// the rest are values or functions called from one thread of one process.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "client/lockctl/bench.h"
#include "client/lockctl/bench/progress.h"
#include "rdmalock/client.h"

namespace lockctl::bench {

using Clock = std::chrono::steady_clock;

// Open loop: a set that starts more than this after its scheduled time counts as late.
inline constexpr int64_t kLateNs = 10'000;
// How long the parent waits for a child to connect, or to report once the run is over.
inline constexpr auto kChildGrace = std::chrono::seconds(120);

// ---- latency samples

// A latency is kept as a 32-bit code: nanoseconds, exact below 2^31 ns (2.1 s), then in 1024 ns
// steps up to about 36 minutes (open-loop latencies of an overloaded run reach seconds). Codes
// sort as the latencies do.
inline constexpr uint32_t kExactLimit = uint32_t{1} << 31;

inline uint32_t EncodeNs(int64_t ns) {
  if (ns <= 0) return 0;
  if (ns < static_cast<int64_t>(kExactLimit)) return static_cast<uint32_t>(ns);
  const uint64_t coarse = (static_cast<uint64_t>(ns) - kExactLimit) >> 10;
  return kExactLimit + static_cast<uint32_t>(std::min<uint64_t>(coarse, kExactLimit - 1));
}

inline uint64_t DecodeNs(uint32_t code) {
  if (code < kExactLimit) return code;
  return kExactLimit + (static_cast<uint64_t>(code - kExactLimit) << 10);
}

// ---- keys (keys.cc)

// Draws slots in [0, locks): uniformly, or Zipf(s) over ranks (rank k has weight 1/(k+1)^s) by
// binary search in the precomputed CDF. Rank k maps to slot (k * stride + offset) mod locks with
// stride about 0.618 x locks and coprime to it, so the hot slots are spread over the table rather
// than adjacent.
class KeySampler {
 public:
  explicit KeySampler(const BenchOptions& o);

  // Inline: every acquire draws one.
  uint64_t operator()(std::mt19937_64& rng) const {
    if (cdf_.empty()) return std::uniform_int_distribution<uint64_t>(0, n_ - 1)(rng);
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
    const uint64_t rank = std::min<uint64_t>(
        n_ - 1,
        static_cast<uint64_t>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin()));
    return (rank * stride_ + offset_) % n_;  // < 2^56: rank and stride are below kMaxLocks
  }

 private:
  uint64_t n_;
  std::vector<double> cdf_;  // empty: uniform
  uint64_t stride_ = 1, offset_ = 0;
};

// Fills `set` with o.batch distinct slots drawn from `keys`, each shared with probability
// shared_ratio. A draw that repeats a slot is redrawn up to 16 times, then moved to the next free
// slot (so very skewed draws of large sets terminate).
void PickSet(const BenchOptions& o, const KeySampler& keys, std::mt19937_64& rng,
             std::bernoulli_distribution& shared, std::vector<rdmalock::SlotRequest>& set,
             std::unordered_set<uint64_t>& taken);

// ---- one process's run (workload.cc)

// One measured set, for --timeline: when it started and was granted (steady_clock ns, which is
// CLOCK_MONOTONIC) and its (first) lock's fencing token (0 without --token).
struct TimelineEntry {
  int64_t start = 0, granted = 0;
  uint64_t token = 0;
};

// What one process measured; children send it to the parent.
struct ProcResult {
  std::vector<uint32_t> acquire, release, pair;  // codes (EncodeNs)
  uint64_t locks = 0, late = 0, errors = 0;
  int64_t max_lag_ns = 0;
  double elapsed_s = 0;
  rdmalock::ClientStats stats;  // over the measured window
  std::string first_error;
  std::vector<TimelineEntry> timeline;  // with --timeline: each measured set's, any order
};

// Runs o.threads workers against `target` for the warm-up and the measured window.
// `proc` numbers the process (0: the parent), which seeds its threads' generators. With
// `progress`, worker g of this process counts its measured acquisitions in slot
// proc * o.threads + g; with `draw` too (the parent, on a terminal), the main thread redraws the
// progress line while it waits and clears it at the end.
ProcResult RunWorkload(const BenchTarget& target, const BenchOptions& o, const KeySampler& keys,
                       int proc, ProgressCounters* progress, bool draw);

// sum += v, counter by counter.
void Accumulate(rdmalock::ClientStats& sum, const rdmalock::ClientStats& v);

// Writes `timeline` to `path`, one "START_NS GRANTED_NS TOKEN" line a set in order of grant.
// False if the file cannot be written (errno says why).
bool WriteTimeline(const std::string& path, std::vector<TimelineEntry>& timeline);

// ---- report (report.cc)

// Merges what the processes measured, prints it and returns the exit code: 1 if any operation
// failed or nothing was measured. Takes the samples out of `procs`.
int Report(const BenchOptions& o, std::vector<ProcResult>& procs, int failed_processes);

}  // namespace lockctl::bench
