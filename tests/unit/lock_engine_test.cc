// The protocol engine over the in-process backend: many threads, shadow checks, and the branches
// of the protocol driven deterministically (acquire, release, FIFO, withdrawal, wrap-around,
// frozen words, stall recovery, renewal). Records: lock_engine_records_test.cc; posted releases
// and sets: lock_engine_batch_test.cc; randomized stress: lock_engine_stress_test.cc.
#include "engine/lock_engine.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "client/src/entry_pool.h"
#include "rdmalock/proto/layout.h"
#include "tests/support/inproc_memory.h"
#include "tests/unit/lock_engine_test_util.h"

using namespace rdmalock;
using namespace std::chrono_literals;
using proto::Word0;
using namespace rdmalock::engine_test;

TEST_CASE("uncontended exclusive acquire is one FETCH_AND_ADD, release one more") {
  InProcessTable table(16);
  LockEngine e(Params(16), nullptr);
  InProcessMemory mem(&table);
  auto g = e.Acquire(mem, 3, Mode::kExclusive, {});
  REQUIRE(g.ok());
  REQUIRE(mem.counters().Total() == 1);
  REQUIRE(e.Release(mem, *g).ok());
  REQUIRE(mem.counters().Total() == 2);
  REQUIRE(W0(table, 3) == Word0{.max_s = 0, .max_x = 1, .n_s = 0, .n_x = 1});
}

TEST_CASE("a release that misses because a request queued since the grant counts one miss") {
  // The release CAS compares against the word as the grant last saw it; a request queued after
  // that makes it miss, and the release takes again from what the miss returned (one more round
  // trip, counted in EngineEvents::release_misses, which lockctl bench prints).
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory holder(&table), other(&table);
  EngineEvents ev;
  auto g = e.Acquire(holder, 1, Mode::kExclusive, {}, &ev);
  REQUIRE(g.ok());
  REQUIRE(e.Release(holder, *g, &ev).ok());
  REQUIRE(ev.release_misses.get() == 0);
  auto g2 = e.Acquire(holder, 1, Mode::kExclusive, {}, &ev);
  REQUIRE(g2.ok());
  QueueExclusive(other, 1);  // queued after the grant was seen
  const uint64_t before = holder.counters().Total();
  REQUIRE(e.Release(holder, *g2, &ev).ok());
  REQUIRE(ev.release_misses.get() == 1);
  REQUIRE(holder.counters().Total() - before == 2);  // the CAS that missed and the one that took
  REQUIRE(W0(table, 1) == Word0{.max_s = 0, .max_x = 3, .n_s = 0, .n_x = 2});
}

TEST_CASE("item 3: a recorded uncontended exclusive pair costs three operations once warm") {
  // FA, the entry's WRITE and the release CAS. The session's first request on a slot knows no
  // generation: it READs word1 in the FA's doorbell (4 operations, no done mark); from then on
  // what it learned tags the entry (3).
  InProcessTable table(16, 4096);
  LockEngine e(Params(16), nullptr);
  RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
  auto pair = [&]() {
    const Grant g = ch.Acquire(e, 3);
    CHECK(g.ticket.tagged);
    REQUIRE(e.Release(ch.mem, g).ok());
  };
  const OpCounters& c = ch.mem.counters();
  pair();
  CHECK(c.Total() == 4);
  CHECK(c.read.get() == 1);   // word1, with the FA
  CHECK(c.write.get() == 1);  // the entry; no done mark
  for (int i = 0; i < 100; ++i) pair();
  CHECK(c.Total() == 4 + 300);
  CHECK(c.fetch_add.get() == 101);
  CHECK(c.read.get() == 1);
  CHECK(c.write.get() == 101);
  CHECK(c.compare_swap.get() == 101);
  // The entry names the slot's generation.
  proto::RequestEntry en;
  REQUIRE(proto::RequestEntry::Decode(table.session_word(ch.o.record).load(),
                                      table.session_word(ch.o.record + 8).load(), &en));
  CHECK(en.tagged);
  CHECK(en.generation == 0);
}

TEST_CASE("item 3: after a reset the hint is not trusted, and the entry gets the new generation") {
  InProcessTable table(1, 4096);
  LockEngine e(Params(1), nullptr);
  RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
  InProcessMemory& mem = ch.mem;
  // Tickets well into generation 0, so that a reset makes the FA's count go down.
  table.Store(0, 0, Word0{.max_s = 0, .max_x = 100, .n_s = 0, .n_x = 100}.Encode());
  REQUIRE(e.Release(mem, ch.Acquire(e, 0)).ok());  // READs word1: tagged, generation 0
  Grant g = ch.Acquire(e, 0);                      // tagged from what the first learned
  REQUIRE(g.ticket.tagged);
  CHECK(mem.counters().read.get() == 1);
  REQUIRE(e.Release(mem, g).ok());
  // Another client's reset (generation 1), and this channel asks again at once.
  table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
  table.Store(0, 0, 0);
  Grant g2 = ch.Acquire(e, 0);
  // The FA's count (0) is below the hint's (100), and no READ was in the doorbell: the request
  // READs word1 after its FA (one round trip) and is tagged with generation 1 (protocol version
  // 8; untagged before, a stale entry lockd would read in whatever generation it found). Its
  // release writes no done mark.
  CHECK(g2.ticket.tagged);
  CHECK(g2.ticket.generation == 1);
  CHECK(mem.counters().read.get() == 2);
  const uint64_t writes = mem.counters().write.get();
  REQUIRE(e.Release(mem, g2).ok());
  CHECK(mem.counters().write.get() == writes);  // an exclusive tagged release: no done mark
  // The next request is tagged from what that READ learned.
  Grant g3 = ch.Acquire(e, 0);
  CHECK(g3.ticket.tagged);
  CHECK(g3.ticket.generation == 1);
  CHECK(mem.counters().read.get() == 2);
  REQUIRE(e.Release(mem, g3).ok());
}

namespace {
// Issues one recorded request on slot 0 of `table` in `mode` (IssueMany, which does not wait),
// the frozen-word rescuer's reset (a generation bump, then word0 zeroed) landing between its FA and
// its READ of the slot's words; returns what was issued.
Issued IssueWithResetUnder(InProcessTable& table, const LockEngine& e, RecordedChannel& ch,
                           Mode mode) {
  bool rescued = false;
  ch.mem.set_hook([&](const RemoteOp& op) {
    if (!rescued && op.kind == RemoteOp::Kind::kRead && op.region == RegionId::kLocks) {
      rescued = true;
      table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
      table.Store(0, 0, 0);
    }
    return true;
  });
  const ManyRequest one[] = {{0, mode, false}};
  const uint32_t seq = ch.NextSeq();
  const LockEngine::EntrySource take = [&] {
    return std::pair<uint64_t, uint32_t>{ch.o.record, seq};
  };
  auto q = e.IssueMany(ch.mem, one, false, take, nullptr);
  ch.mem.set_hook(nullptr);
  REQUIRE(rescued);
  REQUIRE(q.ok());
  return (*q)[0];
}
}  // namespace

// A waiting ticket in a word at or near freezing may have the word reset under it at once: a
// rescuer that has timed the frozen word since before our FA (the last tickets before the freeze
// withdrew, which unfroze it for our FA, and it froze again) resets it as soon as its F x L is up.
// A READ after our FA then shows the next generation over our numbers, and an entry tagged with it
// would be read by lockd as a ticket of that generation once its counts got there (found by
// review, 2026-12-07: first for a ticket whose own FA froze the word, then for one beside it).
// Such an entry is tagged with a generation lockd never sees; a ticket whose FA found the word
// drained is not at risk, and keeps the READ's.
TEST_CASE(
    "item 3: a waiting ticket in a word near freezing is never tagged with a generation "
    "read after its FA") {
  const uint16_t last = proto::kCountMax - 1;
  // A writer holds ticket kCountMax - 2, the word one exclusive ticket short of frozen; or a
  // reader holds, and a reader is granted at once beside it, but not alone: the writer that
  // froze the word behind the first can withdraw, and the rescue then reset it under the second.
  const Word0 writer_holds{.max_s = 0, .max_x = last, .n_s = 0, .n_x = last - 1};
  const Word0 reader_holds{.max_s = 1, .max_x = last, .n_s = 0, .n_x = last};
  struct Case {
    const char* what;
    Mode mode;
    Word0 word;
    bool granted;
  };
  const Case cases[] = {
      {"exclusive, behind a writer (its FA freezes the word)", Mode::kExclusive, writer_holds,
       false},
      {"shared, behind a writer", Mode::kShared, writer_holds, false},
      {"shared, granted at once beside a reader", Mode::kShared, reader_holds, true},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    InProcessTable table(1, 4096);
    LockEngine e(Params(1), nullptr);
    RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
    table.Store(0, 0, c.word.Encode());
    const Issued q = IssueWithResetUnder(table, e, ch, c.mode);
    REQUIRE(q.granted == c.granted);
    const Ticket& t = q.grant.ticket;
    INFO("tag " << t.generation << ", the slot's " << proto::Generation(table.Load(0, 1))
                << "; ticket max_x " << t.word.max_x << ", max_s " << t.word.max_s);
    CHECK(t.tagged);
    CHECK(t.generation != proto::RequestEntry::GenerationOf(table.Load(0, 1)));
  }
  SECTION("granted at once on a drained word: the READ's generation") {
    InProcessTable table(1, 4096);
    LockEngine e(Params(1), nullptr);
    RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
    table.Store(0, 1, 3 * proto::kGenerationIncrement);
    table.Store(0, 0, Word0{.max_s = 0, .max_x = last, .n_s = 0, .n_x = last}.Encode());
    const Grant g = ch.Acquire(e, 0);  // its FA freezes the word; nothing is ahead of it
    CHECK(g.ticket.tagged);
    CHECK(g.ticket.generation == 3);
    REQUIRE(e.Release(ch.mem, g).ok());
  }
}

// A try-lock loop on a held lock: each try takes its increment back. The session's hint counts
// the tickets before its FA, so the next try is still covered and READs nothing (with its own FA
// counted, every try after the first missed and READ word1 again: found by review, 2026-12-07).
TEST_CASE("item 3: a try-lock loop on a held lock READs word1 once") {
  InProcessTable table(1, 4096);
  LockEngine e(Params(1), nullptr);
  RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
  InProcessMemory holder(&table);
  auto held = e.Acquire(holder, 0, Mode::kExclusive, {});
  REQUIRE(held.ok());
  for (int i = 0; i < 4; ++i) {
    AcquireOptions o = ch.o;
    o.record_seq = ch.NextSeq();
    o.try_only = true;
    auto g = e.Acquire(ch.mem, 0, i % 2 == 0 ? Mode::kExclusive : Mode::kShared, o);
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == ErrorCode::kBusy);
  }
  CHECK(ch.mem.counters().read.get() == 1);  // the first try's block READ
  REQUIRE(e.Release(holder, *held).ok());
}

TEST_CASE("item 3: a waiter whose entry has an older generation writes it again with its grant's") {
  // The one case the FA's count cannot show: the word was reset since the session learned its
  // generation, and its counters climbed back past the hint's. The entry goes out tagged with
  // the older generation (lockd would ignore it: safe, but no fast recovery). A request that
  // waits sees word1 with its grant and writes the entry again, on its own channel, before its
  // release. A reader too (its entry is tagged since protocol version 8).
  for (const Mode mode : {Mode::kExclusive, Mode::kShared}) {
    CAPTURE(mode == Mode::kExclusive ? "exclusive" : "shared");
    InProcessTable table(1, 4096);
    LockEngine e(Params(1), nullptr);
    RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
    InProcessMemory other(&table);
    REQUIRE(e.Release(ch.mem, ch.Acquire(e, 0)).ok());  // learns generation 0, count 0
    // A reset, and 5 tickets of the new generation: another client holds the 5th.
    table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
    table.Store(0, 0, Word0{.max_s = 0, .max_x = 4, .n_s = 0, .n_x = 4}.Encode());
    auto held = e.Acquire(other, 0, Mode::kExclusive, {});
    REQUIRE(held.ok());
    bool released = false;
    std::thread releaser([&] {
      std::this_thread::sleep_for(20ms);
      released = e.Release(other, *held).ok();
    });
    const Grant g = ch.Acquire(e, 0, mode);
    releaser.join();
    CHECK(released);
    CHECK(g.ticket.tagged);
    CHECK(g.ticket.generation == 1);
    proto::RequestEntry en;
    REQUIRE(proto::RequestEntry::Decode(table.session_word(ch.o.record).load(),
                                        table.session_word(ch.o.record + 8).load(), &en));
    CHECK(en.tagged);
    CHECK(en.generation == 1);
    CHECK(en.seq == g.ticket.record_seq);
    CHECK(en.mode == mode);
    REQUIRE(e.Release(ch.mem, g).ok());
  }
}

TEST_CASE("giving up: a request granted while it gives up writes its entry live again") {
  // A try-lock (or a timeout) whose holder releases just as it gives its ticket up: the
  // withdrawal's doorbell marks the entry done before its CAS (a withdrawn ticket must never look
  // live), the CAS misses because the word moved, and the ticket turns out granted. The caller
  // gets the lock; until 2026-12-03 its record then showed no live request for it, so were the
  // client to die holding it, lockd's reap found nothing and the waiters' stall recovery (F x L)
  // freed it. Now the grant writes its entry again as a new use (RearmSeq, with its tag), which
  // lands before its release: lockd frees it at once, and the release marks that use done.
  for (const Mode mode : {Mode::kExclusive, Mode::kShared}) {
    CAPTURE(mode == Mode::kExclusive ? "exclusive" : "shared");
    InProcessTable table(1, 4096);
    LockEngine e(Params(1), nullptr);
    RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
    InProcessMemory other(&table);
    if (mode == Mode::kExclusive) REQUIRE(e.Release(ch.mem, ch.Acquire(e, 0)).ok());  // tags
    auto held = e.Acquire(other, 0, Mode::kExclusive, {});
    REQUIRE(held.ok());
    const ManyRequest one[] = {{0, mode, false}};
    const uint32_t seq = ch.NextSeq();
    const LockEngine::EntrySource take = [&] {
      return std::pair<uint64_t, uint32_t>{ch.o.record, seq};
    };
    auto q = e.IssueMany(ch.mem, one, false, take, nullptr);  // queued behind `held`, recorded
    REQUIRE(q.ok());
    REQUIRE_FALSE((*q)[0].granted);
    CHECK((*q)[0].grant.ticket.tagged);  // both modes (protocol version 8)
    REQUIRE(e.Release(other, *held).ok());
    AcquireOptions try_opt;
    try_opt.try_only = true;
    auto g = e.FinishAcquire(ch.mem, (*q)[0].grant, try_opt);  // granted while giving up
    REQUIRE(g.ok());
    CHECK(g->ticket.record == ch.o.record);
    CHECK(g->ticket.record_seq == proto::RequestEntry::RearmSeq(seq));
    CHECK(g->ticket.tagged);
    const auto live = [&](proto::RequestEntry* en) {
      return proto::RequestEntry::DecodeLive(table.session_word(ch.o.record).load(),
                                             table.session_word(ch.o.record + 8).load(),
                                             table.session_word(ch.o.record + 16).load(), en);
    };
    proto::RequestEntry en;
    REQUIRE(live(&en));
    CHECK(en.seq == proto::RequestEntry::RearmSeq(seq));
    CHECK(Word0::Decode(en.ticket).max_x == g->ticket.word.max_x);
    CHECK(Word0::Decode(en.ticket).max_s == g->ticket.word.max_s);
    CHECK(en.tagged);
    CHECK(en.mode == mode);
    // What lockd does if the client dies now: it frees the lock at once.
    InProcessTable copy(1, 4096);
    copy.Store(0, 0, table.Load(0, 0));
    copy.Store(0, 1, table.Load(0, 1));
    for (uint64_t off = 0; off < 32; off += 8) {
      copy.session_word(ch.o.record + off).store(table.session_word(ch.o.record + off).load());
    }
    CHECK(ReapRecord(copy, e, 0) == 1);
    CHECK(Word0::Decode(copy.Load(0, 0)).Drained());
    // Or it releases: that use is marked done (a re-armed use writes its mark, tagged or not: its
    // odd seq may stand in for the use that keeps the mark close), and lockd finds nothing.
    REQUIRE(e.Release(ch.mem, *g).ok());
    CHECK_FALSE(live(&en));
    CHECK(Word0::Decode(table.Load(0, 0)).Drained());
    CHECK(ReapRecord(table, e, 0) == 0);
  }
}

TEST_CASE("giving up: a ticket abandoned after its withdrawal missed keeps a live entry") {
  // A try-lock finds nobody behind its ticket and posts the withdrawal: the entry's done mark,
  // then the CAS. Another request queues in between, so the CAS misses, and the ticket now has
  // a request behind it: it is abandoned to the client's reaper, which releases it when its turn
  // comes. The done mark has already landed. Were the client to die now, lockd's reap of its
  // record would find no live request and free nothing; the ticket would be granted to a dead
  // client, and the request behind it would wait for stall recovery (F x L). The abandoned
  // ticket's entry must be live again, under a use the reaper's release then ends. And tagged
  // with its generation, as it was: the reaper's ticket may wait, and an untagged entry of a
  // client that stopped then, its ticket skipped and the word reset before the fence, would be
  // read as a later request's (docs/protocol.md section 11; found by review, 2026-12-07).
  for (const Mode mode : {Mode::kExclusive, Mode::kShared}) {
    CAPTURE(mode == Mode::kExclusive ? "exclusive" : "shared");
    InProcessTable table(1, 4096);
    std::vector<Ticket> abandoned;
    LockEngine e(Params(1), [&](const Ticket& t) { abandoned.push_back(t); });
    RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
    InProcessMemory holder(&table), late(&table);
    auto held = e.Acquire(holder, 0, Mode::kExclusive, {});
    REQUIRE(held.ok());
    bool queued_late = false;
    ch.mem.set_hook([&](const RemoteOp& op) {
      if (!queued_late && op.kind == RemoteOp::Kind::kCompareSwap &&
          op.region == RegionId::kLocks) {
        queued_late = true;
        QueueExclusive(late, 0);  // lands between the withdrawal's done mark and its CAS
      }
      return true;
    });
    AcquireOptions try_opt = ch.o;
    try_opt.record_seq = ch.NextSeq();
    try_opt.try_only = true;
    auto g = e.Acquire(ch.mem, 0, mode, try_opt);
    ch.mem.set_hook(nullptr);
    REQUIRE(queued_late);
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == ErrorCode::kBusy);
    REQUIRE(abandoned.size() == 1);
    proto::RequestEntry en;
    const bool live = LiveEntryAt(table, ch.o.record, &en);
    CHECK(live);
    if (live) {
      CHECK(en.seq == abandoned[0].record_seq);
      const Word0 t = Word0::Decode(en.ticket);
      CHECK(t.max_x == abandoned[0].word.max_x);
      CHECK(t.max_s == abandoned[0].word.max_s);
      CHECK(en.tagged);
      CHECK(en.generation == 0);
      CHECK(abandoned[0].tagged);
    }
    // The client dies with its ticket queued; the holder releases, and lockd reaps the record:
    // the dead ticket is released at its turn, and the late request is granted.
    REQUIRE(e.Release(holder, *held).ok());
    CHECK(ReapRecord(table, e, 0) == 1);
    const Word0 w = W0(table, 0);
    INFO("word0 after the reap: n_x " << w.n_x << ", max_x " << w.max_x << ", n_s " << w.n_s
                                      << ", max_s " << w.max_s);
    CHECK(w.n_x == w.max_x - 1);  // the late request holds it
    CHECK(w.n_s == w.max_s);
  }
}

TEST_CASE("item 3: a session going round many locks pays three operations per pair once warm") {
  // lockctl bench --locks 10000: one thread takes locks all over the table, coming back to each
  // seldom. A request on a slot whose generation the session does not know READs, with the FA,
  // the words of the slot's whole block of kGenerationBlockSlots slots (one READ of 1 KiB), and
  // learns every slot's generation there: that pair is 4 operations (FA, READ, the entry's WRITE,
  // the CAS; no done mark), and every other pair, in the block or once warm, is FA, WRITE, CAS.
  // 1,000 slots: 15 whole blocks and a last one cut short at the end of the table.
  constexpr uint64_t kSlots = 1000;
  constexpr uint64_t kBlocks =
      (kSlots + LockEngine::kGenerationBlockSlots - 1) / LockEngine::kGenerationBlockSlots;
  static_assert(kBlocks == 16);  // kGenerationBlockSlots = 64
  InProcessTable table(kSlots, 4096);
  for (uint64_t s = 0; s < kSlots; ++s) table.Store(s, 1, (s % 7) * proto::kGenerationIncrement);
  LockEngine e(Params(kSlots), nullptr);
  RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
  const OpCounters& c = ch.mem.counters();
  for (uint64_t s = 0; s < kSlots; ++s) {
    const Grant g = ch.Acquire(e, s);
    CHECK(g.ticket.tagged);
    CHECK(g.ticket.generation == s % 7);  // each slot's own, learned from its block's READ
    REQUIRE(e.Release(ch.mem, g).ok());
  }
  CHECK(c.read.get() == kBlocks);
  CHECK(c.Total() == 3 * kSlots + kBlocks);
  const uint64_t warm = c.Total();
  for (int round = 0; round < 3; ++round) {
    for (uint64_t s = 0; s < kSlots; ++s) {
      const uint64_t slot = (s * 7 + round) % kSlots;  // another order each round
      const Grant g = ch.Acquire(e, slot);
      CHECK(g.ticket.tagged);
      CHECK(g.ticket.generation == slot % 7);
      REQUIRE(e.Release(ch.mem, g).ok());
    }
  }
  CHECK(c.Total() - warm == 3 * 3 * kSlots);
  CHECK(c.read.get() == kBlocks);               // no READ once warm
  CHECK(c.write.get() == kSlots + 3 * kSlots);  // the entries only: no done mark
}

TEST_CASE("item 3: a neighbour's hint from a block READ is not trusted after its word was reset") {
  // What a block READ learns of the other slots is a hint like any other: a reset of a
  // neighbour since (its FA's count lower than the hint's) makes its request READ word1 after
  // its FA, and learn it.
  InProcessTable table(LockEngine::kGenerationBlockSlots, 4096);
  LockEngine e(Params(LockEngine::kGenerationBlockSlots), nullptr);
  RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
  InProcessMemory& mem = ch.mem;
  table.Store(5, 0, Word0{.max_s = 0, .max_x = 100, .n_s = 0, .n_x = 100}.Encode());
  REQUIRE(e.Release(mem, ch.Acquire(e, 0)).ok());  // READs the block: learns slot 5 too
  CHECK(mem.counters().read.get() == 1);
  table.Store(5, 1, table.Load(5, 1) + proto::kGenerationIncrement);  // another client's reset
  table.Store(5, 0, 0);
  const Grant g = ch.Acquire(e, 5);
  CHECK(g.ticket.tagged);  // count 0 below the hint's 100: word1 READ after the FA
  CHECK(g.ticket.generation == 1);
  CHECK(mem.counters().read.get() == 2);
  REQUIRE(e.Release(mem, g).ok());
  const Grant g2 = ch.Acquire(e, 5);  // tagged from what that READ learned
  CHECK(g2.ticket.tagged);
  CHECK(g2.ticket.generation == 1);
  CHECK(mem.counters().read.get() == 2);
  REQUIRE(e.Release(mem, g2).ok());
}

TEST_CASE("item 3: what one thread of a session learned of a slot's generation tags another's") {
  // Two channels of one session (one engine): the second's first request on a slot the first has
  // seen is tagged without a READ.
  InProcessTable table(4, 4096);
  LockEngine e(Params(4), nullptr);
  table.Store(1, 1, 5 * proto::kGenerationIncrement);
  RecordedChannel a(&table, proto::SessionRecord::EntryOffset(0));
  RecordedChannel b(&table, proto::SessionRecord::EntryOffset(1));
  REQUIRE(e.Release(a.mem, a.Acquire(e, 1)).ok());
  const Grant g = b.Acquire(e, 1);
  CHECK(g.ticket.tagged);
  CHECK(g.ticket.generation == 5);
  CHECK(b.mem.counters().read.get() == 0);
  REQUIRE(e.Release(b.mem, g).ok());
  CHECK(b.mem.counters().Total() == 3);  // FA, WRITE, CAS
}

TEST_CASE(
    "item 3: a token's READ tags the entry; a shared request is tagged from what the session "
    "learned, and its release marks it done") {
  InProcessTable table(4, 4096);
  LockEngine e(Params(4), nullptr);
  InProcessMemory mem(&table);
  table.Store(2, 1, 7 * proto::kGenerationIncrement);
  AcquireOptions o;
  o.record = proto::SessionRecord::EntryOffset(0);
  o.record_seq = 2;  // even, as the SDK's pool hands them out (an odd seq is a re-armed use's)
  o.want_token = true;
  auto g = e.Acquire(mem, 2, Mode::kExclusive, o);
  REQUIRE(g.ok());
  CHECK(g->ticket.tagged);
  CHECK(g->ticket.generation == 7);
  CHECK(mem.counters().Total() == 3);  // FA and READ, the entry's WRITE
  REQUIRE(e.Release(mem, *g).ok());
  CHECK(mem.counters().Total() == 4);  // the CAS alone
  o.want_token = false;
  o.record_seq = 4;
  auto s = e.Acquire(mem, 2, Mode::kShared, o);
  REQUIRE(s.ok());
  CHECK(s->ticket.tagged);
  CHECK(s->ticket.generation == 7);
  CHECK(mem.counters().Total() == 6);  // the FA and the entry's WRITE: no READ
  REQUIRE(e.Release(mem, *s).ok());
  CHECK(mem.counters().Total() == 8);  // the done mark and the release
  proto::RequestEntry en;
  CHECK_FALSE(proto::RequestEntry::DecodeLive(table.session_word(o.record).load(),
                                              table.session_word(o.record + 8).load(),
                                              table.session_word(o.record + 16).load(), &en));
}

TEST_CASE("a token comes with an exclusive grant when asked for, and increases") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory mem(&table);
  AcquireOptions o;
  o.want_token = true;
  uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    auto g = e.Acquire(mem, 0, Mode::kExclusive, o);
    REQUIRE(g.ok());
    REQUIRE(g->token > last);
    REQUIRE((g->token >> 48) == 1);  // epoch
    last = g->token;
    REQUIRE(e.Release(mem, *g).ok());
  }
}

TEST_CASE("a token granted while giving up reads the generation after the grant") {
  // A racing reset's generation bump may land late, between a request's FA (and its READ of the
  // generation) and the grant of the request ahead of it. That request's token then carries the
  // higher generation; ours, granted after it, must not carry the lower one.
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory h(&table), p(&table), x(&table);
  auto held = e.Acquire(h, 1, Mode::kExclusive, {});
  REQUIRE(held.ok());
  const ManyRequest one[] = {{1, Mode::kExclusive, true}};
  auto pq = e.IssueMany(p, one, false, nullptr, nullptr);  // ticket 1, queued
  auto xq = e.IssueMany(x, one, false, nullptr, nullptr);  // ticket 2, queued
  REQUIRE(pq.ok());
  REQUIRE(xq.ok());
  REQUIRE_FALSE((*pq)[0].granted);
  REQUIRE_FALSE((*xq)[0].granted);
  RemoteOp bump = RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(1) + proto::kWord1Offset,
                                     proto::kGenerationIncrement);
  REQUIRE(h.Execute(bump).ok());  // the late bump
  REQUIRE(e.Release(h, *held).ok());
  AcquireOptions wait_opt;
  wait_opt.deadline = Clock::now() + 2s;
  auto pg = e.FinishAcquire(p, (*pq)[0].grant, wait_opt);  // granted in Wait: reads it
  REQUIRE(pg.ok());
  REQUIRE(e.Release(p, *pg).ok());
  AcquireOptions try_opt;
  try_opt.try_only = true;
  auto xg = e.FinishAcquire(x, (*xq)[0].grant, try_opt);  // granted while giving up
  REQUIRE(xg.ok());
  INFO("tokens " << std::hex << pg->token << " then " << xg->token);
  REQUIRE(xg->token > pg->token);
  REQUIRE(e.Release(x, *xg).ok());
}

TEST_CASE("out-of-range slot is refused") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory mem(&table);
  auto g = e.Acquire(mem, 4, Mode::kExclusive, {});
  REQUIRE(g.status().code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("shared holders coexist; exclusive waits for all of them") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  InProcessMemory a(&table), b(&table), c(&table);
  auto s1 = e.Acquire(a, 0, Mode::kShared, {});
  auto s2 = e.Acquire(b, 0, Mode::kShared, {});
  REQUIRE(s1.ok());
  REQUIRE(s2.ok());
  AcquireOptions try_only;
  try_only.try_only = true;
  auto x = e.Acquire(c, 0, Mode::kExclusive, try_only);
  REQUIRE(x.status().code() == ErrorCode::kBusy);
  // The failed try-lock withdrew its ticket: the word is as before.
  REQUIRE(W0(table, 0) == Word0{.max_s = 2, .max_x = 0, .n_s = 0, .n_x = 0});
  REQUIRE(e.Release(a, *s1).ok());
  REQUIRE(e.Acquire(c, 0, Mode::kExclusive, try_only).status().code() == ErrorCode::kBusy);
  REQUIRE(e.Release(b, *s2).ok());
  auto x2 = e.Acquire(c, 0, Mode::kExclusive, try_only);
  REQUIRE(x2.ok());
  REQUIRE(e.Acquire(a, 0, Mode::kShared, try_only).status().code() == ErrorCode::kBusy);
  REQUIRE(e.Release(c, *x2).ok());
}

TEST_CASE("mutual exclusion under many threads (shadow counters)") {
  constexpr int kThreads = 8;
  constexpr int kOps = 4000;
  constexpr uint64_t kSlots = 3;
  InProcessTable table(kSlots);
  LockEngine e(Params(kSlots), nullptr);
  std::atomic<int> writers[kSlots] = {}, readers[kSlots] = {};
  std::atomic<int> violations{0}, max_readers{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      InProcessMemory mem(&table);
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < kOps; ++i) {
        const uint64_t slot = rng() % kSlots;
        const Mode m = rng() % 3 == 0 ? Mode::kExclusive : Mode::kShared;
        auto g = e.Acquire(mem, slot, m, {});
        if (!g.ok()) {
          violations++;
          continue;
        }
        if (m == Mode::kExclusive) {
          if (writers[slot].fetch_add(1) != 0 || readers[slot].load() != 0) violations++;
          std::this_thread::yield();
          writers[slot].fetch_sub(1);
        } else {
          const int r = readers[slot].fetch_add(1) + 1;
          if (writers[slot].load() != 0) violations++;
          int prev = max_readers.load();
          while (r > prev && !max_readers.compare_exchange_weak(prev, r)) {
          }
          std::this_thread::yield();
          readers[slot].fetch_sub(1);
        }
        if (!e.Release(mem, *g).ok()) violations++;
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(violations.load() == 0);
  REQUIRE(max_readers.load() >= 2);  // shared holders really overlapped
  for (uint64_t s = 0; s < kSlots; ++s) REQUIRE(W0(table, s).Drained());
}

TEST_CASE("grants follow ticket order (FIFO)") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  InProcessMemory holder_mem(&table);
  ThreadChecks tc;
  auto holder = e.Acquire(holder_mem, 0, Mode::kExclusive, {});
  REQUIRE(holder.ok());
  constexpr int kWaiters = 6;
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread> ts;
  for (int i = 0; i < kWaiters; ++i) {
    // Waiter i queues only after waiter i-1 has drawn its ticket.
    while (W0(table, 0).max_x + W0(table, 0).max_s != static_cast<uint16_t>(1 + i)) {
      std::this_thread::yield();
    }
    const Mode m = i % 3 == 2 ? Mode::kShared : Mode::kExclusive;
    ts.emplace_back([&, i, m] {
      InProcessMemory mem(&table);
      auto g = e.Acquire(mem, 0, m, {});
      THREAD_CHECK(tc, g.ok());
      if (!g.ok()) return;
      {
        std::lock_guard lk(mu);
        order.push_back(i);
      }
      std::this_thread::sleep_for(2ms);
      THREAD_CHECK(tc, e.Release(mem, *g).ok());
    });
  }
  while (W0(table, 0).max_x + W0(table, 0).max_s != 1 + kWaiters) std::this_thread::yield();
  REQUIRE(e.Release(holder_mem, *holder).ok());
  for (auto& t : ts) t.join();
  INFO(tc.Report());
  REQUIRE(tc.failures.empty());
  REQUIRE(order == std::vector<int>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("a timed-out waiter with nobody behind withdraws its ticket") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  InProcessMemory a(&table), b(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  AcquireOptions o;
  o.deadline = Clock::now() + 20ms;
  EngineEvents ev;
  auto w = e.Acquire(b, 0, Mode::kExclusive, o, &ev);
  REQUIRE(w.status().code() == ErrorCode::kTimeout);
  REQUIRE(ev.withdrawals.get() == 1);
  REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 1, .n_s = 0, .n_x = 0});
  REQUIRE(e.Release(a, *g).ok());
}

TEST_CASE("a timed-out waiter with others behind is abandoned and drained") {
  InProcessTable table(1);
  Reaper reaper(&table);
  LockEngine e(Params(1), [&](const Ticket& t) { reaper.Add(t); });
  InProcessMemory a(&table), b(&table), c(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  ThreadChecks checks;
  std::atomic<bool> b_done{false};
  std::thread tb([&] {
    AcquireOptions o;
    o.deadline = Clock::now() + 100ms;
    auto w = e.Acquire(b, 0, Mode::kExclusive, o);
    THREAD_CHECK(checks, w.status().code() == ErrorCode::kTimeout);
    b_done = true;
  });
  while (W0(table, 0).max_x != 2) std::this_thread::yield();
  std::thread tc([&] {
    auto w = e.Acquire(c, 0, Mode::kExclusive, {});  // queued behind b
    THREAD_CHECK(checks, w.ok());
    if (w.ok()) THREAD_CHECK(checks, e.Release(c, *w).ok());
  });
  tb.join();
  REQUIRE(b_done);
  REQUIRE(e.Release(a, *g).ok());
  // b's ticket must be granted and released by the reaper for c to get the lock.
  REQUIRE(reaper.DrainAll(e) == 1);
  tc.join();
  INFO(checks.Report());
  REQUIRE(checks.failures.empty());
  REQUIRE(W0(table, 0).Drained());
}

TEST_CASE("counters reset at COUNT_MAX and the lock keeps working (wrap-around)") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  const uint16_t near = proto::kCountMax - 3;
  table.Store(0, 0, Word0{.max_s = 5, .max_x = near, .n_s = 5, .n_x = near}.Encode());
  InProcessMemory mem(&table);
  EngineEvents ev;
  AcquireOptions o;
  o.want_token = true;
  uint64_t last_token = 0;
  for (int i = 0; i < 10; ++i) {
    auto g = e.Acquire(mem, 0, Mode::kExclusive, o, &ev);
    REQUIRE(g.ok());
    REQUIRE(g->token > last_token);  // monotonic across the reset
    last_token = g->token;
    REQUIRE(e.Release(mem, *g, &ev).ok());
  }
  REQUIRE(ev.resets.get() == 1);
  REQUIRE(proto::Generation(table.Load(0, 1)) == 1);
  REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 7, .n_s = 0, .n_x = 7});
}

TEST_CASE("requests on a frozen word withdraw; the last release resets it") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  const uint16_t last = proto::kCountMax - 1;
  table.Store(0, 0, Word0{.max_s = 2, .max_x = last, .n_s = 2, .n_x = last}.Encode());
  InProcessMemory a(&table), b(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});  // draws the last ticket: word now frozen
  REQUIRE(g.ok());
  REQUIRE(W0(table, 0).Frozen());
  std::atomic<bool> got{false};
  EngineEvents bev;
  ThreadChecks checks;
  std::thread tb([&] {
    auto w = e.Acquire(b, 0, Mode::kShared, {}, &bev);
    THREAD_CHECK(checks, w.ok());
    if (!w.ok()) return;
    got = true;
    THREAD_CHECK(checks, e.Release(b, *w).ok());
  });
  std::this_thread::sleep_for(20ms);
  REQUIRE_FALSE(got);
  REQUIRE(W0(table, 0).max_s == 2);  // b's increments were all withdrawn
  REQUIRE(e.Release(a, *g).ok());
  tb.join();
  INFO(checks.Report());
  REQUIRE(checks.failures.empty());
  REQUIRE(bev.withdrawals.get() >= 1);
  REQUIRE(proto::Generation(table.Load(0, 1)) >= 1);
  REQUIRE(W0(table, 0) == Word0{.max_s = 1, .max_x = 0, .n_s = 1, .n_x = 0});
}

// The recovery CAS compares all of word0, the max fields too, while the stall is timed on (nX, nS,
// word1). A try-lock elsewhere (FA, then a withdrawal) that moved the max fields between the
// waiter's READ and its CAS made the CAS miss, and the waiter timed the stall again from zero:
// with a try-lock looping on the lock, its dead holder's lock could stay stuck as long as the
// loop went on (found by review, 2026-12-06). A miss whose word still shows the stalled counters
// is tried again from the word the CAS found.
TEST_CASE("a waiter recovers a dead holder's lock while a try-lock loops on it") {
  InProcessTable table(1);
  const auto lease = 40ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory dead(&table), w(&table);
  auto g = e.Acquire(dead, 0, Mode::kExclusive, {});  // and never released
  REQUIRE(g.ok());
  const uint16_t dead_ticket = g->ticket.word.max_x;
  // A try-lock on another client, one step per READ of the waiter: its FA lands right after one
  // READ (queued behind the waiter), its withdrawal (or, once granted, its release) right after
  // the next. It starts again only while the dead holder still holds the word.
  bool queued = false, queued_behind = false;
  uint16_t mine = 0;
  int tries = 0;
  w.set_read_filter([&](RemoteOp& op) {
    if (op.offset != 0 || op.length != 16) return;
    Word0 now = W0(table, 0);
    if (!queued) {
      if (now.n_x != dead_ticket) return;  // recovered: the loop is over
      mine = now.max_x;
      ++now.max_x;  // the try-lock's FA
      queued = true;
      ++tries;
    } else if (now.n_x == mine) {
      ++now.n_x;  // granted meanwhile (the recovery skipped to it): its release
      queued = false;
    } else {
      if (now.max_x != mine + 1) queued_behind = true;  // it could not withdraw then
      --now.max_x;
      queued = false;
    }
    table.Store(0, 0, now.Encode());
  });
  EngineEvents ev;
  AcquireOptions o;
  o.deadline = Clock::now() + 3s;  // about 35 stall timeouts of F x L = 80 ms
  auto g2 = e.Acquire(w, 0, Mode::kExclusive, o, &ev);
  INFO("the waiter: " << (g2.ok() ? "granted" : g2.status().ToString()) << " after " << tries
                      << " try-locks; recoveries " << ev.recoveries.get());
  REQUIRE(g2.ok());
  CHECK_FALSE(queued_behind);
  CHECK(ev.recoveries.get() == 1);
  REQUIRE(e.Release(w, *g2).ok());
  CHECK(W0(table, 0).Drained());
}

TEST_CASE("a waiter recovers a lock whose holder died, after F x L") {
  InProcessTable table(1);
  const auto lease = 40ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory dead(&table), w(&table);
  auto g = e.Acquire(dead, 0, Mode::kExclusive, {});  // and never released
  REQUIRE(g.ok());
  EngineEvents ev;
  const auto t0 = Clock::now();
  auto g2 = e.Acquire(w, 0, Mode::kExclusive, {}, &ev);
  const auto took = Clock::now() - t0;
  REQUIRE(g2.ok());
  REQUIRE(ev.recoveries.get() == 1);
  REQUIRE(took >= 2 * lease);
  // The dead holder's late release is refused (lease expired) and changes nothing.
  const Word0 before = W0(table, 0);
  REQUIRE(e.Release(dead, *g).code() == ErrorCode::kLockLost);
  REQUIRE(W0(table, 0) == before);
  REQUIRE(e.Release(w, *g2).ok());
}

TEST_CASE("a release that finds its grant skipped is undone and reported lost") {
  InProcessTable table(1);
  LockEngine e(Params(1, 10s), nullptr);
  InProcessMemory a(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  // A waiter (ticket maxX=1) recovered past us: nX = 2, and queued again (maxX = 3).
  table.Store(0, 0, Word0{.max_s = 0, .max_x = 3, .n_s = 0, .n_x = 2}.Encode());
  REQUIRE(e.Release(a, *g).code() == ErrorCode::kLockLost);
  REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 3, .n_s = 0, .n_x = 2});
}

TEST_CASE("renewal keeps waiters from recovering a live holder") {
  InProcessTable table(1);
  // Long enough that a renewer thread descheduled on a loaded 2-core machine (tens of ms) does
  // not let its lease lapse: the test is about the protocol, not the scheduler.
  const auto lease = 150ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory h(&table), w(&table);
  auto g = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  std::atomic<bool> stop{false};
  ThreadChecks checks;
  std::thread renewer([&] {
    while (!stop) {
      THREAD_CHECK(checks, e.Renew(h, *g).ok());
      std::this_thread::sleep_for(lease / 4);
    }
  });
  AcquireOptions o;
  o.deadline = Clock::now() + 5 * lease;  // longer than F x L
  EngineEvents ev;
  auto r = e.Acquire(w, 0, Mode::kExclusive, o, &ev);
  stop = true;
  renewer.join();  // before any REQUIRE, so that a failure reports instead of aborting the run
  REQUIRE(r.status().code() == ErrorCode::kTimeout);
  REQUIRE(ev.recoveries.get() == 0);
  INFO(checks.Report());
  REQUIRE(checks.failures.empty());
  REQUIRE(e.Release(h, *g).ok());
}

// Found by review (2026-12-05): Renew checked the lease, then posted; a holder descheduled in
// between past its lease posted a renewal that extended it from the late issue. A waiter that saw
// the word unchanged for F x L recovers with a CAS of word0 alone, which a renewal (word1) does
// not stop: landing after the waiter's last READ and before its CAS, the renewal returned ok, and
// two writers held valid leases. A renewal issued after the lease ran out is now a loss.
TEST_CASE("a renewal posted after its lease ran out does not extend it") {
  InProcessTable table(1);
  const auto lease = 50ms;  // F x L = 100 ms
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory h(&table), w(&table);
  auto g = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  std::atomic<bool> waiter_at_cas{false}, renewal_landed{false};
  const auto wait_for = [](std::atomic<bool>& flag) {
    const auto end = Clock::now() + 5s;
    while (!flag.load() && Clock::now() < end) std::this_thread::sleep_for(1ms);
  };
  // The waiter's recovery CAS waits for the renewal to land first (after its last READ).
  w.set_hook([&](const RemoteOp& op) {
    if (op.kind == RemoteOp::Kind::kCompareSwap && !waiter_at_cas.exchange(true)) {
      wait_for(renewal_landed);
    }
    return true;
  });
  Result<Grant> wg = Error(ErrorCode::kInternal, "not run");
  std::thread waiter([&] { wg = e.Acquire(w, 0, Mode::kExclusive, {}); });
  // The holder checks its lease at once, then is descheduled until the waiter is at its CAS.
  std::this_thread::sleep_for(10ms);
  h.set_before_issue([&] { wait_for(waiter_at_cas); });
  const Status renewed = e.Renew(h, *g);
  h.set_before_issue(nullptr);
  renewal_landed.store(true);
  waiter.join();
  const bool holder_valid = renewed.ok() && e.LeaseValid(*g, Clock::now());
  INFO("renewal: " << renewed.ToString()
                   << "; waiter: " << (wg.ok() ? "granted" : wg.status().ToString()));
  CHECK(waiter_at_cas.load());
  CHECK(wg.ok());  // the waiter recovered the lock after F x L and holds it
  CHECK_FALSE(holder_valid);
  CHECK(renewed.code() == ErrorCode::kLockLost);
  if (wg.ok()) CHECK(e.Release(w, *wg).ok());
}

TEST_CASE("a broken channel surfaces as a connection error") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  InProcessMemory mem(&table);
  mem.Break();
  REQUIRE(e.Acquire(mem, 0, Mode::kExclusive, {}).status().code() == ErrorCode::kConnection);
}

TEST_CASE("an exclusive waiter recovers a lock whose shared holders died") {
  InProcessTable table(1);
  const auto lease = 30ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory d1(&table), d2(&table), w(&table);
  auto s1 = e.Acquire(d1, 0, Mode::kShared, {});
  auto s2 = e.Acquire(d2, 0, Mode::kShared, {});
  REQUIRE(s1.ok());
  REQUIRE(s2.ok());
  EngineEvents ev;
  const auto t0 = Clock::now();
  auto x = e.Acquire(w, 0, Mode::kExclusive, {}, &ev);
  REQUIRE(x.ok());
  REQUIRE(Clock::now() - t0 >= 2 * lease);
  REQUIRE(ev.recoveries.get() == 1);
  // Both readers were marked done; their late releases are refused and change nothing.
  const Word0 before = W0(table, 0);
  REQUIRE(e.Release(d1, *s1).code() == ErrorCode::kLockLost);
  REQUIRE(e.Release(d2, *s2).code() == ErrorCode::kLockLost);
  REQUIRE(W0(table, 0) == before);
  REQUIRE(e.Release(w, *x).ok());
}

TEST_CASE("a shared waiter recovers past a dead exclusive holder without counting other readers") {
  InProcessTable table(1);
  const auto lease = 30ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory dead(&table), r(&table);
  auto x = e.Acquire(dead, 0, Mode::kExclusive, {});
  REQUIRE(x.ok());
  EngineEvents ev;
  auto s = e.Acquire(r, 0, Mode::kShared, {}, &ev);
  REQUIRE(s.ok());
  REQUIRE(ev.recoveries.get() == 1);
  // nS counts the recovering reader's first ticket as done; it holds its second.
  REQUIRE(W0(table, 0) == Word0{.max_s = 2, .max_x = 1, .n_s = 1, .n_x = 1});
  REQUIRE(e.Release(r, *s).ok());
  REQUIRE(W0(table, 0).Drained());
}

TEST_CASE("a frozen word left by a dead requester is rescued after F x L") {
  InProcessTable table(1);
  const auto lease = 20ms;
  LockEngine e(Params(1, lease), nullptr);
  // Every ticket released, but one reader died between its FETCH_AND_ADD on the frozen word and
  // its withdrawal: the word can never drain by itself. (An increment left in the frozen field is
  // no holder's, and the word is reset at once: the test below. One in the other field may be an
  // admitted request's: the rescue waits F x L.)
  const uint16_t cmax = proto::kCountMax;
  table.Store(0, 0, Word0{.max_s = 5, .max_x = cmax, .n_s = 4, .n_x = cmax}.Encode());
  InProcessMemory mem(&table);
  EngineEvents ev;
  const auto t0 = Clock::now();
  auto g = e.Acquire(mem, 0, Mode::kExclusive, {}, &ev);
  REQUIRE(g.ok());
  REQUIRE(Clock::now() - t0 >= 2 * lease);
  REQUIRE(ev.resets.get() == 1);
  REQUIRE(proto::Generation(table.Load(0, 1)) == 1);
  REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 1, .n_s = 0, .n_x = 0});
  REQUIRE(e.Release(mem, *g).ok());
}

// A rescuer: an exclusive request that bounces off a frozen word and times it, parked between two
// of its polls as its timer reaches F x L until Resume(). Records when its reset's generation bump
// was issued.
struct ParkedRescuer {
  InProcessMemory mem;
  std::mutex mu;
  std::condition_variable cv;
  bool parked = false, go = false;
  const Clock::time_point start = Clock::now();
  std::atomic<Clock::time_point::rep> reset_at{0};
  Result<Grant> grant = Error(ErrorCode::kTimeout, "not run");
  EngineEvents ev;
  std::thread th;

  ParkedRescuer(InProcessTable* table, const LockEngine& e) : mem(table) {
    mem.set_hook([this, &e](const RemoteOp& op) {
      if (op.kind == RemoteOp::Kind::kFetchAdd && op.region == RegionId::kLocks &&
          op.offset == proto::kWord1Offset && op.operand == proto::kGenerationIncrement) {
        reset_at = Clock::now().time_since_epoch().count();
      }
      if (op.kind == RemoteOp::Kind::kRead && op.region == RegionId::kLocks && !parked &&
          Clock::now() - start >= e.stall_timeout()) {
        std::unique_lock lk(mu);
        parked = true;  // between two polls, as its timer reaches F x L
        cv.notify_all();
        cv.wait(lk, [this] { return go; });
      }
      return true;
    });
    th = std::thread([this, &e] {
      AcquireOptions ro;
      ro.deadline = Clock::now() + 5s;
      grant = e.Acquire(mem, 0, Mode::kExclusive, ro, &ev);
    });
    std::unique_lock lk(mu);
    parked_in_time = cv.wait_for(lk, 5s, [this] { return parked; });
  }
  // A test REQUIREs parked_in_time (a constructor that threw would leave the thread joinable).
  bool parked_in_time = false;
  ~ParkedRescuer() {
    if (th.joinable()) Resume();
  }
  void Resume() {
    {
      std::lock_guard lk(mu);
      go = true;
    }
    cv.notify_all();
    th.join();
  }
  Clock::time_point reset() const { return Clock::time_point{Clock::duration(reset_at.load())}; }
};

// The rescue timed nX, nS and word1 only. A reader that holds has died, and a writer queued behind
// it froze the word; the rescuer times it. Between two of its polls the writer withdraws (a
// timeout), a second reader is granted at once, and another writer freezes the word again: to
// the rescuer nothing moved, and it reset the word under the live reader, then was granted itself
// beside it (found by review, 2026-12-07). A ticket taken since (a max field that moved and
// stayed) restarts its timer.
TEST_CASE(
    "a frozen word is never rescued from under a reader granted since the rescue's timer began") {
  InProcessTable table(1);
  const auto lease = 20ms;
  const LockEngine e(Params(1, lease), nullptr);
  const uint16_t last = proto::kCountMax - 1;
  table.Store(0, 0, Word0{.max_s = 1, .max_x = proto::kCountMax, .n_s = 0, .n_x = last}.Encode());
  InProcessMemory y(&table);
  ParkedRescuer r(&table, e);
  REQUIRE(r.parked_in_time);
  table.Store(0, 0, Word0{.max_s = 1, .max_x = last, .n_s = 0, .n_x = last}.Encode());  // withdrew
  auto gy = e.Acquire(y, 0, Mode::kShared, {});  // granted at once beside the dead reader
  const auto y_at = Clock::now();
  table.Store(0, 0, table.Load(0, 0) + proto::kAcquireExclusive);  // frozen again
  r.Resume();
  REQUIRE(gy.ok());
  // The rescue resets the word (the dead reader's increment is never released) and is granted,
  // but only once the live reader's lease has run out (it renews nothing).
  const auto after = std::chrono::duration_cast<std::chrono::milliseconds>(r.reset() - y_at);
  INFO("rescuer " << (r.grant.ok() ? "granted" : r.grant.status().ToString()) << ", resets "
                  << r.ev.resets.get() << ", the reset " << after.count()
                  << " ms after the reader's grant (lease " << lease.count() << " ms)");
  REQUIRE(r.grant.ok());
  CHECK(r.ev.resets.get() == 1);
  CHECK(r.reset() - y_at >= lease);
  REQUIRE(e.Release(r.mem, *r.grant).ok());
}

// The rule above times a value, and max fields go down as well as up: a ticket's give-up takes
// its increment back. The sixth review of stop 56 gave the interleaving that brings the word back
// to the very value the rescuer timed. A reader that holds has died; writer W1 (ticket a), a
// reader S behind it and writer W2, whose ticket froze the word, wait. Between two of the
// rescuer's polls W2, S and W1 give up in turn, each the last ticket when it does; a reader is
// granted at once, and two writers freeze the word again: the same value, word1 untouched. So a
// frozen word must never thaw before its reset: the ticket that froze it, giving up, leaves its
// ticket to the reaper instead of withdrawing it, and no request is admitted to a frozen word.
TEST_CASE(
    "a frozen word never thaws before its reset, so the rescue cannot land under a reader "
    "granted since its timer began") {
  InProcessTable table(1);
  const auto lease = 20ms;
  const LockEngine e(Params(1, lease), nullptr);
  const uint16_t a = proto::kCountMax - 2;
  // The dead reader holds; nobody else yet.
  table.Store(0, 0, Word0{.max_s = 1, .max_x = a, .n_s = 0, .n_x = a}.Encode());

  // Each of W1, S and W2 is a try-lock on its own thread, parked before any CAS on word0 (its
  // withdrawal) until the test lets it go.
  struct Parked {
    InProcessMemory mem;
    std::mutex mu;
    std::condition_variable cv;
    bool parked = false, go = false, done = false;
    Result<Grant> result = Error(ErrorCode::kTimeout, "not run");
    std::thread th;
    explicit Parked(InProcessTable* t) : mem(t) {
      mem.set_hook([this](const RemoteOp& op) {
        if (op.kind == RemoteOp::Kind::kCompareSwap && op.region == RegionId::kLocks &&
            op.offset == proto::kWord0Offset) {
          std::unique_lock lk(mu);
          parked = true;
          cv.notify_all();
          cv.wait(lk, [this] { return go; });
        }
        return true;
      });
    }
    // Starts the try-lock and returns once it is parked or has returned.
    void Start(const LockEngine& e, Mode m) {
      th = std::thread([this, &e, m] {
        AcquireOptions o;
        o.try_only = true;
        auto r = e.Acquire(mem, 0, m, o);
        std::lock_guard lk(mu);
        result = std::move(r);
        done = true;
        cv.notify_all();
      });
      std::unique_lock lk(mu);
      REQUIRE(cv.wait_for(lk, 5s, [this] { return parked || done; }));
    }
    ~Parked() {
      if (th.joinable()) Finish();  // a REQUIRE failed before Finish()
    }
    // Lets it go and waits for its try-lock's answer.
    void Finish() {
      {
        std::lock_guard lk(mu);
        go = true;
      }
      cv.notify_all();
      th.join();
    }
  };
  Parked w1(&table), s(&table), w2(&table);
  w1.Start(e, Mode::kExclusive);
  s.Start(e, Mode::kShared);
  w2.Start(e, Mode::kExclusive);
  const Word0 timed = W0(table, 0);
  INFO("the word the rescuer times: max_x " << timed.max_x << ", n_x " << timed.n_x << ", max_s "
                                            << timed.max_s << ", n_s " << timed.n_s);
  REQUIRE(timed == Word0{.max_s = 2, .max_x = proto::kCountMax, .n_s = 0, .n_x = a});

  // The rescuer bounces off the frozen word and times it; it is parked between two polls as its
  // timer reaches F x L.
  ParkedRescuer r(&table, e);
  REQUIRE(r.parked_in_time);
  // Between two of its polls: W2, S and W1 give up in turn.
  w2.Finish();
  s.Finish();
  w1.Finish();
  const Word0 after = W0(table, 0);
  INFO("after the three give-ups: max_x " << after.max_x << ", n_x " << after.n_x << ", max_s "
                                          << after.max_s << ", n_s " << after.n_s);
  CHECK(after.Frozen());
  CHECK(w2.mem.counters().compare_swap.get() == 0);  // W2, whose ticket froze it, never withdrew
  // A reader tries; then two writers queue (on other clients: their increments).
  AcquireOptions try_only;
  try_only.try_only = true;
  InProcessMemory y(&table);
  const LockEngine other(Params(1, lease), nullptr);  // another client's session: it FAs
  auto gy = other.Acquire(y, 0, Mode::kShared, try_only);
  const auto y_at = Clock::now();
  table.Store(0, 0, table.Load(0, 0) + 2 * proto::kAcquireExclusive);
  r.Resume();
  const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(r.reset() - y_at);
  INFO("W1 " << w1.result.status().ToString() << "; S " << s.result.status().ToString() << "; W2 "
             << w2.result.status().ToString() << "; the reader "
             << (gy.ok() ? "granted" : gy.status().ToString()) << "; rescuer "
             << (r.grant.ok() ? "granted" : r.grant.status().ToString()) << ", resets "
             << r.ev.resets.get() << ", the reset " << since.count()
             << " ms after the reader's try (lease " << lease.count() << " ms)");
  // The reader is never granted under the rescue: a frozen word admits no one. The rescue still
  // frees the dead reader's lock (one reset) and is granted.
  CHECK_FALSE(gy.ok());
  CHECK((!gy.ok() || r.reset() - y_at >= lease));
  REQUIRE(r.grant.ok());
  CHECK(r.ev.resets.get() == 1);
  REQUIRE(e.Release(r.mem, *r.grant).ok());
}

// A bounce's withdrawal that misses after kFreshWithdrawal leaves its increment in the word until
// the rescue's reset (finding 8). A request that FETCH_AND_ADDs again on every round of its wait
// on a frozen word can leave one on every round, and while a holder keeps the word from the
// rescue (it renews) they add up: 32,768 of them would carry the frozen field into the next one
// (found by review, 2026-12-07). So a request that bounced READs the word until it thaws before
// it FETCH_AND_ADDs again: one call leaves at most one increment.
TEST_CASE(
    "a request waiting on a frozen word leaves at most one increment in it, however many of "
    "its withdrawals come late") {
  InProcessTable table(1);
  const auto lease = 1000ms;  // no rescue within the test (F x L = 2 s)
  const LockEngine e(Params(1, lease), nullptr);
  const uint16_t last = proto::kCountMax - 1;
  const Word0 held{.max_s = 0, .max_x = proto::kCountMax, .n_s = 0, .n_x = last};
  table.Store(0, 0, held.Encode());  // the last ticket's holder holds: frozen
  InProcessMemory w(&table);
  // Every withdrawal of W's comes late (a preempted thread) and misses (another request's bounce
  // in the word meanwhile, gone right after).
  w.set_hook([&](const RemoteOp& op) {
    if (op.kind == RemoteOp::Kind::kCompareSwap && op.region == RegionId::kLocks &&
        op.offset == proto::kWord0Offset) {
      std::this_thread::sleep_for(2ms);
      table.Store(0, 0, table.Load(0, 0) + proto::kAcquireShared);
    }
    return true;
  });
  w.set_after_hook([&](const RemoteOp& op) {
    if (op.kind == RemoteOp::Kind::kCompareSwap && op.region == RegionId::kLocks &&
        op.offset == proto::kWord0Offset) {
      table.Store(0, 0, table.Load(0, 0) - proto::kAcquireShared);
    }
    return true;
  });
  EngineEvents ev;
  AcquireOptions o;
  o.deadline = Clock::now() + 150ms;
  auto g = e.Acquire(w, 0, Mode::kExclusive, o, &ev);
  const Word0 now = W0(table, 0);
  INFO("W: " << (g.ok() ? "granted" : g.status().ToString()) << "; FETCH_AND_ADDs "
             << w.counters().fetch_add.get() << ", READs " << w.counters().read.get()
             << ", increments left " << ev.frozen_left.get() << "; word0 max_x " << now.max_x
             << ", n_x " << now.n_x);
  REQUIRE(g.status().code() == ErrorCode::kTimeout);
  CHECK(now.max_x - proto::kCountMax <= 1);
  CHECK(ev.frozen_left.get() <= 1);
  CHECK(now.n_x == held.n_x);
  CHECK(now.max_s == 0);
}

// The bound above is per call. A loop of separate calls (a try-lock loop: each try bounces once)
// could leave one increment per call, each withdrawal able to come late and miss, without bound
// while a holder renews: 32,768 of them carry the frozen field into the next (a thawed word, a
// false shared release). The session remembers a slot it saw frozen, and its requests on that
// slot READ the word before they FETCH_AND_ADD, until it thaws: one increment per freeze.
TEST_CASE(
    "a loop of try-locks on a frozen word leaves at most one increment in it, however many of "
    "their withdrawals come late") {
  // How the loop tries: single try-locks, or try-locks of a set (AcquireMany) holding the slot.
  const int how = GENERATE(0, 1);
  CAPTURE(how);
  InProcessTable table(2);
  const LockEngine e(Params(2, 1000ms), nullptr);  // F x L = 2 s: no rescue within the test
  const uint16_t last = proto::kCountMax - 1;
  const Word0 held{.max_s = 0, .max_x = proto::kCountMax, .n_s = 0, .n_x = last};
  table.Store(0, 0, held.Encode());  // the last ticket's holder holds and renews: frozen
  InProcessMemory w(&table);
  // Every withdrawal comes late (a preempted thread) and misses (another request's bounce in the
  // word meanwhile, gone right after), as in the test above.
  const auto frozen_cas = [](const RemoteOp& op) {
    return op.kind == RemoteOp::Kind::kCompareSwap && op.region == RegionId::kLocks &&
           op.offset == proto::kWord0Offset;
  };
  w.set_hook([&](const RemoteOp& op) {
    if (frozen_cas(op)) {
      std::this_thread::sleep_for(2ms);
      table.Store(0, 0, table.Load(0, 0) + proto::kAcquireShared);
    }
    return true;
  });
  w.set_after_hook([&](const RemoteOp& op) {
    if (frozen_cas(op)) table.Store(0, 0, table.Load(0, 0) - proto::kAcquireShared);
    return true;
  });
  EngineEvents ev;
  AcquireOptions o;
  o.try_only = true;
  const ManyRequest set[] = {{.slot = 0, .mode = Mode::kExclusive},
                             {.slot = 1, .mode = Mode::kExclusive}};
  constexpr int kTries = 10;
  int busy = 0;
  for (int i = 0; i < kTries; ++i) {
    Status st = Status::Ok();
    if (how == 0) {
      st = e.Acquire(w, 0, Mode::kExclusive, o, &ev).status();
    } else {
      st = e.AcquireMany(w, set, o, nullptr, &ev).status();
    }
    if (st.code() == ErrorCode::kBusy) ++busy;
  }
  const Word0 now = W0(table, 0);
  INFO("tries " << kTries << ", busy " << busy << "; FETCH_AND_ADDs "
                << w.counters().fetch_add.get() << ", READs " << w.counters().read.get()
                << ", increments left " << ev.frozen_left.get() << "; word0 max_x " << now.max_x
                << ", n_x " << now.n_x << "; slot 1 " << table.Load(1, 0));
  CHECK(busy == kTries);
  CHECK(now.max_x - proto::kCountMax <= 1);
  CHECK(ev.frozen_left.get() <= 1);
  CHECK(now.n_x == held.n_x);
  CHECK(now.max_s == 0);
  const Word0 one = W0(table, 1);
  CHECK(one.n_x == one.max_x);  // slot 1 given back each time

  // The mark does not outlive the thaw: once the word is reset, the next try is granted (after
  // one READ that clears the mark), and the one after it FAs at once.
  w.set_hook(nullptr);
  w.set_after_hook(nullptr);
  table.Store(0, 0, 0);
  table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
  for (int i = 0; i < 2; ++i) {
    const uint64_t reads = w.counters().read.get();
    if (how == 0) {
      auto g = e.Acquire(w, 0, Mode::kExclusive, o, &ev);
      REQUIRE(g.ok());
      REQUIRE(e.Release(w, *g).ok());
    } else {
      auto gs = e.AcquireMany(w, set, o, nullptr, &ev);
      REQUIRE(gs.ok());
      for (const Grant& g : *gs) REQUIRE(e.Release(w, g).ok());
    }
    CHECK(w.counters().read.get() - reads == (i == 0 ? 1 : 0));
  }
}

// A request's latency (Grant::requested, where the SDK's lock latency starts for a caller that
// read no clock of its own) starts when the request does: on a marked slot that is its wait for
// the thaw before its first FA (found by review: it started at that FA, leaving the wait out).
TEST_CASE("a request that waits for a thaw before its first FA counts the wait in its latency") {
  InProcessTable table(1);
  const LockEngine e(Params(1, 1000ms), nullptr);  // F x L = 2 s: no rescue within the test
  const uint16_t last = proto::kCountMax - 1;
  table.Store(0, 0, Word0{.max_s = 0, .max_x = proto::kCountMax, .n_s = 0, .n_x = last}.Encode());
  InProcessMemory w(&table);
  AcquireOptions try_only;
  try_only.try_only = true;
  REQUIRE(e.Acquire(w, 0, Mode::kExclusive, try_only).status().code() == ErrorCode::kBusy);
  // The holder releases 100 ms from now, and its release resets the word.
  const auto t0 = Clock::now();
  std::thread holder([&] {
    std::this_thread::sleep_for(100ms);
    table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
    table.Store(0, 0, 0);
  });
  AcquireOptions o;
  o.deadline = Clock::now() + 2s;
  auto g = e.Acquire(w, 0, Mode::kExclusive, o);
  holder.join();
  REQUIRE(g.ok());
  const auto ms = [&](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t - t0).count();
  };
  INFO("requested " << ms(g->requested) << " ms, lease start " << ms(g->lease_start)
                    << " ms after the call");
  CHECK(g->lease_start - t0 >= 100ms);
  CHECK(g->requested - t0 < 50ms);
  REQUIRE(e.Release(w, *g).ok());
}

// A posted release that missed is retried before its channel's next request waits, possibly
// behind that very lock (ReapPending): a request that READs a marked slot before its FA must
// retry it too, or it waits for a thaw only that release can bring (found by review of the
// marks' first version, 2026-12-08).
TEST_CASE(
    "a request on a slot its session saw frozen first finishes its channel's posted release") {
  InProcessTable table(1);
  const LockEngine e(Params(1, 1000ms), nullptr);  // F x L = 2 s: no rescue within the test
  const uint16_t last = proto::kCountMax - 1;
  table.Store(0, 0, Word0{.max_s = 0, .max_x = last, .n_s = 0, .n_x = last}.Encode());
  InProcessMemory t(&table), other(&table);
  // T draws the last ticket (its FA freezes the word) and holds.
  auto held = e.Acquire(t, 0, Mode::kExclusive, {});
  REQUIRE(held.ok());
  REQUIRE(W0(table, 0).Frozen());
  // Another thread of the session bounces off the word: the slot is marked.
  AcquireOptions try_only;
  try_only.try_only = true;
  REQUIRE(e.Acquire(other, 0, Mode::kExclusive, try_only).status().code() == ErrorCode::kBusy);
  // T's posted release misses (its view of the word is stale: a bounce in it then) and is left
  // pending on T's channel; T locks the slot again.
  Grant g = *held;
  g.seen.max_s = 1;
  PendingRelease p;
  REQUIRE(e.StartRelease(t, g, &p).ok());
  EngineEvents ev;
  AcquireOptions o;
  o.deadline = Clock::now() + 300ms;
  o.pending = &p;
  auto again = e.Acquire(t, 0, Mode::kExclusive, o, &ev);
  const Word0 now = W0(table, 0);
  INFO("T again: " << (again.ok() ? "granted" : again.status().ToString()) << "; resets "
                   << ev.resets.get() << "; word0 max_x " << now.max_x << ", n_x " << now.n_x);
  REQUIRE(again.ok());
  CHECK(ev.resets.get() == 1);
  REQUIRE(e.Release(t, *again).ok());
}

// Whoever drains a frozen word resets it; one that dies between its release and the reset leaves
// the word frozen and drained. A request waiting for the word to thaw resets it then, as a
// bounce's withdrawal that drains a word does, and does not wait for the rescue (F x L).
TEST_CASE("a request waiting on a frozen word resets it once it holds nothing but bounces") {
  InProcessTable table(1);
  const auto lease = 1000ms;  // F x L = 2 s, beyond the request's deadline
  const LockEngine e(Params(1, lease), nullptr);
  const uint16_t last = proto::kCountMax - 1;
  // Drained by the release below, or with a bounce's increment left in it (Word0::Resettable).
  const int left = GENERATE(0, 1);
  CAPTURE(left);
  table.Store(0, 0,
              Word0{.max_s = 0, .max_x = uint16_t(proto::kCountMax + left), .n_s = 0, .n_x = last}
                  .Encode());
  InProcessMemory w(&table);
  // The holder releases (and dies before its reset) just before W's first READ, once W's
  // withdrawal has left the word frozen: only a reset from W's wait frees the word in time.
  bool released = false;
  w.set_hook([&](const RemoteOp& op) {
    if (op.kind == RemoteOp::Kind::kRead && op.region == RegionId::kLocks && !released) {
      released = true;
      table.word(0).fetch_add(proto::ReleaseIncrement(Mode::kExclusive));
    }
    return true;
  });
  EngineEvents ev;
  AcquireOptions o;
  o.deadline = Clock::now() + 500ms;
  auto g = e.Acquire(w, 0, Mode::kExclusive, o, &ev);
  INFO("W: " << (g.ok() ? "granted" : g.status().ToString()) << ", resets " << ev.resets.get()
             << ", FETCH_AND_ADDs " << w.counters().fetch_add.get());
  REQUIRE(released);
  REQUIRE(g.ok());
  CHECK(ev.resets.get() == 1);
  CHECK(proto::Generation(table.Load(0, 1)) == 1);
  REQUIRE(e.Release(w, *g).ok());
}

// A try-lock whose withdrawal drains the word and resets it says busy, as before the wait by READs
// (found by review: the wait's exit to the FA loop met the try-lock's deadline, its start, and it
// said "timed out").
TEST_CASE(
    "a try-lock that bounces off a frozen word says busy, whatever its look at the word saw") {
  InProcessTable table(1);
  const LockEngine e(Params(1, 1000ms), nullptr);
  const uint16_t cmax = proto::kCountMax;
  // Frozen and drained (whoever drained it died before the reset): the try-lock's withdrawal
  // resets it, and its READ shows it thawed.
  table.Store(0, 0, Word0{.max_s = 0, .max_x = cmax, .n_s = 0, .n_x = cmax}.Encode());
  InProcessMemory m(&table);
  AcquireOptions o;
  o.try_only = true;
  o.deadline = Clock::now();  // as the SDK's try-lock
  EngineEvents ev;
  auto g = e.Acquire(m, 0, Mode::kExclusive, o, &ev);
  INFO((g.ok() ? std::string("granted") : g.status().ToString()) << ", resets " << ev.resets.get());
  CHECK(ev.resets.get() == 1);
  CHECK(g.status().code() == ErrorCode::kBusy);
}

// A bounce's increment left in a frozen word (its withdrawal came late: WithdrawFrozen) kept the
// word from draining: once every ticket the word admitted was released, nobody reset it, and every
// request waited for the rescue, F x L (seen in a same-boot benchmark on rdma_rxe, 2026-12-07:
// 4 processes on one lock made no acquisition in 3 s). A word frozen in a field whose releases
// reached kCountMax, the other field drained, holds nothing but bounces: whoever sees it resets it.
TEST_CASE(
    "a frozen word with a bounce's increment left in it is reset when its last ticket is "
    "released") {
  InProcessTable table(1);
  const auto lease = 1000ms;  // F x L = 2 s
  const LockEngine e(Params(1, lease), nullptr);
  const uint16_t last = proto::kCountMax - 1;
  table.Store(0, 0, Word0{.max_s = 0, .max_x = last, .n_s = 0, .n_x = last}.Encode());
  InProcessMemory h(&table), w(&table);
  auto g = e.Acquire(h, 0, Mode::kExclusive, {});  // the last ticket: frozen
  REQUIRE(g.ok());
  table.word(0).fetch_add(proto::kAcquireExclusive);  // a bounce's increment, left
  EngineEvents ev;
  REQUIRE(e.Release(h, *g, &ev).ok());
  const Word0 after = W0(table, 0);
  AcquireOptions o;
  o.deadline = Clock::now() + 200ms;
  const auto t0 = Clock::now();
  auto gw = e.Acquire(w, 0, Mode::kExclusive, o);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  INFO("after the release: max_x " << after.max_x << ", n_x " << after.n_x << ", resets "
                                   << ev.resets.get() << "; the next request "
                                   << (gw.ok() ? "granted" : gw.status().ToString()) << " after "
                                   << waited.count() << " ms");
  CHECK(ev.resets.get() == 1);
  CHECK(after == Word0{});
  REQUIRE(gw.ok());
  REQUIRE(e.Release(w, *gw).ok());
}

TEST_CASE("a shared request that draws the last ticket leaves the reset to whoever drains") {
  InProcessTable table(1);
  LockEngine e(Params(1), nullptr);
  const uint16_t last = proto::kCountMax - 1;
  table.Store(0, 0, Word0{.max_s = last, .max_x = 3, .n_s = last, .n_x = 3}.Encode());
  InProcessMemory a(&table), b(&table);
  auto s1 = e.Acquire(a, 0, Mode::kShared, {});  // draws the last S ticket: frozen
  REQUIRE(s1.ok());
  REQUIRE(W0(table, 0).Frozen());
  AcquireOptions try_only;
  try_only.try_only = true;
  REQUIRE(e.Acquire(b, 0, Mode::kShared, try_only).status().code() == ErrorCode::kBusy);
  REQUIRE(W0(table, 0).max_s == proto::kCountMax);  // the bounce was withdrawn
  EngineEvents ev;
  REQUIRE(e.Release(a, *s1, &ev).ok());  // drains the frozen word: the releaser resets it
  REQUIRE(ev.resets.get() == 1);
  REQUIRE(W0(table, 0) == Word0{});
  REQUIRE(proto::Generation(table.Load(0, 1)) == 1);
}

TEST_CASE("a delayed release that lands after a recovery changes nothing") {
  InProcessTable table(1);
  const auto lease = 40ms;
  LockEngine e(Params(1, lease), nullptr);
  InProcessMemory h(&table), w(&table);
  auto g = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  // The holder checks its lease and posts its release, which is then held up (a pause) until a
  // waiter has recovered the lock and holds it.
  std::atomic<bool> recovered{false};
  h.set_hook([&](const RemoteOp& op) {
    if (op.kind == RemoteOp::Kind::kCompareSwap) {
      while (!recovered) std::this_thread::sleep_for(1ms);
    }
    return true;
  });
  std::thread releaser([&] { (void)e.Release(h, *g); });
  auto g2 = e.Acquire(w, 0, Mode::kExclusive, {});
  REQUIRE(g2.ok());
  const Word0 held = W0(table, 0);
  recovered = true;
  releaser.join();
  REQUIRE(W0(table, 0) == held);  // the stale release did not land
  REQUIRE(e.Release(w, *g2).ok());
}

// A READ is no snapshot of the word (engine_internal::AtomicWord0; docs/protocol.md §8, torn
// READs): rdma_rxe copies it bytewise, and a copy stalled halfway mixes the word's values at two
// instants. These give the engine such views where it used to decide on them alone.
TEST_CASE("torn READs: a shared release does not take a torn view of the word for a loss") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory mem(&table);
  auto a = e.Acquire(mem, 0, Mode::kShared, {});
  auto b = e.Acquire(mem, 0, Mode::kShared, {});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  // A's view of the word, as a READ stalled between its halves would give it: maxS from before
  // B queued (1), nS from a later instant when one reader had released (1). No reader holds in
  // it (nS == maxS), though A does.
  Grant g = *a;
  g.seen = Word0{.max_s = 1, .max_x = 0, .n_s = 1, .n_x = 0};
  CHECK(e.Release(mem, g).ok());
  CHECK(W0(table, 0) == Word0{.max_s = 2, .max_x = 0, .n_s = 1, .n_x = 0});
  // Posted, the same.
  PendingRelease p;
  Grant h = *b;
  h.seen = Word0{.max_s = 1, .max_x = 0, .n_s = 2, .n_x = 0};
  CHECK(e.StartRelease(mem, h, &p).ok());
  CHECK(e.FinishRelease(mem, &p).ok());
  CHECK(W0(table, 0) == Word0{.max_s = 2, .max_x = 0, .n_s = 2, .n_x = 0});
  // A grant that is really gone is still reported, and released by nobody.
  auto c = e.Acquire(mem, 1, Mode::kShared, {});
  REQUIRE(c.ok());
  table.Store(1, 0, Word0{.max_s = 1, .max_x = 0, .n_s = 1, .n_x = 0}.Encode());  // recovered
  CHECK(e.Release(mem, *c).code() == ErrorCode::kLockLost);
  CHECK(W0(table, 1) == Word0{.max_s = 1, .max_x = 0, .n_s = 1, .n_x = 0});
}

TEST_CASE("torn READs: a renewal does not take a torn view of the word for a loss") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory mem(&table);
  // Every READ of word0 shows nS caught up with maxS, as a torn one can.
  mem.set_read_filter([](RemoteOp& op) {
    if (op.offset % proto::kSlotSize != 0 || op.into != nullptr) return;
    Word0 w = Word0::Decode(op.result[0]);
    w.n_s = w.max_s;
    op.result[0] = w.Encode();
  });
  auto a = e.Acquire(mem, 0, Mode::kShared, {});
  REQUIRE(a.ok());
  Grant g = *a;
  CHECK(e.Renew(mem, g).ok());
  CHECK(e.Release(mem, g).ok());
  CHECK(W0(table, 0) == Word0{.max_s = 1, .max_x = 0, .n_s = 1, .n_x = 0});
}

TEST_CASE("torn READs: a waiter does not give its ticket up on a torn view of the word") {
  // A reader waits behind a writer. Its first poll READ shows nX a byte's worth past its turn
  // (0x00ff -> 0x0100 read low byte first: 0x01ff), as if a recovery had skipped it. Taken for
  // true, the reader queued again and left its first ticket in the word, where nobody would
  // ever release it: the next writer would wait for stall recovery.
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory writer(&table), reader(&table);
  reader.set_min_round_trip(100us);
  std::atomic<int> torn{0};
  reader.set_read_filter([&](RemoteOp& op) {
    if (op.offset % proto::kSlotSize != 0 || op.into != nullptr || torn.load() > 0) return;
    Word0 w = Word0::Decode(op.result[0]);
    w.n_x = static_cast<uint16_t>(w.n_x + 256);
    op.result[0] = w.Encode();
    ++torn;
  });
  auto x = e.Acquire(writer, 0, Mode::kExclusive, {});
  REQUIRE(x.ok());
  EngineEvents ev;
  Result<Grant> s = Error(ErrorCode::kInternal, "not run");
  std::thread t([&] {
    AcquireOptions o;
    o.deadline = Clock::now() + 5s;
    s = e.Acquire(reader, 0, Mode::kShared, o, &ev);
  });
  while (torn.load() == 0) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(5ms);
  REQUIRE(e.Release(writer, *x).ok());
  t.join();
  REQUIRE(s.ok());
  CHECK(ev.restarts.get() == 0);
  REQUIRE(e.Release(reader, *s).ok());
  CHECK(W0(table, 0).Drained());  // no ticket left behind
}

TEST_CASE("torn READs: a fencing token does not take a torn generation") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory torn(&table), whole(&table);
  torn.set_read_filter(TearGenerations);
  table.Store(0, 1, 0x100 * proto::kGenerationIncrement);
  AcquireOptions o;
  o.want_token = true;
  SECTION("granted at once") {
    auto g = e.Acquire(torn, 0, Mode::kExclusive, o);
    REQUIRE(g.ok());
    CHECK(g->generation == 0x100);
    REQUIRE(e.Release(torn, *g).ok());
    auto h = e.Acquire(whole, 0, Mode::kExclusive, o);  // the next holder, its READ whole
    REQUIRE(h.ok());
    CHECK(h->token > g->token);
    REQUIRE(e.Release(whole, *h).ok());
  }
  SECTION("granted while waiting") {
    torn.set_min_round_trip(100us);
    auto x = e.Acquire(whole, 0, Mode::kExclusive, o);
    REQUIRE(x.ok());
    Result<Grant> g = Error(ErrorCode::kInternal, "not run");
    std::thread t([&] {
      AcquireOptions w = o;
      w.deadline = Clock::now() + 5s;
      g = e.Acquire(torn, 0, Mode::kExclusive, w);
    });
    std::this_thread::sleep_for(5ms);
    REQUIRE(e.Release(whole, *x).ok());
    t.join();
    REQUIRE(g.ok());
    CHECK(g->generation == 0x100);
    CHECK(g->token > x->token);
    REQUIRE(e.Release(torn, *g).ok());
    auto h = e.Acquire(whole, 0, Mode::kExclusive, o);
    REQUIRE(h.ok());
    CHECK(h->token > g->token);
    REQUIRE(e.Release(whole, *h).ok());
  }
  SECTION("a set") {
    const ManyRequest reqs[] = {{0, Mode::kExclusive}, {2, Mode::kExclusive}};
    table.Store(2, 1, 0x300 * proto::kGenerationIncrement);
    auto gs = e.AcquireMany(torn, reqs, o, nullptr);
    REQUIRE(gs.ok());
    REQUIRE(gs->size() == 2);
    CHECK((*gs)[0].generation == 0x100);
    CHECK((*gs)[1].generation == 0x300);
    for (const Status& st : e.ReleaseMany(torn, *gs)) REQUIRE(st.ok());
  }
}

// A waiter whose poll READ looked like its ticket was skipped (a torn view) confirms that on the
// word atomically; when the atomic read showed the grant instead (it came after the READ), the
// grant took its token's generation from the READ's word1, copied before the grant: a bump in
// between (a racing reset's late FA, a renewal carry) gave it an older generation than a holder
// before it may have had (found by review, 2026-12-06). A generation is read after the grant.
TEST_CASE("torn READs: a grant confirmed atomically takes a generation read after it") {
  InProcessTable table(4);
  LockEngine e(Params(4), nullptr);
  InProcessMemory holder(&table), waiter(&table);
  table.Store(0, 1, 0x100 * proto::kGenerationIncrement);
  AcquireOptions o;
  o.want_token = true;
  auto x = e.Acquire(holder, 0, Mode::kExclusive, o);
  REQUIRE(x.ok());
  waiter.set_min_round_trip(100us);
  std::atomic<int> torn{0};
  waiter.set_read_filter([&](RemoteOp& op) {
    if (op.offset % proto::kSlotSize != 0 || op.into != nullptr || op.length != 16 ||
        torn.load() > 0) {
      return;
    }
    // The READ copied word0 and word1 (generation 0x100); a torn byte makes nX look a byte's
    // worth past the waiter's turn. Then, before the waiter looks at the word itself, the
    // generation moves on and the holder releases: the waiter's grant is in generation 0x101.
    Word0 w = Word0::Decode(op.result[0]);
    w.n_x = static_cast<uint16_t>(w.n_x + 256);
    op.result[0] = w.Encode();
    table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
    REQUIRE(e.Release(holder, *x).ok());
    ++torn;
  });
  AcquireOptions wo = o;
  wo.deadline = Clock::now() + 5s;
  auto g = e.Acquire(waiter, 0, Mode::kExclusive, wo);
  REQUIRE(g.ok());
  REQUIRE(torn.load() == 1);
  CHECK(g->generation == 0x101);
  CHECK(g->token > x->token);
  REQUIRE(e.Release(waiter, *g).ok());
}

// A tag newer than the word's generation is what the stale-entry model (tests/model/
// stale_entry.pml) shows unsafe: lockd would act on the entry in a later generation, where its
// ticket numbers may be another holder's. Older (or no tag) only costs a done mark.
TEST_CASE("torn READs: a record's tag and the session's hints do not take a torn generation") {
  InProcessTable table(128, 4096);
  LockEngine e(Params(128), nullptr);
  RecordedChannel ch(&table, proto::SessionRecord::EntryOffset(0));
  ch.mem.set_read_filter(TearGenerations);
  table.Store(0, 1, 0x100 * proto::kGenerationIncrement);
  table.Store(1, 1, 0x200 * proto::kGenerationIncrement);
  table.Store(64, 1, 0x400 * proto::kGenerationIncrement);
  for (uint64_t slot : {0, 1, 2, 64, 0, 1}) {
    INFO("slot " << slot);
    const uint64_t want = proto::Generation(table.Load(slot, 1));
    Grant g = ch.Acquire(e, slot);  // the first on 0 and on 64 READ the block; 1 and 2 hints
    if (g.ticket.tagged) CHECK(g.ticket.generation == want);
    REQUIRE(e.Release(ch.mem, g).ok());
  }
  // A waiter granted by its READ (the retag when the grant's generation differs from the tag).
  InProcessMemory holder(&table);
  auto x = e.Acquire(holder, 1, Mode::kExclusive, {});
  REQUIRE(x.ok());
  table.Store(1, 1, 0x500 * proto::kGenerationIncrement);  // as if lockd's verdict moved it on
  const uint16_t tickets = W0(table, 1).max_x;
  Result<Grant> g = Error(ErrorCode::kInternal, "not run");
  std::thread t([&] {
    ch.o.deadline = Clock::now() + 5s;
    ch.o.record_seq = ch.NextSeq();
    g = e.Acquire(ch.mem, 1, Mode::kExclusive, ch.o);
  });
  // Queued before the release (a sleep of 5 ms was not always enough on a loaded host: granted
  // at once, the request kept a hint's older tag, which is allowed, and the check below failed).
  while (W0(table, 1).max_x == tickets) std::this_thread::yield();
  REQUIRE(e.Release(holder, *x).ok());
  t.join();
  REQUIRE(g.ok());
  if (g->ticket.tagged) CHECK(g->ticket.generation == 0x500);
  REQUIRE(e.Release(ch.mem, *g).ok());
}

// A waiter checked its lease against a clock read before the wait's callback (AcquireMany renews
// the set's held locks there, a round trip each; or the thread is descheduled) and the READ
// after it: a grant that READ showed was returned with its lease start the last READ before, a
// lease that had run out (found by review, 2026-12-06). Its holder could not release it, and the
// lock stalled for F x L. Such a grant goes to the reaper and the request queues again.
TEST_CASE(
    "a grant seen after the waiter lost sight of the word for a lease is not returned lapsed") {
  InProcessTable table(1);
  Reaper reaper(&table);
  LockEngine e(Params(1, 100ms), [&](const Ticket& t) { reaper.Add(t); });
  InProcessMemory a(&table), b(&table);
  auto g = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(g.ok());
  AcquireOptions o;
  int calls = 0;
  bool released = false;  // checked on this thread (Catch2 asserts on one thread)
  o.while_waiting = [&] {
    if (calls++ == 0) {
      released = e.Release(a, *g).ok();  // granted to the waiter while it does not look
      std::this_thread::sleep_for(150ms);
    }
    return true;
  };
  std::atomic<bool> done{false};
  Result<Grant> w = Error(ErrorCode::kInternal, "not run");
  std::thread tb([&] {
    w = e.Acquire(b, 0, Mode::kExclusive, o);
    done = true;
  });
  size_t reaped = 0;
  while (!done) {
    reaped += reaper.DrainAll(e);
    std::this_thread::sleep_for(1ms);
  }
  tb.join();
  reaped += reaper.DrainAll(e);
  REQUIRE(released);
  REQUIRE(w.ok());
  CHECK(e.LeaseValid(*w, Clock::now()));
  CHECK(reaped == 1);
  REQUIRE(e.Release(b, *w).ok());
  CHECK(W0(table, 0).Drained());
}

// A waiter's stall time (F x L without progress, then it recovers the lock) counted from the
// first READ that showed the word's view. A torn READ can show a value the word reaches only
// later (a byte from after a carry: docs/protocol.md, torn READs), and a READ after the word
// reached it then looked like no progress: the timer had started before that grant, up to a poll
// interval and more earlier, and the waiter recovered the lock under a holder granted less than
// F x L before (found by review of the model against the code, 2026-12-06; with F = 2 and a
// renewal landing late, the holder's renewed lease still ran). Stall time now counts from the
// second READ in a row to show the view.
TEST_CASE("torn READs: stall time does not count from a view the word reached only later") {
  InProcessTable table(1);
  LockEngine e(Params(1, 100ms), nullptr);  // stall recovery after 200 ms
  InProcessMemory a(&table), h(&table), w(&table);
  auto ga = e.Acquire(a, 0, Mode::kExclusive, {});
  REQUIRE(ga.ok());
  // H queues behind A and, once granted, holds without a word (no renewal, no release).
  Result<Grant> gh = Error(ErrorCode::kInternal, "not run");
  std::thread th([&] { gh = e.Acquire(h, 0, Mode::kExclusive, {}); });
  while (W0(table, 0).max_x != 2) std::this_thread::yield();
  // W queues behind H. Its first poll READ shows the word as A's release will leave it.
  std::atomic<int> reads{0};
  w.set_read_filter([&](RemoteOp& op) {
    if (op.offset % proto::kSlotSize != 0 || op.into != nullptr) return;
    if (reads.fetch_add(1) != 0) return;
    Word0 v = Word0::Decode(op.result[0]);
    v.n_x = static_cast<uint16_t>(v.n_x + 1);
    op.result[0] = v.Encode();
  });
  std::atomic<bool> torn_seen{false};
  Clock::time_point granted_h;  // set by this thread before W's next READ
  std::atomic<bool> released{false};
  AcquireOptions o;
  o.deadline = Clock::now() + 5s;
  o.while_waiting = [&] {
    if (reads.load() == 1 && !torn_seen.exchange(true)) {
      // After the torn READ, before the next: A releases 80 ms later, and H is granted.
      while (!released.load()) std::this_thread::sleep_for(1ms);
    }
    return true;
  };
  EngineEvents ev;
  Result<Grant> gw = Error(ErrorCode::kInternal, "not run");
  Clock::time_point w_done;
  std::thread tw([&] {
    gw = e.Acquire(w, 0, Mode::kExclusive, o, &ev);
    w_done = Clock::now();
  });
  while (reads.load() == 0) std::this_thread::sleep_for(100us);
  std::this_thread::sleep_for(80ms);
  granted_h = Clock::now();
  REQUIRE(e.Release(a, *ga).ok());
  released = true;
  th.join();
  REQUIRE(gh.ok());
  tw.join();
  REQUIRE(gw.ok());
  REQUIRE(ev.recoveries.get() == 1);  // H never releases: W recovers the lock from it
  const auto after = std::chrono::duration_cast<std::chrono::milliseconds>(w_done - granted_h);
  INFO("W recovered the lock " << after.count() << " ms after H's grant (F x L: 200 ms)");
  CHECK(after >= 200ms);
}
