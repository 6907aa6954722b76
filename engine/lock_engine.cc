#include "engine/lock_engine.h"

#include <algorithm>
#include <random>
#include <thread>
#include <utility>

#include "engine/lock_engine_internal.h"
#include "rdmalock/proto/layout.h"

namespace rdmalock {
using namespace engine_internal;  // NOLINT: the engine's own helpers
namespace {

using proto::Word0;
using std::chrono::nanoseconds;

// Waits under 500 us yield the CPU instead of sleeping: a sleep lasts at least the timer slack
// (60 us) and, in a VM, often a millisecond or more, which capped lock handovers at ~2,000/s on
// rdma_rxe (4 threads, one lock); yielding raised that to ~5,900/s. Longer waits sleep, so that
// a long queue of waiters never starves the holder of CPU.
void Pause(nanoseconds d, bool may_spin = true) {
  if (d <= nanoseconds::zero()) return;
  if (may_spin && d < std::chrono::microseconds(500)) {
    const auto end = Clock::now() + d;
    while (Clock::now() < end) std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(d);
  }
}

// Uniform jitter in [d/2, 3d/2) for back-off.
nanoseconds Jitter(nanoseconds d) {
  thread_local std::minstd_rand rng(
      static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id()) ^
                            static_cast<size_t>(Clock::now().time_since_epoch().count())));
  const auto half = std::max<int64_t>(1, d.count() / 2);
  return nanoseconds(half + static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * half)));
}

}  // namespace

LockEngine::LockEngine(EngineParams params, AbandonHandler on_abandon, RecordHandler on_record_free)
    : params_(params),
      on_abandon_(std::move(on_abandon)),
      on_record_free_(std::move(on_record_free)),
      generations_(params_.lock_count) {}

// The done mark is waited for before the entry goes back to the pool. Posted and handed back at
// once, it could still be in flight on this QP (a retransmission) when another thread reuses the
// entry on its own QP; landing after that use's own done mark, it would make the finished use
// look live, and lockd would release its ticket a second time (issue 16, finding 3). Only a
// request that ends without its grant comes here (a busy try, a timeout, a lapsed lease), so the
// round trip is off the lock path. After a failure the entry is not handed back: the connection
// is broken, so the session ends and its record with it.
//
// The entry is cleared (a = b = 0: no well-formed request): a request can end before its entry
// was written for this use (its FA bounced off a frozen word, or it failed before any FA), and a
// cleared entry is over whatever use it held. Then it is marked done with this use's seq, so
// that the mark keeps up with the entry's seqs (RequestEntry::Newer compares within half their
// range; KeepsDoneClose) and an earlier use's WRITE landing late is over too. (Under the
// liveness rule before 2026-12-05, d != seq, the mark beside the previous use's (seq, ticket)
// would have made that use look live, found by the records model; under Newer it is older than
// the mark, so over.)
void LockEngine::FreeRecord(RemoteMemory& mem, uint64_t record, uint32_t seq) const {
  if (record == 0) return;
  RemoteOp ops[2] = {RemoteOp::Write16(RegionId::kSessions, record, 0, 0), EntryDone(record, seq)};
  if (!mem.Execute(std::span<RemoteOp>(ops, seq != 0 ? 2 : 1)).ok()) return;
  if (on_record_free_) on_record_free_(record);
}

namespace {
// `t` as a new use of its record entry, live again after a give-up's done mark: the odd seq
// above the use's own (RequestEntry::RearmSeq), with the tag it had (the same ticket, so the same
// generation). Untagged, as it was until 2026-12-07, a ticket handed to the reaper that then
// waited left lockd an entry it would read in whatever generation its scan found (docs/protocol.md
// section 11; unit test `giving up: a ticket abandoned after its withdrawal missed keeps a live
// entry`). Returns the entry's WRITE.
RemoteOp Rearm(Ticket* t) {
  t->record_seq = proto::RequestEntry::RearmSeq(t->record_seq);
  return EntryWrite(t->record, t->record_seq, t->slot, t->mode, proto::RequestEntry::State::kQueued,
                    t->word.Encode(), t->tagged, t->generation);
}
}  // namespace

Status LockEngine::RearmAfterGiveUp(RemoteMemory& mem, Grant* g, bool wait) const {
  if (g->ticket.record != 0) {
    RemoteOp entry = Rearm(&g->ticket);
    RDMALOCK_RETURN_IF_ERROR(wait ? mem.Execute(entry) : mem.Post(entry));
  }
  // A token's generation must be read after the grant: the previous holder read its own before
  // it released, so a later read can only be as high or higher, even when a racing reset's
  // generation bump lands late (extra bumps are otherwise harmless). The FA's READ is after the
  // grant when the FA itself was granted, and the Wait loop's READ when it saw the grant; this
  // grant has only the FA-time value, so it is read again (one READ, when a token is wanted).
  if (!g->has_generation) return Status::Ok();
  const uint64_t slot = g->ticket.slot;
  RemoteOp rd = RemoteOp::Read(RegionId::kLocks, Word1Off(slot), 8);
  RDMALOCK_RETURN_IF_ERROR(mem.Execute(rd));
  RDMALOCK_RETURN_IF_ERROR(WholeWord1(mem, slot, &rd.result[0]));
  g->generation = proto::Generation(rd.result[0]);
  return Status::Ok();
}

void LockEngine::FillToken(Grant* g) const {
  if (g->ticket.mode == Mode::kExclusive && g->has_generation) {
    g->token = proto::FencingToken(params_.epoch, g->generation, g->ticket.word.max_x);
  }
}

nanoseconds LockEngine::PollInterval(const RemoteMemory& mem, uint32_t ahead,
                                     uint32_t unchanged_polls, nanoseconds handover) const {
  const nanoseconds rtt = std::max(mem.round_trip(), nanoseconds(100));
  // Each request ahead must be granted and released before ours. With an estimate of how long a
  // handover takes on this lock (measured by watching the counters move), sleep until about
  // half a handover before our turn: one or two READs per acquisition instead of a READ per
  // round trip. Without one, a round trip per request ahead.
  // The estimate is clamped to [1, 3] round trips: a handover needs at least the holder's
  // release and our READ, and an estimate taken while waiters overslept would otherwise feed
  // on itself (sleep longer, see slower handovers, sleep longer still).
  const nanoseconds per = handover > nanoseconds::zero() ? std::clamp(handover, rtt, 3 * rtt) : rtt;
  const nanoseconds by_queue = per * std::max<uint32_t>(1, ahead) - per / 2;
  // Growing while nothing moves, so a long critical section is not polled at full rate.
  const nanoseconds by_idle = rtt * (int64_t{1} << std::min<uint32_t>(unchanged_polls, 3));
  const nanoseconds cap = std::min<nanoseconds>(params_.lease / 8, rtt * 32);
  return std::min(std::max({by_queue, by_idle, rtt}), cap);
}

Result<Grant> LockEngine::Acquire(RemoteMemory& mem, uint64_t slot, Mode mode,
                                  const AcquireOptions& opt, EngineEvents* ev) const {
  bool handed_off = false;  // an abandoned ticket (and its entry) went to the abandon handler
  auto g = AcquireImpl(mem, slot, mode, opt, ev, &handed_off);
  if (!g.ok() && !handed_off) FreeRecord(mem, opt.record, opt.record_seq);
  if (Status st = ReapPending(mem, opt.pending, ev); g.ok() && !st.ok()) return st;
  return g;
}

bool LockEngine::RecentGeneration(uint64_t slot, Clock::time_point last_seen,
                                  GenerationTable::Hint* hint) const {
  return generations_.Find(slot, hint) &&
         (last_seen == Clock::time_point{} ||
          GenerationTable::Age(*hint, last_seen) < kGenerationHintAge);
}

Status LockEngine::TagTicket(RemoteMemory& mem, Ticket* t, const uint64_t* word1,
                             const GenerationTable::Hint& hint, Clock::time_point issue) const {
  // Hints count the tickets issued before our FA, not ours: a withdrawal of ours (a try-lock that
  // found the lock held) takes the word back to that count, and the session's next request there
  // is still covered (with our FA counted, every try of a try-lock loop missed and READ again).
  const uint32_t count = TicketsIssued(t->word);
  // A word at or near freezing, and a ticket that may wait: a rescuer (AcquireImpl's reset of a
  // frozen word nobody moves for F x L) may have timed the word frozen since before our FA. Its
  // timer watches nX, nS, word1 and the max fields (which a withdrawal can bring back to the
  // same value), and its CAS compares word0 as its last READ saw it: if
  // the word was unfrozen at our FA only because the last tickets before the freeze withdrew
  // (try-locks, timeouts), and it froze again after our FA (ours, or a request after it), the
  // rescue resets it under our ticket at once, and word1 read after our FA may be the next
  // generation's over our numbers: the unsafe direction (found by review, 2026-12-07). Our
  // ticket then has a max field within that many withdrawals of kCountMax; kNearFreeze bounds
  // them. Such a ticket is tagged with a hint, read before our FA, or with what lockd never sees
  // (the READ's generation half the 32-bit range away: lockd ignores the entry, and the request
  // loses fast recovery while it waits; its grant writes the entry again with its own, Wait). A
  // ticket whose FA found the word drained is not at risk: nothing was outstanding, so the
  // request that froze the word before it was granted too and cannot have withdrawn. A reader
  // granted at once beside other readers is (the writer queued behind them can withdraw).
  // Since 2026-12-07 the ticket that froze a word never withdraws (GiveUpTicket), so a word
  // frozen before our FA would have bounced it; this stays for words that SDKs built before
  // then can thaw (docs/protocol.md section 10).
  const Word0 after = Word0::Decode(t->word.Encode() + proto::AcquireIncrement(t->mode));
  const bool read_untrusted =
      !t->word.Drained() && (after.max_x >= proto::kCountMax - kNearFreeze ||
                             after.max_s >= proto::kCountMax - kNearFreeze);
  // Otherwise our increment keeps the word from draining, so no reset comes before our release:
  // the generation word1 showed after our FA is our grant's.
  if (word1 != nullptr) {
    t->tagged = true;
    t->generation = proto::RequestEntry::GenerationOf(*word1);
    if (read_untrusted) {
      t->generation ^= kUnseenGeneration;
      return Status::Ok();
    }
    generations_.Learn(t->slot, {t->generation, count, issue});
  } else if (GenerationHintCovers(hint, t->word, issue)) {
    t->tagged = true;
    t->generation = hint.generation;
    // A hint learned less than kGenerationRelearn ago stays as it is (no atomic
    // read-modify-write on the acquire path of a lock taken again and again; its count, a little
    // lower, only makes the check a little weaker).
    if (GenerationTable::Age(hint, issue) >= kGenerationRelearn) {
      generations_.Learn(t->slot, {t->generation, count, issue});
    }
  } else {
    // The word was reset since the hint (its count went down), or the hint grew old: READ word1
    // now, one round trip (a session pays it once per reset of a slot it keeps using). Our FA has
    // returned; nothing can skip our ticket sooner than F x L after it (a waiter behind us
    // queued after it and times its stall from then; a waiter ahead recovers only up to its own
    // ticket), so until then our increment keeps the word from draining and resetting: word1 is
    // our grant's generation, or a later one by renewal carries only, which leave the counters
    // as they are (as Renew's rewrite); but for the frozen-word rescue, which a waiting ticket near
    // freezing is kept from (read_untrusted, above). A READ that took longer than a lease is not
    // trusted: the hint's generation then, read before our FA and so never newer than the
    // grant's, which lockd ignores if older (a waiter's grant writes the entry again with its
    // own, Wait).
    // Untagged, as until 2026-12-07, a request that waited left lockd an entry it read in
    // whatever generation its scan found: a client that stopped while it waited, its ticket
    // skipped and the word reset before the fence, left numbers a later request could draw, and
    // lockd released that request's grant (docs/protocol.md, section 11).
    t->tagged = true;
    t->generation = hint.generation;
    generations_.Forget(t->slot);
    if (read_untrusted) return Status::Ok();  // the hint's, read before our FA (above)
    RemoteOp rd = RemoteOp::Read(RegionId::kLocks, Word1Off(t->slot), 8);
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(rd));
    uint64_t now1 = rd.result[0];
    RDMALOCK_RETURN_IF_ERROR(WholeWord1(mem, t->slot, &now1));
    if (Clock::now() - issue < params_.lease) {
      t->generation = proto::RequestEntry::GenerationOf(now1);
      generations_.Learn(t->slot, {t->generation, count, issue});
    }
  }
  return Status::Ok();
}

LockEngine::GenerationBlock LockEngine::BlockOf(uint64_t slot) const {
  const uint64_t first = slot - slot % kGenerationBlockSlots;
  return {first, std::min(kGenerationBlockSlots, params_.lock_count - first)};
}

RemoteOp LockEngine::GenerationBlock::Read(uint64_t* words) const {
  return RemoteOp::ReadInto(RegionId::kLocks, proto::SlotOffset(first),
                            static_cast<uint32_t>(count * proto::kSlotSize), words);
}

void LockEngine::LearnBlock(GenerationBlock b, const uint64_t* words, uint64_t except,
                            Clock::time_point issue) const {
  const uint64_t first = b.first;
  for (uint64_t i = 0; i < b.count; ++i) {
    if (first + i == except) continue;  // TagTicket learned it, with its own FA's count
    if (!GenerationReadWhole(words[2 * i + 1])) continue;  // maybe torn: its own request READs
    const Word0 w0 = Word0::Decode(words[2 * i]);
    generations_.Learn(
        first + i, {proto::RequestEntry::GenerationOf(words[2 * i + 1]), TicketsIssued(w0), issue});
  }
}

Result<Grant> LockEngine::AcquireImpl(RemoteMemory& mem, uint64_t slot, Mode mode,
                                      const AcquireOptions& opt, EngineEvents* ev,
                                      bool* handed_off) const {
  if (slot >= params_.lock_count) {
    return Error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) +
                                                  " is out of range (lock_count " +
                                                  std::to_string(params_.lock_count) + ")");
  }
  const uint64_t inc = proto::AcquireIncrement(mode);
  nanoseconds backoff = mem.round_trip();
  // The request's record entry; it goes with a ticket handed to the abandon handler, and the
  // requests after that one go unrecorded.
  uint64_t record = opt.record;
  uint32_t record_seq = opt.record_seq;
  // Watches a frozen word that nobody resets (its last participant died holding an increment).
  engine_internal::WordView frozen_seen{engine_internal::WordView::Watch::kTickets};
  // The first FA's issue, or the start of a wait for a thaw before it (Grant::requested).
  Clock::time_point requested;
  bool bounced = false;  // the last attempt's FA found the word frozen

  for (int attempt = 0;; ++attempt) {
    if (bounced || frozen_.Marked(slot)) {
      if (attempt == 0) requested = Clock::now();
      // This call bounced off the word, or another of the session's requests did (FrozenMarks):
      // READ it until it thaws, then queue. A try-lock looks once. The channel's posted release
      // is finished first, as before a wait behind the FA below: the thaw may wait for it.
      RDMALOCK_RETURN_IF_ERROR(ReapPending(mem, opt.pending, ev));
      RDMALOCK_ASSIGN_OR_RETURN(const bool thawed,
                                AwaitThaw(mem, slot, opt, &backoff, &frozen_seen, ev));
      if (!thawed) return Error(ErrorCode::kBusy, "lock word is being reset; try again");
      bounced = false;
    }
    if (attempt > 0 && Clock::now() >= opt.deadline) {
      return Error(ErrorCode::kTimeout, "timed out waiting for slot " + std::to_string(slot));
    }
    // One FETCH_AND_ADD (and a READ of word1 in the same doorbell for a token). The request's
    // record entry is written once the ticket is known, below: an entry written ahead of the FA
    // would cost a WRITE on every acquire and tell lockd nothing it could act on (a request
    // without a ticket is left to stall recovery either way).
    //
    // A recorded request's entry is tagged with the slot's generation: lockd acts on it only in
    // that generation (a stale entry is never read as a later request's ticket; docs/protocol.md,
    // section 11), and an exclusive release then needs no done mark (three operations per
    // uncontended pair instead of four; section 10). The generation comes from a READ of word1 in
    // the FA's doorbell (a token's, or one added here when the session knows no recent generation
    // of the slot: no round trip, the READ rides with the FA), or from what the session learned of
    // the slot before (generations_, any thread's request; GenerationHintCovers). A request that
    // must learn it READs the words of the slot's whole block (kGenerationBlockSlots, 1 KiB) in
    // place of word1 alone, and the session learns every slot's generation there (LearnBlock).
    const bool tag = record != 0;
    GenerationTable::Hint hint;
    const bool learn =
        tag && !opt.want_token && !RecentGeneration(slot, mem.last_completed(), &hint);
    const bool read_word1 = opt.want_token || learn;
    const GenerationBlock b = BlockOf(slot);
    uint64_t block[2 * kGenerationBlockSlots];  // word0, word1 of slot b.first + i at 2i, 2i + 1
    RemoteOp ops[2];
    size_t n = 0;
    const size_t fa = n;
    ops[n++] = RemoteOp::FetchAdd(RegionId::kLocks, Word0Off(slot), inc);
    if (learn) {
      ops[n++] = b.Read(block);
    } else if (read_word1) {
      ops[n++] = RemoteOp::Read(RegionId::kLocks, Word1Off(slot), 8);
    }
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(std::span<RemoteOp>(ops, n)));
    // Word1 as the READ after our FA showed it (read_word1 only; made whole below).
    uint64_t word1 = learn ? block[2 * (slot - b.first) + 1] : ops[fa + 1].result[0];
    const auto issue = mem.last_issued();  // before the FA was posted: the lease's start
    if (requested == Clock::time_point{}) requested = issue;
    // The channel's posted release landed before this FA; reap it (a retry if it missed)
    // before this request waits, possibly behind that very lock.
    RDMALOCK_RETURN_IF_ERROR(ReapPending(mem, opt.pending, ev));
    const Word0 prev = Word0::Decode(ops[fa].result[0]);

    if (prev.Frozen()) {
      // The word awaits a reset: take the increment back (by CAS, never FA of -inc), then READ
      // the word until it thaws (its reset) before queueing again (the next attempt's
      // AwaitThaw). A FETCH_AND_ADD on every round could leave an increment on every round (a
      // withdrawal that comes late is left to the rescue, WithdrawFrozen), and while a holder
      // renews, the rescue does not come: 32,768 of them would carry the frozen field into the
      // next (found by review, 2026-12-07). So one call leaves at most one; and the session's
      // mark makes its later calls on the slot wait for the thaw before their FA too (a
      // try-lock loop: one increment per freeze, not one per call).
      frozen_.Mark(slot);
      bounced = true;
      RDMALOCK_RETURN_IF_ERROR(
          WithdrawFrozen(mem, slot, inc, Word0::Decode(ops[fa].result[0] + inc), issue, ev));
      if (opt.try_only) {
        // A try-lock answers after one look, as it did when it FETCH_AND_ADDed once: busy.
        RDMALOCK_RETURN_IF_ERROR(LookThawed(mem, slot, &frozen_seen, ev).status());
        return Error(ErrorCode::kBusy, "lock word is being reset; try again");
      }
      continue;
    }
    frozen_seen.Forget();
    if (read_word1) RDMALOCK_RETURN_IF_ERROR(WholeWord1(mem, slot, &word1));

    Ticket t{slot, mode, prev, record, record_seq};
    if (tag)
      RDMALOCK_RETURN_IF_ERROR(TagTicket(mem, &t, read_word1 ? &word1 : nullptr, hint, issue));
    if (learn) LearnBlock(b, block, slot, issue);
    if (record != 0) {
      // The ticket, posted without waiting: it lands before anything this channel sends next.
      RemoteOp queued =
          EntryWrite(record, record_seq, slot, mode, proto::RequestEntry::State::kQueued,
                     prev.Encode(), t.tagged, t.generation);
      RDMALOCK_RETURN_IF_ERROR(mem.Post(queued));
    }
    Grant g;
    g.ticket = t;
    g.seen = Word0::Decode(prev.Encode() + inc);
    g.lease_start = issue;
    g.requested = requested;
    if (opt.want_token) {
      g.generation = proto::Generation(word1);
      g.has_generation = true;
    }
    if (proto::Granted(prev, prev, mode)) {  // granted at once: one round trip
      FillToken(&g);
      return g;
    }
    if (opt.try_only) {
      RDMALOCK_ASSIGN_OR_RETURN(const GiveUp gu, GiveUpTicket(mem, t, &g.seen, issue, ev));
      if (gu == GiveUp::kGranted) {  // the holder released in the meantime
        RDMALOCK_RETURN_IF_ERROR(RearmAfterGiveUp(mem, &g));
        FillToken(&g);
        return g;
      }
      if (gu == GiveUp::kAbandoned) *handed_off = true;
      return Error(ErrorCode::kBusy, "slot " + std::to_string(slot) + " is held");
    }
    Count(&EngineEvents::waits, ev);
    {
      // The FA's answer already says how many requests are ahead of ours: a READ at once would
      // only show the same (the holder has had no time to release). Wait first as a poll after
      // an unchanged READ would, so that a contended acquisition costs a READ fewer (issue 19,
      // item 5). (Here only: FinishAcquire's tickets may have waited a while already.)
      const uint32_t ahead = proto::Ahead(g.seen, prev, mode);
      Pause(std::min<nanoseconds>(PollInterval(mem, ahead, 0, mem.handover_estimate(slot)),
                                  opt.deadline - Clock::now()),
            /*may_spin=*/ahead <= 1);
    }
    RDMALOCK_ASSIGN_OR_RETURN(const WaitOutcome out, Wait(mem, t, issue, opt.deadline, &g, ev,
                                                          handed_off, &opt.while_waiting));
    if (out == WaitOutcome::kGranted) {
      FillToken(&g);
      return g;
    }
    if (out == WaitOutcome::kTimeout) {
      return Error(ErrorCode::kTimeout, "timed out waiting for slot " + std::to_string(slot));
    }
    Count(&EngineEvents::restarts, ev);           // skipped, reset or paused: queue again
    if (*handed_off) record = 0, record_seq = 0;  // that entry went with the paused ticket
  }
}

Result<LockEngine::WaitOutcome> LockEngine::Wait(RemoteMemory& mem, const Ticket& t,
                                                 Clock::time_point fa_issue,
                                                 Clock::time_point deadline, Grant* grant,
                                                 EngineEvents* ev, bool* handed_off,
                                                 const std::function<bool()>* while_waiting) const {
  const uint64_t inc = proto::AcquireIncrement(t.mode);
  Clock::time_point last_waiting_issue = fa_issue;  // issue of the last op that showed us waiting
  Word0 last = Word0::Decode(t.word.Encode() + inc);
  bool last_read = false;  // `last` is a READ's view (not a snapshot: AtomicWord0)
  // Fewer than kTornReadMargin requests of each count were ahead at our FA: no torn READ can
  // show a grant that is not ours.
  const bool tear_safe = static_cast<uint16_t>(t.word.max_x - t.word.n_x) < kTornReadMargin &&
                         (t.mode != Mode::kExclusive ||
                          static_cast<uint16_t>(t.word.max_s - t.word.n_s) < kTornReadMargin);
  engine_internal::WordView seen;
  uint32_t unchanged = 0;
  // How long one handover takes on this lock: time between observations over the releases
  // that happened in it. Kept with the channel across acquisitions (a hot lock stays hot).
  nanoseconds handover_est = mem.handover_estimate(t.slot);
  bool have_prev = false;
  uint16_t prev_nx = 0, prev_ns = 0;
  Clock::time_point prev_at;
  bool stop = false;  // while_waiting ended the wait
  // No waiter can have begun timing the word's current view before this (Ticket::watched): our
  // FA's issue, then the issue of the READ before the last one that showed the view change.
  // Not our last READ: one that showed the same view again bounds nothing (review, 2026-12-08).
  Clock::time_point view_since = fa_issue, prev_read_issue = fa_issue;
  // The view the last READ showed, kept apart from `seen`, whose Forget (after a recovery CAS
  // that missed) makes the next READ a change though the view stood (the third review).
  bool have_view = false;
  uint16_t view_nx = 0, view_ns = 0;
  uint64_t view_w1 = 0;

  for (;;) {
    const auto now = Clock::now();
    if (now - last_waiting_issue > params_.lease) {
      // We lost sight of the word for longer than a lease (the process was paused, or an async
      // request waited in the queue for a waiter thread): a grant found now would have a lease
      // that already ran out, so queue again. The old ticket goes to the abandon handler (the
      // client's reaper), which releases it when its turn comes, or drops it once it is skipped
      // or gone: left in the word, it would stall the lock for F x L (issue 16, finding 9).
      // Without a handler, waiters recover it after F x L.
      AbandonLapsed(t, view_since, ev, handed_off);
      return WaitOutcome::kRestart;
    }
    if (now >= deadline || stop) {
      // GiveUpTicket's first look decides without a CAS: on the word itself, not a READ's view.
      if (last_read) {
        RDMALOCK_ASSIGN_OR_RETURN(last, AtomicWord0(mem, t.slot));
      }
      RDMALOCK_ASSIGN_OR_RETURN(const GiveUp gu, GiveUpTicket(mem, t, &last, view_since, ev));
      if (gu == GiveUp::kAbandoned && handed_off != nullptr) *handed_off = true;
      if (gu != GiveUp::kGranted) return WaitOutcome::kTimeout;
      grant->ticket = t;
      grant->seen = last;
      grant->lease_start = last_waiting_issue;
      RDMALOCK_RETURN_IF_ERROR(RearmAfterGiveUp(mem, grant));
      return WaitOutcome::kGranted;
    }
    if (while_waiting != nullptr && *while_waiting && !(*while_waiting)()) {
      stop = true;  // give the ticket up, as at the deadline
      continue;
    }
    RemoteOp rd = RemoteOp::Read(RegionId::kLocks, Word0Off(t.slot), 16);
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(rd));
    const auto issue = mem.last_issued(), done = mem.last_completed();
    Word0 w0 = Word0::Decode(rd.result[0]);
    // A READ is no snapshot of the word (AtomicWord0). Giving the ticket up (gone, skipped) is
    // decided on the word itself. So is a grant, unless fewer than kTornReadMargin requests of
    // each count were ahead at the FA: a torn view of a counter can show our turn only with a
    // byte from a time when the counter was kTornReadMargin or more short of it
    // (docs/protocol.md §8, torn READs).
    bool word0_atomic = false;  // w0 is the atomic read's, which came after the READ's word1
    if (proto::TicketGone(w0, t.word, t.mode) || proto::Skipped(w0, t.word, t.mode) ||
        (!tear_safe && proto::Granted(w0, t.word, t.mode))) {
      RDMALOCK_ASSIGN_OR_RETURN(w0, AtomicWord0(mem, t.slot));
      word0_atomic = true;
    }
    last = w0;
    last_read = true;
    if (proto::TicketGone(w0, t.word, t.mode)) return WaitOutcome::kRestart;
    if (proto::Granted(w0, t.word, t.mode)) {
      if (issue - last_waiting_issue > params_.lease) {
        // We lost sight of the word for longer than a lease between the last READ and this one
        // (while_waiting, or the thread descheduled after the check above): the grant's lease,
        // which starts at the last READ that showed us waiting, has run out. Queue again, as
        // above; the handler releases the granted ticket at once.
        AbandonLapsed(t, view_since, ev, handed_off);
        return WaitOutcome::kRestart;
      }
      // A token's generation is read after the grant (RearmAfterGiveUp). The READ's word1 is,
      // when that READ showed the grant; when the atomic read showed it instead, the grant may
      // have come after the READ copied word1, and a generation bump in between (a racing
      // reset's late FA, a renewal carry) would give this grant an older generation than the
      // holder before it read (found by review, 2026-12-06): read word1 again, after the grant.
      if (word0_atomic) {
        RemoteOp again = RemoteOp::Read(RegionId::kLocks, Word1Off(t.slot), 8);
        RDMALOCK_RETURN_IF_ERROR(mem.Execute(again));
        rd.result[1] = again.result[0];
      }
      RDMALOCK_RETURN_IF_ERROR(WholeWord1(mem, t.slot, &rd.result[1]));
      grant->ticket = t;
      grant->seen = w0;
      grant->lease_start = last_waiting_issue;
      grant->generation = proto::Generation(rd.result[1]);
      grant->has_generation = true;
      const uint32_t gen = proto::RequestEntry::GenerationOf(rd.result[1]);
      generations_.Learn(t.slot, {gen, TicketsIssued(w0), issue});
      if (t.tagged && t.generation != gen) {
        // The entry was tagged with an older generation (a hint from before a reset that the
        // FA's count did not show): lockd would ignore it. Our increment kept the word from
        // resetting since our FA, so `gen` is the grant's: write the entry again with it, on this
        // channel, so that it lands before our release.
        grant->ticket.generation = gen;
        RemoteOp fix = EntryWrite(t.record, t.record_seq, t.slot, t.mode,
                                  proto::RequestEntry::State::kQueued, t.word.Encode(), true, gen);
        RDMALOCK_RETURN_IF_ERROR(mem.Post(fix));
      }
      return WaitOutcome::kGranted;
    }
    if (proto::Skipped(w0, t.word, t.mode)) return WaitOutcome::kRestart;
    last_waiting_issue = issue;
    const uint32_t moved =
        static_cast<uint16_t>(w0.n_x - prev_nx) + static_cast<uint16_t>(w0.n_s - prev_ns);
    if (!have_prev || moved > 0) {
      if (have_prev && moved < 64) {
        const nanoseconds sample = (done - prev_at) / moved;
        handover_est = handover_est == nanoseconds::zero()
                           ? sample
                           : handover_est + (sample - handover_est) / 4;
        mem.set_handover_estimate(t.slot, handover_est);
      }
      have_prev = true;
      prev_nx = w0.n_x, prev_ns = w0.n_s, prev_at = done;
    }

    const bool changed = seen.Note(w0, rd.result[1], done);
    if (have_view && (w0.n_x != view_nx || w0.n_s != view_ns || rd.result[1] != view_w1)) {
      view_since = prev_read_issue;  // the view changed after that READ saw the one before
    }
    have_view = true;
    view_nx = w0.n_x, view_ns = w0.n_s, view_w1 = rd.result[1];
    prev_read_issue = issue;
    if (changed) {
      unchanged = 0;
    } else if (seen.StalledFor(done, stall_timeout())) {
      // Neither a release nor a renewal for F x L: mark everything up to our own request done.
      // (The retry writes the entry again with its new ticket.) An exclusive ticket's entry
      // needs no clearing: nX moves past it.
      Word0 replaced = w0;
      RDMALOCK_ASSIGN_OR_RETURN(
          const bool landed,
          RecoverCas(mem, t, w0, t.record != 0 && t.mode == Mode::kShared, nullptr, &replaced));
      if (landed) {
        Count(&EngineEvents::recoveries, ev);
        const Word0 rec = proto::RecoveredWord(replaced, t.word, t.mode);
        if (rec.Resettable()) {
          RDMALOCK_RETURN_IF_ERROR(ResetDrained(mem, t.slot, rec, ev));
        }
        return WaitOutcome::kRestart;
      }
      seen.Forget();  // something moved: time the stall again
      continue;
    } else {
      ++unchanged;
    }
    const uint32_t ahead = proto::Ahead(w0, t.word, t.mode);
    const nanoseconds pause = PollInterval(mem, ahead, unchanged, handover_est);
    // Waiters further back sleep rather than yield: the CPU they would spin on is the holder's
    // (and, on a software NIC, the NIC's).
    Pause(std::min<nanoseconds>(pause, deadline - Clock::now()), /*may_spin=*/ahead <= 1);
  }
}

Result<bool> LockEngine::RecoverCas(RemoteMemory& mem, const Ticket& t, Word0 seen,
                                    bool clear_entry, bool* unseen, Word0* landed_on) const {
  RemoteOp ops[2] = {RemoteOp::Write16(RegionId::kSessions, t.record, 0, 0),
                     RemoteOp::CompareSwap(RegionId::kLocks, Word0Off(t.slot), seen.Encode(),
                                           proto::RecoveredWord(seen, t.word, t.mode).Encode())};
  if (unseen != nullptr) *unseen = t.mode == Mode::kShared;
  RDMALOCK_RETURN_IF_ERROR(
      mem.Execute(std::span<RemoteOp>(ops + (clear_entry ? 0 : 1), clear_entry ? 2 : 1)));
  bool landed = ops[1].result[0] == seen.Encode();
  // A miss on a word whose counters are still the stalled view's: only the max fields moved (a
  // request queued or withdrew behind, a try-lock's FA and withdrawal), and the stall stands, as
  // nX and nS say on the word itself. Timed again from zero, as it was, a try-lock looping on the
  // lock could keep its dead holder's lock stuck as long as it looped (found by review,
  // 2026-12-06). Word1 is not compared by any CAS: a holder stalled F x L had its lease run out,
  // and renews no more (its renewal checks its lease at issue), so one more round trip changes
  // nothing. Bounded: a word that churns this fast is tried again at the next READ.
  for (int i = 0; !landed && i < kRecoverRetries; ++i) {
    const Word0 found = Word0::Decode(ops[1].result[0]);
    if (found.n_x != seen.n_x || found.n_s != seen.n_s || found.Frozen() != seen.Frozen()) break;
    // Never a word with a count past its issued ones: a withdrawal can take max back below what
    // the ticket's recovery would count done, and only a ticket that is no live one of the word
    // (lockd's stale record entry) gets there; a waiter's own live increment keeps it in range
    // (found by review, 2026-12-07; lockd's first CAS is checked in Reap).
    const Word0 want = proto::RecoveredWord(found, t.word, t.mode);
    if (want.n_x > found.max_x || want.n_s > found.max_s) break;
    seen = found;
    ops[1] = RemoteOp::CompareSwap(RegionId::kLocks, Word0Off(t.slot), seen.Encode(),
                                   proto::RecoveredWord(seen, t.word, t.mode).Encode());
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(std::span<RemoteOp>(ops + 1, 1)));
    landed = ops[1].result[0] == seen.Encode();
  }
  if (unseen != nullptr) *unseen = false;
  if (landed && landed_on != nullptr) *landed_on = seen;
  if (!landed && clear_entry) {
    // Still queued: the record shows it again. Waited for, not posted (this path is rare): the
    // ticket may go to the reaper next (a lapsed wait), which could clear the entry on its own QP
    // while this WRITE was still in flight on ours.
    RemoteOp again =
        EntryWrite(t.record, t.record_seq, t.slot, t.mode, proto::RequestEntry::State::kQueued,
                   t.word.Encode(), t.tagged, t.generation);
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(again));
  }
  return landed;
}

void LockEngine::HandOver(Ticket t, Clock::time_point watched) const {
  t.watched = watched;
  on_abandon_(t);
}

void LockEngine::AbandonLapsed(const Ticket& t, Clock::time_point watched, EngineEvents* ev,
                               bool* handed_off) const {
  if (!on_abandon_ || handed_off == nullptr) return;
  Count(&EngineEvents::abandoned, ev);
  HandOver(t, watched);
  *handed_off = true;
}

Result<LockEngine::GiveUp> LockEngine::GiveUpTicket(RemoteMemory& mem, const Ticket& t,
                                                    Word0* cur_io, Clock::time_point watched,
                                                    EngineEvents* ev) const {
  Word0& cur = *cur_io;
  const uint64_t inc = proto::AcquireIncrement(t.mode);
  const Word0 mine = Word0::Decode(t.word.Encode() + inc);  // max fields with only us added
  bool marked_done = false;  // a withdrawal's doorbell ran: the entry shows the use over
  for (;;) {
    if (proto::Granted(cur, t.word, t.mode)) return GiveUp::kGranted;
    if (proto::Skipped(cur, t.word, t.mode) || proto::TicketGone(cur, t.word, t.mode)) {
      return GiveUp::kGone;
    }
    // A ticket whose FA froze the word is never withdrawn either: a frozen word must stay
    // frozen until its reset, admitting no one, or the frozen-word rescue could time a value
    // that withdrawals (ours, and the tickets' before us once we are gone) and new tickets bring
    // back, and reset it under a reader granted meanwhile (docs/protocol.md section 5). Only the
    // last ticket can withdraw, and after a freeze that is the one whose FA froze it.
    if (cur.max_x != mine.max_x || cur.max_s != mine.max_s || mine.Frozen()) {
      // Requests queued behind us count on our ticket: it must be granted and released.
      Count(&EngineEvents::abandoned, ev);
      if (!marked_done || t.record == 0) {
        if (on_abandon_) HandOver(t, watched);
        return GiveUp::kAbandoned;
      }
      // A request queued between our done mark and our CAS: the ticket is live again, so its
      // entry must be too, or lockd would free nothing were this client to die before the
      // reaper releases it (and the request behind would wait F x L). A new use, as
      // RearmAfterGiveUp's; waited for, because the reaper ends it on its own QP.
      Ticket again = t;
      RemoteOp entry = Rearm(&again);
      const Status written = mem.Execute(entry);
      // The reaper gets the ticket whatever the write did: left in the word, with a request
      // behind it, it would wait for stall recovery (F x L).
      if (on_abandon_) HandOver(again, watched);
      RDMALOCK_RETURN_IF_ERROR(written);
      return GiveUp::kAbandoned;
    }
    // The entry is marked done first, in the same doorbell: a withdrawn ticket's number goes to
    // the next requester, so the record must never show it as ours once the CAS may have landed.
    RemoteOp ops[2] = {EntryDone(t.record, t.record_seq),
                       RemoteOp::CompareSwap(RegionId::kLocks, Word0Off(t.slot), cur.Encode(),
                                             cur.Encode() - inc)};
    const size_t first = t.record != 0 ? 0 : 1;
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(std::span<RemoteOp>(ops + first, 2 - first)));
    marked_done = true;
    const RemoteOp& cas = ops[1];
    if (cas.result[0] == cur.Encode()) {
      Count(&EngineEvents::withdrawals, ev);
      return GiveUp::kWithdrawn;
    }
    cur = Word0::Decode(cas.result[0]);
  }
}

// The retry after a missed CAS is where an ABA hides (issue 16, finding 8). If the frozen word's
// stall rescue reset it after our FA (our increment went with it) and it froze again with other
// requesters' increments, a CAS from the value the miss returned would take back one of theirs.
// A reset word starts from zero and needs COUNT_MAX new tickets before it is frozen again, which
// no NIC issues on one word within kFreshWithdrawal. So a value seen within that time of our
// FA's issue is a word of our FA's generation, still holding our increment (only a reset or our
// own withdrawal removes it), and a CAS against it is safe. A miss seen later (a preempted
// thread, a retransmission) is not retried: the increment stays, and to the word it is a
// requester that died between its FA and its withdrawal, which the rescue frees after F x L.
// (Checking the generation instead would not do: a rescue bumps it before it zeroes word0, and
// the zeroing can land after our READ of it.) The first CAS has no such bound: a thread preempted
// between its FA and that CAS while the word is reset, refilled with COUNT_MAX tickets and frozen
// again to the very same value would take back another's increment (docs/protocol.md section 3's
// ABA); since a word with nothing but bounces left is reset at once (Word0::Resettable), resets
// under a bounce in flight are routine, where before only the rescue made them.
Status LockEngine::WithdrawFrozen(RemoteMemory& mem, uint64_t slot, uint64_t inc, Word0 cur,
                                  Clock::time_point issued, EngineEvents* ev) const {
  for (;;) {
    const uint16_t field = inc == proto::kAcquireExclusive ? cur.max_x : cur.max_s;
    // Once the word is no longer frozen it has been reset, and our increment went with it.
    if (!cur.Frozen() || field == 0) return Status::Ok();
    RemoteOp cas =
        RemoteOp::CompareSwap(RegionId::kLocks, Word0Off(slot), cur.Encode(), cur.Encode() - inc);
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(cas));
    if (cas.result[0] == cur.Encode()) {
      Count(&EngineEvents::withdrawals, ev);
      const Word0 now = Word0::Decode(cur.Encode() - inc);
      if (now.Resettable()) return ResetDrained(mem, slot, now, ev);
      return Status::Ok();
    }
    if (Clock::now() - issued > kFreshWithdrawal) {
      Count(&EngineEvents::frozen_left, ev);
      return Status::Ok();
    }
    cur = Word0::Decode(cas.result[0]);
  }
}

Result<bool> LockEngine::LookThawed(RemoteMemory& mem, uint64_t slot,
                                    engine_internal::WordView* seen, EngineEvents* ev) const {
  RemoteOp rd = RemoteOp::Read(RegionId::kLocks, Word0Off(slot), 16);
  RDMALOCK_RETURN_IF_ERROR(mem.Execute(rd));
  const Word0 w0 = Word0::Decode(rd.result[0]);
  const auto now = Clock::now();
  bool thawed = !w0.Frozen();  // reset (a torn READ cannot fake it: the frozen field's high
                               // byte stays at 0x80 or more until the reset)
  if (!thawed && w0.Resettable()) {
    // Nothing but bounces left in it (Resettable: drained, or a bounce's increment left by a
    // withdrawal that came late): whoever released its last ticket may have died before its
    // reset, or saw the increment still there. Ours then, as a withdrawal's. A READ is no
    // snapshot (a counter crossing a byte boundary can read high: docs/protocol.md section 8),
    // and the generation bump lands whatever the CAS does, so only the word read atomically
    // decides; the CAS lands on that very word alone.
    RDMALOCK_ASSIGN_OR_RETURN(const Word0 whole, AtomicWord0(mem, slot));
    if (!whole.Frozen()) {
      thawed = true;
    } else if (whole.Resettable()) {
      RDMALOCK_RETURN_IF_ERROR(ResetDrained(mem, slot, whole, ev, &thawed));
    }
  } else if (!thawed && seen != nullptr && !seen->Note(w0, rd.result[1], now) &&
             seen->StalledFor(now, stall_timeout())) {
    // Nothing moved for F x L: whoever still counts in this word is gone. Reset it as a drained
    // word is (generation first, then word0 from what the READ showed).
    RDMALOCK_RETURN_IF_ERROR(ResetDrained(mem, slot, w0, ev, &thawed));
    seen->Forget();
  }
  if (thawed) {
    frozen_.Clear(slot);
    if (seen != nullptr)
      seen->Forget();  // a word that SDKs built before 2026-12-07 thawed
                       // without a reset and froze again is timed afresh
  }
  return thawed;
}

Result<bool> LockEngine::AwaitThaw(RemoteMemory& mem, uint64_t slot, const AcquireOptions& opt,
                                   std::chrono::nanoseconds* backoff,
                                   engine_internal::WordView* seen, EngineEvents* ev) const {
  for (;;) {
    RDMALOCK_ASSIGN_OR_RETURN(const bool thawed, LookThawed(mem, slot, seen, ev));
    if (thawed) return true;
    if (opt.try_only) return false;
    if (opt.while_waiting && !opt.while_waiting()) {
      return Error(ErrorCode::kTimeout,
                   "the wait for slot " + std::to_string(slot) + " was ended by its caller");
    }
    if (Clock::now() >= opt.deadline) {
      return Error(ErrorCode::kTimeout, "timed out waiting for slot " + std::to_string(slot));
    }
    Pause(std::min<std::chrono::nanoseconds>(Jitter(*backoff), opt.deadline - Clock::now()));
    *backoff = std::min<std::chrono::nanoseconds>(*backoff * 2, params_.lease / 8);
  }
}

Status LockEngine::ResetDrained(RemoteMemory& mem, uint64_t slot, Word0 drained, EngineEvents* ev,
                                bool* landed) const {
  // Generation first, then word0: both on this channel, so they land in that order. Several
  // participants may race here; only one CAS wins, and extra generation bumps are harmless.
  RemoteOp ops[2] = {
      RemoteOp::FetchAdd(RegionId::kLocks, Word1Off(slot), proto::kGenerationIncrement),
      RemoteOp::CompareSwap(RegionId::kLocks, Word0Off(slot), drained.Encode(), 0)};
  RDMALOCK_RETURN_IF_ERROR(mem.Execute(ops));
  const bool took = ops[1].result[0] == drained.Encode();
  if (took) Count(&EngineEvents::resets, ev);
  if (landed != nullptr) *landed = took;
  return Status::Ok();
}

Status LockEngine::CheckReleasable(RemoteMemory& mem, const Grant& g, Word0* cur_io) const {
  const Ticket& t = g.ticket;
  if (!LeaseValid(g, Clock::now())) {
    FreeRecord(mem, t.record, t.record_seq);
    return Error(ErrorCode::kLockLost, "lease on slot " + std::to_string(t.slot) +
                                           " expired before release; not released (waiters "
                                           "recover the lock)");
  }
  Word0& cur = *cur_io;
  if (!StillHeld(cur, t)) {
    // Perhaps a torn READ's view (a grant seen by a waiter's READ, or a renewal's): the word
    // itself decides.
    RDMALOCK_ASSIGN_OR_RETURN(cur, AtomicWord0(mem, t.slot));
  }
  if (!StillHeld(cur, t)) {
    FreeRecord(mem, t.record, t.record_seq);
    // The words, so that a report tells a recovery from a ticket released twice.
    auto words = [](Word0 w) {
      return "max_x " + std::to_string(w.max_x) + ", n_x " + std::to_string(w.n_x) + ", max_s " +
             std::to_string(w.max_s) + ", n_s " + std::to_string(w.n_s);
    };
    return Error(ErrorCode::kLockLost,
                 "slot " + std::to_string(t.slot) +
                     " was recovered by a waiter before release; the critical section may have "
                     "overlapped another (" +
                     (t.mode == Mode::kExclusive ? "exclusive" : "shared") +
                     " ticket queued behind " + words(t.word) + "; the word now " + words(cur) +
                     ")");
  }
  return Status::Ok();
}

Status LockEngine::Release(RemoteMemory& mem, const Grant& g, EngineEvents* ev) const {
  // g.seen is exact unless requests arrived (or siblings released) since we looked.
  return ReleaseFrom(mem, g, g.seen, /*missed=*/false, ev);
}

Status LockEngine::ReleaseFrom(RemoteMemory& mem, const Grant& g, Word0 cur, bool missed,
                               EngineEvents* ev) const {
  const Ticket& t = g.ticket;
  const uint64_t inc = proto::ReleaseIncrement(t.mode);
  for (;; missed = true) {
    if (missed) Count(&EngineEvents::release_misses, ev);
    RDMALOCK_RETURN_IF_ERROR(CheckReleasable(mem, g, &cur));
    // A CAS, not a FETCH_AND_ADD: it lands only if the word still shows our grant, so a release
    // that is delayed (a paused process, a retransmission) past a recovery changes nothing.
    RemoteOp ops[2];
    const size_t first = ReleaseOps(t, cur, ops);
    // On failure the entry stays out of the pool: its done mark may not have landed, and the
    // session ends with the connection.
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(std::span<RemoteOp>(ops + first, 2 - first)));
    if (ops[1].result[0] == cur.Encode()) {
      if (t.record != 0 && on_record_free_) on_record_free_(t.record);
      const Word0 now = Word0::Decode(cur.Encode() + inc);
      if (now.Resettable()) return ResetDrained(mem, t.slot, now, ev);
      return Status::Ok();
    }
    cur = Word0::Decode(ops[1].result[0]);
  }
}

Status LockEngine::StartRelease(RemoteMemory& mem, const Grant& g, PendingRelease* p,
                                EngineEvents* ev) const {
  RDMALOCK_RETURN_IF_ERROR(ReapPending(mem, p, ev));  // an earlier loss is not this release's
  Word0 cur = g.seen;
  RDMALOCK_RETURN_IF_ERROR(CheckReleasable(mem, g, &cur));
  p->grant = g;
  p->first = ReleaseOps(g.ticket, cur, p->ops);
  RDMALOCK_RETURN_IF_ERROR(mem.Start(std::span<RemoteOp>(p->ops + p->first, 2 - p->first)));
  p->active = true;
  return Status::Ok();
}

Status LockEngine::FinishRelease(RemoteMemory& mem, PendingRelease* p, EngineEvents* ev) const {
  if (p == nullptr || !p->active) return Status::Ok();
  p->active = false;
  const Grant& g = p->grant;
  const Ticket& t = g.ticket;
  RDMALOCK_RETURN_IF_ERROR(mem.Await());  // on failure the entry stays out (see Release)
  const RemoteOp& cas = p->ops[1];
  if (cas.result[0] == cas.operand) {
    if (t.record != 0 && on_record_free_) on_record_free_(t.record);
    const Word0 now = Word0::Decode(cas.swap);
    if (now.Resettable()) return ResetDrained(mem, t.slot, now, ev);
    return Status::Ok();
  }
  // Requests queued (or shared siblings released) since the grant was last seen: release again
  // from what the CAS found. Release() gives the entry back.
  Count(&EngineEvents::deferred, ev);
  return ReleaseFrom(mem, g, Word0::Decode(cas.result[0]), /*missed=*/true, ev);
}

Status LockEngine::ReapPending(RemoteMemory& mem, PendingRelease* p, EngineEvents* ev) const {
  if (p == nullptr || !p->active) return Status::Ok();  // the common case, without a call
  Status st = FinishRelease(mem, p, ev);
  // An earlier lock whose release came too late to count is no concern of this call.
  if (st.code() == ErrorCode::kLockLost) return Status::Ok();
  return st;
}

Status LockEngine::Renew(RemoteMemory& mem, Grant& g, EngineEvents* /*ev*/) const {
  const Ticket& t = g.ticket;
  if (!LeaseValid(g, Clock::now())) {
    return Error(ErrorCode::kLockLost,
                 "lease on slot " + std::to_string(t.slot) + " expired before renewal");
  }
  // Word0 by a FETCH_AND_ADD of 0, not a READ: a torn READ could make a held grant look lost
  // (AtomicWord0). One operation either way, in the renewal's doorbell.
  RemoteOp ops[2] = {RemoteOp::FetchAdd(RegionId::kLocks, Word1Off(t.slot), proto::kRenewIncrement),
                     RemoteOp::FetchAdd(RegionId::kLocks, Word0Off(t.slot), 0)};
  RDMALOCK_RETURN_IF_ERROR(mem.Execute(ops));
  const auto issue = mem.last_issued();
  // Checked again at the issue: a thread descheduled between the check above and the post would
  // extend a lease that had run out. A waiter may have recovered the lock by then with a CAS of
  // word0 alone, which the renewal (word1) does not stop, and its landing ahead of that CAS would
  // leave its word0 still showing our grant (docs/protocol.md §4).
  if (!LeaseValid(g, issue)) {
    return Error(ErrorCode::kLockLost, "renewal of slot " + std::to_string(t.slot) +
                                           " was posted after its lease ran out");
  }
  const Word0 w0 = Word0::Decode(ops[1].result[0]);
  if (!StillHeld(w0, t)) {
    return Error(ErrorCode::kLockLost,
                 "slot " + std::to_string(t.slot) + " was recovered by a waiter");
  }
  g.seen = w0;
  g.lease_start = issue;
  // Every 65,536th renewal of a slot carries into word1's generation, so the generation moves on
  // under a holder that renews for long (about 12 hours at a 2 s lease). A tagged entry then read
  // as over to lockd: a holder that died was left to the waiters' stall recovery, and
  // `lockctl release --force <slot>` found no session holding the lock. Write it again with the
  // slot's generation now: while our ticket holds no reset can come, so its counters are that
  // generation's (as a waiter's grant corrects its entry in Wait). Waited for (one round trip in
  // 65,536 renewals): the renewing channel may be another thread's (the keeper's) than the one
  // that releases, and the entry goes back to the pool once the release completes; landing after
  // that, the WRITE would hide the entry's next use from lockd (docs/protocol.md section 10).
  const uint32_t gen = proto::RequestEntry::GenerationOf(ops[0].result[0] + proto::kRenewIncrement);
  if (t.tagged && t.record != 0 && gen != t.generation) {
    g.ticket.generation = gen;
    RemoteOp fix = EntryWrite(t.record, t.record_seq, t.slot, t.mode,
                              proto::RequestEntry::State::kQueued, t.word.Encode(), true, gen);
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(fix));
  }
  return Status::Ok();
}
}  // namespace rdmalock
