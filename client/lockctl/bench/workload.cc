// lockctl bench's workload: one process's worker threads (closed loop, open loop at a fixed
// rate, or asynchronous acquires in flight), what they time, and the client counters over the
// measured window.
//
// Thread-safety: RunWorkload runs on the process's main thread and starts o.threads workers;
// they share Shared (read-only apart from its atomics) and each writes only its own
// ThreadResult, which the main thread reads after joining them.
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "client/lockctl/bench/bench_internal.h"
#include "common/sync/mutex.h"

namespace lockctl::bench {
namespace {

using std::chrono::duration_cast;
using std::chrono::nanoseconds;

// ---- ClientStats arithmetic: librdmalock's operator+= and -= (one list of the counters).

rdmalock::ClientStats Delta(rdmalock::ClientStats end, const rdmalock::ClientStats& start) {
  end -= start;
  return end;
}

// ---- one process's run

// A time point as --timeline writes it: steady_clock is CLOCK_MONOTONIC, shared by the host's
// processes.
int64_t Ns(Clock::time_point t) { return duration_cast<nanoseconds>(t.time_since_epoch()).count(); }

struct ThreadResult {
  std::vector<uint32_t> acquire, release, pair;  // codes (EncodeNs)
  uint64_t locks = 0;                            // locks of the measured sets
  uint64_t late = 0;                             // open loop: measured sets that started late
  int64_t max_lag_ns = 0;                        // open loop: latest start after schedule
  uint64_t errors = 0;
  std::string first_error;
  std::vector<TimelineEntry> timeline;  // --timeline

  void Error(const rdmalock::Status& st) {
    if (errors++ == 0) first_error = st.ToString();
  }
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
  // The progress line's counters (null: no line); worker g writes only slot g.
  ProgressCounters* progress = nullptr;
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
  ProgressSlot* progress =
      sh.progress != nullptr ? sh.progress->slot(static_cast<size_t>(global_thread)) : nullptr;
  struct Done {
    rdmalock::Result<rdmalock::LockHandle> h;
    Clock::time_point issued, granted;
    uint64_t token = 0;  // --timeline: read before the handle goes to the release batch
  };
  // Completions, pushed by the SDK's callback thread and taken by this one.
  struct Completions {
    rdmalock::Mutex mu;
    rdmalock::CondVar cv;
    std::deque<Done> done GUARDED_BY(mu);
  } q;
  int outstanding = 0;
  auto issue = [&] {
    rdmalock::LockOptions lo;
    lo.fencing_token = o.token;
    lo.auto_renew = o.auto_renew;
    lo.mode = shared(rng) ? rdmalock::LockMode::kShared : rdmalock::LockMode::kExclusive;
    const auto t0 = Clock::now();
    rdmalock::Status st = client.LockSlotAsync((*sh.keys)(rng), lo,
                                               [&, t0](rdmalock::Result<rdmalock::LockHandle> h) {
                                                 const auto t1 = Clock::now();
                                                 // Signalled under the mutex: once the last
                                                 // completion is taken, q is gone.
                                                 rdmalock::MutexLock lk(&q.mu);
                                                 q.done.push_back({std::move(h), t0, t1});
                                                 q.cv.Signal();
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
      rdmalock::MutexLock lk(&q.mu);
      q.cv.Wait(lk, [&] {
        q.mu.AssertHeld();
        return !q.done.empty();
      });
      got.clear();
      while (!q.done.empty()) {
        got.push_back(std::move(q.done.front()));
        q.done.pop_front();
      }
    }
    outstanding -= static_cast<int>(got.size());
    handles.clear();
    for (auto& d : got) {
      if (d.h.ok()) {
        if (!o.timeline.empty()) d.token = d.h->fencing_token();
        handles.push_back(std::move(*d.h));
      } else {
        r.Error(d.h.status());
      }
    }
    Hold(o.hold_us);
    const auto t1r = Clock::now();
    rdmalock::Status released;
    if (!handles.empty()) released = client.ReleaseMany(handles);
    const auto t2 = Clock::now();
    // Only a set acquired and released counts: a handle whose release failed (its lease ran
    // out, its session ended) is an error of its own, and no sample.
    size_t counted = 0;
    for (auto& h : handles) {
      if (h.state() == rdmalock::LockState::kReleased) {
        ++counted;
      } else {
        r.Error(released.ok() ? rdmalock::Error(rdmalock::ErrorCode::kInternal,
                                                "ReleaseMany said OK and left a lock unreleased")
                              : released);
      }
    }
    if (sh.measuring.load(std::memory_order_relaxed)) {
      size_t at = 0;  // the handle of `d` (`handles` holds the granted ones, in `got`'s order)
      for (auto& d : got) {
        if (!d.h.ok()) continue;
        if (handles[at++].state() != rdmalock::LockState::kReleased) continue;
        r.acquire.push_back(EncodeNs(duration_cast<nanoseconds>(d.granted - d.issued).count()));
        r.release.push_back(EncodeNs(duration_cast<nanoseconds>(t2 - t1r).count()));
        r.pair.push_back(EncodeNs(duration_cast<nanoseconds>(t2 - d.issued).count()));
        r.locks += 1;
        if (!o.timeline.empty()) {
          r.timeline.push_back({Ns(d.issued), Ns(d.granted), d.token});
        }
      }
      if (progress != nullptr) progress->Add(counted);
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
  lo.auto_renew = o.auto_renew;
  std::vector<rdmalock::SlotRequest> set;
  set.reserve(static_cast<size_t>(o.batch));
  std::unordered_set<uint64_t> taken;
  ProgressSlot* progress =
      sh.progress != nullptr ? sh.progress->slot(static_cast<size_t>(global_thread)) : nullptr;
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
    uint64_t token = 0;  // --timeline: the (first) lock's fencing token, 0 without --token
    uint64_t got = 1;    // locks the set was granted (LockManySlots grants all or none)
    rdmalock::Status st;
    if (o.batch == 1) {
      auto h =
          client != nullptr ? client->LockSlot(slot, lo) : sh.cluster->Lock((*sh.names)[slot], lo);
      t1 = Clock::now();
      if (!h.ok()) {
        r.Error(h.status());
        continue;
      }
      if (!o.timeline.empty()) token = h->fencing_token();  // (takes the handle's mutex)
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
      got = hs->size();
      if (hs->size() != set.size()) {
        st = rdmalock::Error(rdmalock::ErrorCode::kInternal,
                             "LockManySlots returned " + std::to_string(hs->size()) +
                                 " handles for " + std::to_string(set.size()) + " distinct slots");
      }
      if (!o.timeline.empty() && !hs->empty()) token = hs->front().fencing_token();
      Hold(o.hold_us);
      t1r = Clock::now();
      const rdmalock::Status released = client->ReleaseMany(*hs);
      t2 = Clock::now();
      if (st.ok()) st = released;
    }
    // Only a set acquired whole and released counts: one whose release failed (its lease ran
    // out, its session ended) is an error, and no sample.
    if (!st.ok()) {
      r.Error(st);
      continue;
    }
    if (sh.measuring.load(std::memory_order_relaxed)) {
      r.acquire.push_back(EncodeNs(duration_cast<nanoseconds>(t1 - start).count()));
      r.release.push_back(EncodeNs(duration_cast<nanoseconds>(t2 - t1r).count()));
      r.pair.push_back(EncodeNs(duration_cast<nanoseconds>(t2 - start).count()));
      r.locks += got;
      if (!o.timeline.empty()) r.timeline.push_back({Ns(start), Ns(t1), token});
      if (progress != nullptr) progress->Add(got);
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

// Sleeps `secs`; with `draw`, redraws the progress line every kProgressIntervalMs meanwhile. The
// last wake-up at the end draws nothing, so the measured window ends when it would without the
// line.
void SleepShowing(double secs, bool warmup, const ProgressCounters* draw) {
  const auto span = std::chrono::duration<double>(secs);
  if (draw == nullptr) {
    std::this_thread::sleep_for(span);
    return;
  }
  const auto begin = Clock::now();
  const auto end = begin + duration_cast<Clock::duration>(span);
  auto last_t = begin;
  uint64_t last_n = draw->Sum();
  for (;;) {
    const auto now = Clock::now();
    if (now >= end) return;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(end - now, std::chrono::milliseconds(kProgressIntervalMs)));
    const auto t = Clock::now();
    if (t >= end) return;
    const uint64_t n = draw->Sum();
    const double dt = std::chrono::duration<double>(t - last_t).count();
    const std::string line =
        FormatProgress(warmup, std::chrono::duration<double>(t - begin).count(), secs, n,
                       dt > 0 ? static_cast<double>(n - last_n) / dt : 0);
    std::fputs(("\r\x1b[K" + line).c_str(), stdout);
    std::fflush(stdout);
    last_t = t;
    last_n = n;
  }
}

}  // namespace

void Accumulate(rdmalock::ClientStats& sum, const rdmalock::ClientStats& v) { sum += v; }

bool WriteTimeline(const std::string& path, std::vector<TimelineEntry>& timeline) {
  std::sort(timeline.begin(), timeline.end(),
            [](const TimelineEntry& a, const TimelineEntry& b) { return a.granted < b.granted; });
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  bool ok = true;
  for (const TimelineEntry& e : timeline) {
    if (std::fprintf(f, "%lld %lld %llu\n", static_cast<long long>(e.start),
                     static_cast<long long>(e.granted),
                     static_cast<unsigned long long>(e.token)) < 0) {
      ok = false;
      break;
    }
  }
  const int saved = errno;
  if (std::fclose(f) != 0) return false;
  errno = saved;
  return ok;
}

ProcResult RunWorkload(const BenchTarget& target, const BenchOptions& o, const KeySampler& keys,
                       int proc, ProgressCounters* progress, bool draw) {
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
  sh.progress = progress;
  const ProgressCounters* shown = draw ? progress : nullptr;
  std::vector<ThreadResult> results(static_cast<size_t>(o.threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < o.threads; ++t) {
    workers.emplace_back([&sh, &results, t, g = proc * o.threads + t] {
      Worker(sh, g, results[static_cast<size_t>(t)]);
    });
  }
  SleepShowing(o.warmup_s, /*warmup=*/true, shown);
  const rdmalock::ClientStats at_start = StatsOf(target);
  sh.measuring.store(true);
  const auto start = Clock::now();
  SleepShowing(o.duration_s, /*warmup=*/false, shown);
  sh.measuring.store(false);
  if (shown != nullptr) {
    std::fputs("\r\x1b[K", stdout);  // the report starts on a clean line
    std::fflush(stdout);
  }
  ProcResult p;
  p.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  p.stats = Delta(StatsOf(target), at_start);
  sh.stop.store(true);
  for (auto& w : workers) w.join();
  for (auto& r : results) {
    p.acquire.insert(p.acquire.end(), r.acquire.begin(), r.acquire.end());
    p.release.insert(p.release.end(), r.release.begin(), r.release.end());
    p.pair.insert(p.pair.end(), r.pair.begin(), r.pair.end());
    p.timeline.insert(p.timeline.end(), r.timeline.begin(), r.timeline.end());
    p.locks += r.locks;
    p.late += r.late;
    p.max_lag_ns = std::max(p.max_lag_ns, r.max_lag_ns);
    p.errors += r.errors;
    if (p.first_error.empty()) p.first_error = r.first_error;
  }
  return p;
}

}  // namespace lockctl::bench
