// The three memory regions lockd exposes and the info page at the start of the first one.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "rdmalock/proto/lock_word.h"
#include "rdmalock/proto/wire.h"

namespace rdmalock::proto {

inline constexpr uint32_t kLayoutVersion = 2;
inline constexpr uint64_t kInfoMagic = 0x4b434f4c414d4452ull;  // "RDMALOCK" read little-endian
inline constexpr uint64_t kInfoPageSize = 4096;

// A client's FETCH_AND_ADD of 0 on a word lockd set to kProbePattern tells whether the client's NIC
// returns atomic results in host byte order (pitfall: some do not). Since protocol 7 the word is
// the client's own, in its session record (SessionRecord::kProbe), which lockd sets when the
// session starts: no other client can change it. Clients of protocols 5 and 6 probe the probe
// slot after the lock table, which lockd still fills before registering the table; any client may
// change that one with atomics, and then their probes fail.
inline constexpr uint64_t kProbePattern = 0x0102030405060708ull;
constexpr uint64_t LockTableBytes(uint64_t lock_count) { return (lock_count + 1) * kSlotSize; }
constexpr uint64_t SlotOffset(uint64_t slot) { return slot * kSlotSize; }
constexpr uint64_t ProbeOffset(uint64_t lock_count) { return lock_count * kSlotSize; }

// Limits lockd enforces on its configuration.
inline constexpr uint64_t kMinLockCount = 1;
inline constexpr uint64_t kMaxLockCount = uint64_t{1} << 28;  // 4 GiB of slots
inline constexpr uint32_t kSessionRecordSize = 4096;

// The info page (READ-only to clients). Fields are little-endian at fixed offsets; lockd updates
// the counters with aligned 8-byte CPU stores, which a client's aligned 8-byte READ sees whole.
struct InfoPage {
  static constexpr size_t kMagic = 0;                  // u64
  static constexpr size_t kLayoutVersionOff = 8;       // u32
  static constexpr size_t kSlotSizeOff = 12;           // u32
  static constexpr size_t kEpoch = 16;                 // u64
  static constexpr size_t kLockCount = 24;             // u64
  static constexpr size_t kLeaseNs = 32;               // u64
  static constexpr size_t kStallFactor = 40;           // u32
  static constexpr size_t kSessionRecordSizeOff = 44;  // u32
  static constexpr size_t kMaxSessions = 48;           // u64
  static constexpr size_t kStartTimeUnixNs = 56;       // u64
  static constexpr size_t kConnectedClients = 64;      // u64, updated live
  static constexpr size_t kAcceptedTotal = 72;         // u64, updated live
  static constexpr size_t kRejectedTotal = 80;         // u64, updated live
  static constexpr size_t kClockUnixNs = 88;           // u64, lockd's clock, updated every tick
  static constexpr size_t kGraceUntilUnixNs = 96;      // u64, restart grace end (0: none)
  static constexpr size_t kRecoveries = 104;           // u64, sessions recovered, updated live
  // u64, advanced by lockd's event loop at every tick while lockd may serve (in cluster mode:
  // while its etcd lease is provably valid). A client of a lockd that sets kLivenessTimeoutNs
  // trusts its leases only while it has seen this move within that time (docs/operations.md,
  // "Failover with etcd"; issue 16, finding 4).
  static constexpr size_t kAliveTicks = 112;
  static constexpr size_t kLivenessTimeoutNs = 120;  // u64, T; 0: clients need not watch
  static constexpr size_t kEncodedSize = 128;

  uint64_t magic = kInfoMagic;
  uint32_t layout_version = kLayoutVersion;
  uint32_t slot_size = kSlotSize;
  uint64_t epoch = 0;
  uint64_t lock_count = 0;
  uint64_t lease_ns = 0;
  uint32_t stall_factor = 0;
  uint32_t session_record_size = kSessionRecordSize;
  uint64_t max_sessions = 0;
  uint64_t start_time_unix_ns = 0;
  uint64_t connected_clients = 0;
  uint64_t accepted_total = 0;
  uint64_t rejected_total = 0;
  uint64_t clock_unix_ns = 0;
  uint64_t grace_until_unix_ns = 0;
  uint64_t recoveries = 0;
  uint64_t alive_ticks = 0;
  uint64_t liveness_timeout_ns = 0;

  void EncodeTo(std::span<uint8_t> page) const {
    PutLe(page, kMagic, magic, 8);
    PutLe(page, kLayoutVersionOff, layout_version, 4);
    PutLe(page, kSlotSizeOff, slot_size, 4);
    PutLe(page, kEpoch, epoch, 8);
    PutLe(page, kLockCount, lock_count, 8);
    PutLe(page, kLeaseNs, lease_ns, 8);
    PutLe(page, kStallFactor, stall_factor, 4);
    PutLe(page, kSessionRecordSizeOff, session_record_size, 4);
    PutLe(page, kMaxSessions, max_sessions, 8);
    PutLe(page, kStartTimeUnixNs, start_time_unix_ns, 8);
    PutLe(page, kConnectedClients, connected_clients, 8);
    PutLe(page, kAcceptedTotal, accepted_total, 8);
    PutLe(page, kRejectedTotal, rejected_total, 8);
    PutLe(page, kClockUnixNs, clock_unix_ns, 8);
    PutLe(page, kGraceUntilUnixNs, grace_until_unix_ns, 8);
    PutLe(page, kRecoveries, recoveries, 8);
    PutLe(page, kAliveTicks, alive_ticks, 8);
    PutLe(page, kLivenessTimeoutNs, liveness_timeout_ns, 8);
  }
  static InfoPage DecodeFrom(std::span<const uint8_t> page) {
    InfoPage p;
    p.magic = GetLe(page, kMagic, 8);
    p.layout_version = static_cast<uint32_t>(GetLe(page, kLayoutVersionOff, 4));
    p.slot_size = static_cast<uint32_t>(GetLe(page, kSlotSizeOff, 4));
    p.epoch = GetLe(page, kEpoch, 8);
    p.lock_count = GetLe(page, kLockCount, 8);
    p.lease_ns = GetLe(page, kLeaseNs, 8);
    p.stall_factor = static_cast<uint32_t>(GetLe(page, kStallFactor, 4));
    p.session_record_size = static_cast<uint32_t>(GetLe(page, kSessionRecordSizeOff, 4));
    p.max_sessions = GetLe(page, kMaxSessions, 8);
    p.start_time_unix_ns = GetLe(page, kStartTimeUnixNs, 8);
    p.connected_clients = GetLe(page, kConnectedClients, 8);
    p.accepted_total = GetLe(page, kAcceptedTotal, 8);
    p.rejected_total = GetLe(page, kRejectedTotal, 8);
    p.clock_unix_ns = GetLe(page, kClockUnixNs, 8);
    p.grace_until_unix_ns = GetLe(page, kGraceUntilUnixNs, 8);
    p.recoveries = GetLe(page, kRecoveries, 8);
    p.alive_ticks = GetLe(page, kAliveTicks, 8);
    p.liveness_timeout_ns = GetLe(page, kLivenessTimeoutNs, 8);
    return p;
  }
};
static_assert(InfoPage::kEncodedSize <= kInfoPageSize);

// A session record. The header's first 112 bytes (to kClientWritable) are lockd's: written when
// the session starts, zeroed when it ends (session_id 0 marks a free record), and outside the
// client's window, so what operators see of a session is lockd's view. The client RDMA-WRITEs its
// heartbeat counter and its request entries; lockd stamps when it last saw the heartbeat move.
// Every client may read every record (lockctl clients / inspect).
struct SessionRecord {
  static constexpr size_t kSessionId = 0;     // u64
  static constexpr size_t kPid = 8;           // u32
  static constexpr size_t kFlags = 12;        // u32 (the connect request's flags)
  static constexpr size_t kSinceUnixNs = 16;  // u64
  static constexpr size_t kName = 24, kNameLen = 24;
  static constexpr size_t kPeer = 48, kPeerLen = 48;
  static constexpr size_t kHeartbeatSeenUnixNs = 96;  // u64, lockd: when it last saw it move
  static constexpr size_t kHeartbeat = 112;           // u64, client: bumped every interval
  // u64, kProbePattern, set by lockd when the session starts: the word each connection of the
  // session probes its NIC's atomic byte order on (protocol 7; the client's window allows atomics).
  static constexpr size_t kProbe = 120;
  static constexpr size_t kEncodedSize = 120;
  // The client's window over its own record starts here: everything before it is lockd's view of
  // the session (what operators see), which a client cannot WRITE (with memory windows; with
  // memory_windows: false every client can write the whole session table).
  static constexpr size_t kClientWritable = kHeartbeat;
  static constexpr size_t kEntries = 128;   // request entries start here
  static constexpr size_t kEntrySize = 32;  // see RequestEntry
  static constexpr uint32_t kMaxEntries = (kSessionRecordSize - kEntries) / kEntrySize;

  uint64_t session_id = 0;
  uint32_t pid = 0;
  uint32_t flags = 0;
  uint64_t since_unix_ns = 0;
  std::string name;
  std::string peer;
  uint64_t heartbeat = 0;
  uint64_t heartbeat_seen_unix_ns = 0;

  static constexpr uint64_t EntryOffset(uint32_t i) { return kEntries + uint64_t{i} * kEntrySize; }

  // lockd's part (the header); the client's heartbeat and entries are not touched.
  void EncodeTo(std::span<uint8_t> rec) const {
    PutLe(rec, kSessionId, session_id, 8);
    PutLe(rec, kPid, pid, 4);
    PutLe(rec, kFlags, flags, 4);
    PutLe(rec, kSinceUnixNs, since_unix_ns, 8);
    PutText(rec, kName, kNameLen, name);
    PutText(rec, kPeer, kPeerLen, peer);
  }
  static SessionRecord DecodeFrom(std::span<const uint8_t> rec) {
    SessionRecord r;
    r.session_id = GetLe(rec, kSessionId, 8);
    r.pid = static_cast<uint32_t>(GetLe(rec, kPid, 4));
    r.flags = static_cast<uint32_t>(GetLe(rec, kFlags, 4));
    r.since_unix_ns = GetLe(rec, kSinceUnixNs, 8);
    r.name = GetText(rec, kName, kNameLen);
    r.peer = GetText(rec, kPeer, kPeerLen);
    r.heartbeat = GetLe(rec, kHeartbeat, 8);
    r.heartbeat_seen_unix_ns = GetLe(rec, kHeartbeatSeenUnixNs, 8);
    return r;
  }
};
static_assert(SessionRecord::kEncodedSize <= SessionRecord::kEntries);
static_assert(SessionRecord::kHeartbeatSeenUnixNs + 8 <= SessionRecord::kClientWritable);
static_assert(SessionRecord::kPeer + SessionRecord::kPeerLen <= SessionRecord::kClientWritable);
static_assert(SessionRecord::kMaxEntries >= 120);

// One request of a client, as its record shows it: 32 bytes at SessionRecord::EntryOffset(i).
//   word a (+0):  slot (bits 0-27) | mode (28) | state (29-30) | seq (31-47) | check (48-63)
//   word b (+8):  word0 as the request's FETCH_AND_ADD returned it (its ticket), when kQueued;
//                 in a tagged entry (state field 3: exclusive since protocol version 6, shared
//                 too since version 8) the ticket's max_s and max_x (bits 0-31) and the low 32
//                 bits of the generation of word1 the grant is in (bits 32-63), where the FA's
//                 n_s and n_x would be
//   word d (+16): the seq of the last use of this entry that is over ("done")
// lockd acts on a tagged entry only while the slot's generation is the entry's (or, where its scan
// found it so, past one renewal carry since: ReapState::SameCounters), so a stale entry is never
// read as a ticket of a later generation (docs/protocol.md, sections 10 and 11). Its
// exclusive release needs no done mark: within one generation a released exclusive ticket is
// never granted again (n_x only grows past it); a shared release still writes one. The generation
// written may be older than the grant's (a cached one, never a newer one): lockd then only
// ignores the entry; or one no slot reaches (LockEngine::TagTicket, kUnseenGeneration), which
// lockd ignores too.
// The client writes a and b together (one 16-byte RDMA WRITE) when it asks (kRequesting, in the
// FA's doorbell) and once the ticket is known (kQueued); it writes d alone, in the same doorbell
// and *before* the operation that ends the request (the release or withdrawal CAS). Each use of an
// entry has a newer seq than the last, and an entry is live only while its seq is newer than d
// (Newer), so a write that lands late (another thread's QP) can make an entry look done, never
// make a finished request look live. `check` is a hash of the rest of a and of b: a torn or
// garbage entry is recognised and ignored.
struct RequestEntry {
  enum class State : uint8_t { kFree = 0, kRequesting = 1, kQueued = 2 };
  static constexpr size_t kDone = 16;
  static constexpr uint32_t kSeqMask = (uint32_t{1} << 17) - 1;
  static constexpr uint32_t kSlotMask = (uint32_t{1} << 28) - 1;

  uint32_t slot = 0;
  Mode mode = Mode::kExclusive;
  State state = State::kFree;
  uint32_t seq = 0;     // 1..kSeqMask
  uint64_t ticket = 0;  // Word0 encoding (a tagged entry's: its max fields only, n_s = n_x = 0)
  // Tagged (kQueued): `generation` is the low 32 bits of word1's generation (at most the
  // grant's); an exclusive release then writes no done mark.
  bool tagged = false;
  uint32_t generation = 0;
  static constexpr uint8_t kTaggedStateBits = 3;  // the state field's value for a tagged entry

  // What a tagged entry's generation is compared with: the low 32 bits of word1's generation.
  static constexpr uint32_t GenerationOf(uint64_t word1) {
    return static_cast<uint32_t>(Generation(word1));
  }
  // A tagged entry's request is over, by the slot's words: the slot is in another generation, or
  // the word has moved past its ticket (released, or recovered by a waiter).
  bool TaggedOver(Word0 w0, uint64_t word1) const {
    return TaggedOver(Word0::Decode(ticket), mode, generation, w0, word1);
  }
  static bool TaggedOver(Word0 ticket, Mode mode, uint32_t generation, Word0 w0, uint64_t word1) {
    return GenerationOf(word1) != generation || Skipped(w0, ticket, mode) ||
           TicketGone(w0, ticket, mode);
  }
  // A live entry whose request is over all the same, by the slot's words: a tagged exclusive one,
  // whose release writes no done mark. A shared release writes its done mark, and a shared
  // entry's tag may be older than its grant's (a hint, or another reader's renewal carrying the
  // generation), which says nothing of whether it is over: shared and untagged entries are
  // judged by their numbers (what lockctl inspect shows, and who HoldersOf names).
  bool OverUnmarked(Word0 w0, uint64_t word1) const {
    return tagged && mode == Mode::kExclusive && TaggedOver(w0, word1);
  }

  // Each use of an entry has an even seq: 2, 4, ..., kSeqMask - 1, then 2 again (the SDK's pool
  // hands them out). A use whose entry was marked done while its request was in fact granted (a
  // request granted while it gave its ticket up) is written again as the odd seq above its own,
  // which no other use of the entry has (LockEngine::RearmAfterGiveUp; docs/protocol.md §3).
  static uint32_t NextSeq(uint32_t seq) {
    const uint32_t n = ((seq & kSeqMask) | 1) + 1;
    return n > kSeqMask ? 2 : n;
  }
  static uint32_t RearmSeq(uint32_t seq) { return (seq & kSeqMask) | 1; }
  // A use whose end writes the done mark even where it needs none (a tagged exclusive release):
  // one in every 8,192 uses of an entry, which visit every even seq. Newer() compares within
  // half the seq range, so the mark must never fall that far behind the entry's seq; a cleared
  // entry (LockEngine::FreeRecord) gets its use's mark too.
  static constexpr bool KeepsDoneClose(uint32_t seq) { return (seq & 0x3fff) == 0; }

  static uint16_t Check(uint64_t a_without_check, uint64_t b) {
    uint64_t z = a_without_check ^ (b * 0x9e3779b97f4a7c15ull) ^ 0x5243524c4b4c4f43ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<uint16_t>(z >> 48) | 1;  // never 0, so a zero entry is never "valid"
  }
  std::array<uint64_t, 2> Encode() const {
    if (state == State::kFree) return {0, 0};
    const bool tag = tagged && state == State::kQueued;
    const uint8_t st = tag ? kTaggedStateBits : static_cast<uint8_t>(state);
    const uint64_t a = uint64_t{slot & kSlotMask} | (uint64_t{static_cast<uint8_t>(mode)} << 28) |
                       (uint64_t{st} << 29) | (uint64_t{seq & kSeqMask} << 31);
    const uint64_t b = tag ? (ticket & 0xffffffffull) | (uint64_t{generation} << 32) : ticket;
    return {a | (uint64_t{Check(a, b)} << 48), b};
  }
  // False for a free entry or one that fails its check (torn, garbage).
  static bool Decode(uint64_t a, uint64_t b, RequestEntry* out) {
    if (a == 0 && b == 0) return false;
    const uint64_t rest = a & 0x0000ffffffffffffull;
    if (static_cast<uint16_t>(a >> 48) != Check(rest, b)) return false;
    const auto state = static_cast<uint8_t>((a >> 29) & 3);
    const auto seq = static_cast<uint32_t>((a >> 31) & kSeqMask);
    const auto mode = static_cast<Mode>((a >> 28) & 1);
    if (state < 1 || seq == 0) return false;
    const bool tag = state == kTaggedStateBits;
    out->slot = static_cast<uint32_t>(a & kSlotMask);
    out->mode = mode;
    out->state = tag ? State::kQueued : static_cast<State>(state);
    out->seq = seq;
    out->tagged = tag;
    out->generation = tag ? static_cast<uint32_t>(b >> 32) : 0;
    out->ticket = tag ? b & 0xffffffffull : b;
    return true;
  }
  // Whether seq `a` is of a later use of its entry than `b`: an entry's seqs only grow (by one or
  // two a use, from 0 in a record lockd zeroed for its session), modulo 2^17 (serial number
  // arithmetic: within half the range).
  static constexpr bool Newer(uint32_t a, uint32_t b) {
    const uint32_t d = (a - b) & kSeqMask;
    return d != 0 && d <= kSeqMask / 2;
  }
  // A request still open: well-formed, and its use newer than the last one marked done. Not
  // merely a seq other than the done mark's: one use of an entry can be written on two QPs (the
  // grant's WRITE on the acquiring thread's, its done mark on the releasing thread's), and an
  // earlier use's WRITE landing late, after a later use's done mark, must not look live (found
  // by review, 2026-12-05; unit test `records: a late entry WRITE of an earlier use never makes
  // it live again`).
  static bool DecodeLive(uint64_t a, uint64_t b, uint64_t done, RequestEntry* out) {
    return Decode(a, b, out) && Newer(out->seq, static_cast<uint32_t>(done & kSeqMask));
  }
};

// The one scan of a session record's requests (lockd's recovery and inspect, the SDK's
// introspection): calls live(const RequestEntry&, uint32_t index) for each open request on a slot
// below lock_count, and returns how many entries were neither free, over nor well-formed (torn or
// garbage: counted, never acted on). load(offset) reads the record's 8 bytes at offset; lockd
// passes a relaxed atomic load of its registered memory, the SDK a decode of a READ's buffer.
template <class Load, class Live>
uint32_t ScanRecordEntries(Load&& load, uint64_t lock_count, Live&& live) {
  uint32_t garbage = 0;
  for (uint32_t i = 0; i < SessionRecord::kMaxEntries; ++i) {
    const uint64_t off = SessionRecord::EntryOffset(i);
    const uint64_t a = load(off), b = load(off + 8);
    if (a == 0 && b == 0) continue;  // free
    RequestEntry e;
    if (!RequestEntry::Decode(a, b, &e) || e.slot >= lock_count) {
      ++garbage;
      continue;
    }
    const auto done =
        static_cast<uint32_t>(load(off + RequestEntry::kDone) & RequestEntry::kSeqMask);
    if (!RequestEntry::Newer(e.seq, done)) continue;  // over (DecodeLive)
    live(static_cast<const RequestEntry&>(e), i);
  }
  return garbage;
}

}  // namespace rdmalock::proto
