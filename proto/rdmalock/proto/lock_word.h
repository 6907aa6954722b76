// The 16-byte lock slot and the arithmetic on its two words. Header-only, no verbs types: this is
// what every client and lockd must agree on bit for bit. See docs/protocol.md.
#pragma once

#include <cstdint>

namespace rdmalock::proto {

// A slot is two 8-byte words, 16-byte aligned, so it never straddles a cache line.
inline constexpr uint64_t kSlotSize = 16;
inline constexpr uint64_t kWord0Offset = 0;  // the ticket word
inline constexpr uint64_t kWord1Offset = 8;  // the aux word (generation | renew)

// A counter at or above this value freezes the word until it is reset (section 5 of the protocol).
// Counters are 16 bits wide, so up to 65535 - kCountMax requests may bounce off a frozen word.
inline constexpr uint32_t kCountMax = 32768;

enum class Mode : uint8_t { kExclusive = 0, kShared = 1 };

// word0, most significant field first: nX | nS | maxX | maxS (16 bits each).
//   maxS/maxX: shared/exclusive tickets issued; nS/nX: shared/exclusive releases ("now serving").
struct Word0 {
  uint16_t max_s = 0;
  uint16_t max_x = 0;
  uint16_t n_s = 0;
  uint16_t n_x = 0;

  static constexpr Word0 Decode(uint64_t v) {
    return Word0{static_cast<uint16_t>(v), static_cast<uint16_t>(v >> 16),
                 static_cast<uint16_t>(v >> 32), static_cast<uint16_t>(v >> 48)};
  }
  constexpr uint64_t Encode() const {
    return uint64_t{max_s} | (uint64_t{max_x} << 16) | (uint64_t{n_s} << 32) |
           (uint64_t{n_x} << 48);
  }
  constexpr bool operator==(const Word0&) const = default;

  // Some counter reached kCountMax: new requests must withdraw until the word is reset.
  constexpr bool Frozen() const { return max_x >= kCountMax || max_s >= kCountMax; }
  // Every ticket issued has been released (or skipped): no holder, no waiter.
  constexpr bool Drained() const { return n_x == max_x && n_s == max_s; }
  // Frozen, and holding nothing but bounces: the frozen field admitted exactly kCountMax tickets
  // (every later FA bounced), all released (its n reached kCountMax), and the other field is
  // drained; what is left in the frozen field are bounces' increments, in flight or left by a
  // withdrawal that came late. Whoever sees it resets it (docs/protocol.md section 5). A word
  // frozen and drained is one. Drained() alone missed a left increment, and the word waited for
  // the rescue (F x L).
  constexpr bool Resettable() const {
    return (max_x >= kCountMax && n_x == kCountMax && n_s == max_s) ||
           (max_s >= kCountMax && n_s == kCountMax && n_x == max_x);
  }
};

// Who holds a lock and who waits, as far as the counters alone tell. A mode's outstanding requests
// are its tickets issued minus its releases. With one mode outstanding this is exact: one
// exclusive holder and the rest waiting, or every shared request holding. With both outstanding
// the queue's order is not in the word: at least one request holds (counted as one holder) and
// the rest are counted as waiting. lockd's metrics and lockctl use this.
struct Occupancy {
  uint32_t exclusive_outstanding = 0, shared_outstanding = 0;
  uint32_t holders = 0;  // 0 (free), 1 (exclusive or a mixed queue's head), or the shared holders
  uint32_t waiting = 0;
  bool exclusive_held = false;  // only exclusive requests outstanding: the oldest holds it
};
constexpr Occupancy OccupancyOf(Word0 w) {
  Occupancy o;
  o.exclusive_outstanding = w.max_x >= w.n_x ? uint32_t(w.max_x - w.n_x) : 0;
  o.shared_outstanding = w.max_s >= w.n_s ? uint32_t(w.max_s - w.n_s) : 0;
  const uint32_t total = o.exclusive_outstanding + o.shared_outstanding;
  if (o.exclusive_outstanding == 0) {
    o.holders = o.shared_outstanding;
  } else if (total > 0) {
    o.holders = 1;
    o.waiting = total - 1;
    o.exclusive_held = o.shared_outstanding == 0;
  }
  return o;
}

// Whether a reading (word0, generation) shows a word reset since an earlier one (`before`, in
// `generation_before`). A reset, only ever of a frozen word, bumps the generation first and zeroes
// word0 after (a bump whose CAS then fails leaves the word frozen): a frozen word0 with a new
// generation is not reset yet. And the generation also moves without a reset, when word1's
// 16-bit renewal counter carries into it (every 65,536 renewals): a reset shows as the earlier
// reading frozen, or a counter lower than it was (a reset followed by more requests than the
// earlier reading showed, from a word not frozen then, is counted as if none happened: short).
constexpr bool ResetSince(Word0 before, uint32_t generation_before, Word0 now,
                          uint32_t generation_now) {
  return generation_now != generation_before && !now.Frozen() &&
         (before.Frozen() || now.max_x < before.max_x || now.max_s < before.max_s);
}

// Requests that queued on a slot between two readings of it, from the ticket counters (maxX,
// maxS). Within a generation they never wrap: a word freezes at kCountMax and at most 32,767
// requests are out on it at once (kMaxClientsLimit), so a counter below its earlier reading went
// down, by withdrawals (a try-lock's ticket given back, a timed-out request at the queue's end),
// and counts 0, not a wrap-around of 65,535 (until 2026-12-06). After a reset the counters
// restarted: count what they show now. Keep GenerationSeen's generation with `now` for the next
// reading. lockd's metrics and lockctl top sample the table with it.
constexpr uint64_t RequestsBetween(Word0 before, uint32_t generation_before, Word0 now,
                                   uint32_t generation_now) {
  if (ResetSince(before, generation_before, now, generation_now)) {
    return uint64_t{now.max_x} + now.max_s;
  }
  const auto up = [](uint16_t b, uint16_t n) { return n > b ? uint64_t{n} - b : uint64_t{0}; };
  return up(before.max_x, now.max_x) + up(before.max_s, now.max_s);
}
// The generation to keep with a reading: the earlier one while the word is frozen (not reset yet,
// ResetSince), else its own.
constexpr uint32_t GenerationSeen(uint32_t generation_before, Word0 now, uint32_t generation_now) {
  return now.Frozen() ? generation_before : generation_now;
}

// The FETCH_AND_ADD operands.
inline constexpr uint64_t kAcquireExclusive = uint64_t{1} << 16;
inline constexpr uint64_t kAcquireShared = 1;
inline constexpr uint64_t kReleaseExclusive = uint64_t{1} << 48;
inline constexpr uint64_t kReleaseShared = uint64_t{1} << 32;

constexpr uint64_t AcquireIncrement(Mode m) {
  return m == Mode::kExclusive ? kAcquireExclusive : kAcquireShared;
}
constexpr uint64_t ReleaseIncrement(Mode m) {
  return m == Mode::kExclusive ? kReleaseExclusive : kReleaseShared;
}

// word1: generation (high 48 bits) | renew (low 16 bits). Only FETCH_AND_ADD touches it. A carry
// out of `renew` into `generation` is harmless: generation only grows (a holder whose record entry
// is tagged with the generation writes it again with the new one: LockEngine::Renew).
inline constexpr uint64_t kRenewIncrement = 1;
inline constexpr uint64_t kGenerationIncrement = uint64_t{1} << 16;
constexpr uint64_t Generation(uint64_t word1) { return word1 >> 16; }

// `ticket` is the value of word0 returned by the FETCH_AND_ADD that queued a request (the state
// before it). A request is granted once every request queued before it of a conflicting mode has
// released.
constexpr bool Granted(Word0 now, Word0 ticket, Mode m) {
  if (m == Mode::kExclusive) return now.n_x == ticket.max_x && now.n_s == ticket.max_s;
  return now.n_x == ticket.max_x;
}

// Someone recovered past this request: its ticket counts as released. An S request only looks at
// nX, since sibling readers may release before the request notices its own grant.
constexpr bool Skipped(Word0 now, Word0 ticket, Mode m) {
  if (m == Mode::kExclusive) return now.n_x > ticket.max_x || now.n_s > ticket.max_s;
  return now.n_x > ticket.max_x;
}

// The request's own increment is no longer in the word (the word was reset since it queued).
constexpr bool TicketGone(Word0 now, Word0 ticket, Mode m) {
  return m == Mode::kExclusive ? now.max_x <= ticket.max_x : now.max_s <= ticket.max_s;
}

// A ticket that cannot be a live one of this word's: it shows more requests of the other mode
// ahead of it than the word has ever issued in its generation (the word's max fields only grow,
// and a withdrawal takes back only the last ticket, or increments added after a freeze, never
// one below a live ticket's numbers), or the word has no request of its mode outstanding (a live
// ticket keeps its increment in its mode's max field until it is released or skipped). A record
// entry so read is from another generation (a reset came before lockd read it) or garbage: over.
constexpr bool NotOfThisWord(Word0 now, Word0 ticket, Mode m) {
  return m == Mode::kExclusive ? ticket.max_s > now.max_s || now.n_x >= now.max_x
                               : ticket.max_x > now.max_x || now.n_s >= now.max_s;
}

// Requests that must release before this one is granted (0 once granted).
constexpr uint32_t Ahead(Word0 now, Word0 ticket, Mode m) {
  uint32_t ahead = ticket.max_x > now.n_x ? uint32_t(ticket.max_x - now.n_x) : 0;
  if (m == Mode::kExclusive && ticket.max_s > now.n_s) ahead += uint32_t(ticket.max_s - now.n_s);
  return ahead;
}

// The word a stalled waiter installs by COMPARE_AND_SWAP: every request up to and including its
// own counts as done; it then queues again. `seen` is the value it observed unchanged for F x L.
constexpr Word0 RecoveredWord(Word0 seen, Word0 ticket, Mode m) {
  Word0 w = seen;
  if (m == Mode::kExclusive) {
    w.n_x = static_cast<uint16_t>(ticket.max_x + 1);
    w.n_s = ticket.max_s;
  } else {
    w.n_x = ticket.max_x;
    w.n_s = static_cast<uint16_t>(seen.n_s + 1);
  }
  return w;
}

// Fencing token of an exclusive grant (protocol version 5):
//   epoch:16 | generation:29 | ticket:15 | local:4
// `local` is 0 for a grant from lockd and k for the k-th in-process handover of that grant to
// another thread of the same client (cohort handover, client/src/cohort.h), so the holders of
// one remote grant get tokens between its own and the next remote grant's. Tokens of successive
// exclusive holders of one lock strictly increase, across resets and lockd restarts, while a
// slot's generation stays below 2^29 within one epoch (docs/protocol.md, section 6).
inline constexpr unsigned kTokenLocalBits = 4;
inline constexpr unsigned kTokenTicketBits = 15;
inline constexpr unsigned kTokenGenerationBits = 29;
inline constexpr uint64_t kTokenLocalMax = (uint64_t{1} << kTokenLocalBits) - 1;
static_assert(kTokenLocalBits + kTokenTicketBits + kTokenGenerationBits + 16 == 64);
// A granted exclusive ticket is below kCountMax (a request whose ticket reaches it withdraws).
static_assert(kCountMax <= (uint32_t{1} << kTokenTicketBits));
constexpr uint64_t FencingToken(uint16_t epoch, uint64_t generation, uint16_t ticket,
                                uint64_t local = 0) {
  constexpr uint64_t kGenMask = (uint64_t{1} << kTokenGenerationBits) - 1;
  constexpr uint64_t kTicketMask = (uint64_t{1} << kTokenTicketBits) - 1;
  return (uint64_t{epoch} << 48) |
         ((generation & kGenMask) << (kTokenTicketBits + kTokenLocalBits)) |
         ((uint64_t{ticket} & kTicketMask) << kTokenLocalBits) | (local & kTokenLocalMax);
}
// The token of the `local`-th local handover of the grant whose token is `remote`.
constexpr uint64_t LocalHandoverToken(uint64_t remote, uint64_t local) {
  return (remote & ~kTokenLocalMax) | (local & kTokenLocalMax);
}

}  // namespace rdmalock::proto
