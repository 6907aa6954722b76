#include "server/session_table.h"

#include <cstring>
#include <span>

#include "common/auth/auth.h"
#include "rdmalock/proto/handshake.h"
#include "rdmalock/proto/layout.h"
#include "server/words.h"

namespace rdmalock::lockd {

SessionTable::SessionTable(uint8_t* records, uint32_t record_count, uint64_t lock_count)
    : records_(records), lock_count_(lock_count), next_session_id_(FirstSessionId()) {
  // Handed out from the lowest index up.
  for (uint32_t i = record_count; i > 0; --i) free_records_.push_back(i - 1);
}

uint64_t SessionTable::FirstSessionId() {
  constexpr uint64_t kStride = uint64_t{1} << 24;
  constexpr uint64_t kStarts = (uint64_t{1} << 29) - 1;  // 1 .. 2^29 - 1 strides
  static_assert((kStarts + 1) * kStride == uint64_t{1} << 53);
  return (auth::RandomU64() % kStarts + 1) * kStride;
}

uint8_t* SessionTable::RecordAt(uint32_t index) const {
  return records_ + uint64_t{index} * proto::kSessionRecordSize;
}

std::shared_ptr<Session> SessionTable::Find(uint64_t session_id) const {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : it->second;
}

bool SessionTable::JoinMatches(uint64_t session_id, uint64_t join_key) const {
  auto it = sessions_.find(session_id);
  return it != sessions_.end() && it->second->join_key == join_key;
}

std::shared_ptr<Session> SessionTable::Allocate(const std::string& peer, const std::string& name,
                                                uint32_t pid, bool loopback,
                                                std::chrono::system_clock::time_point since,
                                                Clock::time_point now) {
  auto s = std::make_shared<Session>();
  s->session_id = next_session_id_++;
  s->join_key = auth::RandomU64() | 1;
  s->index = free_records_.back();
  free_records_.pop_back();
  s->peer = peer;
  s->name = name;
  s->pid = pid;
  s->loopback = loopback;
  if (loopback) ++loopback_records_;
  s->since = since;
  s->heartbeat_moved = now;
  return s;
}

void SessionTable::Insert(std::shared_ptr<Session> s) {
  WriteRecord(*s);
  const uint64_t id = s->session_id;
  sessions_.emplace(id, std::move(s));
}

void SessionTable::WriteRecord(const Session& s) {
  std::span<uint8_t> rec(RecordAt(s.index), proto::kSessionRecordSize);
  std::memset(rec.data(), 0, rec.size());
  proto::SessionRecord r;
  r.session_id = s.session_id;
  r.pid = s.pid;
  r.flags = s.loopback ? proto::kFlagLoopback : 0;
  r.since_unix_ns = UnixNs(s.since);
  r.name = s.name;
  r.peer = s.peer;
  r.EncodeTo(rec);
  proto::PutLe(rec, proto::SessionRecord::kProbe, proto::kProbePattern, 8);
}

std::optional<EndedRecord> SessionTable::End(const Session& s) {
  if (sessions_.erase(s.session_id) == 0) return std::nullopt;  // already ended
  EndedRecord out;
  const uint8_t* rec = RecordAt(s.index);
  out.garbage =
      proto::ScanRecordEntries([rec](uint64_t off) { return Load64(rec, off); }, lock_count_,
                               [&](const proto::RequestEntry& e, uint32_t) {
                                 if (e.state == proto::RequestEntry::State::kRequesting) {
                                   ++out.requesting;
                                   return;
                                 }
                                 out.items.push_back(ReapState::ForEntry(e));
                               });
  std::memset(RecordAt(s.index), 0, proto::kSessionRecordSize);
  free_records_.push_back(s.index);
  if (s.loopback) --loopback_records_;
  return out;
}

std::vector<SessionTable::Dead> SessionTable::CheckLiveness(
    Clock::time_point now, std::chrono::system_clock::time_point wall,
    std::chrono::milliseconds heartbeat_timeout, bool check_qps,
    const std::function<bool(rdma_cm_id*)>& qp_in_error) {
  std::vector<Dead> dead;
  for (auto& [sid, s] : sessions_) {
    // lockd's loopback writes no heartbeat: only its QP is checked (one in error, with no
    // DISCONNECTED, kept its session and record for the rest of the run, and the recovery
    // thread's reconnection took the record kept for the loopback from clients).
    if (!s->loopback) {
      uint8_t* rec = RecordAt(s->index);
      const uint64_t hb = Load64(rec, proto::SessionRecord::kHeartbeat);
      if (hb != s->last_heartbeat) {
        s->last_heartbeat = hb;
        s->heartbeat_moved = now;
        Store64(rec, proto::SessionRecord::kHeartbeatSeenUnixNs, UnixNs(wall));
      } else if (s->counted && now - s->heartbeat_moved > heartbeat_timeout) {
        const auto silent =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - s->heartbeat_moved);
        dead.push_back({s, EndReason::kHeartbeatTimeout,
                        "no heartbeat for " + std::to_string(silent.count()) +
                            " ms (heartbeat_timeout_ms " +
                            std::to_string(heartbeat_timeout.count()) + ")"});
        continue;
      }
    }
    // A QP in the error state: a bad operation of the client or a transport failure (rdma_rxe
    // reports no async event for these). Checked every quarter heartbeat timeout, not every
    // tick: a query is a system call per connection.
    if (!check_qps) continue;
    std::set<rdma_cm_id*> in_error;
    bool twice = false;
    for (rdma_cm_id* id : s->conns) {
      if (!qp_in_error(id)) continue;
      in_error.insert(id);
      twice = twice || s->qp_errors_seen.count(id) != 0;
    }
    s->qp_errors_seen = std::move(in_error);
    if (twice) {
      dead.push_back({s, EndReason::kQpError,
                      "its QP is in the error state (a bad operation or a transport failure)"});
    }
  }
  return dead;
}

std::vector<std::shared_ptr<Session>> SessionTable::HoldersOf(uint64_t slot, proto::Word0 w0,
                                                              uint64_t word1) const {
  std::vector<std::shared_ptr<Session>> holders;
  for (auto& [sid, s] : sessions_) {
    const uint8_t* rec = RecordAt(s->index);
    bool holds = false;
    (void)proto::ScanRecordEntries(
        [rec](uint64_t off) { return Load64(rec, off); }, lock_count_,
        [&](const proto::RequestEntry& e, uint32_t) {
          // A tagged exclusive entry stays live past its release (no done mark).
          const bool over = e.OverUnmarked(w0, word1);
          holds = holds || (e.slot == slot && e.state == proto::RequestEntry::State::kQueued &&
                            !over && proto::Granted(w0, proto::Word0::Decode(e.ticket), e.mode));
        });
    if (holds) holders.push_back(s);
  }
  return holders;
}

}  // namespace rdmalock::lockd
