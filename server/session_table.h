// The session table: lockd's client sessions and the registered records they show themselves in
// (one record per session, lockd's header and the client's heartbeat and requests). Plain data:
// the verbs objects of a session's connections stay with the connections (server/lockd_impl.h);
// a session knows its connections only by their rdma_cm ids, as opaque keys. Times are taken as
// arguments, so the liveness rules and the ending of a session are unit-tested without verbs
// (tests/unit/session_table_test.cc).
//
// Threading: owned by lockd's event loop and used only from it; no mutex. The records are
// registered memory that clients WRITE through the NIC: read with relaxed 8-byte loads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/lock_engine.h"
#include "rdmalock/proto/lock_word.h"
#include "server/metrics.h"

struct rdma_cm_id;

namespace rdmalock::lockd {

// A client session: one record in the session table, one or more connections (QPs).
struct Session {
  uint64_t session_id = 0;
  uint64_t join_key = 0;
  uint32_t index = 0;  // record in the session table
  std::string peer;
  std::string name;
  uint32_t pid = 0;
  bool loopback = false;
  bool counted = false;  // counted in `connected` (its first connection was admitted)
  std::chrono::system_clock::time_point since;
  std::set<rdma_cm_id*> conns;    // keys of the connections (owned by the event loop's conn map)
  size_t joins_in_handshake = 0;  // of those, joins whose handshake is in progress
  uint64_t last_heartbeat = 0;
  std::chrono::steady_clock::time_point heartbeat_moved;
  // A connection of it whose fence failed (its QP not moved to ERR): its locks are then freed
  // one lease later even when it disconnected or died (Server::Impl::EndSession).
  bool fence_failed = false;
  // Its connections whose QP was in ERR at the last QP check (keys, as `conns`).
  std::set<rdma_cm_id*> qp_errors_seen;

  // A connection of it went: its key may be a new connection's next (the id is freed).
  void ForgetConn(rdma_cm_id* id) {
    conns.erase(id);
    qp_errors_seen.erase(id);
  }
};

// What an ended session's record showed: the requests lockd must free for it.
struct EndedRecord {
  std::vector<ReapState> items;  // queued (or holding) requests with a known ticket
  uint32_t requesting = 0;       // requests without a known ticket (left to stall recovery)
  uint32_t garbage = 0;          // torn or unreadable entries (ignored)
};

class SessionTable {
 public:
  using Clock = std::chrono::steady_clock;

  // `records`: `record_count` records of proto::kSessionRecordSize bytes, zeroed, alive as long
  // as the table. `lock_count` bounds the slots a record's entries may name. Session ids start
  // at FirstSessionId() and are never reused in the table's life.
  SessionTable(uint8_t* records, uint32_t record_count, uint64_t lock_count);

  // Where a run's session ids start: a random multiple of 2^24, at least 2^24 and below 2^53.
  // Ids are unique across runs of lockd, as ZooKeeper's are: an id an operator read before a
  // restart (`lockctl clients`) names no session after it, so `lockctl release --force --session`
  // cannot fence another client (two runs share a start with probability 2^-29). Below 2^53 every
  // id survives a JSON reader that keeps numbers as doubles (jq).
  static uint64_t FirstSessionId();

  bool has_free_record() const { return !free_records_.empty(); }
  // A free record for a client's new session: one is kept for lockd's loopback while it holds
  // none (at start, or while it reconnects), so that clients cannot take them all.
  bool has_free_client_record() const {
    return free_records_.size() > (loopback_records_ > 0 ? 0U : 1U);
  }
  size_t size() const { return sessions_.size(); }
  const std::unordered_map<uint64_t, std::shared_ptr<Session>>& sessions() const {
    return sessions_;
  }
  std::shared_ptr<Session> Find(uint64_t session_id) const;
  // Whether a join of `session_id` with `join_key` names a live session and its key.
  bool JoinMatches(uint64_t session_id, uint64_t join_key) const;

  // A new session in a free record (has_free_record() must hold), not yet in the table: Insert it
  // once its accept went out, or Release it if the accept failed. The join key comes from a
  // CSPRNG: a client must not guess another's.
  std::shared_ptr<Session> Allocate(const std::string& peer, const std::string& name, uint32_t pid,
                                    bool loopback, std::chrono::system_clock::time_point since,
                                    Clock::time_point now);
  void Release(const Session& s) {
    free_records_.push_back(s.index);
    if (s.loopback) --loopback_records_;
  }
  // Writes lockd's header of its record and adds it to the table.
  void Insert(std::shared_ptr<Session> s);

  // Removes `s` from the table, reads what its record shows to free and zeroes the record for
  // its next session. nullopt if it had ended already.
  std::optional<EndedRecord> End(const Session& s);

  // The liveness tick. A session whose heartbeat moved is stamped (its record's "seen" time);
  // an admitted session whose heartbeat has not moved for `heartbeat_timeout` is dead. With
  // `check_qps`, a session one of whose connections' QP `qp_in_error` reports in the error state
  // at two checks in a row is dead too (rdma_cm also moves a QP to ERR when a disconnect request
  // arrives, before the DISCONNECTED event: one sighting is not enough, and two sightings of two
  // connections, each closing in its turn, are not either). A loopback's silence is never judged.
  struct Dead {
    std::shared_ptr<Session> session;
    EndReason reason;
    std::string why;
  };
  std::vector<Dead> CheckLiveness(Clock::time_point now, std::chrono::system_clock::time_point wall,
                                  std::chrono::milliseconds heartbeat_timeout, bool check_qps,
                                  const std::function<bool(rdma_cm_id*)>& qp_in_error);

  // The sessions whose records show a granted request on `slot`, given its word0 and word1 now
  // (a tagged entry counts only in its own generation).
  std::vector<std::shared_ptr<Session>> HoldersOf(uint64_t slot, proto::Word0 w0,
                                                  uint64_t word1) const;

  uint8_t* RecordAt(uint32_t index) const;
  void Clear() { sessions_.clear(); }

 private:
  void WriteRecord(const Session& s);

  // Constant after construction.
  uint8_t* const records_;
  const uint64_t lock_count_;

  // Owned by the event loop.
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions_;
  std::vector<uint32_t> free_records_;
  uint32_t loopback_records_ = 0;  // records lockd's loopback sessions hold (allocated, not freed)
  uint64_t next_session_id_;
};

}  // namespace rdmalock::lockd
