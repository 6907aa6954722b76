// sdk_microbench: the SDK's own CPU cost per lock operation, measured on the host over the
// in-process backend (tests/support: lockd's lock table as atomic words in this process), so
// that no network, NIC or VM is in the figure. Issue 19, item 2. It runs:
//   backend   the backend's own work for one uncontended exclusive pair, the very operations the
//             engine issues (FA; the record entry's WRITE, posted; the done mark and the CAS,
//             started; the CAS reaped), issued on an InProcessMemory by hand;
//   engine    LockEngine::Acquire + StartRelease (reaped by the next acquire) on the same backend;
//   sdk       Client::LockSlot + LockHandle::Release over the test lockd (tests/support/
//             fake_lockd.h), records on (the default) and off;
//   handover  two threads of one client on one lock, the SDK end to end: ns per grant.
// Each is run `--rounds` times of `--iterations` pairs; the median round is printed: the calling
// thread's CPU time per pair (wall time for handover, which two threads share), with the heap
// allocations per pair (this binary counts every operator new, the client's own threads' too). The
// SDK's cost is the sdk figure minus the backend's, the issue's "beyond the in-process backend's
// own work". Nothing is asserted on times; `--expect-no-allocations` makes the run fail (exit 1) if
// an uncontended SDK pair allocated, which ctest checks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
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

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

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

// Runs `round(iterations)` `rounds` times; returns the median round's figures. Times are the
// calling thread's CPU time (`wall` false: one thread does all the work) or wall-clock time.
template <typename Round>
Figure Measure(int rounds, uint64_t iterations, Round round, bool wall = false) {
  std::vector<Figure> got;
  round(iterations / 10 + 1);  // warm-up: caches, pools, the thread's channel
  for (int r = 0; r < rounds; ++r) {
    const uint64_t a0 = g_allocations.load();
    const auto t0 = Clock::now();
    const double c0 = ThreadCpuNs();
    round(iterations);
    const double c1 = ThreadCpuNs();
    const auto t1 = Clock::now();
    const uint64_t a1 = g_allocations.load();
    const double ns = wall ? std::chrono::duration<double, std::nano>(t1 - t0).count() : c1 - c0;
    got.push_back({ns / static_cast<double>(iterations),
                   static_cast<double>(a1 - a0) / static_cast<double>(iterations)});
  }
  std::sort(got.begin(), got.end(),
            [](const Figure& a, const Figure& b) { return a.ns_per_op < b.ns_per_op; });
  return got[got.size() / 2];
}

constexpr uint64_t kLocks = 1024;

// The backend's operations of one uncontended exclusive pair with a record entry, as the engine
// issues them (lock_engine.cc: Acquire, StartRelease, FinishRelease), without the engine.
Figure Backend(int rounds, uint64_t iterations, bool records) {
  InProcessTable table(kLocks, 2 * proto::kSessionRecordSize);
  InProcessMemory mem(&table);
  const uint64_t entry = proto::kSessionRecordSize + proto::SessionRecord::EntryOffset(0);
  RemoteOp release[2];
  bool started = false;
  uint64_t slot = 0;
  return Measure(rounds, iterations, [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      slot = (slot + 1) % kLocks;
      const uint64_t word0 = proto::SlotOffset(slot);
      RemoteOp fa = RemoteOp::FetchAdd(RegionId::kLocks, word0,
                                       proto::AcquireIncrement(proto::Mode::kExclusive));
      if (!mem.Execute(fa).ok()) std::abort();
      if (started && !mem.Await().ok()) std::abort();  // the last release, reaped
      const uint64_t prev = fa.result[0];
      const uint64_t cur = prev + proto::AcquireIncrement(proto::Mode::kExclusive);
      if (records) {
        RemoteOp queued = RemoteOp::Write16(RegionId::kSessions, entry, prev | 1, prev);
        if (!mem.Post(queued).ok()) std::abort();
      }
      release[0] = RemoteOp::Write(RegionId::kSessions, entry + 16, i);
      release[1] = RemoteOp::CompareSwap(RegionId::kLocks, word0, cur,
                                         cur + proto::ReleaseIncrement(proto::Mode::kExclusive));
      const size_t first = records ? 0 : 1;
      if (!mem.Start(std::span<RemoteOp>(release + first, 2 - first)).ok()) std::abort();
      started = true;
    }
  });
}

// The engine alone: Acquire and a posted release (reaped by the next Acquire), no Client.
Figure Engine(int rounds, uint64_t iterations, bool records) {
  InProcessTable table(kLocks, 2 * proto::kSessionRecordSize);
  InProcessMemory mem(&table);
  EngineParams p;
  p.lock_count = kLocks;
  LockEngine engine(p, [](const Ticket&) {});
  PendingRelease pending;
  const uint64_t entry = proto::kSessionRecordSize + proto::SessionRecord::EntryOffset(0);
  uint32_t seq = 0;
  uint64_t slot = 0;
  return Measure(rounds, iterations, [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      slot = (slot + 1) % kLocks;
      AcquireOptions ao;
      ao.pending = &pending;
      if (records) {
        seq = proto::RequestEntry::NextSeq(seq);
        ao.record = entry;
        ao.record_seq = seq;
      }
      auto g = engine.Acquire(mem, slot, Mode::kExclusive, ao);
      if (!g.ok()) std::abort();
      if (!engine.StartRelease(mem, *g, &pending).ok()) std::abort();
    }
  });
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

// The SDK end to end: LockSlot and Release on one thread, round-robin over the locks.
Figure Sdk(int rounds, uint64_t iterations, bool records) {
  testing::FakeLockd lockd(LockdOptions());
  auto client = ConnectFake(lockd, records);
  uint64_t slot = 0;
  return Measure(rounds, iterations, [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      slot = (slot + 1) % kLocks;
      auto h = client->LockSlot(slot);
      if (!h.ok() || !h->Release().ok()) {
        std::fprintf(stderr, "sdk_microbench: %s\n", h.status().ToString().c_str());
        std::exit(2);
      }
    }
  });
}

// Two threads of one client taking turns on one lock: ns per grant (a handover each, mostly).
Figure Handover(int rounds, uint64_t iterations) {
  testing::FakeLockd lockd(LockdOptions());
  auto client = ConnectFake(lockd, true);
  return Measure(
      rounds, iterations,
      [&](uint64_t n) {
        std::atomic<bool> failed{false};
        auto work = [&] {
          for (uint64_t i = 0; i < n / 2; ++i) {
            auto h = client->LockSlot(0);
            if (!h.ok() || !h->Release().ok()) failed = true;
          }
        };
        std::thread a(work), b(work);
        a.join();
        b.join();
        if (failed) {
          std::fprintf(stderr, "sdk_microbench: a handover failed\n");
          std::exit(2);
        }
      },
      /*wall=*/true);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 200000;
  int rounds = 5;
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
    } else if (a == "--json") {
      json = true;
    } else if (a == "--expect-no-allocations") {
      expect_no_alloc = true;
    } else {
      std::fprintf(stderr,
                   "usage: sdk_microbench [--iterations N] [--rounds R] [--json] "
                   "[--expect-no-allocations] [--case backend|engine|sdk|sdk_norec|handover]\n");
      return 2;
    }
  }
  if (iterations < 10 || rounds < 1) {
    std::fprintf(stderr, "sdk_microbench: --iterations must be >= 10 and --rounds >= 1\n");
    return 2;
  }
  auto run = [&](const char* name, auto fn) {
    return only.empty() || only == name ? fn() : Figure{};
  };
  const Figure backend = run("backend", [&] { return Backend(rounds, iterations, true); });
  const Figure backend_norec = run("backend", [&] { return Backend(rounds, iterations, false); });
  const Figure engine = run("engine", [&] { return Engine(rounds, iterations, true); });
  const Figure sdk = run("sdk", [&] { return Sdk(rounds, iterations, true); });
  const Figure sdk_norec = run("sdk_norec", [&] { return Sdk(rounds, iterations, false); });
  const Figure handover =
      run("handover", [&] { return Handover(rounds, std::max<uint64_t>(iterations / 10, 10)); });
  struct Row {
    const char* key;
    const char* what;
    Figure f;
  } rows[] = {
      {"backend", "backend alone: one pair's operations (records on)", backend},
      {"backend_norec", "backend alone: one pair's operations (records off)", backend_norec},
      {"engine", "engine: Acquire + posted release (records on)", engine},
      {"sdk", "SDK: LockSlot + Release (records on, the default)", sdk},
      {"sdk_norec", "SDK: LockSlot + Release (records off)", sdk_norec},
      {"handover", "SDK: 2 threads of one client on one lock, wall ns per grant", handover},
  };
  if (json) {
    std::printf("{");
    for (const Row& r : rows) {
      std::printf("\"%s\":{\"ns\":%.1f,\"allocations\":%.3f},", r.key, r.f.ns_per_op,
                  r.f.allocations_per_op);
    }
    std::printf("\"sdk_beyond_backend_ns\":%.1f,\"sdk_norec_beyond_backend_ns\":%.1f}\n",
                sdk.ns_per_op - backend.ns_per_op, sdk_norec.ns_per_op - backend_norec.ns_per_op);
  } else {
    std::printf("%-56s %10s %12s\n", "uncontended exclusive pair (median of rounds)", "CPU ns",
                "allocations");
    for (const Row& r : rows) {
      std::printf("%-56s %10.1f %12.3f\n", r.what, r.f.ns_per_op, r.f.allocations_per_op);
    }
    std::printf("%-56s %10.1f\n", "SDK beyond the backend's own work (records on)",
                sdk.ns_per_op - backend.ns_per_op);
    std::printf("%-56s %10.1f\n", "SDK beyond the backend's own work (records off)",
                sdk_norec.ns_per_op - backend_norec.ns_per_op);
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
