// Client::Impl's construction and end, each thread's channel, and a session's start and end
// (client_impl.h says which thread owns what).
#include <algorithm>
#include <random>
#include <string>
#include <system_error>

#include "client/src/client_impl.h"

namespace rdmalock {

using sdk::Session;
using sdk::ThreadChannel;

namespace sdk {

Status ThreadChannel::Reap() {
  if (!pending.active) return Status::Ok();
  Status st = session->engine->FinishRelease(*mem, &pending, &events);
  pending_post.store(0, std::memory_order_relaxed);
  if (st.code() == ErrorCode::kLockLost) {
    ++lost;  // released too late to count: waiters recover it (the holder was done with it)
    return Status::Ok();
  }
  return st;
}

std::pair<uint64_t, uint32_t> ThreadChannel::TakeEntry(bool recording) {
  auto e = session->pool->Take();
  if (e.first == 0 && recording) ++unrecorded;
  return e;
}

void ThreadChannel::NotePending() {
  if (pending.active) {
    // Sequentially consistent: before ReleasePosted's look at the reaper's flag (SlowDown).
    pending_post.store(++posts, std::memory_order_seq_cst);
  } else {
    pending_post.store(0, std::memory_order_relaxed);
  }
}

bool HeldList::Link(LockHandle::State* s) {
  SpinLockGuard lk(&mu_);
  if (closed_) return false;
  s->held_prev = nullptr;
  s->held_next = head_;
  if (head_ != nullptr) head_->held_prev = s;
  head_ = s;
  s->held_linked.store(true, std::memory_order_relaxed);
  return true;
}

void HeldList::Unlink(LockHandle::State* s) {
  SpinLockGuard lk(&mu_);
  if (!s->held_linked.load(std::memory_order_relaxed)) return;
  if (s->held_prev != nullptr) {
    s->held_prev->held_next = s->held_next;
  } else {
    head_ = s->held_next;
  }
  if (s->held_next != nullptr) s->held_next->held_prev = s->held_prev;
  s->held_prev = s->held_next = nullptr;
  s->held_linked.store(false, std::memory_order_release);
}

std::vector<std::shared_ptr<LockHandle::State>> HeldList::Snapshot(bool close) {
  std::vector<std::shared_ptr<LockHandle::State>> out;
  SpinLockGuard lk(&mu_);
  for (LockHandle::State* s = head_; s != nullptr;) {
    LockHandle::State* next = s->held_next;
    // A state whose last reference went is being destroyed: its destructor waits for mu_ to
    // unlink it (or finds it unlinked, when closing).
    if (auto strong = s->weak_from_this().lock()) out.push_back(std::move(strong));
    if (close) {
      s->held_prev = s->held_next = nullptr;
      s->held_linked.store(false, std::memory_order_release);
    }
    s = next;
  }
  if (close) {
    head_ = nullptr;
    closed_ = true;
  }
  return out;
}

}  // namespace sdk

Client::Impl::Impl(ClientOptions opts, std::unique_ptr<Connection> first,
                   std::chrono::nanoseconds liveness, Client::Resolver resolve, Connector connector)
    : opts_(std::move(opts)),
      resolve_(std::move(resolve)),
      connector_(std::move(connector)),
      cohort_(opts_.local_handover ? std::make_shared<sdk::CohortTable>() : nullptr) {
  std::random_device rd;
  nonce_ = (uint64_t{rd()} << 32) | rd();
  rng_.seed(rd());
  auto ch = std::make_shared<ThreadChannel>();
  ch->session = MakeSession(*first, liveness, opts_.server, opts_.port);
  ch->mem = std::move(first);
  session_ = ch->session;
  latest_ = session_;
  channels_[std::this_thread::get_id()] = std::move(ch);
}

Status Client::Impl::JoinOwnThreads() {
  std::shared_ptr<const Session> sess;
  std::shared_ptr<ThreadChannel> first;  // the connecting thread's: no other thread runs yet
  {
    MutexLock lk(&mu_);
    sess = session_;
    if (auto it = channels_.find(std::this_thread::get_id()); it != channels_.end()) {
      first = it->second;
    }
  }
  if (first == nullptr || first->session != sess) {
    return Error(ErrorCode::kInternal, "JoinOwnThreads: not on the connecting thread");
  }
  // The constructor made the first channel before the Impl had an owner (weak_from_this).
  SetGrantContext(*first);
  const auto deadline = Clock::now() + opts_.connect_timeout;
  constexpr std::string_view kWhose[2] = {"keeper (heartbeats, renewals)",
                                          "reaper (abandoned tickets)"};
  std::shared_ptr<ThreadChannel> own[2];
  for (int i = 0; i < 2; ++i) {
    {
      // lockd's heartbeat clock runs from the first connection's admission.
      MutexLock clk(&first->mu);
      RDMALOCK_RETURN_IF_ERROR(WriteHeartbeat(*first->mem, sess->reply));
    }
    auto reason = proto::RejectReason::kNone;
    auto mem =
        Join(sess->server, sess->port, sess->reply, opts_.connect_timeout, deadline, &reason);
    // (A connection made already closes with `own`, the first with the Impl.)
    if (!mem.ok()) return OwnJoinError(kWhose[i], mem.status(), reason);
    own[i] = std::make_shared<ThreadChannel>();
    own[i]->session = sess;
    own[i]->mem = std::move(mem).value();
    SetGrantContext(*own[i]);
  }
  {
    MutexLock clk(&first->mu);
    RDMALOCK_RETURN_IF_ERROR(WriteHeartbeat(*first->mem, sess->reply));
  }
  MutexLock lk(&mu_);
  keeper_own_ = std::move(own[0]);
  reaper_own_ = std::move(own[1]);
  return Status::Ok();
}

Status Client::Impl::WriteHeartbeat(RemoteMemory& mem, const proto::AcceptReply& reply) {
  RemoteOp w = RemoteOp::Write(RegionId::kSessions,
                               reply.session_record_offset + proto::SessionRecord::kHeartbeat,
                               beats_.fetch_add(1, std::memory_order_relaxed) + 1);
  return mem.Execute(std::span<RemoteOp>(&w, 1));
}

Status Client::Impl::OwnJoinError(std::string_view whose, const Status& st,
                                  proto::RejectReason reason) {
  if (reason == proto::RejectReason::kTooManyConnections) {
    return Error(ErrorCode::kResource,
                 "lockd's max_connections_per_session leaves no connection for the client's " +
                     std::string(whose) +
                     ": a client needs one each for its keeper and its reaper besides one per "
                     "thread that locks, so 3 at least (" +
                     st.message() + ")");
  }
  return Error(st.code(), "the client's " + std::string(whose) +
                              " could not join its session: " + st.message());
}

Status Client::Impl::Start() {
  // Under mu_ until the channels are registered: each thread's loop begins by taking it.
  MutexLock lk(&mu_);
  try {
    TestHook("starting threads");
    reaper_ = std::thread([self = shared_from_this()] { self->ReaperLoop(); });
    keeper_ = std::thread([self = shared_from_this()] { self->KeeperLoop(); });
  } catch (const std::system_error& e) {  // no thread to be had now (EAGAIN); Close joins any
    return Error(ErrorCode::kResource,
                 std::string("cannot start the client's keeper and reaper threads: ") + e.what());
  }
  reaper_id_ = reaper_.get_id();
  if (keeper_own_ && keeper_own_->session == session_) channels_[keeper_.get_id()] = keeper_own_;
  if (reaper_own_ && reaper_own_->session == session_) channels_[reaper_id_] = reaper_own_;
  keeper_own_.reset();
  reaper_own_.reset();
  return Status::Ok();
}

void Client::Impl::Close() {
  const auto me = std::this_thread::get_id();
  {
    MutexLock lk(&mu_);
    if (closed_) return;
    closed_ = true;
  }
  cv_.SignalAll();  // a thread waiting for a session (WaitForSessionLocked) gives up
  StopAsync(me);
  {
    MutexLock lk(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  JoinOrDetach(reaper_, me);
  JoinOrDetach(keeper_, me);
  std::vector<std::shared_ptr<ThreadChannel>> chans;
  {
    MutexLock lk(&mu_);
    for (auto& [tid, ch] : channels_) chans.push_back(ch);
  }
  // Posted releases first, so that what this client released is released at lockd.
  for (auto& ch : chans) {
    MutexLock lk(&ch->mu);
    (void)ch->Reap();
  }
  // The session ends with the client: locks still held are lost from here on, then the
  // connections close (threads' caches may keep the objects a while, disconnected), and lockd
  // frees what the record shows.
  (void)EndLeases(chans, Error(ErrorCode::kConnection, "client closed"));
  for (auto& ch : chans) ch->mem->Shutdown();
}

Status Client::Impl::InheritedError() {
  return Error(ErrorCode::kUnsupported,
               "this client was inherited across fork(): its connections are the parent "
               "process's, which keeps its session and locks; a child connects a client of its "
               "own (after exec)");
}

std::shared_ptr<const sdk::Session> Client::Impl::latest_session() const {
  MutexLock lk(&mu_);
  return latest_;
}

std::shared_ptr<const sdk::Session> Client::Impl::session() const {
  MutexLock lk(&mu_);
  return session_;
}

Status Client::Impl::WaitForSessionLocked(MutexLock& lk, Clock::time_point until) {
  // closed_ too: Close() joins the async threads (StopAsync) before it sets stopping_, and one
  // waiting here for a new session waited out its connect timeout, and Close with it (found by
  // review). A live session is still given until stopping_: a handle released meanwhile on a
  // thread with no channel joins it (refused, its release ended the session).
  while (session_ == nullptr && !stopping_ && !closed_ && opts_.reconnect) {
    if (cv_.WaitUntil(lk, until) == std::cv_status::timeout) break;
  }
  if (stopping_ || (closed_ && session_ == nullptr)) {
    return Error(ErrorCode::kConnection, "client closed");
  }
  if (session_ == nullptr) {
    return Error(ErrorCode::kConnection,
                 opts_.reconnect ? "not connected to lockd (reconnecting: " + last_error_ + ")"
                                 : "session with lockd ended: " + last_error_);
  }
  return Status::Ok();
}

Status Client::Impl::WaitForSession(Clock::time_point until) {
  MutexLock lk(&mu_);
  return WaitForSessionLocked(lk, until);
}

namespace {
// The calling thread's channel of the client it used last (Client::Impl::Channel's fast path).
struct ChannelCache {
  const Client::Impl* impl = nullptr;
  uint64_t nonce = 0;
  uint64_t gen = 0;
  std::shared_ptr<ThreadChannel> ch;  // keeps the channel alive while this thread uses it
};
thread_local ChannelCache cache;

// The calling thread's channel of `impl` (told apart by `nonce`) in session `gen`, if cached.
ThreadChannel* Cached(const Client::Impl* impl, uint64_t nonce, uint64_t gen) {
  return cache.impl == impl && cache.nonce == nonce && cache.gen == gen && gen != 0 ? cache.ch.get()
                                                                                    : nullptr;
}
}  // namespace

void Client::Impl::CountRiderRelease(bool released) {
  if (ThreadChannel* ch = Cached(this, nonce_, gen_.load(std::memory_order_acquire))) {
    ++(released ? ch->releases : ch->lost);
    return;
  }
  MutexLock lk(&mu_);
  ++(released ? retired_.releases : retired_.lost);
}

std::shared_ptr<sdk::ThreadChannel> Client::Impl::OwnChannel(const ThreadChannel* ch) const {
  return cache.impl == this && cache.nonce == nonce_ && cache.ch.get() == ch ? cache.ch : nullptr;
}

sdk::ThreadChannel* Client::Impl::ExistingChannel() {
  if (inherited()) return nullptr;  // before any lock: a parent's thread may hold it
  const uint64_t gen = gen_.load(std::memory_order_acquire);
  if (ThreadChannel* ch = Cached(this, nonce_, gen)) return ch;
  MutexLock lk(&mu_);
  const auto it = channels_.find(std::this_thread::get_id());
  if (it == channels_.end() || session_ == nullptr || it->second->session != session_) {
    return nullptr;
  }
  cache = {this, nonce_, it->second->session->gen, it->second};  // keeps it alive, as Channel
  return it->second.get();
}

Result<sdk::ThreadChannel*> Client::Impl::Channel(Clock::time_point deadline, LossCaller caller,
                                                  std::chrono::milliseconds* busy_retry) {
  if (busy_retry != nullptr) *busy_retry = std::chrono::milliseconds(0);
  if (inherited()) return InheritedError();  // before any lock: a parent's thread may hold it
  if (ThreadChannel* ch = Cached(this, nonce_, gen_.load(std::memory_order_acquire))) return ch;
  const auto tid = std::this_thread::get_id();
  std::shared_ptr<const Session> sess;
  {
    MutexLock lk(&mu_);
    if (Status st =
            WaitForSessionLocked(lk, std::min(deadline, Clock::now() + opts_.connect_timeout));
        !st.ok()) {
      return st;
    }
    if (auto it = channels_.find(tid); it != channels_.end()) {
      cache = {this, nonce_, it->second->session->gen, it->second};
      return it->second.get();
    }
    sess = session_;
  }
  // lockd may refuse a thread's join while the session itself is fine: too many handshakes at
  // once (retried within the connect timeout) or the session's connection limit (this thread
  // gets kResource; the session and the other threads go on). A busy join is retried for at
  // least kJoinBusyFloor whatever the call's deadline: a try-lock's, a renewal's or a release's
  // is now or past, and lockd refuses a session's joins busy past 16 in progress, which 17
  // threads starting together meet (their try-lock failed, their release lost the lock; found
  // by review, 2026-12-06). Not for the async pump (busy_retry set): it must not sleep here, and
  // retries the batch itself.
  const auto now = Clock::now();
  const auto join_deadline =
      std::min(busy_retry != nullptr ? deadline : std::max(deadline, now + kJoinBusyFloor),
               now + opts_.connect_timeout);
  auto reason = proto::RejectReason::kNone;
  auto mem = Join(sess->server, sess->port, sess->reply, opts_.connect_timeout, join_deadline,
                  &reason, busy_retry);
  if (!mem.ok()) {
    if (mem.status().code() != ErrorCode::kResource) {
      OnSessionError(sess->gen, mem.status(), caller);
    }
    return mem.status();
  }
  auto ch = std::make_shared<ThreadChannel>();
  ch->session = sess;
  ch->mem = std::move(mem).value();
  SetGrantContext(*ch);
  MutexLock lk(&mu_);
  // Close() has begun meanwhile: it ends the channels it finds, and this one would not be.
  if (stopping_) return Error(ErrorCode::kConnection, "client closed");
  if (session_ != sess) return Error(ErrorCode::kConnection, "session with lockd ended");
  channels_[tid] = ch;
  cache = {this, nonce_, sess->gen, ch};
  return ch.get();
}

Result<std::unique_ptr<Connection>> Client::Impl::Join(const std::string& server, uint16_t port,
                                                       const proto::AcceptReply& reply,
                                                       std::chrono::milliseconds timeout,
                                                       Clock::time_point deadline,
                                                       proto::RejectReason* reason,
                                                       std::chrono::milliseconds* busy_retry) {
  ChannelParams p{server,           port,          timeout, opts_.client_name, proto::kFlagJoin,
                  reply.session_id, reply.join_key};
  p.auth_key = opts_.auth_key;
  for (;;) {
    uint32_t retry_ms = 0;
    *reason = proto::RejectReason::kNone;
    auto mem = connector_(p, &retry_ms, reason);
    if (mem.ok()) return mem;
    if (*reason == proto::RejectReason::kTooManyConnections ||
        *reason == proto::RejectReason::kNoResources) {
      return Error(ErrorCode::kResource, mem.status().message());
    }
    if (*reason == proto::RejectReason::kBusy) {
      if (Clock::now() + std::chrono::milliseconds(retry_ms) < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(retry_ms));
        continue;
      }
      // No time left to retry: this thread's call fails, as for the connection cap; lockd
      // being busy for a moment says nothing about the session (it ended it, as kRejected).
      if (busy_retry != nullptr) {
        *busy_retry = std::max(std::chrono::milliseconds(1), std::chrono::milliseconds(retry_ms));
      }
      return Error(ErrorCode::kResource,
                   "lockd is busy with other handshakes: " + mem.status().message());
    }
    return mem.status();
  }
}

void Client::Impl::OnSessionError(uint64_t gen, const Status& st, LossCaller caller) {
  if (st.code() != ErrorCode::kConnection && st.code() != ErrorCode::kRejected &&
      st.code() != ErrorCode::kProtocol) {
    return;
  }
  std::vector<std::shared_ptr<ThreadChannel>> old;
  {
    MutexLock lk(&mu_);
    if (session_ == nullptr || session_->gen != gen) return;  // already handled
    session_ = nullptr;
    gen_.store(0, std::memory_order_release);
    last_error_ = st.message();
    // Keep the counters of the connections that close now. Only theirs: StatsLocked() would
    // add the client-wide ones (renewals, losses, reconnects) and the earlier retired_ too,
    // which Stats() adds again (each loss counted them once more: n losses read n + n(n-1)/2).
    for (const auto& [tid, ch] : channels_) ch->AddStats(&retired_);
    for (auto& [tid, ch] : channels_) old.push_back(ch);
    channels_.clear();
    ++sessions_lost_;
  }
  cv_.SignalAll();
  TestHook("session_ended");
  // Locks first, then connections: when lockd sees them close it may free those locks at once.
  (void)EndLeases(
      old,
      Error(ErrorCode::kLockLost, "session with lockd ended (" + st.message() + "); lock lost"),
      caller);
  // Releases posted on these connections and not reaped yet, as Close does: a reader's whose CAS
  // missed is tried again here. Its caller was told ok and its record entry reads done, so lockd
  // releases nothing of it; shut down unfinished, its ticket stayed counted in the word until the
  // waiters' stall recovery (F x L). A connection that failed fails the reap at once (a QP in the
  // error state flushes); one that cannot reach lockd fails when its posted CAS's retransmissions
  // run out, which a release posted before the failure was found has mostly spent already. One
  // another thread is using is left (try-lock: that thread finds the session's end itself).
  for (auto& ch : old) {
    if (!ch->mu.TryLock()) continue;
    (void)ch->Reap();
    ch->mu.Unlock();
  }
  for (auto& ch : old) ch->mem->Shutdown();
}

std::shared_ptr<const sdk::Session> Client::Impl::MakeSession(const Connection& first,
                                                              std::chrono::nanoseconds liveness,
                                                              const std::string& server,
                                                              uint16_t port) {
  const proto::AcceptReply& reply = first.reply();
  budget_->SetSessions(reply.max_sessions);
  auto s = std::make_shared<Session>();
  s->liveness = liveness;
  if (liveness > std::chrono::nanoseconds::zero()) {
    s->trusted_until_ns.store((first.connect_started() + liveness).time_since_epoch().count());
  }
  s->gen = ++last_gen_;
  s->server = server;
  s->port = port;
  s->reply = reply;
  const uint32_t entries =
      opts_.record_requests ? std::min(reply.record_entries, proto::SessionRecord::kMaxEntries) : 0;
  s->pool = std::make_shared<EntryPool>(reply.session_record_offset, entries);
  EngineParams p;
  p.lock_count = reply.lock_count;
  p.lease = std::chrono::nanoseconds(reply.lease_ns);
  p.stall_factor = reply.stall_factor;
  p.epoch = static_cast<uint16_t>(reply.epoch);
  if (liveness > std::chrono::nanoseconds::zero()) p.trusted_until = &s->trusted_until_ns;
  // The engine is the session's, and so is the pool, which outlives it (declared before it in
  // Session): whoever calls the engine holds the session, so a raw pointer will do, and the
  // release path does not lock a weak reference (an atomic on a line all threads share).
  EntryPool* pool = s->pool.get();
  const uint64_t gen = s->gen;
  s->engine = std::make_unique<LockEngine>(
      p, [this, gen](const Ticket& t) { Abandon(gen, t, t.watched); },
      [pool](uint64_t record) { pool->Give(record); });
  gen_.store(s->gen, std::memory_order_release);
  return s;
}

size_t Client::Impl::EndLeases(const std::vector<std::shared_ptr<ThreadChannel>>& chans,
                               const Status& why, LossCaller caller) {
  // Each channel's list is closed as it is read: a grant made on one of these channels from now
  // on is not tracked, and its handle reports the loss at once (MakeHandle).
  std::vector<std::shared_ptr<LockHandle::State>> all;
  for (const auto& ch : chans) {
    auto held = ch->held->Snapshot(/*close=*/true);
    all.insert(all.end(), std::make_move_iterator(held.begin()),
               std::make_move_iterator(held.end()));
  }
  // Every lock is lost before the first callback runs: one may close the client, which shuts
  // the connections down (and lockd frees the locks) while the others are still reported.
  size_t n = 0;
  std::vector<std::function<void(const Status&)>> notify;
  for (auto& s : all) {
    MutexLock lk(&s->mu);
    if (s->state != LockState::kHeld) continue;
    ++n;
    if (caller.ToldByResult(s.get())) {
      s->LoseTold();  // the call's result tells it: no callback, now or when one is set later
      continue;
    }
    auto cb = s->Lose(why);
    if (!cb) continue;
    if (caller.dropping) {
      // The owner of caller.handle drops it, maybe under a mutex a callback takes: every loss
      // goes to the keeper (the others ran here, on the dropping thread; found by review).
      TellLater(std::move(cb), why);
    } else {
      notify.push_back(std::move(cb));
    }
  }
  // Readers the call releases that share a grant (cohort.h) were not in the lists: their grant
  // was, and its loss reaches each of them through its callback (ReportRidersLost, in `notify`).
  // The call's result tells these, as for the handles above (found by review, 2026-12-06).
  for (LockHandle::State* r : caller.releasing) {
    if (caller.dropping || r == nullptr || !r->carrier) continue;
    const bool ending = std::any_of(chans.begin(), chans.end(), [&](const auto& ch) {
      return ch->session == r->carrier->ctx->session;
    });
    if (!ending) continue;
    MutexLock lk(&r->mu);
    if (r->state == LockState::kHeld) r->LoseTold();
  }
  for (auto& f : notify) f(why);
  return n;
}

void Client::Impl::JoinOrDetach(std::thread& t, std::thread::id me) {
  if (!t.joinable()) return;
  if (t.get_id() == me) {
    t.detach();  // closing from this thread's own callback: it ends by itself
  } else {
    t.join();
  }
}

// A new state's fields, before any other thread can see it (HeldList::Link publishes it): its
// mutex is not needed yet, and the acquire path saves taking it.
void Client::Impl::InitGrant(LockHandle::State& s, const Grant& g, bool auto_renew,
                             sdk::CohortTable* cohort) {
  s.grant = g;
  s.remote_token = g.token;
  s.auto_renew = auto_renew;
  s.cohort = cohort;
  // Local waiters spin behind a grant lockd gave at once (no other session was queued ahead
  // of it: CohortEntry::held_here).
  if (cohort != nullptr && g.ticket.mode == Mode::kExclusive && g.ticket.word.Drained()) {
    cohort->MarkHeld(g.ticket.slot);
  }
}

void Client::Impl::SetGrantContext(ThreadChannel& ch) {
  ch.grants = std::make_shared<const sdk::GrantContext>(
      sdk::GrantContext{weak_from_this(), ch.session, budget_, ch.held, cohort_});
}

LockHandle Client::Impl::MakeHandle(ThreadChannel& ch, const Grant& g, Clock::time_point completed,
                                    bool auto_renew, Clock::time_point started,
                                    sdk::CohortTable* cohort) {
  ++ch.acquires;
  // Until `completed`, the completion of the channel's last operation (the one that showed the
  // grant, or a READ after it): a clock reading the acquire path had taken already. The caller
  // read it under the channel's mutex. (Reading it after the unlock would be safe today only
  // because every acquire leaves no posted release pending, so the reaper's ReapLeftReleases,
  // which may lock the channel then, has nothing to execute there; this does not lean on that.)
  ch.latency.Add(completed - (started == Clock::time_point{} ? g.requested : started));
  auto state = std::allocate_shared<LockHandle::State>(sdk::StateAllocator<LockHandle::State>());
  state->ctx = ch.grants;  // the caller took this grant's budget unit
  // With the cohort entry before Link: a grant lost at once (below) passes it on.
  InitGrant(*state, g, auto_renew, cohort);
  // Linked atomically with the session's end: a grant of a session whose EndLeases has closed
  // this channel's list already (lockd frees the grant once the connections close) is not
  // tracked, and its handle reports the loss at once (the caller returns EndedWhileGranted).
  // Close() ends the lists too, so a grant that races with it is lost the same way. Link
  // publishes the state (its list's mutex orders these writes before the keeper's reads).
  // Past a cluster-mode lockd's liveness limit the session's leases are not trusted (the keeper
  // ends the session at its next look): a grant whose operations completed after it is lost at
  // once too, and its caller gets an error. (INT64_MAX without a limit: never.)
  const bool linked = ch.held->Link(state.get());
  const bool untrusted = completed.time_since_epoch().count() >=
                         ch.session->trusted_until_ns.load(std::memory_order_acquire);
  if (!linked || untrusted) {
    {
      MutexLock lk(&state->mu);
      state->LoseTold();
    }
    // The session may yet go on (the keeper sees lockd tick again before it looks at the limit):
    // the grant, lockd's still, goes to the reaper, which releases it and clears its entry. (A
    // session that ends first has lockd free it from the record.)
    // No waiter recovers a grant before its lease ends: its lease start bounds a skip.
    if (linked) Abandon(ch.session->gen, g.ticket, g.lease_start);
  }
  return LockHandle(std::move(state));
}

}  // namespace rdmalock
