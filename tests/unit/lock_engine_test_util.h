// What the engine's unit tests share (lock_engine_test.cc, lock_engine_records_test.cc,
// lock_engine_batch_test.cc): engine parameters, a reaper of abandoned tickets, the word of a
// slot, failure collection for worker threads, recorded clients and channels, and lockd's reaping
// of a record.
//
// Threads: a Reaper and ThreadChecks may be used from many threads (their vectors are guarded
// by their mutex); Reaper::DrainAll, ReapRecord and QueueExclusive REQUIRE, so only the test's
// thread calls them.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/lock_engine.h"
#include "rdmalock/proto/layout.h"
#include "tests/support/inproc_memory.h"

namespace rdmalock::engine_test {

using proto::Word0;

inline EngineParams Params(uint64_t locks,
                           std::chrono::nanoseconds lease = std::chrono::seconds(10)) {
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

inline Word0 W0(InProcessTable& t, uint64_t slot) { return Word0::Decode(t.Load(slot, 0)); }

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

// Three clients' channels on one table of 4 locks. Client A's record is at byte 4096 of the
// sessions region, and `o` records a request in its entry 0 (TEST_CASE_METHOD's fixture: each
// run of a test case, section by section, gets a fresh one).
struct RecordedClients {
  static constexpr uint64_t rec = 4096;  // client A's record
  InProcessTable table{4, 4 * 4096};
  LockEngine e{Params(4), nullptr};
  InProcessMemory a{&table}, b{&table}, c{&table};
  AcquireOptions o = [] {
    AcquireOptions x;
    x.record = rec + proto::SessionRecord::EntryOffset(0);
    x.record_seq = 1;
    return x;
  }();
};

// A channel whose requests all use one record entry (byte `record` of the sessions region),
// each with the next use's seq, as the SDK's entry pool hands them out. Acquire REQUIREs the
// grant.
struct RecordedChannel {
  RecordedChannel(InProcessTable* t, uint64_t record) : mem(t) { o.record = record; }
  InProcessMemory mem;
  AcquireOptions o;
  uint32_t seq = 0;  // the last use's
  uint32_t NextSeq() { return seq = proto::RequestEntry::NextSeq(seq); }
  Grant Acquire(const LockEngine& e, uint64_t slot, Mode mode = Mode::kExclusive) {
    o.record_seq = NextSeq();
    auto g = e.Acquire(mem, slot, mode, o);
    REQUIRE(g.ok());
    return *g;
  }
};

// The record entry at byte `off` of the sessions region, if it is an open request
// (RequestEntry::DecodeLive).
inline bool LiveEntryAt(InProcessTable& table, uint64_t off, proto::RequestEntry* out) {
  return proto::RequestEntry::DecodeLive(
      table.session_word(off).load(), table.session_word(off + 8).load(),
      table.session_word(off + proto::RequestEntry::kDone).load(), out);
}

// Steps lockd's reap of `r` until it is done; REQUIREs every step to succeed.
inline void ReapToEnd(const LockEngine& e, InProcessMemory& mem, ReapState& r) {
  for (int step = 0; step < 1000; ++step) {
    auto done = e.Reap(mem, r);
    REQUIRE(done.ok());
    if (*done) return;
  }
}

// What lockd does with a fenced client's record: steps Reap() on every live entry until done.
inline int ReapRecord(InProcessTable& table, const LockEngine& e, uint64_t base) {
  InProcessMemory mem(&table);
  int released = 0;
  for (uint32_t i = 0; i < proto::SessionRecord::kMaxEntries; ++i) {
    proto::RequestEntry entry;
    if (!LiveEntryAt(table, base + proto::SessionRecord::EntryOffset(i), &entry)) continue;
    if (entry.state != proto::RequestEntry::State::kQueued) continue;
    ReapState r = ReapState::ForEntry(entry);
    r.NoteScan(table.Load(entry.slot, 1));
    ReapToEnd(e, mem, r);
    if (r.outcome == ReapState::Outcome::kReleased) ++released;
  }
  return released;
}

// Queues an exclusive request on `slot` as a waiting Acquire leaves it: returns its ticket.
inline Word0 QueueExclusive(InProcessMemory& m, uint64_t slot) {
  RemoteOp fa =
      RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(slot), proto::kAcquireExclusive);
  REQUIRE(m.Execute(fa).ok());
  return Word0::Decode(fa.result[0]);
}

// Record entries for requests that take one each (LockEngine::EntrySource): round the session
// record's kMaxEntries slots, each with the next sequence number.
class EntryCycle {
 public:
  LockEngine::EntrySource Source() {
    return [this] {
      const uint32_t i = next_++ % proto::SessionRecord::kMaxEntries;
      return std::pair<uint64_t, uint32_t>{proto::SessionRecord::EntryOffset(i), next_};
    };
  }

 private:
  uint32_t next_ = 0;
};

// Word1 (the generation) from a READ torn across a reset that took a slot's generation from
// 0x..ff to 0x..00: bytes copied in ascending order, as rdma_rxe copies them, so the
// generation's low byte comes from before the reset and the bytes above it from after: the READ
// shows 0x..ff again on top of the new value, 255 past the word's. Every READ of the lock table
// through the channel is torn so, in `result` or `into`.
inline void TearGenerations(RemoteOp& op) {
  if (op.region != RegionId::kLocks) return;
  uint64_t* w = op.into != nullptr ? op.into : op.result;
  for (uint64_t i = 0; i < op.length / 8; ++i) {
    if ((op.offset + 8 * i) % proto::kSlotSize != proto::kWord1Offset) continue;
    const uint64_t gen = proto::Generation(w[i]);
    if (gen != 0 && (gen & 0xff) == 0) w[i] |= uint64_t{0xff} * proto::kGenerationIncrement;
  }
}

}  // namespace rdmalock::engine_test
