// The lock protocol engine: acquire, poll, release, renew, stall recovery, frozen-word withdrawal
// and counter reset on one 16-byte slot, written once against RemoteMemory. See docs/protocol.md.
//
// Thread-safety: a LockEngine may be shared by all threads; each call takes the caller's own
// channel. Its mutable parts are what the session learned of slots' generations
// (GenerationTable) and the slots it saw frozen (FrozenMarks), both lock-free; everything else is
// immutable after construction.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "engine/budgets.h"
#include "engine/frozen_marks.h"
#include "engine/generation_table.h"
#include "engine/remote_memory.h"
#include "engine/stall_clock.h"
#include "rdmalock/proto/layout.h"
#include "rdmalock/proto/lock_word.h"
#include "rdmalock/status.h"

namespace rdmalock {

using Clock = std::chrono::steady_clock;
using proto::Mode;

struct EngineParams {
  uint64_t lock_count = 0;
  std::chrono::nanoseconds lease{std::chrono::seconds(2)};  // L
  uint32_t stall_factor = 2;                                // F
  uint16_t epoch = 0;                                       // lockd's epoch, leads tokens
  // Steady-clock ns until which lockd is trusted (a cluster-mode lockd seen alive; issue 16,
  // finding 4): no lease is valid past it. Null: no such limit. Owned by the session.
  const std::atomic<int64_t>* trusted_until = nullptr;
};

// A queued request: the slot, the mode and word0 as the FETCH_AND_ADD found it.
struct Ticket {
  uint64_t slot = 0;
  Mode mode = Mode::kExclusive;
  proto::Word0 word;
  // Where the request is recorded in the client's session record (byte offset of its entry in
  // the session table), or 0 for an unrecorded request, and this use's seq. See
  // proto::RequestEntry.
  uint64_t record = 0;
  uint32_t record_seq = 0;
  // The entry is tagged with `generation` (the low 32 bits of word1's generation, at most the
  // grant's): lockd acts on it only in that generation, so its exclusive release writes no done
  // mark (proto::RequestEntry, docs/protocol.md sections 10 and 11). Every recorded request of
  // a version-8 SDK, both modes.
  bool tagged = false;
  uint32_t generation = 0;
  // A ticket handed to the abandon handler: a time before which no waiter's stall recovery can
  // have begun timing the word's view that could skip it: the ticket's FA's issue, or the issue
  // of the last READ before one that showed the word's view (nX, nS, word1) change. Waiters skip
  // it no earlier than watched + F x L, and only after a skip can the word reset and its numbers
  // be drawn again; a first look later than that cannot tell it from a later holder's ticket, so
  // Reap leaves it to stall recovery. (A READ that showed the same view again is no bound: a
  // waiter behind may have timed that view since before it.) {}: not known, stepped as before.
  Clock::time_point watched{};
};

struct Grant {
  Ticket ticket;
  proto::Word0 seen;              // word0 as last seen while holding: the release CAS's first guess
  Clock::time_point lease_start;  // the lease ends at lease_start + L
  // When the request began (LockEngine::Acquire's grants): its first FETCH_AND_ADD's issue, or
  // the start of its wait for a thaw before it (a slot its session saw frozen): where an
  // acquire's latency starts for a caller that read no clock of its own.
  Clock::time_point requested;
  uint64_t generation = 0;  // word1's generation when granted (valid if has_generation)
  bool has_generation = false;
  uint64_t token = 0;  // fencing token; exclusive grants with has_generation only
};

// A release whose CAS went out without waiting for it (LockEngine::StartRelease); it lives in
// the channel's owner until FinishRelease, which reaps it.
struct PendingRelease {
  Grant grant;
  RemoteOp ops[2];
  size_t first = 1;
  bool active = false;
};

struct AcquireOptions {
  Clock::time_point deadline = Clock::time_point::max();
  bool try_only = false;    // give up at once instead of queueing (kBusy)
  bool want_token = false;  // read word1 with the FETCH_AND_ADD so a token comes with the grant
  uint64_t record = 0;      // the request's entry in the session record (0: not recorded)
  uint32_t record_seq = 0;  // this use of the entry (proto::RequestEntry::seq)
  // A release this channel started and has not reaped: finished as soon as the acquire's first
  // batch completes (the release landed before it), so a failed CAS is retried before waiting.
  PendingRelease* pending = nullptr;
  // Called on the acquiring thread while the request waits (before each poll, and before each
  // retry on a frozen word), with `mem` free for it to use; false ends the wait as a timeout
  // would (the ticket given up). AcquireMany renews with it the locks its set holds so far
  // (nothing else renews them while the set waits for the next one), and ends the wait when one
  // cannot be renewed, so that it releases the others while their leases run.
  std::function<bool()> while_waiting;
};

// One lock of a set (LockEngine::AcquireMany) or of a batch of independent requests (IssueMany).
struct ManyRequest {
  uint64_t slot = 0;
  Mode mode = Mode::kExclusive;
  bool want_token = false;  // IssueMany: this request wants a token (exclusive only)
};

// What one request's FETCH_AND_ADD found (LockEngine::IssueMany).
struct Issued {
  Grant grant;           // the ticket, and the grant if `granted`
  bool granted = false;  // granted at once
  bool frozen = false;   // a frozen word: its increment was taken back, or (a slot the session
                         // saw frozen, still frozen at a READ) no FA was made; queue again
};

// lockd's recovery of one request of a dead client: Reap() steps it without blocking.
struct ReapState {
  // The recovery of a live entry of an ended session's record (lockd; the host tests' fakes).
  static ReapState ForEntry(const proto::RequestEntry& e) {
    ReapState r;
    r.ticket.slot = e.slot;
    r.ticket.mode = e.mode;
    r.ticket.word = proto::Word0::Decode(e.ticket);
    r.ticket.tagged = e.tagged;
    r.ticket.generation = e.generation;
    return r;
  }

  // Where lockd read the entry in a dead session's record: the slot's word1 then. Reap() leaves
  // an untagged entry alone once word1 shows a generation that may have come with a reset since
  // (SameCounters): the ticket was then released or recovered (a live one keeps the word from
  // draining), and its numbers may be drawn again (docs/protocol.md section 11). A tagged entry
  // carries its own generation; where the scan found the slot in it, Reap goes on past one carry
  // since, as for an untagged entry.
  void NoteScan(uint64_t word1) {
    scanned = true;
    scan_word1 = word1;
  }
  // Whether word1 `now` shows no generation bump since `scan` other than one carry of the renew
  // field (every 65,536th renewal): the same generation, or the next one with the renew field
  // wrapped below its value then. A bump that came with a reset leaves the renew field where it
  // was (only renewals move it, and a second wrap would show as a second generation), so it reads
  // as changed; so does a racing resetter's extra bump, which costs that entry its fast recovery.
  static constexpr bool SameCounters(uint64_t scan, uint64_t now) {
    const uint64_t g0 = proto::Generation(scan), g1 = proto::Generation(now);
    return g1 == g0 || (g1 == g0 + 1 && (now & 0xffff) < (scan & 0xffff));
  }

  Ticket ticket;
  bool scanned = false;
  uint64_t scan_word1 = 0;
  // The caller's own abandoned ticket (the SDK's reaper), not a dead client's (lockd): its record
  // entry is marked done in the release's doorbell and handed back when the ticket is over.
  bool own = false;
  bool started = false;
  engine_internal::WordView seen;  // the queue ahead, timed for stall recovery
  Clock::time_point last_issue;
  // A step posted a CAS on a shared ticket (its release, or its stall recovery) and never saw the
  // completion (the connection dropped): it may have landed, and the word cannot say so, since a
  // shared release carries no identity and leaves nX where it was. The next step gives up.
  bool unseen = false;
  enum class Outcome {
    kPending,
    kReleased,
    kAlreadyDone,
    kRecovered,
    kGaveUp
  } outcome = Outcome::kPending;
};

// What the engine did, for benchmarks and tests.
struct EngineEvents {
  Counter waits;            // acquires not granted by their FA (they waited in the queue)
  Counter recoveries;       // stall recoveries this caller performed
  Counter restarts;         // tickets given up after being skipped, reset or paused
  Counter withdrawals;      // increments withdrawn (frozen word, try-lock, timeout)
  Counter resets;           // counter resets this caller performed
  Counter abandoned;        // tickets handed to the abandon handler
  Counter frozen_left;      // frozen-word increments left to the stall rescue (finding 8)
  Counter deferred;         // posted releases whose CAS had to be retried when reaped
  Counter release_misses;   // release CASes that missed (requests queued or shared siblings
                            // released since the grant was last seen): each one more round trip
  Counter batch_fallbacks;  // sets not all granted at once (acquired in slot order instead)
  Counter renewals;         // leases renewed by AcquireMany for its set while it waited
  Counter renew_failures;   // of those renewals, the ones that failed (the set failed with them)
};

class LockEngine {
 public:
  // Called with a ticket that timed out or failed a try-lock and could not be withdrawn because
  // requests queued behind it. The handler must Drain() it on some channel soon, or the lock
  // stalls until waiters recover (F x L). Must be thread-safe.
  using AbandonHandler = std::function<void(const Ticket&)>;
  // Called with a request's record offset once the engine has cleared the entry (the request is
  // over: released, withdrawn, drained or lost). Must be thread-safe.
  using RecordHandler = std::function<void(uint64_t record)>;

  LockEngine(EngineParams params, AbandonHandler on_abandon, RecordHandler on_record_free = {});

  const EngineParams& params() const { return params_; }
  std::chrono::nanoseconds stall_timeout() const { return params_.lease * params_.stall_factor; }

  // Queues a request on `slot` and waits for it until `opt.deadline`. kTimeout or kBusy when it
  // gave up; the ticket has then been withdrawn or handed to the abandon handler.
  Result<Grant> Acquire(RemoteMemory& mem, uint64_t slot, Mode mode, const AcquireOptions& opt,
                        EngineEvents* ev = nullptr) const;

  // Releases a grant with a COMPARE_AND_SWAP that only lands while the grant still stands, so a
  // release delayed past a recovery cannot count for someone else's ticket. kLockLost (nothing
  // released) when the lease has lapsed or a waiter recovered the lock.
  Status Release(RemoteMemory& mem, const Grant& g, EngineEvents* ev = nullptr) const;

  // Release() without waiting: checks the grant and posts the entry's done mark and the CAS
  // (mem.Start). `p` must stay put until FinishRelease(mem, p), which the channel's next use must
  // call. Errors here are Release()'s, found before anything was posted; a
  // release still pending in `p` is finished first, its loss (kLockLost) not reported here.
  Status StartRelease(RemoteMemory& mem, const Grant& g, PendingRelease* p,
                      EngineEvents* ev = nullptr) const;
  // Reaps a started release: waits for its CAS if it has not completed yet, and if requests
  // queued since the grant was last seen made it miss, releases again (Release()). No-op when
  // `p` is not active.
  Status FinishRelease(RemoteMemory& mem, PendingRelease* p, EngineEvents* ev = nullptr) const;

  // Acquires a set of distinct slots, sorted ascending, all or none. All FETCH_AND_ADDs go out in
  // one doorbell (per kBatchOps operations); if all are granted at once that is the whole cost.
  // Otherwise the locks above the first one not granted are given back and acquired in slot
  // order after it, so two sets cannot deadlock. `take_entry` supplies record entries
  // ({0, 0}: unrecorded). On failure nothing of the set is held.
  using EntrySource = std::function<std::pair<uint64_t, uint32_t>()>;
  Result<std::vector<Grant>> AcquireMany(RemoteMemory& mem, std::span<const ManyRequest> reqs,
                                         const AcquireOptions& opt, const EntrySource& take_entry,
                                         EngineEvents* ev = nullptr) const;
  // The first step of independent requests (slots in any order, repeats allowed): every FA
  // (and token READ) in as few doorbells as kBatchOps allows (none for a slot the session saw
  // frozen that a READ first shows still frozen: `frozen`), the record entries (from
  // `take_entry`, may be empty) posted after. A request not granted at once must be finished with
  // FinishAcquire (or, if frozen, queued again with Acquire).
  Result<std::vector<Issued>> IssueMany(RemoteMemory& mem, std::span<const ManyRequest> reqs,
                                        bool want_token, const EntrySource& take_entry,
                                        PendingRelease* pending, EngineEvents* ev = nullptr) const;
  // Waits for a ticket IssueMany queued (or, with opt.try_only, gives it up unless granted), as
  // Acquire() would have after its FA. opt.deadline and try_only apply; its record is the ticket's.
  Result<Grant> FinishAcquire(RemoteMemory& mem, const Grant& queued, const AcquireOptions& opt,
                              EngineEvents* ev = nullptr) const;

  // Releases grants together: their done marks and CASes in one doorbell (per kBatchOps), then
  // Release() for any CAS that missed. One status per grant.
  std::vector<Status> ReleaseMany(RemoteMemory& mem, std::span<const Grant> grants,
                                  EngineEvents* ev = nullptr) const;
  static constexpr size_t kBatchOps = budget::kMaxOpsPerDoorbell;  // engine/budgets.h
  // A single acquire that must learn its slot's generation READs the words of the slot's whole
  // aligned block of this many slots in its FA's doorbell, one READ of budget::kMaxBlockRead
  // bytes, and learns every slot's generation there (TagTicket, LearnBlock): a session going
  // round many locks pays one READ per block, not one per slot.
  static constexpr uint64_t kGenerationBlockSlots = budget::kMaxBlockRead / proto::kSlotSize;
  static_assert(kGenerationBlockSlots * proto::kSlotSize == budget::kMaxBlockRead);

  // The grant, when last seen, had requests queued behind it that it blocks: their handover
  // depends on this release, so it is better made at once (Release()) than posted.
  static bool BlocksOthers(const Grant& g) {
    const proto::Word0 t = g.ticket.word, s = g.seen;
    if (g.ticket.mode == Mode::kExclusive) {
      return s.max_x != static_cast<uint16_t>(t.max_x + 1) || s.max_s != t.max_s;
    }
    return s.max_x != t.max_x;
  }

  // Extends the lease (FETCH_AND_ADD on word1) and checks the grant still stands.
  Status Renew(RemoteMemory& mem, Grant& g, EngineEvents* ev = nullptr) const;

  // Waits for an abandoned ticket's turn and releases it at once, so the queue moves on. Blocks:
  // a reaper with several tickets must step them with Reap() instead (own = true), or one that
  // waits behind a lock whose holder waits for another could stall them all (docs/protocol.md §3).
  Status Drain(RemoteMemory& mem, const Ticket& t, EngineEvents* ev = nullptr) const;

  // One step of freeing a dead client's request (lockd's fast recovery): one READ of the slot;
  // releases the ticket if it is granted, finishes if it is already done (skipped, reset), marks
  // it done by stall recovery after F x L without progress, and otherwise leaves it pending.
  // Never blocks. Returns true when the ticket needs no more steps (see r.outcome).
  Result<bool> Reap(RemoteMemory& mem, ReapState& r, EngineEvents* ev = nullptr) const;

  // Clears a request's entry, waits for that to land, then hands the entry back: for a request
  // that ends without its grant, and (the SDK) a grant found lost while its session lives.
  void FreeRecord(RemoteMemory& mem, uint64_t record, uint32_t seq) const;

  bool LeaseValid(const Grant& g, Clock::time_point now) const {
    return now < g.lease_start + params_.lease &&
           (params_.trusted_until == nullptr ||
            now.time_since_epoch().count() <
                params_.trusted_until->load(std::memory_order_acquire));
  }

 private:
  enum class WaitOutcome { kGranted, kRestart, kTimeout };
  Result<WaitOutcome> Wait(RemoteMemory& mem, const Ticket& t, Clock::time_point fa_issue,
                           Clock::time_point deadline, Grant* grant, EngineEvents* ev,
                           bool* handed_off,
                           const std::function<bool()>* while_waiting = nullptr) const;
  Result<Grant> AcquireImpl(RemoteMemory& mem, uint64_t slot, Mode mode, const AcquireOptions& opt,
                            EngineEvents* ev, bool* handed_off) const;
  // FinishRelease() for a call that is about something else: kLockLost is dropped.
  Status ReapPending(RemoteMemory& mem, PendingRelease* p, EngineEvents* ev) const;
  // Release()'s checks before anything is posted: the lease runs and `*cur` shows the grant. A
  // `*cur` that does not is no loss yet: it may be a READ's, and a READ is no snapshot of the
  // word (docs/protocol.md §8, torn READs). The word is read atomically then (AtomicWord0) into
  // `*cur`, and only that decides.
  Status CheckReleasable(RemoteMemory& mem, const Grant& g, proto::Word0* cur) const;
  // Takes back an increment from a frozen word; resets the word if that drains it. `cur` is the
  // word right after our FETCH_AND_ADD, issued at `issued`. Leaves the increment to the frozen
  // word's stall rescue when it cannot prove the increment is still in the word.
  Status WithdrawFrozen(RemoteMemory& mem, uint64_t slot, uint64_t inc, proto::Word0 cur,
                        Clock::time_point issued, EngineEvents* ev) const;
  // How soon after its FETCH_AND_ADD a frozen-word withdrawal must have seen the word for its
  // retries to be safe. A word reset behind our back (the stall rescue) starts again from zero
  // and must issue COUNT_MAX = 32768 new tickets before it looks frozen again; no NIC serves that
  // many atomics on one word in 1 ms (that would be 33 M/s on one address).
  static constexpr std::chrono::microseconds kFreshWithdrawal{1000};
  // A ticket whose grant's lease ran out before its holder could know of it (its request waited
  // unseen for a lease) goes to the abandon handler, which releases it when its turn comes;
  // *handed_off says so. `watched`: no waiter can have skipped it before watched + F x L
  // (Ticket::watched). Without a handler (or with handed_off null) it is left to waiters' stall
  // recovery (F x L).
  void AbandonLapsed(const Ticket& t, Clock::time_point watched, EngineEvents* ev,
                     bool* handed_off) const;
  // Gives `t` to the abandon handler (set) with its bound (Ticket::watched).
  void HandOver(Ticket t, Clock::time_point watched) const;
  enum class GiveUp { kWithdrawn, kAbandoned, kGranted, kGone };
  // Gives a queued, not yet granted ticket back: withdraws it if nothing queued behind it and
  // its FA did not freeze the word (a frozen word never thaws before its reset); otherwise
  // abandons it to the handler.
  // `cur` is our best guess of word0 on entry and the last value seen on return. `watched`: no
  // waiter can have skipped the ticket before watched + F x L (Ticket::watched), given to an
  // abandoned ticket.
  Result<GiveUp> GiveUpTicket(RemoteMemory& mem, const Ticket& t, proto::Word0* cur,
                              Clock::time_point watched, EngineEvents* ev) const;
  // A stall recovery's CAS from `seen` (a waiter's, Wait; the SDK reaper's, Reap): true if it
  // landed. With `clear_entry` (a shared ticket's own entry: a recovered shared ticket still
  // looks granted, and lockd releases a granted ticket a live entry shows) the entry is cleared
  // ahead of the CAS in its doorbell, and written again, waited for, if the CAS missed. `*unseen`
  // (optional) is true while the CAS may have landed unseen. A CAS that misses on a word whose
  // counters (nX, nS) are still `seen`'s (only requests queued or withdrawn behind: the max
  // fields moved) is tried again from the word it found, up to kRecoverRetries times; *landed_on
  // (optional) is the word the landed CAS replaced.
  static constexpr int kRecoverRetries = 8;
  Result<bool> RecoverCas(RemoteMemory& mem, const Ticket& t, proto::Word0 seen, bool clear_entry,
                          bool* unseen = nullptr, proto::Word0* landed_on = nullptr) const;
  // One look at a word the session saw frozen (FrozenMarks): a READ of it; a word with nothing
  // but bounces left in it (Word0::Resettable) is reset, one nothing moved in for F x L is
  // rescued (`seen` times it; null: no rescue). True once it has thawed (a reset, ours or
  // another's); the slot's mark is cleared then.
  Result<bool> LookThawed(RemoteMemory& mem, uint64_t slot, engine_internal::WordView* seen,
                          EngineEvents* ev) const;
  // LookThawed until the word thaws (true), backing off from *backoff; a try-lock looks once
  // (false if still frozen). Ends with kTimeout at opt.deadline or when opt.while_waiting says so.
  Result<bool> AwaitThaw(RemoteMemory& mem, uint64_t slot, const AcquireOptions& opt,
                         std::chrono::nanoseconds* backoff, engine_internal::WordView* seen,
                         EngineEvents* ev) const;
  // Resets a frozen word with nothing but bounces left in it (Word0::Resettable: drained, or a
  // bounce's increment left), generation first, then word0 by CAS from `drained`.
  // `*landed` (optional): whether the CAS took.
  Status ResetDrained(RemoteMemory& mem, uint64_t slot, proto::Word0 drained, EngineEvents* ev,
                      bool* landed = nullptr) const;
  std::chrono::nanoseconds PollInterval(const RemoteMemory& mem, uint32_t ahead,
                                        uint32_t unchanged_polls,
                                        std::chrono::nanoseconds handover) const;
  void FillToken(Grant* g) const;
  // A grant found while its ticket was given up (GiveUpTicket's kGranted): the withdrawal's
  // doorbell marked its entry done before the CAS that missed, so the grant would have no live
  // entry. Writes the entry again as a new use (RequestEntry::RearmSeq, with its tag), posted on
  // this channel, so it lands before the release (waited for with
  // `wait`: the grant goes to the abandon handler, which ends the entry on its own QP); and
  // reads a token's generation again (the FA-time value may be older than the grant's).
  Status RearmAfterGiveUp(RemoteMemory& mem, Grant* g, bool wait = false) const;
  // A recorded request's tag (docs/protocol.md, section 10), in two steps that
  // AcquireImpl and IssueMany share. Before the FA: whether the session knows a recent
  // generation of `slot` (into *hint); if not, the request READs word1 in its FA's doorbell.
  // `last_seen`: the clock reading of the channel's last batch (none: a channel's first request
  // takes the hint); TagTicket checks the hint again against the FA's own issue time.
  bool RecentGeneration(uint64_t slot, Clock::time_point last_seen,
                        GenerationTable::Hint* hint) const;
  // After the FA (it queued t->word, issued at `issue`): tags *t with word1 as that READ returned
  // it (`word1`, null without a READ) or with the hint if it covers the FA
  // (GenerationHintCovers), and keeps generations_ up to date: learns a READ's generation, learns
  // again a covering hint at least kGenerationRelearn old; where the hint did not cover, READs
  // word1 (one round trip after the FA; a READ slower than a lease leaves the hint's generation,
  // never newer than the grant's) and learns it.
  Status TagTicket(RemoteMemory& mem, Ticket* t, const uint64_t* word1,
                   const GenerationTable::Hint& hint, Clock::time_point issue) const;
  // The aligned block of kGenerationBlockSlots slots that holds a slot (the last one cut short at
  // the table's end), and the READ of its words (word0, word1 of each slot in turn) into `words`,
  // 2 * kGenerationBlockSlots of them: the READ a request that must learn its slot's generation
  // makes in its FA's doorbell (AcquireImpl, IssueMany).
  struct GenerationBlock {
    uint64_t first = 0, count = 0;
    RemoteOp Read(uint64_t* words) const;
  };
  GenerationBlock BlockOf(uint64_t slot) const;
  // Release()'s loop, from `cur`: the word as the grant last saw it, or (`missed`) the word a
  // release CAS that missed returned (FinishRelease, ReleaseMany). Each miss is counted here,
  // once (EngineEvents::release_misses).
  Status ReleaseFrom(RemoteMemory& mem, const Grant& g, proto::Word0 cur, bool missed,
                     EngineEvents* ev) const;
  // Learns the generations of block `b`'s slots but `except` from a READ of their words
  // (GenerationBlock::Read) issued at `issue` after the caller's FA.
  // Each hint carries the count its word0 showed, so a reset since is seen as TagTicket sees
  // any (GenerationHintCovers). Word0 and word1 of a slot are not read as one snapshot; either
  // way the hint's generation is never newer than a later request's, which is all safety asks
  // (lock_engine_internal.h, GenerationHintCovers).
  void LearnBlock(GenerationBlock b, const uint64_t* words, uint64_t except,
                  Clock::time_point issue) const;

  EngineParams params_;
  AbandonHandler on_abandon_;
  RecordHandler on_record_free_;
  // Slots' generations as this session last saw them: recorded requests tag their entries with
  // them (AcquireImpl). Lock-free; written by any thread's acquire.
  mutable GenerationTable generations_;
  // Slots this session saw frozen: its requests on them READ before they FETCH_AND_ADD, until
  // the word thaws (AcquireImpl, IssueMany). Lock-free; written by any thread's acquire.
  mutable FrozenMarks frozen_;
};

}  // namespace rdmalock
