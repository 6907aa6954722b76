// rdma_cm private data of the handshake: the client's connect request, lockd's accept reply and
// its reject reply. Fixed-size and little-endian. The receiver always sees the transport's maximum
// length with the unused bytes zeroed, so each message carries its own length.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "rdmalock/proto/wire.h"

namespace rdmalock::proto {

inline constexpr uint32_t kHandshakeMagic = 0x314b4c52;  // "RLK1" read little-endian
// Version 2: sessions (join), heartbeats and request records; not compatible with version 1.
// Version 3: lockd's accept carries a challenge, never an rkey; the rkeys (memory windows bound to
// the connection's QP) travel in a Welcome SEND after the client's Hello proved the shared key.
// Version 4: the session record's heartbeat moved to 112, and the client's record window starts
// there: the header before it (lockd's view of the session) is not client-writable.
// Version 5: fencing tokens are epoch:16|generation:29|ticket:15|local:4 (lock_word.h), so that
// threads of one client handed a grant in-process get larger tokens. Tokens are made by clients
// and compared by resources, so a version-4 client's tokens would not order with version 5's:
// lockd refuses version 4 (the handshake is version 4's).
// Version 6: a recorded exclusive request's entry may be tagged with its slot's generation
// (RequestEntry, state field 3), and its release then writes no done mark. lockd of version 6
// serves version-5 clients too (they write no tagged entry; nothing else changed) and answers
// each client in the version of its connect request. A version-6 client needs a version-6
// lockd, which a version-5 lockd's refusal (bad_version, versions 5..5) says.
// Version 7: a connection probes its NIC's atomic byte order on a word of its own session record
// (SessionRecord::kProbe), not on the probe slot after the lock table, which any client could
// change and so fail every later connection's probe (lockd's own too). lockd of version 7 serves
// versions 5 and 6 too (they probe the old slot, which it still fills).
// Version 8: shared requests' entries are tagged with their slot's generation too, and every
// request the SDK leaves waiting is tagged (a hint that no longer covers the FA's count tags it
// with the hint's generation, never newer than the grant's). An untagged entry says nothing of
// its generation, and a stale one of a client that stopped while it waited could be read as a
// later request's ticket (docs/protocol.md, section 11). lockd of version 8 serves versions 5 to
// 7 too (their untagged entries keep the checks they had); a version-8 client needs a version-8
// lockd, which an older lockd's refusal (bad_version) says.
inline constexpr uint16_t kProtocolVersion = 8;
inline constexpr uint16_t kMinProtocolVersion = 5;

// rdma_cm limits (verified on rdma_rxe; the IB CM sets them): connect 56, accept 196, reject 148.
inline constexpr size_t kMaxConnectPrivateData = 56;
inline constexpr size_t kMaxAcceptPrivateData = 196;
inline constexpr size_t kMaxRejectPrivateData = 148;

// ConnectRequest::flags
inline constexpr uint32_t kFlagLoopback = 1;  // lockd's own connection to itself (not a client)
// Another connection (QP) of an existing session: the request carries the session id and the
// join key from the session's accept reply. It shares the session's record and fate.
inline constexpr uint32_t kFlagJoin = 2;

// Every handshake message starts with the magic (u32 at 0), its version (u16 at 4) and its own
// length (u16 at 6).
inline void PutHeader(std::span<uint8_t> b, uint16_t version, size_t size) {
  PutLe(b, 0, kHandshakeMagic, 4);
  PutLe(b, 4, version, 2);
  PutLe(b, 6, size, 2);
}

enum class RejectReason : uint16_t {
  kNone = 0,
  kBadMagic = 1,      // not an rdmalock client
  kBadVersion = 2,    // protocol version this lockd does not speak
  kBadLength = 3,     // truncated or oversized request
  kServerFull = 4,    // max_clients reached
  kShuttingDown = 5,  // lockd is stopping
  kInternal = 6,      // lockd failed to set up the connection
  kGrace = 7,         // lockd restarted after an unclean stop; retry after retry_after_ms
  kBadSession = 8,    // join of a session that does not exist (any more) or a wrong join key
  kRateLimited = 9,   // too many connection attempts from this address; retry after retry_after_ms
  kAuthFailed = 10,   // the Hello did not prove the shared key (or brought none)
  kNotAllowed = 11,   // the peer address is outside lockd's allow_from
  kBusy = 12,         // too many handshakes in progress; retry after retry_after_ms
  kTooManyConnections = 13,  // the session has max_connections_per_session connections
  kBadHello = 14,            // the Hello message is malformed
  // lockd could not get a device resource for this connection (a QP, a memory window, a
  // registration): the device's limits, not the session's fault. A join refused so costs only
  // the joining thread (kResource); the session and its other connections go on.
  kNoResources = 15,
};
inline constexpr size_t kRejectReasonCount = 16;

inline std::string_view RejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kBadMagic:
      return "bad magic (not an rdmalock client)";
    case RejectReason::kBadVersion:
      return "unsupported protocol version";
    case RejectReason::kBadLength:
      return "malformed request (its length, flags or unused bytes)";
    case RejectReason::kServerFull:
      return "server full (max_clients reached)";
    case RejectReason::kShuttingDown:
      return "server shutting down";
    case RejectReason::kInternal:
      return "server internal error";
    case RejectReason::kGrace:
      return "restart grace period (old leases may still run)";
    case RejectReason::kBadSession:
      return "no such session to join (it ended)";
    case RejectReason::kRateLimited:
      return "too many connection attempts from this address (max_connects_per_second)";
    case RejectReason::kAuthFailed:
      return "authentication failed";
    case RejectReason::kNotAllowed:
      return "address not allowed (allow_from)";
    case RejectReason::kBusy:
      return "too many handshakes in progress";
    case RejectReason::kTooManyConnections:
      return "session has too many connections (max_connections_per_session)";
    case RejectReason::kBadHello:
      return "malformed hello";
    case RejectReason::kNoResources:
      return "lockd is out of RDMA device resources (QPs, memory windows or registrations)";
  }
  return "unknown reason";
}

// A short label for metrics and JSON (snake_case).
inline std::string_view RejectReasonLabel(RejectReason r) {
  switch (r) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kBadMagic:
      return "bad_magic";
    case RejectReason::kBadVersion:
      return "bad_version";
    case RejectReason::kBadLength:
      return "bad_length";
    case RejectReason::kServerFull:
      return "server_full";
    case RejectReason::kShuttingDown:
      return "shutting_down";
    case RejectReason::kInternal:
      return "internal";
    case RejectReason::kGrace:
      return "grace";
    case RejectReason::kBadSession:
      return "bad_session";
    case RejectReason::kRateLimited:
      return "rate_limited";
    case RejectReason::kAuthFailed:
      return "auth_failed";
    case RejectReason::kNotAllowed:
      return "not_allowed";
    case RejectReason::kBusy:
      return "busy";
    case RejectReason::kTooManyConnections:
      return "too_many_connections";
    case RejectReason::kBadHello:
      return "bad_hello";
    case RejectReason::kNoResources:
      return "no_resources";
  }
  return "unknown";
}

struct ConnectRequest {
  static constexpr size_t kMagic = 0, kVersion = 4, kLength = 6, kFlags = 8, kPid = 12,
                          kClientName = 16, kClientNameLen = 24, kJoinSession = 40, kJoinKey = 48;
  static constexpr size_t kSize = 56;

  uint16_t version = kProtocolVersion;
  uint32_t flags = 0;
  uint32_t pid = 0;
  std::string client_name;    // at most kClientNameLen bytes travel
  uint64_t join_session = 0;  // with kFlagJoin (with kFlagLoopback: lockd's secret); else zero
  uint64_t join_key = 0;      // with kFlagJoin (with kFlagLoopback: lockd's secret); else zero

  std::array<uint8_t, kSize> Encode() const {
    std::array<uint8_t, kSize> b{};
    PutHeader(b, version, kSize);
    PutLe(b, kFlags, flags, 4);
    PutLe(b, kPid, pid, 4);
    PutText(b, kClientName, kClientNameLen, client_name);
    PutLe(b, kJoinSession, join_session, 8);
    PutLe(b, kJoinKey, join_key, 8);
    return b;
  }

  // Validates and decodes what lockd received. Returns kNone on success; else the reason, and in
  // *why (if given) what is wrong, for lockd's log.
  static RejectReason Decode(std::span<const uint8_t> data, ConnectRequest* out,
                             std::string* why = nullptr) {
    auto bad = [why](RejectReason r, std::string what) {
      if (why != nullptr) *why = std::move(what);
      return r;
    };
    if (data.size() < kLength + 2) {
      return bad(RejectReason::kBadLength,
                 std::to_string(data.size()) + " bytes, too short for a request");
    }
    if (GetLe(data, kMagic, 4) != kHandshakeMagic) {
      return bad(RejectReason::kBadMagic, "not an rdmalock request");
    }
    const auto version = static_cast<uint16_t>(GetLe(data, kVersion, 2));
    if (version < kMinProtocolVersion || version > kProtocolVersion) {
      return bad(RejectReason::kBadVersion, "protocol version " + std::to_string(version) +
                                                " (this lockd speaks " +
                                                std::to_string(kMinProtocolVersion) + " to " +
                                                std::to_string(kProtocolVersion) + ")");
    }
    if (const uint64_t length = GetLe(data, kLength, 2); length != kSize || data.size() < kSize) {
      return bad(RejectReason::kBadLength,
                 "length field " + std::to_string(length) + " in " + std::to_string(data.size()) +
                     " bytes (a request is " + std::to_string(kSize) + ")");
    }
    const uint32_t flags = static_cast<uint32_t>(GetLe(data, kFlags, 4));
    if (const uint32_t unknown = flags & ~(kFlagLoopback | kFlagJoin); unknown != 0) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%x", unknown);
      return bad(RejectReason::kBadLength,
                 std::string("unknown flags ") + hex + " (a client newer than this lockd?)");
    }
    // A join carries its session's id and key there, lockd's loopback the secret that proves it
    // is lockd's own (never both); anyone else sends zeros.
    if ((flags & kFlagJoin) != 0 && (flags & kFlagLoopback) != 0) {
      return bad(RejectReason::kBadLength, "flags both join and loopback");
    }
    if ((flags & (kFlagJoin | kFlagLoopback)) == 0) {
      for (size_t i = kJoinSession; i < kSize; ++i) {
        if (data[i] != 0) {  // unused bytes must be zero
          return bad(RejectReason::kBadLength, "join fields without the join flag");
        }
      }
    }
    for (size_t i = kSize; i < data.size(); ++i) {
      if (data[i] != 0) {  // nothing may follow the request
        return bad(RejectReason::kBadLength, "bytes after the request");
      }
    }
    out->version = version;
    out->flags = flags;
    out->join_session = GetLe(data, kJoinSession, 8);
    out->join_key = GetLe(data, kJoinKey, 8);
    out->pid = static_cast<uint32_t>(GetLe(data, kPid, 4));
    out->client_name = GetText(data, kClientName, kClientNameLen);
    return RejectReason::kNone;
  }
};
static_assert(ConnectRequest::kSize <= kMaxConnectPrivateData);

// lockd's accept private data (version 3): a fresh nonce for this connection, and whether lockd
// requires proof of the shared key. It carries no rkey: those come in the Welcome.
inline constexpr uint32_t kChallengeAuthRequired = 1;
struct Challenge {
  static constexpr size_t kMagic = 0, kVersion = 4, kLength = 6, kFlags = 8, kNonce = 16;
  static constexpr size_t kNonceSize = 32;
  static constexpr size_t kSize = kNonce + kNonceSize;

  uint16_t version = kProtocolVersion;
  uint32_t flags = 0;
  std::array<uint8_t, kNonceSize> nonce{};

  std::array<uint8_t, kSize> Encode() const {
    std::array<uint8_t, kSize> b{};
    PutHeader(b, version, kSize);
    PutLe(b, kFlags, flags, 4);
    std::memcpy(b.data() + kNonce, nonce.data(), nonce.size());
    return b;
  }
  static bool Decode(std::span<const uint8_t> data, Challenge* out) {
    if (data.size() < kSize || GetLe(data, kMagic, 4) != kHandshakeMagic) return false;
    if (GetLe(data, kLength, 2) != kSize) return false;
    out->version = static_cast<uint16_t>(GetLe(data, kVersion, 2));
    if (out->version < kMinProtocolVersion || out->version > kProtocolVersion) return false;
    out->flags = static_cast<uint32_t>(GetLe(data, kFlags, 4));
    std::memcpy(out->nonce.data(), data.data() + kNonce, out->nonce.size());
    return true;
  }
};
static_assert(Challenge::kSize <= kMaxAcceptPrivateData);

// Messages after the rdma_cm handshake travel as SEND with immediate data naming their kind, into
// a receive buffer of kControlMessageMax bytes.
inline constexpr size_t kControlMessageMax = 256;
enum class ControlKind : uint32_t {
  kHello = 0x52484c4f,
  kWelcome = 0x5257454c,
  kRefusal = 0x52524546
};

// The client's first SEND: its nonce and, where lockd requires it, the HMAC-SHA256 over lockd's
// nonce, its own nonce and the 56 bytes of its connect request (see common auth.h).
inline constexpr uint32_t kHelloHasProof = 1;
struct Hello {
  static constexpr size_t kMagic = 0, kVersion = 4, kLength = 6, kFlags = 8, kNonce = 16, kMac = 48;
  static constexpr size_t kSize = 80;

  uint16_t version = kProtocolVersion;
  uint32_t flags = 0;
  std::array<uint8_t, 32> nonce{};
  std::array<uint8_t, 32> mac{};

  std::array<uint8_t, kSize> Encode() const {
    std::array<uint8_t, kSize> b{};
    PutHeader(b, version, kSize);
    PutLe(b, kFlags, flags, 4);
    std::memcpy(b.data() + kNonce, nonce.data(), nonce.size());
    std::memcpy(b.data() + kMac, mac.data(), mac.size());
    return b;
  }
  // Exactly kSize bytes, lockd's version, known flags, zero padding; kNone on success.
  static RejectReason Decode(std::span<const uint8_t> data, Hello* out) {
    if (data.size() != kSize) return RejectReason::kBadHello;
    if (GetLe(data, kMagic, 4) != kHandshakeMagic) return RejectReason::kBadHello;
    if (GetLe(data, kLength, 2) != kSize) return RejectReason::kBadHello;
    const auto version = static_cast<uint16_t>(GetLe(data, kVersion, 2));
    if (version < kMinProtocolVersion || version > kProtocolVersion)
      return RejectReason::kBadVersion;
    const auto flags = static_cast<uint32_t>(GetLe(data, kFlags, 4));
    if ((flags & ~kHelloHasProof) != 0 || GetLe(data, 12, 4) != 0) return RejectReason::kBadHello;
    out->version = version;
    out->flags = flags;
    std::memcpy(out->nonce.data(), data.data() + kNonce, out->nonce.size());
    std::memcpy(out->mac.data(), data.data() + kMac, out->mac.size());
    return RejectReason::kNone;
  }
};

struct RegionDesc {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
};

struct AcceptReply {
  static constexpr size_t kMagic = 0, kVersion = 4, kLength = 6, kEpoch = 8, kSessionId = 16,
                          kLeaseNs = 24, kLockCount = 32, kStallFactor = 40,
                          kSessionRecordSize = 44, kInfo = 48, kLocks = 72, kSessions = 96,
                          kSessionRecordOffset = 120, kMaxSessions = 128,
                          kHeartbeatIntervalNs = 136, kHeartbeatTimeoutNs = 144, kJoinKey = 152,
                          kRecordEntries = 160, kReserved = 164, kRecord = 168, kMac = 192;
  static constexpr size_t kRegionDescSize = 24;
  static constexpr size_t kSize = 224;

  uint16_t version = kProtocolVersion;
  uint64_t epoch = 0;
  uint64_t session_id = 0;
  uint64_t lease_ns = 0;
  uint64_t lock_count = 0;
  uint32_t stall_factor = 0;
  uint32_t session_record_size = 0;
  // info: READ. locks: READ and atomics. sessions: READ of the whole table. record: READ and WRITE
  // of this client's own record (an address inside `sessions`). With memory windows every rkey
  // is valid only on the QP the reply came over.
  RegionDesc info, locks, sessions, record;
  uint64_t session_record_offset = 0;  // this client's record inside the session table
  uint64_t max_sessions = 0;
  uint64_t heartbeat_interval_ns = 0;  // how often the client writes its heartbeat
  uint64_t heartbeat_timeout_ns = 0;   // lockd fences a session whose heartbeat stops this long
  uint64_t join_key = 0;               // what further connections of this session present
  uint32_t record_entries = 0;         // request entries in the session record
  // HMAC-SHA256 by which lockd proves it knows the shared key (zero without authentication); it
  // covers bytes [0, kMac) of this message. Encode writes it as given.
  std::array<uint8_t, 32> mac{};

  std::array<uint8_t, kSize> Encode() const {
    std::array<uint8_t, kSize> b{};
    PutHeader(b, version, kSize);
    PutLe(b, kEpoch, epoch, 8);
    PutLe(b, kSessionId, session_id, 8);
    PutLe(b, kLeaseNs, lease_ns, 8);
    PutLe(b, kLockCount, lock_count, 8);
    PutLe(b, kStallFactor, stall_factor, 4);
    PutLe(b, kSessionRecordSize, session_record_size, 4);
    PutRegion(b, kInfo, info);
    PutRegion(b, kLocks, locks);
    PutRegion(b, kSessions, sessions);
    PutLe(b, kSessionRecordOffset, session_record_offset, 8);
    PutLe(b, kMaxSessions, max_sessions, 8);
    PutLe(b, kHeartbeatIntervalNs, heartbeat_interval_ns, 8);
    PutLe(b, kHeartbeatTimeoutNs, heartbeat_timeout_ns, 8);
    PutLe(b, kJoinKey, join_key, 8);
    PutLe(b, kRecordEntries, record_entries, 4);
    PutRegion(b, kRecord, record);
    std::memcpy(b.data() + kMac, mac.data(), mac.size());
    return b;
  }

  // Decodes what the client received; false if it is not a well-formed reply of a version this
  // client speaks.
  static bool Decode(std::span<const uint8_t> data, AcceptReply* out) {
    if (data.size() < kSize) return false;
    if (GetLe(data, kMagic, 4) != kHandshakeMagic) return false;
    out->version = static_cast<uint16_t>(GetLe(data, kVersion, 2));
    if (out->version < kMinProtocolVersion || out->version > kProtocolVersion) return false;
    if (GetLe(data, kLength, 2) != kSize) return false;
    out->epoch = GetLe(data, kEpoch, 8);
    out->session_id = GetLe(data, kSessionId, 8);
    out->lease_ns = GetLe(data, kLeaseNs, 8);
    out->lock_count = GetLe(data, kLockCount, 8);
    out->stall_factor = static_cast<uint32_t>(GetLe(data, kStallFactor, 4));
    out->session_record_size = static_cast<uint32_t>(GetLe(data, kSessionRecordSize, 4));
    out->info = GetRegion(data, kInfo);
    out->locks = GetRegion(data, kLocks);
    out->sessions = GetRegion(data, kSessions);
    out->session_record_offset = GetLe(data, kSessionRecordOffset, 8);
    out->max_sessions = GetLe(data, kMaxSessions, 8);
    out->heartbeat_interval_ns = GetLe(data, kHeartbeatIntervalNs, 8);
    out->heartbeat_timeout_ns = GetLe(data, kHeartbeatTimeoutNs, 8);
    out->join_key = GetLe(data, kJoinKey, 8);
    out->record_entries = static_cast<uint32_t>(GetLe(data, kRecordEntries, 4));
    out->record = GetRegion(data, kRecord);
    std::memcpy(out->mac.data(), data.data() + kMac, out->mac.size());
    return true;
  }

 private:
  static void PutRegion(std::span<uint8_t> b, size_t off, const RegionDesc& r) {
    PutLe(b, off, r.addr, 8);
    PutLe(b, off + 8, r.length, 8);
    PutLe(b, off + 16, r.rkey, 4);
    PutLe(b, off + 20, 0, 4);
  }
  static RegionDesc GetRegion(std::span<const uint8_t> b, size_t off) {
    return RegionDesc{GetLe(b, off, 8), GetLe(b, off + 8, 8),
                      static_cast<uint32_t>(GetLe(b, off + 16, 4))};
  }
};
static_assert(AcceptReply::kMac + 32 == AcceptReply::kSize);

struct RejectReply {
  static constexpr size_t kMagic = 0, kVersion = 4, kLength = 6, kReason = 8, kMinVersion = 10,
                          kMaxVersion = 12, kDetail = 16, kDetailLen = 96, kRetryAfterMs = 112;
  static constexpr size_t kSize = 116;

  RejectReason reason = RejectReason::kNone;
  uint16_t min_version = kMinProtocolVersion;
  uint16_t max_version = kProtocolVersion;
  std::string detail;
  uint32_t retry_after_ms = 0;  // kGrace: when lockd will accept

  std::array<uint8_t, kSize> Encode() const {
    std::array<uint8_t, kSize> b{};
    PutHeader(b, kProtocolVersion, kSize);
    PutLe(b, kReason, static_cast<uint16_t>(reason), 2);
    PutLe(b, kMinVersion, min_version, 2);
    PutLe(b, kMaxVersion, max_version, 2);
    PutText(b, kDetail, kDetailLen, detail);
    PutLe(b, kRetryAfterMs, retry_after_ms, 4);
    return b;
  }
  static bool Decode(std::span<const uint8_t> data, RejectReply* out) {
    if (data.size() < kSize || GetLe(data, kMagic, 4) != kHandshakeMagic) return false;
    if (GetLe(data, kLength, 2) != kSize) return false;
    out->reason = static_cast<RejectReason>(GetLe(data, kReason, 2));
    out->min_version = static_cast<uint16_t>(GetLe(data, kMinVersion, 2));
    out->max_version = static_cast<uint16_t>(GetLe(data, kMaxVersion, 2));
    out->detail = GetText(data, kDetail, kDetailLen);
    out->retry_after_ms = static_cast<uint32_t>(GetLe(data, kRetryAfterMs, 4));
    return true;
  }
};
static_assert(RejectReply::kRetryAfterMs + 4 == RejectReply::kSize);
static_assert(RejectReply::kSize <= kMaxRejectPrivateData);
static_assert(AcceptReply::kSize <= kControlMessageMax &&
              RejectReply::kSize <= kControlMessageMax && Hello::kSize <= kControlMessageMax);

}  // namespace rdmalock::proto
