// Sessions on the event loop: ending one (its connections fenced and disconnected, its record's
// requests handed to the recovery worker), the liveness tick, half-open handshakes, a device's
// async events, and carrying out admin requests. See lockd_impl.h for the threads.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "rdmalock/proto/layout.h"
#include "server/lockd_impl.h"
#include "server/words.h"

namespace rdmalock::lockd {

// Ends a connection whose handshake did not finish (refused, failed, or a Welcome it never took
// delivery of, which may have reached it): the session with it if it has no other.
void Server::Impl::DropHandshake(Conn& c, const std::string& why) {
  std::shared_ptr<Session> s = c.session;
  rdma_cm_id* id = c.id.get();
  if (!c.admitted && !c.refused) {
    counters.handshakes_failed.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("handshake with {} ended: {}", s->peer, why);
  }
  if (s->counted) {
    RemoveConn(id);
    // Its first connection's Welcome failed after it was counted: no connection of it is left,
    // and none comes (no DISCONNECTED for an id destroyed here; a join needs the Welcome's key).
    // It ends now, not at its heartbeat timeout; its locks are freed one lease later, as for a
    // connection that failed (the client may have read the Welcome and locked before its SEND's
    // failure showed here).
    if (s->conns.empty()) EndSession(s, EndReason::kConnectFailed, why, false);
  } else {
    // No connection of this session was ever admitted: nothing of it can be in the table.
    EndSession(s, EndReason::kConnectFailed, why, true);
  }
}

void Server::Impl::HandshakeOver(Conn& c) {
  if (!c.in_handshake) return;
  c.in_handshake = false;
  --handshakes;
  if (!c.join_counted_from.empty()) {
    if (auto it = join_handshakes_from.find(c.join_counted_from);
        it != join_handshakes_from.end() && --it->second == 0) {
      join_handshakes_from.erase(it);
    }
    if (c.session->joins_in_handshake > 0) --c.session->joins_in_handshake;
    c.join_counted_from.clear();
  }
  if (c.counted_from.empty()) return;
  if (auto it = new_handshakes_from.find(c.counted_from);
      it != new_handshakes_from.end() && --it->second == 0) {
    new_handshakes_from.erase(it);
  }
  c.counted_from.clear();
}

// Fences, disconnects and forgets one connection of a session that lives on.
void Server::Impl::RemoveConn(rdma_cm_id* id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Conn& c = *it->second;
  if (Status f = c.id.FenceQp(); !f.ok()) {
    c.session->fence_failed = true;
    spdlog::error(
        "session {} ('{}', {}): a connection's fence failed ({}); its memory windows "
        "go now, its QP when the connection is destroyed, and its locks are freed no "
        "sooner than one lease after the session ends",
        c.session->session_id, c.session->name, c.session->peer, f.message());
  }
  c.id.Disconnect();
  c.windows.clear();
  HandshakeOver(c);
  c.session->ForgetConn(id);
  conn_by_serial.erase(c.serial);
  graveyard.push_back(std::move(it->second));
  conns.erase(it);
}

// Ends a session: every connection of it is fenced (QP to ERR, so nothing of it can land any
// more) and disconnected, then what its record shows is handed to the recovery thread. `now`:
// free at once (the client is gone: it disconnected, which the SDK does only after ending its
// leases, or its process died); otherwise one lease later, when any lease it may still believe
// in has run out.
// `s` is taken by value: callers pass references into `sessions` or into a Conn, which the
// first lines below erase (issue 17, finding 1: a use-after-free on release --force --session).
void Server::Impl::EndSession(std::shared_ptr<Session> s, EndReason reason, const std::string& why,
                              bool now) {
  if (!loop.Check("EndSession")) return;
  if (sessions.Find(s->session_id) != s) return;  // already ended
  // Only a session that was admitted (counted in accepted_total) ends as one: a refused or failed
  // handshake is counted by its refusal, and a QP error in one is no fenced client (before
  // 2026-12-06 each counted here too, as connect_failed or qp_error).
  if (s->counted && !s->loopback) {
    counters.ended[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
  }
  // The QP to ERR first (nothing more of it executes), then its memory windows are freed: an
  // rkey the client kept is then invalid on any QP, a new connection of its own included.
  for (rdma_cm_id* id : std::vector<rdma_cm_id*>(s->conns.begin(), s->conns.end())) {
    RemoveConn(id);  // disconnects too, so that the peer sees DISCONNECTED
  }
  s->conns.clear();
  // A fence that failed (its QP not moved to ERR) leaves "free at once" unsafe: the QP may still
  // execute the client's work requests. One lease later, every lease the client may believe in
  // has run out, the argument that holds for a live client that is not fenced.
  if (now && s->fence_failed && s->counted) {
    spdlog::warn("session {}: its locks are freed one lease after now, not at once: a fence failed",
                 s->session_id);
    now = false;
  }
  // The fence's time, once every QP of the session is fenced: a renewal that landed was issued
  // before this, so any lease it gave runs out by `ended + L`. Taken before the loop, a renewal
  // landing on a connection the loop had not reached yet (its order is the set's) could end up
  // to the loop's length later than the reap one lease after (found by review, 2026-12-05).
  const auto ended = SteadyClock::now();
  if (s->counted && !s->loopback) connected.fetch_sub(1);
  if (s->counted && !s->loopback && !now) {
    fenced_leases_until =
        std::max(fenced_leases_until, ended + std::chrono::milliseconds(config.lease_ms));
  }

  RecoveryJob job;
  job.session_id = s->session_id;
  job.who = "session " + std::to_string(s->session_id) + " ('" + s->name + "', pid " +
            std::to_string(s->pid) + ", " + s->peer + ")";
  job.why = why;
  job.ended = ended;
  job.not_before = now ? ended : ended + std::chrono::milliseconds(config.lease_ms);
  // Its QPs are fenced: what its record shows now is all it can ever show.
  EndedRecord rec = std::move(*sessions.End(*s));
  record_mrs.erase(s->session_id);  // its connections hold them until their windows are gone
  job.items = std::move(rec.items);
  // Each is reaped only while its slot's counters are the ones it shows now (ReapState::NoteScan).
  for (ReapState& r : job.items) {
    r.NoteScan(Load64(regions->locks(), proto::SlotOffset(r.ticket.slot) + proto::kWord1Offset));
  }
  // A tagged entry over by the slot's words at the scan (a finished exclusive request, whose
  // release wrote no done mark; a request the slot's generation moved past) stays so: generations
  // only grow, and within one n_x only grows past it. Not a request to free; the reap would find
  // the same (it compares with the scan's word1 too).
  std::erase_if(job.items, [&](const ReapState& r) {
    const uint64_t off = proto::SlotOffset(r.ticket.slot);
    return r.ticket.tagged &&
           proto::RequestEntry::TaggedOver(r.ticket.word, r.ticket.mode, r.ticket.generation,
                                           proto::Word0::Decode(Load64(regions->locks(), off)),
                                           r.scan_word1);
  });
  const uint32_t requesting = rec.requesting;
  const uint32_t garbage = rec.garbage;
  if (s->loopback) {
    spdlog::info("lockd's loopback connection closed: {}", why);
  } else if (!s->counted) {
    // Never admitted: it had no rkey, so nothing of it is in the table. Refusals are logged
    // (rate-limited) where they happen; this line would let a peer flood the log.
    spdlog::debug("{} ended before it was admitted: {}", job.who, why);
  } else {
    ++recoveries_total;
    spdlog::info(
        "{} ended: {}; {} recorded request(s) to free {}{}{}", job.who, why, job.items.size(),
        now ? "now" : "after one lease (" + std::to_string(config.lease_ms) + " ms)",
        requesting > 0 ? "; " + std::to_string(requesting) +
                             " request(s) without a known ticket are left to stall recovery"
                       : "",
        garbage > 0 ? "; " + std::to_string(garbage) + " unreadable entr(y/ies) ignored" : "");
  }
  PublishCounters();
  if (!job.items.empty()) recovery.Enqueue(std::move(job));
}

void Server::Impl::DropConn(rdma_cm_id* id, EndReason reason, const std::string& why, bool now) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  std::shared_ptr<Session> s = it->second->session;
  if (!it->second->established && s->conns.size() == 1 && !s->counted &&
      admission.ShouldLogFailure(s->peer, "not established", std::chrono::steady_clock::now())) {
    spdlog::warn("connection from {} failed before it was established: {}", s->peer, why);
  }
  if (!it->second->admitted) {  // it never had an rkey: it alone goes (its session, if new)
    DropHandshake(*it->second, why);
    return;
  }
  if (reason == EndReason::kDisconnected) {
    // A DISCONNECTED is not proof that the client is gone: the SDK closes a thread's join that
    // failed after the Welcome (a resource or a timeout at the client) while the session's
    // other threads hold leases (issue 16, finding 2). Only that connection goes; the session
    // ends when its last connection does (a dead process closes them all), by heartbeat, or
    // when the SDK, having ended every lease, closes them.
    size_t others = 0;
    for (rdma_cm_id* other : s->conns) {
      auto o = conns.find(other);
      if (other != id && o != conns.end() && o->second->admitted) ++others;
    }
    if (others > 0) {
      spdlog::info("session {}: one of its connections closed ({}); {} other(s) remain",
                   s->session_id, why, others);
      RemoveConn(id);
      PublishCounters();
      return;
    }
  }
  EndSession(s, reason, why, now);
}

// Connections whose handshake is not over within kEstablishTimeout of their accept: never
// established, no valid Hello (they got no rkey, so a session with no other connection ends at
// once), or a Welcome not delivered (the peer posts no receive: it stays in RNR retry). A
// thread's join is dropped alone.
void Server::Impl::DropHalfOpen(SteadyClock::time_point now) {
  std::vector<rdma_cm_id*> stale;
  for (auto& [id, c] : conns) {
    if (c->in_handshake && now - c->accepted_at > kEstablishTimeout) stale.push_back(id);
  }
  for (rdma_cm_id* id : stale) {
    auto it = conns.find(id);
    if (it == conns.end()) continue;  // ended with its session meanwhile
    Conn& c = *it->second;
    std::shared_ptr<Session> s = c.session;
    const std::string why = "connection from " + s->peer +
                            (c.admitted      ? " took no delivery of its welcome"
                             : c.established ? " sent no valid hello"
                                             : " not established") +
                            " within " + std::to_string(kEstablishTimeout.count()) +
                            " s of its accept";
    if (s->counted) {
      spdlog::warn("{}: dropping it (session {} keeps its other connections)", why, s->session_id);
    } else if (admission.ShouldLogFailure(s->peer, "handshake timeout",
                                          std::chrono::steady_clock::now())) {
      // A new session's handshake (no rkey yet): once a second per address, as refusals.
      spdlog::warn("{}: ending session {}", why, s->session_id);
    }
    DropHandshake(c, why);
  }
}

// Every tick: publish the clock, watch heartbeats and QP states.
void Server::Impl::Tick() {
  if (!loop.Check("Tick")) return;
  const auto now = SteadyClock::now();
  // The sign of life clients of a cluster-mode lockd must see (issue 16, finding 4): advanced
  // only by this loop, and only while lockd may serve (its etcd lease provably valid).
  if (now.time_since_epoch().count() < alive_until_ns.load(std::memory_order_relaxed)) {
    Store64(regions->info(), proto::InfoPage::kAliveTicks, ++alive_ticks);
  }
  DropHalfOpen(now);
  admission.Tick(now);
  const auto timeout = std::chrono::milliseconds(config.heartbeat_timeout_ms);
  const bool check_qps = now >= next_qp_check;
  if (check_qps) next_qp_check = now + timeout / 4;
  auto qp_in_error = [](rdma_cm_id* id) { return rdma::QpInError(id); };
  for (auto& d : sessions.CheckLiveness(now, std::chrono::system_clock::now(), timeout, check_qps,
                                        qp_in_error)) {
    EndSession(d.session, d.reason, d.why, false);
  }
  graveyard.clear();
  PublishCounters();
}

// A device's asynchronous event: a QP of a session broke (where the provider reports it).
void Server::Impl::OnAsyncEvent(Device& d) {
  if (!loop.Check("OnAsyncEvent")) return;
  rdma::AsyncEvent ev;
  if (!rdma::TakeAsyncEvent(d.ctx, &ev)) return;
  const ibv_event_type type = ev.type;
  ibv_qp* qp = ev.qp;
  if (qp == nullptr) {
    // A device-level event. A CQ overrun or a fatal device error stops every handshake from
    // completing: said at error level, not at debug only (found by review, 2026-12-06). A port
    // going down is a warning; the rest (port up, address changes) stay at debug.
    if (type == IBV_EVENT_CQ_ERR || type == IBV_EVENT_DEVICE_FATAL) {
      spdlog::error("device {}: {}: handshakes on it may no longer complete; restart lockd", d.name,
                    rdma::AsyncEventName(type));
    } else if (type == IBV_EVENT_PORT_ERR) {
      spdlog::warn("device {}: {}", d.name, rdma::AsyncEventName(type));
    } else {
      spdlog::debug("device {}: async event {}", d.name, rdma::AsyncEventName(type));
    }
    return;
  }
  for (auto& [id, c] : conns) {
    if (id->qp == qp) {
      if (!c->admitted && !c->refused) {
        counters.handshakes_failed.fetch_add(1, std::memory_order_relaxed);
      }
      EndSession(c->session, EndReason::kQpError,
                 std::string("its QP failed (") + rdma::AsyncEventName(type) + ")", false);
      break;
    }
  }
  graveyard.clear();
}

// One request per connection (server/admin.h): "release-slot SLOT" or "release-session ID", either
// optionally naming the lockd it is meant for.
std::string Server::Impl::AdminCommand(const std::string& line, const std::string& asker) {
  if (!loop.Check("AdminCommand")) return "error lockd: not on its event loop";
  std::string error;
  const std::optional<AdminRequest> req = ParseAdminCommand(line, &error);
  if (!req) return error;
  const uint64_t n = req->number;
  const std::string& arg = req->arg;
  const std::string lease = std::to_string(config.lease_ms);
  if (req->meant_for) {
    // Meant for the lockd lockctl reached over RDMA (which mapped a lock name to the slot, or
    // which --server, --port or --shard named): only that lockd acts on it (--admin-socket may
    // name another lockd on this host).
    const uint64_t started =
        proto::GetLe(std::span<const uint8_t>(regions->info(), proto::kInfoPageSize),
                     proto::InfoPage::kStartTimeUnixNs, 8);
    if (req->meant_for->epoch != epoch || req->meant_for->start_time_unix_ns != started) {
      return "error this admin socket is lockd epoch " + std::to_string(epoch) + " started at " +
             std::to_string(started) + " (unix ns); the request is meant for lockd epoch " +
             std::to_string(req->meant_for->epoch) + " started at " +
             std::to_string(req->meant_for->start_time_unix_ns) +
             ": --admin-socket and the lockd lockctl reached (--server, --port, client.yaml, the "
             "map) are different lockds";
    }
  }
  if (req->kind == AdminRequest::Kind::kReleaseSession) {
    std::shared_ptr<Session> s = sessions.Find(n);
    if (s == nullptr || s->loopback) return "error no client session " + arg;
    spdlog::warn("forced release of session {} requested by {}", n, asker);
    counters.forced_releases.fetch_add(1, std::memory_order_relaxed);
    EndSession(s, EndReason::kForced, "forced release by " + asker, false);
    graveyard.clear();
    return "ok session " + arg + " fenced; its locks are freed after one lease (" + lease +
           " ms), when its leases have run out";
  }
  if (n >= config.lock_count) {
    return "error slot " + arg + " is out of range (lock_count " +
           std::to_string(config.lock_count) + ")";
  }
  // Who holds it, by the records: entries on this slot whose ticket the word shows granted.
  const auto w0 = proto::Word0::Decode(Load64(regions->locks(), proto::SlotOffset(n)));
  const uint64_t w1 = Load64(regions->locks(), proto::SlotOffset(n) + proto::kWord1Offset);
  const std::vector<std::shared_ptr<Session>> holders = sessions.HoldersOf(n, w0, w1);
  if (holders.empty()) {
    return "error no session's record shows a holder of slot " + arg +
           " (free, or held by a client that did not record it: waiters recover it after " +
           std::to_string(config.lease_ms * config.stall_factor) + " ms without progress)";
  }
  std::string ids;
  for (auto& s : holders) {
    // Appended piece by piece: GCC 12 at -O3 misreports `const char* + std::string` as an
    // overlapping memcpy (-Werror=restrict, as in rdma::AddressToString).
    if (!ids.empty()) ids += ',';
    ids += std::to_string(s->session_id);
    spdlog::warn("forced release of slot {} requested by {}: fencing session {}", n, asker,
                 s->session_id);
    EndSession(s, EndReason::kForced, "forced release of slot " + arg + " by " + asker, false);
  }
  counters.forced_releases.fetch_add(1, std::memory_order_relaxed);
  graveyard.clear();
  return "ok slot " + arg + ": fenced session(s) " + ids +
         "; their locks are freed after one lease (" + lease +
         " ms), when their leases have run out";
}

}  // namespace rdmalock::lockd
