// sdk_microbench: the SDK's own CPU cost per lock operation, measured on the host over the
// in-process backend (tests/support: lockd's lock table as atomic words in this process), so
// that no network, NIC or VM is in the figure. Issue 19, item 2. It runs:
//   backend   the backend's own work for one uncontended exclusive pair, the very operations the
//             engine issues for the SDK's cases (FA and a token's READ of word1 in one doorbell;
//             the record entry's WRITE, tagged, posted; the CAS alone, started, and reaped),
//             issued on an InProcessMemory by hand;
//   engine    LockEngine::Acquire (with a token) + StartRelease (reaped by the next acquire) on the
//             same backend;
//   sdk       Client::LockSlot + LockHandle::Release over the test lockd (tests/support/
//             fake_lockd.h), records on (the default) and off;
//   handover  `--threads` (2) threads of one client on one lock, the SDK end to end: ns per grant.
// Each is run `--rounds` times of `--iterations` pairs, the cases' rounds interleaved (round r of
// every case, then round r + 1), so that a slow stretch of a shared host falls on all of them
// alike. The median round is printed: the calling thread's CPU time per pair (wall time for
// handover, which two threads share), with the heap allocations per pair (this binary counts
// every operator new, the client's own threads' too). The SDK's cost, the issue's "beyond the
// in-process backend's own work", is the median over rounds of the sdk round minus the backend
// round that ran next to it. Nothing is asserted on times; `--expect-no-allocations` makes the run
// fail (exit 1) if an uncontended SDK pair allocated, which ctest checks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "client/src/client_test_peer.h"
#include "engine/lock_engine.h"
#include "rdmalock/client.h"
#include "rdmalock/proto/layout.h"
#include "tests/support/fake_lockd.h"
#include "tests/support/inproc_memory.h"

namespace {
// Every heap allocation of this process, counted (the benchmark's own replacement of the global
// operator new; the library's allocations go through it too).
std::atomic<uint64_t> g_allocations{0};
}  // namespace

[[gnu::noinline]] void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new[](std::size_t n) { return operator new(n); }
// None is inlined: GCC 12 would pair an inlined malloc() or free() with the operator new or
// delete call it sees at the other end and warn (-Wmismatched-new-delete), although all of them
// are these replacements.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using namespace rdmalock;
using Clock = std::chrono::steady_clock;

struct Figure {
  double ns_per_op = 0;
  double allocations_per_op = 0;
};

// The calling thread's CPU time in ns: what the lock path itself costs, whatever else the
// machine runs meanwhile (a shared 2-core host is rarely idle).
double ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// One case's rounds: `round(n)` runs n pairs. Times are the calling thread's CPU time (`wall`
// false: one thread does all the work) or wall-clock time.
struct Case {
  std::function<void(uint64_t)> round;
  bool wall = false;
  std::vector<Figure> rounds;  // one per measured round, in order

  void Warm(uint64_t iterations) { round(iterations / 10 + 1); }  // caches, pools, channel
  void Run(uint64_t iterations) {
    const uint64_t a0 = g_allocations.load();
    const auto t0 = Clock::now();
    const double c0 = ThreadCpuNs();
    round(iterations);
    const double c1 = ThreadCpuNs();
    const auto t1 = Clock::now();
    const uint64_t a1 = g_allocations.load();
    const double ns = wall ? std::chrono::duration<double, std::nano>(t1 - t0).count() : c1 - c0;
    rounds.push_back({ns / static_cast<double>(iterations),
                      static_cast<double>(a1 - a0) / static_cast<double>(iterations)});
  }
  Figure Median() const {
    if (rounds.empty()) return {};
    std::vector<Figure> got = rounds;
    std::sort(got.begin(), got.end(),
              [](const Figure& a, const Figure& b) { return a.ns_per_op < b.ns_per_op; });
    return got[got.size() / 2];
  }
};

// The median over rounds of a's round minus b's (rounds that ran next to each other).
double MedianDifference(const Case& a, const Case& b) {
  std::vector<double> d;
  for (size_t i = 0; i < a.rounds.size() && i < b.rounds.size(); ++i) {
    d.push_back(a.rounds[i].ns_per_op - b.rounds[i].ns_per_op);
  }
  if (d.empty()) return 0;
  std::sort(d.begin(), d.end());
  return d[d.size() / 2];
}

constexpr uint64_t kLocks = 1024;

// The backend's operations of one uncontended exclusive pair with a record entry, as the engine
// issues them for the SDK's cases (lock_engine.cc: Acquire, StartRelease, FinishRelease), without
// the engine: the FA with word1's READ (a fencing token, the SDK's default), the entry's WRITE
// and the CAS. A token's READ tags the entry, so the release is the CAS alone, as here. (Until
// stop 36 this case left the READ out, and the SDK's figure beyond it counted the READ's ~20 ns
// as the SDK's own.)
Case Backend(bool records) {
  struct Fixture {
    InProcessTable table{kLocks, 2 * proto::kSessionRecordSize};
    InProcessMemory mem{&table};
    RemoteOp release;
    bool started = false;
    uint64_t slot = 0;
  };
  auto f = std::make_shared<Fixture>();
  return {[f, records](uint64_t n) {
    const uint64_t entry = proto::kSessionRecordSize + proto::SessionRecord::EntryOffset(0);
    InProcessMemory& mem = f->mem;
    for (uint64_t i = 0; i < n; ++i) {
      f->slot = (f->slot + 1) % kLocks;
      const uint64_t word0 = proto::SlotOffset(f->slot);
      // The FA, and word1's READ in its doorbell: the SDK's cases lock with its default options,
      // which ask for a fencing token (LockOptions::fencing_token).
      RemoteOp ops[2] = {RemoteOp::FetchAdd(RegionId::kLocks, word0,
                                            proto::AcquireIncrement(proto::Mode::kExclusive)),
                         RemoteOp::Read(RegionId::kLocks, word0 + proto::kWord1Offset, 8)};
      if (!mem.Execute(std::span<RemoteOp>(ops, 2)).ok()) std::abort();
      if (f->started && !mem.Await().ok()) std::abort();  // the last release, reaped
      const uint64_t prev = ops[0].result[0];
      const uint64_t cur = prev + proto::AcquireIncrement(proto::Mode::kExclusive);
      if (records) {
        RemoteOp queued = RemoteOp::Write16(RegionId::kSessions, entry, prev | 1, prev);
        if (!mem.Post(queued).ok()) std::abort();
      }
      f->release = RemoteOp::CompareSwap(RegionId::kLocks, word0, cur,
                                         cur + proto::ReleaseIncrement(proto::Mode::kExclusive));
      if (!mem.Start(std::span<RemoteOp>(&f->release, 1)).ok()) std::abort();
      f->started = true;
    }
  }};
}

// The engine alone: Acquire and a posted release (reaped by the next Acquire), no Client.
Case Engine(bool records) {
  struct Fixture {
    InProcessTable table{kLocks, 2 * proto::kSessionRecordSize};
    InProcessMemory mem{&table};
    LockEngine engine{[] {
                        EngineParams p;
                        p.lock_count = kLocks;
                        return p;
                      }(),
                      [](const Ticket&) {}};
    PendingRelease pending;
    uint32_t seq = 0;
    uint64_t slot = 0;
  };
  auto f = std::make_shared<Fixture>();
  return {[f, records](uint64_t n) {
    const uint64_t entry = proto::kSessionRecordSize + proto::SessionRecord::EntryOffset(0);
    for (uint64_t i = 0; i < n; ++i) {
      f->slot = (f->slot + 1) % kLocks;
      AcquireOptions ao;
      ao.pending = &f->pending;
      ao.want_token = true;  // as the SDK's default, and the backend case's READ
      if (records) {
        f->seq = proto::RequestEntry::NextSeq(f->seq);
        ao.record = entry;
        ao.record_seq = f->seq;
      }
      auto g = f->engine.Acquire(f->mem, f->slot, Mode::kExclusive, ao);
      if (!g.ok()) std::abort();
      if (!f->engine.StartRelease(f->mem, *g, &f->pending).ok()) std::abort();
    }
  }};
}

std::unique_ptr<Client> ConnectFake(testing::FakeLockd& lockd, bool records) {
  ClientOptions o = testing::FakeClientOptions("sdk_microbench");
  o.record_requests = records;
  auto c = ClientTestPeer::Connect(o, lockd.connector());
  if (!c.ok()) {
    std::fprintf(stderr, "sdk_microbench: %s\n", c.status().ToString().c_str());
    std::exit(2);
  }
  return std::move(c).value();
}

testing::FakeLockd::Options LockdOptions() {
  testing::FakeLockd::Options fo;
  fo.lock_count = kLocks;
  fo.lease = std::chrono::seconds(10);  // no renewals inside a round
  fo.heartbeat_interval = std::chrono::milliseconds(100);
  return fo;
}

// Reaps the calling thread's posted release, if any.
void Flush(Client& c) {
  if (Status st = c.Flush(); !st.ok()) {
    std::fprintf(stderr, "sdk_microbench: %s\n", st.ToString().c_str());
    std::exit(2);
  }
}

// A test lockd and one client of it (the client goes first).
struct ClientFixture {
  explicit ClientFixture(bool records) : client(ConnectFake(lockd, records)) {}
  testing::FakeLockd lockd{LockdOptions()};
  std::unique_ptr<Client> client;
  uint64_t slot = 0;
};

// The SDK end to end: LockSlot and Release on one thread, round-robin over the locks.
Case Sdk(bool records) {
  auto f = std::make_shared<ClientFixture>(records);
  return {[f](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      f->slot = (f->slot + 1) % kLocks;
      auto h = f->client->LockSlot(f->slot);
      if (!h.ok() || !h->Release().ok()) {
        std::fprintf(stderr, "sdk_microbench: %s\n", h.status().ToString().c_str());
        std::exit(2);
      }
    }
    // The round's last release is posted: reap it now, or the client's reaper thread reaps it
    // during the next case's round (and its allocations would count there).
    Flush(*f->client);
  }};
}

// `threads` threads of one client taking turns on one lock: ns per grant (a handover each,
// mostly). Its rounds are a tenth of the others' (`n` is scaled by the caller), n grants in all.
Case Handover(int threads) {
  auto f = std::make_shared<ClientFixture>(true);
  return {[f, threads](uint64_t n) {
            std::atomic<bool> failed{false};
            auto work = [&] {
              for (uint64_t i = 0; i < n / static_cast<uint64_t>(threads); ++i) {
                auto h = f->client->LockSlot(0);
                if (!h.ok() || !h->Release().ok()) failed = true;
              }
              Flush(*f->client);  // this thread's posted release, before the thread ends
            };
            std::vector<std::thread> ts;
            for (int t = 0; t < threads; ++t) ts.emplace_back(work);
            for (std::thread& t : ts) t.join();
            if (failed) {
              std::fprintf(stderr, "sdk_microbench: a handover failed\n");
              std::exit(2);
            }
          },
          /*wall=*/true};
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 200000;
  int rounds = 5;
  int threads = 2;  // the handover case's
  bool json = false, expect_no_alloc = false;
  std::string only;  // --case NAME: run that one alone (for a profiler)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iterations" && i + 1 < argc) {
      iterations = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--case" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--json") {
      json = true;
    } else if (a == "--expect-no-allocations") {
      expect_no_alloc = true;
    } else {
      std::fprintf(stderr,
                   "usage: sdk_microbench [--iterations N] [--rounds R] [--json] "
                   "[--expect-no-allocations] [--threads N] "
                   "[--case backend|engine|sdk|sdk_norec|handover]\n");
      return 2;
    }
  }
  if (iterations < 10 || rounds < 1 || threads < 2 || threads > 64) {
    std::fprintf(stderr,
                 "sdk_microbench: --iterations must be >= 10, --rounds >= 1 and --threads "
                 "2..64\n");
    return 2;
  }
  // The cases, each with its fixture (a test lockd and a client for the SDK's), all made before
  // the first round; then round r of each in turn.
  struct Named {
    const char* key;
    const char* what;
    Case c;
    uint64_t iterations;
  };
  std::vector<Named> cases;
  auto add = [&](const char* key, const char* group, const char* what, auto make, uint64_t n) {
    if (only.empty() || only == group) cases.push_back({key, what, make(), n});
  };
  const uint64_t handover_n = std::max<uint64_t>(iterations / 10, 10);
  add(
      "backend", "backend", "backend alone: one pair's operations (records on)",
      [] { return Backend(true); }, iterations);
  add(
      "sdk", "sdk", "SDK: LockSlot + Release (records on, the default)", [] { return Sdk(true); },
      iterations);
  add(
      "backend_norec", "backend", "backend alone: one pair's operations (records off)",
      [] { return Backend(false); }, iterations);
  add(
      "sdk_norec", "sdk_norec", "SDK: LockSlot + Release (records off)", [] { return Sdk(false); },
      iterations);
  add(
      "engine", "engine", "engine: Acquire + posted release (records on)",
      [] { return Engine(true); }, iterations);
  const std::string handover_what =
      "SDK: " + std::to_string(threads) + " threads of one client on one lock, wall ns per grant";
  add(
      "handover", "handover", handover_what.c_str(), [threads] { return Handover(threads); },
      handover_n);
  for (Named& n : cases) n.c.Warm(n.iterations);
  for (int r = 0; r < rounds; ++r) {
    for (Named& n : cases) n.c.Run(n.iterations);
  }
  auto find = [&](const char* key) -> const Case* {
    for (const Named& n : cases) {
      if (std::strcmp(n.key, key) == 0) return &n.c;
    }
    return nullptr;
  };
  auto median = [&](const char* key) {
    const Case* c = find(key);
    return c != nullptr ? c->Median() : Figure{};
  };
  auto beyond = [&](const char* sdk_key, const char* backend_key) {
    const Case* a = find(sdk_key);
    const Case* b = find(backend_key);
    return a != nullptr && b != nullptr ? MedianDifference(*a, *b) : 0.0;
  };
  const Figure sdk = median("sdk");
  const Figure sdk_norec = median("sdk_norec");
  const double sdk_beyond = beyond("sdk", "backend");
  const double sdk_norec_beyond = beyond("sdk_norec", "backend_norec");
  struct Row {
    const char* key;
    const char* what;
    Figure f;
  };
  std::vector<Row> rows;
  for (const char* key : {"backend", "backend_norec", "engine", "sdk", "sdk_norec", "handover"}) {
    for (const Named& n : cases) {
      if (std::strcmp(n.key, key) == 0) rows.push_back({n.key, n.what, n.c.Median()});
    }
  }
  if (json) {
    std::printf("{");
    for (const Row& r : rows) {
      std::printf("\"%s\":{\"ns\":%.1f,\"allocations\":%.3f},", r.key, r.f.ns_per_op,
                  r.f.allocations_per_op);
    }
    std::printf("\"sdk_beyond_backend_ns\":%.1f,\"sdk_norec_beyond_backend_ns\":%.1f}\n",
                sdk_beyond, sdk_norec_beyond);
  } else {
    std::printf("%-56s %10s %12s\n", "uncontended exclusive pair (median of rounds)", "CPU ns",
                "allocations");
    for (const Row& r : rows) {
      std::printf("%-56s %10.1f %12.3f\n", r.what, r.f.ns_per_op, r.f.allocations_per_op);
    }
    std::printf("%-56s %10.1f\n", "SDK beyond the backend's own work (records on)", sdk_beyond);
    std::printf("%-56s %10.1f\n", "SDK beyond the backend's own work (records off)",
                sdk_norec_beyond);
  }
  if (expect_no_alloc && (sdk.allocations_per_op > 0 || sdk_norec.allocations_per_op > 0)) {
    std::fprintf(stderr,
                 "sdk_microbench: an uncontended SDK pair allocated (%.3f and %.3f per pair with "
                 "records on and off); the fast path must not\n",
                 sdk.allocations_per_op, sdk_norec.allocations_per_op);
    return 1;
  }
  return 0;
}
