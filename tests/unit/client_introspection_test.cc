// Client::Sessions() (behind `lockctl clients` and `inspect`) over the in-process backend and the
// test lockd (tests/support/fake_lockd.h): what a session's record shows, checked against the lock
// words. Issue 19, item 3: an exclusive release of a tagged entry writes no done mark, so the
// record keeps the finished request; Sessions() must not show it.
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <vector>

#include "client/src/client_test_peer.h"
#include "rdmalock/client.h"
#include "rdmalock/proto/lock_word.h"
#include "tests/support/fake_lockd.h"

using namespace rdmalock;
using namespace std::chrono_literals;

namespace {

// This client's own session, as Sessions() shows it.
SessionInfo Mine(Client& c) {
  auto all = c.Sessions();
  INFO(all.status().ToString());
  REQUIRE(all.ok());
  for (const SessionInfo& s : *all) {
    if (s.session_id == c.session_id()) return s;
  }
  FAIL("Sessions() does not list the client's own session");
  return {};
}

// A test lockd of 8 locks and one client of it.
struct IntrospectedLockd {
  testing::FakeLockd lockd{[] {
    testing::FakeLockd::Options fo;
    fo.lock_count = 8;
    return fo;
  }()};
  std::unique_ptr<Client> connected;  // after lockd: destroyed first
  Client& Connected() {
    auto c = ClientTestPeer::Connect(testing::FakeClientOptions("introspect"), lockd.connector());
    REQUIRE(c.ok());
    connected = std::move(*c);
    return *connected;
  }
};

}  // namespace

TEST_CASE_METHOD(IntrospectedLockd,
                 "sessions: a released exclusive lock's tagged entry is not shown; a held one is") {
  Client& client = Connected();
  // Twice each: the first request READs word1 (without a token too), the second is tagged from
  // what the session learned.
  for (const bool token : {true, false}) {
    INFO("fencing token " << token);
    LockOptions lo;
    lo.fencing_token = token;
    for (int i = 0; i < 2; ++i) {
      auto h = client.LockSlot(5, lo);
      REQUIRE(h.ok());
      const SessionInfo held = Mine(client);
      REQUIRE(held.requests.size() == 1);
      CHECK(held.requests[0].slot == 5);
      CHECK(held.requests[0].status == RequestInfo::Status::kHolding);
      REQUIRE(h->Release().ok());
      REQUIRE(client.Flush().ok());  // the posted release has landed
      CHECK(Mine(client).requests.empty());
    }
  }
}

// A shared entry is tagged too (protocol version 8), but its release writes its done mark, so its
// tag says nothing of whether it is over: a reader whose slot's generation moved on under it
// (another reader's renewal carried it) still holds, and is shown holding.
TEST_CASE_METHOD(IntrospectedLockd,
                 "sessions: a reader whose slot's generation moved on under it is shown holding") {
  Client& client = Connected();
  LockOptions lo;
  lo.mode = LockMode::kShared;
  lo.auto_renew = false;  // a renewal would write the entry again with the new generation
  auto h = client.LockSlot(5, lo);
  REQUIRE(h.ok());
  // A carry into the generation, as the 65,536th renewal of the slot makes.
  lockd.table().Store(5, 1, lockd.table().Load(5, 1) + rdmalock::proto::kGenerationIncrement);
  const SessionInfo held = Mine(client);
  REQUIRE(held.requests.size() == 1);
  CHECK(held.requests[0].slot == 5);
  CHECK(held.requests[0].status == RequestInfo::Status::kHolding);
  REQUIRE(h->Release().ok());
  REQUIRE(client.Flush().ok());
  CHECK(Mine(client).requests.empty());
}
