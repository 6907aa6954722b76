// Client's calls: connecting, and the blocking acquires and releases on the calling thread's
// channel. The rest of Client::Impl (client_impl.h) is implemented by concern beside it.
#include "rdmalock/client.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <thread>
#include <tuple>

#include "client/src/client_impl.h"
#include "client/src/options_check.h"
#include "common/auth/auth.h"
#include "engine/verbs_memory.h"

namespace rdmalock {

using sdk::AttemptTimeout;
using sdk::EndedWhileGranted;
using sdk::ReadLiveness;
using sdk::Session;
using sdk::ThreadChannel;
using sdk::VerbsConnect;

uint64_t SlotForName(std::string_view name, uint64_t lock_count) {
  if (lock_count == 0) return 0;  // as the C API and Python say; no division by zero
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

}  // namespace

namespace sdk {

// One connection attempt's limit. A lockd that can move (a shard's primary, looked up in etcd
// before each attempt) is given a few seconds: the one named may be cut off, and waiting the whole
// connect timeout for it would leave a failed-over shard unused meanwhile.
std::chrono::milliseconds AttemptTimeout(std::chrono::milliseconds connect_timeout, bool moving) {
  return moving ? std::min(connect_timeout, std::chrono::milliseconds(3000)) : connect_timeout;
}

Status SlotBudget::Refusal(uint64_t slot) const {
  return Error(ErrorCode::kResource,
               "this client has " + std::to_string(per_slot()) + " requests on slot " +
                   std::to_string(slot) +
                   " already, the most one lock word can count for each of lockd's "
                   "max_clients sessions (32767 / max_clients)");
}

// A channel's first READ of lockd's info page: its liveness timeout (0 for a lockd without one).
Result<std::chrono::nanoseconds> ReadLiveness(RemoteMemory& mem) {
  RemoteOp rd = RemoteOp::Read(RegionId::kInfo, proto::InfoPage::kLivenessTimeoutNs, 8);
  RDMALOCK_RETURN_IF_ERROR(mem.Execute(rd));
  return std::chrono::nanoseconds(static_cast<int64_t>(rd.result[0]));
}

Result<std::unique_ptr<Connection>> VerbsConnect(const ChannelParams& p, uint32_t* retry_ms,
                                                 proto::RejectReason* reason) {
  RDMALOCK_ASSIGN_OR_RETURN(auto mem, VerbsMemory::Connect(p, retry_ms, reason));
  return std::unique_ptr<Connection>(std::move(mem));
}

}  // namespace sdk

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

namespace sdk {

Status CheckClientOptions(const ClientOptions& options, bool port_elsewhere) {
  // Checked at Connect, not found out later: a connect_timeout of milliseconds::max() overflowed
  // when added to now() (every deadline in the past), and port 0 failed with an error that did
  // not name it (found by review, 2026-12-06).
  if (options.connect_timeout <= std::chrono::milliseconds(0) ||
      options.connect_timeout > ClientOptions::kMaxConnectTimeout) {
    return Error(ErrorCode::kInvalidArgument, "ClientOptions::connect_timeout is " +
                                                  std::to_string(options.connect_timeout.count()) +
                                                  " ms; give 1 ms to 366 days");
  }
  if (options.port == 0 && !port_elsewhere) {
    return Error(ErrorCode::kInvalidArgument, "ClientOptions::port is 0: give lockd's port");
  }
  return Status::Ok();
}

}  // namespace sdk

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

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

// The first connection of a client and its Impl, through `connector`.
Result<std::shared_ptr<Client::Impl>> ConnectImpl(const ClientOptions& options, Resolve resolve,
                                                  Connector connector) {
  // A resolver (a shard's primary in etcd) says the port.
  RDMALOCK_RETURN_IF_ERROR(sdk::CheckClientOptions(options, static_cast<bool>(resolve)));
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
    bool joins_failed = false;  // the first connection was made, the keeper's or reaper's join not
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
        auto impl = std::make_shared<Client::Impl>(opts, std::move(first).value(), *liveness,
                                                   resolve, connector);
        // The keeper's and the reaper's connections, before any other thread can join.
        failed = impl->JoinOwnThreads();
        if (failed.ok()) return impl;
        // Not the session's connection cap (final: kResource): the session ended while Connect
        // joined it (lockd fenced it, or its first connection dropped, e.g. under packet loss
        // on two hosts). Start again with a new session, within the connect timeout.
        joins_failed = failed.code() != ErrorCode::kResource;
      } else {
        failed = liveness.status();
      }
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
    } else if (!IsNotListening(failed) && !moving_retry && !joins_failed) {
      return failed;
    }
    if (Clock::now() + retry >= deadline) return failed;
    std::this_thread::sleep_for(retry);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}
Result<std::unique_ptr<Client>> Client::ConnectResolving(const ClientOptions& options,
                                                         Resolver resolve) {
  RDMALOCK_ASSIGN_OR_RETURN(auto impl, ConnectImpl(options, std::move(resolve), VerbsConnect));
  // The Client first, then its threads: once they run, only ~Client (Close) ends them.
  auto client = std::unique_ptr<Client>(new Client(std::move(impl)));
  RDMALOCK_RETURN_IF_ERROR(client->impl_->Start());  // else ~Client closes what started
  return client;
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
  const auto deadline = options.timeout ? sdk::DeadlineAfter(Clock::now(), *options.timeout)
                                        : Clock::time_point::max();
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel(deadline));
  const uint64_t count = ch->session->reply.lock_count;
  impl_->TestHook("hashed");
  LockOptions left = options;  // the session wait took part of the timeout
  left.timeout = sdk::TimeoutLeft(options.timeout, deadline, Clock::now());
  auto h = LockSlot(SlotForName(name, count), left);
  if (h.ok()) RDMALOCK_RETURN_IF_ERROR(sdk::SameNameMapping(*h->state_, count));
  // The name's slot is in range of the count it was hashed with: past the count LockSlot checked
  // it against, lockd came back with fewer locks (kConnection, as any change of the count).
  if (h.status().code() == ErrorCode::kInvalidArgument) {
    RDMALOCK_RETURN_IF_ERROR(sdk::SameNameMapping(count, lock_count()));
  }
  return h;
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
  // Where the acquire's latency starts. No clock is read for it here: unset, it starts at the
  // grant's first FETCH_AND_ADD (Grant::requested, a reading the engine takes anyway), and a
  // request that waits in the cohort reads the clock when it queues (CohortAcquire).
  Clock::time_point started{};
  AcquireOptions ao;
  const auto mode = static_cast<Mode>(options.mode);
  if (options.timeout) {
    started = Clock::now();
    ao.deadline = sdk::DeadlineAfter(started, *options.timeout);
    ao.try_only = options.timeout->count() == 0;
  }
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel(ao.deadline));
  // Before the cohort: its key drops a slot's top bit, so a slot out of range shared another
  // slot's entry, and a waiter could be handed that slot's grant (found by review, 2026-12-06).
  if (const uint64_t count = ch->session->reply.lock_count; slot >= count) {
    return Error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) +
                                                  " is out of range (lock_count " +
                                                  std::to_string(count) + ")");
  }
  ao.want_token = options.fencing_token && mode == Mode::kExclusive;
  // Cohort handover (cohort.h): an exclusive request queues behind another of this client's
  // threads that holds or acquires the lock, and may get its grant in-process. A try-lock is
  // busy at once then, token or not (lockd would say so too).
  sdk::CohortTable* cohort = impl_->cohort().get();
  bool owner = false;  // this request owns its slot's cohort entry: pass it on if it fails
  if (cohort != nullptr && mode == Mode::kExclusive) {
    auto local = impl_->CohortAcquire(&ch, slot, ao, options.auto_renew, &started, &owner);
    if (!local.ok() || local->valid()) return local;
  }
  // A shared request joins the session's shared grant of the slot in-process when another of
  // the client's threads holds one that readers may still join; if it owns the entry, its grant
  // from lockd becomes one that later readers can join (cohort.h). Only auto-renewed requests:
  // readers share one lease, which the keeper renews.
  bool share = false;
  if (impl_->SharesInCohort(mode, options)) {
    if (LockHandle joined = impl_->CohortShare(*ch, slot, &owner); joined.valid()) return joined;
    share = owner;
  }
  const Session& sess = *ch->session;
  if (!impl_->budget_->Take(slot)) {
    if (owner) cohort->Leave(slot);
    return impl_->budget_->Refusal(slot);
  }
  MutexLock clk(&ch->mu);
  std::tie(ao.record, ao.record_seq) = ch->TakeEntry(impl_->options().record_requests);
  ao.pending = &ch->pending;
  auto grant = sess.engine->Acquire(*ch->mem, slot, mode, ao, &ch->events);
  ch->NotePending();
  const Clock::time_point completed = ch->mem->last_completed();  // the channel's, under its lock
  clk.Unlock();
  if (!grant.ok()) {
    if (owner) cohort->Leave(slot);  // the next local waiter, if any, tries lockd itself
    impl_->budget_->Give(slot);      // an abandoned ticket took a unit of its own
    if (grant.status().code() == ErrorCode::kTimeout) ++ch->timeouts;
    impl_->OnSessionError(sess.gen, grant.status());
    return grant.status();
  }
  impl_->TestHook("granted");
  LockHandle h = impl_->MakeHandle(*ch, *grant, completed, options.auto_renew, started,
                                   owner ? impl_->cohort().get() : nullptr);
  // Lost already: the session ended while the grant was made (MakeHandle could not track it).
  // Read without the handle's mutex or a clock: the engine granted it within its lease.
  if (h.state_->ended.load(std::memory_order_acquire)) return EndedWhileGranted();
  if (share) {
    impl_->TestHook("sharing");
    // Lost meanwhile (the session ended since the check above): ShareGrant hands the grant back
    // as it is, and the caller gets the error, as above (the async path's FinishGranted too).
    LockHandle shared = impl_->ShareGrant(std::move(h), *ch);
    if (!shared.state_->carrier) return EndedWhileGranted();
    return shared;
  }
  return h;
}

Result<std::vector<LockHandle>> Client::LockMany(std::span<const LockRequest> requests,
                                                 const LockOptions& options) {
  const auto deadline = options.timeout ? sdk::DeadlineAfter(Clock::now(), *options.timeout)
                                        : Clock::time_point::max();
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel(deadline));
  const uint64_t count = ch->session->reply.lock_count;
  std::vector<SlotRequest> slots;
  slots.reserve(requests.size());
  for (const LockRequest& r : requests) {
    if (r.name.empty()) return Error(ErrorCode::kInvalidArgument, "lock name is empty");
    slots.push_back({SlotForName(r.name, count), r.mode});
  }
  impl_->TestHook("hashed");
  LockOptions left = options;  // the session wait took part of the timeout
  left.timeout = sdk::TimeoutLeft(options.timeout, deadline, Clock::now());
  auto handles = LockManySlots(slots, left);
  if (handles.ok()) {
    for (const LockHandle& h : *handles) {  // all or nothing: dropped, they release
      RDMALOCK_RETURN_IF_ERROR(sdk::SameNameMapping(*h.state_, count));
    }
  } else if (handles.status().code() == ErrorCode::kInvalidArgument) {  // as Lock's
    RDMALOCK_RETURN_IF_ERROR(sdk::SameNameMapping(count, lock_count()));
  }
  return handles;
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
    ao.deadline = sdk::DeadlineAfter(Clock::now(), *options.timeout);
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
  MutexLock clk(&ch->mu);
  ao.pending = &ch->pending;
  auto grants = sess.engine->AcquireMany(
      *ch->mem, reqs, ao, [&] { return ch->TakeEntry(recording); }, &ch->events);
  ch->NotePending();
  const Clock::time_point completed = ch->mem->last_completed();
  clk.Unlock();
  if (!grants.ok()) {
    for (const ManyRequest& r : reqs) impl_->budget_->Give(r.slot);
    if (grants.status().code() == ErrorCode::kTimeout) ++ch->timeouts;
    impl_->OnSessionError(sess.gen, grants.status());
    return grants.status();
  }
  ++ch->batches;
  std::vector<LockHandle> out;
  out.reserve(grants->size());
  impl_->TestHook("granted");
  bool ended = false;
  // Cohort handover (cohort.h): an exclusive grant of the set takes its slot's cohort entry if
  // no other of the client's requests has it, so that the client's threads that want the lock
  // meanwhile queue in-process behind this handle and are handed the grant at its release.
  // Taken only once granted, never waited for: a set waits only at lockd (in slot order, as
  // AcquireMany's deadlock freedom needs), and holds no entry of a lock it gave back there. An
  // entry another request owns (it queues at lockd behind this grant) stays that request's.
  sdk::CohortTable* cohort = impl_->cohort().get();
  for (const Grant& g : *grants) {
    sdk::CohortTable* own = nullptr;
    if (cohort != nullptr && g.ticket.mode == Mode::kExclusive &&
        cohort->TryOwn(g.ticket.slot) == sdk::CohortTable::Join::kOwner) {
      own = cohort;
    }
    out.push_back(impl_->MakeHandle(*ch, g, completed, options.auto_renew, started, own));
    ended = ended || out.back().state_->ended.load(std::memory_order_acquire);
  }
  if (ended) return EndedWhileGranted();  // all or nothing: the handles' session is gone
  return out;
}

Status Client::ReleaseMany(std::span<LockHandle> handles) {
  if (impl_->inherited()) return Impl::InheritedError();
  // A loss callback run by a release below may destroy this Client: its Impl stays.
  const std::shared_ptr<Impl> impl = impl_;
  // A join that ends the session tells these handles' losses by this call's result alone.
  std::vector<LockHandle::State*> releasing;
  releasing.reserve(handles.size());
  for (const LockHandle& h : handles) releasing.push_back(h.state_.get());
  auto ch = impl->Channel(Clock::now(), Impl::LossCaller{nullptr, false, releasing});
  std::vector<LockHandle::State*> batch;
  std::vector<size_t> batch_at;  // batch[i] is handles[batch_at[i]]
  sdk::HeldStates locks;         // batch's mutexes, held until their states are set
  // Each handle's outcome, so that the first error is the first in `handles`' order.
  std::vector<Status> outcome(handles.size());
  // The states' mutexes are taken in one order, by address, whatever the order of `handles`:
  // states are pooled and reused, so two calls could otherwise take the same two mutexes in
  // opposite orders (ThreadSanitizer's lock-order-inversion, and a deadlock were two threads
  // ever to release overlapping handles at once).
  // Handles that cannot go in the batch (released or lost already, another session's, a reader's
  // share of a grant): released one by one, after the batch's mutexes are unlocked. Released
  // while they are held, a reader's release that ended the session (its grant's last reader, on a
  // broken connection) deadlocked this thread: ending a session takes every held handle's mutex.
  std::vector<size_t> later;
  std::vector<size_t> order(handles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::less<>{}(handles[a].state_.get(), handles[b].state_.get());
  });
  for (const size_t at : order) {
    LockHandle& h = handles[at];
    if (!h.state_) continue;
    locks.Lock(h.state_.get());
    h.state_->mu.AssertHeld();
    // A rider (a shared grant joined in-process, cohort.h) has no grant of its own to batch.
    if (ch.ok() && h.state_->state == LockState::kHeld && !h.state_->carrier &&
        h.state_->ctx->session == (*ch)->session) {
      // A local waiter queued for this lock (cohort.h) is handed the grant in-process, as
      // LockHandle::Release does; the rest go to lockd together.
      if (impl->HandOver(*h.state_, **ch)) {
        h.state_->SetState(LockState::kReleased);
        ++(*ch)->releases;
        locks.UnlockLast();
        continue;
      }
      batch.push_back(h.state_.get());
      batch_at.push_back(at);
      continue;
    }
    locks.UnlockLast();
    later.push_back(at);  // not batchable: its own release says why (released, lost, ...)
  }
  const auto first = [&] {
    // Each handle's own release, in `handles`' order once the batch's mutexes are unlocked.
    std::sort(later.begin(), later.end());
    for (const size_t at : later) outcome[at] = handles[at].Release();
    for (const Status& st : outcome) {
      if (!st.ok()) return st;
    }
    return Status::Ok();
  };
  if (batch.empty()) return first();
  ThreadChannel& c = **ch;
  std::vector<Grant> grants;
  grants.reserve(batch.size());
  for (auto* s : batch) {
    s->mu.AssertHeld();  // in `locks`
    grants.push_back(s->grant);
  }
  std::vector<Status> res;
  {
    MutexLock clk(&c.mu);
    if (Status st = c.Reap(); !st.ok()) {
      res.assign(batch.size(), st);
    } else {
      res = c.session->engine->ReleaseMany(*c.mem, grants, &c.events);
    }
  }
  Status conn;
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->mu.AssertHeld();  // in `locks`
    if (res[i].ok()) {
      batch[i]->SetState(LockState::kReleased);
      ++c.releases;
    } else {
      batch[i]->LoseTold();
      ++c.lost;
      if (res[i].code() == ErrorCode::kConnection) conn = res[i];
    }
    outcome[batch_at[i]] = res[i];
  }
  locks.UnlockAll();
  // The handles given to this call are told their losses by its result (as the join above):
  // `later`'s readers, still held here, heard it through OnLost too (found by review,
  // 2026-12-07).
  if (!conn.ok())
    impl->OnSessionError(c.session->gen, conn, Impl::LossCaller{nullptr, false, releasing});
  return first();
}

Status Client::Flush() {
  if (impl_->inherited()) return Impl::InheritedError();
  // Only this thread's own channel in this session has releases to wait for: a thread without
  // one posted none, and joining the session for it took one of lockd's connections (and a
  // second of retries while lockd was busy) for nothing (found by review, 2026-12-07).
  ThreadChannel* ch = impl_->ExistingChannel();
  if (ch == nullptr) return Status::Ok();
  Status st;
  {
    MutexLock clk(&ch->mu);
    st = ch->Reap();
  }
  if (!st.ok()) impl_->OnSessionError(ch->session->gen, st);
  return st;
}

}  // namespace rdmalock
