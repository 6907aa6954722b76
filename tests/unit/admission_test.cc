// lockd's admission parts that need no verbs: the refusal log's throttle.
#include <catch2/catch.hpp>
#include <string>

#include "server/refusal_log.h"

using rdmalock::lockd::RefusalLog;

TEST_CASE("refusal log: one line a second per address and reason") {
  RefusalLog log(16);
  const auto t0 = RefusalLog::Clock::now();
  CHECK(log.ShouldLog("10.0.0.1/auth", t0));
  CHECK_FALSE(log.ShouldLog("10.0.0.1/auth", t0 + std::chrono::milliseconds(999)));
  CHECK(log.ShouldLog("10.0.0.1/not_allowed", t0));
  CHECK(log.ShouldLog("10.0.0.2/auth", t0));
  CHECK(log.ShouldLog("10.0.0.1/auth", t0 + std::chrono::seconds(1)));
}

// Issue 17 finding 3: one more key than the table tracks made the throttle forget its table and
// then write through the iterator it had taken before (heap-use-after-free under ASan; a stray
// write into freed memory otherwise). Reachable by an unauthenticated peer with many addresses.
TEST_CASE("issue 17 finding 3: the refusal log stays bounded and sound past its capacity") {
  constexpr size_t kCap = 64;
  RefusalLog log(kCap);
  const auto t0 = RefusalLog::Clock::now();
  for (size_t i = 0; i < 4 * kCap + 1; ++i) {
    const std::string key =
        "10.1." + std::to_string(i / 256) + "." + std::to_string(i % 256) + "/auth";
    CHECK(log.ShouldLog(key, t0));
    REQUIRE(log.tracked() <= kCap);
  }
  // The key logged last is remembered: its next refusal within the second is not logged again.
  const std::string last =
      "10.1." + std::to_string((4 * kCap) / 256) + "." + std::to_string((4 * kCap) % 256) + "/auth";
  CHECK_FALSE(log.ShouldLog(last, t0 + std::chrono::milliseconds(10)));
}

// ---- Admission's decisions (server/admission.h): plain facts in, a verdict out.

#include "server/admission.h"

namespace {

using rdmalock::lockd::Admission;
using rdmalock::lockd::ConnectFacts;
using rdmalock::lockd::Verdict;
using rdmalock::proto::RejectReason;

rdmalock::lockd::Config AdmissionConfig(uint32_t max_clients = 2) {
  rdmalock::lockd::Config c;
  c.max_connects_per_second = 3;
  c.max_clients = max_clients;
  c.max_connections_per_session = 2;
  return c;
}

// A new client from an allowed address, with room for it.
ConnectFacts NewClient(const std::string& peer = "10.0.0.1:5000") {
  ConnectFacts f;
  f.peer = peer;
  f.address_allowed = true;
  f.records_free = true;
  f.client_records_free = true;
  return f;
}

}  // namespace

TEST_CASE("admission: a new client with room is admitted; the caps refuse with a reason") {
  Admission a(AdmissionConfig(), {}, {});
  const auto now = Admission::Clock::now();
  CHECK(a.Decide(NewClient("10.0.0.1:1"), now).admitted());

  ConnectFacts full = NewClient("10.0.0.2:1");
  full.connected = 2;
  Verdict v = a.Decide(full, now);
  CHECK(v.reason == RejectReason::kServerFull);
  CHECK(v.detail == "max_clients 2");
  full.connected = 0;
  full.records_free = full.client_records_free = false;
  // Records held by handshakes in progress (reserved at accept, before the Hello proves the key):
  // the refusal says so, not only "max_clients 2" with no client connected (found by review,
  // 2026-12-08).
  v = a.Decide(full, now);
  CHECK(v.reason == RejectReason::kServerFull);
  CHECK(v.detail ==
        "max_clients 2; records taken: 0 by clients, the rest by handshakes in progress (5 s max)");
  // It fits RejectReply's detail whole, at the largest max_clients and clients connected.
  Admission most(AdmissionConfig(rdmalock::lockd::kMaxClientsLimit), {}, {});
  full.connected = rdmalock::lockd::kMaxClientsLimit - 1;
  CHECK(most.Decide(full, now).detail.size() < rdmalock::proto::RejectReply::kDetailLen);

  ConnectFacts busy = NewClient("10.0.0.3:1");
  busy.handshakes = rdmalock::lockd::kMaxHandshakes;
  v = a.Decide(busy, now);
  CHECK(v.reason == RejectReason::kBusy);
  CHECK(v.retry_after_ms == 100);
}

// A request that does not decode is refused with what was wrong with it, for lockd's log (an
// empty detail before; found by review, 2026-12-08).
TEST_CASE("admission: a malformed request is refused with what is wrong with it") {
  Admission a(AdmissionConfig(), {}, {});
  ConnectFacts f = NewClient("10.0.0.4:1");
  f.decoded = RejectReason::kBadLength;
  f.decoded_why = "unknown flags 0x10";
  const Verdict v = a.Decide(f, Admission::Clock::now());
  CHECK(v.reason == RejectReason::kBadLength);
  CHECK(v.detail == "unknown flags 0x10");
}

// One address's new sessions hold at most kMaxNewHandshakesPerAddress of the handshakes in
// progress (found by review, 2026-12-06; RDMA test 'handshakes in progress: one address's new
// sessions hold 16; the next is refused busy'); a live session's joins from it are not held back.
TEST_CASE("admission: one address's new sessions' handshakes are capped; its joins are not") {
  Admission a(AdmissionConfig(), {}, {});
  const auto now = Admission::Clock::now();
  ConnectFacts f = NewClient("10.0.0.4:1");
  f.new_handshakes_from_address = rdmalock::lockd::kMaxNewHandshakesPerAddress - 1;
  CHECK(a.Decide(f, now).admitted());
  f.peer = "10.0.0.4:2";
  f.new_handshakes_from_address = rdmalock::lockd::kMaxNewHandshakesPerAddress;
  Verdict v = a.Decide(f, now);
  CHECK(v.reason == RejectReason::kBusy);
  CHECK(v.retry_after_ms == 100);
  CHECK(v.detail.find("from this address") != std::string::npos);
  ConnectFacts j = f;
  j.peer = "10.0.0.4:3";
  j.join = true;
  j.join_session = 17;
  j.join_valid = true;
  j.join_session_conns = 1;
  CHECK(a.Decide(j, now).admitted());
}

// Eight addresses (aliases of one host, or addresses of one IPv6 /64) without the key, 16 new
// sessions' handshakes each, took all 128 handshakes in progress, and a live session's new
// thread (a join with a valid key) was refused busy for as long as they kept it up (found by
// review, 2026-12-06). New sessions' handshakes leave room for joins.
TEST_CASE("admission: new sessions' handshakes from many addresses leave room for joins") {
  rdmalock::lockd::Config c = AdmissionConfig();
  c.max_connects_per_second = 1000;  // within the rate: only the handshake caps count here
  Admission a(c, {}, {});
  const auto now = Admission::Clock::now();
  size_t handshakes = 0;
  for (int addr = 0; addr < 16; ++addr) {
    for (size_t from_addr = 0;; ++from_addr) {
      ConnectFacts f =
          NewClient("10.0.1." + std::to_string(addr) + ":" + std::to_string(from_addr));
      f.handshakes = handshakes;
      f.new_handshakes_from_address = from_addr;
      if (!a.Decide(f, now).admitted()) break;
      ++handshakes;
    }
  }
  INFO(handshakes << " new sessions' handshakes admitted");
  CHECK(handshakes < rdmalock::lockd::kMaxHandshakes);
  ConnectFacts j = NewClient("10.0.2.1:1");
  j.join = true;
  j.join_session = 17;
  j.join_valid = true;
  j.join_session_conns = 1;
  for (size_t joins = 0; joins < rdmalock::lockd::kHandshakesKeptForJoins; ++joins) {
    j.handshakes = handshakes + joins;
    INFO("join " << joins);
    REQUIRE(a.Decide(j, now).admitted());
  }
  j.handshakes = rdmalock::lockd::kMaxHandshakes;  // the CQ's budget still bounds them all
  CHECK(a.Decide(j, now).reason == RejectReason::kBusy);
}

// A session's joins skip the rate limit and the new sessions' caps: one session's join requests
// that never complete held all 128 handshakes in progress (found by review, 2026-12-06; RDMA
// test 'one session's joins in progress hold at most 16 handshakes; others still get in').
TEST_CASE("admission: one session's joins in progress, and one address's, are capped") {
  Admission a(AdmissionConfig(), {}, {});
  const auto now = Admission::Clock::now();
  ConnectFacts j = NewClient("10.0.0.9:1");
  j.join = true;
  j.join_session = 17;
  j.join_valid = true;
  j.join_session_conns = 1;
  j.join_handshakes_of_session = rdmalock::lockd::kMaxJoinHandshakesPerSession - 1;
  j.join_handshakes_from_address = rdmalock::lockd::kMaxJoinHandshakesPerAddress - 1;
  CHECK(a.Decide(j, now).admitted());
  j.join_handshakes_of_session = rdmalock::lockd::kMaxJoinHandshakesPerSession;
  Verdict v = a.Decide(j, now);
  CHECK(v.reason == RejectReason::kBusy);
  CHECK(v.retry_after_ms == 100);
  CHECK(v.detail.find("joins of session 17 in progress") != std::string::npos);
  j.join_handshakes_of_session = 0;
  j.join_handshakes_from_address = rdmalock::lockd::kMaxJoinHandshakesPerAddress;
  v = a.Decide(j, now);
  CHECK(v.reason == RejectReason::kBusy);
  CHECK(v.detail.find("joins in progress from this address") != std::string::npos);
  // An invalid join is refused as before (bad session), not told to retry.
  j.join_valid = false;
  CHECK(a.Decide(j, now).reason == RejectReason::kBadSession);
}

TEST_CASE("admission: joins are checked against their session and its connection cap") {
  Admission a(AdmissionConfig(), {}, {});
  const auto now = Admission::Clock::now();
  ConnectFacts j = NewClient();
  j.join = true;
  j.join_session = 17;
  j.join_valid = true;
  j.join_session_conns = 1;
  j.records_free = false;  // a join needs no record
  CHECK(a.Decide(j, now).admitted());
  j.join_session_conns = 2;
  Verdict v = a.Decide(j, now);
  CHECK(v.reason == RejectReason::kTooManyConnections);
  CHECK(v.detail == "session 17 has 2 connections");
  j.join_valid = false;
  v = a.Decide(j, now);
  CHECK(v.reason == RejectReason::kBadSession);
  CHECK(v.detail == "session 17");
}

TEST_CASE("admission: the loopback flag needs its proof; allow_from comes before the rate") {
  Admission a(AdmissionConfig(), {}, {});
  const auto now = Admission::Clock::now();
  ConnectFacts f = NewClient();
  f.flagged_loopback = true;
  Verdict v = a.Decide(f, now);
  CHECK(v.reason == RejectReason::kNotAllowed);
  CHECK(v.detail == "the loopback flag from a peer that is not this lockd");
  // Proven: admitted as the loopback even when max_clients is reached and outside allow_from.
  f.loopback_proven = true;
  f.address_allowed = false;
  f.connected = 2;
  v = a.Decide(f, now);
  CHECK(v.admitted());
  CHECK(v.loopback);

  ConnectFacts outside = NewClient("192.0.2.9:1");
  outside.address_allowed = false;
  const size_t tracked = a.tracked_peers();
  for (int i = 0; i < 10; ++i) {  // never reaches the rate limiter: no bucket for it
    v = a.Decide(outside, now);
    CHECK(v.reason == RejectReason::kNotAllowed);
    CHECK(v.detail == "not in allow_from");
  }
  CHECK(a.tracked_peers() == tracked);
}

// Found by review (2026-12-06): with kMaxTrackedPeers addresses tracked (each at most once
// every 10 s keeps its bucket), any further address was let through without a limit.
TEST_CASE("admission: with the rate limiter's table full, a new address is still limited") {
  Admission a(AdmissionConfig(), {}, {});  // 3 attempts a second per address
  const auto now = Admission::Clock::now();
  for (size_t i = 0;
       a.tracked_peers() < Admission::kMaxTrackedPeers && i < 2 * Admission::kMaxTrackedPeers;
       ++i) {
    (void)a.Decide(NewClient("10." + std::to_string(i / 65536) + "." +
                             std::to_string(i / 256 % 256) + "." + std::to_string(i % 256) + ":1"),
                   now);
  }
  REQUIRE(a.tracked_peers() == Admission::kMaxTrackedPeers);
  int admitted = 0;
  for (int i = 0; i < 100; ++i) {
    if (a.Decide(NewClient("192.0.2.77:" + std::to_string(i)), now).admitted()) ++admitted;
  }
  CHECK(admitted <= 3);
}

// Found by review (2026-12-05): lockd's own loopback went through the caps meant for clients.
// Peers' handshakes filling every slot refused it kBusy (at start lockd then exited: it cannot
// run without it; running, its recovery could not reconnect, and dead clients' locks waited for
// the waiters' F x L), and so did the rate limit. Clients could also take the record it needs
// while it held none (handshakes in progress are not counted in `connected`).
TEST_CASE("admission: lockd's loopback is not crowded out by handshakes, the rate or clients") {
  Admission a(AdmissionConfig(), {}, {});
  const auto now = Admission::Clock::now();
  ConnectFacts lb = NewClient("10.0.0.5:1");
  lb.flagged_loopback = true;
  lb.loopback_proven = true;
  lb.handshakes = rdmalock::lockd::kMaxHandshakes;  // peers' handshakes fill every slot
  Verdict v = a.Decide(lb, now);
  INFO(v.detail);
  CHECK(v.admitted());
  lb.handshakes = 0;
  for (int i = 0; i < 10; ++i) {  // past the rate of 3 a second
    v = a.Decide(lb, now);
    CHECK(v.admitted());
  }
  // The last free record is kept for the loopback while it holds none: a client is refused it.
  ConnectFacts c = NewClient("10.0.0.6:1");
  c.client_records_free = false;
  CHECK(a.Decide(c, now).reason == RejectReason::kServerFull);
  lb.client_records_free = false;
  CHECK(a.Decide(lb, now).admitted());
}

TEST_CASE("admission: the rate limit per address, its retry time, and a valid join exempt") {
  Admission a(AdmissionConfig(), {}, {});  // 3 a second
  const auto t0 = Admission::Clock::now();
  for (int i = 0; i < 3; ++i)
    CHECK(a.Decide(NewClient("10.0.0.1:" + std::to_string(i)), t0).admitted());
  Verdict v = a.Decide(NewClient("10.0.0.1:9"), t0);
  CHECK(v.reason == RejectReason::kRateLimited);
  CHECK_FALSE(v.log);              // the limiter logs its own refusals, once a second with a count
  CHECK(v.retry_after_ms == 334);  // one token at 3 a second
  // Another address has its own bucket.
  CHECK(a.Decide(NewClient("10.0.0.2:1"), t0).admitted());
  // A thread joining its session with the right key is not counted.
  ConnectFacts j = NewClient("10.0.0.1:10");
  j.join = true;
  j.join_valid = true;
  CHECK(a.Decide(j, t0).admitted());
  // A join with a bad key is counted (and refused by the rate first).
  j.join_valid = false;
  CHECK(a.Decide(j, t0).reason == RejectReason::kRateLimited);
  // A second later the bucket has refilled.
  CHECK(a.Decide(NewClient("10.0.0.1:11"), t0 + std::chrono::seconds(1)).admitted());
  // Idle for over 10 s: forgotten by the tick.
  a.Tick(t0 + std::chrono::seconds(12));
  CHECK(a.tracked_peers() == 0);
  // 0 a second: no limit at all.
  auto c = AdmissionConfig();
  c.max_connects_per_second = 0;
  Admission unlimited(c, {}, {});
  for (int i = 0; i < 50; ++i) CHECK(unlimited.RateLimit("10.0.0.1:1", t0) == 0);
}

TEST_CASE("admission: the restart grace refuses clients but not the loopback, with the time left") {
  const auto t0 = Admission::Clock::now();
  Admission a(AdmissionConfig(), {}, t0 + std::chrono::milliseconds(500));
  Verdict v = a.Decide(NewClient(), t0);
  CHECK(v.reason == RejectReason::kGrace);
  CHECK(v.retry_after_ms == 501);
  CHECK(v.detail == "lockd restarted after an unclean stop; retry in 501 ms");
  ConnectFacts lb = NewClient("10.0.0.2:1");
  lb.flagged_loopback = lb.loopback_proven = true;
  CHECK(a.Decide(lb, t0).admitted());
  CHECK(a.Decide(NewClient("10.0.0.3:1"), t0 + std::chrono::milliseconds(500)).admitted());
  // A request that does not decode is refused with its own reason (after the rate, before grace).
  ConnectFacts bad = NewClient("10.0.0.4:1");
  bad.decoded = RejectReason::kBadVersion;
  CHECK(a.Decide(bad, t0).reason == RejectReason::kBadVersion);
}
