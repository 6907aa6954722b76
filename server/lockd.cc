#include "server/lockd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/auth/auth.h"
#include "common/rdma/verbs.h"
#include "engine/lock_engine.h"
#include "engine/verbs_memory.h"
#include "rdmalock/proto/handshake.h"
#include "rdmalock/proto/layout.h"
#include "server/acl.h"
#include "server/metrics.h"
#include "server/refusal_log.h"

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
  // Shared by the QPs of this device's connections: only the handshake's Hello receive, the
  // Welcome or refusal SEND and the memory-window binds complete here, never a client's
  // one-sided operation. Its channel wakes the event loop.
  rdma::CompChannel comp_channel;
  rdma::CompletionQueue cq;
};

// A client session: one record in the session table, one or more connections (QPs).
struct Session {
  uint64_t session_id = 0;
  uint64_t join_key = 0;
  uint32_t index = 0;  // record in the session table
  std::string peer;
  std::string name;
  uint32_t pid = 0;
  bool loopback = false;
  bool counted = false;  // counted in `connected` (its first connection was established)
  std::chrono::system_clock::time_point since;
  std::set<rdma_cm_id*> conns;
  uint64_t last_heartbeat = 0;
  std::chrono::steady_clock::time_point heartbeat_moved;
  bool qp_error_seen = false;  // a QP of it was in ERR at the last tick
  // Its record registered on its own, per device (registered at its first admission there): the
  // record window is bound to this MR, not to the whole table's. rdma_rxe checks a window's
  // accesses against the range of the MR it is bound to, not against the window's own range, so
  // a window over part of a larger MR would not confine the client to its record.
  std::vector<std::pair<const Device*, rdma::MemoryRegion>> record_mrs;
};

// One rdma_cm connection of a session. Declaration order is destruction order reversed: the
// memory windows go first (a window bound to a QP holds a reference on it: rdma_rxe's destroy of
// the QP waits, for about a minute, until the windows are gone), then the QP, then the control
// buffer's MR.
struct Conn {
  uint64_t serial = 0;  // names it in work request ids (a CQE may outlive the Conn)
  std::array<uint8_t, 2 * proto::kControlMessageMax> control{};  // [0,n) receive, [n,2n) send
  rdma::MemoryRegion control_mr;
  std::shared_ptr<Session> session;  // destroyed after the windows (it owns the record's MR)
  rdma::CmId id;
  std::vector<rdma::MemoryWindow> windows;
  Device* device = nullptr;
  bool established = false;
  bool admitted = false;  // the Welcome (with the rkeys) was posted
  bool refused = false;   // a refusal was posted; the connection is dropped when it completes
  auth::Nonce nonce{};    // the challenge's
  // The shared key as of the challenge ("" : none): the Hello's proof and the Welcome's MAC use
  // it, so a reload that rotates the key mid-handshake cannot split one handshake across keys.
  std::string auth_key;
  std::array<uint8_t, proto::ConnectRequest::kSize> request{};  // as received, for the proof
  std::chrono::steady_clock::time_point accepted_at = std::chrono::steady_clock::now();
};

// Work request ids on lockd's QPs: the connection's serial and what the request was.
enum class WrKind : uint64_t { kHelloRecv = 0, kWelcome = 1, kRefusal = 2, kBind = 3 };
uint64_t WrId(uint64_t serial, WrKind k) { return serial << 2 | static_cast<uint64_t>(k); }

// Handshakes (accepted, not yet admitted or dropped) in progress at once; more are refused with
// kBusy. Bounds the completions lockd's CQ must hold (a few per handshake).
constexpr size_t kMaxHandshakes = 128;
constexpr int kCqDepth = 8 * kMaxHandshakes;

// A connection lockd accepted must be admitted (established, and its Hello verified) within this
// long. A client that never completes holds a QP and a session record, but no rkey: the rkeys
// travel only in the Welcome.
constexpr auto kEstablishTimeout = std::chrono::seconds(5);

// What lockd frees for an ended session, on its loopback QP (never with CPU stores).
struct RecoveryJob {
  uint64_t session_id = 0;
  std::string who;
  std::string why;
  std::chrono::steady_clock::time_point not_before;  // later for sessions that may still live
  std::chrono::steady_clock::time_point ended;
  std::vector<ReapState> items;
  uint32_t released = 0, already_done = 0, recovered = 0, gave_up = 0;
};

bool IsAnyAddress(const std::string& a) { return a == "0.0.0.0" || a == "::" || a == "*"; }

void Store64(uint8_t* base, size_t off, uint64_t v) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + off))
      .store(v, std::memory_order_relaxed);
}

// A load of memory the NIC writes (a client's RDMA WRITE): aligned, 8 bytes, whole.
uint64_t Load64(const uint8_t* base, size_t off) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(base) + off))
      .load(std::memory_order_relaxed);
}

uint64_t UnixNs(std::chrono::system_clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

struct Server::Impl {
  using SteadyClock = std::chrono::steady_clock;

  // Declaration order is destruction order reversed: connections (QPs) and the listener go first,
  // then the devices (CQs, MRs, PDs), then the device list, then the memory.
  Config config;
  uint64_t epoch = 0;
  std::unique_ptr<Mapping> info, locks, sessions_mem;
  ibv_context** device_list = nullptr;
  std::vector<std::unique_ptr<Device>> devices;
  rdma::EventChannel channel;
  rdma::CmId listener;
  std::unordered_map<rdma_cm_id*, std::unique_ptr<Conn>> conns;
  std::unordered_map<uint64_t, rdma_cm_id*> conn_by_serial;
  uint64_t next_conn_serial = 1;
  size_t handshakes = 0;  // conns neither admitted nor gone
  // The shared key clients prove ("" : clients are not authenticated). Read by the event loop at
  // each handshake; SetAuthKey (a reload, on the main thread) replaces it. auth_mu guards it.
  mutable std::mutex auth_mu;
  std::string auth_key;
  std::string AuthKey() const {
    std::lock_guard lock(auth_mu);
    return auth_key;
  }
  std::vector<Cidr> allow_from;  // empty: any address
  // Refusals are logged at most once a second per (address, reason).
  RefusalLog refusal_log{kMaxTrackedPeers};
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions;
  std::vector<std::unique_ptr<Conn>> graveyard;  // destroyed after the current event's ack
  std::vector<uint32_t> free_records;
  struct PeerBucket {
    double tokens = 0;
    SteadyClock::time_point refilled, logged;
    uint64_t refused = 0;  // since the last log line
  };
  static constexpr size_t kMaxTrackedPeers = 65536;
  std::unordered_map<std::string, PeerBucket> peer_buckets;  // by peer address
  uint64_t next_session_id = 1;
  uint64_t accepted_total = 0, rejected_total = 0, recoveries_total = 0;
  Counters counters;  // for the metrics endpoint (atomics: its thread reads them)
  std::atomic<uint64_t> connected{0};
  int stop_fd = -1;
  int admin_fd = -1;
  SteadyClock::time_point grace_until;
  std::chrono::system_clock::time_point grace_until_wall;
  // Drawn from libsodium's CSPRNG at start: what lockd's own loopback connection presents.
  const LoopbackSecret loopback_secret{auth::RandomU64() | 1, auth::RandomU64()};
  // The latest time a lease of a session fenced without proof of death (heartbeat, QP error,
  // operator) may still run: a clean stop before it must leave the restart grace to the next
  // start (issue 16, finding 5).
  SteadyClock::time_point fenced_leases_until{};
  // Until when (steady-clock ns) the event loop advances the info page's alive ticks: for ever
  // with one lockd, in cluster mode up to the fence point the campaign sets (SetAliveUntil).
  std::atomic<int64_t> alive_until_ns{INT64_MAX};
  uint64_t alive_ticks = 0;  // event loop only

  // The recovery thread and what it owns: lockd's loopback channel to its own lock table.
  std::unique_ptr<LockEngine> engine;
  std::mutex rec_mu;  // guards the two members below
  std::condition_variable rec_cv;
  std::deque<RecoveryJob> rec_queue;
  bool rec_stop = false;
  std::unique_ptr<VerbsMemory> loopback;  // the recovery thread's once it runs
  std::thread rec_thread;
  bool stopped_with_clients = false;
  std::chrono::steady_clock::time_point fenced_at{};
  SteadyClock::time_point next_qp_check;
  std::chrono::system_clock::time_point started_wall = std::chrono::system_clock::now();

  // The metrics sampler's memory of the lock table (guarded by sample_mu: two HTTP workers).
  std::mutex sample_mu;
  std::vector<uint64_t> sample_word0;  // word0 per slot at the last scrape
  std::vector<uint32_t> sample_gen;    // word1's generation (low 32 bits) at the last scrape
  uint64_t sample_requests = 0;        // requests seen queueing, summed over scrapes
  bool sampled = false;

  // Declared last, so destroyed first: it reads the members above while it serves.
  std::unique_ptr<MetricsServer> metrics;

  ~Impl() {
    for (auto& a : admin_conns) close(a.fd);
    metrics.reset();
    StopRecovery();
    loopback.reset();
    graveyard.clear();
    conns.clear();
    sessions.clear();
    listener.Reset();
    devices.clear();
    channel.reset();
    if (device_list != nullptr) rdma_free_devices(device_list);
    if (stop_fd >= 0) close(stop_fd);
    if (admin_fd >= 0) {
      close(admin_fd);
      unlink(config.admin_socket.c_str());
    }
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
    Store64(info->data(), proto::InfoPage::kRecoveries, recoveries_total);
    Store64(info->data(), proto::InfoPage::kClockUnixNs, UnixNs(std::chrono::system_clock::now()));
  }

  uint8_t* RecordAt(uint32_t index) const {
    return sessions_mem->data() + uint64_t{index} * proto::kSessionRecordSize;
  }

  void WriteRecord(const Session& s) {
    std::span<uint8_t> rec(RecordAt(s.index), proto::kSessionRecordSize);
    std::memset(rec.data(), 0, rec.size());
    proto::SessionRecord r;
    r.session_id = s.session_id;
    r.pid = s.pid;
    r.flags = s.loopback ? proto::kFlagLoopback : 0;
    r.since_unix_ns = UnixNs(s.since);
    r.name = s.name;
    r.peer = s.peer;
    r.EncodeTo(rec);
  }

  void Reject(rdma_cm_id* id, proto::RejectReason reason, const std::string& peer,
              const std::string& detail, uint32_t retry_after_ms = 0, bool log = true) {
    proto::RejectReply r;
    r.reason = reason;
    r.detail = detail;
    r.retry_after_ms = retry_after_ms;
    const auto bytes = r.Encode();
    if (rdma_reject(id, bytes.data(), static_cast<uint8_t>(bytes.size())) != 0) {
      spdlog::warn("rdma_reject for {} failed: {}", peer, std::strerror(errno));
    }
    CountRefusal(reason);
    if (!log) return;
    LogRefusal(peer, reason, detail, retry_after_ms);
  }

  static_assert(proto::kRejectReasonCount <= Counters::kRejectReasons);
  // Counts a refusal (the handshake's or rdma_cm's) without logging it.
  void CountRefusal(proto::RejectReason reason) {
    ++rejected_total;
    counters.rejected[std::min<size_t>(static_cast<size_t>(reason), Counters::kRejectReasons - 1)]
        .fetch_add(1, std::memory_order_relaxed);
    PublishCounters();
  }

  // Logs a refusal with the peer and the reason, at most once a second per address and reason
  // (a peer retrying in a loop cannot flood the log); says how many were not logged.
  void LogRefusal(const std::string& peer, proto::RejectReason reason, const std::string& detail,
                  uint32_t retry_after_ms) {
    const std::string key =
        peer.substr(0, peer.rfind(':')) + "/" + std::string(proto::RejectReasonLabel(reason));
    if (!refusal_log.ShouldLog(key, SteadyClock::now())) return;
    if (reason == proto::RejectReason::kGrace) {
      spdlog::info("refused {} during the restart grace period ({} ms left)", peer, retry_after_ms);
    } else {
      spdlog::warn("rejected connection from {}: {}{}{}", peer, proto::RejectReasonName(reason),
                   detail.empty() ? "" : ": ", detail);
    }
  }

  // Returns the id to destroy after the event is acknowledged (null if kept).
  rdma_cm_id* OnConnectRequest(rdma_cm_event* ev) {
    rdma_cm_id* id = ev->id;
    const std::string peer = rdma::AddressToString(rdma_get_peer_addr(id));
    const auto* data = static_cast<const uint8_t*>(ev->param.conn.private_data);
    const std::span<const uint8_t> bytes(data, data ? ev->param.conn.private_data_len : 0);
    proto::ConnectRequest req;
    const proto::RejectReason reason = proto::ConnectRequest::Decode(bytes, &req);
    const bool flagged_loopback =
        reason == proto::RejectReason::kNone && (req.flags & proto::kFlagLoopback) != 0;
    // lockd's own loopback proves itself with the secret it drew at start, from its own address;
    // a peer that only sets the flag is refused. Anyone else must be in allow_from.
    const bool is_loopback =
        flagged_loopback && LoopbackProven(loopback_secret, req.join_session, req.join_key,
                                           rdma_get_peer_addr(id), rdma_get_local_addr(id));
    if (flagged_loopback && !is_loopback) {
      Reject(id, proto::RejectReason::kNotAllowed, peer,
             "the loopback flag from a peer that is not this lockd");
      return id;
    }
    if (!is_loopback && !AddressAllowed(allow_from, rdma_get_peer_addr(id))) {
      Reject(id, proto::RejectReason::kNotAllowed, peer, "not in allow_from");
      return id;
    }
    // Every attempt counts against its address's rate, except a thread joining its own session
    // with the right key (a client's threads connect together when they start).
    bool valid_join = false;
    if (reason == proto::RejectReason::kNone && (req.flags & proto::kFlagJoin) != 0) {
      auto it = sessions.find(req.join_session);
      valid_join = it != sessions.end() && it->second->join_key == req.join_key &&
                   (req.flags & proto::kFlagLoopback) == 0;
    }
    if (!valid_join) {
      if (const uint32_t retry = RateLimit(peer); retry > 0) {
        Reject(id, proto::RejectReason::kRateLimited, peer,
               "over " + std::to_string(config.max_connects_per_second) +
                   " connection attempts per second; retry in " + std::to_string(retry) + " ms",
               retry, /*log=*/false);
        return id;
      }
    }
    if (reason != proto::RejectReason::kNone) {
      Reject(id, reason, peer, "");
      return id;
    }
    const bool join = (req.flags & proto::kFlagJoin) != 0;
    const auto now = SteadyClock::now();
    if (!is_loopback && now < grace_until) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(grace_until - now).count() + 1;
      Reject(id, proto::RejectReason::kGrace, peer,
             "lockd restarted after an unclean stop; retry in " + std::to_string(left) + " ms",
             static_cast<uint32_t>(left));
      return id;
    }
    if (handshakes >= kMaxHandshakes) {
      Reject(id, proto::RejectReason::kBusy, peer,
             std::to_string(kMaxHandshakes) + " handshakes in progress; retry in 100 ms", 100);
      return id;
    }
    std::shared_ptr<Session> sess;
    if (join) {
      auto it = sessions.find(req.join_session);
      if (it == sessions.end() || it->second->join_key != req.join_key || is_loopback) {
        Reject(id, proto::RejectReason::kBadSession, peer,
               "session " + std::to_string(req.join_session));
        return id;
      }
      sess = it->second;
      if (sess->conns.size() >= config.max_connections_per_session) {
        Reject(id, proto::RejectReason::kTooManyConnections, peer,
               "session " + std::to_string(sess->session_id) + " has " +
                   std::to_string(sess->conns.size()) + " connections");
        return id;
      }
    } else if (free_records.empty() || (connected.load() >= config.max_clients && !is_loopback)) {
      Reject(id, proto::RejectReason::kServerFull, peer,
             "max_clients " + std::to_string(config.max_clients));
      return id;
    }
    Device* dev = DeviceFor(id->verbs);
    if (dev == nullptr) {
      Reject(id, proto::RejectReason::kInternal, peer, "request arrived on an unknown device");
      return id;
    }
    // Send queue: up to four memory-window binds and the Welcome (or one refusal). Receive queue:
    // the Hello.
    rdma::QpSizes qp_sizes{8, 1, 1};
    if (Status st = rdma::CreateRcQp(id, dev->pd.get(), dev->cq.get(), &qp_sizes); !st.ok()) {
      Reject(id, proto::RejectReason::kNoResources, peer, "cannot create a QP: " + st.message());
      spdlog::error("connection from {}: {}", peer, st.ToString());
      return id;
    }
    auto c = std::make_unique<Conn>();
    c->serial = next_conn_serial++;
    c->device = dev;
    std::memcpy(c->request.data(), bytes.data(), c->request.size());
    c->nonce = auth::NewNonce();
    auto mr = rdma::RegisterMr(dev->pd.get(), c->control.data(), c->control.size(),
                               IBV_ACCESS_LOCAL_WRITE);
    Status posted = mr.status();
    if (posted.ok()) {
      c->control_mr = std::move(mr).value();
      ibv_sge sge{reinterpret_cast<uint64_t>(c->control.data()),
                  static_cast<uint32_t>(proto::kControlMessageMax), c->control_mr->lkey};
      ibv_recv_wr rwr{};
      rwr.wr_id = WrId(c->serial, WrKind::kHelloRecv);
      rwr.sg_list = &sge;
      rwr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      if (const int rc = ibv_post_recv(id->qp, &rwr, &bad); rc != 0) {
        posted = rdma::ErrnoStatus(ErrorCode::kResource, "ibv_post_recv", rc);
      }
    }
    if (!posted.ok()) {
      Reject(id, proto::RejectReason::kInternal, peer, "cannot set up the handshake");
      spdlog::error("connection from {}: {}", peer, posted.ToString());
      c->control_mr.reset();
      rdma_destroy_qp(id);
      return id;
    }
    bool fresh = false;
    if (!sess) {
      fresh = true;
      sess = std::make_shared<Session>();
      sess->session_id = next_session_id++;
      sess->join_key = auth::RandomU64() | 1;  // a CSPRNG: a client must not guess another's
      sess->index = free_records.back();
      free_records.pop_back();
      sess->peer = peer;
      sess->name = req.client_name;
      sess->pid = req.pid;
      sess->loopback = is_loopback;
      sess->since = std::chrono::system_clock::now();
      sess->heartbeat_moved = now;
    }

    // The accept carries the challenge only: no rkey leaves lockd before the Hello is verified.
    proto::Challenge challenge;
    c->auth_key = AuthKey();
    challenge.flags = c->auth_key.empty() ? 0 : proto::kChallengeAuthRequired;
    challenge.nonce = c->nonce;
    const auto out = challenge.Encode();
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
      if (fresh) free_records.push_back(sess->index);
      c->control_mr.reset();
      rdma_destroy_qp(id);
      return id;
    }
    if (fresh) {
      WriteRecord(*sess);
      sessions.emplace(sess->session_id, sess);
    }
    c->id = rdma::CmId(id);
    c->session = sess;
    sess->conns.insert(id);
    conn_by_serial.emplace(c->serial, id);
    conns.emplace(id, std::move(c));
    ++handshakes;
    spdlog::debug("accepted {} ({} session {}, client '{}', pid {}); awaiting its hello", peer,
                  join ? "joins" : "new", sess->session_id, sess->name, sess->pid);
    return nullptr;
  }

  void OnEstablished(rdma_cm_id* id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    it->second->established = true;
  }

  // ---- the handshake's messages (completions on a device's CQ)

  void OnCompletions(Device& d) {
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    if (ibv_get_cq_event(d.comp_channel.get(), &ev_cq, &ev_ctx) != 0) return;
    ibv_ack_cq_events(ev_cq, 1);
    // Re-arm before polling, so that a completion arriving after the last poll still wakes us.
    if (ibv_req_notify_cq(d.cq.get(), 0) != 0) {
      spdlog::error("device {}: ibv_req_notify_cq failed: {}", d.name, std::strerror(errno));
    }
    PollCompletions(d);
  }

  void PollCompletions(Device& d) {
    ibv_wc wc[16];
    for (;;) {
      const int n = ibv_poll_cq(d.cq.get(), 16, wc);
      if (n <= 0) break;
      for (int i = 0; i < n; ++i) OnCompletion(wc[i]);
    }
    graveyard.clear();
  }

  void OnCompletion(const ibv_wc& wc) {
    const auto kind = static_cast<WrKind>(wc.wr_id & 3);
    auto sit = conn_by_serial.find(wc.wr_id >> 2);
    if (sit == conn_by_serial.end()) return;  // its connection is gone already
    auto it = conns.find(sit->second);
    if (it == conns.end()) return;
    Conn& c = *it->second;
    if (wc.status != IBV_WC_SUCCESS) {
      if (wc.status != IBV_WC_WR_FLUSH_ERR) {
        const char* what = kind == WrKind::kBind        ? "memory window bind"
                           : kind == WrKind::kHelloRecv ? "hello receive"
                                                        : "handshake send";
        spdlog::warn("connection from {}: {} failed ({})", c.session->peer, what,
                     ibv_wc_status_str(wc.status));
      }
      DropHandshake(c, std::string("handshake failed (") + ibv_wc_status_str(wc.status) + ")");
      return;
    }
    switch (kind) {
      case WrKind::kHelloRecv:
        OnHello(c,
                std::span<const uint8_t>(c.control.data(),
                                         std::min<size_t>(wc.byte_len, proto::kControlMessageMax)),
                (wc.wc_flags & IBV_WC_WITH_IMM) != 0 ? ntohl(wc.imm_data) : 0);
        break;
      case WrKind::kRefusal:
        DropHandshake(c, "refused");
        break;
      case WrKind::kWelcome:
      case WrKind::kBind:
        break;
    }
  }

  void OnHello(Conn& c, std::span<const uint8_t> msg, uint32_t imm) {
    if (c.admitted || c.refused) return;
    if (imm != static_cast<uint32_t>(proto::ControlKind::kHello)) {
      Refuse(c, proto::RejectReason::kBadHello, "the first message is not a hello");
      return;
    }
    proto::Hello hello;
    if (const auto r = proto::Hello::Decode(msg, &hello); r != proto::RejectReason::kNone) {
      Refuse(c, r, std::to_string(msg.size()) + " bytes");
      return;
    }
    if (!c.auth_key.empty()) {
      if ((hello.flags & proto::kHelloHasProof) == 0) {
        Refuse(c, proto::RejectReason::kAuthFailed, "the client brought no key");
        return;
      }
      if (!auth::MacEqual(hello.mac, auth::HelloMac(c.auth_key, c.nonce, hello.nonce, c.request))) {
        Refuse(c, proto::RejectReason::kAuthFailed, "wrong key (its proof does not verify)");
        return;
      }
    }
    Admit(c, hello);
  }

  // Sends a refusal in place of the Welcome; the connection is dropped when it has gone out
  // (or by the establish timeout). No rkey was handed out.
  void Refuse(Conn& c, proto::RejectReason reason, const std::string& detail) {
    c.refused = true;
    CountRefusal(reason);
    LogRefusal(c.session->peer, reason, detail, 0);
    proto::RejectReply r;
    r.reason = reason;
    r.detail = detail;
    if (!PostControl(c, r.Encode(), proto::ControlKind::kRefusal, WrKind::kRefusal, {}).ok()) {
      DropHandshake(c, "refused");
    }
  }

  // Posts `binds` (memory-window binds, unsignalled) and then `msg` as a signalled SEND with
  // immediate data `kind`, in one chain: the binds execute before the SEND goes out.
  Status PostControl(Conn& c, std::span<const uint8_t> msg, proto::ControlKind kind, WrKind wr_kind,
                     std::span<ibv_send_wr> binds) {
    uint8_t* buf = c.control.data() + proto::kControlMessageMax;
    std::memcpy(buf, msg.data(), msg.size());
    ibv_sge sge{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(msg.size()),
                c.control_mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = WrId(c.serial, wr_kind);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htonl(static_cast<uint32_t>(kind));
    wr.send_flags = IBV_SEND_SIGNALED | (binds.empty() ? 0 : IBV_SEND_FENCE);
    for (size_t i = 0; i < binds.size(); ++i) {
      binds[i].next = i + 1 < binds.size() ? &binds[i + 1] : &wr;
    }
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(c.id->qp, binds.empty() ? &wr : &binds[0], &bad); rc != 0) {
      spdlog::warn("connection from {}: ibv_post_send of the handshake failed: {}", c.session->peer,
                   std::strerror(rc));
      return rdma::ErrnoStatus(ErrorCode::kConnection, "ibv_post_send", rc);
    }
    return Status::Ok();
  }

  // The Hello verified: bind this connection's memory windows and send the rkeys.
  void Admit(Conn& c, const proto::Hello& hello) {
    Device& dev = *c.device;
    Session& s = *c.session;
    const uint64_t record_off = uint64_t{s.index} * proto::kSessionRecordSize;
    struct Window {
      ibv_mr* mr;
      uint8_t* addr;
      uint64_t len;
      int access;
    };
    constexpr size_t kWritable = proto::SessionRecord::kClientWritable;
    Window want[4] = {
        {dev.info_mr.get(), info->data(), proto::kInfoPageSize, IBV_ACCESS_REMOTE_READ},
        {dev.locks_mr.get(), locks->data(), proto::LockTableBytes(config.lock_count),
         IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC},
        {dev.sessions_mr.get(), sessions_mem->data(), sessions_mem->size(), IBV_ACCESS_REMOTE_READ},
        // The client's own record, from its heartbeat on: the header before it is lockd's view
        // of the session (peer, pid, name, session id), which operators see and trust.
        {dev.sessions_mr.get(), sessions_mem->data() + record_off + kWritable,
         proto::kSessionRecordSize - kWritable, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE},
    };
    uint32_t rkeys[4];
    ibv_send_wr binds[4]{};
    size_t nbinds = 0;
    if (config.memory_windows) {
      ibv_mr* record_mr = nullptr;
      for (auto& [d, mr] : s.record_mrs) {
        if (d == &dev) record_mr = mr.get();
      }
      if (record_mr == nullptr) {
        // The registration itself covers only what the client may write: rdma_rxe checks an
        // access against the window's MR, not the window's own bounds (measured: a WRITE over
        // the header through a window bound only from kClientWritable on landed), a real NIC
        // against both.
        auto mr = rdma::RegisterMr(dev.pd.get(), sessions_mem->data() + record_off + kWritable,
                                   proto::kSessionRecordSize - kWritable,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
        if (!mr.ok()) {
          spdlog::error("connection from {}: {}", s.peer, mr.status().ToString());
          Refuse(c, proto::RejectReason::kNoResources,
                 "cannot register the session record: " + mr.status().message());
          return;
        }
        record_mr = mr.value().get();
        s.record_mrs.emplace_back(&dev, std::move(mr).value());
      }
      want[3].mr = record_mr;
      for (size_t i = 0; i < 4; ++i) {
        auto mw = rdma::AllocMw(dev.pd.get());
        if (!mw.ok()) {
          spdlog::error("connection from {}: {}", s.peer, mw.status().ToString());
          Refuse(c, proto::RejectReason::kNoResources,
                 "cannot allocate a memory window: " + mw.status().message());
          return;
        }
        ibv_send_wr& b = binds[nbinds++];
        b.wr_id = WrId(c.serial, WrKind::kBind);
        b.opcode = IBV_WR_BIND_MW;
        b.bind_mw.mw = mw.value().get();
        b.bind_mw.rkey = ibv_inc_rkey(mw.value()->rkey);
        b.bind_mw.bind_info.mr = want[i].mr;
        b.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(want[i].addr);
        b.bind_mw.bind_info.length = want[i].len;
        b.bind_mw.bind_info.mw_access_flags = static_cast<unsigned>(want[i].access);
        rkeys[i] = b.bind_mw.rkey;
        c.windows.push_back(std::move(mw).value());
      }
    } else {
      rkeys[0] = dev.info_mr->rkey;
      rkeys[1] = dev.locks_mr->rkey;
      rkeys[2] = rkeys[3] = dev.sessions_mr->rkey;
    }
    proto::AcceptReply reply;
    reply.epoch = epoch;
    reply.session_id = s.session_id;
    reply.lease_ns = config.lease_ms * 1'000'000;
    reply.lock_count = config.lock_count;
    reply.stall_factor = config.stall_factor;
    reply.session_record_size = proto::kSessionRecordSize;
    reply.info = {reinterpret_cast<uint64_t>(info->data()), proto::kInfoPageSize, rkeys[0]};
    reply.locks = {reinterpret_cast<uint64_t>(locks->data()),
                   proto::LockTableBytes(config.lock_count), rkeys[1]};
    reply.sessions = {reinterpret_cast<uint64_t>(sessions_mem->data()),
                      sessions_mem->size(),  // whole pages; records past the last are zero
                      rkeys[2]};
    reply.record = {reinterpret_cast<uint64_t>(sessions_mem->data() + record_off +
                                               proto::SessionRecord::kClientWritable),
                    proto::kSessionRecordSize - proto::SessionRecord::kClientWritable, rkeys[3]};
    reply.session_record_offset = record_off;
    reply.max_sessions = config.max_clients;
    reply.heartbeat_interval_ns = config.heartbeat_interval_ms * 1'000'000;
    reply.heartbeat_timeout_ns = config.heartbeat_timeout_ms * 1'000'000;
    reply.join_key = s.join_key;
    reply.record_entries = proto::SessionRecord::kMaxEntries;
    auto out = reply.Encode();
    if (!c.auth_key.empty()) {
      reply.mac = auth::WelcomeMac(c.auth_key, hello.nonce, c.nonce,
                                   std::span<const uint8_t>(out).first(proto::AcceptReply::kMac));
      out = reply.Encode();
    }
    if (!PostControl(c, out, proto::ControlKind::kWelcome, WrKind::kWelcome,
                     std::span<ibv_send_wr>(binds, nbinds))
             .ok()) {
      DropHandshake(c, "cannot send the welcome");
      return;
    }
    c.admitted = true;
    --handshakes;
    const bool join = s.counted;
    if (join) {
      counters.joined.fetch_add(1, std::memory_order_relaxed);
      spdlog::debug("connection from {} joined session {}", s.peer, s.session_id);
      return;
    }
    s.counted = true;
    s.heartbeat_moved = SteadyClock::now();
    ++accepted_total;
    counters.accepted.fetch_add(1, std::memory_order_relaxed);
    if (!s.loopback) connected.fetch_add(1);
    PublishCounters();
    spdlog::info("client connected: session {} from {} ('{}', pid {}){}{}", s.session_id, s.peer,
                 s.name, s.pid, c.auth_key.empty() ? "" : ", authenticated",
                 s.loopback ? " [lockd loopback]" : "");
  }

  // Ends a connection that never got its rkeys: the session with it if it has no other.
  void DropHandshake(Conn& c, const std::string& why) {
    std::shared_ptr<Session> s = c.session;
    rdma_cm_id* id = c.id.get();
    if (!c.admitted && !c.refused) {
      spdlog::debug("handshake with {} ended: {}", s->peer, why);
    }
    if (s->counted) {
      RemoveConn(id);
    } else {
      // No connection of this session was ever admitted: nothing of it can be in the table.
      EndSession(s, EndReason::kConnectFailed, why, true);
    }
  }

  // Fences, disconnects and forgets one connection of a session that lives on.
  void RemoveConn(rdma_cm_id* id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    Conn& c = *it->second;
    c.id.FenceQp();
    (void)rdma_disconnect(id);
    c.windows.clear();
    if (!c.admitted) --handshakes;
    c.session->conns.erase(id);
    conn_by_serial.erase(c.serial);
    graveyard.push_back(std::move(it->second));
    conns.erase(it);
  }

  // Ends a session: every connection of it is fenced (QP to ERR, so nothing of it can land any
  // more) and disconnected, then what its record shows is handed to the recovery thread. `now`:
  // free at once (the client is gone: it disconnected, which the SDK does only after ending its
  // leases, or its process died); otherwise one lease later, when any lease it may still believe
  // in has run out.
  // `s` is taken by value: callers pass references into `sessions` or into a Conn, which the
  // first lines below erase (issue 17, finding 1: a use-after-free on release --force --session).
  void EndSession(std::shared_ptr<Session> s, EndReason reason, const std::string& why, bool now) {
    if (sessions.erase(s->session_id) == 0) return;  // already ended
    if (!s->loopback) {
      counters.ended[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
    }
    const auto ended = SteadyClock::now();
    // The QP to ERR first (nothing more of it executes), then its memory windows are freed: an
    // rkey the client kept is then invalid on any QP, a new connection of its own included.
    for (rdma_cm_id* id : std::vector<rdma_cm_id*>(s->conns.begin(), s->conns.end())) {
      RemoveConn(id);  // disconnects too, so that the peer sees DISCONNECTED
    }
    s->conns.clear();
    if (s->counted && !s->loopback) connected.fetch_sub(1);
    if (s->counted && !s->loopback && !now) {
      fenced_leases_until =
          std::max(fenced_leases_until, ended + std::chrono::milliseconds(config.lease_ms));
    }

    RecoveryJob job;
    job.session_id = s->session_id;
    job.who = "session " + std::to_string(s->session_id) + " ('" + s->name + "', pid " +
              std::to_string(s->pid) + ", " + s->peer + ")";
    job.why = why;
    job.ended = ended;
    job.not_before = now ? ended : ended + std::chrono::milliseconds(config.lease_ms);
    uint32_t requesting = 0;
    const uint8_t* rec = RecordAt(s->index);
    const uint32_t garbage = proto::ScanRecordEntries(
        [rec](uint64_t off) { return Load64(rec, off); }, config.lock_count,
        [&](const proto::RequestEntry& e, uint32_t) {
          if (e.state == proto::RequestEntry::State::kRequesting) {
            ++requesting;
            return;
          }
          ReapState r;
          r.ticket = Ticket{e.slot, e.mode, proto::Word0::Decode(e.ticket), 0};
          job.items.push_back(r);
        });
    std::memset(RecordAt(s->index), 0, proto::kSessionRecordSize);
    free_records.push_back(s->index);
    if (s->loopback) {
      spdlog::info("lockd's loopback connection closed: {}", why);
    } else if (!s->counted) {
      // Never admitted: it had no rkey, so nothing of it is in the table. Refusals are logged
      // (rate-limited) where they happen; this line would let a peer flood the log.
      spdlog::debug("{} ended before it was admitted: {}", job.who, why);
    } else {
      ++recoveries_total;
      spdlog::info(
          "{} ended: {}; {} recorded request(s) to free {}{}{}", job.who, why, job.items.size(),
          now ? "now" : "after one lease (" + std::to_string(config.lease_ms) + " ms)",
          requesting > 0 ? "; " + std::to_string(requesting) +
                               " request(s) without a known ticket are left to stall recovery"
                         : "",
          garbage > 0 ? "; " + std::to_string(garbage) + " unreadable entr(y/ies) ignored" : "");
    }
    PublishCounters();
    if (!job.items.empty()) {
      std::lock_guard lk(rec_mu);
      rec_queue.push_back(std::move(job));
      counters.recovery_queue.fetch_add(1, std::memory_order_relaxed);
      rec_cv.notify_all();
    }
  }

  void DropConn(rdma_cm_id* id, EndReason reason, const std::string& why, bool now) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    std::shared_ptr<Session> s = it->second->session;
    if (!it->second->established && s->conns.size() == 1 && !s->counted) {
      spdlog::warn("connection from {} failed before it was established: {}", s->peer, why);
    }
    if (!it->second->admitted) {  // it never had an rkey: it alone goes (its session, if new)
      DropHandshake(*it->second, why);
      return;
    }
    if (reason == EndReason::kDisconnected) {
      // A DISCONNECTED is not proof that the client is gone: the SDK closes a thread's join that
      // failed after the Welcome (a resource or a timeout at the client) while the session's
      // other threads hold leases (issue 16, finding 2). Only that connection goes; the session
      // ends when its last connection does (a dead process closes them all), by heartbeat, or
      // when the SDK, having ended every lease, closes them.
      size_t others = 0;
      for (rdma_cm_id* other : s->conns) {
        auto o = conns.find(other);
        if (other != id && o != conns.end() && o->second->admitted) ++others;
      }
      if (others > 0) {
        spdlog::info("session {}: one of its connections closed ({}); {} other(s) remain",
                     s->session_id, why, others);
        RemoveConn(id);
        PublishCounters();
        return;
      }
    }
    EndSession(s, reason, why, now);
  }

  Status HandleOneEvent(bool* device_gone) {
    rdma_cm_event* raw = nullptr;
    if (rdma_get_cm_event(channel.get(), &raw) != 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
      return rdma::ErrnoStatus(ErrorCode::kConnection, "rdma_get_cm_event", errno);
    }
    rdma::CmEvent ev(raw);
    rdma_cm_id* destroy_id = nullptr;
    switch (ev->event) {
      case RDMA_CM_EVENT_CONNECT_REQUEST:
        destroy_id = OnConnectRequest(ev.get());
        break;
      case RDMA_CM_EVENT_ESTABLISHED:
        OnEstablished(ev->id);
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
        DropConn(ev->id, EndReason::kDisconnected, "disconnected", true);
        break;
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
        // The connection never carried anything we can trust to be over: wait out a lease.
        DropConn(ev->id, EndReason::kConnectFailed, rdma_event_str(ev->event), false);
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
    graveyard.clear();
    if (destroy_id != nullptr) rdma_destroy_id(destroy_id);
    return Status::Ok();
  }

  // A token bucket per peer address (without the port): max_connects_per_second tokens a second,
  // bursts of as many. Returns 0 to admit, else the ms until a token is there. Refusals are
  // logged at most once a second per address, with how many there were.
  uint32_t RateLimit(const std::string& peer) {
    const uint32_t rate = config.max_connects_per_second;
    if (rate == 0) return 0;
    const std::string addr = peer.substr(0, peer.rfind(':'));
    const auto now = SteadyClock::now();
    auto it = peer_buckets.find(addr);
    if (it == peer_buckets.end()) {
      if (peer_buckets.size() >= kMaxTrackedPeers) return 0;  // Tick evicts idle ones
      it = peer_buckets.emplace(addr, PeerBucket{static_cast<double>(rate), now, {}, 0}).first;
    }
    PeerBucket& b = it->second;
    b.tokens = std::min<double>(
        rate, b.tokens + rate * std::chrono::duration<double>(now - b.refilled).count());
    b.refilled = now;
    if (b.tokens >= 1) {
      b.tokens -= 1;
      return 0;
    }
    ++b.refused;
    if (now - b.logged >= std::chrono::seconds(1)) LogRefused(addr, b, now);
    return static_cast<uint32_t>(std::ceil((1 - b.tokens) / rate * 1000.0));
  }

  void LogRefused(const std::string& addr, PeerBucket& b, SteadyClock::time_point now) {
    spdlog::warn(
        "rate limit: refused {} connection attempt(s) from {} (over max_connects_per_second {})",
        b.refused, addr, config.max_connects_per_second);
    b.refused = 0;
    b.logged = now;
  }

  // Connections accepted but not admitted within kEstablishTimeout (never established, or no
  // valid Hello): they got no rkey, so a session with no other connection ends at once; a
  // thread's join that never completed is dropped alone.
  void DropHalfOpen(SteadyClock::time_point now) {
    std::vector<rdma_cm_id*> stale;
    for (auto& [id, c] : conns) {
      if (!c->admitted && now - c->accepted_at > kEstablishTimeout) stale.push_back(id);
    }
    for (rdma_cm_id* id : stale) {
      auto it = conns.find(id);
      if (it == conns.end()) continue;  // ended with its session meanwhile
      Conn& c = *it->second;
      std::shared_ptr<Session> s = c.session;
      const std::string why = "connection from " + s->peer +
                              (c.established ? " sent no valid hello" : " not established") +
                              " within " + std::to_string(kEstablishTimeout.count()) +
                              " s of its accept";
      if (s->counted) {
        spdlog::warn("{}: dropping it (session {} keeps its other connections)", why,
                     s->session_id);
      } else {
        spdlog::warn("{}: ending session {}", why, s->session_id);
      }
      DropHandshake(c, why);
    }
  }

  // Every tick: publish the clock, watch heartbeats and QP states.
  void Tick() {
    const auto now = SteadyClock::now();
    // The sign of life clients of a cluster-mode lockd must see (issue 16, finding 4): advanced
    // only by this loop, and only while lockd may serve (its etcd lease provably valid).
    if (now.time_since_epoch().count() < alive_until_ns.load(std::memory_order_relaxed)) {
      Store64(info->data(), proto::InfoPage::kAliveTicks, ++alive_ticks);
    }
    DropHalfOpen(now);
    for (auto it = peer_buckets.begin(); it != peer_buckets.end();) {
      if (it->second.refused > 0 && now - it->second.logged >= std::chrono::seconds(1)) {
        LogRefused(it->first, it->second, now);
      }
      // Idle for 10 s: its bucket is full again; forget it.
      it = now - it->second.refilled > std::chrono::seconds(10) && it->second.refused == 0
               ? peer_buckets.erase(it)
               : std::next(it);
    }
    const auto timeout = std::chrono::milliseconds(config.heartbeat_timeout_ms);
    const bool check_qps = now >= next_qp_check;
    if (check_qps) next_qp_check = now + timeout / 4;
    struct Dead {
      std::shared_ptr<Session> session;
      EndReason reason;
      std::string why;
    };
    std::vector<Dead> dead;
    for (auto& [sid, s] : sessions) {
      if (s->loopback) continue;
      uint8_t* rec = RecordAt(s->index);
      const uint64_t hb = Load64(rec, proto::SessionRecord::kHeartbeat);
      if (hb != s->last_heartbeat) {
        s->last_heartbeat = hb;
        s->heartbeat_moved = now;
        Store64(rec, proto::SessionRecord::kHeartbeatSeenUnixNs,
                UnixNs(std::chrono::system_clock::now()));
      } else if (s->counted && now - s->heartbeat_moved > timeout) {
        dead.push_back({s, EndReason::kHeartbeatTimeout,
                        "no heartbeat for " +
                            std::to_string(static_cast<int64_t>(MsSince(s->heartbeat_moved))) +
                            " ms (heartbeat_timeout_ms " +
                            std::to_string(config.heartbeat_timeout_ms) + ")"});
        continue;
      }
      // A QP in the error state: a bad operation of the client or a transport failure (rdma_rxe
      // reports no async event for these). rdma_cm also moves a QP to ERR when a disconnect
      // request arrives, before we see DISCONNECTED: so only a QP found in ERR at two checks in a
      // row without a disconnect counts. Checked every quarter heartbeat timeout, not every tick: a
      // query is a system call per connection.
      if (!check_qps) continue;
      bool qp_error = false;
      for (rdma_cm_id* id : s->conns) {
        ibv_qp_attr attr{};
        ibv_qp_init_attr init{};
        if (id->qp != nullptr && ibv_query_qp(id->qp, &attr, IBV_QP_STATE, &init) == 0 &&
            attr.qp_state == IBV_QPS_ERR) {
          qp_error = true;
          break;
        }
      }
      if (!qp_error) {
        s->qp_error_seen = false;
      } else if (!s->qp_error_seen) {
        s->qp_error_seen = true;
      } else {
        dead.push_back({s, EndReason::kQpError,
                        "its QP is in the error state (a bad operation or a transport failure)"});
      }
    }
    for (auto& d : dead) EndSession(d.session, d.reason, d.why, false);
    graveyard.clear();
    PublishCounters();
  }

  // A device's asynchronous event: a QP of a session broke (where the provider reports it).
  void OnAsyncEvent(Device& d) {
    ibv_async_event ev{};
    if (ibv_get_async_event(d.ctx, &ev) != 0) return;
    const ibv_event_type type = ev.event_type;
    ibv_qp* qp = nullptr;
    if (type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR ||
        type == IBV_EVENT_QP_ACCESS_ERR) {
      qp = ev.element.qp;
    }
    ibv_ack_async_event(&ev);
    if (qp == nullptr) {
      spdlog::debug("device {}: async event {}", d.name, ibv_event_type_str(type));
      return;
    }
    for (auto& [id, c] : conns) {
      if (id->qp == qp) {
        EndSession(c->session, EndReason::kQpError,
                   std::string("its QP failed (") + ibv_event_type_str(type) + ")", false);
        break;
      }
    }
    graveyard.clear();
  }

  // ---- admin socket

  Status OpenAdminSocket() {
    if (config.admin_socket.empty()) return Status::Ok();
    sockaddr_un addr{};
    if (config.admin_socket.size() >= sizeof(addr.sun_path)) {
      return Error(ErrorCode::kConfig, "admin_socket path is too long: " + config.admin_socket);
    }
    std::error_code ec;
    const auto dir = std::filesystem::path(config.admin_socket).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    admin_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (admin_fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "socket(AF_UNIX)", errno);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, config.admin_socket.c_str(), config.admin_socket.size());
    unlink(config.admin_socket.c_str());  // a stale socket of an earlier run
    if (bind(admin_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        chmod(config.admin_socket.c_str(), 0660) != 0 || listen(admin_fd, 16) != 0) {
      const int err = errno;
      close(admin_fd);
      admin_fd = -1;
      return rdma::ErrnoStatus(ErrorCode::kIo, "admin socket " + config.admin_socket, err);
    }
    spdlog::info("admin socket: {}", config.admin_socket);
    return Status::Ok();
  }

  // The admin socket never blocks the event loop (issue 16, finding 4: a peer that trickled its
  // line could hold it for up to 1024 s before): each connection is non-blocking, read as bytes
  // arrive, answered with a non-blocking send (MSG_NOSIGNAL: a peer that has gone cannot raise
  // SIGPIPE), and dropped after kAdminTimeout. At most kMaxAdminConns are open at once.
  struct AdminConn {
    int fd = -1;
    std::string line;
    SteadyClock::time_point deadline;
    ucred cred{};
  };
  static constexpr size_t kMaxAdminConns = 16;
  static constexpr auto kAdminTimeout = std::chrono::seconds(2);
  std::vector<AdminConn> admin_conns;  // event loop only
  // After a failed accept (no descriptors left), the admin socket is not polled until then.
  SteadyClock::time_point admin_paused_until{}, admin_error_logged{};
  static constexpr std::chrono::milliseconds kAdminPauseOnError{100};

  void OnAdmin() {
    const int fd = accept4(admin_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) return;
      // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays queued and
      // the socket stays readable, so polling it again at once would spin the event loop. Stop
      // polling it for a while instead; the request waits in the listen backlog.
      const auto now = SteadyClock::now();
      admin_paused_until = now + kAdminPauseOnError;
      if (now >= admin_error_logged + std::chrono::seconds(10)) {
        admin_error_logged = now;
        spdlog::error("admin socket: accept failed ({}); not accepting for {} ms",
                      std::strerror(err), kAdminPauseOnError.count());
      }
      return;
    }
    if (admin_conns.size() >= kMaxAdminConns) {
      close(fd);
      return;
    }
    AdminConn c;
    c.fd = fd;
    c.deadline = SteadyClock::now() + kAdminTimeout;
    socklen_t len = sizeof(c.cred);
    (void)getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len);
    admin_conns.push_back(std::move(c));
  }

  // Reads what connection `i` has sent; once its line is complete (or it closed, or sent too
  // much), answers and closes it. Returns false when the connection is gone.
  bool OnAdminReadable(AdminConn& c) {
    char buf[256];
    bool done = false;
    for (;;) {
      const ssize_t n = read(c.fd, buf, sizeof(buf));
      if (n > 0) {
        c.line.append(buf, static_cast<size_t>(n));
        if (c.line.find('\n') != std::string::npos || c.line.size() >= 1024) {
          done = true;
          break;
        }
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      done = true;  // EOF or an error: answer what came
      break;
    }
    if (!done) return true;
    if (auto nl = c.line.find('\n'); nl != std::string::npos) c.line.resize(nl);
    const std::string asker =
        "uid " + std::to_string(c.cred.uid) + " pid " + std::to_string(c.cred.pid);
    const std::string reply = AdminCommand(c.line, asker) + "\n";
    (void)!send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(c.fd);
    return false;
  }

  void ExpireAdmin(SteadyClock::time_point now) {
    std::erase_if(admin_conns, [now](const AdminConn& c) {
      if (now < c.deadline) return false;
      close(c.fd);
      return true;
    });
  }

  // One request per connection: "release-slot SLOT" or "release-session ID". The reply starts with
  // "ok " or "error ".
  std::string AdminCommand(const std::string& line, const std::string& asker) {
    std::istringstream in(line);
    std::string cmd, arg, extra;
    in >> cmd >> arg >> extra;
    uint64_t n = 0;
    const bool numeric = !arg.empty() && arg.size() <= 19 &&
                         arg.find_first_not_of("0123456789") == std::string::npos;
    if (numeric) n = std::stoull(arg);
    if (!extra.empty() || !numeric || (cmd != "release-slot" && cmd != "release-session")) {
      return "error bad request '" + line.substr(0, 80) +
             "' (expected: release-slot SLOT | release-session ID)";
    }
    const std::string lease = std::to_string(config.lease_ms);
    if (cmd == "release-session") {
      auto it = sessions.find(n);
      if (it == sessions.end() || it->second->loopback) {
        return "error no client session " + arg;
      }
      spdlog::warn("forced release of session {} requested by {}", n, asker);
      counters.forced_releases.fetch_add(1, std::memory_order_relaxed);
      EndSession(it->second, EndReason::kForced, "forced release by " + asker, false);
      graveyard.clear();
      return "ok session " + arg + " fenced; its locks are freed after one lease (" + lease +
             " ms), when its leases have run out";
    }
    if (n >= config.lock_count) {
      return "error slot " + arg + " is out of range (lock_count " +
             std::to_string(config.lock_count) + ")";
    }
    // Who holds it, by the records: entries on this slot whose ticket the word shows granted.
    const auto w0 = proto::Word0::Decode(Load64(locks->data(), proto::SlotOffset(n)));
    std::vector<std::shared_ptr<Session>> holders;
    for (auto& [sid, s] : sessions) {
      const uint8_t* rec = RecordAt(s->index);
      bool holds = false;
      (void)proto::ScanRecordEntries(
          [rec](uint64_t off) { return Load64(rec, off); }, config.lock_count,
          [&](const proto::RequestEntry& e, uint32_t) {
            holds = holds || (e.slot == n && e.state == proto::RequestEntry::State::kQueued &&
                              proto::Granted(w0, proto::Word0::Decode(e.ticket), e.mode));
          });
      if (holds) holders.push_back(s);
    }
    if (holders.empty()) {
      return "error no session's record shows a holder of slot " + arg +
             " (free, or held by a client that did not record it: waiters recover it after " +
             std::to_string(config.lease_ms * config.stall_factor) + " ms without progress)";
    }
    std::string ids;
    for (auto& s : holders) {
      ids += (ids.empty() ? "" : ",") + std::to_string(s->session_id);
      spdlog::warn("forced release of slot {} requested by {}: fencing session {}", n, asker,
                   s->session_id);
      EndSession(s, EndReason::kForced, "forced release of slot " + arg + " by " + asker, false);
    }
    counters.forced_releases.fetch_add(1, std::memory_order_relaxed);
    graveyard.clear();
    return "ok slot " + arg + ": fenced session(s) " + ids +
           "; their locks are freed after one lease (" + lease +
           " ms), when their leases have run out";
  }

  // ---- metrics (runs on the metrics server's threads: reads atomics and the lock table only)

  std::string Render() {
    using std::chrono::duration;
    PromText p;
    const auto now_wall = std::chrono::system_clock::now();
    p.Family("rdmalock_lockd_info", "gauge", "lockd's version (label) and epoch; always 1");
    p.Sample(uint64_t{1},
             "version=\"" RDMALOCK_VERSION "\",epoch=\"" + std::to_string(epoch) + "\"");
    p.Family("rdmalock_lockd_epoch", "gauge",
             "epoch of this run (bumped at every start; it leads every fencing token)");
    p.Sample(epoch);
    p.Family("rdmalock_lockd_start_time_seconds", "gauge", "when lockd started, Unix seconds");
    p.Sample(duration<double>(started_wall.time_since_epoch()).count());
    p.Family("rdmalock_lockd_lease_seconds", "gauge", "a holder's lease (lease_ms)");
    p.Sample(static_cast<double>(config.lease_ms) / 1000.0);
    p.Family("rdmalock_lockd_stall_factor", "gauge",
             "waiters recover a lock after stall_factor x lease without progress");
    p.Sample(uint64_t{config.stall_factor});
    p.Family("rdmalock_lockd_grace_remaining_seconds", "gauge",
             "restart grace period left (clients are refused until it ends); 0 if none");
    p.Sample(grace_until_wall > now_wall ? duration<double>(grace_until_wall - now_wall).count()
                                         : 0.0);
    p.Family("rdmalock_lockd_sessions_connected", "gauge", "client sessions connected now");
    p.Sample(connected.load(std::memory_order_relaxed));
    p.Family("rdmalock_lockd_sessions_max", "gauge", "max_clients");
    p.Sample(uint64_t{config.max_clients});
    p.Family("rdmalock_lockd_handshakes_accepted_total", "counter",
             "client sessions admitted (their first connection established)");
    p.Sample(counters.accepted.load(std::memory_order_relaxed));
    p.Family("rdmalock_lockd_connections_joined_total", "counter",
             "further connections accepted into existing sessions (one per client thread)");
    p.Sample(counters.joined.load(std::memory_order_relaxed));
    p.Family("rdmalock_lockd_handshakes_rejected_total", "counter",
             "connections rejected, by reason");
    for (uint16_t r = 1; r < proto::kRejectReasonCount; ++r) {
      const auto reason = static_cast<proto::RejectReason>(r);
      p.Sample(counters.rejected[r].load(std::memory_order_relaxed),
               "reason=\"" + std::string(proto::RejectReasonLabel(reason)) + "\"");
    }
    p.Family("rdmalock_lockd_sessions_ended_total", "counter",
             "client sessions that ended, by reason (lockd then frees their recorded requests)");
    for (size_t r = 0; r < static_cast<size_t>(EndReason::kCount); ++r) {
      p.Sample(counters.ended[r].load(std::memory_order_relaxed),
               "reason=\"" + std::string(EndReasonLabel(static_cast<EndReason>(r))) + "\"");
    }
    p.Family("rdmalock_lockd_forced_releases_total", "counter",
             "lockctl release --force requests carried out");
    p.Sample(counters.forced_releases.load(std::memory_order_relaxed));
    p.Family("rdmalock_lockd_recovered_requests_total", "counter",
             "recorded requests of ended sessions, by what lockd's recovery found: released (it "
             "freed them), done (already over), recovered (waiters had recovered past them), "
             "gave_up (left to waiters' stall recovery)");
    p.Sample(counters.freed_released.load(std::memory_order_relaxed), "outcome=\"released\"");
    p.Sample(counters.freed_done.load(std::memory_order_relaxed), "outcome=\"done\"");
    p.Sample(counters.freed_recovered.load(std::memory_order_relaxed), "outcome=\"recovered\"");
    p.Sample(counters.freed_gave_up.load(std::memory_order_relaxed), "outcome=\"gave_up\"");
    p.Family("rdmalock_lockd_recovery_pending", "gauge",
             "ended sessions whose recorded requests lockd has yet to free");
    p.Sample(counters.recovery_queue.load(std::memory_order_relaxed));
    RenderLockTable(p);
    return p.text();
  }

  // Occupancy from one pass of relaxed loads over the lock table (not a snapshot: clients change
  // words while it reads), and a count of requests that queued since the last scrape.
  void RenderLockTable(PromText& p) {
    const auto t0 = SteadyClock::now();
    uint64_t held_x = 0, held_s = 0, holders = 0, waiting = 0, contended = 0, frozen = 0;
    std::lock_guard lk(sample_mu);
    if (sample_word0.size() != config.lock_count) {
      sample_word0.assign(config.lock_count, 0);
      sample_gen.assign(config.lock_count, 0);
    }
    for (uint64_t slot = 0; slot < config.lock_count; ++slot) {
      const size_t off = proto::SlotOffset(slot);
      const proto::Word0 w = proto::Word0::Decode(Load64(locks->data(), off));
      const auto gen = static_cast<uint32_t>(proto::Generation(Load64(locks->data(), off + 8)));
      const proto::Occupancy o = proto::OccupancyOf(w);
      if (o.holders > 0) {
        if (o.exclusive_outstanding > 0) {
          ++held_x;
        } else {
          ++held_s;
        }
      }
      holders += o.holders;
      waiting += o.waiting;
      if (o.waiting > 0) ++contended;
      if (w.Frozen()) ++frozen;
      if (sampled) {
        sample_requests += proto::RequestsBetween(proto::Word0::Decode(sample_word0[slot]),
                                                  sample_gen[slot], w, gen);
      }
      sample_word0[slot] = w.Encode();
      sample_gen[slot] = gen;
    }
    sampled = true;
    p.Family("rdmalock_lockd_lock_slots", "gauge", "slots in the lock table (lock_count)");
    p.Sample(config.lock_count);
    p.Family("rdmalock_lockd_locks_held", "gauge",
             "slots with a holder now, by mode (a queue of both modes counts as exclusive)");
    p.Sample(held_x, "mode=\"exclusive\"");
    p.Sample(held_s, "mode=\"shared\"");
    p.Family("rdmalock_lockd_lock_holders", "gauge",
             "requests holding a lock now (shared holders counted one by one)");
    p.Sample(holders);
    p.Family("rdmalock_lockd_lock_waiters", "gauge", "requests queued behind a holder now");
    p.Sample(waiting);
    p.Family("rdmalock_lockd_locks_contended", "gauge", "slots with at least one waiter now");
    p.Sample(contended);
    p.Family("rdmalock_lockd_locks_frozen", "gauge",
             "slots whose counters reached the reset threshold and await a reset");
    p.Sample(frozen);
    p.Family("rdmalock_lockd_lock_requests_total", "counter",
             "lock requests (FETCH_AND_ADDs) seen queueing in the table, counted at each scrape "
             "(a slot with over 65535 requests between two scrapes is undercounted)");
    p.Sample(sample_requests);
    p.Family("rdmalock_lockd_table_scan_seconds", "gauge",
             "how long this scrape took to read the lock table");
    p.Sample(std::chrono::duration<double>(SteadyClock::now() - t0).count());
  }

  // ---- recovery thread

  // Connects to this lockd through its own NIC (the event loop must be running on another thread)
  // and checks the byte order of atomic replies with the probe word.
  Result<std::unique_ptr<VerbsMemory>> ConnectLoopback(std::chrono::milliseconds timeout) {
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
      ChannelParams p{ip,
                      config.port,
                      timeout,
                      "lockd",
                      proto::kFlagLoopback,
                      loopback_secret.a,
                      loopback_secret.b};
      p.auth_key = AuthKey();
      auto mem = VerbsMemory::Connect(p);  // checks the atomic byte order with the probe word
      if (mem.ok()) {
        spdlog::info("loopback through {}: RC atomics work, byte order checked", ip);
        return mem;
      }
      errors += "\n  " + ip + ": " + mem.status().ToString();
    }
    return Error(ErrorCode::kUnsupported,
                 "could not reach this lockd through its own RDMA device (needed to check atomic "
                 "replies and to free dead clients' locks):" +
                     (errors.empty() ? std::string(" no IPv4 address found") : errors));
  }

  void StartRecovery() {
    EngineParams p;
    p.lock_count = config.lock_count;
    p.lease = std::chrono::milliseconds(config.lease_ms);
    p.stall_factor = config.stall_factor;
    p.epoch = static_cast<uint16_t>(epoch);
    engine = std::make_unique<LockEngine>(p, nullptr);
    rec_thread = std::thread([this] { RecoveryLoop(); });
  }

  void StopRecovery() {
    {
      std::lock_guard lk(rec_mu);
      rec_stop = true;
    }
    rec_cv.notify_all();
    if (rec_thread.joinable()) rec_thread.join();
  }

  void RecoveryLoop() {
    std::vector<RecoveryJob> jobs;
    for (;;) {
      {
        std::unique_lock lk(rec_mu);
        auto wake = SteadyClock::time_point::max();
        bool ready = false;
        for (const auto& j : jobs) {
          if (j.not_before <= SteadyClock::now()) ready = true;
          wake = std::min(wake, j.not_before);
        }
        if (!ready) {
          if (wake == SteadyClock::time_point::max()) {
            rec_cv.wait(lk, [&] { return rec_stop || !rec_queue.empty(); });
          } else {
            rec_cv.wait_until(lk, wake, [&] { return rec_stop || !rec_queue.empty(); });
          }
        }
        if (rec_stop) return;
        while (!rec_queue.empty()) {
          jobs.push_back(std::move(rec_queue.front()));
          rec_queue.pop_front();
        }
      }
      if (!loopback) {  // lost: connect again (the event loop runs on its own thread)
        auto lb = ConnectLoopback(std::chrono::milliseconds(2000));
        if (lb.ok()) {
          loopback = std::move(lb).value();
        } else {
          spdlog::error("recovery cannot proceed: {}; retrying in 1 s", lb.status().ToString());
          std::unique_lock lk(rec_mu);
          rec_cv.wait_for(lk, std::chrono::seconds(1), [&] { return rec_stop; });
          continue;
        }
      }
      bool pending = false;
      for (auto& j : jobs) {
        if (j.not_before > SteadyClock::now()) continue;
        for (auto& r : j.items) {
          if (r.outcome != ReapState::Outcome::kPending) continue;
          auto done = engine->Reap(*loopback, r);
          if (!done.ok()) {
            spdlog::error("recovery of {}: {} (lockd's loopback connection failed; reconnecting)",
                          j.who, done.status().ToString());
            loopback.reset();
            break;
          }
          if (!*done) pending = true;
        }
        if (!loopback) break;
      }
      // Report and drop finished jobs.
      for (auto it = jobs.begin(); it != jobs.end();) {
        bool finished = true;
        RecoveryJob& j = *it;
        j.released = j.already_done = j.recovered = j.gave_up = 0;
        for (const auto& r : j.items) {
          switch (r.outcome) {
            case ReapState::Outcome::kPending:
              finished = false;
              break;
            case ReapState::Outcome::kReleased:
              ++j.released;
              break;
            case ReapState::Outcome::kAlreadyDone:
              ++j.already_done;
              break;
            case ReapState::Outcome::kRecovered:
              ++j.recovered;
              break;
            case ReapState::Outcome::kGaveUp:
              ++j.gave_up;
              break;
          }
        }
        if (!finished) {
          ++it;
          continue;
        }
        counters.freed_released.fetch_add(j.released, std::memory_order_relaxed);
        counters.freed_done.fetch_add(j.already_done, std::memory_order_relaxed);
        counters.freed_recovered.fetch_add(j.recovered, std::memory_order_relaxed);
        counters.freed_gave_up.fetch_add(j.gave_up, std::memory_order_relaxed);
        counters.recovery_queue.fetch_sub(1, std::memory_order_relaxed);
        spdlog::info(
            "recovered {}: {} lock(s) released for it, {} already released or recovered, {} "
            "freed by stall recovery, {} left to waiters; {:.1f} ms after it ended",
            j.who, j.released, j.already_done, j.recovered, j.gave_up, MsSince(j.ended));
        it = jobs.erase(it);
      }
      if (pending) {
        std::this_thread::sleep_for(std::max<std::chrono::nanoseconds>(
            loopback ? loopback->round_trip() : std::chrono::milliseconds(1),
            std::chrono::microseconds(100)));
      }
    }
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

uint16_t Server::port() const { return impl_->config.port; }
uint64_t Server::connected_clients() const { return impl_->connected.load(); }
void Server::SetAuthKey(std::string key) {
  std::lock_guard lock(impl_->auth_mu);
  impl_->auth_key = std::move(key);
}

void Server::SetAliveUntil(std::chrono::steady_clock::time_point t) {
  impl_->alive_until_ns.store(t.time_since_epoch().count(), std::memory_order_relaxed);
}

Result<std::unique_ptr<Server>> Server::Create(const Config& config, uint64_t epoch,
                                               bool unclean_start) {
  RDMALOCK_RETURN_IF_ERROR(Validate(config));
  auto m = std::make_unique<Impl>();
  m->config = config;
  m->epoch = epoch;
  m->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m->stop_fd < 0) return rdma::ErrnoStatus(ErrorCode::kResource, "eventfd", errno);

  // Memory first, zeroed (mmap gives zero pages) before it is registered.
  RDMALOCK_ASSIGN_OR_RETURN(m->info, Mapping::Create(proto::kInfoPageSize));
  RDMALOCK_ASSIGN_OR_RETURN(m->locks, Mapping::Create(proto::LockTableBytes(config.lock_count)));
  RDMALOCK_ASSIGN_OR_RETURN(m->sessions_mem, Mapping::Create((uint64_t{config.max_clients} + 1) *
                                                             proto::kSessionRecordSize));
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
  if (unclean_start) {
    const auto grace = std::chrono::milliseconds(config.GraceMs());
    m->grace_until = std::chrono::steady_clock::now() + grace;
    m->grace_until_wall = std::chrono::system_clock::now() + grace;
    page.grace_until_unix_ns = UnixNs(m->grace_until_wall);
    spdlog::warn(
        "the previous lockd did not stop cleanly (or stopped with clients connected): refusing "
        "clients for {} ms, until every lease it may have granted has run out",
        config.GraceMs());
  }
  if (config.cluster_mode()) {
    page.liveness_timeout_ns = config.LivenessTimeoutMs() * 1'000'000;
    m->alive_until_ns.store(0);  // not until the campaign says how long the lease holds
  }
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
    if (const int fl = fcntl(d->ctx->async_fd, F_GETFL);
        fl < 0 || fcntl(d->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
      return rdma::ErrnoStatus(ErrorCode::kIo, "making " + d->name + "'s async fd non-blocking",
                               errno);
    }
    ibv_device_attr dattr{};
    if (const int rc = ibv_query_device(d->ctx, &dattr); rc != 0) {
      return rdma::ErrnoStatus(ErrorCode::kResource, "ibv_query_device " + d->name, rc);
    }
    if (config.memory_windows && dattr.max_mw == 0) {
      return Error(ErrorCode::kUnsupported,
                   "device " + d->name +
                       " has no memory windows (max_mw 0): set memory_windows: false in "
                       "lockd.yaml (a fenced client's rkeys then stay valid until its QP is gone)");
    }
    {
      const DeviceLimits limits{d->name, static_cast<uint64_t>(std::max(dattr.max_qp, 0)),
                                static_cast<uint64_t>(std::max(dattr.max_mr, 0)),
                                static_cast<uint64_t>(std::max(dattr.max_mw, 0))};
      std::string warning;
      RDMALOCK_RETURN_IF_ERROR(CheckDeviceLimits(config, limits, &warning));
      if (!warning.empty()) spdlog::warn("{}", warning);
    }
    RDMALOCK_ASSIGN_OR_RETURN(d->pd, rdma::AllocPd(d->ctx));
    RDMALOCK_ASSIGN_OR_RETURN(d->comp_channel, rdma::CreateCompChannel(d->ctx));
    if (const int fl = fcntl(d->comp_channel->fd, F_GETFL);
        fl < 0 || fcntl(d->comp_channel->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
      return rdma::ErrnoStatus(ErrorCode::kIo,
                               "making " + d->name + "'s completion channel non-blocking", errno);
    }
    RDMALOCK_ASSIGN_OR_RETURN(
        d->cq, rdma::CreateCq(d->ctx, std::min(kCqDepth, dattr.max_cqe), d->comp_channel.get()));
    if (ibv_req_notify_cq(d->cq.get(), 0) != 0) {
      return rdma::ErrnoStatus(ErrorCode::kResource, "ibv_req_notify_cq", errno);
    }
    // The NIC enforces who may do what: info READ only; the lock table atomics and READ, never
    // WRITE (a WRITE racing a NIC atomic on one word is not atomic); the session table READ, a
    // client's own record WRITE. With memory windows (the default) the regions themselves grant
    // no remote access at all: each connection gets windows bound to its QP (see Admit).
    const int mw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
    const bool w = config.memory_windows;
    RDMALOCK_ASSIGN_OR_RETURN(d->info_mr,
                              rdma::RegisterMr(d->pd.get(), m->info->data(), m->info->size(),
                                               w ? mw : IBV_ACCESS_REMOTE_READ));
    RDMALOCK_ASSIGN_OR_RETURN(
        d->locks_mr,
        rdma::RegisterMr(
            d->pd.get(), m->locks->data(), m->locks->size(),
            w ? mw : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
    RDMALOCK_ASSIGN_OR_RETURN(
        d->sessions_mr,
        rdma::RegisterMr(
            d->pd.get(), m->sessions_mem->data(), m->sessions_mem->size(),
            w ? mw : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE));
    spdlog::info("device {}: regions registered (lock table {} bytes, rd_atomic {}, {})", d->name,
                 m->locks->size(), d->sizes.rd_atomic,
                 w ? "memory windows per connection (max_mw " + std::to_string(dattr.max_mw) + ")"
                   : "shared rkeys (memory_windows: false)");
    m->devices.push_back(std::move(d));
  }
  if (m->devices.empty()) {
    return Error(ErrorCode::kUnsupported, "no RDMA device with RC atomics found");
  }

  for (const std::string& r : config.allow_from) {
    RDMALOCK_ASSIGN_OR_RETURN(Cidr c, Cidr::Parse(r));
    m->allow_from.push_back(c);
  }
  if (!config.auth_key_file.empty()) {
    RDMALOCK_ASSIGN_OR_RETURN(m->auth_key, auth::LoadKeyFile(config.auth_key_file, true));
    spdlog::info("clients must prove the shared key in {} (HMAC-SHA256 challenge)",
                 config.auth_key_file);
  } else {
    spdlog::warn(
        "authentication is off (no auth_key_file): any host that reaches port {} can connect "
        "and take or break locks; see docs/security.md",
        config.port);
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
  RDMALOCK_RETURN_IF_ERROR(m->OpenAdminSocket());
  if (!config.metrics_address.empty()) {
    Impl* raw = m.get();
    RDMALOCK_ASSIGN_OR_RETURN(
        m->metrics, MetricsServer::Start(config.metrics_address, [raw] { return raw->Render(); }));
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
  // The tick's work (heartbeat and QP checks, the info page's clock) needs a resolution of a
  // fraction of the heartbeat timeout, no finer: each wake-up costs CPU, and lockd's CPU should
  // stay out of the way (about 0.6 ms per wake-up under TCG).
  const auto tick = std::chrono::milliseconds(std::clamp<uint64_t>(
      std::min(m.config.heartbeat_interval_ms, m.config.heartbeat_timeout_ms / 4), 5, 1000));
  auto next_tick = std::chrono::steady_clock::now() + tick;
  for (;;) {
    // cm events, stop, admin socket, then each device's async events.
    const bool admin_paused = std::chrono::steady_clock::now() < m.admin_paused_until;
    std::vector<pollfd> fds = {{m.channel->fd, POLLIN, 0},
                               {m.stop_fd, POLLIN, 0},
                               {admin_paused ? -1 : m.admin_fd, POLLIN, 0}};
    for (auto& d : m.devices) fds.push_back({d->ctx->async_fd, POLLIN, 0});
    for (auto& d : m.devices) fds.push_back({d->comp_channel->fd, POLLIN, 0});
    const size_t admin_base = fds.size();
    for (const auto& a : m.admin_conns) fds.push_back({a.fd, POLLIN, 0});
    // Rounded up: rounded down, the last millisecond before a tick was spent spinning in
    // poll(0), about 1% of a CPU at the default tick (measured under TCG: 40 ms of CPU per 5 s).
    const auto wait =
        std::chrono::ceil<std::chrono::milliseconds>(next_tick - std::chrono::steady_clock::now());
    const int rc =
        poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait.count(), 0)));
    if (rc < 0 && errno != EINTR) return rdma::ErrnoStatus(ErrorCode::kIo, "poll", errno);
    if (rc > 0 && fds[1].revents != 0) break;
    if (rc > 0 && fds[0].revents != 0) {
      // Drain every queued event.
      for (int i = 0; i < 64; ++i) {
        RDMALOCK_RETURN_IF_ERROR(m.HandleOneEvent(&device_gone));
        pollfd p{m.channel->fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
      }
    }
    if (rc > 0) {  // admin connections first: OnAdmin may add one
      std::vector<Impl::AdminConn> keep;
      for (size_t i = 0; i < m.admin_conns.size(); ++i) {
        const bool ready = admin_base + i < fds.size() && fds[admin_base + i].revents != 0;
        if (!ready || m.OnAdminReadable(m.admin_conns[i]))
          keep.push_back(std::move(m.admin_conns[i]));
      }
      m.admin_conns.swap(keep);
    }
    if (rc > 0 && m.admin_fd >= 0 && fds[2].revents != 0) m.OnAdmin();
    for (size_t i = 0; rc > 0 && i < m.devices.size(); ++i) {
      if (fds[3 + i].revents != 0) m.OnAsyncEvent(*m.devices[i]);
      if (fds[3 + m.devices.size() + i].revents != 0) m.OnCompletions(*m.devices[i]);
    }
    if (device_gone) break;
    if (std::chrono::steady_clock::now() >= next_tick) {
      m.ExpireAdmin(std::chrono::steady_clock::now());
      m.Tick();
      next_tick = std::chrono::steady_clock::now() + tick;
    }
  }
  // Shutdown: stop taking connections, fence every QP (to ERR), disconnect, then destroy in order.
  // Every client's QP to the error state first: from then on no client's RDMA reaches the
  // regions (in cluster mode this is the fence a lost primary must finish before its deadline).
  for (auto& [id, c] : m.conns) c->id.FenceQp();
  m.fenced_at = std::chrono::steady_clock::now();
  spdlog::info("shutting down: disconnecting {} client(s)", m.connected.load());
  // Clients connected now, or fenced ones whose leases may still run (a heartbeat fence frees
  // their locks one lease later): either way the next start must wait out the restart grace.
  m.stopped_with_clients =
      m.connected.load() > 0 || std::chrono::steady_clock::now() < m.fenced_leases_until;
  m.StopRecovery();
  m.listener.Reset();
  m.loopback.reset();
  for (auto& [id, c] : m.conns) (void)rdma_disconnect(id);
  for (auto& d : m.devices) {  // drain: reap the handshakes' flushed work requests
    ibv_wc wc[16];
    while (ibv_poll_cq(d->cq.get(), 16, wc) > 0) {
    }
  }
  m.conns.clear();
  m.sessions.clear();
  m.connected.store(0);
  return device_gone ? Error(ErrorCode::kConnection, "RDMA device removed") : Status::Ok();
}

bool Server::stopped_with_clients() const { return impl_->stopped_with_clients; }
std::chrono::steady_clock::time_point Server::fenced_at() const { return impl_->fenced_at; }

Status Server::ProbeLoopback(std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  RDMALOCK_ASSIGN_OR_RETURN(m.loopback, m.ConnectLoopback(timeout));
  m.StartRecovery();  // the recovery thread owns the loopback channel from here on
  return Status::Ok();
}

namespace {

// Writes `text` to `path` so that a crash leaves the old contents or the new, never a mix or
// nothing: a temporary file, fsync'd, renamed over `path`, then the directory fsync'd (without
// it the rename itself may be lost in a crash, and an epoch would be handed out twice).
Status WriteFileAtomically(const std::string& dir, const std::string& path,
                           const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "open " + tmp, errno);
  const bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return rdma::ErrnoStatus(ErrorCode::kIo, "write " + tmp, err);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return rdma::ErrnoStatus(ErrorCode::kIo, "rename " + tmp, errno);
  }
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "open " + dir, errno);
  const bool synced = fsync(dfd) == 0;
  const int derr = errno;
  close(dfd);
  if (!synced) return rdma::ErrnoStatus(ErrorCode::kIo, "fsync " + dir, derr);
  return Status::Ok();
}

// The whole file, or nullopt when it does not exist. Any other failure is an error: an epoch
// file that exists but cannot be read must not be taken for a first start.
Result<std::optional<std::string>> ReadSmallFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return rdma::ErrnoStatus(ErrorCode::kIo, "open " + path, errno);
  }
  std::string text;
  char buf[256];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      const int err = errno;
      close(fd);
      return rdma::ErrnoStatus(ErrorCode::kIo, "read " + path, err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > 4096) {
      close(fd);
      return Error(ErrorCode::kIo, path + " is larger than an epoch file can be");
    }
  }
  close(fd);
  return std::optional<std::string>(std::move(text));
}

}  // namespace

Result<bool> MarkRunning(const std::string& state_dir) {
  if (state_dir.empty()) return true;  // nothing tells us how the last run ended: assume the worst
  const std::string path = state_dir + "/running";
  std::error_code ec;
  const bool unclean = std::filesystem::exists(path, ec);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "create " + path, errno);
  const std::string pid = std::to_string(getpid()) + "\n";
  const bool ok =
      write(fd, pid.data(), pid.size()) == static_cast<ssize_t>(pid.size()) && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return rdma::ErrnoStatus(ErrorCode::kIo, "write " + path, err);
  return unclean;
}

void MarkStoppedCleanly(const std::string& state_dir) {
  if (!state_dir.empty()) unlink((state_dir + "/running").c_str());
}

Result<uint64_t> BumpEpoch(const std::string& state_dir) {
  if (state_dir.empty()) {
    return Error(ErrorCode::kConfig, "state_dir is empty: nowhere to keep the epoch");
  }
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    return Error(ErrorCode::kIo, "cannot create state_dir " + state_dir + ": " + ec.message());
  }
  const std::string path = state_dir + "/epoch";
  uint64_t epoch = 0;
  RDMALOCK_ASSIGN_OR_RETURN(const std::optional<std::string> old, ReadSmallFile(path));
  if (old) {
    std::string text = *old;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    try {
      size_t used = 0;
      epoch = std::stoull(text, &used);
      if (used != text.size()) throw std::invalid_argument(text);
    } catch (const std::exception&) {
      return Error(ErrorCode::kIo, path + " does not hold an epoch number ('" + text +
                                       "'); lockd will not guess one (tokens must only grow)");
    }
  }
  ++epoch;
  if (epoch > 0xffff) {
    return Error(ErrorCode::kIo, path +
                                     ": epoch would exceed 65535, the width of the token's "
                                     "epoch field");
  }
  RDMALOCK_RETURN_IF_ERROR(WriteFileAtomically(state_dir, path, std::to_string(epoch) + "\n"));
  return epoch;
}

}  // namespace rdmalock::lockd
