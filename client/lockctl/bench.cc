#include "bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

namespace lockctl {
namespace {

using Clock = std::chrono::steady_clock;

struct ThreadResult {
  std::vector<uint32_t> acquire_ns;
  std::vector<uint32_t> release_ns;
  std::vector<uint32_t> pair_ns;  // acquire + critical section + release
  uint64_t errors = 0;
  std::string first_error;
};

double Pct(const std::vector<uint32_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p * (sorted.size() - 1) + 0.5));
  return sorted[i] / 1000.0;
}

}  // namespace

int RunBench(rdmalock::Client& client, const BenchOptions& o) {
  if (o.threads < 1 || o.locks < 1 || o.locks > client.lock_count() || o.duration_s <= 0 ||
      o.shared_ratio < 0 || o.shared_ratio > 1) {
    std::fprintf(stderr,
                 "lockctl bench: bad options (threads >= 1, 1 <= locks <= %llu, "
                 "duration > 0, 0 <= shared-ratio <= 1)\n",
                 static_cast<unsigned long long>(client.lock_count()));
    return 64;
  }
  std::atomic<bool> measuring{false}, stop{false};
  std::vector<ThreadResult> results(static_cast<size_t>(o.threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < o.threads; ++t) {
    workers.emplace_back([&, t] {
      ThreadResult& r = results[static_cast<size_t>(t)];
      r.acquire_ns.reserve(1 << 20);
      r.release_ns.reserve(1 << 20);
      r.pair_ns.reserve(1 << 20);
      std::mt19937_64 rng(static_cast<uint64_t>(t) * 7919 + 17);
      std::uniform_int_distribution<uint64_t> slot_dist(0, o.locks - 1);
      std::bernoulli_distribution shared(o.shared_ratio);
      rdmalock::LockOptions lo;
      lo.fencing_token = o.token;
      lo.auto_renew = false;
      while (!stop.load(std::memory_order_relaxed)) {
        lo.mode = shared(rng) ? rdmalock::LockMode::kShared : rdmalock::LockMode::kExclusive;
        const uint64_t slot = slot_dist(rng);
        const auto t0 = Clock::now();
        auto h = client.LockSlot(slot, lo);
        const auto t1 = Clock::now();
        if (!h.ok()) {
          if (r.errors++ == 0) r.first_error = h.status().ToString();
          continue;
        }
        if (o.hold_us > 0) {
          const auto until = Clock::now() + std::chrono::microseconds(o.hold_us);
          while (Clock::now() < until) {
          }
        }
        const auto t1r = Clock::now();
        const rdmalock::Status st = h->Release();
        const auto t2 = Clock::now();
        if (!st.ok() && r.errors++ == 0) r.first_error = st.ToString();
        if (measuring.load(std::memory_order_relaxed)) {
          r.acquire_ns.push_back(
              static_cast<uint32_t>(std::min<int64_t>((t1 - t0).count(), UINT32_MAX)));
          r.release_ns.push_back(
              static_cast<uint32_t>(std::min<int64_t>((t2 - t1r).count(), UINT32_MAX)));
          r.pair_ns.push_back(
              static_cast<uint32_t>(std::min<int64_t>((t2 - t0).count(), UINT32_MAX)));
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_s));
  const rdmalock::ClientStats at_start = client.Stats();
  measuring.store(true);
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.duration_s));
  measuring.store(false);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const rdmalock::ClientStats at_end = client.Stats();
  stop.store(true);
  for (auto& w : workers) w.join();

  std::vector<uint32_t> acq, rel, pair;
  uint64_t errors = 0;
  std::string first_error;
  for (auto& r : results) {
    acq.insert(acq.end(), r.acquire_ns.begin(), r.acquire_ns.end());
    rel.insert(rel.end(), r.release_ns.begin(), r.release_ns.end());
    pair.insert(pair.end(), r.pair_ns.begin(), r.pair_ns.end());
    errors += r.errors;
    if (first_error.empty()) first_error = r.first_error;
  }
  std::sort(acq.begin(), acq.end());
  std::sort(rel.begin(), rel.end());
  std::sort(pair.begin(), pair.end());
  const uint64_t n = acq.size();
  // Operations on lock words (atomics and READs), and WRITEs to the session record (request
  // entries, which share the atomics' doorbells, plus the background heartbeat).
  const uint64_t lock_ops = (at_end.fetch_add - at_start.fetch_add) +
                            (at_end.compare_swap - at_start.compare_swap) +
                            (at_end.read - at_start.read);
  const uint64_t writes = at_end.write - at_start.write;
  const uint64_t pairs = at_end.acquires - at_start.acquires;
  auto per_pair = [&](uint64_t v) {
    return pairs ? static_cast<double>(v) / static_cast<double>(pairs) : 0.0;
  };
  const double ops_per_pair = per_pair(lock_ops + writes);
  const double rate = static_cast<double>(n) / elapsed;
  if (o.json) {
    std::printf(
        "{\"threads\":%d,\"locks\":%llu,\"duration_s\":%.3f,\"shared_ratio\":%.3f,"
        "\"token\":%s,\"acquisitions\":%llu,\"pairs_per_s\":%.1f,"
        "\"acquire_us\":{\"p50\":%.2f,\"p90\":%.2f,\"p99\":%.2f,\"p999\":%.2f,\"max\":%.2f},"
        "\"release_us\":{\"p50\":%.2f,\"p99\":%.2f},"
        "\"pair_us\":{\"p50\":%.2f,\"p90\":%.2f,\"p99\":%.2f,\"p999\":%.2f,\"max\":%.2f},"
        "\"hold_us\":%d,\"rdma_ops_per_pair\":%.3f,"
        "\"lock_word_ops_per_pair\":%.3f,\"record_writes_per_pair\":%.3f,"
        "\"recoveries\":%llu,\"restarts\":%llu,\"errors\":%llu}\n",
        o.threads, static_cast<unsigned long long>(o.locks), elapsed, o.shared_ratio,
        o.token ? "true" : "false", static_cast<unsigned long long>(n), rate, Pct(acq, 0.5),
        Pct(acq, 0.9), Pct(acq, 0.99), Pct(acq, 0.999), acq.empty() ? 0 : acq.back() / 1000.0,
        Pct(rel, 0.5), Pct(rel, 0.99), Pct(pair, 0.5), Pct(pair, 0.9), Pct(pair, 0.99),
        Pct(pair, 0.999), pair.empty() ? 0 : pair.back() / 1000.0, o.hold_us, ops_per_pair,
        per_pair(lock_ops), per_pair(writes),
        static_cast<unsigned long long>(at_end.recoveries - at_start.recoveries),
        static_cast<unsigned long long>(at_end.restarts - at_start.restarts),
        static_cast<unsigned long long>(errors));
  } else {
    std::printf("bench: threads=%d locks=%llu duration=%.2fs shared_ratio=%.2f token=%s\n",
                o.threads, static_cast<unsigned long long>(o.locks), elapsed, o.shared_ratio,
                o.token ? "yes" : "no");
    std::printf("acquisitions:        %llu (%.1f acquire+release pairs/s)\n",
                static_cast<unsigned long long>(n), rate);
    std::printf("acquire latency us:  p50 %.2f  p90 %.2f  p99 %.2f  p999 %.2f  max %.2f\n",
                Pct(acq, 0.5), Pct(acq, 0.9), Pct(acq, 0.99), Pct(acq, 0.999),
                acq.empty() ? 0 : acq.back() / 1000.0);
    std::printf("release latency us:  p50 %.2f  p99 %.2f\n", Pct(rel, 0.5), Pct(rel, 0.99));
    std::printf("pair latency us:     p50 %.2f  p99 %.2f  (acquire + %d us held + release)\n",
                Pct(pair, 0.5), Pct(pair, 0.99), o.hold_us);
    std::printf(
        "rdma ops per pair:   %.3f (%.3f atomics and READs on lock words, %.3f WRITEs to "
        "the session record, in the same doorbells)\n",
        ops_per_pair, per_pair(lock_ops), per_pair(writes));
    std::printf("recoveries %llu  restarts %llu  errors %llu\n",
                static_cast<unsigned long long>(at_end.recoveries - at_start.recoveries),
                static_cast<unsigned long long>(at_end.restarts - at_start.restarts),
                static_cast<unsigned long long>(errors));
  }
  if (errors > 0) {
    std::fprintf(stderr, "lockctl bench: %llu errors; first: %s\n",
                 static_cast<unsigned long long>(errors), first_error.c_str());
    return 1;
  }
  return n > 0 ? 0 : 1;
}

}  // namespace lockctl
