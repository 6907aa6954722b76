// Helpers the protocol engine's files share (engine/lock_engine*.cc): word offsets, the record
// entries' writes, event counting and the still-held check. Not part of the engine's interface.
// Pure functions; no state.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/lock_engine.h"
#include "engine/remote_memory.h"
#include "rdmalock/proto/layout.h"
#include "rdmalock/proto/lock_word.h"

namespace rdmalock::engine_internal {

using proto::Word0;

inline constexpr uint64_t Word0Off(uint64_t slot) {
  return proto::SlotOffset(slot) + proto::kWord0Offset;
}
inline constexpr uint64_t Word1Off(uint64_t slot) {
  return proto::SlotOffset(slot) + proto::kWord1Offset;
}

inline void Count(Counter EngineEvents::*field, EngineEvents* ev) {
  if (ev != nullptr) ++(ev->*field);
}

inline RemoteOp EntryWrite(uint64_t record, uint32_t seq, uint64_t slot, Mode mode,
                           proto::RequestEntry::State state, uint64_t ticket, bool tagged = false,
                           uint32_t generation = 0) {
  proto::RequestEntry e;
  e.slot = static_cast<uint32_t>(slot);
  e.mode = mode;
  e.state = state;
  e.seq = seq;
  e.ticket = ticket;
  e.tagged = tagged;
  e.generation = generation;
  const auto w = e.Encode();
  return RemoteOp::Write16(RegionId::kSessions, record, w[0], w[1]);
}

// Requests a word has queued in its generation (each acquire's FA adds one to max_x or max_s).
inline uint32_t TicketsIssued(Word0 w) { return uint32_t{w.max_x} + w.max_s; }

// How long a generation the session learned of a slot (GenerationTable) is taken as the slot's
// generation for a request that queued `prev` (the word its FA returned) at `issue`, tagging its
// record entry without a READ of word1. The FA's count (max_x + max_s) must be no lower than the
// hint's: a word reset since then restarted its counters, and mostly shows it. A later generation
// that this check cannot see needs the hint's generation to freeze (some counter at COUNT_MAX,
// so COUNT_MAX minus the hint's count of further tickets) and drain, and then as many tickets of
// the new generation as the hint had counted: at least COUNT_MAX = 32,768 requests granted and
// released on one word since the hint, which within kGenerationHintAge means 3,277 a second,
// sustained, while this session did not look at the slot.
//
// Safety does not rest on this bound. Any hint was read from the slot before this request's FA,
// and generations only grow, so it is never newer than the grant's generation; a hint older than
// the grant's generation makes lockd ignore the entry (it acts only when the slot's generation
// equals the entry's), and only that request's fast recovery (were its client to die holding it)
// is left to the waiters' stall recovery (F x L), as for an unrecorded request. A request that
// waits sees word1 with its grant and corrects its entry (LockEngine::Wait).
inline constexpr std::chrono::seconds kGenerationHintAge{10};
// A request a hint covered learns it again (its own count and time) only when the hint is at
// least this old.
inline constexpr std::chrono::milliseconds kGenerationRelearn{100};
// XORed into a READ's generation for a waiting ticket in a word at or near freezing
// (LockEngine::TagTicket): a tag lockd does not see in the slot for 2^31 generations, so it
// ignores the entry.
inline constexpr uint32_t kUnseenGeneration = uint32_t{1} << 31;
// How close to kCountMax a max field (with our increment) makes a READ after our FA untrusted for
// a waiting ticket: a frozen-word rescue that resets the word under it needs the last tickets
// before the freeze to withdraw, the last first, until the word unfroze for our FA; more than this
// many is taken not to happen within the rescue's F x L.
inline constexpr uint32_t kNearFreeze = 256;
inline bool GenerationHintCovers(const GenerationTable::Hint& h, Word0 prev,
                                 Clock::time_point issue) {
  return TicketsIssued(prev) >= h.tickets && GenerationTable::Age(h, issue) < kGenerationHintAge;
}

// Marks this use of the entry done. Goes *before* the operation that ends the request, so the
// record never shows a request that may already be released or withdrawn.
inline RemoteOp EntryDone(uint64_t record, uint32_t seq) {
  return RemoteOp::Write(RegionId::kSessions, record + proto::RequestEntry::kDone, seq);
}

// A word of the lock table read atomically: a FETCH_AND_ADD of 0, which changes nothing. A READ
// is no snapshot of the word: the IB spec makes atomics atomic among themselves only, and a READ
// is a DMA of 8 bytes that need not see them at one instant (rdma_rxe copies it bytewise, and a
// copy stalled halfway mixes two values: docs/protocol.md §8, torn READs).
inline Result<uint64_t> AtomicRead(RemoteMemory& mem, uint64_t offset) {
  RemoteOp fa = RemoteOp::FetchAdd(RegionId::kLocks, offset, 0);
  RDMALOCK_RETURN_IF_ERROR(mem.Execute(fa));
  return fa.result[0];
}

// Word0 of `slot` read atomically. A decision that no later CAS checks against the same value (a
// loss, a restart, giving a ticket up) is taken on this.
inline Result<proto::Word0> AtomicWord0(RemoteMemory& mem, uint64_t slot) {
  RDMALOCK_ASSIGN_OR_RETURN(const uint64_t w, AtomicRead(mem, Word0Off(slot)));
  return proto::Word0::Decode(w);
}

// Word1 as a READ showed it (`*word1`), made whole where its generation is taken for a token, a
// record's tag or a hint (docs/protocol.md §8, torn READs). A READ torn bytewise, low bytes first
// as rdma_rxe copies, shows a generation newer than the word's only by taking a low byte from
// before a carry out of it: one within as many of 0xff as the generation moved during the copy.
// While fewer than kTornGenerationMargin generation changes of one slot (each a reset after
// 32,768 tickets, a recovery after F x L, or a carry out of 65,536 renewals) land during one
// READ's copy, a READ whose generation's low byte is below 256 - kTornGenerationMargin shows no
// generation newer than the word's; one at or above it is read again atomically (a FETCH_AND_ADD
// of 0, one more round trip, for 4 generation values in 256). A generation older than the
// word's is harmless everywhere (a torn READ never shows one older than before the READ).
inline constexpr uint64_t kTornGenerationMargin = 4;
inline constexpr bool GenerationReadWhole(uint64_t word1) {
  return (proto::Generation(word1) & 0xff) < 256 - kTornGenerationMargin;
}
inline Status WholeWord1(RemoteMemory& mem, uint64_t slot, uint64_t* word1) {
  if (GenerationReadWhole(*word1)) return Status::Ok();
  RDMALOCK_ASSIGN_OR_RETURN(*word1, AtomicRead(mem, Word1Off(slot)));
  return Status::Ok();
}

// A 16-bit counter seen through a READ torn bytewise is made of bytes of the counter's values at
// several instants. While the true counter stays within this many of a value above it, no mix of
// its bytes equals that value: the low byte would have to come from a value that many short.
inline constexpr uint16_t kTornReadMargin = 256;

// The grant still stands in `w`: nothing released it or recovered past it, and the word was not
// reset since (our own request is still counted in it).
inline bool StillHeld(Word0 w, const Ticket& t) {
  if (t.mode == Mode::kExclusive) {
    return w.n_x == t.word.max_x && w.n_s == t.word.max_s && w.max_x > t.word.max_x;
  }
  return w.n_x == t.word.max_x && w.max_s > t.word.max_s && w.n_s < w.max_s;
}

// A release's doorbell: the entry's done mark, then the CAS that ends the grant. The done mark
// goes *before* the CAS: were it after, a crash between the two would leave lockd a record of a
// released shared ticket, and a second release of it would count for another reader. (If the CAS
// misses and we try again, the entry reads done meanwhile: a crash then leaves this grant to
// stall recovery.) Returns the index of the first op to post.
// A tagged exclusive entry (with its grant's generation or an older one) gets no done mark: lockd
// acts on it only in that generation, in which the CAS below moves n_x past its ticket for good.
// A shared one does: a shared release carries no identity, and n_x does not move past it. So does
// a use re-armed after a give-up (its odd seq, RequestEntry::RearmSeq): it keeps its tag, and
// may stand in for the use that would have kept the mark close (KeepsDoneClose never holds for
// an odd seq).
// Its record stays as it is until the entry's next use (docs/protocol.md, section 10), but for
// one use in 8,192, which writes the mark all the same (RequestEntry::KeepsDoneClose).
inline size_t ReleaseOps(const Ticket& t, Word0 cur, RemoteOp ops[2]) {
  ops[0] = EntryDone(t.record, t.record_seq);
  ops[1] = RemoteOp::CompareSwap(RegionId::kLocks, Word0Off(t.slot), cur.Encode(),
                                 cur.Encode() + proto::ReleaseIncrement(t.mode));
  const bool mark = t.mode == Mode::kShared || !t.tagged || (t.record_seq & 1) != 0 ||
                    proto::RequestEntry::KeepsDoneClose(t.record_seq);
  return t.record != 0 && mark ? 0 : 1;
}

}  // namespace rdmalock::engine_internal
