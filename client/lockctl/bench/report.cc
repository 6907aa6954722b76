// lockctl bench's report: the processes' samples merged into percentiles and a histogram, the
// client counters per operation, printed as text or as one JSON object.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "client/lockctl/bench/bench_internal.h"
#include "client/lockctl/json.h"

namespace lockctl::bench {
namespace {

double DecodeUs(uint32_t code) { return static_cast<double>(DecodeNs(code)) / 1000.0; }

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
};

Percentiles Summarize(const std::vector<uint32_t>& sorted) {
  Percentiles p;
  if (sorted.empty()) return p;
  auto at = [&](double q) {
    const size_t i = std::min(
        sorted.size() - 1, static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5));
    return DecodeUs(sorted[i]);
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  p.p999 = at(0.999);
  p.max = DecodeUs(sorted.back());
  return p;
}

// Log2 histogram of sorted samples: [upper bound in us, count] for buckets (.., 1], (1, 2],
// (2, 4], ...; empty buckets are left out.
std::vector<std::pair<uint64_t, uint64_t>> Log2Histogram(const std::vector<uint32_t>& sorted) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t bound_us = 1, count = 0;
  for (const uint32_t code : sorted) {
    const uint64_t ns = DecodeNs(code);
    while (ns > bound_us * 1000) {
      if (count > 0) out.emplace_back(bound_us, count);
      count = 0;
      bound_us *= 2;
    }
    ++count;
  }
  if (count > 0) out.emplace_back(bound_us, count);
  return out;
}

// Fine quantiles of sorted samples for a CDF (the log2 histogram is too coarse for one):
// [q, us] for q = 0 (the minimum), every percent, 0.995, 0.999, 0.9999 and 1 (the maximum), by
// Summarize's nearest-rank rule. deploy/perf/bare_lock.cc prints the same.
Json Quantiles(const std::vector<uint32_t>& sorted) {
  Json out = Json::array();
  if (sorted.empty()) return out;
  std::vector<double> qs;
  for (int i = 0; i <= 99; ++i) qs.push_back(i / 100.0);
  for (const double q : {0.995, 0.999, 0.9999, 1.0}) qs.push_back(q);
  for (const double q : qs) {
    const size_t i = std::min(
        sorted.size() - 1, static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5));
    out.push_back({Fixed(q, 4), Fixed(DecodeUs(sorted[i]), 2)});
  }
  return out;
}

Json PctJson(const Percentiles& p) {
  return {{"p50", Fixed(p.p50, 2)},
          {"p90", Fixed(p.p90, 2)},
          {"p99", Fixed(p.p99, 2)},
          {"p999", Fixed(p.p999, 2)},
          {"max", Fixed(p.max, 2)}};
}

void PrintTextPct(const char* label, const Percentiles& p, const char* note) {
  std::printf("%-20s p50 %.2f  p90 %.2f  p99 %.2f  p999 %.2f  max %.2f%s\n", label, p.p50, p.p90,
              p.p99, p.p999, p.max, note);
}

}  // namespace

int Report(const BenchOptions& o, std::vector<ProcResult>& procs, int failed_processes) {
  std::vector<uint32_t> acq, rel, pair;
  uint64_t locks = 0, late = 0, errors = 0;
  int64_t max_lag_ns = 0;
  double sets_per_s = 0, locks_per_s = 0, elapsed_sum = 0;
  rdmalock::ClientStats d;
  std::string first_error;
  for (auto& p : procs) {
    // Rates add up over processes, each over its own measured window.
    if (p.elapsed_s > 0) {
      sets_per_s += static_cast<double>(p.pair.size()) / p.elapsed_s;
      locks_per_s += static_cast<double>(p.locks) / p.elapsed_s;
    }
    elapsed_sum += p.elapsed_s;
    acq.insert(acq.end(), p.acquire.begin(), p.acquire.end());
    rel.insert(rel.end(), p.release.begin(), p.release.end());
    pair.insert(pair.end(), p.pair.begin(), p.pair.end());
    p.acquire = {};
    p.release = {};
    p.pair = {};
    locks += p.locks;
    late += p.late;
    errors += p.errors;
    max_lag_ns = std::max(max_lag_ns, p.max_lag_ns);
    if (first_error.empty()) first_error = p.first_error;
    Accumulate(d, p.stats);
  }
  const double elapsed = procs.empty() ? 0 : elapsed_sum / static_cast<double>(procs.size());
  std::sort(acq.begin(), acq.end());
  std::sort(rel.begin(), rel.end());
  std::sort(pair.begin(), pair.end());
  const Percentiles pa = Summarize(acq), pr = Summarize(rel), pp = Summarize(pair);
  const uint64_t n = pair.size();  // measured sets
  // Operations on lock words (atomics and READs), and WRITEs to the session record (request
  // entries, which share the atomics' doorbells, plus the background heartbeat).
  const uint64_t lock_ops = d.fetch_add + d.compare_swap + d.read;
  const uint64_t writes = d.write;
  auto per = [](uint64_t v, uint64_t by) {
    return by ? static_cast<double>(v) / static_cast<double>(by) : 0.0;
  };
  const bool open = o.rate > 0;
  const double late_pct = n ? 100.0 * static_cast<double>(late) / static_cast<double>(n) : 0.0;
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  if (o.json) {
    // The keys up to "errors" are those of the first versions (deploy/perf/run-perf.sh and
    // deploy/run-demo.sh read them); newer keys follow. acquire_us must open with p50.
    // Figures keep the decimals of the first versions (Fixed).
    Json hist = Json::array();
    for (const auto& [bound, count] : Log2Histogram(pair)) hist.push_back({bound, count});
    const Json out = {{"threads", o.threads},
                      {"locks", o.locks},
                      {"duration_s", Fixed(elapsed, 3)},
                      {"shared_ratio", Fixed(o.shared_ratio, 3)},
                      {"token", o.token},
                      {"acquisitions", n},
                      {"pairs_per_s", Fixed(sets_per_s, 1)},
                      {"acquire_us", PctJson(pa)},
                      {"release_us", PctJson(pr)},
                      {"pair_us", PctJson(pp)},
                      {"hold_us", o.hold_us},
                      {"rdma_ops_per_pair", Fixed(per(lock_ops + writes, d.acquires), 3)},
                      {"lock_word_ops_per_pair", Fixed(per(lock_ops, d.acquires), 3)},
                      {"record_writes_per_pair", Fixed(per(writes, d.acquires), 3)},
                      {"recoveries", d.recoveries},
                      {"restarts", d.restarts},
                      {"errors", errors},
                      {"cluster", o.cluster},
                      {"processes", o.processes},
                      {"total_threads", o.threads * o.processes},
                      {"failed_processes", failed_processes},
                      {"keys", o.keys},
                      {"zipf_s", Fixed(o.zipf_s, 3)},
                      {"batch", o.batch},
                      {"inflight", o.inflight},
                      {"sets_per_s", Fixed(sets_per_s, 1)},
                      {"locks_per_s", Fixed(locks_per_s, 1)},
                      {"locks_acquired", locks},
                      {"rdma_ops_per_set", Fixed(per(lock_ops + writes, n), 3)},
                      {"rdma_ops_per_lock", Fixed(per(lock_ops + writes, locks), 3)},
                      {"loop", open ? "open" : "closed"},
                      {"arrival", open ? "fixed" : "none"},
                      {"target_rate", Fixed(o.rate, 1)},
                      {"achieved_rate", Fixed(sets_per_s, 1)},
                      {"late", late},
                      {"late_pct", Fixed(late_pct, 3)},
                      {"late_threshold_us", Fixed(static_cast<double>(kLateNs) / 1000.0, 1)},
                      {"max_start_lag_us", Fixed(static_cast<double>(max_lag_ns) / 1000.0, 2)},
                      {"withdrawals", d.withdrawals},
                      {"deferred_releases", d.deferred_releases},
                      {"release_misses", d.release_misses},
                      {"local_handovers", d.local_handovers},
                      {"local_shares", d.local_shares},
                      {"auto_renew", o.auto_renew},
                      {"batches", d.batches},
                      {"batch_fallbacks", d.batch_fallbacks},
                      {"timeouts", d.timeouts},
                      {"lost", d.lost},
                      {"resets", d.resets},
                      {"abandoned", d.abandoned},
                      {"sessions_lost", d.sessions_lost},
                      {"reconnects", d.reconnects},
                      {"unrecorded", d.unrecorded},
                      {"waits", d.waits},
                      {"sdk_acquire_p50_us_bound", d.acquire_latency.QuantileUs(0.5)},
                      {"sdk_acquire_p99_us_bound", d.acquire_latency.QuantileUs(0.99)},
                      {"pair_hist_us", std::move(hist)},
                      {"pair_quantiles_us", Quantiles(pair)}};
    std::fputs(JsonLine(out).c_str(), stdout);
  } else {
    std::printf("bench: processes=%d threads=%d locks=%llu keys=%s", o.processes, o.threads,
                u(o.locks), o.keys.c_str());
    if (o.keys == "zipf") std::printf(" (s=%.2f)", o.zipf_s);
    std::printf(
        " batch=%d %s duration=%.2fs shared_ratio=%.2f token=%s auto_renew=%s hold=%dus%s\n",
        o.batch, open ? "open-loop" : "closed-loop", elapsed, o.shared_ratio,
        o.token ? "yes" : "no", o.auto_renew ? "yes" : "no", o.hold_us,
        o.cluster ? " cluster (names bench/K over the shards)" : "");
    std::printf(
        "acquisitions:        %llu sets of %d (%.1f acquire+release sets/s, %.1f locks/s)\n", u(n),
        o.batch, sets_per_s, locks_per_s);
    if (open) {
      std::printf(
          "open loop:           target %.1f sets/s (fixed inter-arrival per thread), achieved "
          "%.1f; late %llu (%.2f%%, started > %.0f us after schedule), max start lag %.2f us\n",
          o.rate, sets_per_s, u(late), late_pct, static_cast<double>(kLateNs) / 1000.0,
          static_cast<double>(max_lag_ns) / 1000.0);
    }
    const char* from = open ? "  (from the scheduled start)" : "";
    PrintTextPct("acquire latency us:", pa, from);
    PrintTextPct("release latency us:", pr, "");
    char note[96];
    std::snprintf(note, sizeof(note), "  (acquire + %d us held + release%s)", o.hold_us,
                  open ? ", from the scheduled start" : "");
    PrintTextPct("pair latency us:", pp, note);
    std::printf(
        "rdma ops per pair:   %.3f (%.3f atomics and READs on lock words, %.3f WRITEs to "
        "the session record, in the same doorbells)\n",
        per(lock_ops + writes, d.acquires), per(lock_ops, d.acquires), per(writes, d.acquires));
    if (o.batch > 1) {
      std::printf("rdma ops per set:    %.3f (%.3f per lock)\n", per(lock_ops + writes, n),
                  per(lock_ops + writes, locks));
    }
    std::printf(
        "client counters:     recoveries %llu  restarts %llu  withdrawals %llu  deferred releases "
        "%llu  release misses %llu  batches %llu  batch fallbacks %llu  timeouts %llu  lost %llu  "
        "reconnects %llu  "
        "local handovers %llu  local shares %llu\n",
        u(d.recoveries), u(d.restarts), u(d.withdrawals), u(d.deferred_releases),
        u(d.release_misses), u(d.batches), u(d.batch_fallbacks), u(d.timeouts), u(d.lost),
        u(d.reconnects), u(d.local_handovers), u(d.local_shares));
    std::printf(
        "sdk histogram:       %llu acquires, %llu waited; acquire p50 <= %llu us, p99 <= %llu us "
        "(ClientStats::acquire_latency, power-of-two buckets)\n",
        u(d.acquire_latency.count), u(d.waits), u(d.acquire_latency.QuantileUs(0.5)),
        u(d.acquire_latency.QuantileUs(0.99)));
    std::printf("errors %llu", u(errors));
    if (failed_processes > 0) std::printf("  failed processes %d", failed_processes);
    std::printf("\n");
  }
  std::fflush(stdout);
  if (errors > 0) {
    std::fprintf(stderr, "lockctl bench: %llu errors; first: %s\n", u(errors), first_error.c_str());
    return 1;
  }
  return n > 0 ? 0 : 1;
}

}  // namespace lockctl::bench
