// Cohort handover inside one Client (client/src/cohort.h; issue 19, item 4) over the in-process
// backend and the test lockd: threads of one client that want an exclusive lock another of its
// threads holds queue in-process and get the grant handed over with no RDMA operation, FIFO,
// at most kMaxLocalHandovers in a row while another client waits; try-locks are busy; local
// waiters time out; a session's end reaches every local holder and wakes every local waiter; an
// expired grant is never handed over.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/src/client_test_peer.h"
#include "client/src/cohort.h"
#include "rdmalock/client.h"
#include "rdmalock/proto/lock_word.h"
#include "tests/support/fake_lockd.h"

using namespace rdmalock;
using namespace std::chrono_literals;
using testing::WaitFor;

namespace {

std::unique_ptr<Client> ConnectTo(const std::string& name, testing::FakeLockd& lockd,
                                  bool local_handover = true, bool auto_renew = true) {
  ClientOptions o = testing::FakeClientOptions(name);
  o.local_handover = local_handover;
  o.auto_renew = auto_renew;
  auto c = ClientTestPeer::Connect(o, lockd.connector());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(c).value();
}

// An exclusive request that may be handed over locally (no fencing token).
LockOptions Local(std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
  LockOptions lo;
  lo.fencing_token = false;
  lo.timeout = timeout;
  return lo;
}

// FETCH_AND_ADDs that acquired (a renewal is one on word1 too, and counted apart).
uint64_t AcquiringFas(const ClientStats& s) { return s.fetch_add - s.renewals - s.renew_failures; }

// Exclusive tickets issued on `slot` so far (word0's max_x).
uint16_t TicketsIssued(testing::FakeLockd& lockd, uint64_t slot) {
  return proto::Word0::Decode(lockd.table().Load(slot, 0)).max_x;
}

}  // namespace

TEST_CASE("cohort: many threads of one client and another client never hold one lock at once") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 4;
  testing::FakeLockd lockd(fo);
  auto a = ConnectTo("cohort-a", lockd);
  auto b = ConnectTo("cohort-b", lockd);
  constexpr int kThreadsA = 6, kThreadsB = 2, kOps = 150;
  uint64_t counter = 0;  // not atomic: only a holder touches it
  std::atomic<int> inside{0}, overlaps{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreadsA + kThreadsB; ++t) {
    Client& c = t < kThreadsA ? *a : *b;
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        // Some of client A's requests want a token (they go to lockd and queue behind the
        // cohort's grant); the rest may be handed over.
        LockOptions lo = Local();
        lo.fencing_token = t == 0 && i % 3 == 0;
        auto h = c.LockSlot(1, lo);
        if (!h.ok()) {
          ++errors;
          continue;
        }
        if (inside.fetch_add(1) != 0) ++overlaps;
        const uint64_t v = counter;
        std::this_thread::yield();
        counter = v + 1;
        inside.fetch_sub(1);
        if (!h->Release().ok()) ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  const ClientStats sa = a->Stats();
  CHECK(errors.load() == 0);
  CHECK(overlaps.load() == 0);
  CHECK(counter == uint64_t{kThreadsA + kThreadsB} * kOps);
  CHECK(sa.local_handovers > 0);  // the cohort was exercised
  CHECK(sa.acquires == uint64_t{kThreadsA} * kOps);
  CHECK(sa.releases == uint64_t{kThreadsA} * kOps);
  WARN("cohort: " << sa.local_handovers << " of " << sa.acquires
                  << " acquires handed over locally; client A made " << sa.fetch_add
                  << " FETCH_AND_ADDs, client B " << b->Stats().fetch_add);
}

TEST_CASE("cohort: local waiters are served in FIFO order, with no RDMA operation") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;  // no renewal (a FETCH_AND_ADD on word1) while the test counts atomics
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-fifo", lockd);
  auto holder = c->LockSlot(2, Local());
  REQUIRE(holder.ok());
  constexpr int kWaiters = 5;
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      auto h = c->LockSlot(2, Local());
      if (!h.ok()) {
        ++errors;
        return;
      }
      {
        std::lock_guard lk(mu);
        order.push_back(i);
      }
      if (!h->Release().ok()) ++errors;
    });
    // Queued in this order: the next one starts once this one waits.
    REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 2) == size_t(i + 1); }));
  }
  const ClientStats before = c->Stats();
  REQUIRE(holder->Release().ok());
  for (auto& t : threads) t.join();
  const ClientStats after = c->Stats();
  CHECK(errors.load() == 0);
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(after.local_handovers - before.local_handovers == kWaiters);
  // Handovers make no FETCH_AND_ADD (only the last release went to lockd: one CAS).
  CHECK(AcquiringFas(after) == AcquiringFas(before));
  CHECK(ClientTestPeer::LocalWaiters(*c, 2) == 0);
  // The lock is free again, for anyone.
  auto again = c->TryLockSlot(2);
  CHECK(again.ok());
}

TEST_CASE("cohort: another client's waiter is granted within kMaxLocalHandovers local handovers") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto a = ConnectTo("cohort-bound-a", lockd);
  auto b = ConnectTo("cohort-bound-b", lockd);
  auto holder = a->LockSlot(3, Local());
  REQUIRE(holder.ok());
  std::mutex mu;
  std::vector<std::string> order;
  auto note = [&](std::string who) {
    std::lock_guard lk(mu);
    order.push_back(std::move(who));
  };
  std::atomic<int> errors{0};
  // Client B's thread queues at lockd behind client A's grant.
  const uint16_t issued = TicketsIssued(lockd, 3);
  std::thread remote([&] {
    auto h = b->LockSlot(3, Local());
    if (!h.ok()) {
      ++errors;
      return;
    }
    note("B");
    if (!h->Release().ok()) ++errors;
  });
  REQUIRE(WaitFor([&] { return TicketsIssued(lockd, 3) != issued; }));
  // More local waiters than the bound, queued behind A's holder.
  constexpr int kLocal = static_cast<int>(sdk::kMaxLocalHandovers) + 4;
  std::vector<std::thread> threads;
  for (int i = 0; i < kLocal; ++i) {
    threads.emplace_back([&, i] {
      auto h = a->LockSlot(3, Local());
      if (!h.ok()) {
        ++errors;
        return;
      }
      // (Not "A" + std::to_string(i): GCC 12 at -O3 reports a -Wrestrict false positive in it.)
      note(std::string(1, 'A').append(std::to_string(i)));
      if (!h->Release().ok()) ++errors;
    });
    REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*a, 3) == size_t(i + 1); }));
  }
  REQUIRE(holder->Release().ok());
  remote.join();
  for (auto& t : threads) t.join();
  CHECK(errors.load() == 0);
  REQUIRE(order.size() == size_t(kLocal + 1));
  size_t before_b = 0;
  while (before_b < order.size() && order[before_b] != "B") ++before_b;
  INFO("grant order: " << [&] {
    std::string s;
    for (const auto& o : order) s += o + " ";
    return s;
  }());
  CHECK(before_b <= sdk::kMaxLocalHandovers);  // B waited out at most the bound's handovers
  CHECK(before_b >= 1);                        // and the cohort did hand over meanwhile
  CHECK(a->Stats().local_handovers >= before_b);
  // A's threads among themselves: FIFO.
  int last = -1;
  for (const auto& o : order) {
    if (o == "B") continue;
    const int i = std::stoi(o.substr(1));
    CHECK(i > last);
    last = i;
  }
}

// Local waiters spin a little before they park only while the entry says a thread of the
// client holds a grant lockd gave at once (CohortEntry::held_here): not behind a remote holder,
// not for a grant that waited behind another session, and not once the grant went back.
TEST_CASE("cohort: waiters spin only behind a grant lockd gave at once and this client holds") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto a = ConnectTo("cohort-spin-a", lockd);
  auto b = ConnectTo("cohort-spin-b", lockd);
  // Taken at once: held here.
  auto held = a->LockSlot(4, Local());
  REQUIRE(held.ok());
  CHECK(ClientTestPeer::HeldHere(*a, 4));
  // Handed over to a local waiter: still held here.
  std::atomic<bool> got{false};
  std::atomic<bool> let_go{false};
  std::thread waiter([&] {
    auto h = a->LockSlot(4, Local());
    got = h.ok();
    while (!let_go) std::this_thread::sleep_for(1ms);
    if (h.ok()) (void)h->Release();
  });
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*a, 4) == 1; }));
  REQUIRE(held->Release().ok());
  REQUIRE(WaitFor([&] { return got.load(); }));
  CHECK(ClientTestPeer::HeldHere(*a, 4));
  // Back to lockd: not held here.
  let_go = true;
  waiter.join();
  CHECK_FALSE(ClientTestPeer::HeldHere(*a, 4));
  // A grant that waited at lockd behind another client's: not held here, so A's local waiters
  // park at once (the CPU is the other sessions' too).
  auto other = b->LockSlot(4, Local());
  REQUIRE(other.ok());
  const uint16_t issued = TicketsIssued(lockd, 4);
  Result<LockHandle> late = Error(ErrorCode::kInternal, "not run");
  std::thread behind([&] { late = a->LockSlot(4, Local()); });
  REQUIRE(WaitFor([&] { return TicketsIssued(lockd, 4) != issued; }));
  CHECK_FALSE(ClientTestPeer::HeldHere(*a, 4));  // A's owner is queued at lockd
  REQUIRE(other->Release().ok());
  behind.join();
  REQUIRE(late.ok());
  CHECK_FALSE(ClientTestPeer::HeldHere(*a, 4));
  REQUIRE(late->Release().ok());
  CHECK(ClientTestPeer::LocalWaiters(*a, 4) == 0);
}

TEST_CASE("cohort: a try-lock is busy at once while another thread of the client holds it") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto c = ConnectTo("cohort-try", lockd);
  auto holder = c->LockSlot(4, Local());
  REQUIRE(holder.ok());
  std::atomic<int> busy{0}, other{0};
  uint64_t fa_before = 0, fa_after = 0;
  std::thread t([&] {
    // This thread's channel first (joining makes no atomic), then count.
    (void)c->Flush();
    fa_before = c->Stats().fetch_add;
    auto plain = c->TryLockSlot(4);  // wants a token (the default)
    (plain.status().code() == ErrorCode::kBusy ? busy : other)++;
    auto local = c->LockSlot(4, Local(0ms));  // may be handed over
    (local.status().code() == ErrorCode::kBusy ? busy : other)++;
    fa_after = c->Stats().fetch_add;
  });
  t.join();
  CHECK(busy.load() == 2);
  CHECK(other.load() == 0);
  CHECK(fa_after == fa_before);  // told busy without asking lockd
  REQUIRE(holder->Release().ok());
  auto free = c->TryLockSlot(4);
  CHECK(free.ok());
}

// Found by review (2026-12-06): LockSlot went into the cohort before anything checked the slot,
// and the cohort's key drops a slot's top bit: a request for slot 5 + 2^63 shared slot 5's entry
// (a try-lock said busy, and a waiting one was handed slot 5's grant: it returned a handle of
// another lock). A slot out of range is an error, before the cohort.
TEST_CASE("cohort: a slot out of range is refused, not queued on another slot's entry") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto c = ConnectTo("cohort-range", lockd);
  auto holder = c->LockSlot(5, Local());
  REQUIRE(holder.ok());
  for (const uint64_t slot : {uint64_t{5} + (uint64_t{1} << 63), ~uint64_t{0}}) {
    INFO("slot " << slot);
    auto other = c->TryLockSlot(slot);
    const std::string other_is = other.ok() ? std::string("granted") : other.status().ToString();
    INFO(other_is);
    CHECK(other.status().code() == ErrorCode::kInvalidArgument);
    auto waited = c->LockSlot(slot, Local(50ms));
    const std::string waited_is =
        waited.ok() ? "granted slot " + std::to_string(waited->slot()) : waited.status().ToString();
    INFO(waited_is);
    CHECK(waited.status().code() == ErrorCode::kInvalidArgument);
  }
  REQUIRE(holder->Release().ok());
}

TEST_CASE("cohort: a local waiter's timeout takes it out of the queue") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto c = ConnectTo("cohort-timeout", lockd);
  auto holder = c->LockSlot(5, Local());
  REQUIRE(holder.ok());
  std::atomic<int> first_ok{0};
  Status timed_out;
  // A patient waiter first, then one that gives up.
  std::thread patient([&] {
    auto h = c->LockSlot(5, Local());
    if (h.ok() && h->Release().ok()) ++first_ok;
  });
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 5) == 1; }));
  std::thread impatient([&] {
    auto h = c->LockSlot(5, Local(30ms));
    timed_out = h.status();
  });
  impatient.join();
  CHECK(timed_out.code() == ErrorCode::kTimeout);
  CHECK(ClientTestPeer::LocalWaiters(*c, 5) == 1);  // the patient one is still queued
  CHECK(c->Stats().timeouts >= 1);
  REQUIRE(holder->Release().ok());
  patient.join();
  CHECK(first_ok.load() == 1);
  CHECK(ClientTestPeer::LocalWaiters(*c, 5) == 0);
  auto free = c->TryLockSlot(5);
  CHECK(free.ok());
}

TEST_CASE("cohort: a session's end reaches every local holder once and wakes every local waiter") {
  testing::FakeLockd::Options fo;
  fo.lease = 200ms;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-fence", lockd);
  const uint64_t first = c->session_id();
  auto holder = c->LockSlot(6, Local());
  REQUIRE(holder.ok());
  // One thread gets the grant handed over and holds it; three more queue behind it.
  std::atomic<int> holder_lost{0}, handed_lost{0}, handed{0}, done{0}, bad{0};
  holder->OnLost([&](const Status&) { ++holder_lost; });
  std::atomic<bool> release_handed{false};
  std::thread second([&] {
    auto h = c->LockSlot(6, Local());
    if (!h.ok()) {
      ++bad;
      ++done;
      return;
    }
    h->OnLost([&](const Status&) { ++handed_lost; });
    ++handed;
    while (!release_handed.load()) std::this_thread::sleep_for(1ms);
    (void)h->Release();  // lost by now: kLockLost or kConnection
    ++done;
  });
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 6) == 1; }));
  REQUIRE(holder->Release().ok());  // handed over to `second`
  REQUIRE(WaitFor([&] { return handed.load() == 1; }));
  std::vector<std::thread> waiters;
  std::atomic<int> waiter_ok{0}, waiter_err{0};
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      auto h = c->LockSlot(6, Local(5s));
      if (h.ok()) {
        ++waiter_ok;  // granted on the new session (a blocking Lock waits for it)
        (void)h->Release();
      } else if (h.status().code() == ErrorCode::kConnection ||
                 h.status().code() == ErrorCode::kLockLost) {
        ++waiter_err;
      } else {
        ++bad;
      }
      ++done;
    });
    REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 6) == size_t(i + 1); }));
  }
  REQUIRE(WaitFor([&] { return lockd.Heartbeat(first) != 0; }));
  lockd.Fence(first);
  REQUIRE(WaitFor([&] { return handed_lost.load() == 1; }));
  release_handed.store(true);
  // Every waiter finishes (no hang), each with a grant of the new session or a session error.
  for (auto& t : waiters) t.join();
  second.join();
  std::this_thread::sleep_for(50ms);  // a second report would have come by now
  CHECK(done.load() == 4);
  CHECK(bad.load() == 0);
  CHECK(waiter_ok.load() + waiter_err.load() == 3);
  CHECK(holder_lost.load() == 0);  // it had handed the grant over before the fence
  CHECK(handed_lost.load() == 1);
  CHECK(ClientTestPeer::LocalWaiters(*c, 6) == 0);
}

TEST_CASE("cohort: a grant whose lease ran out during a local hold is never handed over") {
  testing::FakeLockd::Options fo;
  fo.lease = 60ms;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-lease", lockd);
  LockOptions lo = Local();
  lo.auto_renew = false;  // nothing keeps this one's lease: it runs out while held
  auto holder = c->LockSlot(7, lo);
  REQUIRE(holder.ok());
  Status waited;
  std::atomic<bool> waiter_held{false};
  std::thread waiter([&] {
    auto h = c->LockSlot(7, Local(5s));
    waited = h.status();
    if (h.ok()) {
      waiter_held = h->state() == LockState::kHeld;
      (void)h->Release();
    }
  });
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 7) == 1; }));
  REQUIRE(WaitFor([&] { return holder->state() == LockState::kLost; }));
  const Status released = holder->Release();
  waiter.join();
  CHECK(released.code() == ErrorCode::kLockLost);
  CHECK(c->Stats().local_handovers == 0);
  // The waiter went to lockd and was granted there (after the expired grant's stall recovery).
  CHECK(waited.ok());
  CHECK(waiter_held.load());
}

// A holder that kept its grant for most of the lease (auto_renew off) handed it over with the
// few milliseconds left, and the new holder lost it at once (kLost and OnLost), where lockd would
// have given it a whole lease (found by review, 2026-12-06). A grant with less than a quarter of
// its lease left now goes back to lockd; the waiter acquires it there.
TEST_CASE("cohort: a grant with less than a quarter of its lease left is not handed over") {
  testing::FakeLockd::Options fo;
  fo.lease = 1000ms;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-late", lockd);
  LockOptions lo = Local();
  lo.auto_renew = false;
  auto holder = c->LockSlot(7, lo);
  REQUIRE(holder.ok());
  const auto granted = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration left{};
  Status waited;
  std::thread waiter([&] {
    LockOptions wo = Local(10s);
    wo.auto_renew = false;
    auto h = c->LockSlot(7, wo);
    waited = h.status();
    if (h.ok()) {
      left = h->lease_expiry() - std::chrono::steady_clock::now();
      (void)h->Release();
    }
  });
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 7) == 1; }));
  // 200 ms of the 1 s lease left (under a quarter), with 200 ms to spare for a slow machine.
  std::this_thread::sleep_until(granted + 800ms);
  REQUIRE(holder->Release().ok());
  waiter.join();
  REQUIRE(waited.ok());
  INFO("the waiter's lease had "
       << std::chrono::duration_cast<std::chrono::milliseconds>(left).count()
       << " ms left when it was granted; local handovers: " << c->Stats().local_handovers);
  CHECK(left > 500ms);
  CHECK(c->Stats().local_handovers == 0);
}

TEST_CASE("cohort: with local_handover off, threads of one client queue at lockd") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto c = ConnectTo("cohort-off", lockd, /*local_handover=*/false);
  auto holder = c->LockSlot(8, Local());
  REQUIRE(holder.ok());
  const uint16_t issued = TicketsIssued(lockd, 8);
  std::atomic<int> ok{0};
  std::thread t([&] {
    auto h = c->LockSlot(8, Local());
    if (h.ok() && h->Release().ok()) ++ok;
  });
  REQUIRE(WaitFor([&] { return TicketsIssued(lockd, 8) != issued; }));  // its own ticket
  CHECK(ClientTestPeer::LocalWaiters(*c, 8) == 0);
  REQUIRE(holder->Release().ok());
  t.join();
  CHECK(ok.load() == 1);
  CHECK(c->Stats().local_handovers == 0);
}

TEST_CASE(
    "cohort: requests with a fencing token are handed over, each token larger than the last") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;  // no renewal while the test counts atomics
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-token", lockd);
  auto other = ConnectTo("cohort-token-other", lockd);
  LockOptions tok;  // the defaults: exclusive, with a fencing token
  auto holder = c->LockSlot(3, tok);
  REQUIRE(holder.ok());
  const uint64_t first = holder->fencing_token();
  REQUIRE(first != 0);
  constexpr int kWaiters = 5;
  std::mutex mu;
  std::vector<uint64_t> tokens;  // in the order the grants were held
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&] {
      auto h = c->LockSlot(3, tok);
      if (!h.ok()) {
        ++errors;
        return;
      }
      {
        std::lock_guard lk(mu);
        tokens.push_back(h->fencing_token());
      }
      if (!h->Release().ok()) ++errors;
    });
    // Queued locally behind the holder (else it waits at lockd: release, join, and fail).
    if (!WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 3) == size_t(i + 1); })) {
      FAIL_CHECK("waiter " << i << " did not queue in the cohort");
      break;
    }
  }
  const ClientStats before = c->Stats();
  REQUIRE(holder->Release().ok());
  for (auto& t : threads) t.join();
  const ClientStats after = c->Stats();
  CHECK(errors.load() == 0);
  CHECK(after.local_handovers - before.local_handovers == kWaiters);
  CHECK(AcquiringFas(after) == AcquiringFas(before));
  REQUIRE(tokens.size() == size_t{kWaiters});
  uint64_t last = first;
  for (uint64_t t : tokens) {
    INFO("token " << t << " after " << last);
    CHECK(t > last);
    last = t;
  }
  // The next holder, of another session, from lockd: larger still.
  auto next = other->LockSlot(3, tok);
  REQUIRE(next.ok());
  CHECK(next->fencing_token() > last);
}

TEST_CASE("cohort: a grant without a token is not handed to a request that wants one") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-token-mixed", lockd);
  auto holder = c->LockSlot(4, Local());
  REQUIRE(holder.ok());
  CHECK(holder->fencing_token() == 0);
  uint64_t token = 0;
  bool ok = false;
  std::thread waiter([&] {
    auto h = c->LockSlot(4, LockOptions{});
    ok = h.ok();
    if (ok) {
      token = h->fencing_token();
      ok = h->Release().ok();
    }
  });
  CHECK(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 4) == 1; }));
  const ClientStats before = c->Stats();
  const uint16_t issued = TicketsIssued(lockd, 4);
  REQUIRE(holder->Release().ok());
  waiter.join();
  const ClientStats after = c->Stats();
  CHECK(ok);
  CHECK(token != 0);  // it asked for one, so it queued at lockd for a grant that has one
  CHECK(after.local_handovers == before.local_handovers);
  CHECK(TicketsIssued(lockd, 4) == issued + 1);
}

// ---- Async requests (Client::LockSlotAsync) through the cohort: the pump does not issue an
// exclusive request whose slot another of the client's requests holds or acquires; it waits in
// the cohort on a waiter thread and is handed the grant in-process.

namespace {

// Collects async results; each handle is released in its callback unless `keep`.
struct AsyncResults {
  std::mutex mu;
  std::vector<Status> statuses;  // in completion order
  std::vector<LockHandle> kept;
  std::atomic<int> done{0};
  bool keep = false;
  Client::LockCallback Callback() {
    return [this](Result<LockHandle> h) {
      std::lock_guard lk(mu);
      if (!h.ok()) {
        statuses.push_back(h.status());
      } else if (keep) {
        statuses.push_back(Status::Ok());
        kept.push_back(std::move(h).value());
      } else {
        statuses.push_back(h->Release());
      }
      ++done;
    };
  }
};

}  // namespace

TEST_CASE("cohort: async requests on a lock the client holds are handed over, no RDMA operation") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;  // no renewal (a FETCH_AND_ADD on word1) while the test counts atomics
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-async", lockd);
  auto holder = c->LockSlot(9, Local());
  REQUIRE(holder.ok());
  const ClientStats before = c->Stats();
  AsyncResults r;
  r.keep = true;  // each grant is kept until the test releases it to the next request
  // More than the waiter threads that may wait in the cohort (3 of the 4: one is kept for an
  // owner's wait): the rest wait in their queue until a thread is free.
  constexpr size_t kRequests = 6, kWaiterThreads = 3;
  for (size_t i = 0; i < kRequests; ++i) {
    REQUIRE(c->LockSlotAsync(9, Local(), r.Callback()).ok());
  }
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 9) == kWaiterThreads; }));
  CHECK(r.done.load() == 0);
  REQUIRE(holder->Release().ok());  // handed over to the first
  for (size_t k = 0; k < kRequests; ++k) {
    // The k-th grant was handed over, and every request left waits in the cohort (as many as
    // there are waiter threads), so that its release hands over too.
    const size_t left = std::min(kRequests - k - 1, kWaiterThreads);
    REQUIRE(WaitFor([&] {
      return r.done.load() == int(k + 1) && ClientTestPeer::LocalWaiters(*c, 9) == left;
    }));
    LockHandle h;
    {
      std::lock_guard lk(r.mu);
      REQUIRE(r.statuses.at(k).ok());
      h = std::move(r.kept.at(k));
    }
    REQUIRE(h.Release().ok());
  }
  const ClientStats after = c->Stats();
  CHECK(after.local_handovers - before.local_handovers == kRequests);
  CHECK(after.acquires - before.acquires == kRequests);
  // No FETCH_AND_ADD: every grant came from the holder's (only the last release went to lockd).
  CHECK(AcquiringFas(after) == AcquiringFas(before));
  CHECK(ClientTestPeer::LocalWaiters(*c, 9) == 0);
  // Every request's budget unit came back (a handed-over grant brings its own).
  REQUIRE(WaitFor([&] { return ClientTestPeer::BudgetUnits(*c, 9) == 0; }));
  auto again = c->TryLockSlot(9);
  CHECK(again.ok());
}

TEST_CASE("cohort: an async request that owns the lock hands it to a blocking one, and back") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-async-owner", lockd);
  AsyncResults first;
  first.keep = true;
  REQUIRE(c->LockSlotAsync(10, Local(), first.Callback()).ok());
  REQUIRE(WaitFor([&] { return first.done.load() == 1; }));
  REQUIRE(first.kept.size() == 1);
  const ClientStats before = c->Stats();
  std::atomic<int> blocking_ok{0};
  AsyncResults next;  // queued behind the blocking thread
  std::thread t([&] {
    auto h = c->LockSlot(10, Local());
    if (h.ok()) {
      ++blocking_ok;
      // (No REQUIRE off the test's thread: Catch2's assertions are not thread-safe.)
      (void)WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 10) == 1; });
      (void)h->Release();  // to the async request queued behind it
    }
  });
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 10) == 1; }));
  REQUIRE(c->LockSlotAsync(10, Local(), next.Callback()).ok());
  REQUIRE(first.kept[0].Release().ok());  // to the blocking thread
  t.join();
  REQUIRE(WaitFor([&] { return next.done.load() == 1; }));
  const ClientStats after = c->Stats();
  CHECK(blocking_ok.load() == 1);
  CHECK(next.statuses.at(0).ok());
  CHECK(after.local_handovers - before.local_handovers == 2);
  CHECK(AcquiringFas(after) == AcquiringFas(before));
  REQUIRE(WaitFor([&] { return ClientTestPeer::BudgetUnits(*c, 10) == 0; }));
}

TEST_CASE("cohort: an async try-lock is busy at once, and an async wait times out, in the cohort") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto c = ConnectTo("cohort-async-try", lockd);
  auto holder = c->LockSlot(11, Local());
  REQUIRE(holder.ok());
  const uint64_t fa_before = c->Stats().fetch_add;
  AsyncResults tried, timed;
  REQUIRE(c->LockSlotAsync(11, Local(0ms), tried.Callback()).ok());
  REQUIRE(c->LockSlotAsync(11, Local(40ms), timed.Callback()).ok());
  REQUIRE(WaitFor([&] { return tried.done.load() == 1 && timed.done.load() == 1; }));
  CHECK(tried.statuses.at(0).code() == ErrorCode::kBusy);
  CHECK(timed.statuses.at(0).code() == ErrorCode::kTimeout);
  CHECK(c->Stats().fetch_add == fa_before);  // neither asked lockd
  CHECK(ClientTestPeer::LocalWaiters(*c, 11) == 0);
  CHECK(ClientTestPeer::BudgetUnits(*c, 11) == 1);  // the holder's only
  REQUIRE(holder->Release().ok());
  auto free = c->TryLockSlot(11);
  CHECK(free.ok());
}

TEST_CASE("cohort: closing a client ends its async requests waiting in the cohort") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto c = ConnectTo("cohort-async-close", lockd);
  auto holder = c->LockSlot(12, Local());  // outlives the client: nothing releases it in time
  REQUIRE(holder.ok());
  AsyncResults r;
  for (int i = 0; i < 3; ++i) REQUIRE(c->LockSlotAsync(12, Local(), r.Callback()).ok());
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 12) == 3; }));
  c.reset();  // must not wait for the holder
  CHECK(r.done.load() == 3);
  std::lock_guard lk(r.mu);
  for (const Status& st : r.statuses) CHECK(st.code() == ErrorCode::kConnection);
}

namespace {
// Exclusive grants of slots [first, last] to `c`, kept by the caller.
std::vector<LockHandle> HoldSlots(Client& c, uint64_t first, uint64_t last) {
  std::vector<LockHandle> held;
  for (uint64_t slot = first; slot <= last; ++slot) {
    auto h = c.LockSlot(slot);
    REQUIRE(h.ok());
    held.push_back(std::move(h).value());
  }
  return held;
}
}  // namespace

// The client has kAsyncWaiters (4) waiter threads, and each finishes one request's wait at a
// time. With all four waiting (for locks another client holds, without a timeout) a request
// queued behind them was not timed out: its callback came only when a thread was free, and its
// ticket, granted at its turn with no thread watching, held the lock from everyone until their
// stall recovery (found by review, 2026-12-07).
TEST_CASE("cohort: an async wait times out while every waiter thread is busy") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;
  fo.lock_count = 64;
  testing::FakeLockd lockd(fo);
  auto a = ConnectTo("async-busy-a", lockd);
  auto b = ConnectTo("async-busy-b", lockd);
  std::vector<LockHandle> held = HoldSlots(*b, 20, 24);
  AsyncResults busy, timed;
  for (uint64_t slot = 20; slot <= 23; ++slot) {  // the four waiter threads, for ever
    REQUIRE(a->LockSlotAsync(slot, Local(), busy.Callback()).ok());
  }
  std::this_thread::sleep_for(100ms);  // the pump has handed them to the waiter threads
  const auto submitted = std::chrono::steady_clock::now();
  REQUIRE(a->LockSlotAsync(24, Local(50ms), timed.Callback()).ok());
  const bool told = WaitFor([&] { return timed.done.load() == 1; }, 3s);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - submitted);
  INFO("told: " << told << " after " << took.count() << " ms");
  CHECK(told);
  if (told) {
    std::lock_guard lk(timed.mu);
    CHECK(timed.statuses.at(0).code() == ErrorCode::kTimeout);
  }
  // Its ticket was queued at lockd behind b's grant: at b's release it goes to nobody's use and
  // is released, so a third client gets the lock at once.
  auto c = ConnectTo("async-busy-c", lockd);
  REQUIRE(held.back().Release().ok());
  auto next = c->LockSlot(24, LockOptions{.timeout = 1s});
  INFO("a third client's lock: " << next.status().ToString());
  CHECK(next.ok());
  CHECK(busy.done.load() == 0);
  a.reset();  // ends the four waits (kConnection) while `busy` is still there to be told
}

// A waiter thread took a request that waits in the cohort for its slot's owner, which was still
// in the waiter threads' queue behind it: with every thread so taken, the owner's wait was never
// finished, and neither was any of theirs (found by review, 2026-12-07). At most 3 of the 4
// waiter threads now wait in the cohort at once.
TEST_CASE("cohort: async requests waiting in the cohort leave a waiter thread to their owner") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;
  fo.lock_count = 64;
  testing::FakeLockd lockd(fo);
  auto a = ConnectTo("async-owner-a", lockd);
  auto b = ConnectTo("async-owner-b", lockd);
  const std::vector<LockHandle> held = HoldSlots(*b, 30, 33);
  auto h1 = a->LockSlot(40, Local());  // a's own holder: the cohort entry of slot 40
  REQUIRE(h1.ok());
  AsyncResults busy, queued, owner;
  for (uint64_t slot = 30; slot <= 33; ++slot) {  // the four waiter threads, for a second
    REQUIRE(a->LockSlotAsync(slot, Local(1000ms), busy.Callback()).ok());
  }
  std::this_thread::sleep_for(100ms);
  for (int i = 0; i < 4; ++i) {  // queued in the cohort behind h1, in the waiters' queue
    REQUIRE(a->LockSlotAsync(40, Local(), queued.Callback()).ok());
  }
  std::this_thread::sleep_for(50ms);
  REQUIRE(h1->Release().ok());  // nobody waits in the cohort yet: the entry is free
  auto b40 = b->LockSlot(40);
  REQUIRE(b40.ok());
  REQUIRE(a->LockSlotAsync(40, Local(), owner.Callback()).ok());  // owns the entry, queued at lockd
  REQUIRE(WaitFor([&] { return busy.done.load() == 4; }, 3s));    // the threads are free
  std::this_thread::sleep_for(100ms);
  REQUIRE(b40->Release().ok());
  const bool all = WaitFor([&] { return owner.done.load() == 1 && queued.done.load() == 4; }, 5s);
  INFO("owner done " << owner.done.load() << ", queued done " << queued.done.load());
  CHECK(all);
  a.reset();  // before the results its callbacks write
}

// The same, when the owner took the entry after the waiter threads had taken their waits in the
// cohort: they were joining the session (slow here), the holder released meanwhile with nobody
// queued in the cohort yet, and a new request took the free entry and queued at lockd. All four
// threads then waited behind it in the cohort, and it never got one (found by the review of
// this fix, 2026-12-07). One waiter thread is always left out of the cohort now.
TEST_CASE(
    "cohort: an owner that comes after every waiter thread took a wait in the cohort "
    "still gets one") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;
  testing::FakeLockd lockd(fo);
  std::atomic<bool> slow_joins{false};
  Connector inner = lockd.connector();
  Connector slow = [&slow_joins, inner](const ChannelParams& p, uint32_t* retry_ms,
                                        proto::RejectReason* reason) {
    if ((p.flags & proto::kFlagJoin) != 0 && slow_joins.load()) std::this_thread::sleep_for(400ms);
    return inner(p, retry_ms, reason);
  };
  auto ac = ClientTestPeer::Connect(testing::FakeClientOptions("async-late-owner-a"), slow);
  REQUIRE(ac.ok());
  std::unique_ptr<Client> a = std::move(ac).value();
  auto b = ConnectTo("async-late-owner-b", lockd);
  AsyncResults warm, queued, owner;
  REQUIRE(a->LockSlotAsync(1, Local(), warm.Callback()).ok());  // the pump's own channel
  REQUIRE(WaitFor([&] { return warm.done.load() == 1; }));
  auto h1 = a->LockSlot(7, Local());
  REQUIRE(h1.ok());
  slow_joins = true;  // the waiter threads' first joins take 400 ms
  for (int i = 0; i < 4; ++i) REQUIRE(a->LockSlotAsync(7, Local(), queued.Callback()).ok());
  std::this_thread::sleep_for(100ms);  // the waiter threads took them and are joining
  REQUIRE(h1->Release().ok());         // nobody waits in the cohort yet: the entry is free
  auto b7 = b->LockSlot(7);
  REQUIRE(b7.ok());
  REQUIRE(a->LockSlotAsync(7, Local(), owner.Callback()).ok());  // owns the entry, queued at lockd
  std::this_thread::sleep_for(600ms);  // the joins are done: the cohort's waits are behind it
  REQUIRE(b7->Release().ok());
  const bool all = WaitFor([&] { return owner.done.load() == 1 && queued.done.load() == 4; }, 5s);
  INFO("owner done " << owner.done.load() << ", queued done " << queued.done.load());
  CHECK(all);
  a.reset();  // before the results its callbacks write
}

// ---- Sets (Client::LockManySlots): a set waits only at lockd, but its exclusive grants take
// their cohort entries once granted, so that the client's other threads queue in-process behind
// them and are handed the grant at its release (LockHandle::Release or Client::ReleaseMany).

TEST_CASE("sets: ReleaseMany of 12 exclusive locks with the defaults releases every one") {
  // With the defaults (records, fencing tokens) each exclusive entry is tagged, so each release is
  // the CAS alone and one doorbell takes up to 15 of them. Until stop 32 the engine's per-doorbell
  // bookkeeping had room for 8 (AddressSanitizer: stack-buffer-overflow in ReleaseMany).
  testing::FakeLockd::Options fo;
  fo.lease = 5s;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("set-of-12", lockd);
  std::vector<SlotRequest> set;
  for (uint64_t s = 0; s < 12; ++s) set.push_back({s, LockMode::kExclusive});
  for (int round = 0; round < 2; ++round) {  // the second round's entries tagged from the table
    INFO("round " << round);
    auto held = c->LockManySlots(set);
    REQUIRE(held.ok());
    REQUIRE(held->size() == 12);
    const ClientStats before = c->Stats();
    REQUIRE(c->ReleaseMany(*held).ok());
    REQUIRE(c->Flush().ok());
    CHECK(c->Stats().releases - before.releases == 12);
    // One CAS each. (Done marks are not counted here: the keeper's heartbeat
    // WRITEs count in the same figure.)
    CHECK(c->Stats().compare_swap - before.compare_swap == 12);
    for (const LockHandle& h : *held) CHECK(h.state() == LockState::kReleased);
    for (uint64_t s = 0; s < 12; ++s) {
      CHECK(proto::Word0::Decode(lockd.table().Load(s, 0)).Drained());
    }
  }
}

TEST_CASE("cohort: a set's exclusive grants are handed to local waiters at their release") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;  // no renewal while the test counts atomics
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("cohort-set", lockd);
  const std::vector<SlotRequest> set = {
      {13, LockMode::kExclusive}, {14, LockMode::kExclusive}, {15, LockMode::kShared}};
  LockOptions lo = Local();
  auto held = c->LockManySlots(set, lo);
  REQUIRE(held.ok());
  REQUIRE(held->size() == 3);
  const ClientStats before = c->Stats();
  std::atomic<int> ok{0};
  std::vector<std::thread> waiters;
  for (uint64_t slot : {13, 14}) {
    waiters.emplace_back([&, slot] {
      auto h = c->LockSlot(slot, Local());
      if (h.ok() && h->Release().ok()) ++ok;
    });
    REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, slot) == 1; }));
  }
  SECTION("released one by one") {
    for (LockHandle& h : *held) REQUIRE(h.Release().ok());
  }
  SECTION("released together") { REQUIRE(c->ReleaseMany(*held).ok()); }
  for (auto& t : waiters) t.join();
  const ClientStats after = c->Stats();
  CHECK(ok.load() == 2);
  CHECK(after.local_handovers - before.local_handovers == 2);
  // The waiters made no FETCH_AND_ADD: both grants came from the set's.
  CHECK(AcquiringFas(after) == AcquiringFas(before));
  for (uint64_t slot : {13, 14, 15}) {
    CHECK(ClientTestPeer::LocalWaiters(*c, slot) == 0);
    CHECK(ClientTestPeer::BudgetUnits(*c, slot) == 0);
    auto free = c->TryLockSlot(slot);
    CHECK(free.ok());
  }
}

TEST_CASE("cohort: a set whose lock another thread of the client holds waits at lockd for it") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto c = ConnectTo("cohort-set-wait", lockd);
  auto holder = c->LockSlot(2, Local());
  REQUIRE(holder.ok());
  const std::vector<SlotRequest> set = {{2, LockMode::kExclusive}, {3, LockMode::kExclusive}};
  // Busy at once for a try (the holder's grant is at lockd), and granted once it is released.
  auto tried = c->LockManySlots(set, Local(0ms));
  CHECK(tried.status().code() == ErrorCode::kBusy);
  Status got;
  std::thread t([&] {
    auto h = c->LockManySlots(set, Local(5s));
    got = h.ok() ? c->ReleaseMany(*h) : h.status();
  });
  std::this_thread::sleep_for(50ms);  // the set queues at lockd meanwhile
  REQUIRE(holder->Release().ok());
  t.join();
  CHECK(got.ok());
  CHECK(ClientTestPeer::BudgetUnits(*c, 2) == 0);
  CHECK(ClientTestPeer::BudgetUnits(*c, 3) == 0);
}

namespace {

// Whether `w` is parked on its bell, read under the entry's mutex.
bool Parked(sdk::CohortEntry& e, const sdk::CohortWaiter& w) NO_THREAD_SAFETY_ANALYSIS {
  MutexLock lk(&e.mu);
  return w.parked;
}

}  // namespace

// A waiter is chosen (served) under the entry's mutex and woken after the chooser unlocks it
// (CohortWaiter::bell): a parked waiter stays parked until that wake-up, and the wake-up touches
// none of the waiter's memory, so it may come after the waiter saw its outcome by itself (its
// deadline passed) and its frame ended. AddressSanitizer checks the second half: the waiter is
// freed before the late wake-up.
TEST_CASE("cohort: a chosen waiter is woken after the mutex, and a late wake-up touches nothing") {
  sdk::CohortTable table(3);
  constexpr uint64_t kSlot = 7;
  REQUIRE(table.TryOwn(kSlot) == sdk::CohortTable::Join::kOwner);
  sdk::CohortEntry& e = table.Entry(kSlot);
  for (const bool patient : {true, false}) {
    CAPTURE(patient);
    auto w = std::make_unique<sdk::CohortWaiter>();
    std::atomic<bool> returned{false};
    bool served = false;
    sdk::CohortTable::Join joined = sdk::CohortTable::Join::kBypass;
    // Nothing is held here (held_here unset): the waiter parks at once.
    const auto deadline = patient ? std::chrono::steady_clock::time_point::max()
                                  : std::chrono::steady_clock::now() + 30ms;
    std::thread t([&] {
      joined = table.Wait(kSlot, w.get(), deadline, nullptr, &served);
      returned = true;
    });
    REQUIRE(WaitFor([&] { return Parked(e, *w); }));
    const Bell* waker = nullptr;
    {
      MutexLock lk(&e.mu);
      REQUIRE(sdk::CohortTable::Pop(e, kSlot) == w.get());
      waker = w->Serve(sdk::CohortWaiter::Outcome::kRemote);
    }
    REQUIRE(waker == &w->bell);  // parked: it needs the wake-up
    if (patient) {
      std::this_thread::sleep_for(100ms);
      CHECK_FALSE(returned.load());  // served, but parked until woken
      Bell::Wake(waker);
      t.join();
    } else {
      t.join();  // its deadline passed: it saw the outcome by itself and returned
      w.reset();
      Bell::Wake(waker);  // late, on freed memory: a no-op
    }
    CHECK(returned.load());
    CHECK(joined == sdk::CohortTable::Join::kQueued);
    CHECK(served);
  }
}

// How many waiters spin follows the CPUs the process may use, at least kMinSpinPlaces; once
// more than that wait, a handover wakes the head (the only one that then spins), else the
// spin_places()-th.
TEST_CASE("cohort: spin places follow the CPUs, and a long queue wakes only its head") {
  CHECK(sdk::CohortTable::SpinPlaces(1) == 3);
  CHECK(sdk::CohortTable::SpinPlaces(2) == 3);
  CHECK(sdk::CohortTable::SpinPlaces(4) == 3);
  CHECK(sdk::CohortTable::SpinPlaces(16) == 15);
  CHECK(sdk::CohortTable::SpinPlaces(4096) == sdk::CohortTable::kMaxSpinPlaces);
  CHECK(sdk::CohortTable::UsableCpus() >= 1);
  CHECK(sdk::CohortTable(0).spin_places() == 1);

  for (const uint32_t places : {1u, 3u}) {
    CAPTURE(places);
    sdk::CohortTable table(places);
    constexpr uint64_t kSlot = 9;
    REQUIRE(table.TryOwn(kSlot) == sdk::CohortTable::Join::kOwner);
    table.MarkHeld(kSlot);  // the owner holds a grant lockd gave at once: waiters may spin
    sdk::CohortEntry& e = table.Entry(kSlot);
    constexpr int kWaiters = 5;
    std::vector<sdk::CohortWaiter> ws(kWaiters);
    std::vector<std::thread> ts;
    for (int i = 0; i < kWaiters; ++i) {
      // One at a time, so that waiter i is the (i + 1)-th in the queue.
      ts.emplace_back([&, i] {
        bool served = false;
        (void)table.Wait(kSlot, &ws[static_cast<size_t>(i)],
                         std::chrono::steady_clock::time_point::max(), nullptr, &served);
      });
      REQUIRE(WaitFor([&] { return Parked(e, ws[static_cast<size_t>(i)]); }));
    }
    std::vector<const Bell*> wake;
    {
      MutexLock lk(&e.mu);
      REQUIRE(sdk::CohortTable::Pop(e, kSlot) == &ws[0]);
      wake.push_back(ws[0].Serve(sdk::CohortWaiter::Outcome::kRemote));
      // 4 wait now: more than `places`, so the head (ws[1]) is woken to spin.
      const Bell* near = table.WakeNearHead(e);
      CHECK(near == &ws[1].bell);
      CHECK(ws[1].spin);
      wake.push_back(near);
      // Chosen once: a second handover's choice would be another waiter or none.
      CHECK(table.WakeNearHead(e) == nullptr);
    }
    for (const Bell* b : wake) Bell::Wake(b);
    wake.clear();
    ts[0].join();
    // ws[1] spins its budget out and parks again. The next handover leaves 3 waiting: with 3
    // spin places that is the 3rd (ws[4]) it wakes, with 1 still the head (ws[2]).
    REQUIRE(WaitFor([&] { return Parked(e, ws[1]); }));
    {
      MutexLock lk(&e.mu);
      REQUIRE(sdk::CohortTable::Pop(e, kSlot) == &ws[1]);
      wake.push_back(ws[1].Serve(sdk::CohortWaiter::Outcome::kRemote));
      const Bell* near = table.WakeNearHead(e);
      CHECK(near == (places == 1 ? &ws[2].bell : &ws[4].bell));
      wake.push_back(near);
    }
    for (const Bell* b : wake) Bell::Wake(b);
    ts[1].join();
    for (size_t i = 2; i < kWaiters; ++i) REQUIRE(WaitFor([&] { return Parked(e, ws[i]); }));
    for (int i = 2; i < kWaiters; ++i) {
      const Bell* w = nullptr;
      {
        MutexLock lk(&e.mu);
        REQUIRE(sdk::CohortTable::Pop(e, kSlot) == &ws[static_cast<size_t>(i)]);
        w = ws[static_cast<size_t>(i)].Serve(sdk::CohortWaiter::Outcome::kRemote);
      }
      Bell::Wake(w);
      ts[static_cast<size_t>(i)].join();
    }
    table.Leave(kSlot);
    CHECK(e.word.load() == 0);
  }
}
