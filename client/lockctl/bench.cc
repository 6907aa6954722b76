#include "client/lockctl/bench.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "client/lockctl/args.h"
#include "client/lockctl/json.h"

namespace lockctl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::nanoseconds;

// Open loop: a set that starts more than this after its scheduled time counts as late.
constexpr int64_t kLateNs = 10'000;
// How long the parent waits for a child to connect, or to report once the run is over.
constexpr auto kChildGrace = std::chrono::seconds(120);

// ---- latency samples

// A latency is kept as a 32-bit code: nanoseconds, exact below 2^31 ns (2.1 s), then in 1024 ns
// steps up to about 36 minutes (open-loop latencies of an overloaded run reach seconds). Codes
// sort as the latencies do.
constexpr uint32_t kExactLimit = uint32_t{1} << 31;

uint32_t EncodeNs(int64_t ns) {
  if (ns <= 0) return 0;
  if (ns < static_cast<int64_t>(kExactLimit)) return static_cast<uint32_t>(ns);
  const uint64_t coarse = (static_cast<uint64_t>(ns) - kExactLimit) >> 10;
  return kExactLimit + static_cast<uint32_t>(std::min<uint64_t>(coarse, kExactLimit - 1));
}

uint64_t DecodeNs(uint32_t code) {
  if (code < kExactLimit) return code;
  return kExactLimit + (static_cast<uint64_t>(code - kExactLimit) << 10);
}

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

// ---- ClientStats arithmetic

// Calls f(a.x, b.x) for every counter of ClientStats.
template <typename A, typename B, typename F>
void ForEachCounter(A& a, B& b, F f) {
  static_assert(
      sizeof(rdmalock::ClientStats) == 22 * sizeof(uint64_t) + sizeof(rdmalock::LatencyHistogram),
      "ClientStats changed: list its new counters here");
  static_assert(sizeof(rdmalock::LatencyHistogram) ==
                (rdmalock::LatencyHistogram::kBuckets + 2) * sizeof(uint64_t));
  f(a.acquires, b.acquires);
  f(a.releases, b.releases);
  f(a.timeouts, b.timeouts);
  f(a.lost, b.lost);
  f(a.renewals, b.renewals);
  f(a.renew_failures, b.renew_failures);
  f(a.fetch_add, b.fetch_add);
  f(a.compare_swap, b.compare_swap);
  f(a.read, b.read);
  f(a.write, b.write);
  f(a.recoveries, b.recoveries);
  f(a.restarts, b.restarts);
  f(a.withdrawals, b.withdrawals);
  f(a.resets, b.resets);
  f(a.abandoned, b.abandoned);
  f(a.sessions_lost, b.sessions_lost);
  f(a.reconnects, b.reconnects);
  f(a.unrecorded, b.unrecorded);
  f(a.batches, b.batches);
  f(a.batch_fallbacks, b.batch_fallbacks);
  f(a.deferred_releases, b.deferred_releases);
  f(a.waits, b.waits);
  for (size_t i = 0; i < rdmalock::LatencyHistogram::kBuckets; ++i) {
    f(a.acquire_latency.counts[i], b.acquire_latency.counts[i]);
  }
  f(a.acquire_latency.count, b.acquire_latency.count);
  f(a.acquire_latency.sum_us, b.acquire_latency.sum_us);
}

rdmalock::ClientStats Delta(rdmalock::ClientStats end, const rdmalock::ClientStats& start) {
  ForEachCounter(end, start, [](uint64_t& e, const uint64_t& s) { e -= s; });
  return end;
}

void Accumulate(rdmalock::ClientStats& sum, const rdmalock::ClientStats& v) {
  ForEachCounter(sum, v, [](uint64_t& s, const uint64_t& x) { s += x; });
}

// ---- keys

// Draws slots in [0, locks): uniformly, or Zipf(s) over ranks (rank k has weight 1/(k+1)^s) by
// binary search in the precomputed CDF. Rank k maps to slot (k * stride + offset) mod locks with
// stride about 0.618 x locks and coprime to it, so the hot slots are spread over the table rather
// than adjacent.
class KeySampler {
 public:
  explicit KeySampler(const BenchOptions& o) : n_(o.locks) {
    if (o.keys != "zipf") return;
    cdf_.resize(n_);
    double sum = 0;
    for (uint64_t k = 0; k < n_; ++k) {
      sum += std::pow(static_cast<double>(k + 1), -o.zipf_s);
      cdf_[k] = sum;
    }
    for (double& c : cdf_) c /= sum;
    cdf_.back() = 1.0;
    stride_ = static_cast<uint64_t>(static_cast<double>(n_) * 0.6180339887498949);
    while (std::gcd(stride_, n_) != 1) ++stride_;
    offset_ = 0x9E3779B97F4A7C15ull % n_;
  }

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

// ---- one process's run

struct ThreadResult {
  std::vector<uint32_t> acquire, release, pair;  // codes (EncodeNs)
  uint64_t locks = 0;                            // locks of the measured sets
  uint64_t late = 0;                             // open loop: measured sets that started late
  int64_t max_lag_ns = 0;                        // open loop: latest start after schedule
  uint64_t errors = 0;
  std::string first_error;

  void Error(const rdmalock::Status& st) {
    if (errors++ == 0) first_error = st.ToString();
  }
};

// What one process measured; children send it to the parent.
struct ProcResult {
  std::vector<uint32_t> acquire, release, pair;
  uint64_t locks = 0, late = 0, errors = 0;
  int64_t max_lag_ns = 0;
  double elapsed_s = 0;
  rdmalock::ClientStats stats;  // over the measured window
  std::string first_error;
};

struct Shared {
  rdmalock::Client* client = nullptr;          // one lockd, or
  rdmalock::ClusterClient* cluster = nullptr;  // a cluster, locking names[key]
  const std::vector<std::string>* names = nullptr;
  const BenchOptions* o = nullptr;
  const KeySampler* keys = nullptr;
  int total_threads = 1;   // over all processes
  double interval_ns = 0;  // open loop: each thread's inter-arrival time; 0: closed loop
  Clock::time_point base;  // open loop: the schedule's origin
  std::atomic<bool> measuring{false}, stop{false};
};

// Open loop: waits for each set's scheduled start. Sleeps until `early_` before it, then spins:
// sleeps end late (tens of us in a VM), and a set that starts late measures the generator, not
// lockd. `early_` follows the sleeps' overshoot (1.25 x the worst recently seen, decaying), so
// the spin stays short where wake-ups are prompt. Workers also set their timer slack to 1 ns.
class Pacer {
 public:
  // False if `stop` came first.
  bool WaitUntil(Clock::time_point t, const std::atomic<bool>& stop) {
    using std::chrono::microseconds;
    for (;;) {
      if (stop.load(std::memory_order_relaxed)) return false;
      const auto now = Clock::now();
      if (now >= t) return true;
      const auto left = t - now;
      if (left > early_ + microseconds(10)) {
        const Clock::duration nap =
            std::min<Clock::duration>(left - early_, std::chrono::milliseconds(10));
        std::this_thread::sleep_for(nap);
        const Clock::duration over = Clock::now() - (now + nap);
        early_ = std::clamp<Clock::duration>(
            std::max<Clock::duration>(early_ * 255 / 256, over * 5 / 4 + microseconds(10)),
            microseconds(20), microseconds(2000));
      }
    }
  }

 private:
  Clock::duration early_ = std::chrono::microseconds(50);
};

void Hold(int hold_us) {
  if (hold_us <= 0) return;
  const auto until = Clock::now() + std::chrono::microseconds(hold_us);
  while (Clock::now() < until) {
  }
}

// Fills `set` with o.batch distinct slots drawn from `keys`, each shared with probability
// shared_ratio. A draw that repeats a slot is redrawn up to 16 times, then moved to the next free
// slot (so very skewed draws of large sets terminate).
void PickSet(const BenchOptions& o, const KeySampler& keys, std::mt19937_64& rng,
             std::bernoulli_distribution& shared, std::vector<rdmalock::SlotRequest>& set,
             std::unordered_set<uint64_t>& taken) {
  const bool small = o.batch <= 64;
  set.clear();
  taken.clear();
  auto used = [&](uint64_t s) {
    if (small) {
      return std::any_of(set.begin(), set.end(),
                         [s](const rdmalock::SlotRequest& r) { return r.slot == s; });
    }
    return taken.count(s) > 0;
  };
  for (int i = 0; i < o.batch; ++i) {
    const auto mode = shared(rng) ? rdmalock::LockMode::kShared : rdmalock::LockMode::kExclusive;
    uint64_t slot = keys(rng);
    for (int tries = 0; tries < 16 && used(slot); ++tries) slot = keys(rng);
    while (used(slot)) slot = (slot + 1) % o.locks;
    set.push_back({.slot = slot, .mode = mode});
    if (!small) taken.insert(slot);
  }
}

// --inflight N: this thread keeps N asynchronous acquires (Client::LockSlotAsync) in flight. Each
// completion is released by this thread, and a new request takes its place. Acquire latency runs
// from the request to its callback; pair from the request to the end of the release.
void AsyncWorker(Shared& sh, int global_thread, ThreadResult& r) {
  const BenchOptions& o = *sh.o;
  rdmalock::Client& client = *sh.client;
  r.acquire.reserve(1 << 20);
  r.release.reserve(1 << 20);
  r.pair.reserve(1 << 20);
  std::mt19937_64 rng(static_cast<uint64_t>(global_thread) * 7919 + 17);
  std::bernoulli_distribution shared(o.shared_ratio);
  struct Done {
    rdmalock::Result<rdmalock::LockHandle> h;
    Clock::time_point issued, granted;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Done> done;
  int outstanding = 0;
  auto issue = [&] {
    rdmalock::LockOptions lo;
    lo.fencing_token = o.token;
    lo.auto_renew = false;
    lo.mode = shared(rng) ? rdmalock::LockMode::kShared : rdmalock::LockMode::kExclusive;
    const auto t0 = Clock::now();
    rdmalock::Status st = client.LockSlotAsync((*sh.keys)(rng), lo,
                                               [&, t0](rdmalock::Result<rdmalock::LockHandle> h) {
                                                 const auto t1 = Clock::now();
                                                 {
                                                   std::lock_guard lk(mu);
                                                   done.push_back({std::move(h), t0, t1});
                                                 }
                                                 cv.notify_one();
                                               });
    if (!st.ok()) {
      r.Error(st);
      return false;
    }
    ++outstanding;
    return true;
  };
  for (int i = 0; i < o.inflight; ++i) {
    if (!issue()) break;
  }
  // Takes every completion there is at once, releases those handles together (ReleaseMany: one
  // doorbell), then issues as many new requests.
  std::vector<Done> got;
  std::vector<rdmalock::LockHandle> handles;
  while (outstanding > 0) {
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return !done.empty(); });
      got.clear();
      while (!done.empty()) {
        got.push_back(std::move(done.front()));
        done.pop_front();
      }
    }
    outstanding -= static_cast<int>(got.size());
    handles.clear();
    for (auto& d : got) {
      if (d.h.ok()) {
        handles.push_back(std::move(*d.h));
      } else {
        r.Error(d.h.status());
      }
    }
    Hold(o.hold_us);
    const auto t1r = Clock::now();
    if (!handles.empty()) {
      const rdmalock::Status st = client.ReleaseMany(handles);
      if (!st.ok()) r.Error(st);
    }
    const auto t2 = Clock::now();
    if (sh.measuring.load(std::memory_order_relaxed)) {
      for (auto& d : got) {
        if (!d.h.ok()) continue;
        r.acquire.push_back(EncodeNs(duration_cast<nanoseconds>(d.granted - d.issued).count()));
        r.release.push_back(EncodeNs(duration_cast<nanoseconds>(t2 - t1r).count()));
        r.pair.push_back(EncodeNs(duration_cast<nanoseconds>(t2 - d.issued).count()));
        r.locks += 1;
      }
    }
    if (!sh.stop.load(std::memory_order_relaxed)) {
      for (size_t i = 0; i < got.size(); ++i) issue();
    }
  }
  const rdmalock::Status fl = client.Flush();
  if (!fl.ok()) r.Error(fl);
}

void Worker(Shared& sh, int global_thread, ThreadResult& r) {
  const BenchOptions& o = *sh.o;
  if (o.inflight > 0) {
    AsyncWorker(sh, global_thread, r);
    return;
  }
  rdmalock::Client* client = sh.client;  // null over a cluster
  r.acquire.reserve(1 << 20);
  r.release.reserve(1 << 20);
  r.pair.reserve(1 << 20);
  std::mt19937_64 rng(static_cast<uint64_t>(global_thread) * 7919 + 17);
  std::bernoulli_distribution shared(o.shared_ratio);
  rdmalock::LockOptions lo;
  lo.fencing_token = o.token;
  lo.auto_renew = false;
  std::vector<rdmalock::SlotRequest> set;
  set.reserve(static_cast<size_t>(o.batch));
  std::unordered_set<uint64_t> taken;
  const bool open = sh.interval_ns > 0;
  if (open) prctl(PR_SET_TIMERSLACK, 1UL);  // this thread's sleeps end on time (Pacer)
  Pacer pacer;
  // Open loop: this thread's k-th set is due at base + (k + g/G) intervals, so the G threads'
  // schedules interleave evenly and together start a set every 1/rate s.
  double due_ns = open ? sh.interval_ns * global_thread / sh.total_threads : 0;
  uint64_t slot = 0;
  while (!sh.stop.load(std::memory_order_relaxed)) {
    if (o.batch == 1) {
      lo.mode = shared(rng) ? rdmalock::LockMode::kShared : rdmalock::LockMode::kExclusive;
      slot = (*sh.keys)(rng);
    } else {
      PickSet(o, *sh.keys, rng, shared, set, taken);
    }
    Clock::time_point start;
    if (open) {
      start = sh.base + nanoseconds(static_cast<int64_t>(due_ns));
      due_ns += sh.interval_ns;
      if (!pacer.WaitUntil(start, sh.stop)) break;
    }
    const auto t0 = Clock::now();
    if (!open) start = t0;
    Clock::time_point t1, t1r, t2;
    rdmalock::Status st;
    if (o.batch == 1) {
      auto h =
          client != nullptr ? client->LockSlot(slot, lo) : sh.cluster->Lock((*sh.names)[slot], lo);
      t1 = Clock::now();
      if (!h.ok()) {
        r.Error(h.status());
        continue;
      }
      Hold(o.hold_us);
      t1r = Clock::now();
      st = h->Release();
      t2 = Clock::now();
    } else {
      auto hs = client->LockManySlots(set, lo);
      t1 = Clock::now();
      if (!hs.ok()) {
        r.Error(hs.status());
        continue;
      }
      if (hs->size() != set.size()) {
        r.Error(rdmalock::Error(rdmalock::ErrorCode::kInternal,
                                "LockManySlots returned " + std::to_string(hs->size()) +
                                    " handles for " + std::to_string(set.size()) +
                                    " distinct slots"));
      }
      Hold(o.hold_us);
      t1r = Clock::now();
      st = client->ReleaseMany(*hs);
      t2 = Clock::now();
    }
    if (!st.ok()) r.Error(st);
    if (sh.measuring.load(std::memory_order_relaxed)) {
      r.acquire.push_back(EncodeNs(duration_cast<nanoseconds>(t1 - start).count()));
      r.release.push_back(EncodeNs(duration_cast<nanoseconds>(t2 - t1r).count()));
      r.pair.push_back(EncodeNs(duration_cast<nanoseconds>(t2 - start).count()));
      r.locks += static_cast<uint64_t>(o.batch);
      if (open) {
        const int64_t lag = duration_cast<nanoseconds>(t0 - start).count();
        if (lag > kLateNs) ++r.late;
        r.max_lag_ns = std::max(r.max_lag_ns, lag);
      }
    }
  }
  // Releases are posted without waiting for their completions: reap them before the thread goes.
  if (client != nullptr) {
    const rdmalock::Status fl = client->Flush();
    if (!fl.ok()) r.Error(fl);
    return;
  }
  for (size_t i = 0; i < sh.cluster->map().shards.size(); ++i) {
    auto c = sh.cluster->Shard(i);
    const rdmalock::Status fl = c.ok() ? (*c)->Flush() : c.status();
    if (!fl.ok()) r.Error(fl);
  }
}

// The client's counters; over a cluster, every shard's summed.
rdmalock::ClientStats StatsOf(const BenchTarget& t) {
  if (t.client) return t.client->Stats();
  rdmalock::ClientStats sum;
  for (size_t i = 0; i < t.cluster->map().shards.size(); ++i) {
    if (auto c = t.cluster->Shard(i); c.ok()) Accumulate(sum, (*c)->Stats());
  }
  return sum;
}

ProcResult RunWorkload(const BenchTarget& target, const BenchOptions& o, const KeySampler& keys,
                       int proc) {
  Shared sh;
  sh.client = target.client.get();
  sh.cluster = target.cluster.get();
  std::vector<std::string> names;
  if (sh.cluster != nullptr) {
    names.reserve(o.locks);
    for (uint64_t k = 0; k < o.locks; ++k) names.push_back("bench/" + std::to_string(k));
    sh.names = &names;
  }
  sh.o = &o;
  sh.keys = &keys;
  sh.total_threads = o.threads * o.processes;
  sh.interval_ns = o.rate > 0 ? 1e9 * sh.total_threads / o.rate : 0;
  sh.base = Clock::now();
  std::vector<ThreadResult> results(static_cast<size_t>(o.threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < o.threads; ++t) {
    workers.emplace_back([&sh, &results, t, g = proc * o.threads + t] {
      Worker(sh, g, results[static_cast<size_t>(t)]);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_s));
  const rdmalock::ClientStats at_start = StatsOf(target);
  sh.measuring.store(true);
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.duration_s));
  sh.measuring.store(false);
  ProcResult p;
  p.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  p.stats = Delta(StatsOf(target), at_start);
  sh.stop.store(true);
  for (auto& w : workers) w.join();
  for (auto& r : results) {
    p.acquire.insert(p.acquire.end(), r.acquire.begin(), r.acquire.end());
    p.release.insert(p.release.end(), r.release.begin(), r.release.end());
    p.pair.insert(p.pair.end(), r.pair.begin(), r.pair.end());
    p.locks += r.locks;
    p.late += r.late;
    p.max_lag_ns = std::max(p.max_lag_ns, r.max_lag_ns);
    p.errors += r.errors;
    if (p.first_error.empty()) p.first_error = r.first_error;
  }
  return p;
}

// ---- parent and children

bool WriteAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly `len` bytes unless EOF, an error or `deadline` comes first.
bool ReadAll(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    const auto left = duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{.fd = fd, .events = POLLIN, .revents = 0};
    const int pr = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (pr < 0 && errno != EINTR) return false;
    if (pr <= 0) continue;
    const ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

constexpr uint64_t kWireMagic = 0x726c6b62656e6368ull;  // "rlkbench"

// The fixed part of a child's report; then acquire, release and pair codes, then first_error.
// Parent and child are the same binary, so the layout is the same on both ends.
struct WireHeader {
  uint64_t magic = kWireMagic;
  uint64_t n_acquire = 0, n_release = 0, n_pair = 0, error_len = 0;
  uint64_t locks = 0, late = 0, errors = 0;
  int64_t max_lag_ns = 0;
  double elapsed_s = 0;
  rdmalock::ClientStats stats;
};
static_assert(std::is_trivially_copyable_v<WireHeader>);

bool SendResult(int fd, const ProcResult& p) {
  WireHeader h;
  h.n_acquire = p.acquire.size();
  h.n_release = p.release.size();
  h.n_pair = p.pair.size();
  h.error_len = p.first_error.size();
  h.locks = p.locks;
  h.late = p.late;
  h.errors = p.errors;
  h.max_lag_ns = p.max_lag_ns;
  h.elapsed_s = p.elapsed_s;
  h.stats = p.stats;
  return WriteAll(fd, &h, sizeof(h)) &&
         WriteAll(fd, p.acquire.data(), p.acquire.size() * sizeof(uint32_t)) &&
         WriteAll(fd, p.release.data(), p.release.size() * sizeof(uint32_t)) &&
         WriteAll(fd, p.pair.data(), p.pair.size() * sizeof(uint32_t)) &&
         WriteAll(fd, p.first_error.data(), p.first_error.size());
}

bool ReceiveResult(int fd, Clock::time_point deadline, ProcResult* p) {
  WireHeader h;
  if (!ReadAll(fd, &h, sizeof(h), deadline) || h.magic != kWireMagic) return false;
  constexpr uint64_t kMaxSamples = uint64_t{1} << 32;
  if (h.n_acquire > kMaxSamples || h.n_release > kMaxSamples || h.n_pair > kMaxSamples ||
      h.error_len > (1u << 20)) {
    return false;
  }
  p->acquire.resize(h.n_acquire);
  p->release.resize(h.n_release);
  p->pair.resize(h.n_pair);
  p->first_error.resize(h.error_len);
  p->locks = h.locks;
  p->late = h.late;
  p->errors = h.errors;
  p->max_lag_ns = h.max_lag_ns;
  p->elapsed_s = h.elapsed_s;
  p->stats = h.stats;
  return ReadAll(fd, p->acquire.data(), h.n_acquire * sizeof(uint32_t), deadline) &&
         ReadAll(fd, p->release.data(), h.n_release * sizeof(uint32_t), deadline) &&
         ReadAll(fd, p->pair.data(), h.n_pair * sizeof(uint32_t), deadline) &&
         ReadAll(fd, p->first_error.data(), h.error_len, deadline);
}

// Connects, checks the lock count and opens the idle sessions (the first process only).
struct Session {
  BenchTarget target;
  std::vector<BenchTarget> idle;
};

int Connect(const BenchOptions& o, const BenchConnect& connect, int proc, Session* s) {
  int code = 0;
  s->target = connect(&code);
  if (!s->target.client && !s->target.cluster) return code != 0 ? code : kExitInternal;
  if (s->target.cluster) {  // names hash to slots: any number of keys fits
    for (size_t i = 0; i < s->target.cluster->map().shards.size(); ++i) {
      if (auto c = s->target.cluster->Shard(i); !c.ok()) {  // connect every shard before the run
        std::fprintf(stderr, "lockctl bench: %s\n", c.status().ToString().c_str());
        return kExitUnavailable;
      }
    }
  } else if (o.locks > s->target.client->lock_count()) {
    std::fprintf(stderr, "lockctl bench: --locks %llu is more than lockd's %llu locks\n",
                 static_cast<unsigned long long>(o.locks),
                 static_cast<unsigned long long>(s->target.client->lock_count()));
    return kExitUsage;
  }
  for (int i = 0; proc == 0 && i < o.idle_sessions; ++i) {
    auto extra = connect(&code);
    if (!extra.client && !extra.cluster) return code != 0 ? code : kExitInternal;
    s->idle.push_back(std::move(extra));
  }
  return 0;
}

// A child: connect, say ready ('R' on result_fd), wait for the parent's go (a byte on go_fd; EOF
// means the parent gave up), run, send the result. Its exit code says whether it could run and
// report; what went wrong in the run (errors) travels in the result.
int ChildMain(const BenchOptions& o, const BenchConnect& connect, int proc, int result_fd,
              int go_fd) {
  Session s;
  if (const int rc = Connect(o, connect, proc, &s); rc != 0) return rc;
  const KeySampler keys(o);
  if (!WriteAll(result_fd, "R", 1)) return kExitInternal;
  char go = 0;
  ssize_t n;
  while ((n = read(go_fd, &go, 1)) < 0 && errno == EINTR) {
  }
  if (n != 1) return kExitInternal;
  close(go_fd);
  const ProcResult p = RunWorkload(s.target, o, keys, proc);
  if (!SendResult(result_fd, p)) {
    std::fprintf(stderr, "lockctl bench: process %d: cannot send its result: %s\n", proc,
                 std::strerror(errno));
    return kExitInternal;
  }
  close(result_fd);
  return 0;
}

struct Child {
  int proc = 0;
  pid_t pid = -1;
  int fd = -1;  // read end of its result pipe
  bool reported = false;
  bool killed = false;  // by the parent (no message when it dies of that)
};

void Kill(Child& c) {
  if (c.pid > 0) kill(c.pid, SIGKILL);
  c.killed = true;
}

// Collects a child's exit status; returns its exit code (1 if it died of a signal).
int Reap(Child& c) {
  int status = 0;
  pid_t r;
  while ((r = waitpid(c.pid, &status, 0)) < 0 && errno == EINTR) {
  }
  c.pid = -1;
  if (r < 0) return kExitInternal;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status) && !(c.killed && WTERMSIG(status) == SIGKILL)) {
    std::fprintf(stderr, "lockctl bench: process %d died of signal %d\n", c.proc, WTERMSIG(status));
  }
  return 1;
}

void KillAndReap(std::vector<Child>& children) {
  for (auto& c : children) Kill(c);
  for (auto& c : children) {
    if (c.pid > 0) (void)Reap(c);
    if (c.fd >= 0) close(c.fd);
    c.fd = -1;
  }
}

// ---- report

void PrintJsonPct(const char* key, const Percentiles& p) {
  std::printf("\"%s\":{\"p50\":%.2f,\"p90\":%.2f,\"p99\":%.2f,\"p999\":%.2f,\"max\":%.2f}", key,
              p.p50, p.p90, p.p99, p.p999, p.max);
}

void PrintTextPct(const char* label, const Percentiles& p, const char* note) {
  std::printf("%-20s p50 %.2f  p90 %.2f  p99 %.2f  p999 %.2f  max %.2f%s\n", label, p.p50, p.p90,
              p.p99, p.p999, p.max, note);
}

// Merges what the processes measured, prints it and returns the exit code: 1 if any operation
// failed or nothing was measured.
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
    std::printf(
        "{\"threads\":%d,\"locks\":%llu,\"duration_s\":%.3f,\"shared_ratio\":%.3f,"
        "\"token\":%s,\"acquisitions\":%llu,\"pairs_per_s\":%.1f,",
        o.threads, u(o.locks), elapsed, o.shared_ratio, o.token ? "true" : "false", u(n),
        sets_per_s);
    PrintJsonPct("acquire_us", pa);
    std::printf(",");
    PrintJsonPct("release_us", pr);
    std::printf(",");
    PrintJsonPct("pair_us", pp);
    std::printf(
        ",\"hold_us\":%d,\"rdma_ops_per_pair\":%.3f,\"lock_word_ops_per_pair\":%.3f,"
        "\"record_writes_per_pair\":%.3f,\"recoveries\":%llu,\"restarts\":%llu,"
        "\"errors\":%llu,",
        o.hold_us, per(lock_ops + writes, d.acquires), per(lock_ops, d.acquires),
        per(writes, d.acquires), u(d.recoveries), u(d.restarts), u(errors));
    std::printf(
        "\"cluster\":%s,\"processes\":%d,\"total_threads\":%d,\"failed_processes\":%d,"
        "\"keys\":%s,"
        "\"zipf_s\":%.3f,\"batch\":%d,\"inflight\":%d,\"sets_per_s\":%.1f,\"locks_per_s\":%.1f,"
        "\"locks_acquired\":%llu,\"rdma_ops_per_set\":%.3f,\"rdma_ops_per_lock\":%.3f,",
        o.cluster ? "true" : "false", o.processes, o.threads * o.processes, failed_processes,
        JsonString(o.keys).c_str(), o.zipf_s, o.batch, o.inflight, sets_per_s, locks_per_s,
        u(locks), per(lock_ops + writes, n), per(lock_ops + writes, locks));
    std::printf(
        "\"loop\":%s,\"arrival\":%s,\"target_rate\":%.1f,\"achieved_rate\":%.1f,"
        "\"late\":%llu,\"late_pct\":%.3f,\"late_threshold_us\":%.1f,"
        "\"max_start_lag_us\":%.2f,",
        JsonString(open ? "open" : "closed").c_str(), JsonString(open ? "fixed" : "none").c_str(),
        o.rate, sets_per_s, u(late), late_pct, static_cast<double>(kLateNs) / 1000.0,
        static_cast<double>(max_lag_ns) / 1000.0);
    std::printf(
        "\"withdrawals\":%llu,\"deferred_releases\":%llu,\"batches\":%llu,"
        "\"batch_fallbacks\":%llu,\"timeouts\":%llu,\"lost\":%llu,\"resets\":%llu,"
        "\"abandoned\":%llu,\"sessions_lost\":%llu,\"reconnects\":%llu,"
        "\"unrecorded\":%llu,\"waits\":%llu,\"sdk_acquire_p50_us_bound\":%llu,"
        "\"sdk_acquire_p99_us_bound\":%llu,\"pair_hist_us\":[",
        u(d.withdrawals), u(d.deferred_releases), u(d.batches), u(d.batch_fallbacks), u(d.timeouts),
        u(d.lost), u(d.resets), u(d.abandoned), u(d.sessions_lost), u(d.reconnects),
        u(d.unrecorded), u(d.waits), u(d.acquire_latency.QuantileUs(0.5)),
        u(d.acquire_latency.QuantileUs(0.99)));
    bool first = true;
    for (const auto& [bound, count] : Log2Histogram(pair)) {
      std::printf("%s[%llu,%llu]", first ? "" : ",", u(bound), u(count));
      first = false;
    }
    std::printf("]}\n");
  } else {
    std::printf("bench: processes=%d threads=%d locks=%llu keys=%s", o.processes, o.threads,
                u(o.locks), o.keys.c_str());
    if (o.keys == "zipf") std::printf(" (s=%.2f)", o.zipf_s);
    std::printf(" batch=%d %s duration=%.2fs shared_ratio=%.2f token=%s hold=%dus%s\n", o.batch,
                open ? "open-loop" : "closed-loop", elapsed, o.shared_ratio, o.token ? "yes" : "no",
                o.hold_us, o.cluster ? " cluster (names bench/K over the shards)" : "");
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
        "%llu  batches %llu  batch fallbacks %llu  timeouts %llu  lost %llu  reconnects %llu\n",
        u(d.recoveries), u(d.restarts), u(d.withdrawals), u(d.deferred_releases), u(d.batches),
        u(d.batch_fallbacks), u(d.timeouts), u(d.lost), u(d.reconnects));
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

}  // namespace

int RunBench(const BenchOptions& o, const BenchConnect& connect) {
  if (const int rc = ValidateBenchOptions(o); rc != 0) return rc;
  std::vector<Child> children;
  int go[2] = {-1, -1};
  if (o.processes > 1) {
    // A child that dies must not kill the parent's writes to it (nor the parent a child's).
    signal(SIGPIPE, SIG_IGN);
    if (pipe(go) != 0) {
      std::perror("lockctl bench: pipe");
      return kExitInternal;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t parent = getpid();
    for (int p = 1; p < o.processes; ++p) {
      int res[2];
      if (pipe(res) != 0) {
        std::perror("lockctl bench: pipe");
        close(go[0]);
        close(go[1]);
        KillAndReap(children);
        return kExitInternal;
      }
      const pid_t pid = fork();
      if (pid < 0) {
        std::perror("lockctl bench: fork");
        close(res[0]);
        close(res[1]);
        close(go[0]);
        close(go[1]);
        KillAndReap(children);
        return kExitInternal;
      }
      if (pid == 0) {
        // The child dies with the parent (the forking thread, which is the parent's main one).
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(kExitInternal);
        close(go[1]);
        close(res[0]);
        for (const auto& c : children) close(c.fd);
        _exit(ChildMain(o, connect, p, res[1], go[0]));
      }
      close(res[1]);
      children.push_back({.proc = p, .pid = pid, .fd = res[0]});
    }
    close(go[0]);
  }

  Session s;
  int code = Connect(o, connect, 0, &s);
  std::unique_ptr<KeySampler> keys;
  if (code == 0) keys = std::make_unique<KeySampler>(o);
  // Every child says it is ready (connected) before any process starts its run.
  const auto ready_deadline = Clock::now() + kChildGrace;
  for (auto& c : children) {
    if (code != 0) break;
    char ready = 0;
    if (!ReadAll(c.fd, &ready, 1, ready_deadline) || ready != 'R') {
      close(c.fd);
      c.fd = -1;
      Kill(c);
      const int rc = Reap(c);
      std::fprintf(stderr, "lockctl bench: process %d could not start (exit %d)\n", c.proc, rc);
      code = rc != 0 ? rc : kExitInternal;
    }
  }
  if (code != 0) {
    if (go[1] >= 0) close(go[1]);
    KillAndReap(children);
    return code;
  }
  if (go[1] >= 0) {
    const std::string bytes(children.size(), 'G');
    const bool sent = WriteAll(go[1], bytes.data(), bytes.size());
    close(go[1]);
    if (!sent) {
      std::perror("lockctl bench: cannot start the other processes");
      KillAndReap(children);
      return kExitInternal;
    }
  }

  std::vector<ProcResult> procs;
  procs.push_back(RunWorkload(s.target, o, *keys, 0));
  s = Session{};  // the parent's sessions end now, as the children's do when they exit

  int failed = 0, child_code = 0;
  const auto report_deadline = Clock::now() + kChildGrace;
  for (auto& c : children) {
    ProcResult p;
    c.reported = ReceiveResult(c.fd, report_deadline, &p);
    close(c.fd);
    c.fd = -1;
    if (!c.reported) Kill(c);
    const int rc = Reap(c);
    if (c.reported && rc == 0) {
      procs.push_back(std::move(p));
      continue;
    }
    std::fprintf(stderr, "lockctl bench: process %d failed (%s, exit %d)\n", c.proc,
                 c.reported ? "reported" : "no report", rc);
    ++failed;
    if (child_code == 0) child_code = rc != 0 ? rc : 1;
  }
  const int rc = Report(o, procs, failed);
  return rc != 0 ? rc : child_code;
}

}  // namespace lockctl
