// The SDK's session keeping (client/src/client_keeper.cc, client_channels.cc) on the host: a real
// Client over the in-process backend and the test lockd (tests/support/fake_lockd.h), whose
// connections are dropped, fenced or refused. The keeper must notice, report every lock of the
// ended session lost exactly once, reconnect with a new session (retrying a refused or failed
// connect), and keep a healthy session alive with heartbeats and renewals.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "client/src/client_test_peer.h"
#include "rdmalock/client.h"
#include "tests/support/fake_lockd.h"

using namespace rdmalock;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Client> ConnectTo(const char* name, Connector connector) {
  auto c = ClientTestPeer::Connect(testing::FakeClientOptions(name), std::move(connector));
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(c).value();
}

using testing::WaitFor;

// Waits for the client to be in a session other than `old` (and in one at all).
bool WaitForNewSession(Client& c, uint64_t old) {
  return WaitFor([&] {
    const uint64_t id = c.session_id();
    return id != 0 && id != old;
  });
}

// A lock a holder thread took, and how often its loss was reported.
struct Held {
  LockHandle handle;
  std::shared_ptr<std::atomic<int>> lost = std::make_shared<std::atomic<int>>(0);
};

}  // namespace

TEST_CASE(
    "session keeping: the session ends, every holder hears OnLost once, the keeper reconnects") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 16;
  fo.lease = 200ms;
  testing::FakeLockd lockd(fo);
  auto client = ConnectTo("keeper", lockd.connector());
  const uint64_t first = client->session_id();
  REQUIRE(first != 0);

  bool fence = false;
  SECTION("lockd fences the session (a heartbeat, QP-error or operator fence)") { fence = true; }
  SECTION("every connection of the session drops (QP errors)") {}

  // Holders on several threads (each with its own connection of the session), two locks each.
  constexpr int kThreads = 3;
  std::mutex held_mu;
  std::vector<Held> held;
  std::atomic<int> failed{0}, wrong_reason{0};  // Catch's assertions are for the test's thread
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 2; ++k) {
        LockOptions lo;
        lo.timeout = 2s;
        auto h = client->LockSlot(static_cast<uint64_t>(2 * t + k), lo);
        if (!h.ok()) {
          ++failed;
          return;
        }
        Held one;
        one.handle = std::move(h).value();
        one.handle.OnLost([n = one.lost, &wrong_reason](const Status& why) {
          if (why.code() != ErrorCode::kLockLost) ++wrong_reason;
          ++*n;
        });
        std::lock_guard lk(held_mu);
        held.push_back(std::move(one));
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failed.load() == 0);
  REQUIRE(held.size() == 2 * kThreads);
  // One released before the session ends: nothing is reported for it.
  auto released = client->LockSlot(10);
  REQUIRE(released.ok());
  std::atomic<int> released_lost{0};
  released->OnLost([&](const Status&) { ++released_lost; });
  REQUIRE(released->Release().ok());

  const auto ids = lockd.Sessions();
  REQUIRE(ids.size() == 1);
  REQUIRE(ids[0] == first);
  // The keeper has its connection (it has written a heartbeat): it is among those dropped.
  REQUIRE(WaitFor([&] { return lockd.Heartbeat(first) != 0; }));
  if (fence) {
    lockd.Fence(first);
  } else {
    lockd.BreakSession(first);
  }

  // The keeper's heartbeat (or its connection check) finds the session ended and reconnects.
  REQUIRE(WaitForNewSession(*client, first));
  REQUIRE(WaitFor([&] {
    for (const Held& h : held) {
      if (h.lost->load() == 0) return false;
    }
    return true;
  }));
  std::this_thread::sleep_for(100ms);  // a second report would come from the keeper by now
  for (const Held& h : held) {
    CHECK(h.lost->load() == 1);
    CHECK(h.handle.state() == LockState::kLost);
  }
  CHECK(released_lost.load() == 0);
  CHECK(wrong_reason.load() == 0);
  const ClientStats st = client->Stats();
  CHECK(st.sessions_lost == 1);
  CHECK(st.reconnects == 1);
  CHECK(client->session_id() != first);

  // A handle of the old session cannot be released or renewed in the new one.
  CHECK(held[0].handle.Release().code() == ErrorCode::kLockLost);
  CHECK_FALSE(held[1].handle.Renew().ok());

  // New acquires work, on this thread and on new threads (which join the new session), for the
  // same slots once lockd has freed the old session's (at once on a drop, a lease after a fence).
  LockOptions lo;
  lo.timeout = 3s;
  auto again = client->LockSlot(0, lo);
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  CHECK(again->state() == LockState::kHeld);
  std::atomic<int> ok{0};
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto h = client->LockSlot(static_cast<uint64_t>(2 * t + 1), lo);
      if (h.ok() && h->Release().ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok.load() == kThreads);
  CHECK(again->Release().ok());
  CHECK(lockd.Sessions() == std::vector<uint64_t>{client->session_id()});
}

TEST_CASE("session keeping: heartbeats and renewals keep a session and its locks alive") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 4;
  fo.lease = 500ms;  // long enough for a loaded host's scheduling delays, a third renews it
  fo.heartbeat_interval = 20ms;
  testing::FakeLockd lockd(fo);
  auto client = ConnectTo("renews", lockd.connector());
  auto other = ConnectTo("other", lockd.connector());
  const uint64_t id = client->session_id();

  auto h = client->LockSlot(1);
  REQUIRE(h.ok());
  std::atomic<int> lost{0};
  h->OnLost([&](const Status&) { ++lost; });

  // Four leases long: without renewals the lock would be lost, without heartbeats the record
  // would not move (it moves every 20 ms; sampled every 100 ms).
  uint64_t beat = lockd.Heartbeat(id);
  int samples = 0, beats_moved = 0;
  const auto end = std::chrono::steady_clock::now() + 4 * fo.lease;
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(100ms);
    const uint64_t now = lockd.Heartbeat(id);
    ++samples;
    if (now != beat) ++beats_moved;
    beat = now;
    REQUIRE(h->state() == LockState::kHeld);
  }
  CHECK(beats_moved >= samples / 2);
  const ClientStats st = client->Stats();
  CHECK(st.renewals >= 3);
  CHECK(st.renew_failures == 0);
  CHECK(st.sessions_lost == 0);
  CHECK(st.reconnects == 0);
  CHECK(client->session_id() == id);
  CHECK(lost.load() == 0);
  CHECK(h->lease_expiry() > std::chrono::steady_clock::now());
  // lockd still counts it held: another session may not take it (nor recover it as stalled).
  CHECK(other->TryLockSlot(1).status().code() == ErrorCode::kBusy);
  CHECK(h->Release().ok());
  LockOptions lo;
  lo.timeout = 2s;
  CHECK(other->LockSlot(1, lo).ok());
}

TEST_CASE("session keeping: a connect that fails while reconnecting is retried") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 4;
  fo.lease = 200ms;
  testing::FakeLockd lockd(fo);
  // Refuses the next `refuse` new sessions (a join of a live session goes through).
  std::atomic<int> refuse{0}, refused{0};
  uint32_t retry_after_ms = 0;
  ErrorCode refusal = ErrorCode::kConnection;
  SECTION("lockd does not answer (a connection error; the keeper backs off)") {}
  SECTION("lockd refuses with a retry-after (its restart grace)") {
    retry_after_ms = 30;
    refusal = ErrorCode::kRejected;
  }
  Connector inner = lockd.connector();
  Connector connector = [&, inner](
                            const ChannelParams& p, uint32_t* retry_ms,
                            proto::RejectReason* reason) -> Result<std::unique_ptr<Connection>> {
    if ((p.flags & proto::kFlagJoin) == 0 && refuse.load() > 0) {
      --refuse;
      ++refused;
      if (retry_ms != nullptr) *retry_ms = retry_after_ms;
      return Error(refusal, "test connector: refused");
    }
    return inner(p, retry_ms, reason);
  };
  auto client = ConnectTo("retries", connector);
  const uint64_t first = client->session_id();
  LockOptions lo;
  lo.timeout = 2s;
  auto h = client->LockSlot(2, lo);
  REQUIRE(h.ok());
  std::atomic<int> lost{0};
  h->OnLost([&](const Status&) { ++lost; });

  refuse = 3;
  REQUIRE(WaitFor([&] { return lockd.Heartbeat(first) != 0; }));  // the keeper's is among them
  lockd.BreakSession(first);
  REQUIRE(WaitFor([&] { return lost.load() == 1; }));
  // While the keeper retries, a call waits for the new session until its deadline, then says
  // the client is reconnecting.
  LockOptions quick;
  quick.timeout = 5ms;
  if (auto r = client->LockSlot(3, quick); !r.ok()) {
    CHECK(r.status().code() == ErrorCode::kConnection);
  }
  REQUIRE(WaitForNewSession(*client, first));
  CHECK(refused.load() == 3);
  CHECK(refuse.load() == 0);
  CHECK(lost.load() == 1);
  CHECK(client->Stats().reconnects == 1);
  CHECK(client->Stats().sessions_lost == 1);
  auto again = client->LockSlot(2, lo);
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  CHECK(again->Release().ok());
}
