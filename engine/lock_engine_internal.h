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
                           proto::RequestEntry::State state, uint64_t ticket) {
  proto::RequestEntry e;
  e.slot = static_cast<uint32_t>(slot);
  e.mode = mode;
  e.state = state;
  e.seq = seq;
  e.ticket = ticket;
  const auto w = e.Encode();
  return RemoteOp::Write16(RegionId::kSessions, record, w[0], w[1]);
}

// Marks this use of the entry done. Goes *before* the operation that ends the request, so the
// record never shows a request that may already be released or withdrawn.
inline RemoteOp EntryDone(uint64_t record, uint32_t seq) {
  return RemoteOp::Write(RegionId::kSessions, record + proto::RequestEntry::kDone, seq);
}

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
inline size_t ReleaseOps(const Ticket& t, Word0 cur, RemoteOp ops[2]) {
  ops[0] = EntryDone(t.record, t.record_seq);
  ops[1] = RemoteOp::CompareSwap(RegionId::kLocks, Word0Off(t.slot), cur.Encode(),
                                 cur.Encode() + proto::ReleaseIncrement(t.mode));
  return t.record != 0 ? 0 : 1;
}

}  // namespace rdmalock::engine_internal
