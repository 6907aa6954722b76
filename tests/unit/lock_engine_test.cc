// The protocol engine over the in-process backend: many threads, shadow checks, and the branches
// of the protocol driven deterministically.
#include "engine/lock_engine.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "client/src/entry_pool.h"
#include "rdmalock/proto/layout.h"
#include "tests/support/inproc_memory.h"

using namespace rdmalock;
using namespace std::chrono_literals;
using proto::Word0;

namespace {

EngineParams Params(uint64_t locks, std::chrono::nanoseconds lease = 10s) {
  EngineParams p;
  p.lock_count = locks;
  p.lease = lease;
  p.stall_factor = 2;
  p.epoch = 1;
  return p;
}

// Collects abandoned tickets and frees them on a channel of its own, all stepped together without
// blocking (LockEngine::Reap, own = true), as the SDK's reaper does.
struct Reaper {
  explicit Reaper(InProcessTable* t) : table(t) {}
  InProcessTable* table;
  std::mutex mu;
  std::vector<Ticket> tickets;
  void Add(const Ticket& t) {
    std::lock_guard lk(mu);
    tickets.push_back(t);
  }
  // Steps every ticket (taking in new ones each round) until none is left. Returns how many it
  // freed. Not thread-safe against itself: one caller at a time.
  size_t DrainAll(const LockEngine& e) {
    InProcessMemory mem(table);
    std::vector<ReapState> pending;
    size_t total = 0;
    for (;;) {
      {
        std::lock_guard lk(mu);
        for (const Ticket& t : tickets) {
          ReapState r;
          r.ticket = t;
          r.own = true;
          pending.push_back(r);
        }
        total += tickets.size();
        tickets.clear();
      }
      if (pending.empty()) return total;
      for (size_t i = 0; i < pending.size();) {
        auto done = e.Reap(mem, pending[i]);
        REQUIRE(done.ok());
        if (*done) {
          pending[i] = pending.back();
          pending.pop_back();
        } else {
          ++i;
        }
      }
      if (!pending.empty()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

Word0 W0(InProcessTable& t, uint64_t slot) { return Word0::Decode(t.Load(slot, 0)); }

// Catch2's assertions are not thread-safe: worker threads record failures here and the test
// thread checks them once the workers have joined.
struct ThreadChecks {
  std::mutex mu;
  std::vector<std::string> failures;
  void Check(bool ok, const char* what, int line) {
    if (ok) return;
    std::lock_guard lk(mu);
    failures.push_back(std::string(what) + " (line " + std::to_string(line) + ")");
  }
  std::string Report() {
    std::lock_guard lk(mu);
    std::string out;
    for (const auto& f : failures) out += f + "\n";
    return out;
  }
};
#define THREAD_CHECK(checks, cond) (checks).Check((cond), #cond, __LINE__)

}  // namespace

TEST_CASE("uncontended exclusive acquire is one FETCH_AND_ADD, release one more") {
  InProcessTable table(16);
  LockEngine e(Params(16), nullptr);
  InProcessMemory mem(&table);
  auto g = e.Acquire(mem, 3, Mode::kExclusive, {});
  REQUIRE(g.ok());
  REQUIRE(mem.counters().Total() == 1);
  REQUIRE(e.Release(mem, *g).ok());
  REQUIRE(mem.counters().Total() == 2);
  REQUIRE(W0(table, 3) == Word0{.max_s = 0, .max_x = 1, .n_s = 0, .n_x = 1});
}

TEST_CASE("a token comes with an exclusive grant when asked for, and increases") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory mem(&table);
  AcquireOptions o;
  o.want_token = true;
  uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    auto g = e.Acquire(mem, 0, Mode::kExclusive, o);
    REQUIRE(g.ok());
    REQUIRE(g->token > last);
    REQUIRE((g->token >> 48) == 1);  // epoch
    last = g->token;
    REQUIRE(e.Release(mem, *g).ok());
  }
}

TEST_CASE("a token granted while giving up reads the generation after the grant") {
  // A racing reset's generation bump may land late, between a request's FA (and its READ of the
  // generation) and the grant of the request ahead of it. That request's token then carries the
  // higher generation; ours, granted after it, must not carry the lower one.
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory h(&table), p(&table), x(&table);
  auto held = e.Acquire(h, 1, Mode::kExclusive, {});
  REQUIRE(held.ok());
  const ManyRequest one[] = {{1, Mode::kExclusive, true}};
  auto pq = e.IssueMany(p, one, false, nullptr, nullptr);  // ticket 1, queued
  auto xq = e.IssueMany(x, one, false, nullptr, nullptr);  // ticket 2, queued
  REQUIRE(pq.ok());
  REQUIRE(xq.ok());
  REQUIRE_FALSE((*pq)[0].granted);
  REQUIRE_FALSE((*xq)[0].granted);
  RemoteOp bump = RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(1) + proto::kWord1Offset,
                                     proto::kGenerationIncrement);
  REQUIRE(h.Execute(bump).ok());  // the late bump
  REQUIRE(e.Release(h, *held).ok());
  AcquireOptions wait_opt;
  wait_opt.deadline = Clock::now() + 2s;
  auto pg = e.FinishAcquire(p, (*pq)[0].grant, wait_opt);  // granted in Wait: reads it
  REQUIRE(pg.ok());
  REQUIRE(e.Release(p, *pg).ok());
  AcquireOptions try_opt;
  try_opt.try_only = true;
  auto xg = e.FinishAcquire(x, (*xq)[0].grant, try_opt);  // granted while giving up
  REQUIRE(xg.ok());
  INFO("tokens " << std::hex << pg->token << " then " << xg->token);
  REQUIRE(xg->token > pg->token);
  REQUIRE(e.Release(x, *xg).ok());
}

TEST_CASE("out-of-range slot is refused") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory mem(&table);
  auto g = e.Acquire(mem, 4, Mode::kExclusive, {});
  REQUIRE(g.status().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("shared holders coexist; exclusive waits for all of them") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  InProcessMemory a(&table), b(&table), c(&table);
  auto s1 = e.Acquire(a, 0, Mode::kShared, {});
  auto s2 = e.Acquire(b, 0, Mode::kShared, {});
  REQUIRE(s1.ok());
  REQUIRE(s2.ok());
  AcquireOptions try_only;
  try_only.try_only = true;
  auto x = e.Acquire(c, 0, Mode::kExclusive, try_only);
  REQUIRE(x.status().code() == ErrorCode::kBusy);
  // The failed try-lock withdrew its ticket: the word is as before.
  REQUIRE(W0(table, 0) == Word0{.max_s = 2, .max_x = 0, .n_s = 0, .n_x = 0});
  REQUIRE(e.Release(a, *s1).ok());
  REQUIRE(e.Acquire(c, 0, Mode::kExclusive, try_only).status().code() == ErrorCode::kBusy);
  REQUIRE(e.Release(b, *s2).ok());
  auto x2 = e.Acquire(c, 0, Mode::kExclusive, try_only);
  REQUIRE(x2.ok());
  REQUIRE(e.Acquire(a, 0, Mode::kShared, try_only).status().code() == ErrorCode::kBusy);
  REQUIRE(e.Release(c, *x2).ok());
}

TEST_CASE("mutual exclusion under many threads (shadow counters)") {
  constexpr int kThreads = 8;
  constexpr int kOps = 4000;
  constexpr uint64_t kSlots = 3;
  InProcessTable table(kSlots);
  LockEngine e(Params(kSlots), nullptr);
  std::atomic<int> writers[kSlots] = {}, readers[kSlots] = {};
  std::atomic<int> violations{0}, max_readers{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      InProcessMemory mem(&table);
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < kOps; ++i) {
        const uint64_t slot = rng() % kSlots;
        const Mode m = rng() % 3 == 0 ? Mode::kExclusive : Mode::kShared;
        auto g = e.Acquire(mem, slot, m, {});
        if (!g.ok()) {
          violations++;
          continue;
        }
        if (m == Mode::kExclusive) {
          if (writers[slot].fetch_add(1) != 0 || readers[slot].load() != 0) violations++;
          std::this_thread::yield();
          writers[slot].fetch_sub(1);
        } else {
          const int r = readers[slot].fetch_add(1) + 1;
          if (writers[slot].load() != 0) violations++;
          int prev = max_readers.load();
          while (r > prev && !max_readers.compare_exchange_weak(prev, r)) {
          }
          std::this_thread::yield();
          readers[slot].fetch_sub(1);
        }
        if (!e.Release(mem, *g).ok()) violations++;
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(violations.load() == 0);
  REQUIRE(max_readers.load() >= 2);  // shared holders really overlapped
  for (uint64_t s = 0; s < kSlots; ++s) REQUIRE(W0(table, s).Drained());
}

TEST_CASE("grants follow ticket order (FIFO)") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  InProcessMemory holder_mem(&table);
  ThreadChecks tc;
  auto holder = e.Acquire(holder_mem, 0, Mode::kExclusive, {});
  REQUIRE(holder.ok());
  constexpr int kWaiters = 6;
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread> ts;
  for (int i = 0; i < kWaiters; ++i) {
    // Waiter i queues only after waiter i-1 has drawn its ticket.
    while (W0(table, 0).max_x + W0(table, 0).max_s != static_cast<uint16_t>(1 + i)) {
      std::this_thread::yield();
    }
    const Mode m = i % 3 == 2 ? Mode::kShared : Mode::kExclusive;
    ts.emplace_back([&, i, m] {
      InProcessMemory mem(&table);
      auto g = e.Acquire(mem, 0, m, {});
      THREAD_CHECK(tc, g.ok());
      if (!g.ok()) return;
      {
        std::lock_guard lk(mu);
        order.push_back(i);
      }
      std::this_thread::sleep_for(2ms);
      THREAD_CHECK(tc, e.Release(mem, *g).ok());
    });
  }
  while (W0(table, 0).max_x + W0(table, 0).max_s != 1 + kWaiters) std::this_thread::yield();
  REQUIRE(e.Release(holder_mem, *holder).ok());
  for (auto& t : ts) t.join();
  INFO(tc.Report());
  REQUIRE(tc.failures.empty());
  REQUIRE(order == std::vector<int>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("a timed-out waiter with nobody behind withdraws its ticket") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  InProcessMemory a(&table), b(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  AcquireOptions o;
  o.deadline = Clock::now() + 20ms;
  EngineEvents ev;
  auto w = e.Acquire(b, 0, Mode::kExclusive, o, &ev);
  REQUIRE(w.status().code() == ErrorCode::kTimeout);
  REQUIRE(ev.withdrawals.get() == 1);
  REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 1, .n_s = 0, .n_x = 0});
  REQUIRE(e.Release(a, *g).ok());
}

TEST_CASE("a timed-out waiter with others behind is abandoned and drained") {
  InProcessTable table(1);
  Reaper reaper(&table);
  LockEngine e(Params(1), [&](const Ticket& t) { reaper.Add(t); });
  InProcessMemory a(&table), b(&table), c(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  ThreadChecks checks;
  std::atomic<bool> b_done{false};
  std::thread tb([&] {
    AcquireOptions o;
    o.deadline = Clock::now() + 100ms;
    auto w = e.Acquire(b, 0, Mode::kExclusive, o);
    THREAD_CHECK(checks, w.status().code() == ErrorCode::kTimeout);
    b_done = true;
  });
  while (W0(table, 0).max_x != 2) std::this_thread::yield();
  std::thread tc([&] {
    auto w = e.Acquire(c, 0, Mode::kExclusive, {});  // queued behind b
    THREAD_CHECK(checks, w.ok());
    if (w.ok()) THREAD_CHECK(checks, e.Release(c, *w).ok());
  });
  tb.join();
  REQUIRE(b_done);
  REQUIRE(e.Release(a, *g).ok());
  // b's ticket must be granted and released by the reaper for c to get the lock.
  REQUIRE(reaper.DrainAll(e) == 1);
  tc.join();
  INFO(checks.Report());
  REQUIRE(checks.failures.empty());
  REQUIRE(W0(table, 0).Drained());
}

TEST_CASE("counters reset at COUNT_MAX and the lock keeps working (wrap-around)") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  const uint16_t near = proto::kCountMax - 3;
  table.Store(0, 0, Word0{.max_s = 5, .max_x = near, .n_s = 5, .n_x = near}.Encode());
  InProcessMemory mem(&table);
  EngineEvents ev;
  AcquireOptions o;
  o.want_token = true;
  uint64_t last_token = 0;
  for (int i = 0; i < 10; ++i) {
    auto g = e.Acquire(mem, 0, Mode::kExclusive, o, &ev);
    REQUIRE(g.ok());
    REQUIRE(g->token > last_token);  // monotonic across the reset
    last_token = g->token;
    REQUIRE(e.Release(mem, *g, &ev).ok());
  }
  REQUIRE(ev.resets.get() == 1);
  REQUIRE(proto::Generation(table.Load(0, 1)) == 1);
  REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 7, .n_s = 0, .n_x = 7});
}

TEST_CASE("requests on a frozen word withdraw; the last release resets it") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  const uint16_t last = proto::kCountMax - 1;
  table.Store(0, 0, Word0{.max_s = 2, .max_x = last, .n_s = 2, .n_x = last}.Encode());
  InProcessMemory a(&table), b(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});  // draws the last ticket: word now frozen
  REQUIRE(g.ok());
  REQUIRE(W0(table, 0).Frozen());
  std::atomic<bool> got{false};
  EngineEvents bev;
  ThreadChecks checks;
  std::thread tb([&] {
    auto w = e.Acquire(b, 0, Mode::kShared, {}, &bev);
    THREAD_CHECK(checks, w.ok());
    if (!w.ok()) return;
    got = true;
    THREAD_CHECK(checks, e.Release(b, *w).ok());
  });
  std::this_thread::sleep_for(20ms);
  REQUIRE_FALSE(got);
  REQUIRE(W0(table, 0).max_s == 2);  // b's increments were all withdrawn
  REQUIRE(e.Release(a, *g).ok());
  tb.join();
  INFO(checks.Report());
  REQUIRE(checks.failures.empty());
  REQUIRE(bev.withdrawals.get() >= 1);
  REQUIRE(proto::Generation(table.Load(0, 1)) >= 1);
  REQUIRE(W0(table, 0) == Word0{.max_s = 1, .max_x = 0, .n_s = 1, .n_x = 0});
}

TEST_CASE("a waiter recovers a lock whose holder died, after F x L") {
  InProcessTable table(1);
  const auto lease = 40ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory dead(&table), w(&table);
  auto g = e.Acquire(dead, 0, Mode::kExclusive, {});  // and never released
  REQUIRE(g.ok());
  EngineEvents ev;
  const auto t0 = Clock::now();
  auto g2 = e.Acquire(w, 0, Mode::kExclusive, {}, &ev);
  const auto took = Clock::now() - t0;
  REQUIRE(g2.ok());
  REQUIRE(ev.recoveries.get() == 1);
  REQUIRE(took >= 2 * lease);
  // The dead holder's late release is refused (lease expired) and changes nothing.
  const Word0 before = W0(table, 0);
  REQUIRE(e.Release(dead, *g).code() == ErrorCode::kLockLost);
  REQUIRE(W0(table, 0) == before);
  REQUIRE(e.Release(w, *g2).ok());
}

TEST_CASE("a release that finds its grant skipped is undone and reported lost") {
  InProcessTable table(1);
  LockEngine e(Params(1, 10s), nullptr);
  InProcessMemory a(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  // A waiter (ticket maxX=1) recovered past us: nX = 2, and queued again (maxX = 3).
  table.Store(0, 0, Word0{.max_s = 0, .max_x = 3, .n_s = 0, .n_x = 2}.Encode());
  REQUIRE(e.Release(a, *g).code() == ErrorCode::kLockLost);
  REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 3, .n_s = 0, .n_x = 2});
}

TEST_CASE("renewal keeps waiters from recovering a live holder") {
  InProcessTable table(1);
  const auto lease = 30ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory h(&table), w(&table);
  auto g = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  std::atomic<bool> stop{false};
  ThreadChecks checks;
  std::thread renewer([&] {
    while (!stop) {
      THREAD_CHECK(checks, e.Renew(h, *g).ok());
      std::this_thread::sleep_for(lease / 4);
    }
  });
  AcquireOptions o;
  o.deadline = Clock::now() + 5 * lease;  // longer than F x L
  EngineEvents ev;
  auto r = e.Acquire(w, 0, Mode::kExclusive, o, &ev);
  REQUIRE(r.status().code() == ErrorCode::kTimeout);
  REQUIRE(ev.recoveries.get() == 0);
  stop = true;
  renewer.join();
  INFO(checks.Report());
  REQUIRE(checks.failures.empty());
  REQUIRE(e.Release(h, *g).ok());
}

TEST_CASE("a broken channel surfaces as a connection error") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  InProcessMemory mem(&table);
  mem.Break();
  REQUIRE(e.Acquire(mem, 0, Mode::kExclusive, {}).status().code() == ErrorCode::kConnection);
}

TEST_CASE("an exclusive waiter recovers a lock whose shared holders died") {
  InProcessTable table(1);
  const auto lease = 30ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory d1(&table), d2(&table), w(&table);
  auto s1 = e.Acquire(d1, 0, Mode::kShared, {});
  auto s2 = e.Acquire(d2, 0, Mode::kShared, {});
  REQUIRE(s1.ok());
  REQUIRE(s2.ok());
  EngineEvents ev;
  const auto t0 = Clock::now();
  auto x = e.Acquire(w, 0, Mode::kExclusive, {}, &ev);
  REQUIRE(x.ok());
  REQUIRE(Clock::now() - t0 >= 2 * lease);
  REQUIRE(ev.recoveries.get() == 1);
  // Both readers were marked done; their late releases are refused and change nothing.
  const Word0 before = W0(table, 0);
  REQUIRE(e.Release(d1, *s1).code() == ErrorCode::kLockLost);
  REQUIRE(e.Release(d2, *s2).code() == ErrorCode::kLockLost);
  REQUIRE(W0(table, 0) == before);
  REQUIRE(e.Release(w, *x).ok());
}

TEST_CASE("a shared waiter recovers past a dead exclusive holder without counting other readers") {
  InProcessTable table(1);
  const auto lease = 30ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory dead(&table), r(&table);
  auto x = e.Acquire(dead, 0, Mode::kExclusive, {});
  REQUIRE(x.ok());
  EngineEvents ev;
  auto s = e.Acquire(r, 0, Mode::kShared, {}, &ev);
  REQUIRE(s.ok());
  REQUIRE(ev.recoveries.get() == 1);
  // nS counts the recovering reader's first ticket as done; it holds its second.
  REQUIRE(W0(table, 0) == Word0{.max_s = 2, .max_x = 1, .n_s = 1, .n_x = 1});
  REQUIRE(e.Release(r, *s).ok());
  REQUIRE(W0(table, 0).Drained());
}

TEST_CASE("a frozen word left by a dead requester is rescued after F x L") {
  InProcessTable table(1);
  const auto lease = 20ms;
  LockEngine e(Params(1, lease), nullptr);
  // Every ticket released, but one requester died between its FETCH_AND_ADD on the frozen word and
  // its withdrawal: the word can never drain by itself.
  const uint16_t cmax = proto::kCountMax;
  table.Store(0, 0, Word0{.max_s = 4, .max_x = uint16_t(cmax + 1), .n_s = 4, .n_x = cmax}.Encode());
  InProcessMemory mem(&table);
  EngineEvents ev;
  const auto t0 = Clock::now();
  auto g = e.Acquire(mem, 0, Mode::kExclusive, {}, &ev);
  REQUIRE(g.ok());
  REQUIRE(Clock::now() - t0 >= 2 * lease);
  REQUIRE(ev.resets.get() == 1);
  REQUIRE(proto::Generation(table.Load(0, 1)) == 1);
  REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 1, .n_s = 0, .n_x = 0});
  REQUIRE(e.Release(mem, *g).ok());
}

TEST_CASE("a shared request that draws the last ticket leaves the reset to whoever drains") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  const uint16_t last = proto::kCountMax - 1;
  table.Store(0, 0, Word0{.max_s = last, .max_x = 3, .n_s = last, .n_x = 3}.Encode());
  InProcessMemory a(&table), b(&table);
  auto s1 = e.Acquire(a, 0, Mode::kShared, {});  // draws the last S ticket: frozen
  REQUIRE(s1.ok());
  REQUIRE(W0(table, 0).Frozen());
  AcquireOptions try_only;
  try_only.try_only = true;
  REQUIRE(e.Acquire(b, 0, Mode::kShared, try_only).status().code() == ErrorCode::kBusy);
  REQUIRE(W0(table, 0).max_s == proto::kCountMax);  // the bounce was withdrawn
  EngineEvents ev;
  REQUIRE(e.Release(a, *s1, &ev).ok());  // drains the frozen word: the releaser resets it
  REQUIRE(ev.resets.get() == 1);
  REQUIRE(W0(table, 0) == Word0{});
  REQUIRE(proto::Generation(table.Load(0, 1)) == 1);
}

TEST_CASE("a delayed release that lands after a recovery changes nothing") {
  InProcessTable table(1);
  const auto lease = 40ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory h(&table), w(&table);
  auto g = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  // The holder checks its lease and posts its release, which is then held up (a pause) until a
  // waiter has recovered the lock and holds it.
  std::atomic<bool> recovered{false};
  h.set_hook([&](const RemoteOp& op) {
    if (op.kind == RemoteOp::Kind::kCompareSwap) {
      while (!recovered) std::this_thread::sleep_for(1ms);
    }
    return true;
  });
  std::thread releaser([&] { (void)e.Release(h, *g); });
  auto g2 = e.Acquire(w, 0, Mode::kExclusive, {});
  REQUIRE(g2.ok());
  const Word0 held = W0(table, 0);
  recovered = true;
  releaser.join();
  REQUIRE(W0(table, 0) == held);  // the stale release did not land
  REQUIRE(e.Release(w, *g2).ok());
}

// ---- Request records and lockd's recovery (Reap)

namespace {

// What lockd does with a fenced client's record: steps Reap() on every live entry until done.
int ReapRecord(InProcessTable& table, const LockEngine& e, uint64_t base) {
  InProcessMemory mem(&table);
  int released = 0;
  for (uint32_t i = 0; i < proto::SessionRecord::kMaxEntries; ++i) {
    const uint64_t off = base + proto::SessionRecord::EntryOffset(i);
    proto::RequestEntry entry;
    if (!proto::RequestEntry::DecodeLive(table.session_word(off).load(),
                                         table.session_word(off + 8).load(),
                                         table.session_word(off + 16).load(), &entry)) {
      continue;
    }
    if (entry.state != proto::RequestEntry::State::kQueued) continue;
    ReapState r;
    r.ticket = Ticket{entry.slot, entry.mode, Word0::Decode(entry.ticket), 0, 0};
    for (int step = 0; step < 1000; ++step) {
      auto done = e.Reap(mem, r);
      REQUIRE(done.ok());
      if (*done) break;
    }
    if (r.outcome == ReapState::Outcome::kReleased) ++released;
  }
  return released;
}

// Queues an exclusive request on `slot` as a waiting Acquire leaves it: returns its ticket.
Word0 QueueExclusive(InProcessMemory& m, uint64_t slot) {
  RemoteOp fa =
      RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(slot), proto::kAcquireExclusive);
  REQUIRE(m.Execute(fa).ok());
  return Word0::Decode(fa.result[0]);
}

}  // namespace

TEST_CASE("records: lockd frees a dead client's held and queued requests, exactly once") {
  InProcessTable table(4, 4 * 4096);
  LockEngine e(Params(4), nullptr);
  InProcessMemory a(&table), b(&table), c(&table);
  const uint64_t rec = 4096;  // client A's record
  AcquireOptions o;
  o.record = rec + proto::SessionRecord::EntryOffset(0);
  o.record_seq = 1;
  auto ga = e.Acquire(a, 0, Mode::kExclusive, o);  // A holds slot 0
  REQUIRE(ga.ok());
  o.record = rec + proto::SessionRecord::EntryOffset(1);
  auto gb = e.Acquire(b, 1, Mode::kExclusive, {});  // B holds slot 1 ...
  REQUIRE(gb.ok());
  // ... and A queues behind it: its FA and its entry, as a waiting Acquire leaves them.
  const Word0 queued = QueueExclusive(a, 1);
  proto::RequestEntry q;
  q.slot = 1;
  q.mode = Mode::kExclusive;
  q.state = proto::RequestEntry::State::kQueued;
  q.seq = 5;
  q.ticket = queued.Encode();
  const auto w = q.Encode();
  table.session_word(o.record).store(w[0]);
  table.session_word(o.record + 8).store(w[1]);
  a.Break();  // A dies (fenced)

  // lockd frees A's grant at once; A's queued request is released when its turn comes.
  REQUIRE(ReapRecord(table, e, rec) == 1);
  auto got0 = e.Acquire(c, 0, Mode::kExclusive, {.try_only = true});
  REQUIRE(got0.ok());
  REQUIRE(e.Release(b, *gb).ok());          // B releases: A's dead ticket is next ...
  REQUIRE(ReapRecord(table, e, rec) == 1);  // ... and lockd releases it for A
  auto got1 = e.Acquire(c, 1, Mode::kExclusive, {.try_only = true});
  REQUIRE(got1.ok());
  // Reaping again changes nothing: A's tickets are over.
  REQUIRE(ReapRecord(table, e, rec) == 0);
  REQUIRE(e.Release(c, *got0).ok());
  REQUIRE(e.Release(c, *got1).ok());
  REQUIRE(W0(table, 0).Drained());
  REQUIRE(W0(table, 1).Drained());
}

TEST_CASE("records: a crash anywhere in a shared release never releases it twice") {
  // Readers A and B hold slot 0, writer C waits. A's release is cut short by a crash before its
  // first or its second operation; lockd then reaps A's record. B must still hold, C must not be
  // granted, and the word must count A's release at most once.
  for (int crash_at = 0; crash_at < 3; ++crash_at) {
    INFO("crash before operation " << crash_at << " of the release");
    InProcessTable table(1, 2 * 4096);
    LockEngine e(Params(1), nullptr);
    InProcessMemory a(&table), b(&table), c(&table);
    const uint64_t rec = 4096;
    AcquireOptions o;
    o.record = rec + proto::SessionRecord::EntryOffset(0);
    o.record_seq = 1;
    auto ga = e.Acquire(a, 0, Mode::kShared, o);
    auto gb = e.Acquire(b, 0, Mode::kShared, {});
    REQUIRE(ga.ok());
    REQUIRE(gb.ok());
    const Ticket ct{0, Mode::kExclusive, QueueExclusive(c, 0), 0, 0};  // C queues
    REQUIRE(e.Renew(a, *ga).ok());  // A has seen the word as it is: its release CAS will match
    int ops = 0;
    a.set_hook([&](const RemoteOp&) { return ops++ != crash_at; });
    (void)e.Release(a, *ga);
    (void)ReapRecord(table, e, rec);
    const Word0 w = W0(table, 0);
    INFO("nS " << w.n_s << " maxS " << w.max_s);
    REQUIRE(w.n_s <= 1);                                 // A's release counted at most once
    REQUIRE_FALSE(proto::Granted(w, ct.word, ct.mode));  // B still holds: C waits
    REQUIRE(e.Release(b, *gb).ok());
  }
}

// ---- Posted releases (StartRelease / FinishRelease)

TEST_CASE("a posted release lands and is reaped; a release that misses is retried when reaped") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory a(&table), b(&table);
  PendingRelease p;

  // Uncontended: the CAS lands; reaping finds it done.
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  REQUIRE(e.StartRelease(a, *g, &p).ok());
  REQUIRE(p.active);
  REQUIRE(W0(table, 0).Drained());
  EngineEvents ev;
  REQUIRE(e.FinishRelease(a, &p, &ev).ok());
  REQUIRE_FALSE(p.active);
  REQUIRE(ev.deferred.get() == 0);

  // B queues behind A after A last looked: A's CAS compares against a stale word and misses.
  g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  const Word0 b_ticket = QueueExclusive(b, 0);
  REQUIRE(e.StartRelease(a, *g, &p).ok());
  REQUIRE_FALSE(proto::Granted(W0(table, 0), b_ticket, Mode::kExclusive));  // still A's
  // The next use of A's channel reaps it: the release is retried, and B is granted.
  AcquireOptions o;
  o.pending = &p;
  auto other = e.Acquire(a, 1, Mode::kExclusive, o, &ev);
  REQUIRE(other.ok());
  REQUIRE_FALSE(p.active);
  REQUIRE(ev.deferred.get() == 1);
  REQUIRE(proto::Granted(W0(table, 0), b_ticket, Mode::kExclusive));
  REQUIRE(e.Release(a, *other).ok());
}

TEST_CASE("a posted release is refused up front when the lease has lapsed") {
  InProcessTable table(2);
  LockEngine e(Params(2, 50ms), nullptr);
  InProcessMemory a(&table);
  PendingRelease p;
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  std::this_thread::sleep_for(60ms);
  const Status st = e.StartRelease(a, *g, &p);
  REQUIRE(st.code() == ErrorCode::kLockLost);
  REQUIRE_FALSE(p.active);
  REQUIRE(a.counters().compare_swap.get() == 0);  // nothing was posted
}

TEST_CASE("posted releases under many threads keep mutual exclusion and lose no release") {
  constexpr int kThreads = 6, kIters = 3000, kSlots = 2;
  InProcessTable table(kSlots);
  Reaper reaper(&table);
  LockEngine e(Params(kSlots), [&](const Ticket& t) { reaper.Add(t); });
  std::atomic<int> holders[kSlots] = {};
  ThreadChecks checks;
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      InProcessMemory mem(&table);
      PendingRelease p;
      std::minstd_rand rng(static_cast<unsigned>(i) + 1);
      for (int k = 0; k < kIters; ++k) {
        const uint64_t slot = rng() % kSlots;
        AcquireOptions o;
        o.pending = &p;
        auto g = e.Acquire(mem, slot, Mode::kExclusive, o);
        THREAD_CHECK(checks, g.ok());
        if (!g.ok()) return;
        THREAD_CHECK(checks, holders[slot].fetch_add(1) == 0);
        holders[slot].fetch_sub(1);
        THREAD_CHECK(checks, e.StartRelease(mem, *g, &p).ok());
      }
      THREAD_CHECK(checks, e.FinishRelease(mem, &p).ok());
    });
  }
  for (auto& t : ts) t.join();
  INFO(checks.Report());
  REQUIRE(checks.failures.empty());
  REQUIRE(reaper.DrainAll(e) == 0);
  for (uint64_t s = 0; s < kSlots; ++s) REQUIRE(W0(table, s).Drained());
}

// ---- Sets of locks (AcquireMany / ReleaseMany)

TEST_CASE("acquire_many of free locks is one doorbell of FETCH_AND_ADDs") {
  InProcessTable table(16);
  LockEngine e(Params(16), nullptr);
  InProcessMemory mem(&table);
  const ManyRequest reqs[] = {{1, Mode::kExclusive}, {4, Mode::kShared}, {9, Mode::kExclusive}};
  AcquireOptions o;
  o.want_token = true;
  auto gs = e.AcquireMany(mem, reqs, o, nullptr);
  REQUIRE(gs.ok());
  REQUIRE(gs->size() == 3);
  REQUIRE(mem.counters().batches.get() == 1);
  REQUIRE(mem.counters().fetch_add.get() == 3);
  REQUIRE(mem.counters().read.get() == 2);  // tokens for the exclusive ones only
  REQUIRE((*gs)[0].token != 0);
  REQUIRE((*gs)[1].token == 0);
  for (const Status& st : e.ReleaseMany(mem, *gs)) REQUIRE(st.ok());
  REQUIRE(mem.counters().batches.get() == 2);
  for (uint64_t s : {1, 4, 9}) REQUIRE(W0(table, s).Drained());
}

TEST_CASE("acquire_many: a held lock fails a try for the whole set, and nothing stays held") {
  InProcessTable table(8);
  Reaper reaper(&table);
  LockEngine e(Params(8), [&](const Ticket& t) { reaper.Add(t); });
  InProcessMemory a(&table), b(&table);
  auto held = e.Acquire(b, 5, Mode::kExclusive, {});
  REQUIRE(held.ok());
  const ManyRequest reqs[] = {{2, Mode::kExclusive}, {5, Mode::kExclusive}, {7, Mode::kShared}};
  AcquireOptions o;
  o.try_only = true;
  auto gs = e.AcquireMany(a, reqs, o, nullptr);
  REQUIRE(gs.status().code() == ErrorCode::kBusy);
  REQUIRE(W0(table, 2).Drained());
  REQUIRE(W0(table, 7).Drained());
  REQUIRE(e.Release(b, *held).ok());
  REQUIRE(W0(table, 5).Drained());  // the set's ticket on 5 was withdrawn
  EngineEvents ev;
  o.try_only = false;
  o.deadline = Clock::now() + 50ms;
  held = e.Acquire(b, 7, Mode::kExclusive, {});
  REQUIRE(held.ok());
  gs = e.AcquireMany(a, reqs, o, nullptr, &ev);  // times out on 7, after taking 2 and 5
  REQUIRE(gs.status().code() == ErrorCode::kTimeout);
  REQUIRE(ev.batch_fallbacks.get() == 1);
  REQUIRE(e.Release(b, *held).ok());
  reaper.DrainAll(e);
  for (uint64_t s : {2, 5, 7}) REQUIRE(W0(table, s).Drained());
}

TEST_CASE("acquire_many: overlapping sets from many threads never deadlock and stay exclusive") {
  // Every thread wants the same 4 slots (some shared); all FAs of a set go out at once, so two
  // sets may get tickets in opposite orders on two slots. The fallback (give back above the
  // first lock not granted, then acquire in order) must keep them from waiting on each other.
  constexpr int kThreads = 6, kIters = 800;
  InProcessTable table(8);
  Reaper reaper(&table);
  LockEngine e(Params(8), [&](const Ticket& t) { reaper.Add(t); });
  std::atomic<int> writers[8] = {}, readers[8] = {};
  std::atomic<bool> done{false};
  ThreadChecks checks;
  std::thread drainer([&] {
    while (!done.load()) {
      reaper.DrainAll(e);
      std::this_thread::sleep_for(1ms);
    }
  });
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      InProcessMemory mem(&table);
      std::minstd_rand rng(static_cast<unsigned>(i) * 31 + 7);
      for (int k = 0; k < kIters; ++k) {
        std::vector<ManyRequest> reqs;
        for (uint64_t s = 1; s < 8; s += 2) {
          reqs.push_back({s, rng() % 3 == 0 ? Mode::kShared : Mode::kExclusive});
        }
        AcquireOptions o;
        o.deadline = Clock::now() + 20s;  // a deadlock shows up as a timeout
        auto gs = e.AcquireMany(mem, reqs, o, nullptr);
        THREAD_CHECK(checks, gs.ok());
        if (!gs.ok()) return;
        for (const Grant& g : *gs) {
          if (g.ticket.mode == Mode::kExclusive) {
            THREAD_CHECK(checks, writers[g.ticket.slot].fetch_add(1) == 0);
            THREAD_CHECK(checks, readers[g.ticket.slot].load() == 0);
          } else {
            readers[g.ticket.slot].fetch_add(1);
            THREAD_CHECK(checks, writers[g.ticket.slot].load() == 0);
          }
        }
        for (const Grant& g : *gs) {
          if (g.ticket.mode == Mode::kExclusive) {
            writers[g.ticket.slot].fetch_sub(1);
          } else {
            readers[g.ticket.slot].fetch_sub(1);
          }
        }
        for (const Status& st : e.ReleaseMany(mem, *gs)) THREAD_CHECK(checks, st.ok());
      }
    });
  }
  for (auto& t : ts) t.join();
  done = true;
  drainer.join();
  reaper.DrainAll(e);
  INFO(checks.Report());
  REQUIRE(checks.failures.empty());
  for (uint64_t s = 1; s < 8; s += 2) REQUIRE(W0(table, s).Drained());
}

TEST_CASE("issue_many: independent requests in one doorbell; the queued ones finish like Acquire") {
  InProcessTable table(8);
  Reaper reaper(&table);
  LockEngine e(Params(8), [&](const Ticket& t) { reaper.Add(t); });
  InProcessMemory a(&table), b(&table);
  auto held = e.Acquire(b, 3, Mode::kExclusive, {});
  REQUIRE(held.ok());
  // Slot 2 twice (the second queues behind the first), slot 3 held by b, slot 5 free.
  const ManyRequest reqs[] = {{2, Mode::kExclusive, true},
                              {2, Mode::kExclusive, false},
                              {3, Mode::kShared, false},
                              {5, Mode::kShared, false}};
  auto is = e.IssueMany(a, reqs, false, nullptr, nullptr);
  REQUIRE(is.ok());
  REQUIRE(a.counters().batches.get() == 1);
  REQUIRE(a.counters().read.get() == 1);  // one token asked for
  REQUIRE((*is)[0].granted);
  REQUIRE((*is)[0].grant.token != 0);
  REQUIRE_FALSE((*is)[1].granted);
  REQUIRE_FALSE((*is)[2].granted);
  REQUIRE((*is)[3].granted);
  // A try gives the queued ticket on 3 back; a timed wait on 2 is granted once 2 is released.
  AcquireOptions try_opt;
  try_opt.try_only = true;
  REQUIRE(e.FinishAcquire(a, (*is)[2].grant, try_opt).status().code() == ErrorCode::kBusy);
  REQUIRE(e.Release(a, (*is)[0].grant).ok());
  AcquireOptions wait_opt;
  wait_opt.deadline = Clock::now() + 2s;
  auto second = e.FinishAcquire(a, (*is)[1].grant, wait_opt);
  REQUIRE(second.ok());
  REQUIRE(e.Release(a, *second).ok());
  REQUIRE(e.Release(a, (*is)[3].grant).ok());
  REQUIRE(e.Release(b, *held).ok());
  reaper.DrainAll(e);
  for (uint64_t s : {2, 3, 5}) REQUIRE(W0(table, s).Drained());
}

// ---- Issue 16's findings on the engine (each test failed on the code before its fix)

TEST_CASE("finding 3: an entry goes back to the pool only once its done mark has landed") {
  // A's try-lock gives up and marks its entry done; the mark is still in flight on A's QP (a
  // retransmission) when the entry is handed back. B takes the same entry (the pool is LIFO) on
  // its own QP, is granted a shared lock and releases it. A's late mark then lands last. The
  // record must not show B's finished request as live: lockd would release B's shared ticket a
  // second time and admit a writer beside a reader.
  InProcessTable table(1, 2 * 4096);
  const uint64_t rec = 4096;
  EntryPool pool(rec, 4);
  LockEngine e(Params(1), nullptr, [&](uint64_t entry) { pool.Give(entry); });
  InProcessMemory h(&table), a(&table), b(&table);
  auto held = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(held.ok());

  a.set_hold_posts(true);  // what A posts without waiting lands only when the test says
  AcquireOptions o;
  std::tie(o.record, o.record_seq) = pool.Take();
  o.try_only = true;
  REQUIRE(e.Acquire(a, 0, Mode::kExclusive, o).status().code() == ErrorCode::kBusy);
  REQUIRE(e.Release(h, *held).ok());

  AcquireOptions ob;
  std::tie(ob.record, ob.record_seq) = pool.Take();
  INFO("A's entry " << o.record << ", B's entry " << ob.record);
  auto gb = e.Acquire(b, 0, Mode::kShared, ob);
  REQUIRE(gb.ok());
  REQUIRE(e.Release(b, *gb).ok());
  a.LandHeld();  // A's late done mark
  InProcessMemory c(&table);
  auto gc = e.Acquire(c, 0, Mode::kShared, {});  // another reader holds now
  REQUIRE(gc.ok());

  const uint64_t entry = ob.record;
  proto::RequestEntry seen;
  const bool live = proto::RequestEntry::DecodeLive(table.session_word(entry).load(),
                                                    table.session_word(entry + 8).load(),
                                                    table.session_word(entry + 16).load(), &seen);
  CHECK_FALSE(live);
  // What lockd does with that record when the session ends: nothing to release, so C's
  // shared grant still counts and a writer would wait.
  CHECK(ReapRecord(table, e, rec) == 0);
  CHECK(W0(table, 0).n_s + 1 == W0(table, 0).max_s);
  REQUIRE(e.Release(c, *gc).ok());
}

TEST_CASE(
    "finding 8: a frozen-word withdrawal never takes back an increment of a later generation") {
  // W's FETCH_AND_ADD lands on frozen word F1, whose drain waits on a dead requester's increment.
  // W is preempted before its withdrawal; meanwhile others rescue the word (generation + 1, word
  // to 0), and it fills up and freezes again as F2 with other requesters' increments. W's first
  // CAS misses; it must not then withdraw from F2, whose increments are not W's.
  InProcessTable table(1);
  const auto lease = 20ms;
  LockEngine e(Params(1, lease), nullptr);
  const uint16_t cmax = proto::kCountMax;
  const Word0 f1{.max_s = 4, .max_x = uint16_t(cmax + 1), .n_s = 4, .n_x = cmax};
  table.Store(0, 0, f1.Encode());
  const Word0 f2{.max_s = 2, .max_x = uint16_t(cmax + 3), .n_s = 2, .n_x = cmax};
  InProcessMemory w(&table), other(&table);
  int ops = 0;
  w.set_hook([&](const RemoteOp& op) {
    // Before W's first operation after its FA: the rescue and the refill happen (on another QP),
    // while W sleeps a while as a preempted thread does.
    if (ops++ == 1 && op.kind == RemoteOp::Kind::kCompareSwap) {
      RemoteOp r[2] = {
          RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(0) + 8,
                             proto::kGenerationIncrement),
          RemoteOp::CompareSwap(RegionId::kLocks, proto::SlotOffset(0), table.Load(0, 0), 0)};
      REQUIRE(other.Execute(r).ok());
      RemoteOp fill = RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(0), f2.Encode());
      REQUIRE(other.Execute(fill).ok());
      std::this_thread::sleep_for(5ms);
    }
    return true;
  });
  AcquireOptions o;
  o.try_only = true;
  (void)e.Acquire(w, 0, Mode::kExclusive, o);
  const Word0 now = W0(table, 0);
  INFO("word0 after W's withdrawal: maxX " << now.max_x << " maxS " << now.max_s << " nX "
                                           << now.n_x << " nS " << now.n_s);
  CHECK(now == f2);  // F2's increments are all still there
}

TEST_CASE("finding 9: a request queued longer than a lease gives its old ticket back") {
  // The async pump issues W's FETCH_AND_ADD; W then sits in the queue longer than a lease before
  // a waiter thread picks it up (4 waiters, many requests). The pause rule queues W again; its
  // first ticket must not be left in the word, or the lock stalls for F x L when its turn comes.
  InProcessTable table(1);
  const auto lease = 40ms;
  Reaper reaper(&table);
  LockEngine e(Params(1, lease), [&](const Ticket& t) { reaper.Add(t); });
  InProcessMemory h(&table), w(&table);
  auto held = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(held.ok());
  const ManyRequest reqs[] = {{0, Mode::kExclusive, false}};
  auto issued = e.IssueMany(w, reqs, false, nullptr, nullptr);
  REQUIRE(issued.ok());
  REQUIRE_FALSE((*issued)[0].granted);
  for (int i = 0; i < 3; ++i) {  // more than a lease passes; the holder lives on, renewing
    std::this_thread::sleep_for(lease / 2);
    REQUIRE(e.Renew(h, *held).ok());
  }
  std::atomic<bool> stop{false};
  std::thread reap([&] {
    while (!stop.load()) {
      reaper.DrainAll(e);
      std::this_thread::sleep_for(1ms);
    }
  });
  std::thread release([&] {
    std::this_thread::sleep_for(5ms);
    (void)e.Release(h, *held);
  });
  EngineEvents ev;
  AcquireOptions o;
  o.deadline = Clock::now() + 60ms;  // well under F x L (80 ms) after the holder's release
  auto g = e.FinishAcquire(w, (*issued)[0].grant, o, &ev);
  release.join();
  stop.store(true);
  reap.join();
  INFO(g.status().ToString() << "; restarts " << ev.restarts.get() << ", abandoned "
                             << ev.abandoned.get());
  REQUIRE(g.ok());
  REQUIRE(ev.recoveries.get() == 0);
  REQUIRE(e.Release(w, *g).ok());
  reaper.DrainAll(e);
  REQUIRE(W0(table, 0).Drained());
}

TEST_CASE(
    "finding 3 (found by the records model): a request that ends before its entry is "
    "written leaves no earlier use looking live") {
  // The entry's first use: a shared grant, released (its done mark is seq 1). Its second use
  // bounces off a frozen word, so its entry is never written, and the try gives up. Marking that
  // use done with its own seq (2) would leave a = (seq 1, ticket) with d = 2: the released first
  // use would look live again, and lockd would release its shared ticket a second time.
  InProcessTable table(1, 2 * 4096);
  const uint64_t rec = 4096;
  EntryPool pool(rec, 1);
  LockEngine e(Params(1), nullptr, [&](uint64_t entry) { pool.Give(entry); });
  InProcessMemory a(&table), c(&table);
  AcquireOptions o1;
  std::tie(o1.record, o1.record_seq) = pool.Take();
  auto g1 = e.Acquire(a, 0, Mode::kShared, o1);
  REQUIRE(g1.ok());
  REQUIRE(e.Release(a, *g1).ok());
  // The word is frozen now (a dead requester's increment keeps it from draining).
  const uint16_t cmax = proto::kCountMax;
  table.Store(0, 0, Word0{.max_s = 1, .max_x = uint16_t(cmax + 1), .n_s = 1, .n_x = cmax}.Encode());
  AcquireOptions o2;
  std::tie(o2.record, o2.record_seq) = pool.Take();
  REQUIRE(o2.record == o1.record);
  o2.try_only = true;
  REQUIRE(e.Acquire(a, 0, Mode::kShared, o2).status().code() == ErrorCode::kBusy);
  proto::RequestEntry seen;
  const bool live = proto::RequestEntry::DecodeLive(
      table.session_word(o1.record).load(), table.session_word(o1.record + 8).load(),
      table.session_word(o1.record + 16).load(), &seen);
  CHECK_FALSE(live);
  // With another reader holding, lockd's reap of this record must release nothing.
  table.Store(0, 0, Word0{.max_s = 1, .max_x = 0, .n_s = 1, .n_x = 0}.Encode());
  auto gc = e.Acquire(c, 0, Mode::kShared, {});
  REQUIRE(gc.ok());
  CHECK(ReapRecord(table, e, rec) == 0);
  CHECK(e.Release(c, *gc).ok());
}
