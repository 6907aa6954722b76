// RDMA integration tests: the handshake and admission. A client connects and reads the info
// page; malformed and wrong-version connect requests, a full server, per-address rate limits,
// per-session connection caps, half-open handshakes (one, and 128 at once) and a join refused for
// want of a device resource are refused with a reason while lockd serves on; connect and
// disconnect cycles leak nothing in lockd.
// Run on rdma_rxe only (tests/rdma/lockd_fixture.h).
#include "rdmalock/proto/handshake.h"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/rdma/verbs.h"
#include "engine/verbs_memory.h"
#include "rdmalock/client.h"
#include "tests/rdma/clients.h"
#include "tests/rdma/lockd_fixture.h"
#include "tests/rdma/raw_peer.h"

using namespace rdmalock;
using namespace rdmalock::rdma_test;
using namespace std::chrono_literals;

namespace {

// lockd's refusal: the control message that ends an exchange (rdma::ExchangeControl).
constexpr uint32_t kRefusal = static_cast<uint32_t>(proto::ControlKind::kRefusal);

size_t OpenFds(pid_t pid) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    ++n;
  }
  return n;
}

uint64_t RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  FAIL("no VmRSS for pid " << pid);
  return 0;
}

}  // namespace

TEST_CASE("handshake: a client connects and reads lockd's info page") {
  Lockd lockd(7601, 4096, 1500);
  auto c = MustConnect(lockd);
  REQUIRE(c->lock_count() == 4096);
  REQUIRE(c->lease() == 1500ms);
  auto info = c->Info();
  REQUIRE(info.ok());
  REQUIRE(info->epoch >= 1);
  REQUIRE(info->lock_count == 4096);
  REQUIRE(info->stall_factor == 2);
  REQUIRE(info->connected_clients >= 1);
  auto h = c->Lock("alpha");
  REQUIRE(h.ok());
  REQUIRE(h->fencing_token() != 0);
  REQUIRE((h->fencing_token() >> 48) == info->epoch);
  REQUIRE(h->Release().ok());
}

TEST_CASE("lockd rejects malformed and wrong-version requests and keeps serving") {
  Lockd lockd(7602);
  const std::string ip = RxeIp();
  auto try_connect = [&](std::vector<uint8_t> data) {
    std::vector<uint8_t> reject;
    auto conn = rdma::ConnectRc(ip, lockd.port(), data, 3s, 4, proto::kControlMessageMax, &reject);
    REQUIRE_FALSE(conn.ok());
    REQUIRE(conn.status().code() == ErrorCode::kRejected);
    proto::RejectReply r;
    REQUIRE(proto::RejectReply::Decode(reject, &r));
    return r.reason;
  };
  proto::ConnectRequest good;
  auto bytes = good.Encode();
  std::vector<uint8_t> v(bytes.begin(), bytes.end());

  auto bad_magic = v;
  bad_magic[0] ^= 0x5a;
  REQUIRE(try_connect(bad_magic) == proto::RejectReason::kBadMagic);
  auto future = v;
  future[proto::ConnectRequest::kVersion] = 42;
  REQUIRE(try_connect(future) == proto::RejectReason::kBadVersion);
  // rdma_cm pads private data with zeros to its maximum, so only a request cut before its length
  // field looks truncated to lockd.
  auto truncated = std::vector<uint8_t>(v.begin(), v.begin() + 6);
  REQUIRE(try_connect(truncated) == proto::RejectReason::kBadLength);
  REQUIRE(try_connect({}) == proto::RejectReason::kBadMagic);  // arrives as 56 zero bytes

  // The SDK turns a reject into a clear message.
  const Status st = RejectStatus("x", std::vector<uint8_t>());
  REQUIRE(st.code() == ErrorCode::kConnection);

  auto c = MustConnect(lockd);
  auto info = c->Info();
  REQUIRE(info.ok());
  REQUIRE(info->rejected_total == 4);
  auto h = c->Lock("still-serving", {.timeout = 2000ms});
  REQUIRE(h.ok());
  REQUIRE(lockd.Log().find("bad magic") != std::string::npos);
}

TEST_CASE("lockd caps connections at max_clients and says so") {
  Lockd lockd(7611, 64, 2000, /*max_clients=*/2);
  // The start-up probe's connection is released asynchronously: allow lockd a moment to see it go.
  auto connect_soon = [&] {
    const auto end = std::chrono::steady_clock::now() + 10s;
    for (;;) {
      auto r = lockd.Connect();
      if (r.ok()) return std::move(r).value();
      REQUIRE(std::chrono::steady_clock::now() < end);
      std::this_thread::sleep_for(50ms);
    }
  };
  auto a = connect_soon();
  auto b = connect_soon();
  auto c = lockd.Connect();
  REQUIRE_FALSE(c.ok());
  REQUIRE(c.status().code() == ErrorCode::kRejected);
  REQUIRE(c.status().message().find("server full") != std::string::npos);
  a.reset();  // a slot frees up once a client leaves
  auto d = connect_soon();
  REQUIRE(d->Info().ok());
}

TEST_CASE("lockd rate-limits connection attempts per address; sessions and their threads go on") {
  const std::string addr = "127.0.0.1:19479";
  Lockd lockd(7645, 256, 2000, 64, "",
              {"--max-connects-per-second", "2", "--metrics-address", addr});
  std::this_thread::sleep_for(1100ms);  // the start-up probe's token comes back
  auto keeper = MustConnect(lockd);
  std::this_thread::sleep_for(1100ms);  // and keeper's
  // A burst of 12 sessions from this address at once, each with a 300 ms connect timeout, less
  // than the 500 ms lockd asks a refused one to wait (no time to wait for the limit): the
  // bucket's 2 tokens are admitted, the rest refused with a reason and a retry time. A client
  // makes its keeper's and reaper's joins inside Connect (they do not count against the rate);
  // one whose joins do not finish within the timeout fails with kTimeout, but its session was
  // admitted: lockd's count of sessions admitted is what is bounded (a handshake that took a
  // token and whose client gave up before its Hello is in no count, so this could miss one
  // admission too many, but never fails a lockd that keeps the limit).
  ClientOptions quick;
  quick.server = RxeIp();
  quick.port = lockd.port();
  quick.connect_timeout = 300ms;
  const double accepted0 = Metric(Scrape(addr), "rdmalock_lockd_handshakes_accepted_total");
  std::mutex mu;
  std::vector<std::unique_ptr<Client>> opened;
  int refused = 0, timed_out = 0, other = 0;
  std::string message, other_message;
  {
    std::vector<std::thread> burst;
    for (int i = 0; i < 12; ++i) {
      burst.emplace_back([&] {
        auto c = Client::Connect(quick);
        std::lock_guard lk(mu);
        if (c.ok()) {
          opened.push_back(std::move(c).value());
        } else if (c.status().code() == ErrorCode::kRejected) {
          message = c.status().message();
          ++refused;
        } else if (c.status().code() == ErrorCode::kTimeout) {
          ++timed_out;
        } else {
          other_message = c.status().ToString();
          ++other;
        }
      });
    }
    for (auto& t : burst) t.join();
  }
  INFO(message << " | opened " << opened.size() << ", refused " << refused << ", timed out "
               << timed_out << ", other: " << other_message);
  REQUIRE(other == 0);
  REQUIRE(refused > 0);
  // 2 tokens, and at most one more refilled while lockd took the burst's handshakes in turn.
  // Counted where they are admitted: a refusal that reached its client after the 300 ms timeout
  // is a kTimeout there too (opened + timed out <= 3 could fail on a slow VM; found by review,
  // 2026-12-06).
  const double admitted =
      Metric(Scrape(addr), "rdmalock_lockd_handshakes_accepted_total") - accepted0;
  REQUIRE(admitted <= 3);
  REQUIRE(static_cast<double>(opened.size()) <= admitted);
  REQUIRE(message.find("too many connection attempts from this address") != std::string::npos);
  // A session's threads join without counting: 8 threads of `keeper` lock at once.
  std::atomic<int> locked{0};
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        auto h = keeper->Lock("limited-" + std::to_string(t), {.timeout = 5000ms});
        if (h.ok() && h->Release().ok()) ++locked;
      });
    }
    for (auto& t : threads) t.join();
  }
  REQUIRE(locked == 8);
  // Client::Connect waits as long as lockd says (within its timeout): it gets in despite the limit.
  auto patient = lockd.Connect();
  REQUIRE(patient.ok());
  REQUIRE((*patient)->Lock("limited-0").ok());
  const std::string page = Scrape(addr);
  REQUIRE(Metric(page, "rdmalock_lockd_handshakes_rejected_total{reason=\"rate_limited\"}") >=
          refused);
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (lockd.Log().find("rate limit: refused") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() < end);  // logged within a second, with a count
    std::this_thread::sleep_for(100ms);
  }
}

TEST_CASE("a client that never completes the handshake is dropped; lockd keeps serving") {
  const std::string addr = "127.0.0.1:19480";
  Lockd lockd(7646, 256, 1000, /*max_clients=*/2, "", {"--metrics-address", addr});
  auto existing = MustConnect(lockd);
  // The fixture's start-up probe leaves asynchronously: until lockd has seen it go, it holds the
  // second place and the half-open client below is refused (found by review, 2026-12-06).
  const auto gone = std::chrono::steady_clock::now() + 10s;
  while (existing->Info()->connected_clients != 1) {
    REQUIRE(std::chrono::steady_clock::now() < gone);
    std::this_thread::sleep_for(50ms);
  }
  auto half = std::make_unique<HalfOpenClient>(RxeIp(), lockd.port());
  REQUIRE(half->rejected() == proto::RejectReason::kNone);
  // It holds a session record: with max_clients 2 and one client connected, the table is full.
  ClientOptions quick;
  quick.server = RxeIp();
  quick.port = lockd.port();
  quick.connect_timeout = 200ms;
  auto refused = Client::Connect(quick);
  REQUIRE_FALSE(refused.ok());
  REQUIRE(refused.status().message().find("server full") != std::string::npos);
  // ... and says that a handshake holds the record (it read "max_clients 2" only).
  INFO(refused.status().message());
  REQUIRE(refused.status().message().find("1 by clients, the rest by handshakes in progress") !=
          std::string::npos);
  // lockd keeps serving the connected client meanwhile.
  for (int i = 0; i < 20; ++i) {
    auto h = existing->Lock("while-half-open", {.timeout = 2000ms});
    REQUIRE(h.ok());
  }
  // Within the establish timeout (5 s) and a tick, lockd ends the half-open session and says why.
  const auto end = std::chrono::steady_clock::now() + 15s;
  while (lockd.Log().find("not established within 5 s of its accept") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(100ms);
  }
  // A handshake that failed, not a session that ended (before 2026-12-06 it counted as a session
  // ended connect_failed).
  const std::string page = Scrape(addr);
  CHECK(Metric(page, "rdmalock_lockd_handshakes_failed_total") == 1);
  CHECK(Metric(page, "rdmalock_lockd_sessions_ended_total{reason=\"connect_failed\"}") == 0);
  auto fresh = lockd.Connect();  // its record is free again
  REQUIRE(fresh.ok());
  REQUIRE((*fresh)->Lock("after-half-open").ok());
}

// 400 cycles: each Connect makes three connections of its session (the application's, the
// keeper's and the reaper's), so lockd sets up and tears down 1,200 connections and 400 sessions.
TEST_CASE("400 connect and disconnect cycles leak no descriptors or memory in lockd") {
  Lockd lockd(7647, 1024, 2000, 64);
  auto cycle = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto c = lockd.Connect();
      REQUIRE(c.ok());
      if (i % 4 == 0) REQUIRE((*c)->Lock("cycle-" + std::to_string(i % 16)).ok());
    }
  };
  cycle(50);  // warm-up: allocator pools, spdlog, rdma_cm caches
  std::this_thread::sleep_for(500ms);
  const size_t fds_before = OpenFds(lockd.pid());
  const uint64_t rss_before = RssKiB(lockd.pid());
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kCycles = 400;
  cycle(kCycles);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Let lockd see the last disconnects and free the last records.
  auto probe = MustConnect(lockd);
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (probe->Info()->connected_clients != 1) {
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(50ms);
  }
  probe.reset();
  std::this_thread::sleep_for(500ms);
  const size_t fds_after = OpenFds(lockd.pid());
  const uint64_t rss_after = RssKiB(lockd.pid());
  WARN(kCycles << " cycles in " << secs << " s; lockd fds " << fds_before << " -> " << fds_after
               << ", RSS " << rss_before << " -> " << rss_after << " KiB");
  REQUIRE(fds_after <= fds_before);
  // A leak of even 1 KiB per cycle would show as 400 KiB (in our runs RSS moved by 0 KiB).
  REQUIRE(rss_after <= rss_before + 256);
}

TEST_CASE(
    "max_connections_per_session: threads past the limit get kResource; the session goes on") {
  const std::string addr = "127.0.0.1:19484";
  Lockd lockd(7658, 1024, 2000, 16, "",
              {"--max-connections-per-session", "4", "--metrics-address", addr});
  auto c = MustConnect(lockd);
  std::atomic<int> ok{0}, limited{0}, other{0};
  std::string other_error;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      auto h = c->Lock("limit-" + std::to_string(i), {.timeout = 5000ms});
      if (h.ok()) {
        ++ok;
        if (!h->Release().ok()) ++other;  // (no REQUIRE off the test's thread)
      } else if (h.status().code() == ErrorCode::kResource &&
                 h.status().message().find("max_connections_per_session") != std::string::npos) {
        ++limited;
      } else {
        std::lock_guard lk(mu);
        other_error = h.status().ToString();
        ++other;
      }
    });
  }
  for (auto& t : threads) t.join();
  INFO(other_error);
  REQUIRE(other == 0);
  REQUIRE(ok >= 1);
  REQUIRE(limited >= 1);
  REQUIRE(ok + limited == 6);
  // The session lives on: a thread that has a connection locks again; lockd counted the refusals.
  REQUIRE(c->Lock("limit-after", {.timeout = 2000ms}).ok());
  // (at least one refused attempt per limited thread)
  REQUIRE(Metric(Scrape(addr),
                 "rdmalock_lockd_handshakes_rejected_total{reason=\"too_many_connections\"}") >=
          limited);
  REQUIRE(c->Stats().sessions_lost == 0);
}

// One address's new sessions may hold at most kMaxNewHandshakesPerAddress (16) of the 128
// handshakes in progress: one host without the key filled all 128 (each lives up to 5 s), so
// every other host's new clients, and new threads of live clients, were refused busy, and its
// half-open sessions took session records (found by review, 2026-12-06). The pool's own cap of
// 128 is checked by the unit test 'admission: a new client with room is admitted; ...' (this VM
// has one address).
TEST_CASE("handshakes in progress: one address's new sessions hold 16; the next is refused busy") {
  const std::string addr = "127.0.0.1:19485";
  Lockd lockd(7659, 1024, 2000, /*max_clients=*/200, "",
              {"--max-connects-per-second", "0", "--metrics-address", addr});
  auto existing = MustConnect(lockd);
  std::vector<std::unique_ptr<HalfOpenClient>> stalled;
  for (int i = 0; i < 16; ++i) {
    stalled.push_back(std::make_unique<HalfOpenClient>(RxeIp(), 7659));
    REQUIRE(stalled.back()->rejected() == proto::RejectReason::kNone);
  }
  ClientOptions quick;
  quick.server = RxeIp();
  quick.port = lockd.port();
  quick.connect_timeout = 300ms;
  auto refused = Client::Connect(quick);
  REQUIRE_FALSE(refused.ok());
  INFO(refused.status().ToString());
  REQUIRE(refused.status().message().find("too many handshakes in progress") != std::string::npos);
  REQUIRE(Metric(Scrape(addr), "rdmalock_lockd_handshakes_rejected_total{reason=\"busy\"}") >= 1);
  // The admitted client is not affected, and a new thread of it joins its session.
  for (int i = 0; i < 20; ++i) REQUIRE(existing->Lock("busy-" + std::to_string(i)).ok());
  Status joined;
  std::thread([&] {
    auto h = existing->Lock("busy-join", {.timeout = 3000ms});
    joined = h.ok() ? h->Release() : h.status();
  }).join();
  INFO("a new thread of the live client: " << joined.ToString());
  REQUIRE(joined.ok());
  // After the establish timeout lockd drops them all, and new clients get in again.
  const auto end = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    auto c = lockd.Connect();
    if (c.ok()) break;
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(200ms);
  }
  REQUIRE(Alive(lockd.pid()));
}

// Found by review, 2026-12-06: a session's joins were exempt from the rate limit and from the
// per-address cap, and nothing bounded how many of one session's were in progress. A client with
// the key (or anyone, with authentication off) could hold all 128 handshakes with join requests
// that never complete, again and again as lockd dropped them after 5 s: every other client's new
// sessions and new threads were refused busy. Now one session has at most 16 joins in progress
// and one address at most 24; the rest are told to retry in 100 ms.
TEST_CASE("one session's joins in progress hold at most 16 handshakes; others still get in") {
  Lockd lockd(7696, 64, 2000, 64, "", {"--heartbeat-timeout-ms", "20000"});
  auto owner = RawChannel(lockd, "join-hog");
  const uint64_t session = owner->reply().session_id;
  const uint64_t key = owner->reply().join_key;
  std::vector<std::unique_ptr<HalfOpenClient>> joins;
  int accepted = 0, busy = 0, other = 0;
  for (int i = 0; i < 24; ++i) {
    joins.push_back(std::make_unique<HalfOpenClient>(RxeIp(), lockd.port(), session, key));
    const auto r = joins.back()->rejected();
    if (r == proto::RejectReason::kNone) {
      ++accepted;
    } else if (r == proto::RejectReason::kBusy) {
      ++busy;
    } else {
      ++other;
    }
  }
  INFO("24 half-open joins of one session: " << accepted << " accepted, " << busy << " busy, "
                                             << other << " other");
  CHECK(other == 0);
  CHECK(accepted == 16);
  CHECK(busy == 8);
  // Another client connects, and its new threads join, meanwhile.
  auto c = MustConnect(lockd);
  Status joined;
  std::thread([&] {
    auto h = c->Lock("beside-the-hog", {.timeout = 3000ms});
    joined = h.ok() ? h->Release() : h.status();
  }).join();
  INFO("a new thread of another client: " << joined.ToString());
  CHECK(joined.ok());
}

// Issue 17 finding 4: a join lockd cannot serve for want of a device resource (here a memory
// window) was refused as `internal`, which the SDK took as fatal for the whole session: the new
// thread's failure cost the locks every other thread held.
TEST_CASE(
    "issue 17 finding 4: a join refused for want of device resources costs only that thread") {
  Lockd lockd(7671);
  auto c = MustConnect(lockd);
  auto held = c->Lock("f4-held", {.timeout = 2000ms});
  REQUIRE(held.ok());
  MemoryWindowHog hog;
  INFO("memory windows taken from the device: " << hog.taken());
  REQUIRE(hog.taken() > 0);
  rdmalock::Status other_status;
  std::thread([&] {
    auto h = c->Lock("f4-other", {.timeout = 3000ms});
    other_status = h.ok() ? rdmalock::Status::Ok() : h.status();
  }).join();
  INFO("the new thread's Lock: " << other_status.ToString());
  CHECK(other_status.code() == ErrorCode::kResource);
  CHECK(held->state() == LockState::kHeld);
  CHECK(c->Stats().sessions_lost == 0);
  hog.Free();
  // The windows back: another client finds the lock held, and a new thread of c works.
  auto other = MustConnect(lockd);
  auto busy = other->TryLock("f4-held");
  CHECK(busy.status().code() == ErrorCode::kBusy);
  rdmalock::Status after;
  std::thread([&] {
    auto h = c->Lock("f4-other", {.timeout = 3000ms});
    after = h.ok() ? h->Release() : h.status();
  }).join();
  INFO("a new thread's Lock once the windows are back: " << after.ToString());
  CHECK(after.ok());
  CHECK(held->Release().ok());
}

TEST_CASE(
    "protocol versions: lockd answers a client of version 5, 6 or 7 in its own version, and "
    "serves it") {
  // A version-5 client writes no tagged record entries, the only change of version 6; a
  // version-6 one no tagged shared entries, which version 8 added (version 7 moved the byte-order
  // probe). lockd serves them all: the challenge and the Welcome carry the client's version (an
  // SDK refuses any other than its own). A request of this version is answered in it.
  Lockd lockd(7673);
  const std::string ip = RxeIp();
  for (const uint16_t version : {uint16_t{5}, uint16_t{6}, uint16_t{7}, proto::kProtocolVersion}) {
    INFO("client version " << version);
    proto::ConnectRequest req;
    req.version = version;
    req.client_name = std::string(1, 'v').append(
        std::to_string(version));  // not "v" + ...: GCC 12 -O3 -Wrestrict
    const auto bytes = req.Encode();
    std::vector<uint8_t> reject, reply;
    auto conn = rdma::ConnectRc(ip, lockd.port(), bytes, 3s, 4, proto::kControlMessageMax, &reject);
    REQUIRE(conn.ok());
    proto::Challenge ch;
    REQUIRE(proto::Challenge::Decode((*conn)->accept_data, &ch));
    CHECK(ch.version == version);
    proto::Hello h;
    h.version = version;
    const auto hello = h.Encode();
    uint32_t kind = 0;
    REQUIRE(rdma::ExchangeControl(conn->get(), hello,
                                  static_cast<uint32_t>(proto::ControlKind::kHello), kRefusal, 3s,
                                  &reply, &kind)
                .ok());
    REQUIRE(kind == static_cast<uint32_t>(proto::ControlKind::kWelcome));
    proto::AcceptReply welcome;
    REQUIRE(proto::AcceptReply::Decode(reply, &welcome));
    CHECK(welcome.version == version);
    CHECK(welcome.session_id != 0);
  }
}

// A session's first connection is counted when lockd posts its Welcome. A Welcome whose SEND then
// failed (the client's receive too small here; a peer that posts none fails it the same way)
// dropped only the connection: the session, with no connection left and none to come, lingered in
// the table, holding a record and a max_clients place, until its heartbeat timed out (found by
// review, 2026-12-06). It ends when its last connection goes.
TEST_CASE("a session whose first Welcome fails ends with it, not at its heartbeat timeout") {
  Lockd lockd(7636, 64, 1000, 64, "", {"--heartbeat-timeout-ms", "20000"});
  const std::string ip = RxeIp();
  proto::ConnectRequest req;
  req.client_name = "welcome-fails";
  const auto bytes = req.Encode();
  std::vector<uint8_t> reject, reply;
  // A receive of 128 bytes: the Welcome does not fit.
  auto conn = rdma::ConnectRc(ip, lockd.port(), bytes, 3s, 4, 128, &reject);
  REQUIRE(conn.ok());
  const auto hello = proto::Hello{}.Encode();
  uint32_t kind = 0;
  const Status st =
      rdma::ExchangeControl(conn->get(), hello, static_cast<uint32_t>(proto::ControlKind::kHello),
                            kRefusal, 3s, &reply, &kind);
  INFO("the client's side: " << st.ToString());
  CHECK_FALSE(st.ok());
  WaitForLog(lockd, "handshake send failed");
  // The connection is kept open: only lockd's own handling can end the session.
  const auto end = std::chrono::steady_clock::now() + 5s;
  std::string clients;
  for (;;) {
    clients = Capture(Lockctl(lockd) + " clients").second;
    if (clients.find("welcome-fails") == std::string::npos) break;
    if (std::chrono::steady_clock::now() > end) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO("lockctl clients, 5 s after the Welcome failed:\n" << clients);
  CHECK(clients.find("welcome-fails") == std::string::npos);
  CHECK(lockd.Log().find("ended: handshake failed") != std::string::npos);
}

TEST_CASE("a refusal is the answer at once, even while the hello's SEND is unacknowledged") {
  // The client's side of a handshake whose hello was never acknowledged (rdma_rxe under TCG has
  // left one so for seconds; after a refusal lockd fences the QP, so no retransmission could
  // ever be acknowledged). UnreceivingPeer posts no receive, so the hello's SEND never
  // completes, and answers it unasked. Before rdma::ExchangeControl took a refusal as final, the
  // exchange waited for that completion and timed out without the refusal's reason.
  const std::string ip = RxeIp();
  const uint32_t kHello = static_cast<uint32_t>(proto::ControlKind::kHello);
  proto::Hello hello;
  const auto hello_bytes = hello.Encode();
  // Connects to the peer on `port` (the connection in *conn, kept open until the peer has seen
  // its answer delivered) and sends it the hello: the exchange's outcome.
  auto hello_to = [&](uint16_t port, std::chrono::milliseconds timeout,
                      std::unique_ptr<rdma::ActiveConnection>* conn, std::vector<uint8_t>* reply,
                      uint32_t* kind) {
    std::vector<uint8_t> reject;
    auto c = rdma::ConnectRc(ip, port, {}, 3s, 4, proto::kControlMessageMax, &reject);
    INFO(c.status().ToString());
    REQUIRE(c.ok());
    *conn = std::move(c).value();
    return rdma::ExchangeControl(conn->get(), hello_bytes, kHello, kRefusal, timeout, reply, kind);
  };
  {
    proto::RejectReply refusal;
    refusal.reason = proto::RejectReason::kAuthFailed;
    refusal.detail = "wrong key";
    UnreceivingPeer peer(ip, 7692, kRefusal, refusal.Encode());
    std::unique_ptr<rdma::ActiveConnection> conn;
    std::vector<uint8_t> reply;
    uint32_t kind = 0;
    const Status st = hello_to(7692, 3s, &conn, &reply, &kind);
    INFO(st.ToString());
    REQUIRE(st.ok());
    REQUIRE(kind == kRefusal);
    proto::RejectReply r;
    REQUIRE(proto::RejectReply::Decode(reply, &r));
    REQUIRE(r.reason == proto::RejectReason::kAuthFailed);
    const Status served = peer.Wait();
    INFO(served.ToString());
    REQUIRE(served.ok());
  }
  {
    // A welcome in the same position is not final: the connection is used on, so the SEND's
    // completion is still awaited, and the timeout names what is missing.
    proto::AcceptReply welcome;
    UnreceivingPeer peer(ip, 7693, static_cast<uint32_t>(proto::ControlKind::kWelcome),
                         welcome.Encode());
    std::unique_ptr<rdma::ActiveConnection> conn;
    std::vector<uint8_t> reply;
    uint32_t kind = 0;
    const Status st = hello_to(7693, 1s, &conn, &reply, &kind);
    INFO(st.ToString());
    REQUIRE(st.code() == ErrorCode::kTimeout);
    REQUIRE(st.message().find("hello was not acknowledged") != std::string::npos);
    REQUIRE(peer.Wait().ok());
  }
}

TEST_CASE("a connection attempt takes no longer than its connect timeout in all") {
  // Found by review (2026-12-06): each step of a connection (address, route, the accept) and then
  // the hello's exchange got the whole connect_timeout, so a lockd that accepted late and then
  // went silent held a connect, a join or a try-lock's first use of a thread for up to twice it
  // (four times, with slow resolution). A peer stands in for that lockd: it accepts 1.4 s after
  // the request, with a challenge, and never answers the hello.
  const std::string ip = RxeIp();
  proto::Challenge challenge;
  const auto challenge_bytes = challenge.Encode();
  UnreceivingPeer peer(ip, 7694, 0, {}, 1400ms, challenge_bytes);
  ChannelParams p;
  p.host = ip;
  p.port = 7694;
  p.connect_timeout = 2000ms;
  p.client_name = "deadline-test";
  const auto t0 = std::chrono::steady_clock::now();
  auto mem = VerbsMemory::Connect(p, nullptr, nullptr);
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  INFO("connect with a 2000 ms timeout: " << (mem.ok() ? "ok" : mem.status().ToString())
                                          << " after " << took << " ms");
  CHECK_FALSE(mem.ok());
  CHECK(took < 3000);  // 3.4 s and more before: the accept's 1.4 s, then the hello's whole 2 s
  CHECK(peer.Wait().ok());
}

TEST_CASE("a Welcome not delivered keeps its handshake counted until it is, or is dropped") {
  // Found by review (2026-12-06): a connection's handshake stopped counting when its Welcome was
  // posted. A peer that posts no receive leaves the Welcome in RNR retry without end, so any
  // number of connections could each hold work requests that a QP error flushes into the device
  // CQ, which kMaxHandshakes (128) sizes: past it the CQ overflows (rdma_rxe drops completions;
  // a hardware CQ overrun stops every handshake until lockd restarts). Now the handshake is over
  // when the Welcome completes: new sessions from one address beyond kMaxNewHandshakesPerAddress
  // (16) are told to retry, and a Welcome not delivered within 5 s is dropped with its session
  // (the heartbeat timeout is longer here, so that it is the drop that ends them).
  Lockd lockd(7637, 64, 1000, 64, "", {"--heartbeat-timeout-ms", "20000"});
  const std::string ip = RxeIp();
  std::vector<std::unique_ptr<DeafClient>> deaf;
  for (int i = 0; i < 16; ++i) {
    deaf.push_back(std::make_unique<DeafClient>(ip, lockd.port(), "deaf-" + std::to_string(i)));
    INFO("deaf client " << i << " refused: " << proto::RejectReasonName(deaf.back()->rejected()));
    REQUIRE(deaf.back()->rejected() == proto::RejectReason::kNone);
  }
  DeafClient seventeenth(ip, lockd.port(), "deaf-16");
  INFO("the 17th new session from this address while 16 Welcomes are undelivered: "
       << (seventeenth.rejected() == proto::RejectReason::kNone
               ? std::string("admitted")
               : "refused: " + std::string(proto::RejectReasonName(seventeenth.rejected()))));
  CHECK(seventeenth.rejected() == proto::RejectReason::kBusy);
  // Within kEstablishTimeout (5 s) and a tick they are dropped, and their sessions end.
  WaitForLog(lockd, "took no delivery of its welcome");
  const auto end = std::chrono::steady_clock::now() + 10s;
  std::string clients;
  for (;;) {
    clients = Capture(Lockctl(lockd) + " clients").second;
    if (clients.find("deaf-") == std::string::npos) break;
    if (std::chrono::steady_clock::now() > end) break;
    std::this_thread::sleep_for(200ms);
  }
  INFO("lockctl clients after the drop:\n" << clients);
  CHECK(clients.find("deaf-") == std::string::npos);
  // A client that receives its Welcome is served as ever.
  auto c = MustConnect(lockd);
  CHECK(c->Lock("after-deaf", {.timeout = 2s}).ok());
}
