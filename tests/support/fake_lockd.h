// A test lockd for the SDK's host tests (issue 16): sessions, joins, records and lockd's reaping
// over the in-process backend, so that a real rdmalock::Client (its session keeping, keeper,
// reaper, reconnects and OnLost) runs without RDMA. What it does is what server/lockd.cc does for
// the same events, with the same engine:
//   - a new connection creates a session (an id, a join key, a record); a join joins it;
//   - Fence(): every connection of the session is fenced at once (nothing of it lands any more),
//     and what its record shows is freed one lease later (a heartbeat, QP-error or operator
//     fence: the client may be alive and believe in its leases until then);
//   - a connection that is shut down (or destroyed: a DISCONNECTED) is dropped; when it was the
//     session's last, the session ends and its record is freed at once;
//   - as test doubles of lockd's admission and liveness tick, both off unless set: a join past
//     max_connections_per_session live connections of its session is refused
//     (kTooManyConnections, as Admission::Decide), and a session whose heartbeat word has not
//     moved for heartbeat_timeout is fenced as Fence() does (SessionTable::CheckLiveness).
// Thread-safety: every public method may be called from any thread; mu_ guards the sessions.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/connection.h"
#include "engine/lock_engine.h"
#include "rdmalock/client.h"
#include "rdmalock/proto/layout.h"
#include "tests/support/inproc_memory.h"

namespace rdmalock::testing {

// Polls `pred` every millisecond until it holds (true) or `limit` passes (false).
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Options for a Client of a FakeLockd (ClientTestPeer::Connect(FakeClientOptions(..), connector)).
inline ClientOptions FakeClientOptions(std::string name) {
  ClientOptions o;
  o.server = "fake";
  o.client_name = std::move(name);
  o.connect_timeout = std::chrono::seconds(2);
  return o;
}

class FakeLockd {
 public:
  struct Options {
    uint64_t lock_count = 16;
    uint32_t max_sessions = 16;
    std::chrono::milliseconds lease{300};
    uint32_t stall_factor = 2;
    std::chrono::milliseconds heartbeat_interval{20};
    uint16_t epoch = 1;
    // 0: no limit (lockd's default is 256). Settable later: set_max_connections_per_session.
    uint32_t max_connections_per_session = 0;
    // 0: no heartbeat fencing (the handshake's reply still says 5 x heartbeat_interval).
    std::chrono::milliseconds heartbeat_timeout{0};
    // Every connection's started batches (posted releases) land late, as on a real QP
    // (InProcessMemory::set_defer_starts).
    bool defer_starts = false;
    // Every connection's READs of the lock table go through this (InProcessMemory::
    // set_read_filter), e.g. to tear them as rdma_rxe can.
    InProcessMemory::ReadFilter read_filter;
  };

  explicit FakeLockd(Options o)
      : opts_(o),
        table_(o.lock_count, (uint64_t{o.max_sessions} + 1) * proto::kSessionRecordSize),
        engine_(Params(o), nullptr),
        max_conns_(o.max_connections_per_session) {
    for (uint32_t i = o.max_sessions; i >= 1; --i) free_records_.push_back(i);
    recovery_ = std::thread([this] { RecoveryLoop(); });
  }
  ~FakeLockd() {
    {
      std::lock_guard lk(rec_mu_);
      stopping_ = true;
    }
    rec_cv_.notify_all();
    recovery_.join();
  }

  InProcessTable& table() { return table_; }
  const EngineParams& params() const { return engine_.params(); }

  Connector connector() {
    return [this](const ChannelParams& p, uint32_t* retry_ms, proto::RejectReason* reason) {
      return Connect(p, retry_ms, reason);
    };
  }

  std::vector<uint64_t> Sessions() {
    std::lock_guard lk(mu_);
    std::vector<uint64_t> out;
    for (auto& [id, s] : sessions_) out.push_back(id);
    return out;
  }

  // The live queued entries of session `id`'s record, as lockd would reap them if the session
  // ended now (EndLocked). Empty for an unknown session.
  std::vector<proto::RequestEntry> LiveEntries(uint64_t id) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    return it == sessions_.end() ? std::vector<proto::RequestEntry>{}
                                 : LiveEntriesLocked(it->second.index);
  }

  // A heartbeat, QP-error or operator fence of session `id`.
  void Fence(uint64_t id) {
    std::lock_guard lk(mu_);
    EndLocked(id, /*now=*/false);
  }

  // Breaks every connection of session `id` (QP errors the client will see, as a link that went
  // down would; lockd does not act on them here: the client's Shutdown ends the session).
  void BreakSession(uint64_t id) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    for (InProcessMemory* c : it->second.live) c->Break();
  }

  // The heartbeat word of session `id`'s record (what the client's keeper last wrote), or 0.
  uint64_t Heartbeat(uint64_t id) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return 0;
    return table_
        .session_word(uint64_t{it->second.index} * proto::kSessionRecordSize +
                      proto::SessionRecord::kHeartbeat)
        .load();
  }

  // Breaks one connection (a QP error the client will see; lockd does not act on it here).
  void BreakOne(std::mt19937& rng) {
    std::lock_guard lk(mu_);
    std::vector<InProcessMemory*> all;
    for (auto& [id, s] : sessions_) all.insert(all.end(), s.live.begin(), s.live.end());
    if (!all.empty()) all[rng() % all.size()]->Break();
  }

  // Live connections of session `id` now (0: no such session).
  size_t Connections(uint64_t id) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    return it == sessions_.end() ? 0 : it->second.live.size();
  }

  // Applies to joins from now on (the connections a session has keep going).
  void set_max_connections_per_session(uint32_t n) {
    std::lock_guard lk(mu_);
    max_conns_ = n;
  }

  // While paused, the recovery thread frees nothing of the sessions that end (their jobs wait),
  // as a lockd whose recovery has not come to them yet: a test can then show what a client does
  // in that window.
  void PauseRecovery(bool paused) { recovery_paused_.store(paused); }

  uint64_t ended_at_once() const { return ended_now_.load(); }
  uint64_t ended_after_lease() const { return ended_later_.load(); }
  uint64_t released_for_dead() const { return released_.load(); }
  // Sessions fenced because their heartbeat stopped (Options::heartbeat_timeout).
  uint64_t fenced_for_heartbeat() const { return fenced_hb_.load(); }
  // Joins refused for max_connections_per_session.
  uint64_t joins_refused() const { return joins_refused_.load(); }

 private:
  struct Session {
    uint64_t key = 0;
    uint32_t index = 0;
    std::vector<InProcessMemory*> live;  // connections not shut down, fenced or destroyed
    uint64_t beat = 0;                   // the heartbeat word when last seen to move
    Clock::time_point beat_moved;        // when (the session's start until it first moves)
  };
  struct Job {
    Clock::time_point not_before;
    std::vector<ReapState> items;
  };

  static EngineParams Params(const Options& o) {
    EngineParams p;
    p.lock_count = o.lock_count;
    p.lease = o.lease;
    p.stall_factor = o.stall_factor;
    p.epoch = o.epoch;
    return p;
  }

  Result<std::unique_ptr<Connection>> Connect(const ChannelParams& p, uint32_t*,
                                              proto::RejectReason* reason) {
    std::lock_guard lk(mu_);
    uint64_t id = 0;
    if ((p.flags & proto::kFlagJoin) != 0) {
      auto it = sessions_.find(p.join_session);
      if (it == sessions_.end() || it->second.key != p.join_key) {
        if (reason != nullptr) *reason = proto::RejectReason::kBadSession;
        return Error(ErrorCode::kRejected, "fake lockd: no such session to join");
      }
      id = it->first;
      if (max_conns_ != 0 && it->second.live.size() >= max_conns_) {
        ++joins_refused_;
        if (reason != nullptr) *reason = proto::RejectReason::kTooManyConnections;
        return Error(
            ErrorCode::kRejected,
            "fake lockd: session " + std::to_string(id) + " has " +
                std::to_string(it->second.live.size()) + " connections (" +
                std::string(proto::RejectReasonName(proto::RejectReason::kTooManyConnections)) +
                ")");
      }
    } else {
      if (free_records_.empty()) {
        if (reason != nullptr) *reason = proto::RejectReason::kServerFull;
        return Error(ErrorCode::kRejected, "fake lockd: server full");
      }
      id = next_id_++;
      Session s;
      s.key = rng_() | 1;
      s.index = free_records_.back();
      s.beat_moved = Clock::now();
      free_records_.pop_back();
      sessions_[id] = s;
      // The record's header, as lockd writes it (SessionTable::WriteRecord): Client::Sessions()
      // lists the records whose session id is set.
      proto::SessionRecord hdr;
      hdr.session_id = id;
      std::array<uint8_t, proto::SessionRecord::kEntries> b{};
      hdr.EncodeTo(b);
      const uint64_t base = uint64_t{s.index} * proto::kSessionRecordSize;
      for (uint64_t w = 0; w < b.size(); w += 8) {
        table_.session_word(base + w).store(proto::GetLe(b, w, 8));
      }
    }
    Session& s = sessions_[id];
    auto mem = std::make_unique<InProcessMemory>(&table_);
    mem->set_min_round_trip(std::chrono::microseconds(20));
    mem->set_defer_starts(opts_.defer_starts);
    if (opts_.read_filter) mem->set_read_filter(opts_.read_filter);
    proto::AcceptReply r;
    r.epoch = opts_.epoch;
    r.session_id = id;
    r.lease_ns = static_cast<uint64_t>(std::chrono::nanoseconds(opts_.lease).count());
    r.lock_count = opts_.lock_count;
    r.stall_factor = opts_.stall_factor;
    r.session_record_size = proto::kSessionRecordSize;
    r.sessions.length = table_.session_bytes();
    r.session_record_offset = uint64_t{s.index} * proto::kSessionRecordSize;
    r.max_sessions = opts_.max_sessions;
    r.heartbeat_interval_ns =
        static_cast<uint64_t>(std::chrono::nanoseconds(opts_.heartbeat_interval).count());
    r.heartbeat_timeout_ns = 5 * r.heartbeat_interval_ns;
    r.join_key = s.key;
    r.record_entries = proto::SessionRecord::kMaxEntries;
    mem->set_reply(r);
    InProcessMemory* raw = mem.get();
    mem->set_on_shutdown([this, id, raw] { OnGone(id, raw); });
    s.live.push_back(raw);
    return std::unique_ptr<Connection>(std::move(mem));
  }

  // A DISCONNECTED: the connection goes; the session ends at once with its last connection.
  void OnGone(uint64_t id, InProcessMemory* conn) {
    std::lock_guard lk(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    std::erase(it->second.live, conn);
    if (it->second.live.empty()) EndLocked(id, /*now=*/true);
  }

  // The live queued entries of the record at `index` (mu_ held).
  std::vector<proto::RequestEntry> LiveEntriesLocked(uint32_t index) {
    std::vector<proto::RequestEntry> out;
    const uint64_t base = uint64_t{index} * proto::kSessionRecordSize;
    for (uint32_t i = 0; i < proto::SessionRecord::kMaxEntries; ++i) {
      const uint64_t off = base + proto::SessionRecord::EntryOffset(i);
      proto::RequestEntry e;
      if (proto::RequestEntry::DecodeLive(table_.session_word(off).load(),
                                          table_.session_word(off + 8).load(),
                                          table_.session_word(off + 16).load(), &e) &&
          e.state == proto::RequestEntry::State::kQueued) {
        out.push_back(e);
      }
    }
    return out;
  }

  // As lockd's EndSession: fence every connection, read the record's live entries, clear the
  // record, and hand the queued tickets to the recovery thread (at once, or one lease later).
  void EndLocked(uint64_t id, bool now) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    for (InProcessMemory* c : it->second.live) c->Break();  // returns once nothing is in flight
    const uint64_t base = uint64_t{it->second.index} * proto::kSessionRecordSize;
    Job job;
    job.not_before = Clock::now() + (now ? Clock::duration::zero() : Clock::duration(opts_.lease));
    for (const proto::RequestEntry& e : LiveEntriesLocked(it->second.index)) {
      if (e.slot >= opts_.lock_count) continue;
      job.items.push_back(ReapState::ForEntry(e));
      job.items.back().NoteScan(table_.Load(e.slot, 1));
    }
    for (uint64_t w = 0; w < proto::kSessionRecordSize; w += 8)
      table_.session_word(base + w).store(0);
    free_records_.push_back(it->second.index);
    sessions_.erase(it);
    (now ? ended_now_ : ended_later_).fetch_add(1);
    if (job.items.empty()) return;
    {
      std::lock_guard rl(rec_mu_);
      jobs_.push_back(std::move(job));
    }
    rec_cv_.notify_all();
  }

  // lockd's liveness tick, for the heartbeat alone: a session whose heartbeat word has not moved
  // for heartbeat_timeout is fenced.
  void CheckHeartbeats() {
    if (opts_.heartbeat_timeout.count() == 0) return;
    std::lock_guard lk(mu_);
    const auto now = Clock::now();
    std::vector<uint64_t> dead;
    for (auto& [id, s] : sessions_) {
      const uint64_t beat = table_
                                .session_word(uint64_t{s.index} * proto::kSessionRecordSize +
                                              proto::SessionRecord::kHeartbeat)
                                .load();
      if (beat != s.beat) {
        s.beat = beat;
        s.beat_moved = now;
      } else if (now - s.beat_moved >= opts_.heartbeat_timeout) {
        dead.push_back(id);
      }
    }
    for (uint64_t id : dead) {
      EndLocked(id, /*now=*/false);
      ++fenced_hb_;
    }
  }

  void RecoveryLoop() {
    InProcessMemory mem(&table_);
    mem.set_min_round_trip(std::chrono::microseconds(20));
    std::vector<ReapState> steps;
    for (;;) {
      {
        std::unique_lock lk(rec_mu_);
        rec_cv_.wait_for(lk, std::chrono::milliseconds(1),
                         [&] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        if (recovery_paused_.load()) continue;
        const auto now = Clock::now();
        for (auto it = jobs_.begin(); it != jobs_.end();) {
          if (it->not_before > now) {
            ++it;
            continue;
          }
          steps.insert(steps.end(), it->items.begin(), it->items.end());
          it = jobs_.erase(it);
        }
      }
      CheckHeartbeats();  // takes mu_, and EndLocked rec_mu_ inside it: not under rec_mu_
      for (size_t i = 0; i < steps.size();) {
        auto done = engine_.Reap(mem, steps[i]);
        if (!done.ok() || *done) {
          if (done.ok() && steps[i].outcome == ReapState::Outcome::kReleased) released_++;
          steps[i] = steps.back();
          steps.pop_back();
        } else {
          ++i;
        }
      }
    }
  }

  const Options opts_;
  InProcessTable table_;
  const LockEngine engine_;

  std::mutex mu_;       // guards the members below
  uint32_t max_conns_;  // 0: none
  std::map<uint64_t, Session> sessions_;
  std::vector<uint32_t> free_records_;  // record indices; 0 is lockd's own (unused here)
  uint64_t next_id_ = 1;
  std::mt19937_64 rng_{12345};

  std::mutex rec_mu_;  // guards the members below
  std::condition_variable rec_cv_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::thread recovery_;

  std::atomic<uint64_t> ended_now_{0}, ended_later_{0}, released_{0}, fenced_hb_{0};
  std::atomic<uint64_t> joins_refused_{0};
  std::atomic<bool> recovery_paused_{false};
};

}  // namespace rdmalock::testing
