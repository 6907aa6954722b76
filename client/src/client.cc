#include "rdmalock/client.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "client/src/client_test_peer.h"
#include "client/src/entry_pool.h"
#include "common/auth/auth.h"
#include "engine/fork_guard.h"
#include "engine/lock_engine.h"
#include "engine/verbs_memory.h"
#include "rdmalock/proto/layout.h"

namespace rdmalock {

uint64_t SlotForName(std::string_view name, uint64_t lock_count) {
  return XXH3_64bits(name.data(), name.size()) % lock_count;
}

namespace {

std::string DefaultClientName() {
  char buf[64] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string path = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "client";
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// One connection attempt's limit. A lockd that can move (a shard's primary, looked up in etcd
// before each attempt) is given a few seconds: the one named may be cut off, and waiting the whole
// connect timeout for it would leave a failed-over shard unused meanwhile.
std::chrono::milliseconds AttemptTimeout(std::chrono::milliseconds connect_timeout, bool moving) {
  return moving ? std::min(connect_timeout, std::chrono::milliseconds(3000)) : connect_timeout;
}

// One session with lockd: the handshake's answer, the engine for its parameters and its record.
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
  Status Refusal(uint64_t slot) const {
    return Error(ErrorCode::kResource,
                 "this client has " + std::to_string(per_slot()) + " requests on slot " +
                     std::to_string(slot) +
                     " already, the most one lock word can count for each of lockd's "
                     "max_clients sessions (32767 / max_clients)");
  }

 private:
  std::atomic<uint32_t> per_slot_{31};
  std::array<std::atomic<uint32_t>, kBuckets> counts_{};
};

// A channel's first READ of lockd's info page: its liveness timeout (0 for a lockd without one).
Result<std::chrono::nanoseconds> ReadLiveness(RemoteMemory& mem) {
  RemoteOp rd = RemoteOp::Read(RegionId::kInfo, proto::InfoPage::kLivenessTimeoutNs, 8);
  RDMALOCK_RETURN_IF_ERROR(mem.Execute(rd));
  return std::chrono::nanoseconds(static_cast<int64_t>(rd.result[0]));
}

}  // namespace

// LatencyHistogram's buckets as counters one thread writes and any thread reads.
struct LatencyCounters {
  Counter buckets[LatencyHistogram::kBuckets];
  Counter count, sum_us;
  void Add(Clock::duration d) {
    const auto us = static_cast<uint64_t>(
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(d).count()));
    ++buckets[LatencyHistogram::BucketOf(us)];
    ++count;
    sum_us.Add(us);
  }
  void AddTo(LatencyHistogram* h) const {
    for (size_t i = 0; i < LatencyHistogram::kBuckets; ++i) h->counts[i] += buckets[i].get();
    h->count += count.get();
    h->sum_us += sum_us.get();
  }
};

void Merge(const LatencyHistogram& from, LatencyHistogram* to) {
  for (size_t i = 0; i < LatencyHistogram::kBuckets; ++i) to->counts[i] += from.counts[i];
  to->count += from.count;
  to->sum_us += from.sum_us;
}

// One thread's connection to lockd (in one session) and what the engine did on it.
struct ThreadChannel {
  std::shared_ptr<const Session> session;
  std::unique_ptr<Connection> mem;
  // Held by whoever uses `mem` and `pending`: the owning thread for its calls, the keeper when it
  // reaps a release the owner posted and left (it only try-locks).
  std::mutex mu;
  PendingRelease pending;                 // a release posted without waiting, not reaped yet
  std::atomic<int64_t> pending_since{0};  // steady-clock ns when posted; 0: none
  EngineEvents events;
  Counter acquires, releases, timeouts, lost, unrecorded, batches;
  LatencyCounters latency;  // of the grants made on this channel

  // Reaps the posted release, if any. The caller holds `mu`.
  Status Reap() {
    if (!pending.active) return Status::Ok();
    Status st = session->engine->FinishRelease(*mem, &pending, &events);
    pending_since.store(0, std::memory_order_relaxed);
    if (st.code() == ErrorCode::kLockLost) {
      ++lost;  // released too late to count: waiters recover it (the holder was done with it)
      return Status::Ok();
    }
    return st;
  }
  // A record entry for a new request from the session's pool; counts requests that go
  // unrecorded because the record is full (when recording is on).
  std::pair<uint64_t, uint32_t> TakeEntry(bool recording) {
    auto e = session->pool->Take();
    if (e.first == 0 && recording) ++unrecorded;
    return e;
  }
  void NotePending() {
    pending_since.store(pending.active ? Clock::now().time_since_epoch().count() : 0,
                        std::memory_order_relaxed);
  }
};

struct [[gnu::visibility("hidden")]] LockHandle::State {
  ~State() { Settle(); }
  // fork_guard::Generation() when granted: in a forked child the handle is inert (its mutex may
  // have been held by one of the parent's threads, which the child does not have).
  const uint64_t fork_gen = fork_guard::Generation();
  bool inherited() const { return fork_guard::Generation() != fork_gen; }
  std::weak_ptr<Client::Impl> client;
  std::shared_ptr<const Session> session;
  std::shared_ptr<SlotBudget> budget;  // the client's; the grant holds one unit until it ends
  std::mutex mu;  // guards everything below: the owner and the renewer thread both use it
  Grant grant;
  LockState state = LockState::kHeld;
  bool settled = false;  // the budget unit was given back
  // Leaves kHeld (the caller holds mu): the grant's budget unit goes back.
  void SetState(LockState to) {
    state = to;
    if (to != LockState::kHeld) Settle();
  }
  void Settle() {
    if (!settled && budget) budget->Give(grant.ticket.slot);
    settled = true;
  }
  bool auto_renew = true;
  std::function<void(const Status&)> on_lost;
  bool lost_reported = false;
};

// Hidden: nested in an exported class, it would be exported too.
class [[gnu::visibility("hidden")]] Client::Impl
    : public std::enable_shared_from_this<Client::Impl> {
 public:
  // `opts.server` and `.port` are where `first` is connected; `resolve` (may be empty) says where
  // to reconnect.
  Impl(ClientOptions opts, std::unique_ptr<Connection> first, std::chrono::nanoseconds liveness,
       Client::Resolver resolve, Connector connector)
      : opts_(std::move(opts)), resolve_(std::move(resolve)), connector_(std::move(connector)) {
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

  // Starts the keeper and the reaper. Each thread holds a reference to the Impl until it ends,
  // so that one whose callback closes the client (Close then detaches it) goes on, until it
  // returns, on a live object (issue 17, finding 9). Called once, by Client's constructor.
  void Start() {
    reaper_ = std::thread([self = shared_from_this()] { self->ReaperLoop(); });
    keeper_ = std::thread([self = shared_from_this()] { self->KeeperLoop(); });
  }

  ~Impl() { Close(); }

  // Ends the session and stops the threads: ~Client calls it, on any thread, including one of
  // this client's own from inside a callback (a loss callback on the keeper or the reaper, an
  // async acquire's on the pump or a waiter). That thread cannot be joined from itself: it is
  // detached instead, and finishes what it was doing once the callback returns (its reference
  // keeps the Impl alive; everything it does next sees stopping_). Idempotent.
  void Close() {
    const auto me = std::this_thread::get_id();
    {
      std::lock_guard lk(mu_);
      if (closed_) return;
      closed_ = true;
    }
    StopAsync(me);
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    JoinOrDetach(reaper_, me);
    JoinOrDetach(keeper_, me);
    std::vector<std::shared_ptr<ThreadChannel>> chans;
    {
      std::lock_guard lk(mu_);
      for (auto& [tid, ch] : channels_) chans.push_back(ch);
    }
    // Posted releases first, so that what this client released is released at lockd.
    for (auto& ch : chans) {
      std::lock_guard lk(ch->mu);
      (void)ch->Reap();
    }
    // The session ends with the client: locks still held are lost from here on, then the
    // connections close (threads' caches may keep the objects a while, disconnected), and lockd
    // frees what the record shows.
    (void)EndLeases(Error(ErrorCode::kConnection, "client closed"));
    for (auto& ch : chans) ch->mem->Shutdown();
  }

  // In a forked child, the client's connections are the parent's and its threads do not exist:
  // every call fails and nothing is torn down (issue 17, finding 11; fork_guard.h).
  bool inherited() const { return fork_guard::Generation() != fork_gen_; }
  static Status InheritedError() {
    return Error(ErrorCode::kUnsupported,
                 "this client was inherited across fork(): its connections are the parent "
                 "process's, which keeps its session and locks; a child connects a client of its "
                 "own (after exec)");
  }

  const ClientOptions& options() const { return opts_; }
  // The latest session, also while reconnecting (its lock count and lease still describe lockd).
  std::shared_ptr<const Session> latest_session() const {
    std::lock_guard lk(mu_);
    return latest_;
  }
  std::shared_ptr<const Session> session() const {
    std::lock_guard lk(mu_);
    return session_;
  }

  // This thread's channel in the current session, connected on first use. The fast path reads a
  // thread-local cache. While the client reconnects, waits for the new session until `deadline`.
  Result<ThreadChannel*> Channel(Clock::time_point deadline = Clock::time_point::max()) {
    struct Cache {
      const Impl* impl = nullptr;
      uint64_t nonce = 0;
      uint64_t gen = 0;
      std::shared_ptr<ThreadChannel> ch;  // keeps the channel alive while this thread uses it
    };
    thread_local Cache cache;
    if (inherited()) return InheritedError();  // before any lock: a parent's thread may hold it
    const uint64_t gen = gen_.load(std::memory_order_acquire);
    if (cache.impl == this && cache.nonce == nonce_ && cache.gen == gen && gen != 0) {
      return cache.ch.get();
    }
    const auto tid = std::this_thread::get_id();
    std::shared_ptr<const Session> sess;
    {
      std::unique_lock lk(mu_);
      const auto limit = std::min(deadline, Clock::now() + opts_.connect_timeout);
      while (session_ == nullptr && !stopping_ && opts_.reconnect) {
        if (cv_.wait_until(lk, limit) == std::cv_status::timeout) break;
      }
      if (stopping_) return Error(ErrorCode::kConnection, "client closed");
      if (session_ == nullptr) {
        return Error(ErrorCode::kConnection,
                     opts_.reconnect ? "not connected to lockd (reconnecting: " + last_error_ + ")"
                                     : "session with lockd ended: " + last_error_);
      }
      if (auto it = channels_.find(tid); it != channels_.end()) {
        cache = {this, nonce_, it->second->session->gen, it->second};
        return it->second.get();
      }
      sess = session_;
    }
    ChannelParams p{sess->server,        sess->port,       opts_.connect_timeout,
                    opts_.client_name,   proto::kFlagJoin, sess->reply.session_id,
                    sess->reply.join_key};
    p.auth_key = opts_.auth_key;
    // lockd may refuse a thread's join while the session itself is fine: too many handshakes at
    // once (retried within the connect timeout) or the session's connection limit (this thread
    // gets kResource; the session and the other threads go on).
    const auto join_deadline = std::min(deadline, Clock::now() + opts_.connect_timeout);
    Result<std::unique_ptr<Connection>> mem = Error(ErrorCode::kInternal, "not connected");
    for (;;) {
      uint32_t retry_ms = 0;
      proto::RejectReason reason = proto::RejectReason::kNone;
      mem = connector_(p, &retry_ms, &reason);
      if (mem.ok()) break;
      if (reason == proto::RejectReason::kTooManyConnections ||
          reason == proto::RejectReason::kNoResources) {
        return Error(ErrorCode::kResource, mem.status().message());
      }
      if (reason == proto::RejectReason::kBusy &&
          Clock::now() + std::chrono::milliseconds(retry_ms) < join_deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(retry_ms));
        continue;
      }
      OnSessionError(sess->gen, mem.status());
      return mem.status();
    }
    auto ch = std::make_shared<ThreadChannel>();
    ch->session = sess;
    ch->mem = std::move(mem).value();
    std::lock_guard lk(mu_);
    if (session_ != sess) return Error(ErrorCode::kConnection, "session with lockd ended");
    channels_[tid] = ch;
    cache = {this, nonce_, sess->gen, ch};
    return ch.get();
  }

  // A call on `gen`'s session failed. A connection error ends the session: every lock it held is
  // lost, its connections close (so lockd frees what they recorded), and the keeper reconnects.
  void OnSessionError(uint64_t gen, const Status& st) {
    if (st.code() != ErrorCode::kConnection && st.code() != ErrorCode::kRejected &&
        st.code() != ErrorCode::kProtocol) {
      return;
    }
    std::vector<std::shared_ptr<ThreadChannel>> old;
    {
      std::lock_guard lk(mu_);
      if (session_ == nullptr || session_->gen != gen) return;  // already handled
      session_ = nullptr;
      gen_.store(0, std::memory_order_release);
      last_error_ = st.message();
      retired_ = StatsLocked();  // keep the counters of the connections that close now
      for (auto& [tid, ch] : channels_) old.push_back(ch);
      channels_.clear();
      ++sessions_lost_;
    }
    cv_.notify_all();
    // Locks first, then connections: when lockd sees them close it may free those locks at once.
    (void)EndLeases(
        Error(ErrorCode::kLockLost, "session with lockd ended (" + st.message() + "); lock lost"));
    for (auto& ch : old) ch->mem->Shutdown();
  }

  // Tracks a new grant's handle for renewal and loss reports, atomically with the session's end:
  // a grant of a session that OnSessionError has ended already (its EndLeases ran without this
  // handle, and lockd frees the grant once the connections close) is not tracked and returns
  // false; the caller reports the grant lost (issue 16, finding 1).
  bool Track(const std::shared_ptr<LockHandle::State>& s) {
    std::lock_guard lk(mu_);
    if (stopping_ || session_ != s->session) return false;
    handles_.push_back(s);
    return true;
  }

  // Test seam (ClientTestPeer): runs the fault hook at a named point.
  void Fault(std::string_view point) {
    if (fault_) fault_(point);
  }
  std::function<void(std::string_view)> fault_;  // set before use (ClientTestPeer)

  ClientStats Stats() {
    std::lock_guard lk(mu_);
    return StatsLocked();
  }

  ClientStats StatsLocked() {
    ClientStats out;
    out.renewals = renewals_.load(std::memory_order_relaxed);
    out.renew_failures = renew_failures_.load(std::memory_order_relaxed);
    out.sessions_lost = sessions_lost_;
    out.reconnects = reconnects_;
    auto add = [&](const ThreadChannel& ch) {
      const OpCounters& c = ch.mem->counters();
      out.fetch_add += c.fetch_add.get();
      out.compare_swap += c.compare_swap.get();
      out.read += c.read.get();
      out.write += c.write.get();
      out.acquires += ch.acquires.get();
      out.waits += ch.events.waits.get();
      ch.latency.AddTo(&out.acquire_latency);
      out.releases += ch.releases.get();
      out.timeouts += ch.timeouts.get();
      out.lost += ch.lost.get();
      out.unrecorded += ch.unrecorded.get();
      out.recoveries += ch.events.recoveries.get();
      out.restarts += ch.events.restarts.get();
      out.withdrawals += ch.events.withdrawals.get();
      out.resets += ch.events.resets.get();
      out.abandoned += ch.events.abandoned.get();
      out.deferred_releases += ch.events.deferred.get();
      out.batch_fallbacks += ch.events.batch_fallbacks.get();
      out.batches += ch.batches.get();
    };
    for (const auto& [tid, ch] : channels_) add(*ch);
    out.fetch_add += retired_.fetch_add;
    out.compare_swap += retired_.compare_swap;
    out.read += retired_.read;
    out.write += retired_.write;
    out.acquires += retired_.acquires;
    out.waits += retired_.waits;
    Merge(retired_.acquire_latency, &out.acquire_latency);
    out.releases += retired_.releases;
    out.timeouts += retired_.timeouts;
    out.lost += retired_.lost;
    out.unrecorded += retired_.unrecorded;
    out.recoveries += retired_.recoveries;
    out.restarts += retired_.restarts;
    out.withdrawals += retired_.withdrawals;
    out.resets += retired_.resets;
    out.abandoned += retired_.abandoned;
    out.deferred_releases += retired_.deferred_releases;
    out.batch_fallbacks += retired_.batch_fallbacks;
    out.batches += retired_.batches;
    return out;
  }

  std::atomic<uint64_t> renewals_{0}, renew_failures_{0};
  // Requests outstanding per lock word (finding 11); handles hold units too. Any thread.
  const std::shared_ptr<SlotBudget> budget_ = std::make_shared<SlotBudget>();

 private:
  std::shared_ptr<const Session> MakeSession(const Connection& first,
                                             std::chrono::nanoseconds liveness,
                                             const std::string& server, uint16_t port) {
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
    const uint32_t entries = opts_.record_requests
                                 ? std::min(reply.record_entries, proto::SessionRecord::kMaxEntries)
                                 : 0;
    s->pool = std::make_shared<EntryPool>(reply.session_record_offset, entries);
    EngineParams p;
    p.lock_count = reply.lock_count;
    p.lease = std::chrono::nanoseconds(reply.lease_ns);
    p.stall_factor = reply.stall_factor;
    p.epoch = static_cast<uint16_t>(reply.epoch);
    if (liveness > std::chrono::nanoseconds::zero()) p.trusted_until = &s->trusted_until_ns;
    std::weak_ptr<EntryPool> pool = s->pool;
    const uint64_t gen = s->gen;
    s->engine = std::make_unique<LockEngine>(
        p, [this, gen](const Ticket& t) { Abandon(gen, t); },
        [pool](uint64_t record) {
          if (auto pl = pool.lock()) pl->Give(record);
        });
    gen_.store(s->gen, std::memory_order_release);
    return s;
  }

  // Marks every held lock lost and calls the loss callbacks. Returns how many.
  size_t EndLeases(const Status& why) {
    std::vector<std::shared_ptr<LockHandle::State>> all;
    {
      std::lock_guard lk(mu_);
      for (auto& w : handles_) {
        if (auto s = w.lock()) all.push_back(s);
      }
      handles_.clear();
    }
    // Every lock is lost before the first callback runs: one may close the client, which shuts
    // the connections down (and lockd frees the locks) while the others are still reported.
    size_t n = 0;
    std::vector<std::function<void(const Status&)>> notify;
    for (auto& s : all) {
      std::lock_guard lk(s->mu);
      if (s->state != LockState::kHeld) continue;
      s->SetState(LockState::kLost);
      ++n;
      if (!s->lost_reported) {
        s->lost_reported = true;
        if (s->on_lost) notify.push_back(s->on_lost);
      }
    }
    for (auto& f : notify) f(why);
    return n;
  }

  void Abandon(uint64_t gen, const Ticket& t) {
    {
      std::lock_guard lk(mu_);
      if (session_ == nullptr || session_->gen != gen) return;  // the session is gone anyway
      abandoned_.emplace_back(gen, t);
      budget_->Force(t.slot);  // the reaper's until it is done with the ticket
    }
    cv_.notify_all();
  }

  void GiveAll(std::vector<ReapState> * pending) {
    for (const ReapState& r : *pending) budget_->Give(r.ticket.slot);
    pending->clear();
  }

  // Frees tickets that gave up (a timeout or a busy try) while others were queued behind them:
  // each must be released when its turn comes. They are stepped together, without blocking
  // (LockEngine::Reap, one READ each per round): draining them one at a time could stall them
  // all behind one whose turn waits for a holder that itself waits behind another abandoned
  // ticket (docs/protocol.md §3).
  void ReaperLoop() {
    std::vector<ReapState> pending;
    uint64_t pending_gen = 0;  // the session the pending tickets belong to
    for (;;) {
      {
        std::unique_lock lk(mu_);
        const auto wake = [&] { return stopping_ || !abandoned_.empty() || wake_reaper_; };
        if (!pending.empty()) {
          cv_.wait_for(lk, std::chrono::microseconds(500), wake);
        } else if (reap_fast_.load(std::memory_order_relaxed)) {
          cv_.wait_for(lk, kReapTick, wake);
        } else {
          cv_.wait(lk, wake);
        }
        wake_reaper_ = false;
        if (stopping_) return;
        while (!abandoned_.empty()) {
          ReapState r;
          r.ticket = abandoned_.front().second;
          r.own = true;
          if (abandoned_.front().first != pending_gen) GiveAll(&pending);  // an ended session's
          pending_gen = abandoned_.front().first;
          abandoned_.pop_front();
          pending.push_back(r);
        }
      }
      // Releases other threads posted and left: reaped here, not on the keeper, whose heartbeat
      // must never wait behind another connection's retransmissions.
      if (reap_fast_.load(std::memory_order_relaxed)) ReapLeftReleases();
      if (pending.empty()) continue;
      auto ch = Channel(Clock::now());
      if (!ch.ok()) {
        GiveAll(&pending);  // the session ended: lockd frees what the record shows
        continue;
      }
      ThreadChannel& c = **ch;
      if (c.session->gen != pending_gen) {
        GiveAll(&pending);
        continue;
      }
      Status st;
      {
        std::lock_guard clk(c.mu);
        st = c.Reap();
        for (size_t i = 0; st.ok() && i < pending.size();) {
          auto done = c.session->engine->Reap(*c.mem, pending[i], &c.events);
          if (!done.ok()) {
            st = done.status();
          } else if (*done) {
            budget_->Give(pending[i].ticket.slot);
            pending[i] = pending.back();
            pending.pop_back();
          } else {
            ++i;
          }
        }
      }
      if (!st.ok()) {
        GiveAll(&pending);
        OnSessionError(c.session->gen, st);
      }
    }
  }

  // The keeper: writes the heartbeat, renews tracked grants once a third of their lease has
  // passed, watches for lockd disconnecting us, and reconnects after the session ends.
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

  void KeeperLoop() {
    AliveWatch alive;
    uint64_t beat = 0;
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
      {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, tick, [&] { return stopping_; });
        if (stopping_) return;
      }
      if (!sess) {
        if (!opts_.reconnect) continue;
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
        std::lock_guard clk(c.mu);
        st = c.mem->CheckConnection();
        if (st.ok()) st = c.Reap();
        if (st.ok() && Clock::now() >= next_beat) {
          next_beat = Clock::now() + hb;
          // With the heartbeat, in the same doorbell, a READ of lockd's alive ticks when lockd
          // asks to be watched (cluster mode).
          RemoteOp ops[2] = {
              RemoteOp::Write(RegionId::kSessions,
                              sess->reply.session_record_offset + proto::SessionRecord::kHeartbeat,
                              ++beat),
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

  // Reaps releases that threads posted and then left (no call on the client since): a release
  // whose CAS missed must be retried soon, or the lock's waiters wait for it.
  void ReapLeftReleases() {
    const int64_t now = Clock::now().time_since_epoch().count();
    const int64_t min_age = std::chrono::nanoseconds(kReapTick).count();
    std::vector<std::shared_ptr<ThreadChannel>> left;
    bool any = false;
    {
      std::lock_guard lk(mu_);
      for (auto& [tid, ch] : channels_) {
        const int64_t since = ch->pending_since.load(std::memory_order_relaxed);
        if (since == 0) continue;
        any = true;
        if (now - since >= min_age) left.push_back(ch);
      }
    }
    if (any) {
      idle_reap_ticks_ = 0;
    } else if (++idle_reap_ticks_ > 20) {
      reap_fast_.store(false, std::memory_order_relaxed);  // 20 ms with none: slow down
    }
    for (auto& ch : left) {
      std::unique_lock clk(ch->mu, std::try_to_lock);
      if (!clk.owns_lock()) continue;  // its thread is using it, and reaps it itself
      if (Status st = ch->Reap(); !st.ok()) {
        clk.unlock();
        OnSessionError(ch->session->gen, st);
      }
    }
  }

 public:
  // A thread posted a release: make sure the reaper thread ticks fast enough to reap it if the
  // thread makes no further call.
  void ReleasePosted() {
    if (reap_fast_.load(std::memory_order_relaxed)) return;
    {
      std::lock_guard lk(mu_);
      reap_fast_.store(true, std::memory_order_relaxed);
      wake_reaper_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::chrono::nanoseconds SmallJitter(std::chrono::milliseconds d) {
    const int64_t most = std::clamp<int64_t>(d.count() / 4, 1, 250);
    std::uniform_int_distribution<int64_t> dist(0, most);
    return std::chrono::milliseconds(dist(rng_));
  }

  std::chrono::nanoseconds Jittered(std::chrono::milliseconds d) {
    std::uniform_int_distribution<int64_t> dist(d.count() / 2, d.count() * 3 / 2);
    return std::chrono::milliseconds(dist(rng_));
  }

  bool Reconnect(std::chrono::milliseconds * backoff) {
    std::string server = opts_.server;
    uint16_t port = opts_.port;
    if (resolve_) {
      auto where = resolve_();
      if (!where.ok()) {
        std::lock_guard lk(mu_);
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
      std::lock_guard lk(mu_);
      last_error_ = liveness.status().message();
      // lockd's restart grace or rate limit says when it will take us: come back then (the
      // caller jitters).
      if (retry_ms > 0) *backoff = std::chrono::milliseconds(retry_ms);
      return false;
    }
    auto ch = std::make_shared<ThreadChannel>();
    ch->mem = std::move(mem).value();
    {
      std::lock_guard lk(mu_);
      if (stopping_) return false;
      ch->session = MakeSession(*ch->mem, *liveness, server, port);
      session_ = ch->session;
      latest_ = session_;
      channels_[std::this_thread::get_id()] = ch;
      ++reconnects_;
    }
    cv_.notify_all();
    return true;
  }

  void RenewDue(ThreadChannel & c, std::chrono::nanoseconds lease) {
    std::vector<std::shared_ptr<LockHandle::State>> due;
    {
      std::lock_guard lk(mu_);
      std::vector<std::weak_ptr<LockHandle::State>> keep;
      for (auto& w : handles_) {
        if (auto s = w.lock()) {
          due.push_back(s);
          keep.push_back(w);
        }
      }
      handles_.swap(keep);
    }
    for (auto& s : due) {
      Status st;
      std::function<void(const Status&)> notify;
      {
        // Never wait for a handle its owner is using (a release may wait out retransmissions):
        // the keeper's heartbeat comes next, and a renewal skipped now is tried next tick (it is
        // due at a third of the lease, with two thirds to spare).
        std::unique_lock lk(s->mu, std::try_to_lock);
        if (!lk.owns_lock()) continue;
        if (s->state != LockState::kHeld) continue;
        if (s->session != c.session) continue;  // from an ended session: EndLeases handles it
        if (!s->auto_renew || !opts_.auto_renew) {
          // Not renewed here: the lock is lost once its lease runs out, and the owner is told
          // (issue 16, finding 12).
          if (!c.session->engine->LeaseValid(s->grant, Clock::now())) {
            s->SetState(LockState::kLost);
            if (!s->lost_reported) {
              s->lost_reported = true;
              notify = s->on_lost;
            }
            st = Error(ErrorCode::kLockLost, "lease ran out without a renewal; lock lost");
            lk.unlock();
            if (notify) notify(st);
          }
          continue;
        }
        if (Clock::now() - s->grant.lease_start < lease / 3) continue;
        {
          std::lock_guard clk(c.mu);
          st = c.session->engine->Renew(*c.mem, s->grant, &c.events);
        }
        if (st.ok()) {
          renewals_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        renew_failures_.fetch_add(1, std::memory_order_relaxed);
        // A failed renewal whose lease is still running may succeed next tick; past the lease
        // the lock is lost.
        if (st.code() == ErrorCode::kLockLost ||
            !c.session->engine->LeaseValid(s->grant, Clock::now())) {
          s->SetState(LockState::kLost);
          if (!s->lost_reported) {
            s->lost_reported = true;
            notify = s->on_lost;
          }
        }
      }
      if (notify) notify(st);
      if (st.code() == ErrorCode::kConnection) OnSessionError(c.session->gen, st);
      std::lock_guard lk(mu_);
      if (stopping_) return;  // a callback closed the client
    }
  }

  ClientOptions opts_;
  Client::Resolver resolve_;  // empty: lockd is at opts_.server, opts_.port
  Connector connector_;       // how every connection is made (VerbsMemory::Connect but in tests)
  uint64_t nonce_ = 0;
  std::atomic<uint64_t> gen_{0};  // the current session's gen; 0 while there is none
  std::minstd_rand rng_;          // keeper thread only
  static constexpr std::chrono::milliseconds kReapTick{1};
  std::atomic<bool> reap_fast_{false};  // releases are being posted: the reaper ticks every 1 ms
  int idle_reap_ticks_ = 0;             // reaper thread only

  const uint64_t fork_gen_ = fork_guard::Generation();  // see inherited()

  mutable std::mutex mu_;  // guards the members below
  std::condition_variable cv_;
  bool closed_ = false;  // Close() has begun
  bool stopping_ = false;
  bool wake_reaper_ = false;
  uint64_t last_gen_ = 0;
  std::shared_ptr<const Session> session_;  // null while reconnecting
  std::shared_ptr<const Session> latest_;   // never null
  std::string last_error_;
  std::unordered_map<std::thread::id, std::shared_ptr<ThreadChannel>> channels_;
  ClientStats retired_;  // counters of the connections of ended sessions
  std::deque<std::pair<uint64_t, Ticket>> abandoned_;  // (session gen, ticket)
  std::vector<std::weak_ptr<LockHandle::State>> handles_;
  uint64_t sessions_lost_ = 0, reconnects_ = 0;
  std::thread reaper_;
  std::thread keeper_;

  // ---- Asynchronous acquires (Client::LockSlotAsync)
 public:
  struct AsyncRequest {
    uint64_t slot = 0;
    Mode mode = Mode::kExclusive;
    LockOptions options;
    Clock::time_point deadline = Clock::time_point::max();
    Client::LockCallback done;
    Clock::time_point submitted = Clock::now();  // where its latency starts
  };
  Status Submit(AsyncRequest req);
  // Makes a handle for a grant of `ch`'s session (counted, its latency since `started` recorded,
  // and tracked for renewal).
  LockHandle MakeHandle(ThreadChannel & ch, const Grant& g, bool auto_renew,
                        Clock::time_point started);

 private:
  struct AsyncWait {
    AsyncRequest req;
    Grant queued;
    bool frozen = false;
  };
  static constexpr size_t kAsyncBatch = 8;
  static constexpr int kAsyncWaiters = 4;
  void PumpLoop();
  void WaiterLoop();
  // `me`: the closing thread (if it is the pump or a waiter, it is detached, not joined).
  void StopAsync(std::thread::id me);
  static void JoinOrDetach(std::thread & t, std::thread::id me) {
    if (!t.joinable()) return;
    if (t.get_id() == me) {
      t.detach();  // closing from this thread's own callback: it ends by itself
    } else {
      t.join();
    }
  }

  std::mutex async_mu_;               // guards the members below
  std::condition_variable async_cv_;  // the pump waits on it
  std::condition_variable wait_cv_;   // the waiters wait on it
  bool async_stop_ = false;
  std::deque<AsyncRequest> async_q_;
  std::deque<AsyncWait> wait_q_;
  std::thread pump_;
  std::vector<std::thread> waiters_;
  std::vector<std::thread::id> waiter_ids_;
};

Status Client::Impl::Submit(AsyncRequest req) {
  {
    std::lock_guard lk(async_mu_);
    if (async_stop_) return Error(ErrorCode::kConnection, "client closed");
    if (!pump_.joinable()) {
      // As the keeper's, these threads hold the Impl while they run (see Start).
      pump_ = std::thread([self = shared_from_this()] { self->PumpLoop(); });
      for (int i = 0; i < kAsyncWaiters; ++i) {
        waiters_.emplace_back([self = shared_from_this()] { self->WaiterLoop(); });
        waiter_ids_.push_back(waiters_.back().get_id());
      }
    }
    async_q_.push_back(std::move(req));
    // Under the lock: once it is released, the request's callback may run and destroy the
    // client, this Impl (and its condition variable) with it, before this thread goes on.
    async_cv_.notify_one();
  }
  return Status::Ok();
}

LockHandle Client::Impl::MakeHandle(ThreadChannel& ch, const Grant& g, bool auto_renew,
                                    Clock::time_point started) {
  ++ch.acquires;
  ch.latency.Add(Clock::now() - started);
  auto state = std::make_shared<LockHandle::State>();
  state->client = weak_from_this();  // expired while the client closes: no throw
  state->session = ch.session;
  state->grant = g;
  state->budget = budget_;  // the caller took this grant's unit
  state->auto_renew = auto_renew;
  if (!Track(state)) {
    state->SetState(LockState::kLost);  // the session ended while the grant was made
    state->lost_reported = true;
  }
  return LockHandle(std::move(state));
}

namespace {

// A handle MakeHandle made for a session that had ended meanwhile: the caller gets an error.
Status EndedWhileGranted() {
  return Error(ErrorCode::kConnection,
               "the session with lockd ended while the lock was granted; lock lost");
}

}  // namespace

// Takes up to kAsyncBatch queued requests and posts their FAs in one doorbell. Granted ones
// complete here; the others go to the waiters.
void Client::Impl::PumpLoop() {
  for (;;) {
    std::vector<AsyncRequest> batch;
    {
      std::unique_lock lk(async_mu_);
      async_cv_.wait(lk, [&] { return async_stop_ || !async_q_.empty(); });
      if (async_stop_) return;
      while (!async_q_.empty() && batch.size() < kAsyncBatch) {
        batch.push_back(std::move(async_q_.front()));
        async_q_.pop_front();
      }
    }
    Clock::time_point deadline = Clock::time_point::max();
    for (const auto& r : batch) deadline = std::min(deadline, r.deadline);
    auto chr = Channel(deadline);
    if (!chr.ok()) {
      for (auto& r : batch) r.done(chr.status());
      continue;
    }
    ThreadChannel& ch = **chr;
    const Session& sess = *ch.session;
    std::vector<ManyRequest> reqs;
    reqs.reserve(batch.size());
    for (const auto& r : batch) {
      reqs.push_back({r.slot, r.mode, r.options.fencing_token && r.mode == Mode::kExclusive});
    }
    Result<std::vector<Issued>> issued = Error(ErrorCode::kInternal, "not issued");
    {
      std::lock_guard clk(ch.mu);
      Status st = ch.Reap();
      if (st.ok()) {
        issued = sess.engine->IssueMany(
            *ch.mem, reqs, false, [&] { return ch.TakeEntry(opts_.record_requests); }, &ch.pending,
            &ch.events);
      } else {
        issued = st;
      }
      ch.NotePending();
    }
    if (!issued.ok()) {
      OnSessionError(sess.gen, issued.status());
      for (auto& r : batch) r.done(issued.status());
      continue;
    }
    std::vector<AsyncWait> waits;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Issued& is = (*issued)[i];
      if (is.granted) {
        Fault("granted");
        LockHandle h = MakeHandle(ch, is.grant, batch[i].options.auto_renew, batch[i].submitted);
        if (h.state() == LockState::kLost) {
          batch[i].done(EndedWhileGranted());
        } else {
          batch[i].done(std::move(h));
        }
      } else {
        waits.push_back({std::move(batch[i]), is.grant, is.frozen});
      }
    }
    if (!waits.empty()) {
      {
        std::lock_guard lk(async_mu_);
        for (auto& w : waits) wait_q_.push_back(std::move(w));
      }
      wait_cv_.notify_all();
    }
  }
}

// Finishes requests the pump could not grant at once, one at a time, on this thread's channel.
void Client::Impl::WaiterLoop() {
  for (;;) {
    AsyncWait w;
    {
      std::unique_lock lk(async_mu_);
      wait_cv_.wait(lk, [&] { return async_stop_ || !wait_q_.empty(); });
      if (async_stop_ && wait_q_.empty()) return;
      w = std::move(wait_q_.front());
      wait_q_.pop_front();
    }
    auto chr = Channel(w.req.deadline);
    if (!chr.ok()) {
      w.req.done(chr.status());
      continue;
    }
    ThreadChannel& ch = **chr;
    const Session& sess = *ch.session;
    AcquireOptions ao;
    ao.deadline = w.req.deadline;
    ao.try_only = w.req.options.timeout && w.req.options.timeout->count() == 0;
    ao.want_token = w.req.options.fencing_token && w.req.mode == Mode::kExclusive;
    Result<Grant> g = Error(ErrorCode::kInternal, "not acquired");
    {
      std::lock_guard clk(ch.mu);
      Status st = ch.Reap();
      if (!st.ok()) {
        g = st;
      } else if (w.queued.ticket.record != 0 && w.frozen) {
        g = Error(ErrorCode::kInternal, "frozen request with a record");  // IssueMany never does
      } else if (w.frozen && ao.try_only) {
        g = Error(ErrorCode::kBusy, "lock word is being reset; try again");
      } else if (w.frozen) {
        std::tie(ao.record, ao.record_seq) = ch.TakeEntry(opts_.record_requests);
        ao.pending = &ch.pending;
        g = sess.engine->Acquire(*ch.mem, w.req.slot, w.req.mode, ao, &ch.events);
      } else {
        g = sess.engine->FinishAcquire(*ch.mem, w.queued, ao, &ch.events);
      }
      ch.NotePending();
    }
    if (!g.ok()) {
      if (g.status().code() == ErrorCode::kTimeout) ++ch.timeouts;
      OnSessionError(sess.gen, g.status());
      w.req.done(g.status());
      continue;
    }
    Fault("granted");
    LockHandle h = MakeHandle(ch, *g, w.req.options.auto_renew, w.req.submitted);
    if (h.state() == LockState::kLost) {
      w.req.done(EndedWhileGranted());
    } else {
      w.req.done(std::move(h));
    }
  }
}

// Stops the async threads. Waiters blocked in a wait are woken by shutting their connections
// (after reaping any release they posted); what is still queued completes with kConnection.
void Client::Impl::StopAsync(std::thread::id me) {
  std::vector<std::thread::id> ids;
  {
    std::lock_guard lk(async_mu_);
    async_stop_ = true;
    ids = waiter_ids_;
  }
  async_cv_.notify_all();
  wait_cv_.notify_all();
  JoinOrDetach(pump_, me);
  std::vector<std::shared_ptr<ThreadChannel>> chans;
  {
    std::lock_guard lk(mu_);
    for (auto id : ids) {
      if (auto it = channels_.find(id); it != channels_.end()) chans.push_back(it->second);
    }
  }
  for (auto& ch : chans) {
    std::unique_lock clk(ch->mu, std::try_to_lock);
    if (clk.owns_lock()) (void)ch->Reap();
  }
  {
    std::lock_guard lk(async_mu_);
    for (auto& w : wait_q_) async_q_.push_back(std::move(w.req));
    wait_q_.clear();
  }
  for (auto& ch : chans) ch->mem->Shutdown();
  for (auto& t : waiters_) JoinOrDetach(t, me);
  std::deque<AsyncRequest> left;
  {
    std::lock_guard lk(async_mu_);
    left.swap(async_q_);
  }
  for (auto& r : left) r.done(Error(ErrorCode::kConnection, "client closed"));
}

// ---- Client

namespace {

// The key from the options, else from the environment (see ClientOptions::auth_key).
Result<std::string> ResolveAuthKey(const ClientOptions& o) {
  if (!o.auth_key.empty()) {
    RDMALOCK_RETURN_IF_ERROR(auth::CheckKey(o.auth_key, "ClientOptions::auth_key"));
    return o.auth_key;
  }
  if (!o.auth_key_file.empty()) return auth::LoadKeyFile(o.auth_key_file, false);
  if (const char* k = std::getenv("RDMALOCK_AUTH_KEY"); k != nullptr && *k != '\0') {
    const std::string key = auth::TrimKey(k);
    RDMALOCK_RETURN_IF_ERROR(auth::CheckKey(key, "RDMALOCK_AUTH_KEY"));
    return key;
  }
  if (const char* f = std::getenv("RDMALOCK_AUTH_KEY_FILE"); f != nullptr && *f != '\0') {
    return auth::LoadKeyFile(f, false);
  }
  return std::string();
}

}  // namespace

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->Start(); }

Client::~Client() {
  if (impl_->inherited()) {
    // A forked child's copy: its threads are the parent's and its connections too. Nothing of
    // it is destroyed (fork_guard.h).
    fork_guard::Bury(std::move(impl_));
    return;
  }
  impl_->Close();  // on this thread; if it is one of the client's own, that one is detached
}

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.server.empty()) {
    return Error(ErrorCode::kInvalidArgument,
                 "ClientOptions::server is empty: name lockd's "
                 "address");
  }
  return ConnectResolving(options, nullptr);
}

namespace {

Result<std::unique_ptr<Connection>> VerbsConnect(const ChannelParams& p, uint32_t* retry_ms,
                                                 proto::RejectReason* reason) {
  RDMALOCK_ASSIGN_OR_RETURN(auto mem, VerbsMemory::Connect(p, retry_ms, reason));
  return std::unique_ptr<Connection>(std::move(mem));
}

// The first connection of a client and its Impl, through `connector`.
using Resolve = std::function<Result<std::pair<std::string, uint16_t>>()>;  // Client::Resolver

Result<std::shared_ptr<Client::Impl>> ConnectImpl(const ClientOptions& options, Resolve resolve,
                                                  Connector connector) {
  fork_guard::Install();  // before the first connection (see Client::~Client)
  ClientOptions opts = options;
  if (opts.client_name.empty()) opts.client_name = DefaultClientName();
  RDMALOCK_ASSIGN_OR_RETURN(opts.auth_key, ResolveAuthKey(opts));
  opts.auth_key_file.clear();
  // lockd in its restart grace period refuses connections for a while, its per-address rate
  // limit refuses bursts, and a lockd that is (re)starting may not listen yet: retry those (when
  // lockd says, else with back-off) within the connect timeout. Other refusals (version, server
  // full, bad address) are final. A lockd that can move (a resolver) is looked up before every
  // attempt, and any connection failure is retried: the one it named may have just failed.
  const auto deadline = Clock::now() + opts.connect_timeout;
  auto backoff = std::chrono::milliseconds(20);
  for (;;) {
    Status failed;
    uint32_t retry_ms = 0;
    if (resolve) {
      auto where = resolve();
      if (where.ok()) {
        std::tie(opts.server, opts.port) = *where;
      } else {
        failed = where.status();
      }
    }
    if (failed.ok()) {
      ChannelParams p{opts.server, opts.port,
                      AttemptTimeout(opts.connect_timeout, resolve != nullptr), opts.client_name,
                      0};
      p.auth_key = opts.auth_key;
      auto first = connector(p, &retry_ms, nullptr);
      Result<std::chrono::nanoseconds> liveness = first.status();
      if (first.ok()) liveness = ReadLiveness(**first);
      if (liveness.ok()) {
        return std::make_shared<Client::Impl>(opts, std::move(first).value(), *liveness,
                                              std::move(resolve), std::move(connector));
      }
      failed = liveness.status();
    }
    std::chrono::milliseconds retry = backoff;
    // With a resolver, whatever did not come as lockd's own refusal is retried: the lockd it
    // named may be a stopped or cut-off primary (its rdma_cm never answers: kTimeout), and
    // etcd names the new one once its key expires. A failover costs time, not an error
    // (issue 16, finding 14).
    const bool moving_retry = resolve && (failed.code() == ErrorCode::kConnection ||
                                          failed.code() == ErrorCode::kTimeout);
    if (retry_ms > 0) {
      retry = std::chrono::milliseconds(retry_ms);
    } else if (!IsNotListening(failed) && !moving_retry) {
      return failed;
    }
    if (Clock::now() + retry >= deadline) return failed;
    std::this_thread::sleep_for(retry);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace

Result<std::unique_ptr<Client>> Client::ConnectResolving(const ClientOptions& options,
                                                         Resolver resolve) {
  RDMALOCK_ASSIGN_OR_RETURN(auto impl, ConnectImpl(options, std::move(resolve), VerbsConnect));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

// In a forked child the accessors say 0: the client's mutex may be held by a parent's thread.
uint64_t Client::SlotOf(std::string_view name) const {
  if (impl_->inherited()) return 0;
  return SlotForName(name, impl_->latest_session()->reply.lock_count);
}
uint64_t Client::lock_count() const {
  return impl_->inherited() ? 0 : impl_->latest_session()->reply.lock_count;
}
uint64_t Client::session_id() const {
  if (impl_->inherited()) return 0;
  auto s = impl_->session();
  return s ? s->reply.session_id : 0;
}
uint64_t Client::epoch() const {
  if (impl_->inherited()) return 0;
  auto s = impl_->session();
  return s ? s->reply.epoch : 0;
}
std::chrono::nanoseconds Client::lease() const {
  if (impl_->inherited()) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(impl_->latest_session()->reply.lease_ns);
}

Result<LockHandle> Client::Lock(std::string_view name, const LockOptions& options) {
  if (name.empty()) return Error(ErrorCode::kInvalidArgument, "lock name is empty");
  const auto deadline =
      options.timeout ? Clock::now() + *options.timeout : Clock::time_point::max();
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel(deadline));
  return LockSlot(SlotForName(name, ch->session->reply.lock_count), options);
}

Result<LockHandle> Client::TryLock(std::string_view name, LockMode mode) {
  LockOptions o;
  o.mode = mode;
  o.timeout = std::chrono::milliseconds(0);
  return Lock(name, o);
}

Result<LockHandle> Client::TryLockSlot(uint64_t slot, LockMode mode) {
  LockOptions o;
  o.mode = mode;
  o.timeout = std::chrono::milliseconds(0);
  return LockSlot(slot, o);
}

Result<LockHandle> Client::LockSlot(uint64_t slot, const LockOptions& options) {
  if (options.timeout && options.timeout->count() < 0) {
    return Error(ErrorCode::kInvalidArgument, "negative lock timeout");
  }
  const Clock::time_point started = Clock::now();
  AcquireOptions ao;
  const auto mode = static_cast<Mode>(options.mode);
  if (options.timeout) {
    ao.deadline = Clock::now() + *options.timeout;
    ao.try_only = options.timeout->count() == 0;
  }
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel(ao.deadline));
  const Session& sess = *ch->session;
  ao.want_token = options.fencing_token && mode == Mode::kExclusive;
  if (!impl_->budget_->Take(slot)) return impl_->budget_->Refusal(slot);
  std::unique_lock clk(ch->mu);
  std::tie(ao.record, ao.record_seq) = ch->TakeEntry(impl_->options().record_requests);
  ao.pending = &ch->pending;
  auto grant = sess.engine->Acquire(*ch->mem, slot, mode, ao, &ch->events);
  ch->NotePending();
  clk.unlock();
  if (!grant.ok()) {
    impl_->budget_->Give(slot);  // an abandoned ticket took a unit of its own
    if (grant.status().code() == ErrorCode::kTimeout) ++ch->timeouts;
    impl_->OnSessionError(sess.gen, grant.status());
    return grant.status();
  }
  impl_->Fault("granted");
  LockHandle h = impl_->MakeHandle(*ch, *grant, options.auto_renew, started);
  if (h.state() == LockState::kLost) return EndedWhileGranted();
  return h;
}

Status Client::LockAsync(std::string_view name, const LockOptions& options, LockCallback done) {
  if (name.empty()) return Error(ErrorCode::kInvalidArgument, "lock name is empty");
  if (impl_->inherited()) return Impl::InheritedError();
  return LockSlotAsync(SlotForName(name, impl_->latest_session()->reply.lock_count), options,
                       std::move(done));
}

Status Client::LockSlotAsync(uint64_t slot, const LockOptions& options, LockCallback done) {
  if (!done) return Error(ErrorCode::kInvalidArgument, "LockSlotAsync needs a callback");
  if (impl_->inherited()) return Impl::InheritedError();
  if (options.timeout && options.timeout->count() < 0) {
    return Error(ErrorCode::kInvalidArgument, "negative lock timeout");
  }
  const uint64_t count = impl_->latest_session()->reply.lock_count;
  if (slot >= count) {
    return Error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) +
                                                  " is out of range (lock_count " +
                                                  std::to_string(count) + ")");
  }
  if (!impl_->budget_->Take(slot)) return impl_->budget_->Refusal(slot);
  Impl::AsyncRequest r;
  r.slot = slot;
  r.mode = static_cast<Mode>(options.mode);
  r.options = options;
  if (options.timeout) r.deadline = Clock::now() + *options.timeout;
  // A request that ends without a grant gives its unit back; a grant's handle holds it.
  r.done = [budget = impl_->budget_, slot, done = std::move(done)](Result<LockHandle> h) {
    if (!h.ok()) budget->Give(slot);
    done(std::move(h));
  };
  Status st = impl_->Submit(std::move(r));
  if (!st.ok()) impl_->budget_->Give(slot);
  return st;
}

Result<std::vector<LockHandle>> Client::LockMany(std::span<const LockRequest> requests,
                                                 const LockOptions& options) {
  const auto deadline =
      options.timeout ? Clock::now() + *options.timeout : Clock::time_point::max();
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel(deadline));
  std::vector<SlotRequest> slots;
  slots.reserve(requests.size());
  for (const LockRequest& r : requests) {
    if (r.name.empty()) return Error(ErrorCode::kInvalidArgument, "lock name is empty");
    slots.push_back({SlotForName(r.name, ch->session->reply.lock_count), r.mode});
  }
  return LockManySlots(slots, options);
}

Result<std::vector<LockHandle>> Client::LockManySlots(std::span<const SlotRequest> requests,
                                                      const LockOptions& options) {
  if (options.timeout && options.timeout->count() < 0) {
    return Error(ErrorCode::kInvalidArgument, "negative lock timeout");
  }
  if (requests.empty()) return std::vector<LockHandle>{};
  const Clock::time_point started = Clock::now();
  // Canonical order, one request per slot (exclusive wins).
  std::vector<ManyRequest> reqs;
  reqs.reserve(requests.size());
  for (const SlotRequest& r : requests) reqs.push_back({r.slot, static_cast<Mode>(r.mode)});
  std::sort(reqs.begin(), reqs.end(), [](const ManyRequest& a, const ManyRequest& b) {
    return a.slot != b.slot ? a.slot < b.slot : a.mode < b.mode;  // kExclusive (0) first
  });
  reqs.erase(
      std::unique(reqs.begin(), reqs.end(),
                  [](const ManyRequest& a, const ManyRequest& b) { return a.slot == b.slot; }),
      reqs.end());
  AcquireOptions ao;
  if (options.timeout) {
    ao.deadline = Clock::now() + *options.timeout;
    ao.try_only = options.timeout->count() == 0;
  }
  ao.want_token = options.fencing_token;
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel(ao.deadline));
  const Session& sess = *ch->session;
  const bool recording = impl_->options().record_requests;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!impl_->budget_->Take(reqs[i].slot)) {
      for (size_t j = 0; j < i; ++j) impl_->budget_->Give(reqs[j].slot);
      return impl_->budget_->Refusal(reqs[i].slot);
    }
  }
  std::unique_lock clk(ch->mu);
  ao.pending = &ch->pending;
  auto grants = sess.engine->AcquireMany(
      *ch->mem, reqs, ao, [&] { return ch->TakeEntry(recording); }, &ch->events);
  ch->NotePending();
  clk.unlock();
  if (!grants.ok()) {
    for (const ManyRequest& r : reqs) impl_->budget_->Give(r.slot);
    if (grants.status().code() == ErrorCode::kTimeout) ++ch->timeouts;
    impl_->OnSessionError(sess.gen, grants.status());
    return grants.status();
  }
  ++ch->batches;
  std::vector<LockHandle> out;
  out.reserve(grants->size());
  impl_->Fault("granted");
  bool ended = false;
  for (const Grant& g : *grants) {
    out.push_back(impl_->MakeHandle(*ch, g, options.auto_renew, started));
    ended = ended || out.back().state() == LockState::kLost;
  }
  if (ended) return EndedWhileGranted();  // all or nothing: the handles' session is gone
  return out;
}

Status Client::ReleaseMany(std::span<LockHandle> handles) {
  if (impl_->inherited()) return Impl::InheritedError();
  // A loss callback run by a release below may destroy this Client: its Impl stays.
  const std::shared_ptr<Impl> impl = impl_;
  auto ch = impl->Channel(Clock::now());
  std::vector<LockHandle::State*> batch;
  std::vector<std::unique_lock<std::mutex>> locks;
  Status first;
  auto note = [&](const Status& st) {
    if (first.ok() && !st.ok()) first = st;
  };
  for (LockHandle& h : handles) {
    if (!h.state_) continue;
    std::unique_lock lk(h.state_->mu);
    if (ch.ok() && h.state_->state == LockState::kHeld && h.state_->session == (*ch)->session) {
      batch.push_back(h.state_.get());
      locks.push_back(std::move(lk));
      continue;
    }
    lk.unlock();
    note(h.Release());  // not batchable: says why (released, lost, other session)
  }
  if (batch.empty()) return first;
  ThreadChannel& c = **ch;
  std::vector<Grant> grants;
  grants.reserve(batch.size());
  for (auto* s : batch) grants.push_back(s->grant);
  std::vector<Status> res;
  {
    std::lock_guard clk(c.mu);
    if (Status st = c.Reap(); !st.ok()) {
      res.assign(batch.size(), st);
    } else {
      res = c.session->engine->ReleaseMany(*c.mem, grants, &c.events);
    }
  }
  Status conn;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (res[i].ok()) {
      batch[i]->SetState(LockState::kReleased);
      ++c.releases;
    } else {
      batch[i]->SetState(LockState::kLost);
      batch[i]->lost_reported = true;
      ++c.lost;
      if (res[i].code() == ErrorCode::kConnection) conn = res[i];
    }
    note(res[i]);
  }
  locks.clear();
  if (!conn.ok()) impl->OnSessionError(c.session->gen, conn);
  return first;
}

Status Client::Flush() {
  auto ch = impl_->Channel(Clock::now());
  if (!ch.ok()) return ch.status();
  Status st;
  {
    std::lock_guard clk((*ch)->mu);
    st = (*ch)->Reap();
  }
  if (!st.ok()) impl_->OnSessionError((*ch)->session->gen, st);
  return st;
}

Result<ServerInfo> Client::Info() {
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel());
  std::vector<uint8_t> page(proto::InfoPage::kEncodedSize);
  std::unique_lock clk(ch->mu);
  Status rs = ch->Reap();
  if (rs.ok()) rs = ch->mem->ReadBytes(RegionId::kInfo, 0, page);
  clk.unlock();
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
  std::unique_lock clk(ch->mu);
  Status rs = ch->Reap();
  if (rs.ok()) rs = ch->mem->ReadBytes(RegionId::kLocks, proto::SlotOffset(first), bytes);
  clk.unlock();
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
  std::unique_lock clk(ch->mu);
  Status st = ch->Reap();
  if (st.ok()) st = ch->mem->ReadBytes(RegionId::kSessions, 0, table);
  if (st.ok()) st = ch->mem->ReadBytes(RegionId::kInfo, 0, page);
  if (!st.ok()) {
    clk.unlock();
    impl_->OnSessionError(ch->session->gen, st);
    return st;
  }
  const uint64_t lockd_now = proto::InfoPage::DecodeFrom(page).clock_unix_ns;
  std::vector<SessionInfo> out;
  std::unordered_map<uint64_t, proto::Word0> words;  // slot -> word0, read once per slot
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
          RemoteOp rd = RemoteOp::Read(RegionId::kLocks, proto::SlotOffset(entry.slot), 8);
          if (Status rs = ch->mem->Execute(rd); !rs.ok()) {
            clk.unlock();
            impl_->OnSessionError(ch->session->gen, rs);
            return rs;
          }
          it = words.emplace(entry.slot, proto::Word0::Decode(rd.result[0])).first;
        }
        const proto::Word0 w = it->second;
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

ClientStats Client::Stats() const { return impl_->inherited() ? ClientStats{} : impl_->Stats(); }

// ---- LockHandle

namespace {
Status ReleaseHeld(LockHandle::State& s, Client::Impl* impl);
}  // namespace

LockHandle::LockHandle(LockHandle&& o) noexcept : state_(std::move(o.state_)) {}
LockHandle& LockHandle::operator=(LockHandle&& o) noexcept {
  if (this != &o) {
    if (state_) (void)Release();
    state_ = std::move(o.state_);
  }
  return *this;
}
LockHandle::~LockHandle() {
  if (state_) (void)Release();
}

uint64_t LockHandle::slot() const { return state_ ? state_->grant.ticket.slot : 0; }
LockMode LockHandle::mode() const {
  return state_ ? static_cast<LockMode>(state_->grant.ticket.mode) : LockMode::kExclusive;
}
// A grant whose lease has run out is lost, whether or not the keeper has noticed yet (it may be
// stuck, or renewal off): waiters may recover it from then on.
LockState LockHandle::state() const {
  if (!state_) return LockState::kReleased;
  if (state_->inherited()) return LockState::kLost;  // a forked child holds nothing
  std::lock_guard lk(state_->mu);
  if (state_->state == LockState::kHeld &&
      !state_->session->engine->LeaseValid(state_->grant, Clock::now())) {
    return LockState::kLost;
  }
  return state_->state;
}
uint64_t LockHandle::fencing_token() const {
  if (!state_ || state_->inherited()) return 0;
  std::lock_guard lk(state_->mu);
  return state_->grant.token;
}
std::chrono::steady_clock::time_point LockHandle::lease_expiry() const {
  if (!state_ || state_->inherited()) return {};
  std::lock_guard lk(state_->mu);
  const auto end = state_->grant.lease_start + state_->session->engine->params().lease;
  if (const auto* t = state_->session->engine->params().trusted_until; t != nullptr) {
    // A cluster-mode lockd not seen alive: no lease lasts past that (issue 16, finding 4).
    const auto trusted = Clock::time_point(Clock::duration(t->load()));
    return std::min(end, trusted);
  }
  return end;
}

void LockHandle::OnLost(std::function<void(const Status&)> callback) {
  if (!state_ || state_->inherited()) return;
  std::lock_guard lk(state_->mu);
  state_->on_lost = std::move(callback);
}

Status LockHandle::Release() {
  if (!state_) return Error(ErrorCode::kNotHeld, "empty lock handle");
  // In a forked child: the parent holds the lock; releasing it from here would release theirs.
  if (state_->inherited()) return Client::Impl::InheritedError();
  auto impl = state_->client.lock();
  Status st = ReleaseHeld(*state_, impl.get());
  if (impl && st.code() == ErrorCode::kConnection) impl->OnSessionError(state_->session->gen, st);
  return st;
}

namespace {

Status ReleaseHeld(LockHandle::State& s, Client::Impl* impl) {
  auto* state_ = &s;
  // The calling thread's connection first, before the handle's mutex: a thread with none joins
  // the session, and a join that fails ends it, whose EndLeases takes every handle's mutex (this
  // one's too, on this thread: it deadlocked).
  Result<ThreadChannel*> ch = impl
                                  ? impl->Channel(Clock::now())
                                  : Result<ThreadChannel*>(Error(ErrorCode::kConnection, "closed"));
  std::lock_guard lk(state_->mu);
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
  if (ch.ok() && (*ch)->session != state_->session) {
    ch = Error(ErrorCode::kLockLost, "session with lockd ended; lock lost");
  }
  Status st = ch.status();
  if (ch.ok()) {
    ThreadChannel& c = **ch;
    std::lock_guard clk(c.mu);
    // Posted, not waited for, unless waiters were seen queued behind: the CAS's completion is
    // reaped by this thread's next call, or by the reaper thread (ReapLeftReleases). Only the
    // checks before posting can fail here.
    st = c.Reap();
    const LockEngine& engine = *state_->session->engine;
    if (st.ok() && LockEngine::BlocksOthers(state_->grant)) {
      st = engine.Release(*c.mem, state_->grant, &c.events);  // a handover: at once
    } else if (st.ok()) {
      st = engine.StartRelease(*c.mem, state_->grant, &c.pending, &c.events);
    }
    c.NotePending();
    if (c.pending.active) impl->ReleasePosted();
  }
  if (st.ok()) {
    state_->SetState(LockState::kReleased);
    ++(*ch)->releases;
  } else {
    // Lost, or the connection failed so the release may not have happened: either way this
    // process no longer holds a lock it can rely on.
    state_->SetState(LockState::kLost);
    state_->lost_reported = true;
    if (ch.ok()) ++(*ch)->lost;
  }
  return st;
}

}  // namespace

Status LockHandle::Renew() {
  if (!state_) return Error(ErrorCode::kNotHeld, "empty lock handle");
  if (state_->inherited()) return Client::Impl::InheritedError();
  auto impl = state_->client.lock();
  if (!impl) return Error(ErrorCode::kConnection, "client closed");
  Status st;
  // The connection before the handle's mutex, as in ReleaseHeld (a failed join ends the session,
  // and ending it takes this handle's mutex).
  auto chr = impl->Channel(Clock::now());
  {
    std::lock_guard lk(state_->mu);
    if (state_->state != LockState::kHeld) return Error(ErrorCode::kNotHeld, "lock is not held");
    RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, std::move(chr));
    if (ch->session != state_->session) {
      state_->SetState(LockState::kLost);
      return Error(ErrorCode::kLockLost, "session with lockd ended; lock lost");
    }
    {
      std::lock_guard clk(ch->mu);
      st = ch->Reap();
      if (st.ok()) st = state_->session->engine->Renew(*ch->mem, state_->grant, &ch->events);
    }
    if (st.code() == ErrorCode::kLockLost) state_->SetState(LockState::kLost);
  }
  if (st.code() == ErrorCode::kConnection) impl->OnSessionError(state_->session->gen, st);
  return st;
}

// ---- ClientTestPeer

void ClientTestPeer::SetFaultPoint(Client& c, std::function<void(std::string_view)> fn) {
  c.impl_->fault_ = std::move(fn);
}

void ClientTestPeer::FailSession(Client& c, const std::string& why) {
  if (auto s = c.impl_->session()) {
    c.impl_->OnSessionError(s->gen, Error(ErrorCode::kConnection, why));
  }
}

Result<std::unique_ptr<Client>> ClientTestPeer::Connect(const ClientOptions& options,
                                                        Connector connector) {
  RDMALOCK_ASSIGN_OR_RETURN(auto impl, ConnectImpl(options, nullptr, std::move(connector)));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

uint64_t ClientTestPeer::JoinKey(Client& c) {
  auto s = c.impl_->session();
  return s ? s->reply.join_key : 0;
}

std::weak_ptr<const void> ClientTestPeer::Lifetime(Client& c) { return c.impl_; }

}  // namespace rdmalock
