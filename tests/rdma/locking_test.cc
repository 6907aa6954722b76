// RDMA integration tests: locking and fairness on real verbs. Exclusion and FIFO across client
// processes, stale releases, try-lock and timeouts, many threads of one client, sets
// (acquire_many / release_many), posted releases, asynchronous acquires, the per-session bound
// on one lock word's requests, the block READ of generations, and the premise under all of it:
// the NIC's atomics are exactly-once, retransmissions included.
// Run on rdma_rxe only (tests/rdma/lockd_fixture.h).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/budgets.h"
#include "engine/lock_engine.h"
#include "engine/verbs_memory.h"
#include "rdmalock/client.h"
#include "rdmalock/proto/layout.h"
#include "tests/rdma/clients.h"
#include "tests/rdma/lockd_fixture.h"
#include "tests/support/test_env.h"

using namespace rdmalock;
using namespace rdmalock::rdma_test;
using namespace std::chrono_literals;

namespace {

// Collects LockAsync results.
struct AsyncResults {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Result<LockHandle>> got;
  Client::LockCallback Callback() {
    return [this](Result<LockHandle> r) {
      {
        std::lock_guard lk(mu);
        got.push_back(std::move(r));
      }
      cv.notify_all();
    };
  }
  bool WaitFor(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, [&] { return got.size() >= n; });
  }
};

}  // namespace

TEST_CASE("exclusive and shared locks exclude each other across 4 client processes") {
  Lockd lockd(7604, 64);
  SharedFile shf;
  WorkerShared* sh = shf.get();
  constexpr int kProcs = 4, kOps = 150;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    kids.push_back(Worker({"exclusion", RxeIp(), std::to_string(lockd.port()), shf.path(),
                           std::to_string(p), std::to_string(kOps)}));
  }
  for (pid_t k : kids) REQUIRE(WaitExit(k, 180s) == 0);
  INFO("ops " << sh->ops << " errors " << sh->errors << " max concurrent readers "
              << sh->max_readers);
  REQUIRE(sh->ops == kProcs * kOps);
  REQUIRE(sh->errors == 0);
  REQUIRE(sh->violations == 0);
  REQUIRE(sh->max_readers >= 2);
  auto c = MustConnect(lockd);
  auto s = c->Inspect(c->SlotOf("contended"));
  REQUIRE(s.ok());
  REQUIRE(s->exclusive_outstanding == 0);
  REQUIRE(s->shared_outstanding == 0);
}

TEST_CASE("grants follow ticket order across processes (FIFO)") {
  Lockd lockd(7605, 64);
  auto c = MustConnect(lockd);
  auto holder = c->Lock("fifo");
  REQUIRE(holder.ok());
  SharedFile shf;
  WorkerShared* ord = shf.get();
  const uint64_t slot = c->SlotOf("fifo");
  std::vector<pid_t> kids;
  constexpr int kWaiters = 5;
  for (int i = 0; i < kWaiters; ++i) {
    kids.push_back(
        Worker({"fifo", RxeIp(), std::to_string(lockd.port()), shf.path(), std::to_string(i)}));
    // Wait until this waiter has drawn its ticket before starting the next.
    const auto end = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      auto s = c->Inspect(slot);
      REQUIRE(s.ok());
      if (s->exclusive_issued + s->shared_issued == i + 2) break;
      REQUIRE(std::chrono::steady_clock::now() < end);
      std::this_thread::sleep_for(5ms);
    }
  }
  REQUIRE(holder->Release().ok());
  for (pid_t k : kids) REQUIRE(WaitExit(k, 120s) == 0);
  std::vector<int> got;
  for (int i = 0; i < kWaiters; ++i) got.push_back(ord->order[i]);
  REQUIRE(got == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("a release that no longer matches the grant is refused and changes nothing") {
  Lockd lockd(7606, 16);
  ChannelParams p{RxeIp(), lockd.port(), 3000ms, "engine", 0};
  auto a = VerbsMemory::Connect(p);
  auto b = VerbsMemory::Connect(p);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  EngineParams ep;
  ep.lock_count = 16;
  ep.lease = 10s;
  LockEngine e(ep, nullptr);
  auto g1 = e.Acquire(**a, 5, Mode::kExclusive, {});
  REQUIRE(g1.ok());
  REQUIRE(e.Release(**a, *g1).ok());
  auto g2 = e.Acquire(**b, 5, Mode::kExclusive, {});  // b holds now
  REQUIRE(g2.ok());
  // a replays its old release: the engine sees from the FA's result that it is not the holder,
  // undoes the increment and reports the lock lost.
  REQUIRE(e.Release(**a, *g1).code() == ErrorCode::kLockLost);
  AcquireOptions try_only;
  try_only.try_only = true;
  REQUIRE(e.Acquire(**a, 5, Mode::kExclusive, try_only).status().code() == ErrorCode::kBusy);
  REQUIRE(e.Release(**b, *g2).ok());
  // And through the SDK: a released handle cannot release again.
  auto c = MustConnect(lockd);
  auto h = c->LockSlot(5);
  REQUIRE(h.ok());
  REQUIRE(h->Release().ok());
  REQUIRE(h->Release().code() == ErrorCode::kNotHeld);
  LockHandle empty;
  REQUIRE(empty.Release().code() == ErrorCode::kNotHeld);
}

TEST_CASE(
    "going round 1,000 locks: one 1 KiB READ per 64 slots teaches the session their generations") {
  Lockd lockd(7612, 1000);
  ChannelParams p{RxeIp(), lockd.port(), 3000ms, "engine", 0};
  auto a = VerbsMemory::Connect(p);
  REQUIRE(a.ok());
  EngineParams ep;
  ep.lock_count = 1000;
  ep.lease = 10s;
  LockEngine e(ep, nullptr);
  for (int i = 0; i < 3; ++i) {
    auto g = e.Acquire(**a, 70, Mode::kExclusive, {});
    REQUIRE(g.ok());
    REQUIRE(e.Release(**a, *g).ok());
  }
  // The block READ on a real QP, behind an FA in one doorbell: slots 64..127's words land in the
  // caller's buffer, slot 70's showing its three pairs and the FA, the others untouched.
  uint64_t block[2 * LockEngine::kGenerationBlockSlots];
  RemoteOp ops[2] = {
      RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(71), 0),
      RemoteOp::ReadInto(RegionId::kLocks, proto::SlotOffset(64), budget::kMaxBlockRead, block)};
  REQUIRE((*a)->Execute(ops).ok());
  for (uint64_t i = 0; i < LockEngine::kGenerationBlockSlots; ++i) {
    INFO("slot " << 64 + i);
    CHECK(block[2 * i] ==
          (i == 6 ? proto::Word0{.max_s = 0, .max_x = 3, .n_s = 0, .n_x = 3}.Encode() : 0));
    CHECK(block[2 * i + 1] == 0);  // generation 0 everywhere: no word was reset
  }
  // Two in one doorbell are refused before anything is posted, and the channel goes on.
  uint64_t other[2 * LockEngine::kGenerationBlockSlots];
  RemoteOp two[2] = {
      RemoteOp::ReadInto(RegionId::kLocks, proto::SlotOffset(0), budget::kMaxBlockRead, block),
      RemoteOp::ReadInto(RegionId::kLocks, proto::SlotOffset(64), budget::kMaxBlockRead, other)};
  CHECK((*a)->Execute(two).code() == ErrorCode::kInvalidArgument);
  REQUIRE((*a)->Execute(ops[1]).ok());
  // Through the SDK, records on, no fencing token (a token READs word1 after the grant, every
  // time): the first pass over the table READs once per block of 64 slots (16 blocks, the last
  // cut at the table's end), and every pair is FA, the entry's WRITE and the CAS (writes also
  // count the keeper's heartbeats, so only the others are exact).
  auto c = MustConnect(lockd);
  const LockOptions no_token{.fencing_token = false};
  REQUIRE(c->LockSlot(0, no_token).ok());  // the first thread's channel, and its first block
  ClientStats before = c->Stats();
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t s = 0; s < 1000; ++s) {
      auto h = c->LockSlot(s, no_token);
      REQUIRE(h.ok());
      REQUIRE(h->Release().ok());
    }
  }
  ClientStats d = c->Stats();
  d -= before;
  CHECK(d.fetch_add == 2000);
  CHECK(d.compare_swap == 2000);
  CHECK(d.read == 15);  // blocks 1..15; block 0 was read before
  CHECK(d.write >= 2000);
  CHECK(d.lost == 0);
}

TEST_CASE("try-lock, timeouts and shared holders on real verbs") {
  Lockd lockd(7607, 128);
  auto a = MustConnect(lockd);
  auto b = MustConnect(lockd);
  auto x = a->Lock("t");
  REQUIRE(x.ok());
  REQUIRE(b->TryLock("t").status().code() == ErrorCode::kBusy);
  const auto t0 = std::chrono::steady_clock::now();
  auto w = b->Lock("t", {.timeout = 300ms});
  REQUIRE(w.status().code() == ErrorCode::kTimeout);
  REQUIRE(std::chrono::steady_clock::now() - t0 >= 300ms);
  REQUIRE(x->Release().ok());
  auto s1 = a->Lock("t", {.mode = LockMode::kShared});
  auto s2 = b->Lock("t", {.mode = LockMode::kShared, .timeout = 1000ms});
  REQUIRE(s1.ok());
  REQUIRE(s2.ok());
  REQUIRE(s2->fencing_token() == 0);
  REQUIRE(a->TryLock("t").status().code() == ErrorCode::kBusy);
  REQUIRE(a->LockSlot(128).status().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("many threads of one client share it, each on its own connection") {
  Lockd lockd(7610, 32);
  auto c = MustConnect(lockd);
  std::atomic<int> in{0}, violations{0}, done{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        auto h = c->Lock("threads", {.timeout = 30000ms});
        if (!h.ok()) {
          violations++;
          continue;
        }
        if (in.fetch_add(1) != 0) violations++;
        in.fetch_sub(1);
        if (!h->Release().ok()) violations++;
        done++;
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(violations == 0);
  REQUIRE(done == 400);
  // Four connections, one session: lockd counts clients, not QPs.
  auto info = c->Info();
  REQUIRE(info.ok());
  REQUIRE(info->connected_clients == 1);
  auto sessions = c->Sessions();
  REQUIRE(sessions.ok());
  int clients = 0;
  for (const auto& s : *sessions) clients += s.lockd_loopback ? 0 : 1;
  REQUIRE(clients == 1);
}

TEST_CASE("acquire_many takes a set all or nothing; release_many frees it") {
  Lockd lockd(7640, 256);
  auto a = MustConnect(lockd);
  auto b = MustConnect(lockd);
  std::vector<std::string> names;
  std::vector<LockRequest> reqs;
  for (int i = 0; i < 8; ++i) names.push_back("set/" + std::to_string(i));
  for (int i = 0; i < 8; ++i) {
    reqs.push_back({names[i], i % 3 == 0 ? LockMode::kShared : LockMode::kExclusive});
  }
  const ClientStats before = a->Stats();
  auto set = a->LockMany(reqs, {.timeout = 2000ms});
  REQUIRE(set.ok());
  REQUIRE(!set->empty());
  REQUIRE(set->size() <= 8);  // names may share a slot
  for (size_t i = 1; i < set->size(); ++i) REQUIRE((*set)[i - 1].slot() < (*set)[i].slot());
  for (auto& h : *set) REQUIRE(h.state() == LockState::kHeld);
  const ClientStats after = a->Stats();
  REQUIRE(after.batches - before.batches == 1);
  REQUIRE(after.batch_fallbacks == before.batch_fallbacks);  // all free: one doorbell
  REQUIRE(after.fetch_add - before.fetch_add == set->size());

  // b wants an overlapping set: a try fails as a whole, and b holds nothing of it after.
  const LockRequest overlap[] = {{"other", LockMode::kExclusive}, {names[1], LockMode::kExclusive}};
  REQUIRE(b->LockMany(overlap, {.timeout = 0ms}).status().code() == ErrorCode::kBusy);
  REQUIRE(a->TryLock("other").ok());  // not left held by b's failed set

  // With a timeout b waits; a's release_many lets it in.
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    auto s = b->LockMany(overlap, {.timeout = 10000ms});
    got = s.ok() && s->size() == 2;
  });
  std::this_thread::sleep_for(200ms);
  REQUIRE_FALSE(got.load());
  REQUIRE(a->ReleaseMany(*set).ok());
  for (auto& h : *set) REQUIRE(h.state() == LockState::kReleased);
  waiter.join();
  REQUIRE(got.load());
  REQUIRE(b->Stats().batch_fallbacks >= 1);
}

TEST_CASE(
    "a posted release that finds a new waiter is retried in the background, not left stalled") {
  // lease 2 s, F = 2: a release left unretried would hold the waiter for F x L = 4 s.
  Lockd lockd(7641, 64);
  auto a = MustConnect(lockd);
  auto b = MustConnect(lockd);
  auto h = a->Lock("posted");
  REQUIRE(h.ok());
  std::atomic<int64_t> waited_ms{-1};
  std::thread waiter([&] {
    const auto t0 = std::chrono::steady_clock::now();
    auto w = b->Lock("posted", {.timeout = 10000ms});
    if (w.ok()) {
      waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
    }
  });
  // b queues after a's grant was seen, so a's CAS compares against a stale word and misses.
  // (Waited for without a bound of 1 s, which fell through silently if b's new thread took
  // longer to connect; found by review, 2026-12-06.)
  WaitQueued(*a, a->SlotOf("posted"), 2);
  const auto released = std::chrono::steady_clock::now();
  REQUIRE(h->Release().ok());
  // ... and this thread makes no further call: the reaper thread must reap and retry it.
  waiter.join();
  const auto handover = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - released);
  REQUIRE(waited_ms.load() >= 0);
  WARN("handover after a posted release that missed: " << handover.count() << " ms");
  REQUIRE(handover < 2000ms);  // well under a lease: not stall recovery
  REQUIRE(a->Stats().deferred_releases >= 1);
}

TEST_CASE("async acquires: many in flight from one thread, waits, try, timeout and close") {
  Lockd lockd(7642, 4096);
  auto a = MustConnect(lockd);
  auto b = MustConnect(lockd);

  // 64 requests on distinct slots from one thread, without waiting in between.
  AsyncResults r;
  const ClientStats before = a->Stats();
  for (uint64_t s = 0; s < 64; ++s) {
    REQUIRE(a->LockSlotAsync(s * 7, {.timeout = 5000ms}, r.Callback()).ok());
  }
  REQUIRE(r.WaitFor(64, 20000ms));
  std::vector<LockHandle> held;
  for (auto& g : r.got) {
    REQUIRE(g.ok());
    REQUIRE(g->state() == LockState::kHeld);
    REQUIRE(g->fencing_token() != 0);
    held.push_back(std::move(*g));
  }
  REQUIRE(a->Stats().acquires - before.acquires == 64);
  REQUIRE(b->TryLockSlot(7 * 5).status().code() == ErrorCode::kBusy);
  REQUIRE(a->ReleaseMany(held).ok());

  // A request on a held lock waits (on a waiter thread) and is granted once it is released.
  auto x = a->LockSlot(1);
  REQUIRE(x.ok());
  AsyncResults w;
  REQUIRE(b->LockSlotAsync(1, {.timeout = 10000ms}, w.Callback()).ok());
  REQUIRE(b->LockSlotAsync(1, {.timeout = 0ms}, w.Callback()).ok());  // a try: busy
  REQUIRE(b->LockSlotAsync(2, {.timeout = 0ms}, w.Callback()).ok());  // a try: free
  REQUIRE(w.WaitFor(2, 5000ms));
  std::this_thread::sleep_for(200ms);
  {
    std::lock_guard lk(w.mu);
    REQUIRE(w.got.size() == 2);  // the waiting one has not completed
    int busy = 0, ok = 0;
    for (auto& g : w.got) {
      if (g.ok()) ok++;
      if (g.status().code() == ErrorCode::kBusy) busy++;
    }
    REQUIRE(busy == 1);
    REQUIRE(ok == 1);
  }
  REQUIRE(x->Release().ok());
  REQUIRE(w.WaitFor(3, 5000ms));
  REQUIRE(w.got[2].ok());
  REQUIRE(w.got[2]->slot() == 1);

  // A timeout completes with kTimeout.
  AsyncResults t;
  REQUIRE(a->LockSlotAsync(1, {.timeout = 300ms}, t.Callback()).ok());
  REQUIRE(t.WaitFor(1, 5000ms));
  REQUIRE(t.got[0].status().code() == ErrorCode::kTimeout);

  // Closing a client with a request still waiting completes it with kConnection, promptly.
  AsyncResults c;
  auto closing = MustConnect(lockd);
  REQUIRE(closing->LockSlotAsync(1, {}, c.Callback()).ok());  // waits for ever
  std::this_thread::sleep_for(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  closing.reset();
  REQUIRE(std::chrono::steady_clock::now() - t0 < 5000ms);
  REQUIRE(c.WaitFor(1, 1000ms));
  REQUIRE(c.got[0].status().code() == ErrorCode::kConnection);
  REQUIRE(a->LockSlotAsync(99999, {}, c.Callback()).code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("cohort on rdma_rxe: async requests and a set's grant are handed over in-process") {
  Lockd lockd(7648, 64);
  auto a = MustConnect(lockd);  // local handover on (the default)
  // FETCH_AND_ADDs that acquire (a renewal is one on word1 too).
  auto acquiring_fas = [&] {
    const ClientStats s = a->Stats();
    return s.fetch_add - s.renewals - s.renew_failures;
  };

  // The async pump's own connection first, outside the measured part: made within the 500 ms
  // below it could leave the requests too late to queue in-process (found by review,
  // 2026-12-06: a handshake can stall for a second under TCG).
  {
    AsyncResults warm;
    REQUIRE(a->LockSlotAsync(9, {.fencing_token = false}, warm.Callback()).ok());
    REQUIRE(warm.WaitFor(1, 20000ms));
    REQUIRE(warm.got[0].ok());
    REQUIRE(warm.got[0]->Release().ok());
  }
  // Three async requests for a lock a thread of the client holds wait in-process (on the async
  // waiter threads) and are handed the grant one after the other: no FETCH_AND_ADD of theirs.
  auto x = a->LockSlot(1, {.fencing_token = false});
  REQUIRE(x.ok());
  const ClientStats before = a->Stats();
  const uint64_t fas = acquiring_fas();
  AsyncResults r;
  std::atomic<int> released{0};
  for (int i = 0; i < 3; ++i) {
    REQUIRE(a->LockSlotAsync(1, {.timeout = 20000ms, .fencing_token = false},
                             [&](Result<LockHandle> h) {
                               if (h.ok() && h->Release().ok()) ++released;
                               r.Callback()(std::move(h));
                             })
                .ok());
  }
  std::this_thread::sleep_for(500ms);  // all three queue in-process meanwhile
  REQUIRE(x->Release().ok());
  REQUIRE(r.WaitFor(3, 20000ms));
  CHECK(released.load() == 3);
  CHECK(a->Stats().local_handovers - before.local_handovers == 3);
  CHECK(acquiring_fas() == fas);

  // A set's exclusive grant is handed to a thread of the client that waits for it, also when
  // the set is released with ReleaseMany.
  const std::vector<SlotRequest> set = {{5, LockMode::kExclusive}, {6, LockMode::kExclusive}};
  auto held = a->LockManySlots(set, {.fencing_token = false});
  REQUIRE(held.ok());
  Status waited, warmed;
  std::atomic<int> phase{0};
  std::thread t([&] {
    // This new thread's connection first (it joins the session), outside the measured part.
    auto warm = a->LockSlot(8, {.fencing_token = false});
    warmed = warm.ok() ? warm->Release() : warm.status();
    phase = 1;
    while (phase.load() != 2) std::this_thread::sleep_for(1ms);
    auto h = a->LockSlot(5, {.timeout = 20000ms, .fencing_token = false});
    waited = h.ok() ? h->Release() : h.status();
  });
  while (phase.load() != 1) std::this_thread::sleep_for(1ms);
  const ClientStats mid = a->Stats();
  const uint64_t fas_mid = acquiring_fas();
  phase = 2;
  std::this_thread::sleep_for(500ms);  // it queues in-process behind the set's grant
  REQUIRE(a->ReleaseMany(*held).ok());
  t.join();
  INFO(waited.ToString() << "; the warm-up: " << warmed.ToString());
  REQUIRE(warmed.ok());
  CHECK(waited.ok());
  CHECK(a->Stats().local_handovers - mid.local_handovers == 1);
  CHECK(acquiring_fas() == fas_mid);
  // Nothing is left held: another client takes all three at once.
  auto b = MustConnect(lockd);
  CHECK(b->TryLockSlot(1).ok());
  CHECK(b->TryLockSlot(5).ok());
  CHECK(b->TryLockSlot(6).ok());
}

TEST_CASE("cohort on rdma_rxe: readers of one client share one shared grant in-process") {
  Lockd lockd(7649, 64);
  auto a = MustConnect(lockd);
  auto b = MustConnect(lockd);
  auto acquiring_fas = [&] {
    const ClientStats s = a->Stats();
    return s.fetch_add - s.renewals - s.renew_failures;
  };
  auto first = a->LockSlot(3, {.mode = LockMode::kShared});
  REQUIRE(first.ok());
  const ClientStats before = a->Stats();
  const uint64_t fas = acquiring_fas();
  // Four more threads of the client read the lock: they join the client's grant, no FA.
  std::mutex mu;
  std::vector<LockHandle> readers;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      auto h = a->LockSlot(3, {.mode = LockMode::kShared, .timeout = 20000ms});
      std::lock_guard lk(mu);
      if (h.ok()) readers.push_back(std::move(*h));
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(readers.size() == 4);
  CHECK(a->Stats().local_shares - before.local_shares == 4);
  CHECK(acquiring_fas() == fas);
  auto st = a->Inspect(3);
  REQUIRE(st.ok());
  CHECK(st->shared_holders == 1);  // one shared grant at lockd for all five readers
  // Another client's writer waits until the last of them leaves.
  std::atomic<bool> granted{false};
  Status wrote;
  std::thread writer([&] {
    auto h = b->LockSlot(3, {.timeout = 20000ms});
    granted = h.ok();
    wrote = h.ok() ? h->Release() : h.status();
  });
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(granted.load());
  REQUIRE(first->Release().ok());
  for (int i = 0; i < 3; ++i) REQUIRE(readers[i].Release().ok());
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(granted.load());  // one reader left: the grant is still held
  CHECK(readers[3].state() == LockState::kHeld);
  REQUIRE(readers[3].Release().ok());
  writer.join();
  INFO(wrote.ToString());
  CHECK(granted.load());
  CHECK(wrote.ok());
}

TEST_CASE("finding 11: one client's requests on one lock word are bounded by 32767 / max_clients") {
  // max_clients 1024: each session may have 31 requests on one word at once, so 1,024 sessions
  // never make a 16-bit field carry. Before the fix a client could queue or hold any number.
  Lockd lockd(7668, 64, 2000, 1024);
  // Each reader to lockd: with the cohort, readers after the first would join its grant
  // in-process and hold no request on the word (nor a unit).
  auto a = MustConnectQueuingAtLockd(lockd);
  std::vector<LockHandle> held;
  Status refused;
  for (int i = 0; i < 40 && refused.ok(); ++i) {
    auto h = a->TryLock("f11", LockMode::kShared);
    if (h.ok()) {
      held.push_back(std::move(*h));
    } else {
      refused = h.status();
    }
  }
  INFO(refused.ToString());
  CHECK(held.size() == 31);
  CHECK(refused.code() == ErrorCode::kResource);
  CHECK(refused.message().find("32767 / max_clients") != std::string::npos);
  // Asynchronous requests count too, and a released grant gives its unit back.
  CHECK(a->LockAsync("f11", {.mode = LockMode::kShared}, [](Result<LockHandle>) {}).code() ==
        ErrorCode::kResource);
  REQUIRE(held.back().Release().ok());
  held.pop_back();
  auto again = a->TryLock("f11", LockMode::kShared);
  CHECK(again.ok());
  auto s = a->Inspect(a->SlotOf("f11"));
  REQUIRE(s.ok());
  CHECK(s->shared_outstanding == 31);
}

namespace {
// The test NIC's count of duplicate requests its responder saw (retransmissions), over every
// rdma device's port 1 (rdma_rxe's hw_counters; 0 where a device has none).
uint64_t DuplicateRequests() {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& dev : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    std::ifstream f(dev.path() / "ports/1/hw_counters/duplicate_request");
    uint64_t v = 0;
    if (f >> v) n += v;
  }
  return n;
}

// `n` raw channels (QPs) to `lockd`, each its own session; lockd rate-limits a burst of
// connections, so each is retried for up to 10 s.
std::vector<std::unique_ptr<VerbsMemory>> ConnectChannels(const Lockd& lockd, int n,
                                                          const char* name) {
  std::vector<std::unique_ptr<VerbsMemory>> mems;
  for (int i = 0; i < n; ++i) {
    for (int attempt = 0;; ++attempt) {
      ChannelParams p{RxeIp(), lockd.port(), 3000ms, name, 0};
      auto m = VerbsMemory::Connect(p);
      if (m.ok()) {
        mems.push_back(std::move(m).value());
        break;
      }
      REQUIRE(attempt < 20);
      std::this_thread::sleep_for(500ms);
    }
  }
  return mems;
}

// A raw channel's heartbeat, every 100 ms, so that lockd keeps its session: false if it failed.
struct Heartbeat {
  uint64_t beat = 0;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now() - 1s;
  bool Keep(VerbsMemory& m) {
    if (std::chrono::steady_clock::now() - last <= 100ms) return true;
    RemoteOp w =
        RemoteOp::Write(RegionId::kSessions,
                        m.reply().session_record_offset + proto::SessionRecord::kHeartbeat, ++beat);
    if (!m.Execute(w).ok()) return false;
    last = std::chrono::steady_clock::now();
    return true;
  }
};
}  // namespace

TEST_CASE("the NIC's atomics are exactly-once under load, retransmissions included") {
  // The protocol's premise (RC): a retransmitted FETCH_AND_ADD or COMPARE_AND_SWAP is executed
  // once and its first result returned. Were a retransmitted CAS executed again, or its reply
  // lost and a later value returned, a release that swapped would read as missed and be made
  // again (LockEngine::FinishRelease), which for a shared grant releases another reader's
  // ticket. 8 QPs, each doorbell an FA on one word, a CAS increment on another and a READ, for
  // 10 s: every FA's old value is seen once and the word ends at the count issued; the CAS
  // word ends at the number of CASes reported as swapped. Under TCG rdma_rxe retransmits a few
  // times a second under such load (its duplicate_request counter, printed).
  Lockd lockd(7614, 16);
  constexpr int kThreads = 8;
  auto mems = ConnectChannels(lockd, kThreads, "atomics");
  const uint64_t dup_before = DuplicateRequests();
  const auto until = std::chrono::steady_clock::now() + 10s;
  std::vector<std::vector<uint64_t>> fa_seen(kThreads);
  std::vector<uint64_t> cas_ok(kThreads, 0), cas_missed(kThreads, 0);
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      VerbsMemory& m = *mems[i];
      uint64_t expected = 0;
      Heartbeat hb;
      while (std::chrono::steady_clock::now() < until) {
        if (!hb.Keep(m)) {
          errors++;
          return;
        }
        RemoteOp ops[3] = {
            RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(1), 1),
            RemoteOp::CompareSwap(RegionId::kLocks, proto::SlotOffset(2), expected, expected + 1),
            RemoteOp::Read(RegionId::kLocks, proto::SlotOffset(3), 8)};
        if (!m.Execute(ops).ok()) {
          errors++;
          return;
        }
        fa_seen[i].push_back(ops[0].result[0]);
        if (ops[1].result[0] == expected) {
          ++cas_ok[i];
          ++expected;
        } else {
          ++cas_missed[i];
          expected = ops[1].result[0];
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(errors == 0);
  const uint64_t duplicates = DuplicateRequests() - dup_before;
  RemoteOp rd[2] = {RemoteOp::Read(RegionId::kLocks, proto::SlotOffset(1), 8),
                    RemoteOp::Read(RegionId::kLocks, proto::SlotOffset(2), 8)};
  REQUIRE(mems[0]->Execute(rd).ok());
  std::vector<uint64_t> all;
  uint64_t swapped = 0, missed = 0;
  for (int i = 0; i < kThreads; ++i) {
    all.insert(all.end(), fa_seen[i].begin(), fa_seen[i].end());
    swapped += cas_ok[i];
    missed += cas_missed[i];
  }
  std::sort(all.begin(), all.end());
  uint64_t repeated = 0, skipped = 0;
  for (size_t k = 1; k < all.size(); ++k) {
    if (all[k] == all[k - 1]) ++repeated;
    if (all[k] > all[k - 1] + 1) skipped += all[k] - all[k - 1] - 1;
  }
  WARN("atomics: " << all.size() << " FAs (word " << rd[0].result[0] << ", old values repeated "
                   << repeated << ", skipped " << skipped << "), CAS " << swapped << " swapped and "
                   << missed << " missed (word " << rd[1].result[0] << "); the NIC saw "
                   << duplicates << " duplicate requests meanwhile");
  CHECK(rd[0].result[0] == all.size());
  CHECK(repeated == 0);
  CHECK(skipped == 0);
  CHECK(rd[1].result[0] == swapped);
}

TEST_CASE("an RDMA READ of a word that other QPs' atomics change: whole or torn") {
  // The IB spec makes atomics atomic among themselves only; a READ of the word they change is a
  // DMA (on rdma_rxe, the kernel's memcpy, bytewise under TCG: `rep movsb`) that need not see
  // the 8 bytes at one instant. Writers add 2^32 + 1, so both halves move together; readers count
  // the READs whose halves disagree. The engine decides nothing on a READ alone that a torn one
  // could turn against it (engine_internal::AtomicWord0; docs/protocol.md §8, torn READs). One
  // 90 s run (RDMALOCK_DIAG_SECS=90) with the host busy: 277,813 READs, one torn, its halves
  // 126,945 and 126,689: 256 additions landed while the copy stood between bytes 1 and 5.
  // Asserted: the word ends at the additions made (atomics exactly-once); the torn READs are
  // counted, not asserted (a torn half can even exceed every value the word had: 0x00ff and
  // 0x0100 read low byte first give 0x01ff).
  Lockd lockd(7615, 16);
  constexpr int kWriters = 4, kReaders = 4;
  auto mems = ConnectChannels(lockd, kWriters + kReaders, "tear");
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::seconds(testing::EnvInt("RDMALOCK_DIAG_SECS", 10));
  std::atomic<uint64_t> reads{0}, torn{0}, adds{0};
  std::atomic<int> errors{0};
  std::mutex emu;
  std::vector<uint64_t> examples;
  std::vector<std::thread> ts;
  for (int i = 0; i < kWriters + kReaders; ++i) {
    ts.emplace_back([&, i] {
      VerbsMemory& m = *mems[i];
      Heartbeat hb;
      while (std::chrono::steady_clock::now() < until) {
        if (!hb.Keep(m)) {
          errors++;
          return;
        }
        if (i < kWriters) {
          RemoteOp fa =
              RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(1), (uint64_t{1} << 32) + 1);
          if (!m.Execute(fa).ok()) {
            errors++;
            return;
          }
          ++adds;
        } else {
          RemoteOp rd = RemoteOp::Read(RegionId::kLocks, proto::SlotOffset(1), 16);
          if (!m.Execute(rd).ok()) {
            errors++;
            return;
          }
          ++reads;
          const uint64_t v = rd.result[0];
          if ((v >> 32) != (v & 0xffffffffu)) {
            ++torn;
            std::lock_guard lk(emu);
            if (examples.size() < 8) examples.push_back(v);
          }
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(errors == 0);
  RemoteOp last = RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(1), 0);
  REQUIRE(mems[0]->Execute(last).ok());
  CHECK((last.result[0] >> 32) == adds.load());
  CHECK((last.result[0] & 0xffffffffu) == adds.load());
  std::string ex;
  for (uint64_t v : examples)
    ex.append(" ")
        .append(std::to_string(v >> 32))
        .append("|")
        .append(std::to_string(v & 0xffffffffu));
  WARN("READs " << reads.load() << ", torn " << torn.load() << " (" << ex << "), FAs "
                << adds.load());
  CHECK(reads.load() > 0);
}
