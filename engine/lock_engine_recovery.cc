// LockEngine's recovery: draining an abandoned ticket and reaping an ended session's recorded
// requests (lockd's recovery thread and the SDK's reaper; engine/lock_engine.h).
#include <algorithm>
#include <utility>
#include <vector>

#include "engine/lock_engine.h"
#include "engine/lock_engine_internal.h"

namespace rdmalock {
using namespace engine_internal;  // NOLINT: the engine's own helpers
using proto::Word0;

Status LockEngine::Drain(RemoteMemory& mem, const Ticket& t, EngineEvents* ev) const {
  Grant g;
  auto out = Wait(mem, t, Clock::now(), Clock::time_point::max(), &g, ev, nullptr);
  if (!out.ok() || *out != WaitOutcome::kGranted) {  // skipped or reset: nothing to release
    FreeRecord(mem, t.record, t.record_seq);
    return out.ok() ? Status::Ok() : out.status();
  }
  Status st = Release(mem, g, ev);  // clears the entry
  return st.code() == ErrorCode::kLockLost ? Status::Ok() : st;
}

Result<bool> LockEngine::Reap(RemoteMemory& mem, ReapState& r, EngineEvents* ev) const {
  using Outcome = ReapState::Outcome;
  const Ticket& t = r.ticket;
  // Left to the waiters' stall recovery: over, and the SDK's own entry cleared.
  const auto give_up = [&] {
    r.outcome = Outcome::kGaveUp;
    if (r.own) FreeRecord(mem, t.record, t.record_seq);
    return true;
  };
  if (r.unseen) {
    // An earlier step's CAS on this shared ticket may have landed unseen: stepping again could
    // release the ticket a second time, which would count for another reader and could admit a
    // writer beside it. Leave it to the waiters' stall recovery (a ticket released already is
    // nothing to them).
    return give_up();
  }
  if (r.started && Clock::now() - r.last_issue > params_.lease) {
    // We lost sight of the word for a lease (lockd was descheduled): the word may have been
    // reset meanwhile and the ticket's numbers reused. Leave it to the waiters' stall recovery.
    return give_up();
  }
  RemoteOp rd = RemoteOp::Read(RegionId::kLocks, Word0Off(t.slot), 16);
  const auto issue = Clock::now();
  RDMALOCK_RETURN_IF_ERROR(mem.Execute(rd));
  const auto done = Clock::now();
  if (r.own && !r.started && t.watched != Clock::time_point{} &&
      done - t.watched >= stall_timeout()) {
    // The SDK's own ticket, first looked at F x L or more after `watched` (Ticket::watched: an
    // async request unwatched in the queue for a waiter thread, a waiter paused past a lease):
    // waiters may have skipped it since watched + F x L, and the word reset and climbed back to
    // its numbers for a later holder, whose grant would read as ours and be released (found by
    // review, 2026-12-08: unit test `issue_many: a ticket unwatched past the stall timeout is not
    // released over a later holder of its numbers`). Left to the waiters' stall recovery, as
    // lockd leaves a ticket it lost sight of. (A READ that completed before watched + F x L saw
    // the word before any skip: its numbers are ours, and so are those of every READ after it
    // within a lease, the check above.)
    return give_up();
  }
  r.started = true;
  r.last_issue = issue;
  Word0 w0 = Word0::Decode(rd.result[0]);
  uint64_t w1 = rd.result[1];
  // A READ is no snapshot (AtomicWord0): what ends the reaping (over, or granted and released
  // below) is decided on both words read atomically, word0 first as the READ reads them.
  auto confirm = [&]() -> Status {
    RemoteOp fa[2] = {RemoteOp::FetchAdd(RegionId::kLocks, Word0Off(t.slot), 0),
                      RemoteOp::FetchAdd(RegionId::kLocks, Word1Off(t.slot), 0)};
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(fa));
    w0 = Word0::Decode(fa[0].result[0]);
    w1 = fa[1].result[0];
    return Status::Ok();
  };
  // A dead session's entry counts only in its own generation (a tagged one's), or while the
  // counters are the ones lockd saw when it read the record (untagged entries carry no generation:
  // ReapState::NoteScan).
  auto is_over = [&] {
    // Numbers past the word's own: an entry of another generation (the word reset before lockd
    // read the record, so the scan noted the new one) or garbage. Stepped on, its stall recovery
    // installed counts past the word's and every later request saw itself skipped, for ever
    // (found by review, 2026-12-07).
    if (!r.own && proto::NotOfThisWord(w0, t.word, t.mode)) return true;
    if (!r.own && t.tagged) {
      // In its own generation; or, where lockd's scan found the slot in it, moved on since by one
      // renewal's carry alone (SameCounters: another reader's renewals, every 65,536th of the
      // slot). The scan's equality says the grant is of that generation (the tag is never newer
      // than the grant's, the slot never older), as the untagged rule below assumes.
      const bool carried = r.scanned &&
                           proto::RequestEntry::GenerationOf(r.scan_word1) == t.generation &&
                           ReapState::SameCounters(r.scan_word1, w1);
      return proto::RequestEntry::TaggedOver(
          t.word, t.mode, t.generation, w0,
          carried ? r.scan_word1 : w1);  // compared as in the scan's generation
    }
    return (!r.own && r.scanned && !ReapState::SameCounters(r.scan_word1, w1)) ||
           proto::TicketGone(w0, t.word, t.mode) || proto::Skipped(w0, t.word, t.mode);
  };
  if (is_over() || proto::Granted(w0, t.word, t.mode)) RDMALOCK_RETURN_IF_ERROR(confirm());
  // A tagged entry of a dead client counts only in its own generation. Its exclusive release
  // wrote no done mark, so after a reset its ticket's numbers may be a later holder's; and a
  // generation older than the grant's (the SDK's hint) only makes lockd leave the request to
  // stall recovery. The SDK's own abandoned ticket is no stale entry: it is stepped as before.
  if (is_over()) {
    r.outcome = Outcome::kAlreadyDone;
    if (r.own) FreeRecord(mem, t.record, t.record_seq);
    return true;
  }
  if (proto::Granted(w0, t.word, t.mode)) {
    // The SDK's own ticket, past a cluster-mode lockd's liveness limit: a release now would find
    // its lease untrusted and give it up to the waiters. Looked at again next round: either the
    // keeper sees lockd tick again (then it is released) or it ends the session (then lockd frees
    // it from the record).
    if (r.own && params_.trusted_until != nullptr &&
        Clock::now().time_since_epoch().count() >=
            params_.trusted_until->load(std::memory_order_acquire)) {
      return false;
    }
    Grant g;
    g.ticket = t;
    // lockd clears a dead session's record itself; the SDK's own entry is marked done in the
    // release's doorbell (and handed back by Release()).
    if (!r.own) g.ticket.record = 0;
    g.seen = w0;
    g.lease_start = issue;
    r.unseen = t.mode == Mode::kShared;  // until the release's completion says what became of it
    Status st = Release(mem, g, ev);
    if (!st.ok() && st.code() != ErrorCode::kLockLost) return st;
    r.unseen = false;
    r.outcome = st.ok() ? Outcome::kReleased : Outcome::kAlreadyDone;
    return true;
  }
  if (r.seen.Note(w0, w1, done) || !r.seen.StalledFor(done, stall_timeout())) return false;
  if (!r.own) {
    // Never a word with counts past its issued ones (NotOfThisWord should have said over; a
    // recovery that installed one made every later request of the slot see itself skipped).
    const Word0 want = proto::RecoveredWord(w0, t.word, t.mode);
    if (want.n_x > want.max_x || want.n_s > want.max_s) {
      r.outcome = Outcome::kAlreadyDone;
      return true;
    }
  }
  // The queue ahead of this ticket is stuck (F x L): mark it and this ticket done, as a waiter.
  // The SDK's own shared entry is cleared in the CAS's doorbell, as a waiter's (RecoverCas); a
  // recovered shared ticket still looks granted, so the CAS may land unseen (r.unseen).
  Word0 replaced = w0;
  RDMALOCK_ASSIGN_OR_RETURN(
      const bool landed, RecoverCas(mem, t, w0, r.own && t.record != 0 && t.mode == Mode::kShared,
                                    &r.unseen, &replaced));
  const Word0 rec = proto::RecoveredWord(replaced, t.word, t.mode);
  if (!landed) {
    r.seen.Forget();  // something moved: time the stall again
    return false;
  }
  Count(&EngineEvents::recoveries, ev);
  if (r.own) FreeRecord(mem, t.record, t.record_seq);
  // Over before the reset: a reset that fails must not make this ticket be stepped again.
  r.outcome = Outcome::kRecovered;
  if (rec.Resettable()) RDMALOCK_RETURN_IF_ERROR(ResetDrained(mem, t.slot, rec, ev));
  return true;
}
}  // namespace rdmalock
