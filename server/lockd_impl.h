// Server::Impl, declared once and implemented by concern across small files (as eRPC's rpc.h
// and rpc_impl/): lockd.cc (Create, Run, Stop, teardown, the loopback), handshake.cc (accept,
// Hello, refusal, the Welcome and its windows), lockd_sessions.cc (ending sessions, liveness
// ticks, half-open drops, async events, admin requests). The decisions themselves live in parts
// of their own, unit-tested without verbs: Admission, SessionTable, ParseAdminCommand,
// RenderMetrics, state_dir; the recovery worker and the admin socket's I/O too.
//
// Threading (who may touch what):
//   - the event loop thread (the one that calls Run) owns every rdma_cm and verbs object of a
//     connection, the session table, admission and the admin socket. Its entry points check that
//     they run on it (LoopThread::Check, a cheap run-time check that logs and refuses).
//   - the recovery thread owns the loopback connection (Recovery; its only entry is Enqueue).
//   - the metrics server's HTTP thread reads atomics and the lock table only (RenderMetrics).
//   - any thread: RequestStop (an eventfd), SetAuthKey and SetAliveUntil (mu_, an atomic),
//     connected_clients (an atomic).
// Lock order: mu_ is a leaf (nothing else is taken while it is held).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/auth/auth.h"
#include "common/rdma/verbs.h"
#include "common/sync/mutex.h"
#include "rdmalock/proto/handshake.h"
#include "server/acl.h"
#include "server/admin.h"
#include "server/admission.h"
#include "server/budgets.h"
#include "server/config.h"
#include "server/lockd.h"
#include "server/metrics.h"
#include "server/metrics_render.h"
#include "server/recovery.h"
#include "server/regions.h"
#include "server/session_table.h"

namespace rdmalock::lockd {

// Which thread is the event loop. Bound when Run starts; before that (Create, on the thread that
// builds the server) every thread passes.
class LoopThread {
 public:
  void Bind() { owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  bool OnLoop() const {
    const std::thread::id owner = owner_.load(std::memory_order_relaxed);
    return owner == std::thread::id() || owner == std::this_thread::get_id();
  }
  // False (and an error logged) when called off the event loop: the caller refuses.
  bool Check(const char* what) const;

 private:
  std::atomic<std::thread::id> owner_{};
};

// A session's record registered on its own, per device (at its first admission there): the
// record window is bound to this MR, not to the whole table's. rdma_rxe checks a window's
// accesses against the range of the MR it is bound to, not against the window's own range, so a
// window over part of a larger MR would not confine the client to its record. Held by the
// session's connections (destroyed after their windows) and by the server until the session ends.
struct RecordMrs {
  std::vector<std::pair<const Device*, rdma::MemoryRegion>> by_device;
};

// One rdma_cm connection of a session. Declaration order is destruction order reversed: the
// memory windows go first (a window bound to a QP holds a reference on it: rdma_rxe's destroy of
// the QP waits, for about a minute, until the windows are gone), then the QP, then the control
// buffer's MR. Owned by the event loop.
struct Conn {
  uint64_t serial = 0;  // names it in work request ids (a CQE may outlive the Conn)
  std::array<uint8_t, 2 * proto::kControlMessageMax> control{};  // [0,n) receive, [n,2n) send
  rdma::MemoryRegion control_mr;
  std::shared_ptr<Session> session;
  std::shared_ptr<RecordMrs> record_mrs;  // destroyed after the windows bound to them
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
  // The protocol version of the client's connect request: lockd answers in it (5 to 8; the
  // versions differ in the record entries a client writes and where it probes, proto/handshake.h).
  uint16_t version = proto::kProtocolVersion;
  std::chrono::steady_clock::time_point accepted_at = std::chrono::steady_clock::now();
  // A new session's handshake: the peer's address (no port), counted in
  // Impl::new_handshakes_from until its handshake is over ("" : a join, or lockd's loopback, not
  // counted).
  std::string counted_from;
  // A join's handshake: the peer's address, counted in Impl::join_handshakes_from and in its
  // session's joins_in_handshake until its handshake is over ("" : not a join).
  std::string join_counted_from;
  // Counted in Impl::handshakes (and the counts by address and session) until the handshake is
  // over: its Welcome completed, or the connection is gone. Not at the Welcome's post: a peer that
  // posts no receive leaves it in RNR retry, without end, and its flushed work requests must still
  // fit the device CQ that kMaxHandshakes sizes (found by review, 2026-12-06).
  bool in_handshake = true;
};

// Work request ids on lockd's QPs: the connection's serial and what the request was.
enum class WrKind : uint64_t { kHelloRecv = 0, kWelcome = 1, kRefusal = 2, kBind = 3 };
inline uint64_t WrId(uint64_t serial, WrKind k) { return serial << 2 | static_cast<uint64_t>(k); }

struct Server::Impl {
  using SteadyClock = std::chrono::steady_clock;

  Impl(const Config& c, uint64_t e, std::unique_ptr<Regions> r, std::vector<Cidr> allow_from,
       SteadyClock::time_point grace_until, std::chrono::system_clock::time_point grace_wall);
  ~Impl();

  // ---- constant after construction (any thread may read)
  const Config config;
  const uint64_t epoch;
  const SteadyClock::time_point grace_until;
  const std::chrono::system_clock::time_point grace_until_wall;
  const std::chrono::system_clock::time_point started_wall = std::chrono::system_clock::now();
  // Drawn from libsodium's CSPRNG at start: what lockd's own loopback connection presents.
  const LoopbackSecret loopback_secret{auth::RandomU64() | 1, auth::RandomU64()};
  // The memory and the devices (their objects the event loop's from Run on).
  std::unique_ptr<Regions> regions;
  rdma::Fd stop_fd;  // written by RequestStop (any thread), read by the event loop

  // ---- atomics (any thread)
  Counters counters;  // for the metrics endpoint
  std::atomic<uint64_t> connected{0};
  // Until when (steady-clock ns) the event loop advances the info page's alive ticks: for ever
  // with one lockd, in cluster mode up to the fence point the campaign sets (SetAliveUntil).
  std::atomic<int64_t> alive_until_ns{INT64_MAX};

  // ---- guarded by mu_
  mutable Mutex mu_;
  // The shared key clients prove ("" : clients are not authenticated). Read by the event loop at
  // each handshake; SetAuthKey (a reload, on the main thread) replaces it.
  std::string auth_key GUARDED_BY(mu_);
  std::string AuthKey() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return auth_key;
  }

  // ---- owned by the event loop (declaration order is destruction order reversed: connections
  // go before the listener and the channel; see ~Impl for the one teardown order)
  LoopThread loop;
  rdma::EventChannel channel;
  rdma::CmId listener;
  Admission admission;
  SessionTable sessions;
  // Per session id, its record's own registrations (see RecordMrs); shared with the session's
  // connections, erased when the session ends.
  std::unordered_map<uint64_t, std::shared_ptr<RecordMrs>> record_mrs;
  std::unordered_map<rdma_cm_id*, std::unique_ptr<Conn>> conns;
  std::unordered_map<uint64_t, rdma_cm_id*> conn_by_serial;
  std::vector<std::unique_ptr<Conn>> graveyard;  // destroyed after the current event's ack
  uint64_t next_conn_serial = 1;
  size_t handshakes = 0;  // conns whose handshake is in progress (Conn::in_handshake)
  // Of those, new sessions' by peer address (Conn::counted_from; kMaxNewHandshakesPerAddress).
  std::unordered_map<std::string, size_t> new_handshakes_from;
  // ... and joins' by peer address (Conn::join_counted_from; kMaxJoinHandshakesPerAddress).
  std::unordered_map<std::string, size_t> join_handshakes_from;
  uint64_t accepted_total = 0, rejected_total = 0, recoveries_total = 0;
  // The latest time a lease of a session fenced without proof of death (heartbeat, QP error,
  // operator) may still run: a clean stop before it must leave the restart grace to the next
  // start (issue 16, finding 5).
  SteadyClock::time_point fenced_leases_until{};
  uint64_t alive_ticks = 0;
  SteadyClock::time_point next_qp_check;
  std::unique_ptr<AdminSocket> admin;  // null without admin_socket
  // Set by Run as it stops; read after it returned.
  bool stopped_with_clients = false;
  SteadyClock::time_point fenced_at{};

  // ---- the recovery thread's (its only entry from the event loop is Enqueue)
  Recovery recovery;

  // ---- the metrics server's threads' (declared last, so destroyed first: it reads the above)
  LockTableSampler sampler;
  std::unique_ptr<MetricsServer> metrics;

  // lockd.cc
  Status Listen();
  void PublishCounters();
  Result<std::unique_ptr<VerbsMemory>> ConnectLoopback(std::chrono::milliseconds timeout);
  std::string Render();

  // handshake.cc (event loop)
  Status HandleOneEvent(bool* device_gone);
  rdma::CmId OnConnectRequest(rdma_cm_event* ev);
  void OnEstablished(rdma_cm_id* id);
  void OnCompletions(Device& d);
  void PollCompletions(Device& d);
  void OnCompletion(const ibv_wc& wc);
  void OnHello(Conn& c, std::span<const uint8_t> msg, uint32_t imm);
  void Refuse(Conn& c, proto::RejectReason reason, const std::string& detail);
  Status PostControl(Conn& c, std::span<const uint8_t> msg, proto::ControlKind kind, WrKind wr_kind,
                     std::span<ibv_send_wr> binds);
  void Admit(Conn& c, const proto::Hello& hello);
  void Reject(rdma_cm_id* id, proto::RejectReason reason, const std::string& peer,
              const std::string& detail, uint32_t retry_after_ms = 0, bool log = true);
  void CountRefusal(proto::RejectReason reason);

  // lockd_sessions.cc (event loop)
  // `c`'s handshake is over (its Welcome completed, or the connection goes): it no longer counts
  // as one in progress (handshakes, new_handshakes_from, join_handshakes_from and its session's
  // joins_in_handshake). Idempotent (Conn::in_handshake).
  void HandshakeOver(Conn& c);
  void DropHandshake(Conn& c, const std::string& why);
  void RemoveConn(rdma_cm_id* id);
  void EndSession(std::shared_ptr<Session> s, EndReason reason, const std::string& why, bool now);
  void DropConn(rdma_cm_id* id, EndReason reason, const std::string& why, bool now);
  void DropHalfOpen(SteadyClock::time_point now);
  void Tick();
  void OnAsyncEvent(Device& d);
  std::string AdminCommand(const std::string& line, const std::string& asker);
};

}  // namespace rdmalock::lockd
