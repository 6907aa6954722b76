// Shared requests through the cohort (client/src/cohort.h; issue 19, item 4) over the in-process
// backend and the test lockd: readers of one client share the session's one shared grant of a
// lock in-process (riders on a carrier), with no RDMA operation; only while no exclusive request
// of the client queues in the entry, and at most kMaxSharedJoins times per remote grant, so that
// another session's writer is granted before the client's later readers; the last reader releases
// the grant; a lost carrier reaches every reader once; a lease that ran out is never joined.
#include <atomic>
#include <catch2/catch.hpp>
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
                                  bool local_handover = true) {
  ClientOptions o = testing::FakeClientOptions(name);
  o.local_handover = local_handover;
  auto c = ClientTestPeer::Connect(o, lockd.connector());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(c).value();
}

LockOptions Reader() {
  LockOptions lo;
  lo.mode = LockMode::kShared;
  return lo;
}

LockOptions Writer() {
  LockOptions lo;
  lo.fencing_token = false;
  return lo;
}

uint64_t AcquiringFas(const ClientStats& s) { return s.fetch_add - s.renewals - s.renew_failures; }

proto::Word0 WordOf(testing::FakeLockd& lockd, uint64_t slot) {
  return proto::Word0::Decode(lockd.table().Load(slot, 0));
}
// Shared grants (or requests) at lockd not released yet, and exclusive ones.
int SharedOut(testing::FakeLockd& lockd, uint64_t slot) {
  const auto w = WordOf(lockd, slot);
  return static_cast<uint16_t>(w.max_s - w.n_s);
}
int ExclusiveOut(testing::FakeLockd& lockd, uint64_t slot) {
  const auto w = WordOf(lockd, slot);
  return static_cast<uint16_t>(w.max_x - w.n_x);
}

}  // namespace

TEST_CASE("cohort shared: readers of one client share one remote grant, with no RDMA operation") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;  // no renewal while the test counts atomics
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("shared-one", lockd);
  auto first = c->LockSlot(3, Reader());
  REQUIRE(first.ok());
  const ClientStats before = c->Stats();
  std::vector<LockHandle> readers;
  for (int i = 0; i < 4; ++i) {
    auto r = c->LockSlot(3, Reader());
    REQUIRE(r.ok());
    readers.push_back(std::move(*r));
  }
  const ClientStats after = c->Stats();
  CHECK(after.local_shares - before.local_shares == 4);
  CHECK(after.acquires - before.acquires == 4);
  CHECK(AcquiringFas(after) == AcquiringFas(before));  // no FETCH_AND_ADD: joined in-process
  CHECK(after.write == before.write);                  // nor a record entry
  CHECK(SharedOut(lockd, 3) == 1);                     // one shared grant at lockd
  for (auto& r : readers) {
    CHECK(r.state() == LockState::kHeld);
    CHECK(r.mode() == LockMode::kShared);
    CHECK(r.slot() == 3);
    CHECK(r.fencing_token() == 0);
    CHECK(r.lease_expiry() == first->lease_expiry());  // one lease, the grant's
  }
  // A reader's renewal renews the one grant.
  const auto expiry = first->lease_expiry();
  std::this_thread::sleep_for(2ms);
  REQUIRE(readers[0].Renew().ok());
  CHECK(first->lease_expiry() > expiry);
  CHECK(readers[3].lease_expiry() == first->lease_expiry());
  // The grant stays until its last reader leaves, whichever that is.
  REQUIRE(first->Release().ok());
  CHECK(first->Release().code() == ErrorCode::kNotHeld);
  for (int i = 0; i < 3; ++i) REQUIRE(readers[i].Release().ok());
  CHECK(SharedOut(lockd, 3) == 1);
  CHECK(readers[3].state() == LockState::kHeld);
  auto other = ConnectTo("shared-other", lockd);
  CHECK(other->TryLockSlot(3, LockMode::kExclusive).status().code() == ErrorCode::kBusy);
  // ReleaseMany takes a reader too (it has no grant of its own to batch).
  REQUIRE(c->ReleaseMany(std::span<LockHandle>(&readers[3], 1)).ok());
  CHECK(readers[3].state() == LockState::kReleased);
  REQUIRE(c->Flush().ok());
  CHECK(WaitFor([&] { return SharedOut(lockd, 3) == 0; }));
  auto w = other->TryLockSlot(3, LockMode::kExclusive);
  CHECK(w.ok());
  CHECK(ClientTestPeer::BudgetUnits(*c, 3) == 0);
}

TEST_CASE(
    "cohort shared: an exclusive request of the client waits for its readers, and stops "
    "new ones joining") {
  testing::FakeLockd lockd(testing::FakeLockd::Options{});
  auto c = ConnectTo("shared-excl", lockd);
  auto r0 = c->LockSlot(4, Reader());
  REQUIRE(r0.ok());
  std::atomic<bool> readers_gone{false}, granted{false}, early{false};
  std::atomic<int> errors{0};
  std::thread writer([&] {
    auto h = c->LockSlot(4, Writer());
    if (!h.ok()) {
      ++errors;
      return;
    }
    if (!readers_gone.load()) early = true;
    granted = true;
    if (!h->Release().ok()) ++errors;
  });
  REQUIRE(WaitFor([&] { return ClientTestPeer::LocalWaiters(*c, 4) == 1; }));
  // A reader now does not join (a writer of the client waits behind the grant): it goes to
  // lockd, which grants it at once beside the client's grant (nothing of another session queued).
  const ClientStats before = c->Stats();
  auto r1 = c->LockSlot(4, Reader());
  REQUIRE(r1.ok());
  const ClientStats after = c->Stats();
  CHECK(after.local_shares == before.local_shares);
  CHECK(AcquiringFas(after) - AcquiringFas(before) == 1);
  CHECK(SharedOut(lockd, 4) == 2);
  REQUIRE(r0->Release().ok());  // the last of the grant's readers: the writer goes to lockd
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(granted.load());  // r1 still reads
  readers_gone = true;
  REQUIRE(r1->Release().ok());
  writer.join();
  CHECK(errors.load() == 0);
  CHECK(granted.load());
  CHECK_FALSE(early.load());
  CHECK(c->Stats().local_handovers == 0);  // a shared grant is never handed to a writer
}

TEST_CASE(
    "cohort shared: joins are bounded, so another session's writer goes before later "
    "readers") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;
  testing::FakeLockd lockd(fo);
  auto a = ConnectTo("shared-bound-a", lockd);
  auto b = ConnectTo("shared-bound-b", lockd);
  std::vector<LockHandle> readers;
  {
    auto r = a->LockSlot(5, Reader());
    REQUIRE(r.ok());
    readers.push_back(std::move(*r));
  }
  std::atomic<int> order{0}, writer_at{0}, late_reader_at{0}, errors{0};
  std::thread writer([&] {
    auto h = b->LockSlot(5, Writer());
    if (!h.ok()) {
      ++errors;
      return;
    }
    writer_at = ++order;
    std::this_thread::sleep_for(10ms);
    if (!h->Release().ok()) ++errors;
  });
  REQUIRE(WaitFor([&] { return ExclusiveOut(lockd, 5) == 1; }));  // b queued at lockd
  const ClientStats before = a->Stats();
  for (uint32_t i = 0; i < sdk::kMaxSharedJoins; ++i) {
    auto r = a->LockSlot(5, Reader());
    REQUIRE(r.ok());
    readers.push_back(std::move(*r));
  }
  CHECK(a->Stats().local_shares - before.local_shares == sdk::kMaxSharedJoins);
  CHECK(AcquiringFas(a->Stats()) == AcquiringFas(before));
  // One more reader: the grant had its joins; it queues at lockd behind b's writer.
  std::thread late([&] {
    auto h = a->LockSlot(5, Reader());
    if (!h.ok()) {
      ++errors;
      return;
    }
    late_reader_at = ++order;
    if (!h->Release().ok()) ++errors;
  });
  REQUIRE(WaitFor([&] { return SharedOut(lockd, 5) == 2; }));
  std::this_thread::sleep_for(30ms);
  CHECK(order.load() == 0);
  for (auto& r : readers) REQUIRE(r.Release().ok());
  writer.join();
  late.join();
  CHECK(errors.load() == 0);
  CHECK(writer_at.load() == 1);
  CHECK(late_reader_at.load() == 2);
  CHECK(a->Stats().local_shares - before.local_shares == sdk::kMaxSharedJoins);
}

TEST_CASE("cohort shared: a session's end reaches every reader of the grant once") {
  testing::FakeLockd::Options fo;
  fo.lease = 200ms;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("shared-fence", lockd);
  const uint64_t first = c->session_id();
  std::vector<LockHandle> readers;
  std::atomic<int> lost[4] = {};
  for (int i = 0; i < 4; ++i) {
    auto r = c->LockSlot(6, Reader());
    REQUIRE(r.ok());
    r->OnLost([&lost, i](const Status&) { ++lost[i]; });
    readers.push_back(std::move(*r));
  }
  CHECK(c->Stats().local_shares == 3);
  REQUIRE(WaitFor([&] { return lockd.Heartbeat(first) != 0; }));
  lockd.Fence(first);
  for (int i = 0; i < 4; ++i) {
    INFO("reader " << i);
    CHECK(WaitFor([&] { return lost[i].load() == 1; }));
    CHECK(readers[i].state() == LockState::kLost);
    CHECK(readers[i].Release().code() == ErrorCode::kLockLost);
  }
  std::this_thread::sleep_for(50ms);  // a second report would have come by now
  for (int i = 0; i < 4; ++i) CHECK(lost[i].load() == 1);
  // The new session's readers share again.
  auto r = c->LockSlot(6, Reader());
  REQUIRE(r.ok());
  auto r2 = c->LockSlot(6, Reader());
  REQUIRE(r2.ok());
  CHECK(c->Stats().local_shares == 4);
  CHECK(ClientTestPeer::BudgetUnits(*c, 6) == 1);  // the one grant's
}

// A reader that is not the last on a shared grant said it held the lock up to its Release() by
// the grant's state and lease alone: released between the session's end and its locks' loss
// report (another thread ended it; EndLeases had not reached the grant), it returned OK, where
// client.h promises kLockLost, as a plain holder's release says (found by review, 2026-12-06).
TEST_CASE(
    "cohort shared: a reader's release between the session's end and the loss report says "
    "kLockLost") {
  testing::FakeLockd::Options fo;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("shared-release-at-end", lockd);
  std::vector<LockHandle> readers;
  for (int i = 0; i < 2; ++i) {
    auto r = c->LockSlot(3, Reader());
    REQUIRE(r.ok());
    readers.push_back(std::move(*r));
  }
  REQUIRE(c->Stats().local_shares == 1);
  Status during = Error(ErrorCode::kInternal, "the hook did not run");
  std::atomic<bool> once{false};
  ClientTestPeer::SetTestHook(*c, [&](std::string_view point) {
    if (point == "session_ended" && !once.exchange(true)) during = readers[0].Release();
  });
  ClientTestPeer::FailSession(*c, "injected");
  ClientTestPeer::SetTestHook(*c, nullptr);
  INFO("the first reader's Release() while the session ended: " << during.ToString());
  CHECK(during.code() == ErrorCode::kLockLost);
  CHECK(readers[1].state() == LockState::kLost);
}

TEST_CASE("cohort shared: a reader never joins a grant whose lease ran out") {
  testing::FakeLockd::Options fo;
  fo.lease = 60ms;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("shared-lease", lockd);
  auto r0 = c->LockSlot(7, Reader());
  REQUIRE(r0.ok());
  ClientTestPeer::PauseRenewals(*c, true);
  REQUIRE(WaitFor([&] { return r0->state() == LockState::kLost; }));
  auto r1 = c->LockSlot(7, Reader());  // to lockd, which grants it beside the expired one
  REQUIRE(r1.ok());
  CHECK(c->Stats().local_shares == 0);
  // The join that was undone counts as nothing: no acquire, and no loss (the diff review,
  // 2026-12-06: its undoing release counted a loss of a lock never handed out).
  CHECK(c->Stats().lost == 0);
  CHECK(c->Stats().acquires == 2);
  ClientTestPeer::PauseRenewals(*c, false);
  CHECK(r1->state() == LockState::kHeld);
  CHECK(r0->Release().code() == ErrorCode::kLockLost);
  CHECK(r1->Release().ok());
}

// A reader that is not the last one leaves the shared grant without releasing it at lockd; its
// Release must still say kLockLost once the grant's lease has run out (client.h), as the last
// reader's does: the reader may not believe it held the lock throughout.
TEST_CASE("cohort shared: a reader that is not the last is told its lease ran out at Release") {
  testing::FakeLockd::Options fo;
  fo.lease = 300ms;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("shared-lapsed", lockd);
  auto r0 = c->LockSlot(10, Reader());
  REQUIRE(r0.ok());
  auto r1 = c->LockSlot(10, Reader());  // joins r0's grant in-process
  REQUIRE(r1.ok());
  REQUIRE(c->Stats().local_shares == 1);
  ClientTestPeer::PauseRenewals(*c, true);
  REQUIRE(WaitFor([&] { return r1->state() == LockState::kLost; }));
  const Status st = r1->Release();  // r0 still holds its share: r1 is not the last reader
  INFO(st.ToString());
  CHECK(st.code() == ErrorCode::kLockLost);
  CHECK(r1->state() == LockState::kLost);
  CHECK(r0->Release().code() == ErrorCode::kLockLost);
  ClientTestPeer::PauseRenewals(*c, false);
}

TEST_CASE(
    "cohort shared: with local_handover off, or auto_renew off, every reader goes to "
    "lockd") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;
  testing::FakeLockd lockd(fo);
  auto off = ConnectTo("shared-off", lockd, /*local_handover=*/false);
  auto a = off->LockSlot(8, Reader());
  auto b = off->LockSlot(8, Reader());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(SharedOut(lockd, 8) == 2);
  auto on = ConnectTo("shared-norenew", lockd);
  LockOptions lo = Reader();
  lo.auto_renew = false;
  auto x = on->LockSlot(9, lo);
  auto y = on->LockSlot(9, lo);
  REQUIRE(x.ok());
  REQUIRE(y.ok());
  CHECK(SharedOut(lockd, 9) == 2);
  CHECK(on->Stats().local_shares == 0);
}

TEST_CASE(
    "cohort shared: async readers join a held grant at once, and an async reader's grant "
    "is joined") {
  testing::FakeLockd::Options fo;
  fo.lease = 2s;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("shared-async", lockd);
  std::mutex mu;
  std::vector<LockHandle> kept;
  std::vector<Status> statuses;
  auto keep = [&](Result<LockHandle> h) {
    std::lock_guard lk(mu);
    statuses.push_back(h.status());
    if (h.ok()) kept.push_back(std::move(*h));
  };
  auto done = [&] {
    std::lock_guard lk(mu);
    return statuses.size();
  };
  // Async readers of a lock a thread of the client reads: they join, no FETCH_AND_ADD.
  auto r0 = c->LockSlot(10, Reader());
  REQUIRE(r0.ok());
  const ClientStats before = c->Stats();
  for (int i = 0; i < 3; ++i) REQUIRE(c->LockSlotAsync(10, Reader(), keep).ok());
  REQUIRE(WaitFor([&] { return done() == 3; }));
  ClientStats after = c->Stats();
  CHECK(after.local_shares - before.local_shares == 3);
  CHECK(AcquiringFas(after) == AcquiringFas(before));
  CHECK(SharedOut(lockd, 10) == 1);
  CHECK(ClientTestPeer::BudgetUnits(*c, 10) == 1);  // the one grant's: joins hold none
  REQUIRE(r0->Release().ok());
  {
    std::lock_guard lk(mu);
    for (auto& s : statuses) CHECK(s.ok());
    for (auto& h : kept) CHECK(h.state() == LockState::kHeld);
    for (auto& h : kept) CHECK(h.Release().ok());
    kept.clear();
    statuses.clear();
  }
  REQUIRE(c->Flush().ok());
  CHECK(WaitFor([&] { return SharedOut(lockd, 10) == 0; }));
  // An async reader that finds the entry free acquires from lockd and its grant is joined by a
  // blocking reader.
  REQUIRE(c->LockSlotAsync(11, Reader(), keep).ok());
  REQUIRE(WaitFor([&] { return done() == 1; }));
  auto r1 = c->LockSlot(11, Reader());
  REQUIRE(r1.ok());
  CHECK(c->Stats().local_shares - after.local_shares == 1);
  CHECK(SharedOut(lockd, 11) == 1);
  {
    std::lock_guard lk(mu);
    REQUIRE(kept.size() == 1);
    CHECK(kept[0].Release().ok());
  }
  CHECK(r1->state() == LockState::kHeld);
  CHECK(r1->Release().ok());
  REQUIRE(c->Flush().ok());
  CHECK(WaitFor([&] { return SharedOut(lockd, 11) == 0; }));
  CHECK(WaitFor([&] { return ClientTestPeer::BudgetUnits(*c, 10) == 0; }));
  CHECK(WaitFor([&] { return ClientTestPeer::BudgetUnits(*c, 11) == 0; }));
}

// A blocking shared request whose grant is about to become the one the client's readers join: the
// session ends there (after the check that returns EndedWhileGranted for a grant lost at once).
// ShareGrant then hands back the grant itself, lost, and LockSlot returned ok with a handle that
// was lost already (the async path returns an error there; found by review, 2026-12-05). It
// returns the error too.
TEST_CASE("cohort shared: a reader whose session ends as its grant is shared gets an error") {
  testing::FakeLockd lockd({});
  auto c = ConnectTo("shared-ends", lockd);
  auto fail_once = std::make_shared<std::atomic<bool>>(true);
  Client* raw = c.get();  // used once, on this thread, while `c` lives
  ClientTestPeer::SetTestHook(*c, [fail_once, raw](std::string_view point) {
    if (point == "sharing" && fail_once->exchange(false)) {
      ClientTestPeer::FailSession(*raw, "injected as the grant is shared");
    }
  });
  auto r = c->LockSlot(6, Reader());
  INFO((r.ok() ? std::string(r->state() == LockState::kLost ? "ok, lost" : "ok, held")
               : r.status().ToString()));
  CHECK_FALSE(r.ok());
  CHECK(r.status().code() == ErrorCode::kConnection);
  CHECK_FALSE(fail_once->load());  // the hook ran
}

TEST_CASE(
    "cohort shared: every reader's release counts in the client's releases, on any thread, and "
    "a reader's lost release in its losses") {
  testing::FakeLockd::Options fo;
  fo.lease = 300ms;
  testing::FakeLockd lockd(fo);
  auto c = ConnectTo("shared-counted", lockd);
  const ClientStats before = c->Stats();
  std::vector<LockHandle> readers;
  for (int i = 0; i < 4; ++i) {
    auto r = c->LockSlot(11, Reader());
    REQUIRE(r.ok());
    readers.push_back(std::move(*r));
  }
  REQUIRE(c->Stats().local_shares - before.local_shares == 3);
  REQUIRE(readers[0].Release().ok());
  // A thread that never used the client (it has no connection of its own) releases one.
  Status other_thread;
  std::thread([&] { other_thread = readers[1].Release(); }).join();
  REQUIRE(other_thread.ok());
  REQUIRE(readers[2].Release().ok());
  REQUIRE(readers[3].Release().ok());  // the last reader: the grant goes back to lockd
  const ClientStats after = c->Stats();
  CHECK(after.acquires - before.acquires == 4);
  CHECK(after.releases - before.releases == 4);
  CHECK(after.lost == before.lost);

  // Two readers whose lease ran out: the first one's release is not the last.
  auto r0 = c->LockSlot(12, Reader());
  REQUIRE(r0.ok());
  auto r1 = c->LockSlot(12, Reader());
  REQUIRE(r1.ok());
  ClientTestPeer::PauseRenewals(*c, true);
  REQUIRE(WaitFor([&] { return r1->state() == LockState::kLost; }));
  CHECK(r1->Release().code() == ErrorCode::kLockLost);
  CHECK(r0->Release().code() == ErrorCode::kLockLost);
  ClientTestPeer::PauseRenewals(*c, false);
  const ClientStats end = c->Stats();
  CHECK(end.releases == after.releases);
  CHECK(end.lost - after.lost == 2);
}
