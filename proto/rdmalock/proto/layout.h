// The three memory regions lockd exposes and the info page at the start of the first one.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "rdmalock/proto/lock_word.h"
#include "rdmalock/proto/wire.h"

namespace rdmalock::proto {

inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr uint64_t kInfoMagic = 0x4b434f4c414d4452ull;  // "RDMALOCK" read little-endian
inline constexpr uint64_t kInfoPageSize = 4096;

// The lock table holds `lock_count` slots followed by one probe slot. lockd stores kProbePattern
// in the probe slot's word0 before registering the table. A client's FETCH_AND_ADD of 0 on it tells
// whether the client's NIC returns atomic results in host byte order (pitfall: some do not).
inline constexpr uint64_t kProbePattern = 0x0102030405060708ull;
constexpr uint64_t LockTableBytes(uint64_t lock_count) { return (lock_count + 1) * kSlotSize; }
constexpr uint64_t SlotOffset(uint64_t slot) { return slot * kSlotSize; }
constexpr uint64_t ProbeOffset(uint64_t lock_count) { return lock_count * kSlotSize; }

// Limits lockd enforces on its configuration.
inline constexpr uint64_t kMinLockCount = 1;
inline constexpr uint64_t kMaxLockCount = uint64_t{1} << 28;  // 4 GiB of slots
inline constexpr uint32_t kSessionRecordSize = 256;

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
  static constexpr size_t kEncodedSize = 88;

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
    return p;
  }
};
static_assert(InfoPage::kEncodedSize <= kInfoPageSize);

// A session record: lockd fills in who the client is when it accepts the connection and clears
// it when the session ends. session_id 0 marks a free record. Clients may read every record.
struct SessionRecord {
  static constexpr size_t kSessionId = 0;     // u64
  static constexpr size_t kPid = 8;           // u32
  static constexpr size_t kFlags = 12;        // u32 (the connect request's flags)
  static constexpr size_t kSinceUnixNs = 16;  // u64
  static constexpr size_t kName = 24, kNameLen = 24;
  static constexpr size_t kPeer = 48, kPeerLen = 48;
  static constexpr size_t kEncodedSize = 96;

  uint64_t session_id = 0;
  uint32_t pid = 0;
  uint32_t flags = 0;
  uint64_t since_unix_ns = 0;
  std::string name;
  std::string peer;

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
    return r;
  }
};
static_assert(SessionRecord::kPeer + SessionRecord::kPeerLen == SessionRecord::kEncodedSize);
static_assert(SessionRecord::kEncodedSize <= kSessionRecordSize);

}  // namespace rdmalock::proto
