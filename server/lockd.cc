#include "lockd.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>
#include <vector>

#include "../client/src/verbs_memory.h"
#include "../common/rdma/verbs.h"
#include "rdmalock/proto/handshake.h"
#include "rdmalock/proto/layout.h"

namespace rdmalock::lockd {
namespace {

// Anonymous, zeroed, page-aligned memory released with munmap.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr_ != nullptr) munmap(addr_, len_);
  }
  static Result<std::unique_ptr<Mapping>> Create(size_t len) {
    const size_t page = 4096;
    len = (len + page - 1) / page * page;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return rdma::ErrnoStatus(ErrorCode::kResource, "mmap of " + std::to_string(len) + " bytes",
                               errno);
    }
    auto m = std::make_unique<Mapping>();
    m->addr_ = p;
    m->len_ = len;
    return m;
  }
  uint8_t* data() const { return static_cast<uint8_t*>(addr_); }
  size_t size() const { return len_; }

 private:
  void* addr_ = nullptr;
  size_t len_ = 0;
};

// The regions registered on one device.
struct Device {
  ibv_context* ctx = nullptr;  // owned by rdma_get_devices' list
  std::string name;
  rdma::QpSizes sizes;
  rdma::ProtectionDomain pd;
  rdma::MemoryRegion info_mr, locks_mr, sessions_mr;
  rdma::CompletionQueue cq;  // shared by the QPs of this device's sessions; nothing is posted
};

struct Session {
  rdma::CmId id;
  uint64_t session_id = 0;
  uint32_t index = 0;  // record in the session table
  std::string peer;
  std::string name;
  uint32_t pid = 0;
  bool loopback = false;
  bool established = false;
  std::chrono::system_clock::time_point since;
};

bool IsAnyAddress(const std::string& a) { return a == "0.0.0.0" || a == "::" || a == "*"; }

void Store64(uint8_t* base, size_t off, uint64_t v) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + off))
      .store(v, std::memory_order_relaxed);
}

}  // namespace

struct Server::Impl {
  // Declaration order is destruction order reversed: sessions (QPs) and the listener go first,
  // then the devices (CQs, MRs, PDs), then the device list, then the memory.
  Config config;
  uint64_t epoch = 0;
  std::unique_ptr<Mapping> info, locks, sessions_mem;
  ibv_context** device_list = nullptr;
  std::vector<std::unique_ptr<Device>> devices;
  rdma::EventChannel channel;
  rdma::CmId listener;
  std::unordered_map<rdma_cm_id*, std::unique_ptr<Session>> sessions;
  std::vector<uint32_t> free_records;
  uint64_t next_session_id = 1;
  uint64_t accepted_total = 0, rejected_total = 0;
  std::atomic<uint64_t> connected{0};
  int stop_fd = -1;
  std::unique_ptr<VerbsMemory> loopback;  // lockd's own channel to its lock table

  ~Impl() {
    loopback.reset();
    sessions.clear();
    listener.Reset();
    devices.clear();
    channel.reset();
    if (device_list != nullptr) rdma_free_devices(device_list);
    if (stop_fd >= 0) close(stop_fd);
  }

  Device* DeviceFor(ibv_context* ctx) {
    for (auto& d : devices) {
      if (d->ctx == ctx) return d.get();
    }
    return nullptr;
  }

  void PublishCounters() {
    Store64(info->data(), proto::InfoPage::kConnectedClients, connected.load());
    Store64(info->data(), proto::InfoPage::kAcceptedTotal, accepted_total);
    Store64(info->data(), proto::InfoPage::kRejectedTotal, rejected_total);
  }

  void WriteRecord(const Session& s) {
    std::span<uint8_t> rec(sessions_mem->data() + uint64_t{s.index} * proto::kSessionRecordSize,
                           proto::kSessionRecordSize);
    std::memset(rec.data(), 0, rec.size());
    proto::SessionRecord r;
    r.session_id = s.session_id;
    r.pid = s.pid;
    r.flags = s.loopback ? proto::kFlagLoopback : 0;
    r.since_unix_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(s.since.time_since_epoch()).count());
    r.name = s.name;
    r.peer = s.peer;
    r.EncodeTo(rec);
  }

  void ClearRecord(uint32_t index) {
    std::memset(sessions_mem->data() + uint64_t{index} * proto::kSessionRecordSize, 0,
                proto::kSessionRecordSize);
  }

  void Reject(rdma_cm_id* id, proto::RejectReason reason, const std::string& peer,
              const std::string& detail) {
    proto::RejectReply r;
    r.reason = reason;
    r.detail = detail;
    const auto bytes = r.Encode();
    if (rdma_reject(id, bytes.data(), static_cast<uint8_t>(bytes.size())) != 0) {
      spdlog::warn("rdma_reject for {} failed: {}", peer, std::strerror(errno));
    }
    ++rejected_total;
    PublishCounters();
    spdlog::warn("rejected connection from {}: {}{}{}", peer, proto::RejectReasonName(reason),
                 detail.empty() ? "" : ": ", detail);
  }

  // Returns the id to destroy after the event is acknowledged (null if kept).
  rdma_cm_id* OnConnectRequest(rdma_cm_event* ev) {
    rdma_cm_id* id = ev->id;
    const std::string peer = rdma::AddressToString(rdma_get_peer_addr(id));
    const auto* data = static_cast<const uint8_t*>(ev->param.conn.private_data);
    const std::span<const uint8_t> bytes(data, data ? ev->param.conn.private_data_len : 0);
    proto::ConnectRequest req;
    const proto::RejectReason reason = proto::ConnectRequest::Decode(bytes, &req);
    if (reason != proto::RejectReason::kNone) {
      Reject(id, reason, peer, "");
      return id;
    }
    if (free_records.empty() ||
        (connected.load() >= config.max_clients && (req.flags & proto::kFlagLoopback) == 0)) {
      Reject(id, proto::RejectReason::kServerFull, peer,
             "max_clients " + std::to_string(config.max_clients));
      return id;
    }
    Device* dev = DeviceFor(id->verbs);
    if (dev == nullptr) {
      Reject(id, proto::RejectReason::kInternal, peer, "request arrived on an unknown device");
      return id;
    }
    if (Status st = rdma::CreateRcQp(id, dev->pd.get(), dev->cq.get(), rdma::QpSizes{1, 1, 1});
        !st.ok()) {
      Reject(id, proto::RejectReason::kInternal, peer, "cannot create a QP");
      spdlog::error("connection from {}: {}", peer, st.ToString());
      return id;
    }
    auto s = std::make_unique<Session>();
    s->id = rdma::CmId(id);
    s->session_id = next_session_id++;
    s->index = free_records.back();
    free_records.pop_back();
    s->peer = peer;
    s->name = req.client_name;
    s->pid = req.pid;
    s->loopback = (req.flags & proto::kFlagLoopback) != 0;
    s->since = std::chrono::system_clock::now();

    proto::AcceptReply reply;
    reply.epoch = epoch;
    reply.session_id = s->session_id;
    reply.lease_ns = config.lease_ms * 1'000'000;
    reply.lock_count = config.lock_count;
    reply.stall_factor = config.stall_factor;
    reply.session_record_size = proto::kSessionRecordSize;
    reply.info = {reinterpret_cast<uint64_t>(info->data()), proto::kInfoPageSize,
                  dev->info_mr->rkey};
    reply.locks = {reinterpret_cast<uint64_t>(locks->data()),
                   proto::LockTableBytes(config.lock_count), dev->locks_mr->rkey};
    reply.sessions = {reinterpret_cast<uint64_t>(sessions_mem->data()),
                      sessions_mem->size(),  // whole pages; records past the last are zero
                      dev->sessions_mr->rkey};
    reply.session_record_offset = uint64_t{s->index} * proto::kSessionRecordSize;
    reply.max_sessions = config.max_clients;
    const auto out = reply.Encode();

    rdma_conn_param param{};
    param.private_data = out.data();
    param.private_data_len = static_cast<uint8_t>(out.size());
    param.responder_resources = static_cast<uint8_t>(
        std::min<uint32_t>(dev->sizes.rd_atomic, ev->param.conn.initiator_depth));
    param.initiator_depth = static_cast<uint8_t>(
        std::min<uint32_t>(dev->sizes.rd_atomic, ev->param.conn.responder_resources));
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    if (rdma_accept(id, &param) != 0) {
      spdlog::error("rdma_accept for {} failed: {}", peer, std::strerror(errno));
      free_records.push_back(s->index);
      s->id.release();  // destroyed after the ack, with its QP
      rdma_destroy_qp(id);
      return id;
    }
    WriteRecord(*s);
    spdlog::debug("accepted {} (session {}, client '{}', pid {})", peer, s->session_id, s->name,
                  s->pid);
    sessions.emplace(id, std::move(s));
    return nullptr;
  }

  void OnEstablished(rdma_cm_id* id) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return;
    Session& s = *it->second;
    s.established = true;
    ++accepted_total;
    if (!s.loopback) connected.fetch_add(1);
    PublishCounters();
    spdlog::info("client connected: session {} from {} ('{}', pid {}){}", s.session_id, s.peer,
                 s.name, s.pid, s.loopback ? " [lockd loopback]" : "");
  }

  // Ends a session: its QP goes to ERR (nothing of it can land any more), then it is destroyed.
  // Returns the session to destroy after the event is acknowledged.
  std::unique_ptr<Session> Drop(rdma_cm_id* id, const char* why) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return nullptr;
    std::unique_ptr<Session> s = std::move(it->second);
    sessions.erase(it);
    s->id.FenceQp();
    (void)rdma_disconnect(id);  // so that the peer sees DISCONNECTED too
    if (s->established) {
      if (!s->loopback) connected.fetch_sub(1);
      spdlog::info("client disconnected: session {} from {} ('{}'): {}", s->session_id, s->peer,
                   s->name, why);
    } else {
      spdlog::warn("connection from {} failed before it was established: {}", s->peer, why);
    }
    ClearRecord(s->index);
    free_records.push_back(s->index);
    PublishCounters();
    return s;
  }

  Status HandleOneEvent(bool* device_gone) {
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(channel.get(), &raw) != 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
      return rdma::ErrnoStatus(ErrorCode::kConnection, "rdma_get_cm_event", errno);
    }
    rdma::CmEvent ev(raw);
    rdma_cm_id* destroy_id = nullptr;
    std::unique_ptr<Session> dropped;
    switch (ev->event) {
      case RDMA_CM_EVENT_CONNECT_REQUEST:
        destroy_id = OnConnectRequest(ev.get());
        break;
      case RDMA_CM_EVENT_ESTABLISHED:
        OnEstablished(ev->id);
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
        dropped = Drop(ev->id, "disconnected");
        break;
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
        dropped = Drop(ev->id, rdma_event_str(ev->event));
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        spdlog::critical("RDMA device removed; shutting down");
        *device_gone = true;
        break;
      default:
        spdlog::debug("rdma_cm event {} ignored", rdma_event_str(ev->event));
        break;
    }
    ev.reset();  // acknowledge before destroying any id it refers to
    dropped.reset();
    if (destroy_id != nullptr) rdma_destroy_id(destroy_id);
    return Status::Ok();
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

uint16_t Server::port() const { return impl_->config.port; }
uint64_t Server::connected_clients() const { return impl_->connected.load(); }

Result<std::unique_ptr<Server>> Server::Create(const Config& config, uint64_t epoch) {
  RDMALOCK_RETURN_IF_ERROR(Validate(config));
  auto m = std::make_unique<Impl>();
  m->config = config;
  m->epoch = epoch;
  m->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m->stop_fd < 0) return rdma::ErrnoStatus(ErrorCode::kResource, "eventfd", errno);

  // Memory first, zeroed (mmap gives zero pages) before it is registered.
  RDMALOCK_ASSIGN_OR_RETURN(m->info, Mapping::Create(proto::kInfoPageSize));
  RDMALOCK_ASSIGN_OR_RETURN(m->locks, Mapping::Create(proto::LockTableBytes(config.lock_count)));
  RDMALOCK_ASSIGN_OR_RETURN(
      m->sessions_mem, Mapping::Create(uint64_t{config.max_clients} * proto::kSessionRecordSize));
  // The probe word: initialisation, before any NIC can reach the table.
  std::memcpy(m->locks->data() + proto::ProbeOffset(config.lock_count), &proto::kProbePattern, 8);
  proto::InfoPage page;
  page.epoch = epoch;
  page.lock_count = config.lock_count;
  page.lease_ns = config.lease_ms * 1'000'000;
  page.stall_factor = config.stall_factor;
  page.max_sessions = config.max_clients;
  page.start_time_unix_ns =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  page.EncodeTo(std::span<uint8_t>(m->info->data(), proto::kInfoPageSize));
  // One record per client plus one for lockd's own loopback connection.
  for (uint32_t i = config.max_clients + 1; i > 0; --i) m->free_records.push_back(i - 1);

  int n = 0;
  m->device_list = rdma_get_devices(&n);
  if (m->device_list == nullptr || n == 0) {
    return Error(ErrorCode::kUnsupported,
                 "no RDMA device found (on a host without an RDMA NIC, load Soft-RoCE: "
                 "modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IFACE; see "
                 "deploy/softroce)");
  }
  for (int i = 0; i < n; ++i) {
    auto d = std::make_unique<Device>();
    d->ctx = m->device_list[i];
    d->name = ibv_get_device_name(d->ctx->device);
    auto sizes = rdma::DeviceQpSizes(d->ctx, 1);
    if (!sizes.ok()) {
      spdlog::warn("skipping RDMA device {}: {}", d->name, sizes.status().ToString());
      continue;
    }
    d->sizes = *sizes;
    RDMALOCK_ASSIGN_OR_RETURN(d->pd, rdma::AllocPd(d->ctx));
    RDMALOCK_ASSIGN_OR_RETURN(d->cq, rdma::CreateCq(d->ctx, 16));
    // The NIC enforces who may do what: info READ only; the lock table atomics and READ, never
    // WRITE (a WRITE racing a NIC atomic on one word is not atomic); session records READ/WRITE.
    RDMALOCK_ASSIGN_OR_RETURN(
        d->info_mr,
        rdma::RegisterMr(d->pd.get(), m->info->data(), m->info->size(), IBV_ACCESS_REMOTE_READ));
    RDMALOCK_ASSIGN_OR_RETURN(d->locks_mr,
                              rdma::RegisterMr(d->pd.get(), m->locks->data(), m->locks->size(),
                                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                                   IBV_ACCESS_REMOTE_ATOMIC));
    RDMALOCK_ASSIGN_OR_RETURN(
        d->sessions_mr,
        rdma::RegisterMr(
            d->pd.get(), m->sessions_mem->data(), m->sessions_mem->size(),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
    spdlog::info("device {}: regions registered (lock table {} bytes, rd_atomic {})", d->name,
                 m->locks->size(), d->sizes.rd_atomic);
    m->devices.push_back(std::move(d));
  }
  if (m->devices.empty()) {
    return Error(ErrorCode::kUnsupported, "no RDMA device with RC atomics found");
  }

  RDMALOCK_ASSIGN_OR_RETURN(m->channel, rdma::CreateEventChannel());
  RDMALOCK_ASSIGN_OR_RETURN(m->listener, rdma::CreateId(m->channel.get(), nullptr));
  RDMALOCK_ASSIGN_OR_RETURN(
      rdma::SockAddr addr,
      rdma::ResolveAddress(IsAnyAddress(config.address) ? "" : config.address, config.port, true));
  if (IsAnyAddress(config.address) && config.address != "::") {
    auto* in = reinterpret_cast<sockaddr_in*>(addr.get());
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    in->sin_port = htons(config.port);
  }
  if (rdma_bind_addr(m->listener.get(), addr.get()) != 0) {
    return rdma::ErrnoStatus(
        ErrorCode::kIo,
        "rdma_bind_addr " + config.address + ":" + std::to_string(config.port) + " (port in use?)",
        errno);
  }
  if (rdma_listen(m->listener.get(), 128) != 0) {
    return rdma::ErrnoStatus(ErrorCode::kIo, "rdma_listen", errno);
  }
  spdlog::info("listening on {}:{} (epoch {}, {} locks, lease {} ms, stall factor {})",
               config.address, config.port, epoch, config.lock_count, config.lease_ms,
               config.stall_factor);
  return std::unique_ptr<Server>(new Server(std::move(m)));
}

void Server::RequestStop() {
  const uint64_t one = 1;
  (void)!write(impl_->stop_fd, &one, sizeof(one));
}

Status Server::Run() {
  Impl& m = *impl_;
  bool device_gone = false;
  for (;;) {
    pollfd fds[2] = {{m.channel->fd, POLLIN, 0}, {m.stop_fd, POLLIN, 0}};
    const int rc = poll(fds, 2, 1000);
    if (rc < 0 && errno != EINTR) return rdma::ErrnoStatus(ErrorCode::kIo, "poll", errno);
    if (fds[1].revents != 0) break;
    if (fds[0].revents != 0) {
      // Drain every queued event.
      for (int i = 0; i < 64; ++i) {
        RDMALOCK_RETURN_IF_ERROR(m.HandleOneEvent(&device_gone));
        pollfd p{m.channel->fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
      }
    }
    if (device_gone) break;
  }
  // Shutdown: stop taking connections, fence every QP (to ERR), disconnect, then destroy in order.
  spdlog::info("shutting down: disconnecting {} client(s)", m.connected.load());
  m.listener.Reset();
  m.loopback.reset();
  for (auto& [id, s] : m.sessions) {
    s->id.FenceQp();
    (void)rdma_disconnect(id);
  }
  for (auto& d : m.devices) {  // drain: nothing is posted on lockd's side, but reap any flush
    ibv_wc wc[16];
    while (ibv_poll_cq(d->cq.get(), 16, wc) > 0) {
    }
  }
  m.sessions.clear();
  m.connected.store(0);
  return device_gone ? Error(ErrorCode::kConnection, "RDMA device removed") : Status::Ok();
}

Status Server::ProbeLoopback(std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  std::vector<std::string> candidates;
  if (!IsAnyAddress(m.config.address)) {
    candidates.push_back(m.config.address);
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
    ChannelParams p{ip, m.config.port, timeout, "lockd", proto::kFlagLoopback};
    auto mem = VerbsMemory::Connect(p);  // checks the atomic byte order with the probe word
    if (mem.ok()) {
      spdlog::info("loopback through {}: RC atomics work, byte order checked", ip);
      m.loopback = std::move(mem).value();
      return Status::Ok();
    }
    errors += "\n  " + ip + ": " + mem.status().ToString();
  }
  return Error(ErrorCode::kUnsupported,
               "could not reach this lockd through its own RDMA device (needed to check atomic "
               "replies):" +
                   (errors.empty() ? std::string(" no IPv4 address found") : errors));
}

Result<uint64_t> BumpEpoch(const std::string& state_dir) {
  if (state_dir.empty()) return uint64_t{1};
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    return Error(ErrorCode::kIo, "cannot create state_dir " + state_dir + ": " + ec.message());
  }
  const std::string path = state_dir + "/epoch";
  uint64_t epoch = 0;
  {
    std::ifstream in(path);
    if (in) {
      std::string text;
      in >> text;
      try {
        size_t used = 0;
        epoch = std::stoull(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
      } catch (const std::exception&) {
        return Error(ErrorCode::kIo, path + " does not hold an epoch number ('" + text + "')");
      }
    }
  }
  ++epoch;
  if (epoch > 0xffff) {
    return Error(ErrorCode::kIo, path +
                                     ": epoch would exceed 65535, the width of the token's "
                                     "epoch field");
  }
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "open " + tmp, errno);
  const std::string text = std::to_string(epoch) + "\n";
  const bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return rdma::ErrnoStatus(ErrorCode::kIo, "write " + tmp, err);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return rdma::ErrnoStatus(ErrorCode::kIo, "rename " + tmp, errno);
  }
  return epoch;
}

}  // namespace rdmalock::lockd
