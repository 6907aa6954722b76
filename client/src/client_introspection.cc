// What lockd shows: its info page, lock words and session table (Client::Info, Inspect,
// InspectRange, Sessions), read on the calling thread's channel.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "client/src/client_impl.h"

namespace rdmalock {

using sdk::Session;
using sdk::ThreadChannel;

Result<ServerInfo> Client::Info() {
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel());
  std::vector<uint8_t> page(proto::InfoPage::kEncodedSize);
  MutexLock clk(&ch->mu);
  Status rs = ch->Reap();
  if (rs.ok()) rs = ch->mem->ReadBytes(RegionId::kInfo, 0, page);
  clk.Unlock();
  if (Status st = rs; !st.ok()) {
    impl_->OnSessionError(ch->session->gen, st);
    return st;
  }
  const proto::InfoPage p = proto::InfoPage::DecodeFrom(page);
  if (p.magic != proto::kInfoMagic) {
    return Error(ErrorCode::kProtocol, "lockd's info page has a bad magic number");
  }
  ServerInfo info;
  info.epoch = p.epoch;
  info.lock_count = p.lock_count;
  info.lease = std::chrono::nanoseconds(p.lease_ns);
  info.stall_factor = p.stall_factor;
  info.max_sessions = p.max_sessions;
  info.connected_clients = p.connected_clients;
  info.accepted_total = p.accepted_total;
  info.rejected_total = p.rejected_total;
  info.start_time_unix_ns = p.start_time_unix_ns;
  info.clock_unix_ns = p.clock_unix_ns;
  info.grace_until_unix_ns = p.grace_until_unix_ns;
  info.recoveries = p.recoveries;
  return info;
}

namespace {

SlotState DecodeSlot(uint64_t slot, uint64_t word0, uint64_t word1) {
  const proto::Word0 w = proto::Word0::Decode(word0);
  const proto::Occupancy o = proto::OccupancyOf(w);
  SlotState s;
  s.slot = slot;
  s.exclusive_issued = w.max_x;
  s.shared_issued = w.max_s;
  s.exclusive_released = w.n_x;
  s.shared_released = w.n_s;
  s.generation = proto::Generation(word1);
  s.renewals = static_cast<uint16_t>(word1);
  s.exclusive_outstanding = o.exclusive_outstanding;
  s.shared_outstanding = o.shared_outstanding;
  s.frozen = w.Frozen();
  // Outstanding exclusive and shared requests interleave in ticket order; from the counters alone
  // one can tell whether the head of the queue is exclusive only if no shared request is pending.
  s.exclusive_held = o.exclusive_held;
  s.shared_holders = o.exclusive_outstanding == 0 ? o.shared_outstanding : 0;
  return s;
}

}  // namespace

Result<SlotState> Client::Inspect(uint64_t slot) {
  RDMALOCK_ASSIGN_OR_RETURN(auto range, InspectRange(slot, 1));
  return range.front();
}

Result<std::vector<SlotState>> Client::InspectRange(uint64_t first, uint64_t count) {
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel());
  const uint64_t n = ch->session->reply.lock_count;
  if (count == 0 || first >= n || count > n - first) {
    return Error(ErrorCode::kInvalidArgument,
                 "slots [" + std::to_string(first) + ", " + std::to_string(first + count) +
                     ") are out of range (lock_count " + std::to_string(n) + ")");
  }
  std::vector<uint8_t> bytes(count * proto::kSlotSize);
  MutexLock clk(&ch->mu);
  Status rs = ch->Reap();
  if (rs.ok()) rs = ch->mem->ReadBytes(RegionId::kLocks, proto::SlotOffset(first), bytes);
  clk.Unlock();
  if (!rs.ok()) {
    impl_->OnSessionError(ch->session->gen, rs);
    return rs;
  }
  std::vector<SlotState> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t w[2];  // the words as the responder's atomics left them: host order, like READ ops
    std::memcpy(w, bytes.data() + i * proto::kSlotSize, sizeof(w));
    out.push_back(DecodeSlot(first + i, w[0], w[1]));
  }
  return out;
}

Result<std::vector<SessionInfo>> Client::Sessions() {
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel());
  const proto::AcceptReply& r = ch->session->reply;
  if (r.session_record_size != proto::kSessionRecordSize ||
      r.sessions.length % r.session_record_size != 0) {
    return Error(ErrorCode::kProtocol, "lockd's session table has an unexpected layout");
  }
  std::vector<uint8_t> table(r.sessions.length);
  std::vector<uint8_t> page(proto::InfoPage::kEncodedSize);
  MutexLock clk(&ch->mu);
  Status st = ch->Reap();
  if (st.ok()) st = ch->mem->ReadBytes(RegionId::kSessions, 0, table);
  if (st.ok()) st = ch->mem->ReadBytes(RegionId::kInfo, 0, page);
  if (!st.ok()) {
    clk.Unlock();
    impl_->OnSessionError(ch->session->gen, st);
    return st;
  }
  const uint64_t lockd_now = proto::InfoPage::DecodeFrom(page).clock_unix_ns;
  std::vector<SessionInfo> out;
  // slot -> word0 and word1, read once per slot
  std::unordered_map<uint64_t, std::pair<proto::Word0, uint64_t>> words;
  for (size_t off = 0; off + r.session_record_size <= table.size(); off += r.session_record_size) {
    const std::span<const uint8_t> rec(table.data() + off, r.session_record_size);
    const auto hdr = proto::SessionRecord::DecodeFrom(rec);
    if (hdr.session_id == 0) continue;  // free
    SessionInfo s;
    s.session_id = hdr.session_id;
    s.client_name = hdr.name;
    s.pid = hdr.pid;
    s.peer = hdr.peer;
    s.since_unix_ns = hdr.since_unix_ns;
    s.lockd_loopback = (hdr.flags & proto::kFlagLoopback) != 0;
    if (hdr.heartbeat_seen_unix_ns != 0 && lockd_now >= hdr.heartbeat_seen_unix_ns) {
      s.heartbeat_age = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::nanoseconds(lockd_now - hdr.heartbeat_seen_unix_ns));
    }
    std::vector<proto::RequestEntry> live;
    (void)proto::ScanRecordEntries(
        [&rec](uint64_t o) { return proto::GetLe(rec, o, 8); }, r.lock_count,
        [&](const proto::RequestEntry& e, uint32_t) { live.push_back(e); });
    for (const proto::RequestEntry& entry : live) {
      RequestInfo q;
      q.slot = entry.slot;
      q.mode = static_cast<LockMode>(entry.mode);
      const proto::Word0 t = proto::Word0::Decode(entry.ticket);
      q.ticket = entry.mode == Mode::kExclusive ? t.max_x : t.max_s;
      if (entry.state == proto::RequestEntry::State::kQueued) {
        auto it = words.find(entry.slot);
        if (it == words.end()) {
          RemoteOp rd = RemoteOp::Read(RegionId::kLocks, proto::SlotOffset(entry.slot), 16);
          if (Status rs = ch->mem->Execute(rd); !rs.ok()) {
            clk.Unlock();
            impl_->OnSessionError(ch->session->gen, rs);
            return rs;
          }
          it =
              words.emplace(entry.slot, std::pair{proto::Word0::Decode(rd.result[0]), rd.result[1]})
                  .first;
        }
        const proto::Word0 w = it->second.first;
        // A finished exclusive request whose release wrote no done mark: over.
        if (entry.OverUnmarked(w, it->second.second)) continue;
        if (proto::TicketGone(w, t, entry.mode) || proto::Skipped(w, t, entry.mode)) {
          q.status = RequestInfo::Status::kStale;
        } else if (proto::Granted(w, t, entry.mode)) {
          q.status = RequestInfo::Status::kHolding;
        } else {
          q.status = RequestInfo::Status::kWaiting;
        }
      }
      s.requests.push_back(q);
    }
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const SessionInfo& a, const SessionInfo& b) { return a.session_id < b.session_id; });
  return out;
}

}  // namespace rdmalock
