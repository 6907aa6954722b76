// The handshake, on the event loop: a connection request is decided by Admission, accepted with
// a challenge (no rkey), its Hello verified, and then its memory windows bound and the Welcome
// (with the rkeys) sent, or a refusal in its place. See lockd_impl.h for the threads.
#include <arpa/inet.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "rdmalock/proto/layout.h"
#include "server/lockd_impl.h"
#include "server/words.h"

namespace rdmalock::lockd {

// The Welcome names one region per window, in this order: info, lock table, session table, the
// client's record.
static_assert(kWindowsPerConnection == 4, "AcceptReply carries four regions");

void Server::Impl::Reject(rdma_cm_id* id, proto::RejectReason reason, const std::string& peer,
                          const std::string& detail, uint32_t retry_after_ms, bool log) {
  proto::RejectReply r;
  r.reason = reason;
  r.detail = detail;
  r.retry_after_ms = retry_after_ms;
  const auto bytes = r.Encode();
  // Counted and logged before the reject goes out: a peer that has its answer finds the refusal
  // in the metrics and the log already (the RDMA tests read both right after).
  CountRefusal(reason);
  if (log) admission.LogRefusal(peer, reason, detail, retry_after_ms, SteadyClock::now());
  // A reject that fails (the peer's side went first) is logged as the refusal is: at most once
  // a second per address, and not at all for a refusal kept quiet (a rate-limited flood).
  if (Status st = rdma::Reject(id, bytes);
      !st.ok() && log && admission.ShouldLogFailure(peer, "reject failed", SteadyClock::now())) {
    spdlog::warn("rejecting {}: {}", peer, st.ToString());
  }
}

static_assert(proto::kRejectReasonCount <= Counters::kRejectReasons);
// Counts a refusal (the handshake's or rdma_cm's) without logging it.
void Server::Impl::CountRefusal(proto::RejectReason reason) {
  ++rejected_total;
  counters.rejected[std::min<size_t>(static_cast<size_t>(reason), Counters::kRejectReasons - 1)]
      .fetch_add(1, std::memory_order_relaxed);
  PublishCounters();
}

// The request's id is owned from here on: a refused one is returned, to be destroyed (with its
// QP, if one was made) after the event is acknowledged; an accepted one moves into its Conn.
rdma::CmId Server::Impl::OnConnectRequest(rdma_cm_event* ev) {
  rdma_cm_id* id = ev->id;
  rdma::CmId owned(id);
  const std::string peer = rdma::AddressToString(rdma::PeerAddr(id));
  const auto* data = static_cast<const uint8_t*>(ev->param.conn.private_data);
  const std::span<const uint8_t> bytes(data, data ? ev->param.conn.private_data_len : 0);
  proto::ConnectRequest req;
  ConnectFacts f;
  f.peer = peer;
  f.decoded = proto::ConnectRequest::Decode(bytes, &req, &f.decoded_why);
  f.flagged_loopback =
      f.decoded == proto::RejectReason::kNone && (req.flags & proto::kFlagLoopback) != 0;
  f.loopback_proven =
      f.flagged_loopback && LoopbackProven(loopback_secret, req.join_session, req.join_key,
                                           rdma::PeerAddr(id), rdma::LocalAddr(id));
  f.address_allowed = admission.AddressAllowed(rdma::PeerAddr(id));
  f.join = (req.flags & proto::kFlagJoin) != 0;
  f.join_session = req.join_session;
  std::shared_ptr<Session> joined = f.join ? sessions.Find(req.join_session) : nullptr;
  f.join_valid = joined != nullptr && joined->join_key == req.join_key &&
                 (req.flags & proto::kFlagLoopback) == 0;
  f.join_session_conns = joined ? joined->conns.size() : 0;
  f.records_free = sessions.has_free_record();
  f.client_records_free = sessions.has_free_client_record();
  f.connected = connected.load();
  f.handshakes = handshakes;
  const std::string address = peer.substr(0, peer.rfind(':'));  // as the rate limit keys it
  if (auto it = new_handshakes_from.find(address); it != new_handshakes_from.end()) {
    f.new_handshakes_from_address = it->second;
  }
  if (auto it = join_handshakes_from.find(address); it != join_handshakes_from.end()) {
    f.join_handshakes_from_address = it->second;
  }
  f.join_handshakes_of_session = joined ? joined->joins_in_handshake : 0;
  const auto now = SteadyClock::now();
  const Verdict v = admission.Decide(f, now);
  if (!v.admitted()) {
    Reject(id, v.reason, peer, v.detail, v.retry_after_ms, v.log);
    return owned;
  }
  const bool is_loopback = v.loopback;
  const bool join = f.join;
  Device* dev = regions->DeviceFor(id->verbs);
  if (dev == nullptr) {
    Reject(id, proto::RejectReason::kInternal, peer, "request arrived on an unknown device");
    return owned;
  }
  // Send queue: the memory-window binds and the Welcome (or one refusal). Receive queue: the
  // Hello. See server/budgets.h.
  rdma::QpSizes qp_sizes{kHandshakeSendDepth, kHandshakeRecvDepth, 1};
  if (Status st = rdma::CreateRcQp(id, dev->pd.get(), dev->cq.get(), &qp_sizes); !st.ok()) {
    Reject(id, proto::RejectReason::kNoResources, peer, "cannot create a QP: " + st.message());
    spdlog::error("connection from {}: {}", peer, st.ToString());
    return owned;
  }
  auto c = std::make_unique<Conn>();
  c->serial = next_conn_serial++;
  c->version = req.version;
  c->device = dev;
  std::memcpy(c->request.data(), bytes.data(), c->request.size());
  c->nonce = auth::NewNonce();
  auto mr =
      rdma::RegisterMr(dev->pd.get(), c->control.data(), c->control.size(), IBV_ACCESS_LOCAL_WRITE);
  Status posted = mr.status();
  const bool registered = mr.ok();
  if (registered) {
    c->control_mr = std::move(mr).value();
    posted = rdma::PostRecv(id->qp, WrId(c->serial, WrKind::kHelloRecv), c->control.data(),
                            static_cast<uint32_t>(proto::kControlMessageMax), c->control_mr->lkey);
  }
  if (!posted.ok()) {
    // Out of registrations is the device's limit (no_resources, as for a QP or a window: a
    // join refused so fails only its thread); a receive that cannot be posted is ours.
    Reject(id, registered ? proto::RejectReason::kInternal : proto::RejectReason::kNoResources,
           peer, "cannot set up the handshake");
    spdlog::error("connection from {}: {}", peer, posted.ToString());
    c->control_mr.reset();
    return owned;
  }
  std::shared_ptr<Session> sess = joined;
  bool fresh = false;
  if (!join) {
    fresh = true;
    sess = sessions.Allocate(peer, req.client_name, req.pid, is_loopback,
                             std::chrono::system_clock::now(), now);
  }

  // The accept carries the challenge only: no rkey leaves lockd before the Hello is verified.
  proto::Challenge challenge;
  c->auth_key = AuthKey();
  challenge.flags = c->auth_key.empty() ? 0 : proto::kChallengeAuthRequired;
  challenge.nonce = c->nonce;
  challenge.version = c->version;
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
  if (Status st = rdma::Accept(id, &param); !st.ok()) {
    // The peer's side may have gone first (a connect abandoned at once): throttled per address.
    if (admission.ShouldLogFailure(peer, "accept failed", SteadyClock::now())) {
      spdlog::error("accepting {}: {}", peer, st.ToString());
    }
    if (fresh) sessions.Release(*sess);
    c->control_mr.reset();
    return owned;
  }
  if (fresh) sessions.Insert(sess);
  c->id = std::move(owned);
  c->session = sess;
  auto& mrs = record_mrs[sess->session_id];
  if (!mrs) mrs = std::make_shared<RecordMrs>();
  c->record_mrs = mrs;
  if (!join && !is_loopback) {
    c->counted_from = address;
    ++new_handshakes_from[address];
  }
  if (join && !is_loopback) {
    c->join_counted_from = address;
    ++join_handshakes_from[address];
    ++sess->joins_in_handshake;
  }
  sess->conns.insert(id);
  conn_by_serial.emplace(c->serial, id);
  conns.emplace(id, std::move(c));
  ++handshakes;
  spdlog::debug("accepted {} ({} session {}, client '{}', pid {}); awaiting its hello", peer,
                join ? "joins" : "new", sess->session_id, sess->name, sess->pid);
  return rdma::CmId();
}

void Server::Impl::OnEstablished(rdma_cm_id* id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  it->second->established = true;
}

// ---- the handshake's messages (completions on a device's CQ)

void Server::Impl::OnCompletions(Device& d) {
  if (!loop.Check("OnCompletions")) return;
  // Re-armed before polling, so that a completion arriving after the last poll still wakes us.
  Status rearmed;
  if (!rdma::TakeCqEvent(d.comp_channel.get(), d.cq.get(), &rearmed)) return;
  if (!rearmed.ok()) spdlog::error("device {}: {}", d.name, rearmed.ToString());
  PollCompletions(d);
}

void Server::Impl::PollCompletions(Device& d) {
  ibv_wc wc[kPollBatch];
  for (;;) {
    const int n = rdma::PollCq(d.cq.get(), wc);
    if (n <= 0) break;
    for (int i = 0; i < n; ++i) OnCompletion(wc[i]);
  }
  graveyard.clear();
}

void Server::Impl::OnCompletion(const ibv_wc& wc) {
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
      // Once a second per address and kind: a peer failing in a loop cannot flood the log.
      if (admission.ShouldLogFailure(c.session->peer, what, std::chrono::steady_clock::now())) {
        spdlog::warn("connection from {}: {} failed ({})", c.session->peer, what,
                     rdma::WcStatusName(wc.status));
      }
    }
    DropHandshake(c, std::string("handshake failed (") + rdma::WcStatusName(wc.status) + ")");
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
      HandshakeOver(c);  // delivered: nothing of the handshake is outstanding on the QP
      break;
    case WrKind::kBind:
      break;
  }
}

void Server::Impl::OnHello(Conn& c, std::span<const uint8_t> msg, uint32_t imm) {
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
void Server::Impl::Refuse(Conn& c, proto::RejectReason reason, const std::string& detail) {
  c.refused = true;
  CountRefusal(reason);
  admission.LogRefusal(c.session->peer, reason, detail, 0, SteadyClock::now());
  proto::RejectReply r;
  r.reason = reason;
  r.detail = detail;
  if (!PostControl(c, r.Encode(), proto::ControlKind::kRefusal, WrKind::kRefusal, {}).ok()) {
    DropHandshake(c, "refused");
  }
}

// Posts `binds` (memory-window binds, unsignalled) and then `msg` as a signalled SEND with
// immediate data `kind`, in one chain: the binds execute before the SEND goes out.
Status Server::Impl::PostControl(Conn& c, std::span<const uint8_t> msg, proto::ControlKind kind,
                                 WrKind wr_kind, std::span<ibv_send_wr> binds) {
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
  Status st = rdma::PostSend(c.id->qp, binds.empty() ? &wr : &binds[0]);
  if (!st.ok()) {
    spdlog::warn("connection from {}: posting the handshake failed: {}", c.session->peer,
                 st.ToString());
  }
  return st;
}

// The Hello verified: bind this connection's memory windows and send the rkeys.
void Server::Impl::Admit(Conn& c, const proto::Hello& hello) {
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
  Window want[kWindowsPerConnection] = {
      {dev.info_mr.get(), regions->info(), proto::kInfoPageSize, IBV_ACCESS_REMOTE_READ},
      {dev.locks_mr.get(), regions->locks(), proto::LockTableBytes(config.lock_count),
       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC},
      {dev.sessions_mr.get(), regions->sessions(), regions->sessions_size(),
       IBV_ACCESS_REMOTE_READ},
      // The client's own record, from its heartbeat on: the header before it is lockd's view
      // of the session (peer, pid, name, session id), which operators see and trust.
      // Atomics too, for its byte-order probe word (SessionRecord::kProbe).
      {dev.sessions_mr.get(), regions->sessions() + record_off + kWritable,
       proto::kSessionRecordSize - kWritable,
       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC},
  };
  uint32_t rkeys[kWindowsPerConnection];
  ibv_send_wr binds[kWindowsPerConnection]{};
  size_t nbinds = 0;
  if (config.memory_windows) {
    ibv_mr* record_mr = nullptr;
    for (auto& [d, mr] : c.record_mrs->by_device) {
      if (d == &dev) record_mr = mr.get();
    }
    if (record_mr == nullptr) {
      // The registration itself covers only what the client may write: rdma_rxe checks an
      // access against the window's MR, not the window's own bounds (measured: a WRITE over
      // the header through a window bound only from kClientWritable on landed), a real NIC
      // against both.
      auto mr = rdma::RegisterMr(dev.pd.get(), regions->sessions() + record_off + kWritable,
                                 proto::kSessionRecordSize - kWritable,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
      if (!mr.ok()) {
        spdlog::error("connection from {}: {}", s.peer, mr.status().ToString());
        Refuse(c, proto::RejectReason::kNoResources,
               "cannot register the session record: " + mr.status().message());
        return;
      }
      record_mr = mr.value().get();
      c.record_mrs->by_device.emplace_back(&dev, std::move(mr).value());
    }
    want[3].mr = record_mr;
    for (size_t i = 0; i < kWindowsPerConnection; ++i) {
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
      b.bind_mw.rkey = rdma::NextRkey(mw.value()->rkey);
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
  reply.version = c.version;
  reply.epoch = epoch;
  reply.session_id = s.session_id;
  reply.lease_ns = config.lease_ms * 1'000'000;
  reply.lock_count = config.lock_count;
  reply.stall_factor = config.stall_factor;
  reply.session_record_size = proto::kSessionRecordSize;
  reply.info = {reinterpret_cast<uint64_t>(regions->info()), proto::kInfoPageSize, rkeys[0]};
  reply.locks = {reinterpret_cast<uint64_t>(regions->locks()),
                 proto::LockTableBytes(config.lock_count), rkeys[1]};
  reply.sessions = {reinterpret_cast<uint64_t>(regions->sessions()),
                    regions->sessions_size(),  // whole pages; records past the last are zero
                    rkeys[2]};
  reply.record = {reinterpret_cast<uint64_t>(regions->sessions() + record_off +
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
  c.admitted = true;  // the handshake is over when the Welcome completes (OnCompletion)
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

Status Server::Impl::HandleOneEvent(bool* device_gone) {
  if (!loop.Check("HandleOneEvent")) return Error(ErrorCode::kInternal, "off the event loop");
  RDMALOCK_ASSIGN_OR_RETURN(rdma::CmEvent ev, rdma::TryGetEvent(channel.get()));
  if (!ev) return Status::Ok();  // none queued
  rdma::CmId refused;            // a connect request's id that was not accepted
  switch (ev->event) {
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      refused = OnConnectRequest(ev.get());
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
      DropConn(ev->id, EndReason::kConnectFailed, rdma::EventName(ev->event), false);
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      spdlog::critical("RDMA device removed; shutting down");
      *device_gone = true;
      break;
    default:
      spdlog::debug("rdma_cm event {} ignored", rdma::EventName(ev->event));
      break;
  }
  ev.reset();  // acknowledge before destroying any id it refers to
  graveyard.clear();
  refused.Reset();
  return Status::Ok();
}

}  // namespace rdmalock::lockd
