// Client::Impl, declared once: the state a Client's threads share, and the parts that keep it.
// Not installed; included only by the SDK's own files, each implementing one concern (eRPC's
// rpc_impl/ idea):
//   client.cc               Client's calls: Connect, Lock*, LockMany*, ReleaseMany, Flush
//   client_channels.cc      construction, Close, each thread's channel, a session's start and end
//   client_keeper.cc        the keeper thread: heartbeats, renewals, liveness, reconnects
//   client_reaper.cc        the reaper thread: abandoned tickets, releases threads posted and left
//   client_async.cc         LockAsync: the pump and the waiter threads
//   client_introspection.cc Info, Inspect, InspectRange, Sessions
//   client_stats.cc         ClientStats: the counters' one sum
//   client_cohort.cc        cohort handover among the client's threads (cohort.h)
//   lock_handle.cc          LockHandle
//   client_test_peer.cc     ClientTestPeer (test hooks)
//
// Threads: the caller's threads (each with its own channel), the keeper, the reaper, and once an
// async acquire is made, the pump and kAsyncWaiters waiters. Each of the client's own threads
// holds a reference to the Impl until it ends (see Start).
//
// Lock order (a thread holding one may take those after it, never one before):
//   LockHandle::State::mu  ->  ThreadChannel::mu  ->  Impl::mu_
//   HeldList::mu_ is a leaf (taken under State::mu or none; nothing is taken under it).
//   LockHandle::State::mu  ->  sdk::CohortEntry::mu  ->  HeldList::mu_ (cohort handover,
//   cohort.h; an entry's mu is never held with a ThreadChannel::mu or Impl::mu_).
//   Impl::async_mu_ is never held with any other (it guards queues only).
//   A shared grant's rider and carrier (cohort.h): their State::mu are never held together;
//   the entry's mu, taken under either, guards the carrier's list of riders.
// The lock path (Lock, LockSlot, Release of an uncontended grant) takes only the calling
// thread's channel mutex, the handle's own and its channel's HeldList: nothing client-wide
// (issue 19). EntryPool and SlotBudget are lock-free, and so is the cohort table for a request
// that finds its entry free (cohort.h): an entry's mutex is taken only when threads of the
// client contend for one lock.
// A channel's mu is held across remote operations (which may wait out retransmissions): the
// reaper (ReapLeftReleases) and StopAsync only try-lock another thread's channel, and the
// keeper's renewals only try-lock a handle, so that none waits behind an owner's slow call. Loss
// callbacks run with none of these held.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/src/cohort.h"
#include "client/src/deadline.h"
#include "client/src/entry_pool.h"
#include "client/src/state_pool.h"
#include "common/sync/mutex.h"
#include "common/sync/spin_lock.h"
#include "common/sync/thread_annotations.h"
#include "engine/connection.h"
#include "engine/fork_guard.h"
#include "engine/lock_engine.h"
#include "rdmalock/client.h"
#include "rdmalock/proto/layout.h"

namespace rdmalock {

class ClientTestPeer;  // client_test_peer.h: the tests' seams

namespace sdk {

// One session with lockd: the handshake's answer, the engine for its parameters and its record.
// Constant once made (MakeSession), except trusted_until_ns (the keeper moves it; any thread
// reads it) and the engine's generation table (lock-free; any thread's acquire learns into it).
// Shared by the session's channels and handles.
struct Session {
  uint64_t gen = 0;    // the client's count of sessions, from 1
  std::string server;  // the lockd it is with (threads join it there)
  uint16_t port = 0;
  proto::AcceptReply reply;
  std::shared_ptr<EntryPool> pool;
  std::unique_ptr<LockEngine> engine;
  // A cluster-mode lockd's liveness timeout T (0: none): its leases count only while the keeper
  // has seen lockd's event loop tick within T. trusted_until_ns is that limit (steady-clock ns),
  // which the engine's LeaseValid applies to every grant of the session (issue 16, finding 4).
  std::chrono::nanoseconds liveness{0};
  mutable std::atomic<int64_t> trusted_until_ns{INT64_MAX};
};

// How many of a client's requests may be outstanding on one lock word at once (queued, held, or
// left to the reaper), so that all sessions together stay under the 32,767 one 16-bit field can
// count before it carries into its neighbour (issue 16, finding 11): 32,767 / max_sessions (31
// with lockd's default 1,024). Counted per bucket of slots (slot mod kBuckets; a lock table
// larger than that shares buckets, which only makes the count stricter). Lock-free; any thread.
class SlotBudget {
 public:
  static constexpr size_t kBuckets = 16384;
  static constexpr uint32_t kWordLimit = 32767;
  void SetSessions(uint64_t max_sessions) {
    per_slot_.store(static_cast<uint32_t>(
                        std::max<uint64_t>(1, kWordLimit / std::max<uint64_t>(1, max_sessions))),
                    std::memory_order_relaxed);
  }
  uint32_t per_slot() const { return per_slot_.load(std::memory_order_relaxed); }
  // One more request on `slot`, unless the client has per_slot() there already.
  bool Take(uint64_t slot) {
    std::atomic<uint32_t>& c = counts_[slot % kBuckets];
    if (c.fetch_add(1, std::memory_order_relaxed) >= per_slot()) {
      c.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  // One more that exists already (a ticket handed to the reaper): counted whatever the limit.
  void Force(uint64_t slot) { counts_[slot % kBuckets].fetch_add(1, std::memory_order_relaxed); }
  void Give(uint64_t slot) { counts_[slot % kBuckets].fetch_sub(1, std::memory_order_relaxed); }
  uint32_t Count(uint64_t slot) const {
    return counts_[slot % kBuckets].load(std::memory_order_relaxed);
  }
  Status Refusal(uint64_t slot) const;

 private:
  std::atomic<uint32_t> per_slot_{31};
  std::array<std::atomic<uint32_t>, kBuckets> counts_{};
};

// LatencyHistogram's buckets as counters one thread writes and any thread reads.
struct LatencyCounters {
  Counter buckets[LatencyHistogram::kBuckets];
  Counter count, sum_us;
  void Add(Clock::duration d);
  void AddTo(LatencyHistogram* h) const;
};

// The grants made on one channel that are still held (their LockHandle::State), so that the
// keeper can renew them and a session's end can report them lost. One list per channel, not one
// per client: the acquire and release paths link and unlink here under this list's own mutex,
// which only the channel's thread, the keeper and a session's end take, so that threads of one
// client never serialise on a client-wide lock (issue 19). A handle released on another thread
// unlinks itself from the list of the channel that granted it. Thread-safe; mu_ guards the links
// (State::held_prev/held_next/held_linked) and closed_. Lock order: State::mu -> HeldList::mu_
// (a leaf: nothing is taken while it is held). mu_ is a SpinLock: Link and Unlink hold it for a
// few stores, on every grant and release (issue 19: two std::mutex round trips per pair).
class HeldList {
 public:
  friend class ::rdmalock::ClientTestPeer;  // HoldHeldList: a fork while the lock is held
  // Links `s` (just granted; its mutex held by the caller). False once the list is closed: the
  // session ended, and `s` is not tracked (its grant is lost).
  bool Link(LockHandle::State* s) EXCLUDES(mu_);
  // Unlinks `s` if it is linked. Idempotent.
  void Unlink(LockHandle::State* s) EXCLUDES(mu_);
  // The states linked now, as strong references (one being destroyed meanwhile is skipped).
  // With `close`, the list also ends: everything is unlinked and nothing more will link.
  std::vector<std::shared_ptr<LockHandle::State>> Snapshot(bool close) EXCLUDES(mu_);

 private:
  SpinLock mu_;
  LockHandle::State* head_ GUARDED_BY(mu_) = nullptr;
  bool closed_ GUARDED_BY(mu_) = false;
};

// What every grant made on one channel refers to, in one object the channel makes once, so that
// a grant's state takes one reference count instead of one for each (issue 19, item 2: the
// lock path's atomic operations and instructions). Constant once made; any thread.
struct GrantContext {
  std::weak_ptr<Client::Impl> client;      // expired once the client is gone
  std::shared_ptr<const Session> session;  // the channel's session
  std::shared_ptr<SlotBudget> budget;      // the client's
  std::shared_ptr<HeldList> held;          // the channel's list of its grants
  std::shared_ptr<CohortTable> cohort;     // the client's table; null with local handover off
};

// One thread's connection to lockd (in one session) and what the engine did on it. `session`
// and `mem` are set before the channel is shared; the counters are written by the thread using
// the channel and read by any (Stats).
struct ThreadChannel {
  std::shared_ptr<const Session> session;
  std::unique_ptr<Connection> mem;
  const std::shared_ptr<HeldList> held = std::make_shared<HeldList>();  // grants made here
  // What this channel's grants refer to (Client::Impl::SetGrantContext where the channel is
  // made; for the connecting thread's first channel, JoinOwnThreads): set before the channel
  // makes a grant.
  std::shared_ptr<const GrantContext> grants;
  // Held by whoever uses `mem` and `pending`: the owning thread for its calls, the keeper and
  // the reaper when they reap a release the owner posted and left (they only try-lock).
  // `mem` is not GUARDED_BY it: Shutdown() and counters() are for any thread.
  Mutex mu;
  PendingRelease pending GUARDED_BY(mu);  // a release posted without waiting, not reaped yet
  uint64_t posts GUARDED_BY(mu) = 0;      // releases posted on this channel so far
  // `posts` while a posted release is outstanding, 0 when none: the reaper reaps a release it
  // finds outstanding, unchanged, on two of its ticks in a row (left by its thread). Read
  // without a clock, so that posting costs the owner no time stamp.
  std::atomic<uint64_t> pending_post{0};
  uint64_t reaper_seen = 0;  // owned by the reaper thread: pending_post at its last tick
  EngineEvents events;
  Counter acquires, releases, timeouts, lost, unrecorded, batches;
  Counter local_handovers;  // grants this channel's thread handed to another of the client's
  Counter local_shares;     // shared requests of this channel that joined a carrier in-process
  LatencyCounters latency;  // of the grants made on this channel

  // Reaps the posted release, if any.
  Status Reap() REQUIRES(mu);
  // A record entry for a new request from the session's pool; counts requests that go
  // unrecorded because the record is full (when recording is on).
  std::pair<uint64_t, uint32_t> TakeEntry(bool recording);
  // Notes whether a release is posted now (for the reaper).
  void NotePending() REQUIRES(mu);
  // Adds this channel's counters to `out` (client_stats.cc). Any thread.
  void AddStats(ClientStats* out) const;
};

// A channel's first READ of lockd's info page: its liveness timeout (0 for a lockd without one).
Result<std::chrono::nanoseconds> ReadLiveness(RemoteMemory& mem);

// One connection attempt's limit (client.cc).
std::chrono::milliseconds AttemptTimeout(std::chrono::milliseconds connect_timeout, bool moving);

// A handle MakeHandle made for a session that had ended meanwhile: the caller gets an error.
Status EndedWhileGranted();

// Lock(name), LockMany and LockAsync hash names with the lock count of the session they start
// in (`hashed_with`). A grant `s` made in a later session whose lockd has another lock count
// (restarted with a new configuration, or a standby configured otherwise) is of another slot
// than the name's there, where a client of that session takes the name's own: an error then (the
// caller drops the grant, which releases it), as for a request whose session ends while it waits.
Status SameNameMapping(const LockHandle::State& s, uint64_t hashed_with);
// The same for a request not yet made, with the current session's `lock_count`.
Status SameNameMapping(uint64_t hashed_with, uint64_t lock_count);

// Adds `from`'s counters to `to`: ClientStats's one field list (client_stats.cc).
void AddStats(const ClientStats& from, ClientStats* to);

// The connector of every client but the tests': VerbsMemory::Connect.
Result<std::unique_ptr<Connection>> VerbsConnect(const ChannelParams& p, uint32_t* retry_ms,
                                                 proto::RejectReason* reason);

// The call on a handle that may find the session broken, and so end it (OnSessionError): whose
// loss callbacks may run on this thread. client.h: a thread dropping a handle runs none (it may
// hold a mutex a callback takes: the keeper tells them all), and a Release() whose
// result says the lock was lost does not also tell its handle's callback (client.h).
struct LossCaller {
  const LockHandle::State* handle = nullptr;  // the handle the call is on (none: any call)
  bool dropping = false;                      // its owner drops it
  // More handles the call releases and tells by its result (ReleaseMany), as `handle`.
  std::span<LockHandle::State* const> releasing;

  bool ToldByResult(const LockHandle::State* s) const {
    if (dropping) return false;
    if (s == handle) return true;
    return std::find(releasing.begin(), releasing.end(), s) != releasing.end();
  }
};

}  // namespace sdk

// A granted lock, shared by its LockHandle and the client's handle list (renewal, loss reports).
// Hidden: nested in an exported class, it would be exported too.
struct [[gnu::visibility("hidden")]] LockHandle::State
    : public std::enable_shared_from_this<LockHandle::State> {
  // User-provided, so that std::allocate_shared's value-initialisation does not zero the whole
  // state before the member initialisers run (a 300-byte rep stosq on every grant; every member
  // has an initialiser).
  State() noexcept {}  // NOLINT(modernize-use-equals-default): `= default` would zero it
  // The last reference is going: no other thread can hold mu (the keeper may be looking at the
  // held list: Unlink waits for it, and the keeper skips a state it cannot lock a reference to).
  ~State() NO_THREAD_SAFETY_ANALYSIS {
    Settle();
    // Linked only while held: a released or lost state was unlinked already (no mutex to take).
    // Not in a forked child, as below: the list's spin lock may have been held by a parent's
    // thread at fork() (every grant and release takes it), and the child would spin for ever.
    if (ctx && held_linked.load(std::memory_order_acquire) && !inherited()) {
      ctx->held->Unlink(this);
    }
    // Still the cohort entry's owner (never left kHeld): pass the entry on. Not in a forked
    // child, whose entry mutexes may have been held by the parent's threads.
    if (cohort && !inherited()) {
      if (shares) cohort->Unshare(grant.ticket.slot, this);
      cohort->Leave(grant.ticket.slot);
    }
  }
  // Constant after construction.
  // fork_guard::Generation() when granted: in a forked child the handle is inert (its mutex may
  // have been held by one of the parent's threads, which the child does not have).
  const uint64_t fork_gen = fork_guard::Generation();
  bool inherited() const { return fork_guard::Generation() != fork_gen; }
  // The client, session, budget, held list and cohort table of the channel that made the state
  // (one reference for all of them). The grant holds one budget unit until it ends.
  std::shared_ptr<const sdk::GrantContext> ctx;
  // Links in `ctx->held`, guarded by that list's lock (HeldList's methods only). held_linked is
  // also read without it, by the destructor: once false it stays false (nothing links a state
  // twice).
  State* held_prev = nullptr;
  State* held_next = nullptr;
  std::atomic<bool> held_linked{false};
  // `state` has left kHeld (set under mu, read without it): dropping a handle whose lock was
  // released already costs no mutex.
  std::atomic<bool> ended{false};

  // Guarded by mu: the owner and the keeper (renewals, losses) both use it.
  Mutex mu;
  Grant grant GUARDED_BY(mu);
  LockState state GUARDED_BY(mu) = LockState::kHeld;
  bool settled GUARDED_BY(mu) = false;  // the budget unit was given back
  bool auto_renew GUARDED_BY(mu) = true;
  std::function<void(const Status&)> on_lost GUARDED_BY(mu);
  bool lost_reported GUARDED_BY(mu) = false;
  // Why the lock was lost, while no callback has been told (none was set when it was found lost):
  // OnLost tells a callback set later at once.
  std::optional<Status> lost_untold GUARDED_BY(mu);
  // Set while this state owns its slot's cohort entry (cohort.h): the grant came through the
  // cohort, remotely or handed over. Cleared when the state leaves kHeld (the entry is passed
  // on) or hands the grant over (the next holder's state owns the entry then). The table is
  // ctx->cohort, which outlives the state.
  sdk::CohortTable* cohort GUARDED_BY(mu) = nullptr;
  // Local handovers this remote grant has had before reaching this state (kMaxLocalHandovers).
  uint32_t local_run GUARDED_BY(mu) = 0;
  // The remote grant's fencing token (0: it has none), kept through local handovers: a holder
  // that asked for a token gets proto::LocalHandoverToken(remote_token, local_run) in
  // grant.token, one that did not gets 0 (cohort.h).
  uint64_t remote_token GUARDED_BY(mu) = 0;
  // The request wanted a fencing token (LockOptions::fencing_token, exclusive): a waiting
  // state's, set before it is queued; a grant from lockd has one iff it was wanted.
  bool wants_token GUARDED_BY(mu) = false;

  // Shared grants through the cohort (cohort.h, Client::Impl::CohortShare). A *rider* is a
  // reader's handle state: it holds no grant of its own (its `grant` is a copy for slot() and
  // mode(), settled, never linked) and refers to the carrier, whose grant the keeper renews.
  // `carrier` is set before the rider is published and constant after.
  std::shared_ptr<State> carrier;
  // A rider's links in its carrier's `riders` list, and a carrier's list: guarded by the
  // carrier's slot's cohort entry mutex (CohortEntry::mu; the analysis cannot name it).
  State* rider_prev = nullptr;
  State* rider_next = nullptr;
  bool rider_linked = false;
  State* riders = nullptr;
  // This state is a carrier (set before it is published, constant after).
  bool shares = false;
  // A rider whose join was undone before it was handed out (its acquire never counted): its
  // release counts in no statistic. Set before that release, by the joining thread.
  bool uncounted = false;

  // The grant's ticket: written once, before the handle exists (MakeHandle), never after (a
  // renewal moves the lease, not the ticket), so it is read without mu (LockHandle::slot, mode).
  const Ticket& ticket() const NO_THREAD_SAFETY_ANALYSIS { return grant.ticket; }
  // Leaves kHeld: the grant's budget unit goes back.
  void SetState(LockState to) REQUIRES(mu) {
    state = to;
    if (to != LockState::kHeld) {
      ended.store(true, std::memory_order_release);
      Settle();
      if (ctx) ctx->held->Unlink(this);  // nothing to renew or report any more
      // Released to lockd, or lost: the next local waiter (if any) goes to lockd itself; no
      // reader joins a carrier's grant from now on.
      if (cohort) {
        sdk::CohortTable* t = std::exchange(cohort, nullptr);
        if (shares) t->Unshare(grant.ticket.slot, this);
        t->Leave(grant.ticket.slot);
      }
    }
  }
  // Leaves kHeld as lost, when the caller tells the owner itself (a release's or an acquire's
  // error): OnLost is not called for it.
  void LoseTold() REQUIRES(mu) {
    SetState(LockState::kLost);
    lost_reported = true;
  }
  // Leaves kHeld as lost (`why`), and returns the OnLost callback to call with `why` (with no
  // mutex held), or an empty one if the loss was reported already or none is set: each loss is
  // reported once, to a callback set later if none is set now (lost_untold).
  std::function<void(const Status&)> Lose(const Status& why) REQUIRES(mu) {
    SetState(LockState::kLost);
    if (lost_reported) return {};
    lost_reported = true;
    if (!on_lost) lost_untold = why;
    return on_lost;
  }
  void Settle() REQUIRES(mu) {
    if (!settled && ctx) ctx->budget->Give(grant.ticket.slot);
    settled = true;
  }
};

namespace sdk {

// The mutexes of several handles held at once (Client::ReleaseMany), in the order taken, released
// together (or the last one alone). The analysis cannot follow a set of locks: a user of a held
// state's fields says so with state->mu.AssertHeld().
class HeldStates {
 public:
  HeldStates() = default;
  HeldStates(const HeldStates&) = delete;
  HeldStates& operator=(const HeldStates&) = delete;
  ~HeldStates() { UnlockAll(); }
  void Lock(LockHandle::State* s) NO_THREAD_SAFETY_ANALYSIS {
    s->mu.Lock();
    held_.push_back(s);
  }
  void UnlockLast() NO_THREAD_SAFETY_ANALYSIS {
    held_.back()->mu.Unlock();
    held_.pop_back();
  }
  void UnlockAll() NO_THREAD_SAFETY_ANALYSIS {
    for (LockHandle::State* s : held_) s->mu.Unlock();
    held_.clear();
  }

 private:
  std::vector<LockHandle::State*> held_;
};

}  // namespace sdk

// Hidden: nested in an exported class, it would be exported too.
class [[gnu::visibility("hidden")]] Client::Impl
    : public std::enable_shared_from_this<Client::Impl> {
 public:
  using Session = sdk::Session;
  using ThreadChannel = sdk::ThreadChannel;

  // ---- Construction and end (client_channels.cc)
  // `opts.server` and `.port` are where `first` is connected; `resolve` (may be empty) says where
  // to reconnect.
  Impl(ClientOptions opts, std::unique_ptr<Connection> first, std::chrono::nanoseconds liveness,
       Client::Resolver resolve, Connector connector);
  ~Impl() { Close(); }
  // Makes the keeper's and the reaper's connections of the first session, on the connecting
  // thread before Connect returns (ConnectImpl); Start hands them to the threads. lockd counts
  // every connection of a session against max_connections_per_session alike: made lazily, they
  // could find the application's threads holding them all, and a keeper without a connection
  // writes no heartbeat (lockd fences the live session), a reaper none leaves abandoned tickets
  // in their queues. A refusal for the cap fails Connect with kResource, naming the key.
  Status JoinOwnThreads() EXCLUDES(mu_);
  // Has the keeper call `callback(why)` soon, on its thread: a dropped handle's loss (Drop in
  // lock_handle.cc), told away from the thread that dropped it, which may hold what the callback
  // takes. Dropped if the client closes first (its owner is closing it).
  void TellLater(std::function<void(const Status&)> callback, Status why) EXCLUDES(mu_);
  // Starts the keeper and the reaper. Each thread holds a reference to the Impl until it ends,
  // so that one whose callback closes the client (Close then detaches it) goes on, until it
  // returns, on a live object (issue 17, finding 9). Called once, before the Client is made
  // (Client::Connect); kResource if a thread could not be started (~Client then closes it).
  Status Start() EXCLUDES(mu_);
  // Ends the session and stops the threads: ~Client calls it, on any thread, including one of
  // this client's own from inside a callback (a loss callback on the keeper or the reaper, an
  // async acquire's on the pump or a waiter). That thread cannot be joined from itself: it is
  // detached instead, and finishes what it was doing once the callback returns (its reference
  // keeps the Impl alive; everything it does next sees stopping_). Idempotent.
  void Close() EXCLUDES(mu_, async_mu_);

  // In a forked child, the client's connections are the parent's and its threads do not exist:
  // every call fails and nothing is torn down (issue 17, finding 11; fork_guard.h).
  bool inherited() const { return fork_guard::Generation() != fork_gen_; }
  static Status InheritedError();

  const ClientOptions& options() const { return opts_; }
  // The latest session, also while reconnecting (its lock count and lease still describe lockd).
  std::shared_ptr<const Session> latest_session() const EXCLUDES(mu_);
  // The current session; null while reconnecting.
  std::shared_ptr<const Session> session() const EXCLUDES(mu_);
  // Whether `s` is still the current session, without mu_ (one atomic load of gen_).
  bool IsCurrent(const Session& s) const { return gen_.load(std::memory_order_acquire) == s.gen; }

  // Counts a rider's release (cohort.h) that was not its grant's last, so that released
  // (`released`) or found lost: on this thread's channel when it has one in the current session
  // (its counters are this thread's to write), else among the retired counters (under mu_).
  void CountRiderRelease(bool released) EXCLUDES(mu_);

  // ---- Channels and sessions (client_channels.cc)
  using LossCaller = sdk::LossCaller;
  // This thread's channel in the current session, connected on first use. The fast path reads a
  // thread-local cache. While the client reconnects, waits for the new session until `deadline`.
  // A join that fails ends the session (OnSessionError; `caller` as there). `busy_retry`, if
  // given, is set to lockd's retry delay when the failure was lockd busy with handshakes and
  // `deadline` too near to retry (kResource; the session lives, and a later deadline may get
  // through), else to 0.
  Result<ThreadChannel*> Channel(Clock::time_point deadline = Clock::time_point::max(),
                                 LossCaller caller = {},
                                 std::chrono::milliseconds* busy_retry = nullptr) EXCLUDES(mu_);
  // This thread's channel in the current session if it has one, else nullptr: never joins,
  // never waits (Flush: a thread with no channel has posted nothing in this session).
  ThreadChannel* ExistingChannel() EXCLUDES(mu_);
  // `ch`, which Channel or ExistingChannel just returned on this thread, as an owning reference
  // (they leave it in the thread's cache); nullptr if it is not there any more.
  std::shared_ptr<ThreadChannel> OwnChannel(const ThreadChannel* ch) const;
  // A call on `gen`'s session failed. A connection error ends the session: every lock it held is
  // lost, its connections close (so lockd frees what they recorded), and the keeper reconnects.
  // The loss callbacks run on this thread, as `caller` allows (LossCaller): a dropping thread's
  // go to the keeper (TellLater), and the handle a Release() is on is told by its result.
  void OnSessionError(uint64_t gen, const Status& st, LossCaller caller = {}) EXCLUDES(mu_);
  // Makes a handle for a grant of `ch`'s session (counted, its latency from `started`, or from
  // the grant's first FETCH_AND_ADD (Grant::requested) when `started` is unset, to `completed`
  // recorded, and tracked for renewal). `completed`: ch.mem->last_completed() as the caller read
  // it under ch.mu, which it no longer holds.
  // `cohort`: the grant came to the owner of its cohort entry (the state owns it from now on).
  LockHandle MakeHandle(ThreadChannel & ch, const Grant& g, Clock::time_point completed,
                        bool auto_renew, Clock::time_point started,
                        sdk::CohortTable* cohort = nullptr) EXCLUDES(mu_);
  // Sets `ch`'s grant context (ThreadChannel::grants) from its session and held list: once,
  // when the channel is made, before it is shared.
  void SetGrantContext(ThreadChannel & ch);

  // A grant of `c`'s session that was just found lost (its lease ran out) while the session
  // lives: its record entry is cleared and goes back to the pool (client_keeper.cc says why).
  static void ClearLostEntry(ThreadChannel & c, LockHandle::State & s) REQUIRES(s.mu)
      EXCLUDES(c.mu);
  // Hands a ticket of session `gen` to the reaper thread, which releases it when its turn comes
  // (or drops it once skipped or gone) and clears its record entry (client_reaper.cc).
  // `watched`: no waiter can have skipped the ticket before watched + F x L (Ticket::watched;
  // the reaper leaves it to stall recovery if it cannot look at it before then).
  void Abandon(uint64_t gen, Ticket t, Clock::time_point watched) EXCLUDES(mu_);

  // ---- Cohort handover (client_cohort.cc, cohort.h)
  // The client's cohort table; null with ClientOptions::local_handover off.
  const std::shared_ptr<sdk::CohortTable>& cohort() const { return cohort_; }
  // An exclusive, token-free request's turn in the cohort: a handle handed over by a local
  // holder; an empty handle with *owner set (the caller owns the entry and acquires from lockd
  // on *ch, which may be a new channel after a wait), or with *owner clear (bypass: acquire
  // from lockd outside the cohort); or kBusy (ao.try_only), kTimeout, or the error of a session
  // that ended meanwhile. An unset *started (the caller read no clock) is set when the request
  // queues, so that its latency includes the wait. `cancel` (may be null): a queued request
  // gives up with kConnection once it is set and the table's WakeAll called (StopAsync).
  Result<LockHandle> CohortAcquire(ThreadChannel * *ch, uint64_t slot, const AcquireOptions& ao,
                                   bool auto_renew, Clock::time_point* started, bool* owner,
                                   const std::atomic<bool>* cancel = nullptr) EXCLUDES(mu_);
  // Hands `s`'s grant to the first local waiter, if one waits, the grant's lease still runs and
  // it has had fewer than kMaxLocalHandovers local handovers. True if it did: `s` no longer owns
  // the grant (or the entry, or a budget unit); the caller marks it released.
  bool HandOver(LockHandle::State & s, ThreadChannel & c) REQUIRES(s.mu);
  // A shared, auto-renewed request's turn in the cohort (cohort.h): a rider handle that joined
  // the session's shared grant of `slot` in-process; an empty handle with *owner set (the caller
  // owns the entry: acquire from lockd, then ShareGrant), or with *owner clear (acquire from
  // lockd outside the cohort: the entry is another slot's, an exclusive request holds it or
  // queues in it, the grant had its kMaxSharedJoins joins, or its lease ran out).
  // Used by blocking requests (LockSlot) and the pump (async ones); never fails.
  LockHandle CohortShare(ThreadChannel & ch, uint64_t slot, bool* owner) EXCLUDES(mu_);
  // CohortShare's join, for a request whose entry another of the client's requests owns: a rider
  // handle, or an empty one (acquire from lockd outside the cohort).
  LockHandle JoinShared(ThreadChannel & ch, uint64_t slot) EXCLUDES(mu_);
  // Whether a request in `mode` with `o` goes through the cohort as a reader (CohortShare).
  bool SharesInCohort(Mode mode, const LockOptions& o) const {
    return cohort_ != nullptr && mode == Mode::kShared && o.auto_renew && opts_.auto_renew;
  }
  // The entry owner's shared grant from lockd, `h` (made by MakeHandle with the cohort), becomes
  // the entry's carrier; the caller gets a rider on it. A handle lost already is returned as is.
  LockHandle ShareGrant(LockHandle h, ThreadChannel & ch) EXCLUDES(mu_);
  // Takes `rider` off `carrier`'s readers; true if it was the last (then no reader joins the
  // grant any more, and the caller releases it).
  static bool LeaveShared(LockHandle::State & carrier, LockHandle::State & rider);
  // A carrier's grant was lost: every rider on it is marked lost and told (its OnLost), with no
  // mutex held while the callbacks run. The carrier's loss callback; also called by a rider's
  // Renew that found the lock lost.
  static void ReportRidersLost(const std::shared_ptr<LockHandle::State>& carrier,
                               const Status& why);

  // ---- The reaper (client_reaper.cc)
  // A thread posted a release: make sure the reaper thread ticks fast enough to reap it if the
  // thread makes no further call.
  void ReleasePosted() EXCLUDES(mu_);
  void SlowDown() EXCLUDES(mu_);  // the reaper thread's

  // ---- Asynchronous acquires (client_async.cc; Client::LockSlotAsync)
  struct AsyncRequest {
    uint64_t slot = 0;
    Mode mode = Mode::kExclusive;
    LockOptions options;
    Clock::time_point deadline = Clock::time_point::max();
    Client::LockCallback done;                   // called once, by Finish or FinishGranted
    Clock::time_point submitted = Clock::now();  // where its latency starts
    bool holds_unit = true;    // the budget unit LockSlotAsync took is the request's
    uint64_t hashed_with = 0;  // LockAsync: the lock count its name was hashed with (else 0)
  };
  Status Submit(AsyncRequest req) EXCLUDES(async_mu_);
  // LockSlotAsync's checks and Submit; `hashed_with` as in AsyncRequest.
  Status SubmitLock(uint64_t slot, const LockOptions& options, Client::LockCallback done,
                    uint64_t hashed_with) EXCLUDES(async_mu_);

  // ---- Stats (client_stats.cc)
  ClientStats Stats() const EXCLUDES(mu_);

  // ---- Test hooks (ClientTestPeer)
  // Runs the test hook at a named point (client_test_peer.h lists them).
  void TestHook(std::string_view point) {
    if (test_hook_) test_hook_(point);
  }

  // Requests outstanding per lock word (finding 11); handles hold units too. Any thread.
  const std::shared_ptr<sdk::SlotBudget> budget_ = std::make_shared<sdk::SlotBudget>();

 private:
  friend class ClientTestPeer;
  struct AsyncWait {
    AsyncRequest req;
    Grant queued;
    bool frozen = false;
    uint64_t gen = 0;  // the session `queued` was issued in
    // Cohort handover (cohort.h): the request owns its slot's cohort entry (its grant will, or
    // it passes the entry on if it fails), or it was not issued because another of the
    // client's requests owns the entry: it waits in the cohort on a waiter thread.
    bool cohort_owner = false;
    bool cohort_queued = false;
    // A shared request that owns its entry: its grant becomes the entry's carrier (ShareGrant).
    bool cohort_share = false;
  };
  static constexpr size_t kAsyncBatch = 8;
  static constexpr int kAsyncWaiters = 4;
  // A wait still queued for a waiter thread this long past its deadline (every waiter thread
  // busy) is finished by the pump thread instead (FinishWait, which then gives up at once).
  static constexpr std::chrono::milliseconds kOverdueWait{10};
  // How long the pump waits for a session at a time before it looks at the queue again
  // (BatchChannel): a request queued meanwhile ends this late past its deadline at most.
  static constexpr auto kSessionWaitSlice = std::chrono::milliseconds(20);
  static constexpr std::chrono::milliseconds kReapTick{1};
  // How long a thread's join that lockd refuses busy is retried at least, whatever the call's
  // deadline (Channel): lockd caps a session's joins in progress (server/budgets.h).
  static constexpr std::chrono::milliseconds kJoinBusyFloor{1000};

  // client_channels.cc
  static void InitGrant(LockHandle::State & s, const Grant& g, bool auto_renew,
                        sdk::CohortTable* cohort) NO_THREAD_SAFETY_ANALYSIS;
  std::shared_ptr<const Session> MakeSession(
      const Connection& first, std::chrono::nanoseconds liveness, const std::string& server,
      uint16_t port) REQUIRES(mu_);
  // Marks every lock held on `chans` (an ending session's channels) lost, closes their held
  // lists, and calls the loss callbacks (as `caller` allows: LossCaller). Returns how many.
  size_t EndLeases(const std::vector<std::shared_ptr<ThreadChannel>>& chans, const Status& why,
                   LossCaller caller = {}) EXCLUDES(mu_);
  static void JoinOrDetach(std::thread & t, std::thread::id me);
  // A connection joining the session `reply` describes at server:port (a connect timeout of
  // `timeout`), retried while lockd is busy until `deadline`. A refusal for the session's
  // connection cap or lockd's resources, or busy past `deadline`, comes back as kResource (the
  // session goes on); *reason says which, and *busy_retry (if given, and only for busy past
  // `deadline`) lockd's retry delay, at least 1 ms.
  Result<std::unique_ptr<Connection>> Join(
      const std::string& server, uint16_t port, const proto::AcceptReply& reply,
      std::chrono::milliseconds timeout, Clock::time_point deadline, proto::RejectReason* reason,
      std::chrono::milliseconds* busy_retry = nullptr);
  // Why one of the client's own threads (`whose`) could not join its session.
  static Status OwnJoinError(std::string_view whose, const Status& st, proto::RejectReason reason);
  // Writes the next heartbeat (beats_) into the record `reply` names, over `mem`: while the
  // client's own connections are being made, before the keeper's loop runs, so that lockd's
  // heartbeat timeout never covers more than one handshake.
  Status WriteHeartbeat(RemoteMemory & mem, const proto::AcceptReply& reply);

  // client_reaper.cc
  void GiveAll(std::vector<ReapState> * pending);
  void ReaperLoop() EXCLUDES(mu_);
  void ReapLeftReleases() EXCLUDES(mu_);

  // client_keeper.cc
  void KeeperLoop() EXCLUDES(mu_);
  bool Reconnect(std::chrono::milliseconds * backoff) EXCLUDES(mu_);
  void RenewDue(ThreadChannel & c, std::chrono::nanoseconds lease) EXCLUDES(mu_, c.mu);
  // One tracked grant's turn in RenewDue: renews it if due, or finds it lost (*notify: the
  // callback to run once s.mu is released). True if a renewal failed (*st says why).
  bool RenewOne(ThreadChannel & c, LockHandle::State & s, std::chrono::nanoseconds lease,
                Status * st, std::function<void(const Status&)> * notify) REQUIRES(s.mu)
      EXCLUDES(mu_, c.mu);
  std::chrono::nanoseconds SmallJitter(std::chrono::milliseconds d);
  std::chrono::nanoseconds Jittered(std::chrono::milliseconds d);

  // client_async.cc
  // The request's budget unit goes back (it holds none from then on).
  void GiveUnit(AsyncRequest & r);
  // Completes `r` without a grant of its own (an error): the request's budget unit goes back.
  void Finish(AsyncRequest & r, Status st);
  // Completes `r` with a grant it did not ask lockd for (a shared grant it joined, which holds no
  // unit, or one handed over in the cohort, which brings its own): the request's unit goes back,
  // and the grant is checked as FinishGranted checks its own.
  void FinishAdopted(AsyncRequest & r, LockHandle h);
  // A waiter thread's acquire for `r` in session `gen` failed with `st` (its cohort entry passed
  // on already): ends the session if `st` says so, unless the client is closing, and finishes `r`.
  void FailWait(AsyncRequest & r, uint64_t gen, const Status& st) EXCLUDES(async_mu_, mu_);
  // Finish with `st`, for a request that got no grant: passes its cohort entry on if it owned it.
  void FinishUngranted(AsyncRequest & r, bool cohort_owner, Status st);
  // Completes `r` with the handle MakeHandle made for its own grant, which holds the request's
  // budget unit from now on; a handle lost at once completes it with EndedWhileGranted, and one
  // on a slot its name no longer maps to (lockd came back with another lock count since the
  // name was hashed: AsyncRequest::hashed_with) is released and completes it with kConnection.
  static void FinishGranted(AsyncRequest & r, LockHandle h);
  // The pump's channel for `batch`, owned: the pump runs the batch's callbacks while it goes on
  // using the channel, and a callback that locks through the client replaces this thread's
  // cached channel, which after the session's end was the channel's last owner (the pump's next
  // grant wrote to freed memory; found by review, 2026-12-08).
  Result<std::shared_ptr<sdk::ThreadChannel>> BatchChannel(std::vector<AsyncRequest> & batch)
      EXCLUDES(async_mu_, mu_);
  // Waits until there is a session, the client closes, or `until`: OK if there is a session,
  // else why not (kConnection), as Channel says it.
  Status WaitForSession(Clock::time_point until) EXCLUDES(mu_);
  Status WaitForSessionLocked(MutexLock & lk, Clock::time_point until) REQUIRES(mu_);
  void PumpLoop() EXCLUDES(async_mu_);
  void WaiterLoop() EXCLUDES(async_mu_);
  // The next wait for a waiter thread: the first in the queue, but a wait in the cohort only
  // while another waiter thread is left out of it (cohort_waiting_). Takeable says whether
  // there is one to take.
  bool TakeableLocked() const REQUIRES(async_mu_);
  std::deque<AsyncWait>::const_iterator FirstTakeableLocked() const REQUIRES(async_mu_);
  AsyncWait TakeWaitLocked() REQUIRES(async_mu_);
  // Moves the waits whose deadline is kOverdueWait past to `overdue`; returns when the next one
  // will be (time_point::max() if none has a deadline).
  Clock::time_point TakeOverdueLocked(Clock::time_point now, std::vector<AsyncWait> * overdue)
      REQUIRES(async_mu_);
  // Finishes one request the pump could not grant at once, on this thread's channel (a waiter
  // thread's, or the pump's for an overdue one: `overdue`, its deadline past, joins no session
  // for it; without a channel in the current session it times out at once).
  void FinishWait(AsyncWait & w, bool overdue = false) EXCLUDES(mu_, async_mu_);
  // An async request that waits in the cohort (AsyncWait::cohort_queued), on a waiter thread
  // whose channel is `ch`: completes it.
  void CohortWait(AsyncWait & w, ThreadChannel * ch) EXCLUDES(mu_, async_mu_);
  bool ClosingAsync() EXCLUDES(async_mu_);
  // `me`: the closing thread (if it is the pump or a waiter, it is detached, not joined).
  void StopAsync(std::thread::id me) EXCLUDES(mu_, async_mu_);

  // client_stats.cc
  ClientStats StatsLocked() const REQUIRES(mu_);

  // ---- Constant after construction
  const ClientOptions opts_;
  const Client::Resolver resolve_;  // empty: lockd is at opts_.server, opts_.port
  const Connector connector_;       // how every connection is made (VerbsConnect but in tests)
  const std::shared_ptr<sdk::CohortTable> cohort_;  // see cohort(); constant, shared with states
  uint64_t nonce_ = 0;  // set by the constructor: tells this Impl's thread caches apart
  const uint64_t fork_gen_ = fork_guard::Generation();  // see inherited()
  // Set before the client is used from other threads (ClientTestPeer::SetTestHook).
  std::function<void(std::string_view)> test_hook_;
  std::atomic<bool> renewals_paused_{false};         // ClientTestPeer::PauseRenewals
  std::atomic<bool> keeper_paused_{false};           // ClientTestPeer::PauseKeeper
  std::atomic<bool> release_reaping_paused_{false};  // ClientTestPeer::PauseReleaseReaping

  // ---- Atomics, any thread
  std::atomic<uint64_t> gen_{0};  // the current session's gen; 0 while there is none
  std::atomic<uint64_t> renewals_{0}, renew_failures_{0};
  std::atomic<bool> reap_fast_{false};  // releases are being posted: the reaper ticks every 1 ms
  // Set by StopAsync: async requests waiting in the cohort give up (CohortAcquire's `cancel`).
  std::atomic<bool> async_cancel_{false};
  // The heartbeat's last value: JoinOwnThreads and Reconnect write some, the keeper the rest
  // (lockd counts a change, so one sequence for all).
  std::atomic<uint64_t> beats_{0};

  // ---- Owned by the keeper thread
  std::minstd_rand rng_;
  // ---- Owned by the reaper thread
  int idle_reap_ticks_ = 0;

  // ---- Guarded by mu_
  mutable Mutex mu_;
  CondVar cv_;                           // session_, stopping_, the reaper's work
  bool closed_ GUARDED_BY(mu_) = false;  // Close() has begun
  bool stopping_ GUARDED_BY(mu_) = false;
  bool wake_reaper_ GUARDED_BY(mu_) = false;
  uint64_t last_gen_ GUARDED_BY(mu_) = 0;
  std::shared_ptr<const Session> session_ GUARDED_BY(mu_);  // null while reconnecting
  std::shared_ptr<const Session> latest_ GUARDED_BY(mu_);   // never null
  std::string last_error_ GUARDED_BY(mu_);
  std::unordered_map<std::thread::id, std::shared_ptr<ThreadChannel>> channels_ GUARDED_BY(mu_);
  ClientStats retired_ GUARDED_BY(mu_);  // counters of the connections of ended sessions
  std::deque<std::pair<uint64_t, Ticket>> abandoned_ GUARDED_BY(mu_);  // (session gen, ticket)
  uint64_t sessions_lost_ GUARDED_BY(mu_) = 0;
  uint64_t reconnects_ GUARDED_BY(mu_) = 0;
  // Losses of dropped handles, for the keeper to tell (TellLater).
  std::vector<std::pair<std::function<void(const Status&)>, Status>> told_later_ GUARDED_BY(mu_);

  // The keeper's and the reaper's connections of the first session, from JoinOwnThreads until
  // Start registers them under their threads' ids; reaper_id_ (set by Start) is where Reconnect
  // registers the reaper's connection of each new session.
  std::shared_ptr<ThreadChannel> keeper_own_ GUARDED_BY(mu_), reaper_own_ GUARDED_BY(mu_);
  std::thread::id reaper_id_ GUARDED_BY(mu_);

  // ---- Started by Start, joined (or detached) by Close
  std::thread reaper_;
  std::thread keeper_;

  // ---- Guarded by async_mu_
  Mutex async_mu_;
  CondVar async_cv_;  // the pump waits on it
  CondVar wait_cv_;   // the waiters wait on it
  bool async_stop_ GUARDED_BY(async_mu_) = false;
  std::deque<AsyncRequest> async_q_ GUARDED_BY(async_mu_);
  std::deque<AsyncWait> wait_q_ GUARDED_BY(async_mu_);
  // Waiter threads in CohortWait now: at most kAsyncWaiters - 1 (TakeWaitLocked), so that one is
  // always left for the owner's wait that they may wait behind.
  int cohort_waiting_ GUARDED_BY(async_mu_) = 0;
  std::vector<std::thread::id> waiter_ids_ GUARDED_BY(async_mu_);
  // Started by the first Submit (under async_mu_), joined by StopAsync once async_stop_ is set
  // (no Submit starts them any more).
  std::thread pump_;
  std::vector<std::thread> waiters_;
};

// Client::Resolver (private to Client): where lockd is now, asked before every (re)connection.
using Resolve = std::function<Result<std::pair<std::string, uint16_t>>()>;
// The first connection of a client and its Impl, through `connector` (client.cc).
Result<std::shared_ptr<Client::Impl>> ConnectImpl(const ClientOptions& options, Resolve resolve,
                                                  Connector connector);

}  // namespace rdmalock
