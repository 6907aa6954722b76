// LockHandle: a granted lock as its owner holds it. Its State is shared with the keeper
// (renewals, loss reports) and guarded by State::mu (client_impl.h).
#include <algorithm>

#include "client/src/client_impl.h"

namespace rdmalock {

using sdk::Session;
using sdk::ThreadChannel;

namespace sdk {

// A handle MakeHandle made for a session that had ended meanwhile: the caller gets an error.
Status EndedWhileGranted() {
  return Error(ErrorCode::kConnection,
               "the session with lockd ended (or lockd was not seen alive within its liveness "
               "timeout) while the lock was granted; lock lost");
}

Status SameNameMapping(uint64_t hashed_with, uint64_t lock_count) {
  if (lock_count == hashed_with) return Status::Ok();
  return Error(ErrorCode::kConnection,
               "the session with lockd ended while the lock was requested, and the new lockd has " +
                   std::to_string(lock_count) + " locks where the name was mapped to a slot of " +
                   std::to_string(hashed_with) + "; nothing is held, request it again");
}

Status SameNameMapping(const LockHandle::State& s, uint64_t hashed_with) {
  return SameNameMapping(hashed_with, s.ctx->session->reply.lock_count);
}

}  // namespace sdk

namespace {
// Where a release that finds the lock lost puts the loss: null for Release(), whose caller is
// told by its result; a handle being dropped gets its OnLost callback, when the release's result
// is kLockLost and the loss was not reported before (client.h: the owner of a dropped handle
// learns through the callback that its lock was lost before it let go).
using Teller = std::function<void(const Status&)>;
// `caller`: the handle this call releases and whether its owner drops it, should the release
// end the session (Client::Impl::LossCaller): a dropping thread tells no loss itself (the keeper
// does), and a Release() tells its handle's loss by its result alone.
Status ReleaseHeld(LockHandle::State& s, Client::Impl* impl, Teller* tell,
                   Client::Impl::LossCaller caller);
Status ReleaseState(LockHandle::State& s, Teller* tell);

// Whether the lease of `s`'s grant (a rider's: its carrier's) has run out by now.
bool LeaseRanOut(LockHandle::State& s) {
  LockHandle::State& g = s.carrier ? *s.carrier : s;
  MutexLock lk(&g.mu);
  return !g.ctx->session->engine->LeaseValid(g.grant, Clock::now());
}

// ReleaseOnChannel's remote operations: the channel's last posted release reaped, then this
// grant's release, at once (waiters were seen) or posted.
Status ReapAndRelease(LockHandle::State& s, ThreadChannel& c) REQUIRES(s.mu, c.mu) {
  RDMALOCK_RETURN_IF_ERROR(c.Reap());  // the channel's last posted release
  const LockEngine& engine = *s.ctx->session->engine;
  if (LockEngine::BlocksOthers(s.grant)) {
    return engine.Release(*c.mem, s.grant, &c.events);  // a handover: at once
  }
  return engine.StartRelease(*c.mem, s.grant, &c.pending, &c.events);
}

// The release of `s`'s grant to lockd on `c`, the calling thread's channel in its session.
// Posted, not waited for, unless waiters were seen queued behind: the CAS's completion is reaped
// by this thread's next call, or by the reaper thread (ReapLeftReleases). Only the checks before
// posting can fail here.
Status ReleaseOnChannel(LockHandle::State& s, ThreadChannel& c, Client::Impl& impl) REQUIRES(s.mu) {
  MutexLock clk(&c.mu);
  Status st = ReapAndRelease(s, c);
  c.NotePending();
  if (c.pending.active) impl.ReleasePosted();
  return st;
}
}  // namespace

namespace {
// The handle may still hold its lock (so dropping it must release it). A handle released by its
// owner is the common case, and dropping it then costs one atomic load: no mutex, no error made
// and thrown away, no channel looked up.
bool StillHeld(const LockHandle::State& s) {
  if (s.inherited()) return true;  // Release() says why it cannot
  return !s.ended.load(std::memory_order_acquire);
}

// The owner drops a handle that may still hold its lock: it is released, and a loss the release
// found (the lease had run out, a waiter had recovered the lock) goes to the OnLost callback, as
// the owner cannot see the result. The client's keeper runs it, not this thread: the owner may
// drop the handle under a mutex its callback takes, or assign to the handle the callback uses.
void Drop(LockHandle::State& s) {
  if (!StillHeld(s)) return;
  Teller tell;
  const Status st = ReleaseState(s, &tell);
  if (!tell) return;
  if (auto impl = s.ctx->client.lock()) impl->TellLater(std::move(tell), st);
}
}  // namespace

LockHandle::LockHandle(LockHandle&& o) noexcept : state_(std::move(o.state_)) {}
LockHandle& LockHandle::operator=(LockHandle&& o) noexcept {
  if (this != &o) {
    if (state_) Drop(*state_);
    state_ = std::move(o.state_);
  }
  return *this;
}
LockHandle::~LockHandle() {
  if (state_) Drop(*state_);
}

// In a forked child an inherited handle reads as an empty one (sdk.md: accessors return 0).
uint64_t LockHandle::slot() const {
  return state_ && !state_->inherited() ? state_->ticket().slot : 0;
}
LockMode LockHandle::mode() const {
  return state_ && !state_->inherited() ? static_cast<LockMode>(state_->ticket().mode)
                                        : LockMode::kExclusive;
}
// A grant whose lease has run out is lost, whether or not the keeper has noticed yet (it may be
// stuck, or renewal off): waiters may recover it from then on.
LockState LockHandle::state() const {
  if (!state_) return LockState::kReleased;
  if (state_->inherited()) return LockState::kLost;  // a forked child holds nothing
  if (const auto& c = state_->carrier) {
    // A rider (cohort.h): held while its carrier's grant is. The two mutexes one after the
    // other, never together.
    {
      MutexLock lk(&state_->mu);
      if (state_->state != LockState::kHeld) return state_->state;
    }
    MutexLock lk(&c->mu);
    return c->state == LockState::kHeld &&
                   c->ctx->session->engine->LeaseValid(c->grant, Clock::now())
               ? LockState::kHeld
               : LockState::kLost;
  }
  MutexLock lk(&state_->mu);
  if (state_->state == LockState::kHeld &&
      !state_->ctx->session->engine->LeaseValid(state_->grant, Clock::now())) {
    return LockState::kLost;
  }
  return state_->state;
}
uint64_t LockHandle::fencing_token() const {
  if (!state_ || state_->inherited()) return 0;
  MutexLock lk(&state_->mu);
  return state_->grant.token;
}
std::chrono::steady_clock::time_point LockHandle::lease_expiry() const {
  if (!state_ || state_->inherited()) return {};
  // A rider's lease is its carrier's (the grant the keeper renews).
  LockHandle::State* g = state_->carrier ? state_->carrier.get() : state_.get();
  MutexLock lk(&g->mu);
  const auto end = g->grant.lease_start + g->ctx->session->engine->params().lease;
  if (const auto* t = g->ctx->session->engine->params().trusted_until; t != nullptr) {
    // A cluster-mode lockd not seen alive: no lease lasts past that (issue 16, finding 4).
    const auto trusted = Clock::time_point(Clock::duration(t->load()));
    return std::min(end, trusted);
  }
  return end;
}

void LockHandle::OnLost(std::function<void(const Status&)> callback) {
  if (!state_ || state_->inherited()) return;
  std::optional<Status> untold;
  {
    MutexLock lk(&state_->mu);
    untold = std::exchange(state_->lost_untold, std::nullopt);
    if (!untold) {
      state_->on_lost = std::move(callback);
      return;
    }
  }
  if (callback) callback(*untold);  // lost before any callback was set: told now, here
}

Status LockHandle::Release() {
  if (!state_) return Error(ErrorCode::kNotHeld, "empty lock handle");
  // Kept alive for the call: a loss callback that ReleaseHeld's join failure runs on this thread
  // may drop the handle that owns this one (found by review, 2026-12-06).
  const std::shared_ptr<State> keep = state_;
  return ReleaseState(*keep, nullptr);
}

namespace {

Status ReleaseState(LockHandle::State& s, Teller* tell) {
  // In a forked child: the parent holds the lock; releasing it from here would release theirs.
  if (s.inherited()) return Client::Impl::InheritedError();
  auto impl = s.ctx->client.lock();
  const Client::Impl::LossCaller caller{&s, tell != nullptr};
  Status st = ReleaseHeld(s, impl.get(), tell, caller);
  // kNotHeld: released (or ended) before this call; no lease of it is in question.
  if (st.ok() || st.code() == ErrorCode::kLockLost || st.code() == ErrorCode::kNotHeld) return st;
  if (impl && st.code() == ErrorCode::kConnection) {
    impl->OnSessionError(s.ctx->session->gen, st, caller);
  }
  // A lease that ran out lost the lock before anything else failed (client.h: kLockLost,
  // nothing released), whatever that was: a broken connection, a join lockd refused.
  if (LeaseRanOut(s)) {
    return Error(ErrorCode::kLockLost,
                 "lease ran out before the release; lock lost, nothing released (then: " +
                     st.message() + ")");
  }
  // Not a loss: the lock was held until now, and what failed is the release (a connection, a
  // join refused), which the session's end or the client's reaper finishes.
  if (tell != nullptr) *tell = nullptr;
  return st;
}

// A rider (cohort.h) leaves its carrier's grant; the last one to leave releases the grant to
// lockd (ReleaseHeld on the carrier: the cohort entry passes on). A rider holds nothing remote
// of its own, so its release never fails but for the carrier's.
// The reader's loss (it is kReleased already), told as ReleaseHeld tells a holder's.
void LoseRider(LockHandle::State& r, Teller* tell) NO_THREAD_SAFETY_ANALYSIS {
  MutexLock lk(&r.mu);
  r.state = LockState::kLost;  // ended already (kReleased)
  if (tell != nullptr && !r.lost_reported) *tell = r.on_lost;
  r.lost_reported = true;
}

Status ReleaseRider(LockHandle::State& r, Client::Impl* impl,
                    Teller* tell) NO_THREAD_SAFETY_ANALYSIS {
  {
    MutexLock lk(&r.mu);
    if (r.state == LockState::kReleased) return Error(ErrorCode::kNotHeld, "lock already released");
    if (r.state == LockState::kLost) {
      return Error(ErrorCode::kLockLost, "lock was lost; nothing to release");
    }
    r.SetState(LockState::kReleased);
  }
  LockHandle::State& c = *r.carrier;
  // Whether the reader held the lock until now: the grant is held and its lease runs. Read while
  // the reader still counts among the grant's readers, so that no other reader can have released
  // the grant yet (only the last one does; read after leaving, a grant another reader released
  // meanwhile looked lost). A lapsed lease is never renewed again. And the grant's session must
  // still be the client's: after its end (another thread found it broken, and its EndLeases has
  // not come to the grant yet) the lock is lost, as a plain holder's release says (ReleaseHeld).
  // One atomic load, no client-wide mutex: this is a shared release's fast path.
  const bool current = impl != nullptr && impl->IsCurrent(*c.ctx->session);
  bool held = false;
  {
    MutexLock lk(&c.mu);
    held = current && c.state == LockState::kHeld &&
           c.ctx->session->engine->LeaseValid(c.grant, Clock::now());
  }
  if (!Client::Impl::LeaveShared(c, r)) {
    // Other readers still share the grant, so nothing goes to lockd; but the reader says, as the
    // last reader's release would (client.h: kLockLost if the lease lapsed), whether it held.
    if (impl != nullptr && !r.uncounted) impl->CountRiderRelease(held);
    if (held) return Status();
    LoseRider(r, tell);
    return Error(ErrorCode::kLockLost,
                 "the shared grant's lease ran out (or the grant was lost, or its session with "
                 "lockd ended) before the release; lock lost");
  }
  // The carrier is no owner's handle; a dropped rider is kReleased already, and told nothing.
  // A dropping thread runs no other handle's loss callback (the keeper tells them).
  Status st = ReleaseHeld(c, impl, nullptr, Client::Impl::LossCaller{nullptr, tell != nullptr});
  if (!st.ok()) LoseRider(r, tell);
  return st;
}

Status ReleaseHeld(LockHandle::State& s, Client::Impl* impl, Teller* tell,
                   Client::Impl::LossCaller caller) {
  if (s.carrier) return ReleaseRider(s, impl, tell);
  auto* state_ = &s;
  // The calling thread's connection first, before the handle's mutex: a thread with none joins
  // the session, and a join that fails ends it, whose EndLeases takes every handle's mutex (this
  // one's too, on this thread: it deadlocked).
  // Never waits for a reconnection (a deadline already past; no clock read for it). A handle
  // of a session that has ended joins nothing: it is lost whatever the join would give, and a
  // join lockd keeps busy is retried for a second (found by review, 2026-12-06).
  Result<ThreadChannel*> ch =
      !impl ? Result<ThreadChannel*>(Error(ErrorCode::kConnection, "closed"))
      : !impl->IsCurrent(*state_->ctx->session)
          ? Result<ThreadChannel*>(Error(ErrorCode::kLockLost,
                                         "session with lockd ended; lock lost, nothing released"))
          : impl->Channel(Clock::time_point{}, caller);
  // No connection because the session ended (another thread found it broken, and its EndLeases
  // has not come to this handle yet): the lock is lost, as it will be reported.
  if (!ch.ok() && ch.status().code() == ErrorCode::kConnection && impl &&
      impl->session() != state_->ctx->session) {
    ch = Error(ErrorCode::kLockLost, "session with lockd ended (" + ch.status().message() +
                                         "); lock lost, nothing released");
  }
  MutexLock lk(&state_->mu);
  if (state_->state == LockState::kReleased) {
    return Error(ErrorCode::kNotHeld, "lock already released");
  }
  if (state_->state == LockState::kLost) {
    return Error(ErrorCode::kLockLost, "lock was lost; nothing to release");
  }
  if (!impl) {
    state_->SetState(LockState::kLost);
    return Error(ErrorCode::kConnection,
                 "client closed before release; lockd frees the lock when the session ends");
  }
  if (ch.ok() && (*ch)->session != state_->ctx->session) {
    ch = Error(ErrorCode::kLockLost, "session with lockd ended; lock lost");
  }
  // A local waiter queued for this lock (cohort.h): the grant goes to it in-process, no RDMA
  // operation. Outside the channel's mutex (the cohort entry's mu is never held with it).
  // Each branch makes `st` in place (no Status is assigned or copied on the way, but the
  // channel's error).
  Status st = !ch.ok()                        ? ch.status()
              : impl->HandOver(*state_, **ch) ? Status()
                                              : ReleaseOnChannel(*state_, **ch, *impl);
  if (st.ok()) {
    state_->SetState(LockState::kReleased);
    ++(*ch)->releases;
  } else {
    // Lost, or the connection failed so the release may not have happened: either way this
    // process no longer holds a lock it can rely on.
    const bool refused_a_connection = !ch.ok() && ch.status().code() == ErrorCode::kResource;
    const bool lease_runs = state_->ctx->session->engine->LeaseValid(state_->grant, Clock::now());
    if (tell != nullptr) *tell = state_->on_lost;  // not reported before: it was held
    state_->LoseTold();
    if (ch.ok()) ++(*ch)->lost;
    // This thread could not join the session (its connection cap is taken), which goes on: the
    // client's reaper, on its own connection, releases the ticket and clears its record entry,
    // as for a ticket given up with requests behind it. Left, the ticket would wait for the
    // waiters' stall recovery (F x L), and the entry would stay live for the rest of the session
    // (docs/protocol.md §10). Only while the lease runs: the grant is then still this session's,
    // and no waiter has recovered it.
    if (refused_a_connection && lease_runs && impl->session() == state_->ctx->session) {
      // No waiter recovers a grant before its lease ends: its lease start bounds a skip.
      impl->Abandon(state_->ctx->session->gen, state_->grant.ticket, state_->grant.lease_start);
    }
  }
  return st;
}

}  // namespace

Status LockHandle::Renew() {
  if (!state_) return Error(ErrorCode::kNotHeld, "empty lock handle");
  if (state_->inherited()) return Client::Impl::InheritedError();
  // A rider (cohort.h) renews its carrier's grant, the one lease all its readers share; if that
  // finds the lock lost, every reader is told.
  // A lost lock says so, as Release does: kNotHeld is for one released (it was kNotHeld once the
  // keeper had marked the loss, kLockLost before: a race decided; found by review, 2026-12-06).
  const auto not_held = [](LockState st) {
    return st == LockState::kLost ? Error(ErrorCode::kLockLost, "lock was lost")
                                  : Error(ErrorCode::kNotHeld, "lock is not held");
  };
  auto impl = state_->ctx->client.lock();
  if (!impl) {
    // The client closed: its handles are lost (released ones stay released), as Release says
    // (it said kConnection; found by review, 2026-12-07).
    MutexLock lk(&state_->mu);
    return state_->state == LockState::kHeld
               ? Error(ErrorCode::kLockLost, "client closed; lock lost")
               : not_held(state_->state);
  }
  // The state kept alive for the call: a loss callback run on this thread by Channel() below (a
  // failed join ends the session) may drop the handle that owns it (found by review).
  const std::shared_ptr<State> keep = state_;
  const std::shared_ptr<State>& carrier = keep->carrier;
  if (carrier) {
    MutexLock lk(&keep->mu);
    if (keep->state != LockState::kHeld) return not_held(keep->state);
  }
  State* const s = carrier ? carrier.get() : keep.get();
  Status st;
  // The connection before the handle's mutex, as in ReleaseHeld (a failed join ends the session,
  // and ending it takes this handle's mutex).
  auto chr = impl->Channel(Clock::now());
  {
    MutexLock lk(&s->mu);
    if (s->state != LockState::kHeld) {
      return carrier ? Error(ErrorCode::kLockLost, "lock was lost") : not_held(s->state);
    }
    RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, std::move(chr));
    if (ch->session != s->ctx->session) {
      st = Error(ErrorCode::kLockLost, "session with lockd ended; lock lost");
    } else {
      {
        MutexLock clk(&ch->mu);
        st = ch->Reap();
        if (st.ok()) st = s->ctx->session->engine->Renew(*ch->mem, s->grant, &ch->events);
      }
      // Lost in this session, which goes on: its record entry goes (as the keeper's finding).
      if (st.code() == ErrorCode::kLockLost) Client::Impl::ClearLostEntry(*ch, *s);
    }
    if (st.code() == ErrorCode::kLockLost) s->SetState(LockState::kLost);
  }
  // The carrier is unlinked now, so no session's end reports it: tell its readers here.
  if (carrier && st.code() == ErrorCode::kLockLost) Client::Impl::ReportRidersLost(carrier, st);
  if (st.code() == ErrorCode::kConnection) impl->OnSessionError(s->ctx->session->gen, st);
  return st;
}

}  // namespace rdmalock
