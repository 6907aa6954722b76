// Closing a Client from inside its own callbacks (issue 17, finding 9). Loss callbacks run on the
// client's keeper thread (or whichever of its threads noticed the loss), async acquires complete
// on its pump thread: destroying the client there must neither join that thread from itself
// (std::terminate) nor leave it running on a freed client. Over the in-process backend and the
// test lockd (tests/support/fake_lockd.h), so that this also runs under ASan and TSan.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "client/src/client_test_peer.h"
#include "rdmalock/client.h"
#include "tests/support/fake_lockd.h"
#include "tests/support/test_env.h"

using namespace rdmalock;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Client> ConnectTo(testing::FakeLockd& lockd, const char* name) {
  auto c = ClientTestPeer::Connect(testing::FakeClientOptions(name), lockd.connector());
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(c).value();
}

using testing::WaitFor;

// What a callback that destroyed its client saw.
struct Seen {
  std::atomic<int> calls{0};
  std::atomic<bool> closed{false};       // set after the client's destruction returned
  std::atomic<bool> on_caller{false};    // it ran on the test's own thread
  std::atomic<bool> handle_lost{false};  // the handle it held turned kLost
};

}  // namespace

TEST_CASE("issue 17 finding 9: a loss callback that destroys its client (keeper thread)") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 4;
  fo.lease = 200ms;
  testing::FakeLockd lockd(fo);
  std::unique_ptr<Client> client = ConnectTo(lockd, "closes-in-callback");
  auto other = ConnectTo(lockd, "other");
  const std::weak_ptr<const void> life = ClientTestPeer::Lifetime(*client);
  const auto test_thread = std::this_thread::get_id();
  Seen seen;

  LockOptions lo;
  lo.timeout = 1s;
  bool fence = false;
  SECTION("the lease runs out (auto_renew off): the keeper reports it") { lo.auto_renew = false; }
  SECTION("lockd fences the session: the keeper's heartbeat finds it") { fence = true; }

  auto h = client->LockSlot(1, lo);
  REQUIRE(h.ok());
  h->OnLost([&](const Status&) {
    ++seen.calls;
    seen.on_caller = std::this_thread::get_id() == test_thread;
    client.reset();  // ~Client on the thread that runs the callback
    seen.closed = true;
  });
  if (fence) {
    const auto ids = lockd.Sessions();
    REQUIRE(ids.size() == 2);
    lockd.Fence(std::min(ids[0], ids[1]));  // the first session is `client`'s
  }
  REQUIRE(WaitFor([&] { return seen.closed.load(); }));
  CHECK(seen.calls.load() == 1);
  CHECK_FALSE(seen.on_caller.load());
  // Whatever that thread still had to do after the callback is done without the client object
  // (and without anything freed under it: ASan), then the implementation goes too.
  CHECK(WaitFor([&] { return life.expired(); }));
  CHECK(h->state() == LockState::kLost);
  CHECK_FALSE(h->Release().ok());
  // The closed session's lock is free at lockd (at once on a close; one lease after a fence).
  LockOptions wait;
  wait.timeout = 3s;
  auto again = other->LockSlot(1, wait);
  INFO(again.status().ToString());
  CHECK(again.ok());
}

TEST_CASE("issue 17 finding 9: an async acquire's callback that destroys its client (pump)") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 4;
  testing::FakeLockd lockd(fo);
  std::unique_ptr<Client> client = ConnectTo(lockd, "closes-in-async");
  const std::weak_ptr<const void> life = ClientTestPeer::Lifetime(*client);
  Seen seen;
  LockOptions lo;
  lo.timeout = 1s;
  REQUIRE(client
              ->LockSlotAsync(2, lo,
                              [&](Result<LockHandle> h) {
                                ++seen.calls;
                                if (h.ok())
                                  client.reset();  // with the grant's handle alive: it turns lost
                                seen.handle_lost = h.ok() && h->state() == LockState::kLost;
                                seen.closed = true;
                              })
              .ok());
  REQUIRE(WaitFor([&] { return seen.closed.load(); }));
  CHECK(seen.calls.load() == 1);
  CHECK(seen.handle_lost.load());
  CHECK(WaitFor([&] { return life.expired(); }));
}

// Found while fixing finding 9 (helper's review): Release and Renew took the handle's mutex, then
// asked for the calling thread's connection. A thread with none yet joins the session; a join
// that fails with a connection error ends the session, whose EndLeases takes every handle's
// mutex, this one's too, on the same thread: a deadlock (a handle moved to a new thread, then
// lockd unreachable).
TEST_CASE("issue 17: releasing or renewing from a thread whose join fails does not deadlock") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 4;
  fo.lease = 2s;
  testing::FakeLockd lockd(fo);
  auto inner = lockd.connector();
  auto fail_joins = std::make_shared<std::atomic<bool>>(false);
  Connector failing = [inner, fail_joins](
                          const ChannelParams& p, uint32_t* retry,
                          proto::RejectReason* why) -> Result<std::unique_ptr<Connection>> {
    if (fail_joins->load() && (p.flags & proto::kFlagJoin) != 0) {
      return Error(ErrorCode::kConnection, "test: lockd unreachable for this join");
    }
    return inner(p, retry, why);
  };
  ClientOptions o = testing::FakeClientOptions("moved-handle");
  o.reconnect = false;
  auto client = ClientTestPeer::Connect(o, failing);
  REQUIRE(client.ok());
  LockOptions lo;
  lo.timeout = 1s;
  lo.auto_renew = false;
  auto h = (*client)->LockSlot(1, lo);
  REQUIRE(h.ok());
  fail_joins->store(true);
  bool renew = false;
  SECTION("Release") {}
  SECTION("Renew") { renew = true; }
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto result = std::make_shared<Status>();
  LockHandle moved = std::move(*h);
  std::thread t([&moved, renew, done, result] {
    *result = renew ? moved.Renew() : moved.Release();
    done->store(true);
  });
  const bool finished = WaitFor([&] { return done->load(); }, 5s);
  if (!finished) {
    std::fprintf(stderr,
                 "%s: the call on a new thread whose join failed never returned within 5 s "
                 "(deadlock); exiting\n",
                 renew ? "Renew" : "Release");
    t.detach();  // stuck for good: the process cannot end cleanly
    std::_Exit(1);
  }
  t.join();
  INFO(result->ToString());
  CHECK_FALSE(result->ok());
  CHECK(moved.state() == LockState::kLost);
}

// Found by review (2026-12-05): ReleaseMany holds the mutexes of the handles it batches while it
// goes on through the rest, and released a handle it cannot batch (a reader's, cohort.h) there
// and then. When that reader was its grant's last and the connection had broken, its release
// ended the session, whose EndLeases takes every held handle's mutex: a batched one's too, held
// by this very thread (a deadlock). The handles it cannot batch are released after the batch.
TEST_CASE("ReleaseMany: a reader's release that ends the session does not deadlock the batch") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 16;
  fo.lease = 2s;
  // The keeper must not find the broken connection first (its session's end would leave nothing
  // to batch): heartbeats far apart, and renewals paused below.
  fo.heartbeat_interval = 10s;
  testing::FakeLockd lockd(fo);
  ClientOptions o = testing::FakeClientOptions("release-many-broken");
  o.reconnect = false;
  auto client = ClientTestPeer::Connect(o, lockd.connector());
  REQUIRE(client.ok());
  Client& c = **client;
  std::vector<LockHandle> hs;
  LockOptions reader;
  reader.mode = LockMode::kShared;
  // Exclusive handles on either side of the readers' states in memory (the batch locks its
  // mutexes in address order): some are locked before the reader is reached.
  for (uint64_t slot = 1; slot <= 4; ++slot) {
    auto h = c.LockSlot(slot, {});
    REQUIRE(h.ok());
    hs.push_back(std::move(h).value());
  }
  auto r0 = c.LockSlot(9, reader);
  auto r1 = c.LockSlot(9, reader);  // joins r0's grant in-process
  REQUIRE(r0.ok());
  REQUIRE(r1.ok());
  for (uint64_t slot = 5; slot <= 8; ++slot) {
    auto h = c.LockSlot(slot, {});
    REQUIRE(h.ok());
    hs.push_back(std::move(h).value());
  }
  REQUIRE(r0->Release().ok());  // r1 is the grant's last reader now
  hs.push_back(std::move(r1).value());
  // client.h: a release whose result reports the loss does not call OnLost too. The call's
  // result tells every handle given to it (found by review, 2026-12-07: the session's end
  // told the reader, released after the batch, through OnLost as well).
  auto told = std::make_shared<std::atomic<int>>(0);
  for (LockHandle& h : hs) h.OnLost([told](const Status&) { ++*told; });
  ClientTestPeer::PauseRenewals(c, true);
  const auto ids = lockd.Sessions();
  REQUIRE(ids.size() == 1);
  lockd.BreakSession(ids[0]);
  // On this thread, whose connection broke (a new thread would join the session afresh); a
  // watchdog ends the process if the call never returns.
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread watchdog([done] {
    if (!WaitFor([&] { return done->load(); }, 5s)) {
      std::fprintf(stderr, "ReleaseMany never returned within 5 s (deadlock); exiting\n");
      std::_Exit(1);
    }
  });
  const Status result = c.ReleaseMany(hs);
  done->store(true);
  watchdog.join();
  INFO(result.ToString());
  CHECK_FALSE(result.ok());  // the connection broke: the locks are lost, not released
  for (LockHandle& h : hs) CHECK(h.state() == LockState::kLost);
  std::this_thread::sleep_for(100ms);  // a loss told through the keeper would come by now
  CHECK(told->load() == 0);
}

// Found by review (2026-12-05): the pump finishes a batch's granted requests first (running their
// callbacks) and queues the rest for the waiter threads. A callback that destroyed the client
// stopped those threads, and the pump then queued the rest where nobody would serve them: their
// callbacks never ran, although client.h promises each runs once (kConnection on close).
TEST_CASE("async: a callback that closes the client still completes the rest of its batch") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 8;
  testing::FakeLockd lockd(fo);
  std::unique_ptr<Client> client = ConnectTo(lockd, "closes-mid-batch");
  auto other = ConnectTo(lockd, "holds-b");
  auto held = other->LockSlot(3, {});  // B's lock: B waits at lockd
  REQUIRE(held.ok());
  std::atomic<bool> gate{false}, first_in{false};
  std::atomic<int> a_calls{0}, b_calls{0};
  std::atomic<bool> b_connection{false};
  // The first request's callback holds the pump until A and B are queued, so that the pump takes
  // them in one batch.
  std::vector<LockHandle> kept;
  std::mutex kept_mu;
  REQUIRE(client
              ->LockSlotAsync(1, {},
                              [&](Result<LockHandle> h) {
                                first_in = true;
                                while (!gate.load()) std::this_thread::sleep_for(1ms);
                                std::lock_guard lk(kept_mu);
                                if (h.ok()) kept.push_back(std::move(h).value());
                              })
              .ok());
  REQUIRE(WaitFor([&] { return first_in.load(); }));
  REQUIRE(client
              ->LockSlotAsync(2, {},
                              [&](Result<LockHandle> h) {
                                ++a_calls;
                                if (h.ok()) client.reset();  // on the pump, mid-batch
                              })
              .ok());
  REQUIRE(client
              ->LockSlotAsync(3, {},
                              [&](Result<LockHandle> h) {
                                ++b_calls;
                                b_connection = h.status().code() == ErrorCode::kConnection;
                              })
              .ok());
  gate = true;
  REQUIRE(WaitFor([&] { return a_calls.load() == 1; }));
  const bool b_done = WaitFor([&] { return b_calls.load() == 1; }, 3s);
  CHECK(b_done);
  CHECK(b_connection.load());
  std::this_thread::sleep_for(50ms);
  CHECK(b_calls.load() <= 1);
}

// Found by review (2026-12-05): a forked child that destroys a handle it inherited must not take
// the held list's spin lock. A parent's thread may have held it at fork() (every grant and
// release takes it for a few stores), and in the child nothing ever gives it back: the child
// spun for ever. The test holds that lock across the fork.
TEST_CASE("fork: a child destroying an inherited handle does not wait for the held list") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 4;
  testing::FakeLockd lockd(fo);
  auto client = ConnectTo(lockd, "forks");
  auto h = client->LockSlot(1, {});
  REQUIRE(h.ok());
  ClientTestPeer::HoldHeldList(*client, true);  // as a grant on another thread would, briefly
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(5);  // a child that spins is killed: the parent reads SIGALRM
    { LockHandle inherited = std::move(*h); }
    _exit(0);
  }
  ClientTestPeer::HoldHeldList(*client, false);
  REQUIRE(pid > 0);
  const testing::ChildEnd child = testing::WaitChild(pid);
  REQUIRE(child.waited);
  INFO("child: " << child.how);
  CHECK(child.clean);
  CHECK(h->state() == LockState::kHeld);  // the parent's lock is untouched
  CHECK(h->Release().ok());
}

// sdk.md and rdmalock.h: in a forked child, accessors of an inherited handle return 0. slot()
// and mode() returned the parent's (found by review, 2026-12-06).
TEST_CASE("fork: a child's inherited handle reads slot 0 and no token") {
  testing::FakeLockd::Options fo;
  fo.lock_count = 4;
  testing::FakeLockd lockd(fo);
  auto client = ConnectTo(lockd, "fork-accessors");
  auto h = client->LockSlot(3, {.mode = LockMode::kShared});
  REQUIRE(h.ok());
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(5);
    // Exit status: which accessor showed the parent's lock (0: none).
    int bad = 0;
    if (h->slot() != 0) bad |= 1;
    if (h->mode() != LockMode::kExclusive) bad |= 2;
    if (h->fencing_token() != 0) bad |= 4;
    if (h->state() != LockState::kLost) bad |= 8;
    _exit(bad);
  }
  REQUIRE(pid > 0);
  const testing::ChildEnd child = testing::WaitChild(pid);
  REQUIRE(child.waited);
  INFO("child: " << child.how << " (exit bits: 1 slot, 2 mode, 4 token, 8 state)");
  CHECK(child.clean);
  CHECK(h->slot() == 3);  // the parent's lock is untouched
  CHECK(h->Release().ok());
}

// Closing a client joins its async waiter threads after shutting their connections, so that a
// waiter waiting at lockd for a lock another client holds gives up. A waiter that was still
// joining the session (its first request, or its first since a reconnect) when the close collected
// those connections registered its connection after that and waited on it for the lock: the
// close hung until the other client released (found by review, 2026-12-05). A waiter that has its
// connection checks whether the client is closing before it waits.
TEST_CASE("async: closing a client whose waiter thread is still joining the session ends it") {
  testing::FakeLockd lockd({});
  auto holder = ConnectTo(lockd, "holder");
  auto held = holder->LockSlot(0, {});
  REQUIRE(held.ok());
  // A connector whose joins wait at a gate once it is armed.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool armed = false, entered = false, open = false;
  } gate;
  // However the test ends, the gate opens (a waiter left at it would hang the client's close).
  struct OpenAtEnd {
    Gate& g;
    ~OpenAtEnd() {
      {
        std::lock_guard lk(g.mu);
        g.open = true;
      }
      g.cv.notify_all();
    }
  };
  Connector inner = lockd.connector();
  Connector gated = [&gate, inner](const ChannelParams& p, uint32_t* retry_ms,
                                   proto::RejectReason* reason) {
    if ((p.flags & proto::kFlagJoin) != 0) {
      std::unique_lock lk(gate.mu);
      if (gate.armed) {
        gate.entered = true;
        gate.cv.notify_all();
        gate.cv.wait(lk, [&] { return gate.open; });
      }
    }
    return inner(p, retry_ms, reason);
  };
  auto c = ClientTestPeer::Connect(testing::FakeClientOptions("closing"), gated);
  REQUIRE(c.ok());
  std::unique_ptr<Client> client = std::move(c).value();
  OpenAtEnd open_at_end{gate};  // destroyed before `client` (declared after it)
  // The pump's connection first (a request granted at once), so that only the waiter joins later.
  auto warm = std::make_shared<std::promise<Result<LockHandle>>>();
  auto warm_f = warm->get_future();
  REQUIRE(
      client->LockSlotAsync(1, {}, [warm](Result<LockHandle> r) { warm->set_value(std::move(r)); })
          .ok());
  REQUIRE(warm_f.wait_for(5s) == std::future_status::ready);
  REQUIRE(warm_f.get().ok());
  {
    std::lock_guard lk(gate.mu);
    gate.armed = true;
  }
  auto waits = std::make_shared<std::promise<Result<LockHandle>>>();
  auto waits_f = waits->get_future();
  REQUIRE(
      client
          ->LockSlotAsync(0, {}, [waits](Result<LockHandle> r) { waits->set_value(std::move(r)); })
          .ok());
  {
    std::unique_lock lk(gate.mu);
    REQUIRE(gate.cv.wait_for(lk, 5s, [&] { return gate.entered; }));  // the waiter joins
  }
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    client.reset();
    closed.store(true);
  });
  std::this_thread::sleep_for(200ms);  // the close has collected the connections it shuts
  {
    std::lock_guard lk(gate.mu);
    gate.open = true;
  }
  gate.cv.notify_all();
  const bool in_time = WaitFor([&] { return closed.load(); }, 3s);
  CHECK(in_time);
  (void)held->Release();  // what ended the close before the fix
  closer.join();
  REQUIRE(waits_f.wait_for(5s) == std::future_status::ready);
  auto r = waits_f.get();
  INFO(r.status().ToString());
  CHECK(r.status().code() == ErrorCode::kConnection);
}

// The first async request starts the client's pump and waiter threads. std::thread throws when
// the system has no thread for it (EAGAIN: RLIMIT_NPROC, a cgroup's pids.max), and the exception
// went out of LockSlotAsync, through an API that promises none, with the request's budget unit
// kept for ever (found by review, 2026-12-06). A test hook at that point throws as std::thread
// does.
TEST_CASE("async: a thread that cannot be started is an error, not an exception") {
  testing::FakeLockd lockd({});
  auto client = ConnectTo(lockd, "no-threads");
  std::atomic<int> refusals{1};
  ClientTestPeer::SetTestHook(*client, [&refusals](std::string_view point) {
    if (point == "starting async threads" && refusals.fetch_sub(1) > 0) {
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                              "thread constructor failed");
    }
  });
  std::promise<Result<LockHandle>> got;
  Status st;
  std::string threw;
  try {
    st = client->LockSlotAsync(1, {}, [&](Result<LockHandle> r) { got.set_value(std::move(r)); });
  } catch (const std::exception& e) {
    threw = e.what();
  }
  INFO("threw: " << threw << "; status: " << st.ToString());
  CHECK(threw.empty());
  CHECK(st.code() == ErrorCode::kResource);
  CHECK(ClientTestPeer::BudgetUnits(*client, 1) == 0);
  // Threads can be had again: the next request starts them and is served.
  REQUIRE(client->LockSlotAsync(1, {}, [&](Result<LockHandle> r) { got.set_value(std::move(r)); })
              .ok());
  auto f = got.get_future();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  auto h = f.get();
  CHECK(h.ok());
  ClientTestPeer::SetTestHook(*client, nullptr);
}

// Connect starts the client's keeper and reaper threads; std::thread's exception (no thread to
// be had) went out of Client::Connect, which promises none (found by review, 2026-12-06). The
// test hook throws as std::thread does.
TEST_CASE("connect: a keeper or reaper thread that cannot be started is an error") {
  testing::FakeLockd lockd({});
  const auto hook = [](std::string_view point) {
    if (point == "starting threads") {
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                              "thread constructor failed");
    }
  };
  Result<std::unique_ptr<Client>> c = Error(ErrorCode::kInternal, "not run");
  std::string threw;
  try {
    c = ClientTestPeer::Connect(testing::FakeClientOptions("no-threads"), lockd.connector(), hook);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  INFO("threw: " << threw << "; status: " << c.status().ToString());
  CHECK(threw.empty());
  CHECK(c.status().code() == ErrorCode::kResource);
  // The session it had opened ends with it: another client takes every slot.
  auto other = ConnectTo(lockd, "after");
  CHECK(other->TryLockSlot(0).ok());
}

// Closing a client shuts its async waiters' connections to end their waits at lockd. The waiter
// took its failed wait for the session's end: it ended the session from there, its held locks
// were told "session with lockd ended" (kLockLost) on that waiter thread, not "client closed" on
// the closing thread as client.h says, and the keeper could open a new session while the client
// closed (found by review, 2026-12-08).
TEST_CASE(
    "async: closing a client whose request waits at lockd tells its locks 'client closed' "
    "on the closing thread, and opens no session") {
  testing::FakeLockd lockd({});
  auto holder = ConnectTo(lockd, "holder");
  auto held = holder->LockSlot(5, {});
  REQUIRE(held.ok());
  std::atomic<bool> closing{false};
  std::atomic<int> opened_while_closing{0};
  Connector inner = lockd.connector();
  Connector counted = [&closing, &opened_while_closing, inner](
                          const ChannelParams& p, uint32_t* retry_ms, proto::RejectReason* reason) {
    if ((p.flags & proto::kFlagJoin) == 0 && closing.load()) ++opened_while_closing;
    return inner(p, retry_ms, reason);
  };
  auto c = ClientTestPeer::Connect(testing::FakeClientOptions("closing"), counted);
  REQUIRE(c.ok());
  std::unique_ptr<Client> client = std::move(c).value();
  auto mine = client->LockSlot(3, {});
  REQUIRE(mine.ok());
  struct Told {
    std::mutex mu;
    int times = 0;
    Status st;
    std::thread::id tid;
  };
  auto told = std::make_shared<Told>();
  mine->OnLost([told](const Status& st) {
    std::lock_guard lk(told->mu);
    ++told->times;
    told->st = st;
    told->tid = std::this_thread::get_id();
  });
  auto waits = std::make_shared<std::promise<Result<LockHandle>>>();
  auto waits_f = waits->get_future();
  const uint64_t before = lockd.table().Load(5, 0);
  REQUIRE(
      client
          ->LockSlotAsync(5, {}, [waits](Result<LockHandle> r) { waits->set_value(std::move(r)); })
          .ok());
  // The request waits at lockd on a waiter thread (its FA is in the word behind the holder's).
  REQUIRE(WaitFor([&lockd, before] { return lockd.table().Load(5, 0) != before; }));
  std::this_thread::sleep_for(50ms);
  closing.store(true);
  client.reset();
  REQUIRE(waits_f.wait_for(5s) == std::future_status::ready);
  const Status waited = waits_f.get().status();
  std::lock_guard lk(told->mu);
  INFO("the held lock was told " << told->times << " time(s): " << told->st.ToString()
                                 << (told->tid == std::this_thread::get_id()
                                         ? " on the closing thread"
                                         : " on another thread")
                                 << "; the waiting request: " << waited.ToString()
                                 << "; sessions opened while closing: "
                                 << opened_while_closing.load());
  CHECK(told->times == 1);
  CHECK(told->st.code() == ErrorCode::kConnection);
  CHECK_THAT(told->st.message(), Catch::Contains("client closed"));
  CHECK(told->tid == std::this_thread::get_id());
  CHECK(waited.code() == ErrorCode::kConnection);
  CHECK(opened_while_closing.load() == 0);
}
