#include "rdmalock/client.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "lock_engine.h"
#include "rdmalock/proto/layout.h"
#include "verbs_memory.h"

namespace rdmalock {

uint64_t SlotForName(std::string_view name, uint64_t lock_count) {
  return XXH3_64bits(name.data(), name.size()) % lock_count;
}

namespace {

// One thread's connection to lockd and what the engine did on it.
struct ThreadChannel {
  std::unique_ptr<VerbsMemory> mem;
  EngineEvents events;
  Counter acquires, releases, timeouts, lost;
};

std::string DefaultClientName() {
  char buf[64] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string path = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "client";
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

struct LockHandle::State {
  std::weak_ptr<Client::Impl> client;
  std::mutex mu;  // guards everything below: the owner and the renewer thread both use it
  Grant grant;
  LockState state = LockState::kHeld;
  std::function<void(const Status&)> on_lost;
  bool lost_reported = false;
};

class Client::Impl {
 public:
  Impl(ClientOptions opts, std::unique_ptr<VerbsMemory> first)
      : opts_(std::move(opts)), reply_(first->reply()) {
    std::random_device rd;
    nonce_ = (uint64_t{rd()} << 32) | rd();
    EngineParams p;
    p.lock_count = reply_.lock_count;
    p.lease = std::chrono::nanoseconds(reply_.lease_ns);
    p.stall_factor = reply_.stall_factor;
    p.epoch = static_cast<uint16_t>(reply_.epoch);
    engine_ = std::make_unique<LockEngine>(p, [this](const Ticket& t) { Abandon(t); });
    auto ch = std::make_unique<ThreadChannel>();
    ch->mem = std::move(first);
    channels_[std::this_thread::get_id()] = std::move(ch);
    reaper_ = std::thread([this] { ReaperLoop(); });
    if (opts_.auto_renew) renewer_ = std::thread([this] { RenewerLoop(); });
  }

  ~Impl() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();
    if (renewer_.joinable()) renewer_.join();
  }

  const LockEngine& engine() const { return *engine_; }
  const proto::AcceptReply& reply() const { return reply_; }
  const ClientOptions& options() const { return opts_; }

  // This thread's channel, connected on first use. The fast path reads a thread-local cache.
  Result<ThreadChannel*> Channel() {
    struct Cache {
      const Impl* impl = nullptr;
      uint64_t nonce = 0;
      ThreadChannel* ch = nullptr;
    };
    thread_local Cache cache;
    if (cache.impl == this && cache.nonce == nonce_) return cache.ch;
    const auto tid = std::this_thread::get_id();
    {
      std::lock_guard lk(mu_);
      if (auto it = channels_.find(tid); it != channels_.end()) {
        cache = {this, nonce_, it->second.get()};
        return it->second.get();
      }
    }
    RDMALOCK_ASSIGN_OR_RETURN(auto mem, ConnectChannel());
    auto ch = std::make_unique<ThreadChannel>();
    ch->mem = std::move(mem);
    std::lock_guard lk(mu_);
    ThreadChannel* raw = ch.get();
    channels_[tid] = std::move(ch);
    cache = {this, nonce_, raw};
    return raw;
  }

  Result<std::unique_ptr<VerbsMemory>> ConnectChannel() {
    ChannelParams p{opts_.server, opts_.port, opts_.connect_timeout, opts_.client_name, 0};
    RDMALOCK_ASSIGN_OR_RETURN(auto mem, VerbsMemory::Connect(p));
    if (mem->reply().epoch != reply_.epoch || mem->reply().lock_count != reply_.lock_count) {
      return Error(ErrorCode::kConnection,
                   "lockd restarted (epoch " + std::to_string(reply_.epoch) + " -> " +
                       std::to_string(mem->reply().epoch) + "); reconnect the client");
    }
    return mem;
  }

  void Track(const std::shared_ptr<LockHandle::State>& s) {
    std::lock_guard lk(mu_);
    renewing_.push_back(s);
  }

  ClientStats Stats() {
    ClientStats out;
    out.renewals = renewals_.load(std::memory_order_relaxed);
    out.renew_failures = renew_failures_.load(std::memory_order_relaxed);
    std::lock_guard lk(mu_);
    for (const auto& [tid, ch] : channels_) {
      const OpCounters& c = ch->mem->counters();
      out.fetch_add += c.fetch_add.get();
      out.compare_swap += c.compare_swap.get();
      out.read += c.read.get();
      out.write += c.write.get();
      out.acquires += ch->acquires.get();
      out.releases += ch->releases.get();
      out.timeouts += ch->timeouts.get();
      out.lost += ch->lost.get();
      out.recoveries += ch->events.recoveries.get();
      out.restarts += ch->events.restarts.get();
      out.withdrawals += ch->events.withdrawals.get();
      out.resets += ch->events.resets.get();
      out.abandoned += ch->events.abandoned.get();
    }
    return out;
  }

 private:
  void Abandon(const Ticket& t) {
    {
      std::lock_guard lk(mu_);
      abandoned_.push_back(t);
    }
    cv_.notify_all();
  }

  // Drains tickets that timed out behind which others queued: waits for their turn and releases.
  void ReaperLoop() {
    for (;;) {
      Ticket t;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !abandoned_.empty(); });
        if (stopping_) return;
        t = abandoned_.front();
        abandoned_.pop_front();
      }
      auto ch = Channel();
      if (!ch.ok()) continue;  // the lock's waiters recover the ticket after F x L
      (void)engine_->Drain(*(*ch)->mem, t, &(*ch)->events);
    }
  }

  // Renews every tracked grant once a third of its lease has passed.
  void RenewerLoop() {
    const auto lease = engine_->params().lease;
    const auto tick = std::max<std::chrono::nanoseconds>(lease / 12, std::chrono::milliseconds(1));
    for (;;) {
      std::vector<std::shared_ptr<LockHandle::State>> due;
      {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, tick, [&] { return stopping_; });
        if (stopping_) return;
        std::vector<std::weak_ptr<LockHandle::State>> keep;
        for (auto& w : renewing_) {
          if (auto s = w.lock()) {
            due.push_back(s);
            keep.push_back(w);
          }
        }
        renewing_.swap(keep);
      }
      for (auto& s : due) {
        Status st;
        std::function<void(const Status&)> notify;
        {
          std::lock_guard lk(s->mu);
          if (s->state != LockState::kHeld) continue;
          if (Clock::now() - s->grant.lease_start < lease / 3) continue;
          auto ch = Channel();
          st = ch.ok() ? engine_->Renew(*(*ch)->mem, s->grant, &(*ch)->events) : ch.status();
          if (st.ok()) {
            renewals_.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
          renew_failures_.fetch_add(1, std::memory_order_relaxed);
          // A failed renewal whose lease is still running may succeed next tick; past the lease
          // the lock is lost.
          if (st.code() == ErrorCode::kLockLost || !engine_->LeaseValid(s->grant, Clock::now())) {
            s->state = LockState::kLost;
            if (!s->lost_reported) {
              s->lost_reported = true;
              notify = s->on_lost;
            }
          }
        }
        if (notify) notify(st);
      }
    }
  }

  ClientOptions opts_;
  proto::AcceptReply reply_;
  uint64_t nonce_ = 0;
  std::unique_ptr<LockEngine> engine_;

  std::mutex mu_;  // guards the members below
  std::condition_variable cv_;
  bool stopping_ = false;
  std::unordered_map<std::thread::id, std::unique_ptr<ThreadChannel>> channels_;
  std::deque<Ticket> abandoned_;
  std::vector<std::weak_ptr<LockHandle::State>> renewing_;
  std::thread reaper_;
  std::thread renewer_;
  std::atomic<uint64_t> renewals_{0}, renew_failures_{0};
};

// ---- Client

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.server.empty()) {
    return Error(ErrorCode::kInvalidArgument,
                 "ClientOptions::server is empty: name lockd's "
                 "address");
  }
  ClientOptions opts = options;
  if (opts.client_name.empty()) opts.client_name = DefaultClientName();
  ChannelParams p{opts.server, opts.port, opts.connect_timeout, opts.client_name, 0};
  RDMALOCK_ASSIGN_OR_RETURN(auto first, VerbsMemory::Connect(p));
  return std::unique_ptr<Client>(new Client(std::make_shared<Impl>(opts, std::move(first))));
}

uint64_t Client::SlotOf(std::string_view name) const {
  return SlotForName(name, impl_->reply().lock_count);
}
uint64_t Client::lock_count() const { return impl_->reply().lock_count; }
uint64_t Client::session_id() const { return impl_->reply().session_id; }
std::chrono::nanoseconds Client::lease() const { return impl_->engine().params().lease; }

Result<LockHandle> Client::Lock(std::string_view name, const LockOptions& options) {
  if (name.empty()) return Error(ErrorCode::kInvalidArgument, "lock name is empty");
  return LockSlot(SlotOf(name), options);
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
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel());
  AcquireOptions ao;
  const auto mode = static_cast<Mode>(options.mode);
  if (options.timeout) {
    ao.deadline = Clock::now() + *options.timeout;
    ao.try_only = options.timeout->count() == 0;
  }
  ao.want_token = options.fencing_token && mode == Mode::kExclusive;
  auto grant = impl_->engine().Acquire(*ch->mem, slot, mode, ao, &ch->events);
  if (!grant.ok()) {
    if (grant.status().code() == ErrorCode::kTimeout) ++ch->timeouts;
    return grant.status();
  }
  ++ch->acquires;
  auto state = std::make_shared<LockHandle::State>();
  state->client = impl_;
  state->grant = *grant;
  if (impl_->options().auto_renew && options.auto_renew) impl_->Track(state);
  return LockHandle(std::move(state));
}

Result<ServerInfo> Client::Info() {
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel());
  std::vector<uint8_t> page(proto::InfoPage::kEncodedSize);
  RDMALOCK_RETURN_IF_ERROR(ch->mem->ReadBytes(RegionId::kInfo, 0, page));
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
  return info;
}

Result<SlotState> Client::Inspect(uint64_t slot) {
  if (slot >= lock_count()) {
    return Error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) +
                                                  " is out of range (lock_count " +
                                                  std::to_string(lock_count()) + ")");
  }
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel());
  RemoteOp rd = RemoteOp::Read(RegionId::kLocks, proto::SlotOffset(slot), 16);
  RDMALOCK_RETURN_IF_ERROR(ch->mem->Execute(rd));
  const proto::Word0 w = proto::Word0::Decode(rd.result[0]);
  SlotState s;
  s.slot = slot;
  s.exclusive_issued = w.max_x;
  s.shared_issued = w.max_s;
  s.exclusive_released = w.n_x;
  s.shared_released = w.n_s;
  s.generation = proto::Generation(rd.result[1]);
  s.renewals = static_cast<uint16_t>(rd.result[1]);
  s.exclusive_outstanding = w.max_x >= w.n_x ? uint32_t(w.max_x - w.n_x) : 0;
  s.shared_outstanding = w.max_s >= w.n_s ? uint32_t(w.max_s - w.n_s) : 0;
  s.frozen = w.Frozen();
  // Outstanding exclusive and shared requests interleave in ticket order; from the counters alone
  // one can tell whether the head of the queue is exclusive only if no shared request is pending.
  s.exclusive_held = s.exclusive_outstanding > 0 && s.shared_outstanding == 0;
  s.shared_holders = s.exclusive_outstanding == 0 ? s.shared_outstanding : 0;
  return s;
}

Result<std::vector<SessionInfo>> Client::Sessions() {
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl_->Channel());
  const proto::AcceptReply& r = impl_->reply();
  if (r.session_record_size < proto::SessionRecord::kEncodedSize ||
      r.sessions.length % r.session_record_size != 0) {
    return Error(ErrorCode::kProtocol, "lockd's session table has an unexpected layout");
  }
  std::vector<uint8_t> table(r.sessions.length);
  RDMALOCK_RETURN_IF_ERROR(ch->mem->ReadBytes(RegionId::kSessions, 0, table));
  std::vector<SessionInfo> out;
  for (size_t off = 0; off + r.session_record_size <= table.size(); off += r.session_record_size) {
    const auto rec = proto::SessionRecord::DecodeFrom(
        std::span<const uint8_t>(table.data() + off, r.session_record_size));
    if (rec.session_id == 0) continue;  // free
    SessionInfo s;
    s.session_id = rec.session_id;
    s.client_name = rec.name;
    s.pid = rec.pid;
    s.peer = rec.peer;
    s.since_unix_ns = rec.since_unix_ns;
    s.lockd_loopback = (rec.flags & proto::kFlagLoopback) != 0;
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const SessionInfo& a, const SessionInfo& b) { return a.session_id < b.session_id; });
  return out;
}

ClientStats Client::Stats() const { return impl_->Stats(); }

// ---- LockHandle

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
LockState LockHandle::state() const {
  if (!state_) return LockState::kReleased;
  std::lock_guard lk(state_->mu);
  return state_->state;
}
uint64_t LockHandle::fencing_token() const {
  if (!state_) return 0;
  std::lock_guard lk(state_->mu);
  return state_->grant.token;
}
std::chrono::steady_clock::time_point LockHandle::lease_expiry() const {
  if (!state_) return {};
  std::lock_guard lk(state_->mu);
  auto impl = state_->client.lock();
  return state_->grant.lease_start +
         (impl ? impl->engine().params().lease : std::chrono::nanoseconds::zero());
}

void LockHandle::OnLost(std::function<void(const Status&)> callback) {
  if (!state_) return;
  std::lock_guard lk(state_->mu);
  state_->on_lost = std::move(callback);
}

Status LockHandle::Release() {
  if (!state_) return Error(ErrorCode::kNotHeld, "empty lock handle");
  auto impl = state_->client.lock();
  std::lock_guard lk(state_->mu);
  if (state_->state == LockState::kReleased) {
    return Error(ErrorCode::kNotHeld, "lock already released");
  }
  if (state_->state == LockState::kLost) {
    return Error(ErrorCode::kLockLost, "lock was lost; nothing to release");
  }
  if (!impl) {
    state_->state = LockState::kLost;
    return Error(ErrorCode::kConnection,
                 "client closed before release; lockd's waiters "
                 "recover the lock after its lease");
  }
  auto ch = impl->Channel();
  Status st =
      ch.ok() ? impl->engine().Release(*(*ch)->mem, state_->grant, &(*ch)->events) : ch.status();
  if (st.ok()) {
    state_->state = LockState::kReleased;
    ++(*ch)->releases;
  } else {
    // Lost, or the connection failed so the release may not have happened: either way this
    // process no longer holds a lock it can rely on.
    state_->state = LockState::kLost;
    if (ch.ok()) ++(*ch)->lost;
  }
  return st;
}

Status LockHandle::Renew() {
  if (!state_) return Error(ErrorCode::kNotHeld, "empty lock handle");
  auto impl = state_->client.lock();
  if (!impl) return Error(ErrorCode::kConnection, "client closed");
  std::lock_guard lk(state_->mu);
  if (state_->state != LockState::kHeld) return Error(ErrorCode::kNotHeld, "lock is not held");
  RDMALOCK_ASSIGN_OR_RETURN(ThreadChannel * ch, impl->Channel());
  Status st = impl->engine().Renew(*ch->mem, state_->grant, &ch->events);
  if (st.code() == ErrorCode::kLockLost) state_->state = LockState::kLost;
  return st;
}

}  // namespace rdmalock
