#include "server/lockd.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/auth/auth.h"
#include "engine/verbs_memory.h"
#include "rdmalock/proto/layout.h"
#include "server/lockd_impl.h"
#include "server/words.h"

namespace rdmalock::lockd {

bool LoopThread::Check(const char* what) const {
  if (OnLoop()) return true;
  spdlog::error("internal error: {} called off lockd's event loop; refused", what);
  return false;
}

namespace {

EngineParams RecoveryParams(const Config& config, uint64_t epoch) {
  EngineParams p;
  p.lock_count = config.lock_count;
  p.lease = std::chrono::milliseconds(config.lease_ms);
  p.stall_factor = config.stall_factor;
  p.epoch = static_cast<uint16_t>(epoch);
  return p;
}

}  // namespace

Server::Impl::Impl(const Config& c, uint64_t e, std::unique_ptr<Regions> r,
                   std::vector<Cidr> allow_from, SteadyClock::time_point grace,
                   std::chrono::system_clock::time_point grace_wall)
    : config(c),
      epoch(e),
      grace_until(grace),
      grace_until_wall(grace_wall),
      regions(std::move(r)),
      admission(c, std::move(allow_from), grace),
      // One record per client plus one for lockd's own loopback connection.
      sessions(regions->sessions(), c.max_clients + 1, c.lock_count),
      recovery(RecoveryParams(c, e), &counters,
               [this](std::chrono::milliseconds timeout) { return ConnectLoopback(timeout); }),
      sampler(regions->locks(), c.lock_count) {}

// The one teardown order: what reads the state first (the metrics threads, the admin socket),
// then the recovery worker and its loopback connection, then the connections (windows, QPs,
// control MRs; then the sessions' record MRs), the listener, the devices and the memory
// (Regions), and the event channel last.
Server::Impl::~Impl() {
  metrics.reset();
  admin.reset();
  recovery.Stop();
  recovery.DropLoopback();
  graveyard.clear();
  conns.clear();
  record_mrs.clear();
  sessions.Clear();
  listener.Reset();
  regions.reset();
  channel.reset();
}

void Server::Impl::PublishCounters() {
  Store64(regions->info(), proto::InfoPage::kConnectedClients, connected.load());
  Store64(regions->info(), proto::InfoPage::kAcceptedTotal, accepted_total);
  Store64(regions->info(), proto::InfoPage::kRejectedTotal, rejected_total);
  Store64(regions->info(), proto::InfoPage::kRecoveries, recoveries_total);
  Store64(regions->info(), proto::InfoPage::kClockUnixNs, UnixNs(std::chrono::system_clock::now()));
}

// Connects to this lockd through its own NIC (the event loop must be running on another thread)
// and checks the byte order of atomic replies with the probe word.
Result<std::unique_ptr<VerbsMemory>> Server::Impl::ConnectLoopback(
    std::chrono::milliseconds timeout) {
  std::vector<std::string> candidates;
  if (!IsAnyAddress(config.address)) {
    candidates.push_back(config.address);
  } else {
    ifaddrs* ifs = nullptr;
    if (getifaddrs(&ifs) == 0) {
      for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
        const std::string a = rdma::AddressToString(i->ifa_addr);
        const std::string ip = a.substr(0, a.rfind(':'));
        if (ip.rfind("127.", 0) == 0) continue;
        candidates.push_back(ip);
      }
      freeifaddrs(ifs);
    }
  }
  std::string errors;
  for (const std::string& ip : candidates) {
    const auto deadline = SteadyClock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      ChannelParams p{ip,
                      config.port,
                      std::max(left, std::chrono::milliseconds(1)),
                      "lockd",
                      proto::kFlagLoopback,
                      loopback_secret.a,
                      loopback_secret.b};
      p.auth_key = AuthKey();
      proto::RejectReason reason = proto::RejectReason::kNone;
      // Checks the atomic byte order with the probe word.
      auto mem = VerbsMemory::Connect(p, nullptr, &reason);
      if (mem.ok()) {
        spdlog::info("loopback through {}: RC atomics work, byte order checked", ip);
        return mem;
      }
      // A reload replaced the key between our read of it and the challenge, which carries the
      // key of its own moment (in cluster mode a reload may come while a new term starts): once
      // more with the key now in force. Not for any other failure, nor past the timeout.
      if (reason == proto::RejectReason::kAuthFailed && AuthKey() != p.auth_key &&
          SteadyClock::now() < deadline) {
        continue;
      }
      errors += "\n  " + ip + ": " + mem.status().ToString();
      break;
    }
  }
  return Error(ErrorCode::kUnsupported,
               "could not reach this lockd through its own RDMA device (needed to check atomic "
               "replies and to free dead clients' locks):" +
                   (errors.empty() ? std::string(" no IPv4 address found") : errors));
}

std::string Server::Impl::Render() {
  MetricsSource s;
  s.epoch = epoch;
  s.config = &config;
  s.started_wall = started_wall;
  s.grace_until_wall = grace_until_wall;
  s.counters = &counters;
  s.connected = &connected;
  return RenderMetrics(s, sampler, std::chrono::system_clock::now());
}

Status Server::Impl::Listen() {
  RDMALOCK_ASSIGN_OR_RETURN(channel, rdma::CreateEventChannel());
  RDMALOCK_ASSIGN_OR_RETURN(listener, rdma::CreateId(channel.get(), nullptr));
  RDMALOCK_ASSIGN_OR_RETURN(
      rdma::SockAddr addr,
      rdma::ResolveAddress(IsAnyAddress(config.address) ? "" : config.address, config.port, true));
  if (IsAnyAddress(config.address) && config.address != "::") {
    auto* in = reinterpret_cast<sockaddr_in*>(addr.get());
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    in->sin_port = htons(config.port);
  }
  return rdma::Listen(listener.get(), addr.get(), 128,
                      config.address + ":" + std::to_string(config.port));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

uint16_t Server::port() const { return impl_->config.port; }
uint64_t Server::connected_clients() const { return impl_->connected.load(); }
void Server::SetAuthKey(std::string key) {
  MutexLock lock(&impl_->mu_);
  impl_->auth_key = std::move(key);
}

void Server::SetAliveUntil(std::chrono::steady_clock::time_point t) {
  impl_->alive_until_ns.store(t.time_since_epoch().count(), std::memory_order_relaxed);
}

Result<std::unique_ptr<Server>> Server::Create(const Config& config, uint64_t epoch,
                                               bool unclean_start, std::string auth_key) {
  RDMALOCK_RETURN_IF_ERROR(Validate(config));
  // A verbs object whose release fails (a teardown order broken, a resource leaked) is logged.
  rdma::SetTeardownReporter([](const char* call, int rc) {
    spdlog::error("{} failed: {}", call, std::strerror(rc > 0 ? rc : errno));
  });
  rdma::Fd stop_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!stop_fd) return rdma::ErrnoStatus(ErrorCode::kResource, "eventfd", errno);

  proto::InfoPage page;
  page.epoch = epoch;
  page.lock_count = config.lock_count;
  page.lease_ns = config.lease_ms * 1'000'000;
  page.stall_factor = config.stall_factor;
  page.max_sessions = config.max_clients;
  page.start_time_unix_ns = UnixNs(std::chrono::system_clock::now());
  std::chrono::steady_clock::time_point grace_until{};
  std::chrono::system_clock::time_point grace_until_wall{};
  if (unclean_start) {
    const auto grace = std::chrono::milliseconds(config.GraceMs());
    grace_until = std::chrono::steady_clock::now() + grace;
    grace_until_wall = std::chrono::system_clock::now() + grace;
    page.grace_until_unix_ns = UnixNs(grace_until_wall);
    spdlog::warn(
        "the previous lockd did not stop cleanly (or stopped with clients connected): refusing "
        "clients for {} ms, until every lease it may have granted has run out",
        config.GraceMs());
  }
  if (config.cluster_mode()) page.liveness_timeout_ns = config.LivenessTimeoutMs() * 1'000'000;
  RDMALOCK_ASSIGN_OR_RETURN(std::unique_ptr<Regions> regions, Regions::Create(config, page));

  std::vector<Cidr> allow_from;
  for (const std::string& r : config.allow_from) {
    RDMALOCK_ASSIGN_OR_RETURN(Cidr c, Cidr::Parse(r));
    allow_from.push_back(c);
  }
  auto m = std::make_unique<Impl>(config, epoch, std::move(regions), std::move(allow_from),
                                  grace_until, grace_until_wall);
  m->stop_fd = std::move(stop_fd);
  // Cluster mode: not until the campaign says how long the lease holds.
  if (config.cluster_mode()) m->alive_until_ns.store(0);
  if (!config.auth_key_file.empty()) {
    RDMALOCK_RETURN_IF_ERROR(auth::CheckKey(auth_key, config.auth_key_file));
    {
      MutexLock lock(&m->mu_);
      m->auth_key = std::move(auth_key);
    }
    spdlog::info("clients must prove the shared key read from {} (HMAC-SHA256 challenge)",
                 config.auth_key_file);
  } else {
    spdlog::warn(
        "authentication is off (no auth_key_file): any host that reaches port {} can connect "
        "and take or break locks; see docs/security.md",
        config.port);
  }
  RDMALOCK_RETURN_IF_ERROR(m->Listen());
  if (!config.admin_socket.empty()) {
    RDMALOCK_ASSIGN_OR_RETURN(m->admin, AdminSocket::Open(config.admin_socket));
  }
  if (!config.metrics_address.empty()) {
    Impl* raw = m.get();
    RDMALOCK_ASSIGN_OR_RETURN(
        m->metrics, MetricsServer::Start(config.metrics_address, [raw] { return raw->Render(); }));
  }
  if (std::string w = FenceMarginWarning(config); !w.empty()) spdlog::warn("{}", w);
  spdlog::info("listening on {}:{} (epoch {}, {} locks, lease {} ms, stall factor {})",
               config.address, config.port, epoch, config.lock_count, config.lease_ms,
               config.stall_factor);
  return std::unique_ptr<Server>(new Server(std::move(m)));
}

void Server::RequestStop() {
  const uint64_t one = 1;
  (void)!write(impl_->stop_fd.get(), &one, sizeof(one));
}

Status Server::Run() {
  Impl& m = *impl_;
  m.loop.Bind();  // from here on this thread is the event loop
  bool device_gone = false;
  const auto& devices = m.regions->devices();
  // The tick's work (heartbeat and QP checks, the info page's clock) needs a resolution of a
  // fraction of the heartbeat timeout, no finer: each wake-up costs CPU, and lockd's CPU should
  // stay out of the way (about 0.6 ms per wake-up under TCG).
  const auto tick = std::chrono::milliseconds(m.config.LivenessTickMs());
  auto next_tick = std::chrono::steady_clock::now() + tick;
  const AdminSocket::Handler admin_handler = [&m](const std::string& line,
                                                  const std::string& asker) {
    return m.AdminCommand(line, asker);
  };
  for (;;) {
    // cm events, stop, admin socket, then each device's async events and completions, then the
    // admin connections.
    const auto now = std::chrono::steady_clock::now();
    std::vector<pollfd> fds = {{m.channel->fd, POLLIN, 0},
                               {m.stop_fd.get(), POLLIN, 0},
                               {m.admin ? m.admin->listen_fd(now) : -1, POLLIN, 0}};
    for (auto& d : devices) fds.push_back({d->ctx->async_fd, POLLIN, 0});
    for (auto& d : devices) fds.push_back({d->comp_channel->fd, POLLIN, 0});
    const size_t admin_base = fds.size();
    if (m.admin) m.admin->AddConnFds(&fds);
    // Rounded up: rounded down, the last millisecond before a tick was spent spinning in
    // poll(0), about 1% of a CPU at the default tick (measured under TCG: 40 ms of CPU per 5 s).
    const auto wait =
        std::chrono::ceil<std::chrono::milliseconds>(next_tick - std::chrono::steady_clock::now());
    const int rc =
        poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait.count(), 0)));
    if (rc < 0 && errno != EINTR) return rdma::ErrnoStatus(ErrorCode::kIo, "poll", errno);
    if (rc > 0 && fds[1].revents != 0) break;
    if (rc > 0 && fds[0].revents != 0) {
      // The handshakes' completions first: one that came before a connection's DISCONNECTED
      // (a hello lockd could not receive, whose sender then gave up) is handled, and logged,
      // before the disconnect drops the connection and with it the completion's meaning.
      for (auto& d : devices) m.PollCompletions(*d);
      // Drain every queued event.
      for (int i = 0; i < 64; ++i) {
        RDMALOCK_RETURN_IF_ERROR(m.HandleOneEvent(&device_gone));
        pollfd p{m.channel->fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
      }
    }
    if (rc > 0 && m.admin) {  // admin connections first: OnAcceptable may add one
      m.admin->OnConnsReady(fds.data() + admin_base, fds.size() - admin_base, admin_handler);
      if (fds[2].fd >= 0 && fds[2].revents != 0) {
        m.admin->OnAcceptable(std::chrono::steady_clock::now());
      }
    }
    for (size_t i = 0; rc > 0 && i < devices.size(); ++i) {
      if (fds[3 + i].revents != 0) m.OnAsyncEvent(*devices[i]);
      if (fds[3 + devices.size() + i].revents != 0) m.OnCompletions(*devices[i]);
    }
    if (device_gone) break;
    if (std::chrono::steady_clock::now() >= next_tick) {
      if (m.admin) m.admin->Expire(std::chrono::steady_clock::now());
      m.Tick();
      next_tick = std::chrono::steady_clock::now() + tick;
    }
  }
  // Shutdown: stop taking connections, fence every QP (to ERR), disconnect, then destroy in order.
  // Every client's QP to the error state first: from then on no client's RDMA reaches the
  // regions (in cluster mode this is the fence a lost primary must finish before its deadline).
  for (auto& [id, c] : m.conns) {
    if (Status f = c->id.FenceQp(); !f.ok()) {
      // Destroyed now, its memory windows first (a window bound to a QP holds a reference on
      // it): nothing of it may execute through what follows (in cluster mode, before the lease's
      // deadline).
      spdlog::error("shutting down: a client's QP could not be fenced ({}); destroying it now",
                    f.message());
      c->windows.clear();
      c->id.Reset();
    }
  }
  m.fenced_at = std::chrono::steady_clock::now();  // every QP in ERR, or destroyed
  spdlog::info("shutting down: disconnecting {} client(s)", m.connected.load());
  // Clients connected now, or fenced ones whose leases may still run (a heartbeat fence frees
  // their locks one lease later): either way the next start must wait out the restart grace.
  m.stopped_with_clients =
      m.connected.load() > 0 || std::chrono::steady_clock::now() < m.fenced_leases_until;
  m.recovery.Stop();
  m.listener.Reset();
  m.recovery.DropLoopback();
  for (auto& [id, c] : m.conns) c->id.Disconnect();
  for (auto& d : devices) rdma::DrainCq(d->cq.get());  // reap the handshakes' flushed requests
  m.conns.clear();
  m.record_mrs.clear();
  m.sessions.Clear();
  m.connected.store(0);
  return device_gone ? Error(ErrorCode::kConnection, "RDMA device removed") : Status::Ok();
}

bool Server::stopped_with_clients() const { return impl_->stopped_with_clients; }
std::chrono::steady_clock::time_point Server::fenced_at() const { return impl_->fenced_at; }

Status Server::ProbeLoopback(std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  RDMALOCK_ASSIGN_OR_RETURN(std::unique_ptr<VerbsMemory> loopback, m.ConnectLoopback(timeout));
  return m.recovery.Start(std::move(loopback));  // the recovery thread owns it from here on
}

}  // namespace rdmalock::lockd
