// server/session_table: sessions, their records, liveness ticks and ending, over records in
// plain memory and times passed in (no verbs).
#include "server/session_table.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "rdmalock/proto/layout.h"

using namespace rdmalock;
using namespace rdmalock::lockd;
using std::chrono::milliseconds;

namespace {

// Zeroed records, 8-byte aligned like lockd's mapping.
struct Records {
  std::vector<uint64_t> words;
  explicit Records(uint32_t n) : words(uint64_t{n} * proto::kSessionRecordSize / 8, 0) {}
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
};

void Put64(uint8_t* rec, size_t off, uint64_t v) { std::memcpy(rec + off, &v, 8); }
uint64_t Get64(const uint8_t* rec, size_t off) {
  uint64_t v;
  std::memcpy(&v, rec + off, 8);
  return v;
}

// Writes entry `i` of a record as a client would.
void PutEntry(uint8_t* rec, uint32_t i, const proto::RequestEntry& e, uint64_t done = 0) {
  const auto w = e.Encode();
  const uint64_t off = proto::SessionRecord::EntryOffset(i);
  Put64(rec, off, w[0]);
  Put64(rec, off + 8, w[1]);
  Put64(rec, off + proto::RequestEntry::kDone, done);
}

proto::RequestEntry Entry(uint32_t slot, proto::RequestEntry::State st, uint32_t seq,
                          proto::Word0 ticket = {}) {
  proto::RequestEntry e;
  e.slot = slot;
  e.state = st;
  e.seq = seq;
  e.ticket = ticket.Encode();
  return e;
}

const auto kNoQpError = [](rdma_cm_id*) { return false; };
// A connection's key in Session::conns (nothing here looks at what it points to).
rdma_cm_id* FakeId(uintptr_t n) { return reinterpret_cast<rdma_cm_id*>(n * 0x1000); }

// A client's session, admitted (counted) and in the table, with connections `conns`.
std::shared_ptr<Session> Admitted(SessionTable& t, SessionTable::Clock::time_point at,
                                  std::set<rdma_cm_id*> conns) {
  auto s = t.Allocate("a:1", "x", 1, false, {}, at);
  s->counted = true;
  s->conns = std::move(conns);
  t.Insert(s);
  return s;
}

}  // namespace

TEST_CASE("session table: records are handed out, written, and freed for reuse") {
  Records mem(2);
  SessionTable t(mem.data(), 2, 64);
  const auto now = SessionTable::Clock::now();
  const auto wall = std::chrono::system_clock::now();
  auto a = t.Allocate("10.0.0.1:1", "alpha", 11, false, wall, now);
  CHECK(a->index == 0);
  CHECK(a->session_id >= (uint64_t{1} << 24));
  CHECK(a->session_id < (uint64_t{1} << 53));
  CHECK((a->join_key & 1) == 1);
  t.Insert(a);
  auto b = t.Allocate("10.0.0.2:1", "beta", 12, false, wall, now);
  CHECK(b->index == 1);
  CHECK_FALSE(t.has_free_record());
  // A failed accept gives the record back without entering the table.
  t.Release(*b);
  CHECK(t.has_free_record());
  CHECK(t.size() == 1);
  CHECK(t.Find(a->session_id) == a);
  CHECK(t.Find(b->session_id) == nullptr);
  CHECK(t.JoinMatches(a->session_id, a->join_key));
  CHECK_FALSE(t.JoinMatches(a->session_id, a->join_key + 2));
  CHECK_FALSE(t.JoinMatches(99, a->join_key));

  const auto rec = proto::SessionRecord::DecodeFrom(
      std::span<const uint8_t>(t.RecordAt(a->index), proto::kSessionRecordSize));
  CHECK(rec.session_id == a->session_id);
  CHECK(rec.pid == 11);
  CHECK(rec.name == "alpha");
  CHECK(rec.peer == "10.0.0.1:1");

  auto ended = t.End(*a);
  REQUIRE(ended);
  CHECK(ended->items.empty());
  CHECK_FALSE(t.End(*a));  // ended once only
  CHECK(t.size() == 0);
  // Its record is zero again and the next session gets it.
  CHECK(Get64(t.RecordAt(0), 0) == 0);
  auto c = t.Allocate("10.0.0.3:1", "gamma", 13, false, wall, now);
  CHECK(c->index == 0);
  CHECK(c->session_id == a->session_id + 2);  // ids are never reused
}

// The last free record is lockd's loopback's while it holds none (admission_test.cc has why).
TEST_CASE("session table: one record is kept for the loopback while it holds none") {
  Records mem(3);
  SessionTable t(mem.data(), 3, 64);
  const auto now = SessionTable::Clock::now();
  const auto wall = std::chrono::system_clock::now();
  auto a = t.Allocate("10.0.0.1:1", "alpha", 11, false, wall, now);
  t.Insert(a);
  CHECK(t.has_free_client_record());
  auto b = t.Allocate("10.0.0.2:1", "beta", 12, false, wall, now);
  t.Insert(b);
  CHECK(t.has_free_record());
  CHECK_FALSE(t.has_free_client_record());  // the last one: the loopback's
  auto lb = t.Allocate("10.0.0.9:1", "lockd", 1, true, wall, now);
  CHECK_FALSE(t.has_free_record());
  t.Release(*lb);  // its accept failed: the reserve is back
  CHECK_FALSE(t.has_free_client_record());
  lb = t.Allocate("10.0.0.9:1", "lockd", 1, true, wall, now);
  t.Insert(lb);
  CHECK(t.End(*a));  // with the loopback holding one, a freed record is a client's
  CHECK(t.has_free_client_record());
  CHECK(t.End(*lb));  // the loopback gone: two free, one of them kept for it
  CHECK(t.has_free_client_record());
  t.Insert(t.Allocate("10.0.0.3:1", "gamma", 13, false, wall, now));
  CHECK(t.has_free_record());
  CHECK_FALSE(t.has_free_client_record());
}

TEST_CASE("session table: ending reads the record's live requests, then zeroes it") {
  Records mem(1);
  SessionTable t(mem.data(), 1, 64);
  auto s = t.Allocate("p:1", "n", 1, false, {}, SessionTable::Clock::now());
  t.Insert(s);
  uint8_t* rec = t.RecordAt(s->index);
  using St = proto::RequestEntry::State;
  PutEntry(rec, 0, Entry(5, St::kQueued, 1, proto::Word0{0, 2, 0, 1}));
  PutEntry(rec, 1, Entry(6, St::kRequesting, 2));
  PutEntry(rec, 2, Entry(7, St::kQueued, 3), /*done=*/3);    // over: not freed again
  PutEntry(rec, 3, Entry(500, St::kQueued, 4));              // a slot past lock_count: garbage
  Put64(rec, proto::SessionRecord::EntryOffset(4), 0x1234);  // torn: garbage
  auto ended = t.End(*s);
  REQUIRE(ended);
  REQUIRE(ended->items.size() == 1);
  CHECK(ended->items[0].ticket.slot == 5);
  CHECK(ended->items[0].ticket.word == proto::Word0{0, 2, 0, 1});
  CHECK(ended->requesting == 1);
  CHECK(ended->garbage == 2);
  for (size_t off = 0; off < proto::kSessionRecordSize; off += 8) REQUIRE(Get64(rec, off) == 0);
}

TEST_CASE("session table: a silent heartbeat ends an admitted session after the timeout") {
  Records mem(3);
  SessionTable t(mem.data(), 3, 64);
  const auto t0 = SessionTable::Clock::now();
  const auto wall = std::chrono::system_clock::now();
  auto live = t.Allocate("a:1", "live", 1, false, wall, t0);
  auto silent = t.Allocate("b:1", "silent", 2, false, wall, t0);
  auto loopback = t.Allocate("c:1", "lockd", 3, true, wall, t0);
  for (auto& s : {live, silent, loopback}) {
    s->counted = true;
    t.Insert(s);
  }
  const milliseconds timeout(1000);
  uint64_t hb = 0;
  for (int ms = 250; ms <= 1000; ms += 250) {
    Put64(t.RecordAt(live->index), proto::SessionRecord::kHeartbeat, ++hb);
    CHECK(t.CheckLiveness(t0 + milliseconds(ms), wall, timeout, false, kNoQpError).empty());
  }
  // lockd saw the live one's heartbeat move: it stamps the record for operators.
  CHECK(Get64(t.RecordAt(live->index), proto::SessionRecord::kHeartbeatSeenUnixNs) ==
        static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(wall.time_since_epoch()).count()));
  Put64(t.RecordAt(live->index), proto::SessionRecord::kHeartbeat, ++hb);
  auto dead = t.CheckLiveness(t0 + milliseconds(1001), wall, timeout, false, kNoQpError);
  REQUIRE(dead.size() == 1);
  CHECK(dead[0].session == silent);
  CHECK(dead[0].reason == EndReason::kHeartbeatTimeout);
  CHECK(dead[0].why == "no heartbeat for 1001 ms (heartbeat_timeout_ms 1000)");
  // The check only reports: ending is the caller's.
  CHECK(t.size() == 3);

  // A session not yet admitted (no rkey, so no heartbeat expected) is not judged by it.
  silent->counted = false;
  CHECK(t.CheckLiveness(t0 + milliseconds(5000), wall, timeout, false, kNoQpError).size() == 1);
}

TEST_CASE("session table: a QP in error at two checks in a row ends the session") {
  Records mem(1);
  SessionTable t(mem.data(), 1, 64);
  const auto t0 = SessionTable::Clock::now();
  auto s = Admitted(t, t0, {FakeId(1)});
  bool in_error = true;
  auto qp = [&](rdma_cm_id*) { return in_error; };
  const milliseconds timeout(60000);
  CHECK(t.CheckLiveness(t0, {}, timeout, true, qp).empty());   // first sighting
  CHECK(t.CheckLiveness(t0, {}, timeout, false, qp).empty());  // not a QP check: no change
  auto dead = t.CheckLiveness(t0, {}, timeout, true, qp);      // second in a row
  REQUIRE(dead.size() == 1);
  CHECK(dead[0].reason == EndReason::kQpError);
  // One sighting, then a healthy check, then one again: not two in a row.
  s->qp_errors_seen.clear();
  CHECK(t.CheckLiveness(t0, {}, timeout, true, qp).empty());
  in_error = false;
  CHECK(t.CheckLiveness(t0, {}, timeout, true, qp).empty());
  in_error = true;
  CHECK(t.CheckLiveness(t0, {}, timeout, true, qp).empty());
}

// Two sightings in a row were counted per session, not per QP: one join's QP in ERR at one check
// (its disconnect request arrived before its DISCONNECTED event, then it went) and another
// join's at the next fenced a live session whose threads come and go (found by review,
// 2026-12-06). Only one QP in error at two checks in a row ends it.
TEST_CASE("session table: two joins each in error at one check do not end the session") {
  Records mem(1);
  SessionTable t(mem.data(), 1, 64);
  const auto t0 = SessionTable::Clock::now();
  rdma_cm_id* const a = FakeId(2);
  rdma_cm_id* const b = FakeId(3);
  auto s = Admitted(t, t0, {FakeId(1), a, b});
  std::set<rdma_cm_id*> in_error{a};
  auto qp = [&](rdma_cm_id* id) { return in_error.count(id) != 0; };
  const milliseconds timeout(60000);
  CHECK(t.CheckLiveness(t0, {}, timeout, true, qp).empty());  // a in ERR: first sighting
  s->conns.erase(a);                                          // a's DISCONNECTED: it went
  in_error = {b};                                             // b closes in its turn
  CHECK(t.CheckLiveness(t0, {}, timeout, true, qp).empty());  // b's first sighting
  auto dead = t.CheckLiveness(t0, {}, timeout, true, qp);     // b's second: it stayed in ERR
  REQUIRE(dead.size() == 1);
  CHECK(dead[0].reason == EndReason::kQpError);
}

// The same with the connections' keys reused: a connection's id is freed once it goes, and a new
// join's id can take its address; a sighting of the old one must not count for the new (found by
// reviewing the fix above).
TEST_CASE("session table: a new join at a gone join's address starts its sightings afresh") {
  Records mem(1);
  SessionTable t(mem.data(), 1, 64);
  const auto t0 = SessionTable::Clock::now();
  rdma_cm_id* const a = FakeId(2);
  auto s = Admitted(t, t0, {FakeId(1), a});
  bool in_error = true;
  auto qp = [&](rdma_cm_id* id) { return id == a && in_error; };
  const milliseconds timeout(60000);
  CHECK(t.CheckLiveness(t0, {}, timeout, true, qp).empty());  // a in ERR: first sighting
  s->ForgetConn(a);                                           // a's DISCONNECTED: it went
  s->conns.insert(a);  // a new join, its id where a's was, closing in its turn
  CHECK(t.CheckLiveness(t0, {}, timeout, true, qp).empty());  // its first sighting
}

// lockd's loopback session was skipped by the liveness checks altogether: it writes no heartbeat,
// but its QP in error (with no DISCONNECTED event) left the session, and its record, for the
// rest of the run. The recovery thread then reconnected as a second loopback session, which
// took the record kept for the loopback from clients (found by review, 2026-12-06). Now a
// loopback's QP in error ends it as a client's does; a silent heartbeat still never does.
TEST_CASE("session table: a loopback session's QP in error ends it; its silence does not") {
  Records mem(2);
  SessionTable t(mem.data(), 2, 64);
  const auto t0 = SessionTable::Clock::now();
  auto lb = t.Allocate("lockd", "loopback", 1, true, {}, t0);
  lb->counted = true;
  lb->conns = {FakeId(1)};
  t.Insert(lb);
  bool in_error = false;
  auto qp = [&](rdma_cm_id*) { return in_error; };
  const milliseconds timeout(1000);
  CHECK(t.CheckLiveness(t0 + milliseconds(5000), {}, timeout, true, qp).empty());  // silent
  in_error = true;
  CHECK(t.CheckLiveness(t0 + milliseconds(5000), {}, timeout, true, qp).empty());  // first
  auto dead = t.CheckLiveness(t0 + milliseconds(5000), {}, timeout, true, qp);
  REQUIRE(dead.size() == 1);
  CHECK(dead[0].session == lb);
  CHECK(dead[0].reason == EndReason::kQpError);
}

TEST_CASE("session table: the holders of a slot are the sessions whose granted request shows") {
  Records mem(2);
  SessionTable t(mem.data(), 2, 64);
  const auto t0 = SessionTable::Clock::now();
  auto holder = t.Allocate("a:1", "h", 1, false, {}, t0);
  auto waiter = t.Allocate("b:1", "w", 2, false, {}, t0);
  t.Insert(holder);
  t.Insert(waiter);
  using St = proto::RequestEntry::State;
  // Slot 9's word after two exclusive requests, none released: the first (ticket 0) holds.
  const proto::Word0 now{0, 2, 0, 0};
  PutEntry(t.RecordAt(holder->index), 0, Entry(9, St::kQueued, 1, proto::Word0{0, 0, 0, 0}));
  PutEntry(t.RecordAt(waiter->index), 0, Entry(9, St::kQueued, 1, proto::Word0{0, 1, 0, 0}));
  auto h = t.HoldersOf(9, now, 0);
  REQUIRE(h.size() == 1);
  CHECK(h[0] == holder);
  CHECK(t.HoldersOf(8, now, 0).empty());
  // After the first released, the second holds.
  auto h2 = t.HoldersOf(9, proto::Word0{0, 2, 0, 1}, 0);
  REQUIRE(h2.size() == 1);
  CHECK(h2[0] == waiter);
}

TEST_CASE("session table: a tagged entry names its session a holder only in its generation") {
  // A released exclusive request's tagged entry stays in the record (no done mark). After a reset
  // another session holds a ticket with the same numbers: lockd must not name the first session
  // (a forced release of the slot would fence it), nor free its entry when it ends.
  Records mem(2);
  SessionTable t(mem.data(), 2, 64);
  const auto t0 = SessionTable::Clock::now();
  auto done = t.Allocate("a:1", "old", 1, false, {}, t0);
  auto holder = t.Allocate("b:1", "new", 2, false, {}, t0);
  t.Insert(done);
  t.Insert(holder);
  using St = proto::RequestEntry::State;
  proto::RequestEntry old = Entry(9, St::kQueued, 1, proto::Word0{0, 0, 0, 0});
  old.tagged = true;
  old.generation = 4;  // released in generation 4
  proto::RequestEntry now_e = Entry(9, St::kQueued, 1, proto::Word0{0, 0, 0, 0});
  now_e.tagged = true;
  now_e.generation = 5;  // holds ticket 0 of generation 5
  PutEntry(t.RecordAt(done->index), 0, old);
  PutEntry(t.RecordAt(holder->index), 0, now_e);
  const proto::Word0 w0{0, 1, 0, 0};
  const uint64_t word1 = uint64_t{5} << 16;
  auto h = t.HoldersOf(9, w0, word1);
  REQUIRE(h.size() == 1);
  CHECK(h[0] == holder);
  // Ended, the record's entry is handed over with its tag (the reap compares it).
  auto rec = t.End(*done);
  REQUIRE(rec.has_value());
  REQUIRE(rec->items.size() == 1);
  CHECK(rec->items[0].ticket.tagged);
  CHECK(rec->items[0].ticket.generation == 4);
}

// A shared entry is tagged too (protocol version 8), but its release writes its done mark, and its
// tag may be older than its grant's: a hint, or another reader's renewal that carried the
// generation since. A live session's reader is named a holder by its numbers, whatever its tag.
TEST_CASE("session table: a reader is named a holder by its numbers, whatever its tag") {
  Records mem(1);
  SessionTable t(mem.data(), 1, 64);
  auto reader = t.Allocate("a:1", "reader", 1, false, {}, SessionTable::Clock::now());
  t.Insert(reader);
  proto::RequestEntry e = Entry(9, proto::RequestEntry::State::kQueued, 2, proto::Word0{});
  e.mode = proto::Mode::kShared;
  e.tagged = true;
  e.generation = 4;  // the slot is in 5 now (a carry)
  PutEntry(t.RecordAt(reader->index), 0, e);
  const proto::Word0 w0{.max_s = 2, .max_x = 0, .n_s = 0, .n_x = 0};  // two readers hold
  auto h = t.HoldersOf(9, w0, uint64_t{5} << 16);
  REQUIRE(h.size() == 1);
  CHECK(h[0] == reader);
}

// Session ids began at 1 on every start of lockd (tests/rdma/lockctl_test.cc has the forced
// release that fenced another client after a restart).
TEST_CASE("session table: each run of lockd starts its session ids somewhere else, below 2^53") {
  std::set<uint64_t> starts;
  for (int i = 0; i < 64; ++i) {
    const uint64_t first = SessionTable::FirstSessionId();
    CHECK(first >= (uint64_t{1} << 24));
    CHECK(first < (uint64_t{1} << 53));
    CHECK(first % (uint64_t{1} << 24) == 0);
    starts.insert(first);
  }
  CHECK(starts.size() == 64);  // 64 draws of 2^29 - 1: a repeat has probability 4e-6
}
