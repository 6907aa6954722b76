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
//   lock_handle.cc          LockHandle
//   client_test_peer.cc     ClientTestPeer (test hooks)
//
// Threads: the caller's threads (each with its own channel), the keeper, the reaper, and once an
// async acquire is made, the pump and kAsyncWaiters waiters. Each of the client's own threads
// holds a reference to the Impl until it ends (see Start).
//
// Lock order (a thread holding one may take those after it, never one before):
//   LockHandle::State::mu  ->  ThreadChannel::mu  ->  Impl::mu_
//   Impl::async_mu_ is never held with any other (it guards queues only).
// A channel's mu is held across remote operations (which may wait out retransmissions): the
// reaper (ReapLeftReleases) and StopAsync only try-lock another thread's channel, and the
// keeper's renewals only try-lock a handle, so that none waits behind an owner's slow call. Loss
// callbacks run with none of these held.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/src/entry_pool.h"
#include "common/sync/mutex.h"
#include "common/sync/thread_annotations.h"
#include "engine/connection.h"
#include "engine/fork_guard.h"
#include "engine/lock_engine.h"
#include "rdmalock/client.h"
#include "rdmalock/proto/layout.h"

namespace rdmalock {

namespace sdk {

// One session with lockd: the handshake's answer, the engine for its parameters and its record.
// Constant once made (MakeSession), except trusted_until_ns (the keeper moves it; any thread
// reads it). Shared by the session's channels and handles.
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

// One thread's connection to lockd (in one session) and what the engine did on it. `session`
// and `mem` are set before the channel is shared; the counters are written by the thread using
// the channel and read by any (Stats).
struct ThreadChannel {
  std::shared_ptr<const Session> session;
  std::unique_ptr<Connection> mem;
  // Held by whoever uses `mem` and `pending`: the owning thread for its calls, the keeper and
  // the reaper when they reap a release the owner posted and left (they only try-lock).
  // `mem` is not GUARDED_BY it: Shutdown() and counters() are for any thread.
  Mutex mu;
  PendingRelease pending GUARDED_BY(mu);  // a release posted without waiting, not reaped yet
  std::atomic<int64_t> pending_since{0};  // steady-clock ns when posted; 0: none
  EngineEvents events;
  Counter acquires, releases, timeouts, lost, unrecorded, batches;
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

// Adds `from`'s counters to `to`: ClientStats's one field list (client_stats.cc).
void AddStats(const ClientStats& from, ClientStats* to);

// The connector of every client but the tests': VerbsMemory::Connect.
Result<std::unique_ptr<Connection>> VerbsConnect(const ChannelParams& p, uint32_t* retry_ms,
                                                 proto::RejectReason* reason);

}  // namespace sdk

// A granted lock, shared by its LockHandle and the client's handle list (renewal, loss reports).
// Hidden: nested in an exported class, it would be exported too.
struct [[gnu::visibility("hidden")]] LockHandle::State {
  // The last reference is going: no other thread can hold mu.
  ~State() NO_THREAD_SAFETY_ANALYSIS { Settle(); }
  // Constant after construction.
  // fork_guard::Generation() when granted: in a forked child the handle is inert (its mutex may
  // have been held by one of the parent's threads, which the child does not have).
  const uint64_t fork_gen = fork_guard::Generation();
  bool inherited() const { return fork_guard::Generation() != fork_gen; }
  std::weak_ptr<Client::Impl> client;
  std::shared_ptr<const sdk::Session> session;
  std::shared_ptr<sdk::SlotBudget> budget;  // the client's; the grant holds one unit until it ends

  // Guarded by mu: the owner and the keeper (renewals, losses) both use it.
  Mutex mu;
  Grant grant GUARDED_BY(mu);
  LockState state GUARDED_BY(mu) = LockState::kHeld;
  bool settled GUARDED_BY(mu) = false;  // the budget unit was given back
  bool auto_renew GUARDED_BY(mu) = true;
  std::function<void(const Status&)> on_lost GUARDED_BY(mu);
  bool lost_reported GUARDED_BY(mu) = false;

  // The grant's ticket: written once, before the handle exists (MakeHandle), never after (a
  // renewal moves the lease, not the ticket), so it is read without mu (LockHandle::slot, mode).
  const Ticket& ticket() const NO_THREAD_SAFETY_ANALYSIS { return grant.ticket; }
  // Leaves kHeld: the grant's budget unit goes back.
  void SetState(LockState to) REQUIRES(mu) {
    state = to;
    if (to != LockState::kHeld) Settle();
  }
  void Settle() REQUIRES(mu) {
    if (!settled && budget) budget->Give(grant.ticket.slot);
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
  // Starts the keeper and the reaper. Each thread holds a reference to the Impl until it ends,
  // so that one whose callback closes the client (Close then detaches it) goes on, until it
  // returns, on a live object (issue 17, finding 9). Called once, by Client's constructor.
  void Start();
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

  // ---- Channels and sessions (client_channels.cc)
  // This thread's channel in the current session, connected on first use. The fast path reads a
  // thread-local cache. While the client reconnects, waits for the new session until `deadline`.
  Result<ThreadChannel*> Channel(Clock::time_point deadline = Clock::time_point::max())
      EXCLUDES(mu_);
  // A call on `gen`'s session failed. A connection error ends the session: every lock it held is
  // lost, its connections close (so lockd frees what they recorded), and the keeper reconnects.
  void OnSessionError(uint64_t gen, const Status& st) EXCLUDES(mu_);
  // Makes a handle for a grant of `ch`'s session (counted, its latency since `started` recorded,
  // and tracked for renewal).
  LockHandle MakeHandle(ThreadChannel & ch, const Grant& g, bool auto_renew,
                        Clock::time_point started) EXCLUDES(mu_);

  // ---- The reaper (client_reaper.cc)
  // A thread posted a release: make sure the reaper thread ticks fast enough to reap it if the
  // thread makes no further call.
  void ReleasePosted() EXCLUDES(mu_);

  // ---- Asynchronous acquires (client_async.cc; Client::LockSlotAsync)
  struct AsyncRequest {
    uint64_t slot = 0;
    Mode mode = Mode::kExclusive;
    LockOptions options;
    Clock::time_point deadline = Clock::time_point::max();
    Client::LockCallback done;
    Clock::time_point submitted = Clock::now();  // where its latency starts
  };
  Status Submit(AsyncRequest req) EXCLUDES(async_mu_);

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
  };
  static constexpr size_t kAsyncBatch = 8;
  static constexpr int kAsyncWaiters = 4;
  static constexpr std::chrono::milliseconds kReapTick{1};

  // client_channels.cc
  std::shared_ptr<const Session> MakeSession(
      const Connection& first, std::chrono::nanoseconds liveness, const std::string& server,
      uint16_t port) REQUIRES(mu_);
  // Tracks a new grant's handle for renewal and loss reports, atomically with the session's end
  // (see the definition).
  bool Track(const std::shared_ptr<LockHandle::State>& s) EXCLUDES(mu_);
  // Marks every held lock lost and calls the loss callbacks. Returns how many.
  size_t EndLeases(const Status& why) EXCLUDES(mu_);
  static void JoinOrDetach(std::thread & t, std::thread::id me);
  // A connection joining the session `reply` describes at server:port (a connect timeout of
  // `timeout`), retried while lockd is busy until `deadline`. A refusal for the session's
  // connection cap or lockd's resources comes back as kResource; *reason says which.
  Result<std::unique_ptr<Connection>> Join(
      const std::string& server, uint16_t port, const proto::AcceptReply& reply,
      std::chrono::milliseconds timeout, Clock::time_point deadline, proto::RejectReason* reason);
  // Why one of the client's own threads (`whose`) could not join its session.
  static Status OwnJoinError(std::string_view whose, const Status& st, proto::RejectReason reason);
  // Writes the next heartbeat (beats_) into the record `reply` names, over `mem`: while the
  // client's own connections are being made, before the keeper's loop runs, so that lockd's
  // heartbeat timeout never covers more than one handshake.
  Status WriteHeartbeat(RemoteMemory & mem, const proto::AcceptReply& reply);

  // client_reaper.cc
  void Abandon(uint64_t gen, const Ticket& t) EXCLUDES(mu_);
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
  void PumpLoop() EXCLUDES(async_mu_);
  void WaiterLoop() EXCLUDES(async_mu_);
  // `me`: the closing thread (if it is the pump or a waiter, it is detached, not joined).
  void StopAsync(std::thread::id me) EXCLUDES(mu_, async_mu_);

  // client_stats.cc
  ClientStats StatsLocked() const REQUIRES(mu_);

  // ---- Constant after construction
  const ClientOptions opts_;
  const Client::Resolver resolve_;  // empty: lockd is at opts_.server, opts_.port
  const Connector connector_;       // how every connection is made (VerbsConnect but in tests)
  uint64_t nonce_ = 0;              // set by the constructor: tells this Impl's thread caches apart
  const uint64_t fork_gen_ = fork_guard::Generation();  // see inherited()
  // Set before the client is used from other threads (ClientTestPeer::SetTestHook).
  std::function<void(std::string_view)> test_hook_;

  // ---- Atomics, any thread
  std::atomic<uint64_t> gen_{0};  // the current session's gen; 0 while there is none
  std::atomic<uint64_t> renewals_{0}, renew_failures_{0};
  std::atomic<bool> reap_fast_{false};  // releases are being posted: the reaper ticks every 1 ms
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
  std::vector<std::weak_ptr<LockHandle::State>> handles_ GUARDED_BY(mu_);
  uint64_t sessions_lost_ GUARDED_BY(mu_) = 0;
  uint64_t reconnects_ GUARDED_BY(mu_) = 0;

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
