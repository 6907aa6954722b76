// The keeper thread: heartbeats, renewals, lockd's liveness (cluster mode) and reconnects.
// Owns rng_ and its own channel; takes a handle's or another channel's mutex only by try-lock.
// Its channel is never joined lazily: the first session's is made before Connect returns
// (JoinOwnThreads), each new session's first connection is its own (Reconnect).
#include <algorithm>
#include <random>
#include <tuple>

#include "client/src/client_impl.h"

namespace rdmalock {

using sdk::AttemptTimeout;
using sdk::ReadLiveness;
using sdk::Session;
using sdk::ThreadChannel;

namespace {

// The keeper's view of lockd's alive ticks (cluster mode): when a READ shows them moved since
// the previous one, lockd's loop ran after that previous READ was issued, so the session's
// leases may be trusted until that issue time plus T.
struct AliveWatch {
  uint64_t gen = 0, ticks = 0;
  Clock::time_point prev_issue{};
  void Saw(const Session& s, uint64_t now_ticks, Clock::time_point issued) {
    if (gen != s.gen) {
      gen = s.gen;
      ticks = now_ticks;
    } else if (now_ticks != ticks) {
      ticks = now_ticks;
      const int64_t until = (prev_issue + s.liveness).time_since_epoch().count();
      if (until > s.trusted_until_ns.load()) s.trusted_until_ns.store(until);
    }
    prev_issue = issued;
  }
};

}  // namespace

void Client::Impl::TellLater(std::function<void(const Status&)> callback, Status why) {
  {
    MutexLock lk(&mu_);
    if (stopping_) return;
    told_later_.emplace_back(std::move(callback), std::move(why));
  }
  cv_.SignalAll();
}

// The keeper: writes the heartbeat, renews tracked grants once a third of their lease has
// passed, watches for lockd disconnecting us, and reconnects after the session ends.
void Client::Impl::KeeperLoop() {
  AliveWatch alive;
  Clock::time_point next_beat, next_renew_check;
  std::chrono::milliseconds backoff{50};
  bool told_retry = false;  // backoff is lockd's retry-after
  for (;;) {
    std::shared_ptr<const Session> sess = session();
    const auto lease = sess ? std::chrono::nanoseconds(sess->reply.lease_ns)
                            : std::chrono::nanoseconds(std::chrono::seconds(2));
    const auto hb = sess && sess->reply.heartbeat_interval_ns > 0
                        ? std::chrono::nanoseconds(sess->reply.heartbeat_interval_ns)
                        : lease / 4;
    auto tick = std::max<std::chrono::nanoseconds>(std::min(lease / 12, hb / 2),
                                                   std::chrono::milliseconds(1));
    // lockd said when to come back (its grace period): then, plus up to a quarter more (at most
    // 250 ms) so that its clients do not all arrive at once; never earlier. Else back off.
    if (!sess) tick = told_retry ? backoff + SmallJitter(backoff) : Jittered(backoff);
    std::vector<std::pair<std::function<void(const Status&)>, Status>> tell;
    {
      MutexLock lk(&mu_);
      cv_.WaitFor(lk, tick, [&] {
        mu_.AssertHeld();
        return stopping_ || !told_later_.empty();
      });
      if (stopping_) return;
      tell.swap(told_later_);
    }
    // Dropped handles' losses (TellLater). One may close the client (client.h): the rest are
    // dropped with it, as TellLater says.
    for (auto& [callback, why] : tell) {
      callback(why);
      MutexLock lk(&mu_);
      if (stopping_) return;
    }
    if (keeper_paused_.load(std::memory_order_relaxed)) continue;  // a test stalls the keeper
    if (!sess) {
      if (!opts_.reconnect) continue;
      {
        // Closing (Close sets stopping_ only once the async threads are joined, which may run
        // callbacks meanwhile): a session that ended then is not replaced (review, 2026-12-08).
        MutexLock lk(&mu_);
        if (closed_) continue;
      }
      auto grace = std::chrono::milliseconds(0);
      if (Reconnect(&grace)) {
        backoff = std::chrono::milliseconds(50);
        told_retry = false;
        next_beat = Clock::time_point{};
      } else {
        told_retry = grace.count() > 0;
        backoff = told_retry ? grace : std::min(backoff * 2, std::chrono::milliseconds(2000));
      }
      continue;
    }
    auto ch = Channel(Clock::now());
    if (!ch.ok()) continue;
    ThreadChannel& c = **ch;
    if (c.session != sess) continue;
    if (Clock::now() < next_beat && Clock::now() < next_renew_check) continue;
    Status st;
    {
      MutexLock clk(&c.mu);
      st = c.mem->CheckConnection();
      if (st.ok()) st = c.Reap();
      if (st.ok() && Clock::now() >= next_beat) {
        next_beat = Clock::now() + hb;
        // With the heartbeat, in the same doorbell, a READ of lockd's alive ticks when lockd
        // asks to be watched (cluster mode).
        RemoteOp ops[2] = {
            RemoteOp::Write(RegionId::kSessions,
                            sess->reply.session_record_offset + proto::SessionRecord::kHeartbeat,
                            beats_.fetch_add(1, std::memory_order_relaxed) + 1),
            RemoteOp::Read(RegionId::kInfo, proto::InfoPage::kAliveTicks, 8)};
        const bool watch = sess->liveness > std::chrono::nanoseconds::zero();
        const auto issued = Clock::now();
        st = c.mem->Execute(std::span<RemoteOp>(ops, watch ? 2 : 1));
        if (st.ok() && watch) alive.Saw(*sess, ops[1].result[0], issued);
      }
    }
    if (st.ok() && sess->liveness > std::chrono::nanoseconds::zero() &&
        Clock::now().time_since_epoch().count() >= sess->trusted_until_ns.load()) {
      // lockd's event loop has not been seen to tick for T: it is stopped, frozen, stuck or
      // no longer primary, while its NIC may still answer. Its leases cannot be trusted; a
      // standby may serve after its grace. End the session; the keeper reconnects (through
      // etcd: to the new primary).
      st = Error(
          ErrorCode::kConnection,
          "lockd has not been seen alive for " +
              std::to_string(
                  std::chrono::duration_cast<std::chrono::milliseconds>(sess->liveness).count()) +
              " ms (stopped, stuck or no longer primary); its leases are not trusted");
    }
    // Outside the channel's lock: ending the session takes every handle's lock, and RenewDue
    // takes a handle's lock before the channel's (one order for both).
    if (!st.ok()) {
      OnSessionError(sess->gen, st);
      continue;
    }
    next_renew_check =
        Clock::now() + std::max<std::chrono::nanoseconds>(std::min(lease / 12, hb / 2),
                                                          std::chrono::milliseconds(1));
    RenewDue(c, lease);
  }
}

std::chrono::nanoseconds Client::Impl::SmallJitter(std::chrono::milliseconds d) {
  const int64_t most = std::clamp<int64_t>(d.count() / 4, 1, 250);
  std::uniform_int_distribution<int64_t> dist(0, most);
  return std::chrono::milliseconds(dist(rng_));
}

std::chrono::nanoseconds Client::Impl::Jittered(std::chrono::milliseconds d) {
  std::uniform_int_distribution<int64_t> dist(d.count() / 2, d.count() * 3 / 2);
  return std::chrono::milliseconds(dist(rng_));
}

bool Client::Impl::Reconnect(std::chrono::milliseconds* backoff) {
  std::string server = opts_.server;
  uint16_t port = opts_.port;
  if (resolve_) {
    auto where = resolve_();
    if (!where.ok()) {
      MutexLock lk(&mu_);
      last_error_ = where.status().message();
      return false;
    }
    std::tie(server, port) = *where;
  }
  ChannelParams p{server, port, AttemptTimeout(opts_.connect_timeout, resolve_ != nullptr),
                  opts_.client_name, 0};
  p.auth_key = opts_.auth_key;
  uint32_t retry_ms = 0;
  auto mem = connector_(p, &retry_ms, nullptr);
  Result<std::chrono::nanoseconds> liveness = mem.status();
  if (mem.ok()) liveness = ReadLiveness(**mem);
  if (!liveness.ok()) {
    MutexLock lk(&mu_);
    last_error_ = liveness.status().message();
    // lockd's restart grace or rate limit says when it will take us: come back then (the
    // caller jitters).
    if (retry_ms > 0) *backoff = std::chrono::milliseconds(retry_ms);
    return false;
  }
  // The reaper's connection of the new session, before the session is published: the
  // application's threads waiting in Channel() join it the moment it is, and could take every
  // connection lockd allows it (max_connections_per_session). The first one is the keeper's.
  // (A heartbeat first: lockd's heartbeat clock runs from the admission.)
  auto reason = proto::RejectReason::kNone;
  Status beat = WriteHeartbeat(**mem, (*mem)->reply());
  if (!beat.ok()) {
    MutexLock lk(&mu_);
    last_error_ = beat.message();
    return false;
  }
  auto reaper_mem = Join(server, port, (*mem)->reply(), p.connect_timeout,
                         Clock::now() + opts_.connect_timeout, &reason);
  if (!reaper_mem.ok()) {
    (*mem)->Shutdown();  // lockd ends the session with its only connection
    MutexLock lk(&mu_);
    last_error_ = OwnJoinError("reaper (abandoned tickets)", reaper_mem.status(), reason).message();
    return false;  // tried again after the back-off (lockd may come back with a larger cap)
  }
  auto ch = std::make_shared<ThreadChannel>();
  ch->mem = std::move(mem).value();
  auto reaper_ch = std::make_shared<ThreadChannel>();
  reaper_ch->mem = std::move(reaper_mem).value();
  {
    MutexLock lk(&mu_);
    if (stopping_ || closed_) return false;  // the connections close with ch and reaper_ch
    ch->session = MakeSession(*ch->mem, *liveness, server, port);
    reaper_ch->session = ch->session;
    SetGrantContext(*ch);
    SetGrantContext(*reaper_ch);
    session_ = ch->session;
    latest_ = session_;
    channels_[std::this_thread::get_id()] = ch;
    channels_[reaper_id_] = reaper_ch;
    ++reconnects_;
  }
  cv_.SignalAll();
  return true;
}

void Client::Impl::RenewDue(ThreadChannel& c, std::chrono::nanoseconds lease) {
  if (renewals_paused_.load(std::memory_order_relaxed)) return;  // a test stalls the renewer
  // The grants held on the current session's channels (each channel's HeldList).
  std::vector<std::shared_ptr<sdk::HeldList>> lists;
  {
    MutexLock lk(&mu_);
    for (auto& [tid, ch] : channels_) lists.push_back(ch->held);
  }
  std::vector<std::shared_ptr<LockHandle::State>> due;
  for (auto& l : lists) {
    auto held = l->Snapshot(/*close=*/false);
    due.insert(due.end(), std::make_move_iterator(held.begin()),
               std::make_move_iterator(held.end()));
  }
  for (auto& s : due) {
    Status st;
    std::function<void(const Status&)> notify;
    // Never wait for a handle its owner is using (a release may wait out retransmissions):
    // the keeper's heartbeat comes next, and a renewal skipped now is tried next tick (it is
    // due at a third of the lease, with two thirds to spare).
    if (!s->mu.TryLock()) continue;
    const bool failed = RenewOne(c, *s, lease, &st, &notify);
    s->mu.Unlock();
    if (notify) notify(st);
    if (!failed) continue;
    if (st.code() == ErrorCode::kConnection) OnSessionError(c.session->gen, st);
    MutexLock lk(&mu_);
    if (stopping_) return;  // a callback closed the client
  }
}

bool Client::Impl::RenewOne(ThreadChannel& c, LockHandle::State& s, std::chrono::nanoseconds lease,
                            Status* st, std::function<void(const Status&)>* notify) {
  if (s.state != LockState::kHeld) return false;
  if (s.ctx->session != c.session) return false;  // from an ended session: EndLeases handles it
  if (!s.auto_renew || !opts_.auto_renew) {
    // Not renewed here: the lock is lost once its lease runs out, and the owner is told
    // (issue 16, finding 12).
    if (!c.session->engine->LeaseValid(s.grant, Clock::now())) {
      *st = Error(ErrorCode::kLockLost, "lease ran out without a renewal; lock lost");
      *notify = s.Lose(*st);
      ClearLostEntry(c, s);
    }
    return false;
  }
  if (Clock::now() - s.grant.lease_start < lease / 3) return false;
  {
    MutexLock clk(&c.mu);
    *st = c.session->engine->Renew(*c.mem, s.grant, &c.events);
  }
  if (st->ok()) {
    renewals_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  renew_failures_.fetch_add(1, std::memory_order_relaxed);
  // A failed renewal whose lease is still running may succeed next tick; past the lease the
  // lock is lost.
  if (st->code() == ErrorCode::kLockLost || !c.session->engine->LeaseValid(s.grant, Clock::now())) {
    *notify = s.Lose(*st);
    ClearLostEntry(c, s);
  }
  return true;
}

// A lost grant's record entry would otherwise stay live for the rest of the session (its holder
// releases nothing past its lease, and nothing else clears it), and lockd reaps every live entry
// when the session ends. By then waiters may have recovered the ticket and the word may have been
// reset: a request of the new generation can draw the same counters, and an untagged entry (every
// shared one until protocol version 8) carries no generation that tells the two apart, so lockd
// would release that request's grant. Cleared now, while the session lives, it is over before any
// waiter can recover the ticket (F x L after the holder's last renewal, against this tick one lease
// after it); the ticket itself stays for the waiters' stall recovery, or lockd's fencing of a
// client that stops. The entry goes back to the pool only once the clear has landed
// (LockEngine::FreeRecord).
void Client::Impl::ClearLostEntry(ThreadChannel& c, LockHandle::State& s) {
  Ticket& t = s.grant.ticket;
  if (t.record == 0) return;
  {
    MutexLock clk(&c.mu);
    c.session->engine->FreeRecord(*c.mem, t.record, t.record_seq);
  }
  t.record = 0;  // cleared once
}

}  // namespace rdmalock
