// The protocol engine over the in-process backend: request records and lockd's recovery of a
// dead client's requests (Reap), and issue 16's findings on the engine.
#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "client/src/entry_pool.h"
#include "engine/lock_engine.h"
#include "rdmalock/proto/layout.h"
#include "tests/support/inproc_memory.h"
#include "tests/unit/lock_engine_test_util.h"

using namespace rdmalock;
using namespace std::chrono_literals;
using proto::Word0;
using namespace rdmalock::engine_test;

// ---- Request records and lockd's recovery (Reap)

namespace {
// What a client of protocol version 7 or before wrote for grant `g` at byte `off`: the entry
// untagged, with the FA's whole ticket (lockd of version 8 still serves such clients, and their
// shared entries, and exclusive ones a session knew no generation for, were all untagged).
void WriteUntagged(InProcessTable& table, uint64_t off, const Grant& g) {
  proto::RequestEntry en;
  REQUIRE(LiveEntryAt(table, off, &en));
  en.tagged = false;
  en.generation = 0;
  en.ticket = g.ticket.word.Encode();
  const auto w = en.Encode();
  table.session_word(off).store(w[0]);
  table.session_word(off + 8).store(w[1]);
}

// Whether a writer's try-lock on slot 0, on channel `m`, is granted now (released again if so).
bool WriterGranted(const LockEngine& e, InProcessMemory& m) {
  AcquireOptions try_only;
  try_only.try_only = true;
  auto g = e.Acquire(m, 0, Mode::kExclusive, try_only);
  if (g.ok()) REQUIRE(e.Release(m, *g).ok());
  return g.ok();
}

// Client A of fixture `f` asks for slot 0 in `mode` (its entry `f.o`, use f.o.record_seq) and
// waits behind a holder; once its entry is written, A stops (its channel breaks) while it waits.
// Returns A's entry as A left it.
proto::RequestEntry StopWhileWaiting(RecordedClients& f, Mode mode) {
  std::atomic<bool> ended{false};
  std::thread waiter([&] { ended = !f.e.Acquire(f.a, 0, mode, f.o).ok(); });
  proto::RequestEntry entry;
  const auto written = [&] {
    return LiveEntryAt(f.table, f.o.record, &entry) && entry.seq == f.o.record_seq;
  };
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  while (!written() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  f.a.Break();
  waiter.join();
  REQUIRE(ended);
  REQUIRE(written());
  return entry;
}
}  // namespace

TEST_CASE_METHOD(RecordedClients,
                 "records: lockd frees a dead client's held and queued requests, exactly once") {
  auto ga = e.Acquire(a, 0, Mode::kExclusive, o);  // A holds slot 0
  REQUIRE(ga.ok());
  o.record = rec + proto::SessionRecord::EntryOffset(1);
  auto gb = e.Acquire(b, 1, Mode::kExclusive, {});  // B holds slot 1 ...
  REQUIRE(gb.ok());
  // ... and A queues behind it: its FA and its entry, as a waiting Acquire leaves them.
  const Word0 queued = QueueExclusive(a, 1);
  proto::RequestEntry q;
  q.slot = 1;
  q.mode = Mode::kExclusive;
  q.state = proto::RequestEntry::State::kQueued;
  q.seq = 5;
  q.ticket = queued.Encode();
  const auto w = q.Encode();
  table.session_word(o.record).store(w[0]);
  table.session_word(o.record + 8).store(w[1]);
  a.Break();  // A dies (fenced)

  // lockd frees A's grant at once; A's queued request is released when its turn comes.
  REQUIRE(ReapRecord(table, e, rec) == 1);
  auto got0 = e.Acquire(c, 0, Mode::kExclusive, {.try_only = true});
  REQUIRE(got0.ok());
  REQUIRE(e.Release(b, *gb).ok());          // B releases: A's dead ticket is next ...
  REQUIRE(ReapRecord(table, e, rec) == 1);  // ... and lockd releases it for A
  auto got1 = e.Acquire(c, 1, Mode::kExclusive, {.try_only = true});
  REQUIRE(got1.ok());
  // Reaping again changes nothing: A's tickets are over.
  REQUIRE(ReapRecord(table, e, rec) == 0);
  REQUIRE(e.Release(c, *got0).ok());
  REQUIRE(e.Release(c, *got1).ok());
  REQUIRE(W0(table, 0).Drained());
  REQUIRE(W0(table, 1).Drained());
}

// Issue 19, item 3: an exclusive release writes no done mark when its entry is tagged with the
// generation. The entry then stays live in the record after the release. Should the slot go
// through a reset and a later holder draw the same ticket numbers, lockd must not take that
// entry for the later grant when the first client's session ends.
TEST_CASE_METHOD(
    RecordedClients,
    "item 3: a released, unmarked exclusive entry never frees a later holder of its numbers") {
  // A's first request on slot 0 READs word1 with its FA (the session knows nothing of the slot),
  // its second is tagged from what the first learned: ticket max_x 1 in generation 0.
  auto first = e.Acquire(a, 0, Mode::kExclusive, o);
  REQUIRE(first.ok());
  REQUIRE(first->ticket.tagged);
  REQUIRE(e.Release(a, *first).ok());
  o.record_seq = 2;
  auto ga = e.Acquire(a, 0, Mode::kExclusive, o);
  REQUIRE(ga.ok());
  REQUIRE(ga->ticket.tagged);
  REQUIRE(e.Release(a, *ga).ok());
  // No done mark: the entry still reads as a live request (the record is as the FA left it).
  proto::RequestEntry left;
  REQUIRE(LiveEntryAt(table, o.record, &left));
  REQUIRE(left.tagged);
  REQUIRE(left.generation == 0);

  SECTION("the same generation: the word moved past the ticket") {
    auto gb = e.Acquire(b, 0, Mode::kExclusive, {});
    REQUIRE(gb.ok());
    a.Break();
    REQUIRE(ReapRecord(table, e, rec) == 0);
    REQUIRE(e.Release(b, *gb).ok());
  }
  SECTION("a later generation: a reset, and B draws A's ticket numbers again") {
    // 32,768 grants later the word froze and drained, and its last participant reset it
    // (generation first, then word0), as LockEngine::ResetDrained does. One request of another
    // client came and went in the new generation, so B's ticket is A's again (max_x 1).
    table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
    table.Store(0, 0, Word0{.max_s = 0, .max_x = 1, .n_s = 0, .n_x = 1}.Encode());
    auto gb = e.Acquire(b, 0, Mode::kExclusive, {});
    REQUIRE(gb.ok());
    REQUIRE(gb->ticket.word.max_x == left.ticket >> 16);  // the numbers A's entry shows
    a.Break();                                            // A dies; lockd reaps its record
    const int released = ReapRecord(table, e, rec);
    CHECK(released == 0);
    // B still holds: its release finds its grant and frees the lock.
    REQUIRE(e.Release(b, *gb).ok());
    REQUIRE(W0(table, 0) == Word0{.max_s = 0, .max_x = 2, .n_s = 0, .n_x = 2});
  }
  SECTION("an entry tagged with an older generation than its grant's is left alone") {
    // What a stale hint would write: lockd ignores the entry (the waiters' stall recovery covers
    // a holder that died), and never acts on it in another generation.
    table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
    auto gc = e.Acquire(c, 0, Mode::kExclusive, {});
    REQUIRE(gc.ok());
    proto::RequestEntry st = left;
    st.ticket = gc->ticket.word.Encode();
    st.seq = 3;
    const auto w = st.Encode();  // generation 0, the slot is in 1
    table.session_word(o.record).store(w[0]);
    table.session_word(o.record + 8).store(w[1]);
    a.Break();
    REQUIRE(ReapRecord(table, e, rec) == 0);
    REQUIRE(e.Release(c, *gc).ok());
  }
}

TEST_CASE("records: a crash anywhere in a shared release never releases it twice") {
  // Readers A and B hold slot 0, writer C waits. A's release is cut short by a crash before its
  // first or its second operation; lockd then reaps A's record. B must still hold, C must not be
  // granted, and the word must count A's release at most once.
  for (int crash_at = 0; crash_at < 3; ++crash_at) {
    INFO("crash before operation " << crash_at << " of the release");
    InProcessTable table(1, 2 * 4096);
    LockEngine e(Params(1), nullptr);
    InProcessMemory a(&table), b(&table), c(&table);
    const uint64_t rec = 4096;
    AcquireOptions o;
    o.record = rec + proto::SessionRecord::EntryOffset(0);
    o.record_seq = 1;
    auto ga = e.Acquire(a, 0, Mode::kShared, o);
    auto gb = e.Acquire(b, 0, Mode::kShared, {});
    REQUIRE(ga.ok());
    REQUIRE(gb.ok());
    const Ticket ct{0, Mode::kExclusive, QueueExclusive(c, 0), 0, 0};  // C queues
    REQUIRE(e.Renew(a, *ga).ok());  // A has seen the word as it is: its release CAS will match
    int ops = 0;
    a.set_hook([&](const RemoteOp&) { return ops++ != crash_at; });
    (void)e.Release(a, *ga);
    (void)ReapRecord(table, e, rec);
    const Word0 w = W0(table, 0);
    INFO("nS " << w.n_s << " maxS " << w.max_s);
    REQUIRE(w.n_s <= 1);                                 // A's release counted at most once
    REQUIRE_FALSE(proto::Granted(w, ct.word, ct.mode));  // B still holds: C waits
    REQUIRE(e.Release(b, *gb).ok());
  }
}

// Found by review (2026-12-05): lockd's reap of a dead reader releases its ticket with a CAS. If
// the loopback connection drops after that CAS landed but before its completion came back, lockd
// reconnects and steps the same item again: a shared release carries no identity and leaves nX
// where it was, so the word still shows the ticket granted, and it was released a second time,
// counting for a live reader (a writer could then be granted beside it). A step whose CAS may
// have landed unseen now leaves the ticket to the waiters' stall recovery. The same for the
// stall recovery's own CAS.
TEST_CASE("records: a reap whose release CAS landed unseen never releases the reader again") {
  InProcessTable table(1, 2 * 4096);
  LockEngine e(Params(1), nullptr);
  InProcessMemory a(&table), b(&table), c(&table);
  auto ga = e.Acquire(a, 0, Mode::kShared, {});  // the dead client's reader
  auto gb = e.Acquire(b, 0, Mode::kShared, {});  // a live one
  REQUIRE(ga.ok());
  REQUIRE(gb.ok());
  const Ticket ct{0, Mode::kExclusive, QueueExclusive(c, 0), 0, 0};  // writer C queues
  ReapState r;
  r.ticket = ga->ticket;
  InProcessMemory lost(&table);  // lockd's loopback, dropping after its first CAS lands
  lost.set_after_hook([](const RemoteOp& op) { return op.kind != RemoteOp::Kind::kCompareSwap; });
  auto first = e.Reap(lost, r);
  REQUIRE_FALSE(first.ok());
  CHECK(W0(table, 0).n_s == 1);   // A's release landed
  InProcessMemory again(&table);  // reconnected
  for (int i = 0; i < 4 && r.outcome == ReapState::Outcome::kPending; ++i) {
    auto next = e.Reap(again, r);
    REQUIRE(next.ok());
  }
  const Word0 w = W0(table, 0);
  INFO("nS " << w.n_s << " maxS " << w.max_s << ", outcome " << static_cast<int>(r.outcome));
  CHECK(w.n_s == 1);                                 // A's release counted once
  CHECK_FALSE(proto::Granted(w, ct.word, ct.mode));  // B still holds: C waits
  CHECK(r.outcome == ReapState::Outcome::kGaveUp);
  REQUIRE(e.Release(b, *gb).ok());
}

// Found by review (2026-12-05): a reader's stall recovery counts its own ticket as released
// (nS + 1, nX at its maxX), so the ticket then looks granted. The recovery's CAS went out with the
// request's entry still live, until the retry's WRITE after its next FETCH_AND_ADD: a session that
// ended in between (the connection dropped after the CAS landed, or the client died) left an entry
// lockd found granted and released again, counting for a live reader, and a writer was granted
// beside it. The same for the SDK reaper's recovery of its own abandoned ticket, whose entry was
// freed only after the CAS. The entry is now cleared in the CAS's doorbell, ahead of it.
TEST_CASE("records: a reader's stall recovery never leaves its ticket for lockd to release") {
  InProcessTable table(1, 2 * 4096);
  std::vector<Ticket> abandoned;
  LockEngine e(Params(1, std::chrono::milliseconds(30)),
               [&](const Ticket& t) { abandoned.push_back(t); });
  InProcessMemory x(&table), r(&table), a(&table), w(&table);
  const uint64_t rec = 4096;
  REQUIRE(e.Acquire(x, 0, Mode::kExclusive, {}).ok());  // X holds, and dies
  RemoteOp fa = RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(0), proto::kAcquireShared);
  REQUIRE(r.Execute(fa).ok());  // reader R queues behind X
  const Word0 rt = Word0::Decode(fa.result[0]);
  AcquireOptions o;
  o.record = rec + proto::SessionRecord::EntryOffset(0);
  o.record_seq = 2;
  Word0 wt{};
  bool queued = false;
  a.set_hook([&](const RemoteOp& op) {  // writer W queues behind A once A waits
    if (op.kind == RemoteOp::Kind::kRead && !queued) {
      queued = true;
      wt = QueueExclusive(w, 0);
    }
    return true;
  });
  SECTION("a waiter's recovery, its connection dropping after the CAS landed") {
    a.set_after_hook([](const RemoteOp& op) { return op.kind != RemoteOp::Kind::kCompareSwap; });
    auto ga = e.Acquire(a, 0, Mode::kShared, o);  // recovers X's grant after F x L
    REQUIRE_FALSE(ga.ok());
  }
  SECTION("the SDK reaper's recovery of its abandoned ticket, its CAS landing unseen") {
    o.deadline = Clock::now() + std::chrono::milliseconds(5);
    auto ga = e.Acquire(a, 0, Mode::kShared, o);  // times out: W is behind, so it is abandoned
    REQUIRE(ga.status().code() == ErrorCode::kTimeout);
    REQUIRE(abandoned.size() == 1);
    ReapState rs;
    rs.ticket = abandoned[0];
    rs.own = true;
    InProcessMemory reaper(&table);
    reaper.set_after_hook(
        [](const RemoteOp& op) { return op.kind != RemoteOp::Kind::kCompareSwap; });
    bool broke = false;
    for (int i = 0; i < 400 && !broke; ++i) {  // F x L is 60 ms
      auto done = e.Reap(reaper, rs);
      broke = !done.ok();
      if (done.ok()) REQUIRE_FALSE(*done);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(broke);
  }
  REQUIRE(proto::Granted(W0(table, 0), rt, Mode::kShared));  // X's grant recovered: R holds
  (void)ReapRecord(table, e, rec);  // the session ended: lockd reaps what its record shows
  const Word0 now = W0(table, 0);
  INFO("nX " << now.n_x << " nS " << now.n_s << " maxS " << now.max_s);
  CHECK(now.n_s == 1);                                     // A's ticket counted once
  CHECK_FALSE(proto::Granted(now, wt, Mode::kExclusive));  // R still holds: W waits
}

// Found by review (2026-12-05): one use of an entry can be written on two QPs. A grant's entry
// WRITE is posted on the acquiring thread's channel, and the use can end on another (a handle
// released on another thread, a shared grant's last reader, an async request finished by a waiter
// thread, the reaper): the entry goes back to the pool when that other channel's done mark has
// completed, while the WRITE may still be in flight on the first (a retransmission). Landing after
// the entry's next use had ended (done mark 4), the stale (seq 2, ticket) looked live, since an
// entry was live while its seq differed from the done mark, and lockd released that ticket again
// when the session ended. An entry is now live only while its seq is newer than the done mark
// (RequestEntry::Newer): an older use's late WRITE is over.
TEST_CASE("records: a late entry WRITE of an earlier use never makes it live again") {
  InProcessTable table(1, 2 * 4096);
  LockEngine e(Params(1), nullptr);
  InProcessMemory a(&table), b(&table), c(&table), r(&table), w(&table);
  const uint64_t rec = 4096, entry = rec + proto::SessionRecord::EntryOffset(0);
  AcquireOptions o;
  o.record = entry;
  o.record_seq = 2;
  auto g1 = e.Acquire(a, 0, Mode::kShared, o);  // its entry WRITE posted on a's QP
  REQUIRE(g1.ok());
  const uint64_t late_a = table.session_word(entry).load(),
                 late_b = table.session_word(entry + 8).load();
  REQUIRE(e.Release(b, *g1).ok());  // released on another thread's channel: done mark 2
  o.record_seq = proto::RequestEntry::NextSeq(2);
  auto g2 = e.Acquire(c, 0, Mode::kShared, o);  // the entry's next use
  REQUIRE(g2.ok());
  REQUIRE(e.Release(c, *g2).ok());          // done mark 4
  table.session_word(entry).store(late_a);  // a's WRITE of use 2, retransmitted, lands now
  table.session_word(entry + 8).store(late_b);
  auto gr = e.Acquire(r, 0, Mode::kShared, {});  // another client's reader
  REQUIRE(gr.ok());
  const Word0 wt = QueueExclusive(w, 0);           // and a writer behind it
  const int released = ReapRecord(table, e, rec);  // the session ends: lockd reaps its record
  const Word0 now = W0(table, 0);
  INFO("lockd released " << released << "; nS " << now.n_s << " maxS " << now.max_s);
  CHECK(released == 0);
  CHECK_FALSE(proto::Granted(now, wt, Mode::kExclusive));  // R still holds: W waits
  REQUIRE(e.Release(r, *gr).ok());
}

// Found by the review of the change above: an entry is live only while its seq is newer than its
// done mark within half the 17-bit range, and a tagged exclusive release writes no done mark, nor
// does a request that ends without its grant (it clears the entry). A thread taking one lock
// exclusively again and again left the mark at 0 while its entry's seq grew, and from the
// 32,768th use on its live entries looked over: lockd never freed a dead holder's lock (waiters
// recovered it after F x L). A tagged release now writes the mark once every 8,192 uses of an
// entry, and a cleared entry gets its use's mark too.
TEST_CASE("records: an entry's done mark keeps up with its seq, whatever its releases") {
  InProcessTable table(1, 2 * 4096);
  LockEngine e(Params(1), nullptr);
  InProcessMemory a(&table), b(&table);
  const uint64_t rec = 4096;
  AcquireOptions o;
  o.record = rec + proto::SessionRecord::EntryOffset(0);
  o.want_token = true;  // its exclusive entries are tagged
  uint32_t seq = 2;
  bool tagged = true;
  for (int use = 0; use < 32'768; ++use, seq = proto::RequestEntry::NextSeq(seq)) {
    o.record_seq = seq;
    auto g = e.Acquire(a, 0, Mode::kExclusive, o);
    REQUIRE(g.ok());
    tagged = tagged && g->ticket.tagged;
    REQUIRE(e.Release(a, *g).ok());
  }
  CHECK(tagged);
  o.record_seq = seq;  // 65,538: the client dies holding it
  auto held = e.Acquire(a, 0, Mode::kExclusive, o);
  REQUIRE(held.ok());
  const Word0 bt = QueueExclusive(b, 0);
  const int released = ReapRecord(table, e, rec);
  INFO("seq " << seq << ", done mark "
              << table.session_word(o.record + proto::RequestEntry::kDone).load());
  CHECK(released == 1);  // lockd freed the dead holder's lock
  CHECK(proto::Granted(W0(table, 0), bt, Mode::kExclusive));
}

// ---- Issue 16's findings on the engine (each test failed on the code before its fix)

TEST_CASE("finding 3: an entry goes back to the pool only once its done mark has landed") {
  // A's try-lock gives up and marks its entry done; the mark is still in flight on A's QP (a
  // retransmission) when the entry is handed back. B takes the same entry (the pool is LIFO) on
  // its own QP, is granted a shared lock and releases it. A's late mark then lands last. The
  // record must not show B's finished request as live: lockd would release B's shared ticket a
  // second time and admit a writer beside a reader.
  InProcessTable table(1, 2 * 4096);
  const uint64_t rec = 4096;
  EntryPool pool(rec, 4);
  LockEngine e(Params(1), nullptr, [&](uint64_t entry) { pool.Give(entry); });
  InProcessMemory h(&table), a(&table), b(&table);
  auto held = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(held.ok());

  a.set_hold_posts(true);  // what A posts without waiting lands only when the test says
  AcquireOptions o;
  std::tie(o.record, o.record_seq) = pool.Take();
  o.try_only = true;
  REQUIRE(e.Acquire(a, 0, Mode::kExclusive, o).status().code() == ErrorCode::kBusy);
  REQUIRE(e.Release(h, *held).ok());

  AcquireOptions ob;
  std::tie(ob.record, ob.record_seq) = pool.Take();
  INFO("A's entry " << o.record << ", B's entry " << ob.record);
  auto gb = e.Acquire(b, 0, Mode::kShared, ob);
  REQUIRE(gb.ok());
  REQUIRE(e.Release(b, *gb).ok());
  a.LandHeld();  // A's late done mark
  InProcessMemory c(&table);
  auto gc = e.Acquire(c, 0, Mode::kShared, {});  // another reader holds now
  REQUIRE(gc.ok());

  const uint64_t entry = ob.record;
  proto::RequestEntry seen;
  const bool live = LiveEntryAt(table, entry, &seen);
  CHECK_FALSE(live);
  // What lockd does with that record when the session ends: nothing to release, so C's
  // shared grant still counts and a writer would wait.
  CHECK(ReapRecord(table, e, rec) == 0);
  CHECK(W0(table, 0).n_s + 1 == W0(table, 0).max_s);
  REQUIRE(e.Release(c, *gc).ok());
}

TEST_CASE(
    "finding 8: a frozen-word withdrawal never takes back an increment of a later generation") {
  // W's FETCH_AND_ADD lands on frozen word F1 (a dead requester's increment left in it).
  // W is preempted before its withdrawal; meanwhile others rescue the word (generation + 1, word
  // to 0), and it fills up and freezes again as F2 with other requesters' increments. W's first
  // CAS misses; it must not then withdraw from F2, whose increments are not W's.
  InProcessTable table(1);
  const auto lease = 20ms;
  LockEngine e(Params(1, lease), nullptr);
  const uint16_t cmax = proto::kCountMax;
  const Word0 f1{.max_s = 4, .max_x = uint16_t(cmax + 1), .n_s = 4, .n_x = cmax};
  table.Store(0, 0, f1.Encode());
  // (Its last ticket held: a word with nothing but bounces left in it W would reset, rightly.)
  const Word0 f2{.max_s = 2, .max_x = uint16_t(cmax + 3), .n_s = 2, .n_x = uint16_t(cmax - 1)};
  InProcessMemory w(&table), other(&table);
  int ops = 0;
  w.set_hook([&](const RemoteOp& op) {
    // Before W's first operation after its FA: the rescue and the refill happen (on another QP),
    // while W sleeps a while as a preempted thread does.
    if (ops++ == 1 && op.kind == RemoteOp::Kind::kCompareSwap) {
      RemoteOp r[2] = {
          RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(0) + 8,
                             proto::kGenerationIncrement),
          RemoteOp::CompareSwap(RegionId::kLocks, proto::SlotOffset(0), table.Load(0, 0), 0)};
      REQUIRE(other.Execute(r).ok());
      RemoteOp fill = RemoteOp::FetchAdd(RegionId::kLocks, proto::SlotOffset(0), f2.Encode());
      REQUIRE(other.Execute(fill).ok());
      std::this_thread::sleep_for(5ms);
    }
    return true;
  });
  AcquireOptions o;
  o.try_only = true;
  (void)e.Acquire(w, 0, Mode::kExclusive, o);
  const Word0 now = W0(table, 0);
  INFO("word0 after W's withdrawal: maxX " << now.max_x << " maxS " << now.max_s << " nX "
                                           << now.n_x << " nS " << now.n_s);
  CHECK(now == f2);  // F2's increments are all still there
}

TEST_CASE("finding 9: a request queued longer than a lease gives its old ticket back") {
  // The async pump issues W's FETCH_AND_ADD; W then sits in the queue longer than a lease before
  // a waiter thread picks it up (4 waiters, many requests). The pause rule queues W again; its
  // first ticket must not be left in the word, or the lock stalls for F x L when its turn comes.
  InProcessTable table(1);
  const auto lease = 40ms;
  Reaper reaper(&table);
  LockEngine e(Params(1, lease), [&](const Ticket& t) { reaper.Add(t); });
  InProcessMemory h(&table), w(&table);
  auto held = e.Acquire(h, 0, Mode::kExclusive, {});
  REQUIRE(held.ok());
  const ManyRequest reqs[] = {{0, Mode::kExclusive, false}};
  auto issued = e.IssueMany(w, reqs, false, nullptr, nullptr);
  REQUIRE(issued.ok());
  REQUIRE_FALSE((*issued)[0].granted);
  for (int i = 0; i < 3; ++i) {  // more than a lease passes; the holder lives on, renewing
    std::this_thread::sleep_for(lease / 2);
    REQUIRE(e.Renew(h, *held).ok());
  }
  std::atomic<bool> stop{false};
  std::thread reap([&] {
    while (!stop.load()) {
      reaper.DrainAll(e);
      std::this_thread::sleep_for(1ms);
    }
  });
  std::thread release([&] {
    std::this_thread::sleep_for(5ms);
    (void)e.Release(h, *held);
  });
  EngineEvents ev;
  AcquireOptions o;
  o.deadline = Clock::now() + 60ms;  // well under F x L (80 ms) after the holder's release
  auto g = e.FinishAcquire(w, (*issued)[0].grant, o, &ev);
  release.join();
  stop.store(true);
  reap.join();
  INFO(g.status().ToString() << "; restarts " << ev.restarts.get() << ", abandoned "
                             << ev.abandoned.get());
  REQUIRE(g.ok());
  REQUIRE(ev.recoveries.get() == 0);
  REQUIRE(e.Release(w, *g).ok());
  reaper.DrainAll(e);
  REQUIRE(W0(table, 0).Drained());
}

TEST_CASE(
    "finding 3 (found by the records model): a request that ends before its entry is "
    "written leaves no earlier use looking live") {
  // The entry's first use: a shared grant, released (its done mark is seq 1). Its second use
  // bounces off a frozen word, so its entry is never written, and the try gives up. Marking that
  // use done with its own seq (2) would leave a = (seq 1, ticket) with d = 2: the released first
  // use would look live again, and lockd would release its shared ticket a second time.
  InProcessTable table(1, 2 * 4096);
  const uint64_t rec = 4096;
  EntryPool pool(rec, 1);
  LockEngine e(Params(1), nullptr, [&](uint64_t entry) { pool.Give(entry); });
  InProcessMemory a(&table), c(&table);
  AcquireOptions o1;
  std::tie(o1.record, o1.record_seq) = pool.Take();
  auto g1 = e.Acquire(a, 0, Mode::kShared, o1);
  REQUIRE(g1.ok());
  REQUIRE(e.Release(a, *g1).ok());
  // The word is frozen now (its last ticket held, and a requester's increment in it).
  const uint16_t cmax = proto::kCountMax;
  table.Store(
      0, 0,
      Word0{.max_s = 1, .max_x = uint16_t(cmax + 1), .n_s = 1, .n_x = uint16_t(cmax - 1)}.Encode());
  AcquireOptions o2;
  std::tie(o2.record, o2.record_seq) = pool.Take();
  REQUIRE(o2.record == o1.record);
  o2.try_only = true;
  REQUIRE(e.Acquire(a, 0, Mode::kShared, o2).status().code() == ErrorCode::kBusy);
  proto::RequestEntry seen;
  const bool live = proto::RequestEntry::DecodeLive(
      table.session_word(o1.record).load(), table.session_word(o1.record + 8).load(),
      table.session_word(o1.record + 16).load(), &seen);
  CHECK_FALSE(live);
  // With another reader holding, lockd's reap of this record must release nothing.
  table.Store(0, 0, Word0{.max_s = 1, .max_x = 0, .n_s = 1, .n_x = 0}.Encode());
  auto gc = e.Acquire(c, 0, Mode::kShared, {});
  REQUIRE(gc.ok());
  CHECK(ReapRecord(table, e, rec) == 0);
  CHECK(e.Release(c, *gc).ok());
}

// A renewal adds one to word1's low 16 bits, and every 65,536th carries into the generation
// (lock_word.h): a slot's generation moves on under a holder that keeps renewing (about 12 hours
// at the default lease). The holder's entry, tagged with the generation it was granted in, then
// read as over to lockd: when the holder died lockd freed nothing (the lock waited for the
// waiters' stall recovery, F x L) and `lockctl release --force <slot>` found no session holding it
// (found by review, 2026-12-05). The renewal that sees the carry writes the entry again with the
// slot's generation now: no reset can come while the ticket holds, so its counters are still
// current in it.
TEST_CASE_METHOD(RecordedClients,
                 "records: a renewal's carry into the generation keeps the holder's entry live") {
  table.Store(0, 1, 0xffff);  // generation 0, the next renewal carries
  auto g = e.Acquire(a, 0, Mode::kExclusive, o);
  REQUIRE(g.ok());
  REQUIRE(g->ticket.tagged);
  REQUIRE(g->ticket.generation == 0);
  const uint64_t token = g->token;
  REQUIRE(e.Renew(a, *g).ok());
  REQUIRE(proto::Generation(table.Load(0, 1)) == 1);
  CHECK(g->ticket.generation == 1);
  CHECK(g->token == token);  // the grant's fencing token is its own, whatever the renewals
  proto::RequestEntry entry;
  REQUIRE(LiveEntryAt(table, o.record, &entry));
  INFO("entry generation " << entry.generation << ", slot's "
                           << proto::Generation(table.Load(0, 1)));
  CHECK(entry.generation == 1);
  // The holder dies: lockd frees its lock at once from the record, and a waiter is granted.
  AcquireOptions try_only;
  try_only.try_only = true;
  CHECK(e.Acquire(b, 0, Mode::kExclusive, try_only).status().code() == ErrorCode::kBusy);
  a.Break();
  CHECK(ReapRecord(table, e, rec) == 1);
  auto gc = e.Acquire(c, 0, Mode::kExclusive, {});
  REQUIRE(gc.ok());
  REQUIRE(e.Release(c, *gc).ok());
}

// An untagged entry (every shared request's, from a client of version 7 or before) carries no
// generation: lockd tells its ticket from a later one with the same numbers only while the slot has
// not been reset. lockd's reap comes one lease after the fence, or later (its loopback connection
// down, retried until it is back); meanwhile waiters may recover the dead reader's ticket (F x L),
// the word may serve 32,768 tickets and reset, and new readers draw the same numbers. The reap then
// released one of their grants (a reader's release counted twice: a writer granted beside a reader;
// found by review, 2026-12-05). lockd notes the slot's generation when it reads the record, and a
// reap that finds it changed leaves the entry alone (ReapState::NoteScan): its ticket went with the
// reset.
TEST_CASE_METHOD(
    RecordedClients,
    "records: lockd never reaps an untagged entry in a later generation than its scan") {
  auto ga = e.Acquire(a, 0, Mode::kShared, o);
  REQUIRE(ga.ok());
  WriteUntagged(table, o.record, *ga);  // as a client of version 7 or before wrote it
  a.Break();                            // A dies; lockd fences it and reads its record
  std::vector<ReapState> items;
  const uint64_t off = o.record;
  proto::RequestEntry entry;
  REQUIRE(LiveEntryAt(table, off, &entry));
  items.push_back(ReapState::ForEntry(entry));
  items.back().NoteScan(table.Load(0, 1));
  // Before lockd's reap: waiters recovered A's ticket, the word served on, froze, drained and
  // reset (generation first, then word0), and two readers of other clients hold in the new
  // generation, the first with A's ticket numbers.
  table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
  table.Store(0, 0, 0);
  auto gb = e.Acquire(b, 0, Mode::kShared, {});
  REQUIRE(gb.ok());
  auto gc = e.Acquire(c, 0, Mode::kShared, {});
  REQUIRE(gc.ok());
  REQUIRE(gb->ticket.word == ga->ticket.word);
  InProcessMemory lockd_mem(&table);
  int released = 0;
  for (ReapState& r : items) {
    ReapToEnd(e, lockd_mem, r);
    if (r.outcome == ReapState::Outcome::kReleased) ++released;
  }
  CHECK(released == 0);
  // B leaves; C still reads: no writer may be granted.
  REQUIRE(e.Release(b, *gb).ok());
  InProcessMemory w(&table);
  AcquireOptions try_only;
  try_only.try_only = true;
  auto writer = e.Acquire(w, 0, Mode::kExclusive, try_only);
  INFO("word " << W0(table, 0).n_s << "/" << W0(table, 0).max_s << " readers released");
  CHECK_FALSE(writer.ok());
  if (writer.ok()) REQUIRE(e.Release(w, *writer).ok());
  REQUIRE(e.Release(c, *gc).ok());
}

namespace {
// Steps lockd's reap of `r` with an engine whose lease is 20 ms (a holder that does not move is
// a stall to it within 40 ms), until it is done or 2 s have passed; returns whether it is done.
bool ReapThroughStalls(InProcessTable& table, ReapState& r) {
  const LockEngine lockd{Params(4, std::chrono::milliseconds(20)), nullptr};
  InProcessMemory lockd_mem(&table);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < end) {
    auto step = lockd.Reap(lockd_mem, r);
    REQUIRE(step.ok());
    if (*step) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}
}  // namespace

// The reset may also come before lockd's scan: a waiting request of a client that stops is
// skipped by a waiter's stall recovery behind it, and the word drains and resets before the
// client is fenced. The scan then notes the new generation, and the untagged entry's numbers,
// from the old one, were taken for a ticket of the new: an exclusive count the word had not
// reached looked like requests still ahead, the word stalled (its readers held), and lockd's
// stall recovery installed n_x = 5 over max_x = 0: every later request of the slot saw itself
// skipped, for ever (found by review, 2026-12-07). A live ticket of the word's generation never
// shows numbers past the word's own, so such an entry is over.
TEST_CASE_METHOD(RecordedClients,
                 "records: lockd never recovers a stale untagged entry with numbers past the "
                 "word's") {
  for (int i = 0; i < 5; ++i) {  // five exclusive uses before A's: A's ticket has max_x 5
    auto g = e.Acquire(c, 0, Mode::kExclusive, {});
    REQUIRE(g.ok());
    REQUIRE(e.Release(c, *g).ok());
  }
  auto ga = e.Acquire(a, 0, Mode::kShared, o);
  REQUIRE(ga.ok());
  WriteUntagged(table, o.record, *ga);  // as a client of version 7 or before wrote it
  a.Break();  // A stops; the word resets before lockd fences A and reads its record
  table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
  table.Store(0, 0, 0);
  auto gb = e.Acquire(b, 0, Mode::kShared, {});  // two readers of the new generation hold
  REQUIRE(gb.ok());
  auto gc = e.Acquire(c, 0, Mode::kShared, {});
  REQUIRE(gc.ok());
  proto::RequestEntry entry;
  REQUIRE(LiveEntryAt(table, o.record, &entry));
  ReapState r = ReapState::ForEntry(entry);
  r.NoteScan(table.Load(0, 1));
  const bool done = ReapThroughStalls(table, r);
  const Word0 w = W0(table, 0);
  INFO("reap done " << done << ", outcome " << static_cast<int>(r.outcome) << "; word n_x " << w.n_x
                    << "/" << w.max_x << ", n_s " << w.n_s << "/" << w.max_s);
  CHECK(done);
  CHECK(r.outcome == ReapState::Outcome::kAlreadyDone);
  CHECK(w.n_x <= w.max_x);
  CHECK(w.n_s <= w.max_s);
  // The word serves on: the readers leave, and a writer is granted.
  REQUIRE(e.Release(b, *gb).ok());
  REQUIRE(e.Release(c, *gc).ok());
  CHECK(WriterGranted(e, b));
}

// The same with small numbers the new generation has reached: a stale shared entry {max_x 1,
// max_s 0}; in the new generation a reader came and went, and a writer holds and stalls. Nothing
// said the entry was over, and lockd's stall recovery installed n_s 2 over max_s 1: every later
// writer saw itself skipped, for ever (found by the review of the fix above, 2026-12-07). A live
// shared ticket keeps its increment in max_s until released, so a word with no reader
// outstanding (n_s == max_s) has none of the entry's.
TEST_CASE_METHOD(RecordedClients,
                 "records: lockd never recovers a stale shared entry when no reader is "
                 "outstanding") {
  {
    auto g = e.Acquire(c, 0, Mode::kExclusive, {});  // one writer before A: A's max_x is 1
    REQUIRE(g.ok());
    REQUIRE(e.Release(c, *g).ok());
  }
  auto ga = e.Acquire(a, 0, Mode::kShared, o);
  REQUIRE(ga.ok());
  WriteUntagged(table, o.record, *ga);  // as a client of version 7 or before wrote it
  a.Break();  // A stops; the word resets before lockd fences A and reads its record
  table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
  table.Store(0, 0, 0);
  {
    auto gb = e.Acquire(b, 0, Mode::kShared, {});  // a reader comes and goes
    REQUIRE(gb.ok());
    REQUIRE(e.Release(b, *gb).ok());
  }
  auto writer = e.Acquire(c, 0, Mode::kExclusive, {});  // and a writer holds (and stalls)
  REQUIRE(writer.ok());
  proto::RequestEntry entry;
  REQUIRE(LiveEntryAt(table, o.record, &entry));
  ReapState r = ReapState::ForEntry(entry);
  r.NoteScan(table.Load(0, 1));
  const bool done = ReapThroughStalls(table, r);
  const Word0 w = W0(table, 0);
  INFO("reap done " << done << ", outcome " << static_cast<int>(r.outcome) << "; word n_x " << w.n_x
                    << "/" << w.max_x << ", n_s " << w.n_s << "/" << w.max_s);
  CHECK(done);
  CHECK(r.outcome == ReapState::Outcome::kAlreadyDone);
  CHECK(w.n_s <= w.max_s);
  // The word serves on: the writer leaves, and the next one is granted.
  REQUIRE(e.Release(c, *writer).ok());
  CHECK(WriterGranted(e, b));
}

// The gap the two fixes above left open (docs/protocol.md, section 11): the new generation reaches
// the stale entry's numbers in both fields, with a request of its mode outstanding. A waits as a
// reader behind a writer and stops; a waiter further back recovers the writer's stall, which
// skips A's ticket too, and the word drains and resets before lockd fences A. In the new
// generation a writer comes and goes and two readers hold, the first with A's numbers. An
// untagged entry says nothing of its generation: lockd's scan noted the new one, the reap took
// A's ticket for the first reader's grant and released it, and once that reader left, a writer
// was granted beside the second (found by review, 2026-12-07). A shared entry now carries its
// generation, as an exclusive one does, and lockd acts on it only in that generation.
TEST_CASE_METHOD(RecordedClients,
                 "records: lockd never acts on a stopped waiter's entry from before a reset, "
                 "whatever numbers the new generation reached") {
  auto writer = e.Acquire(c, 0, Mode::kExclusive, {});  // holds, and will stall
  REQUIRE(writer.ok());
  const proto::RequestEntry entry = StopWhileWaiting(*this, Mode::kShared);
  const uint64_t gen_before = proto::Generation(table.Load(0, 1));
  // A waiter's stall recovery skipped the writer's ticket and A's; the word drained and reset.
  table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);
  table.Store(0, 0, 0);
  {
    auto gw = e.Acquire(b, 0, Mode::kExclusive, {});  // a writer of the new generation leaves
    REQUIRE(gw.ok());
    REQUIRE(e.Release(b, *gw).ok());
  }
  auto gb = e.Acquire(b, 0, Mode::kShared, {});  // A's numbers
  REQUIRE(gb.ok());
  auto gc = e.Acquire(c, 0, Mode::kShared, {});
  REQUIRE(gc.ok());
  const Word0 a_ticket = Word0::Decode(entry.ticket);
  REQUIRE(gb->ticket.word.max_x == a_ticket.max_x);
  REQUIRE(gb->ticket.word.max_s == a_ticket.max_s);
  // lockd fences A now and reaps its record.
  ReapState r = ReapState::ForEntry(entry);
  r.NoteScan(table.Load(0, 1));
  InProcessMemory lockd_mem(&table);
  ReapToEnd(e, lockd_mem, r);
  INFO("entry tagged " << entry.tagged << " generation " << entry.generation << " (A's "
                       << gen_before << "); reap outcome " << static_cast<int>(r.outcome)
                       << "; word n_s " << W0(table, 0).n_s << "/" << W0(table, 0).max_s);
  CHECK(r.outcome != ReapState::Outcome::kReleased);
  CHECK(r.outcome != ReapState::Outcome::kRecovered);
  // B leaves; C still reads: no writer may be granted.
  REQUIRE(e.Release(b, *gb).ok());
  CHECK_FALSE(WriterGranted(e, b));
  REQUIRE(e.Release(c, *gc).ok());
}

// The same gap through an exclusive request: its session's hint of the slot's generation no longer
// covered the FA's count (the word was reset since), and the request went untagged. It waited,
// its client stopped, its ticket was skipped and the word reset again before the fence; in the
// newest generation another client holds with the same numbers, and lockd released that grant
// (found by review, 2026-12-07). The request now READs word1 after its FA and is tagged with its
// generation: lockd ignores it in another.
TEST_CASE_METHOD(RecordedClients,
                 "records: a waiter whose session's hint predates its word's reset is never taken "
                 "for a later holder") {
  table.Store(0, 0, Word0{.max_s = 0, .max_x = 100, .n_s = 0, .n_x = 100}.Encode());
  {
    auto g = e.Acquire(a, 0, Mode::kExclusive, o);  // A's session learns generation 0, count 100
    REQUIRE(g.ok());
    REQUIRE(e.Release(a, *g).ok());
  }
  table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);  // a reset: generation 1
  table.Store(0, 0, 0);
  auto writer = e.Acquire(c, 0, Mode::kExclusive, {});  // holds, and will stall
  REQUIRE(writer.ok());
  o.record_seq = 2;
  // Count 1 < the hint's: the hint does not cover.
  const proto::RequestEntry entry = StopWhileWaiting(*this, Mode::kExclusive);
  // A waiter's stall recovery skipped the writer's ticket and A's; the word drained and reset.
  table.Store(0, 1, table.Load(0, 1) + proto::kGenerationIncrement);  // generation 2
  table.Store(0, 0, 0);
  {
    auto gw = e.Acquire(b, 0, Mode::kExclusive, {});  // a writer of the new generation leaves
    REQUIRE(gw.ok());
    REQUIRE(e.Release(b, *gw).ok());
  }
  auto gb = e.Acquire(b, 0, Mode::kExclusive, {});  // A's numbers: max_x 1
  REQUIRE(gb.ok());
  REQUIRE(gb->ticket.word.max_x == Word0::Decode(entry.ticket).max_x);
  ReapState r = ReapState::ForEntry(entry);  // lockd fences A now and reaps its record
  r.NoteScan(table.Load(0, 1));
  InProcessMemory lockd_mem(&table);
  ReapToEnd(e, lockd_mem, r);
  INFO("entry tagged " << entry.tagged << " generation " << entry.generation << " (slot's "
                       << proto::Generation(table.Load(0, 1)) << "); reap outcome "
                       << static_cast<int>(r.outcome));
  CHECK(r.outcome != ReapState::Outcome::kReleased);
  CHECK(r.outcome != ReapState::Outcome::kRecovered);
  // B still holds: nobody else may be granted
  CHECK_FALSE(WriterGranted(e, c));
  CHECK(e.Release(b, *gb).ok());
}

// The other way the generation moves: a renewal's carry (every 65,536th renewal of the slot, any
// reader's), which resets nothing. A dead reader's entry is still reaped after one: the renew
// field wrapped below its value at the scan, which a reset's bump never does.
TEST_CASE_METHOD(
    RecordedClients,
    "records: a renewal's carry since lockd's scan still lets it reap a reader's entry") {
  table.Store(0, 1, 0xfffe);
  auto ga = e.Acquire(a, 0, Mode::kShared, o);  // dies
  REQUIRE(ga.ok());
  // Tagged (this version): lockd's scan found the slot in the entry's generation, so a carry
  // since is one as for an untagged entry. Untagged: a client of version 7 or before.
  SECTION("tagged") { REQUIRE(ga->ticket.tagged); }
  SECTION("untagged") { WriteUntagged(table, o.record, *ga); }
  auto gb = e.Acquire(b, 0, Mode::kShared, {});  // lives on, renewing
  REQUIRE(gb.ok());
  a.Break();
  const uint64_t off = o.record;
  proto::RequestEntry entry;
  REQUIRE(LiveEntryAt(table, off, &entry));
  ReapState r = ReapState::ForEntry(entry);
  r.NoteScan(table.Load(0, 1));
  REQUIRE(e.Renew(b, *gb).ok());
  REQUIRE(e.Renew(b, *gb).ok());
  REQUIRE(proto::Generation(table.Load(0, 1)) == 1);  // carried
  InProcessMemory lockd_mem(&table);
  ReapToEnd(e, lockd_mem, r);
  CHECK(r.outcome == ReapState::Outcome::kReleased);
  REQUIRE(e.Release(b, *gb).ok());
  // both readers are gone
  CHECK(WriterGranted(e, c));
}
