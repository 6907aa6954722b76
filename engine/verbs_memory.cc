#include "engine/verbs_memory.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "common/auth/auth.h"
#include "common/rdma/verbs.h"
#include "engine/fork_guard.h"
#include "rdmalock/proto/layout.h"

namespace rdmalock {

namespace {
// The budgets (engine/budgets.h): work requests per doorbell, unsignalled posts, the post ring.
using budget::kOpScratch;
using budget::kPostRing;
constexpr size_t kMaxPosted = budget::kMaxPostedUnsignalled;
constexpr size_t kBulkBytes = 64 * 1024;  // ReadBytes bounce buffer, and an Execute's block READ
static_assert(kBulkBytes >= budget::kMaxBlockRead, "a block READ must fit the bounce buffer");
// A backstop: RC retries (ACK timeout 67 ms, 7 retries) end a stuck operation in about half a
// second, and lockd fences a session whose heartbeat stops for heartbeat_timeout_ms. Past this
// the connection is treated as lost (the session ends, its locks are reported lost), so that a
// client of a failed-over shard moves on to the new primary instead of waiting here.
constexpr auto kCompletionTimeout = std::chrono::seconds(5);
}  // namespace

struct VerbsMemory::Impl {
  // Destruction order matters: the QP first (~Impl), then the MR before the connection's PD, the
  // buffer after the MR.
  std::unique_ptr<rdma::ActiveConnection> conn;
  std::vector<uint8_t> buffer;  // ops (kMaxBatch x kOpScratch), post ring, then kBulkBytes
  rdma::MemoryRegion mr;
  proto::RegionDesc regions[3];
  proto::RegionDesc record;  // this session's record: WRITEs and atomics to kSessions use its rkey

  uint32_t Rkey(RegionId region, bool write) const {
    if (write && region == RegionId::kSessions && record.rkey != 0) return record.rkey;
    return regions[static_cast<int>(region)].rkey;
  }
  bool swap_atomics = false;
  std::atomic<bool> broken{false};
  uint64_t next_wr_id = 1;
  size_t posted = 0;     // unsignalled WRs outstanding since the last signalled completion
  size_t ring_next = 0;  // next post-ring buffer
  ibv_send_wr wrs[kMaxBatch]{};
  ibv_sge sges[kMaxBatch]{};

  ~Impl() {
    if (!conn || !conn->id) return;
    // Nothing executes once we start tearing down (a failure is reported; the QP goes below).
    (void)conn->id.FenceQp();
    // The QP goes now, before the members below it are destroyed: the buffer's MR and the buffer
    // its work requests name (a READ or atomic still in flight after a completion timeout); a
    // NIC may write for a WR until its QP is destroyed (architecture.md: a QP before its CQ, MR
    // and PD; found by review, 2026-12-06). The disconnect first, as ~ActiveConnection's: lockd
    // sees the connection end at once.
    conn->id.Disconnect();
    conn->id.Reset();
  }

  // The work requests' constant parts, once the buffer is registered: each WR's one SGE and the
  // region's lkey. The lock path then writes only the op's own fields (issue 19).
  void Prepare() {
    for (size_t i = 0; i < kMaxBatch; ++i) {
      wrs[i] = ibv_send_wr{};
      sges[i] = ibv_sge{};
      sges[i].lkey = mr->lkey;
      wrs[i].sg_list = &sges[i];
      wrs[i].num_sge = 1;
    }
  }

  uint8_t* op_buf(size_t i) { return buffer.data() + i * kOpScratch; }
  uint8_t* ring_buf(size_t i) { return buffer.data() + (kMaxBatch + i) * kOpScratch; }
  uint8_t* start_buf(size_t i) { return buffer.data() + (kMaxBatch + kPostRing + i) * kOpScratch; }
  uint8_t* bulk_buf() { return buffer.data() + (2 * kMaxBatch + kPostRing) * kOpScratch; }

  // The started batch (VerbsMemory::Start): its ops, and the wr_id of its signalled last WR.
  std::span<RemoteOp> started_ops;
  uint64_t started_want = 0;
  bool started_done = false;
  uint64_t last_unsignalled = 0;  // wr_id of the latest unsignalled WRITE posted

  // Fills wrs[0..n) and sges[0..n) for `ops`, with local buffers from `scratch(i)`; a READ
  // `into` a caller's buffer (at most one) lands in `block` (null: none allowed in this batch).
  template <typename Scratch>
  Status Build(std::span<RemoteOp> ops, Scratch scratch, uint8_t* block) {
    if (ops.size() > kMaxBatch) {
      return Error(ErrorCode::kInvalidArgument, "batch of " + std::to_string(ops.size()) +
                                                    " operations exceeds " +
                                                    std::to_string(kMaxBatch));
    }
    bool block_used = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      const RemoteOp& op = ops[i];
      const proto::RegionDesc& r = regions[static_cast<int>(op.region)];
      if (op.into != nullptr) {
        if (op.kind != RemoteOp::Kind::kRead || block == nullptr || block_used ||
            op.length % 8 != 0 || op.length > budget::kMaxBlockRead) {
          return Error(ErrorCode::kInvalidArgument,
                       "a READ into a caller's buffer must be the batch's only one, executed, of "
                       "whole words and at most " +
                           std::to_string(budget::kMaxBlockRead) + " bytes");
        }
        block_used = true;
      }
      if (op.offset + op.length > r.length || (op.into == nullptr && op.length > kOpScratch)) {
        return Error(ErrorCode::kInvalidArgument, "remote offset out of range");
      }
      // wrs[i] and sges[i] were prepared once (Prepare): only what varies by op is written
      // here; every field the op's opcode uses is among them (wr_id, next and the signalled
      // flag are Post's).
      ibv_send_wr& wr = wrs[i];
      ibv_sge& sge = sges[i];
      uint8_t* buf = op.into != nullptr ? block : scratch(i);
      sge.addr = reinterpret_cast<uint64_t>(buf);
      sge.length =
          op.kind == RemoteOp::Kind::kRead || op.kind == RemoteOp::Kind::kWrite ? op.length : 8;
      wr.send_flags = 0;
      const uint64_t raddr = r.addr + op.offset;
      switch (op.kind) {
        case RemoteOp::Kind::kFetchAdd:
          wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
          wr.wr.atomic = {raddr, op.operand, 0, Rkey(op.region, true)};
          break;
        case RemoteOp::Kind::kCompareSwap:
          wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
          wr.wr.atomic = {raddr, op.operand, op.swap, Rkey(op.region, true)};
          break;
        case RemoteOp::Kind::kRead:
          wr.opcode = IBV_WR_RDMA_READ;
          wr.wr.rdma = {raddr, Rkey(op.region, false)};
          break;
        case RemoteOp::Kind::kWrite:
          wr.opcode = IBV_WR_RDMA_WRITE;
          wr.wr.rdma = {raddr, Rkey(op.region, true)};
          std::memcpy(buf, &op.operand, 8);
          std::memcpy(buf + 8, &op.swap, 8);
          if (op.length <= conn->sizes.max_inline) wr.send_flags = IBV_SEND_INLINE;
          break;
      }
    }
    return Status::Ok();
  }

  // Copies results of `ops` out of their local buffers.
  template <typename Scratch>
  void Results(std::span<RemoteOp> ops, Scratch scratch) {
    for (size_t i = 0; i < ops.size(); ++i) {
      RemoteOp& op = ops[i];
      if (op.kind == RemoteOp::Kind::kRead && op.into != nullptr) {
        std::memcpy(op.into, bulk_buf(), op.length);  // Build put it there (DoExecute only)
      } else if (op.kind == RemoteOp::Kind::kRead) {
        std::memcpy(op.result, scratch(i), op.length);
      } else if (op.kind != RemoteOp::Kind::kWrite) {
        std::memcpy(&op.result[0], scratch(i), 8);
        if (swap_atomics) op.result[0] = __builtin_bswap64(op.result[0]);
      }
    }
  }

  // Posts wrs[0..n), the last one signalled; returns its wr_id in *want.
  Status Post(size_t n, uint64_t* want) {
    if (broken) return Error(ErrorCode::kConnection, "connection to lockd is broken");
    for (size_t i = 0; i < n; ++i) {
      wrs[i].wr_id = next_wr_id++;
      wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
      wrs[i].send_flags =
          (wrs[i].send_flags & IBV_SEND_INLINE) | (i + 1 == n ? IBV_SEND_SIGNALED : 0);
    }
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(conn->id->qp, &wrs[0], &bad); rc != 0) {
      broken = true;
      return rdma::ErrnoStatus(ErrorCode::kConnection, "ibv_post_send", rc);
    }
    *want = wrs[n - 1].wr_id;
    return Status::Ok();
  }

  // Polls until the signalled WR `want` completes. Completes the started batch on the way.
  Status WaitFor(uint64_t want) {
    if (broken) return Error(ErrorCode::kConnection, "connection to lockd is broken");
    // The 5 s start when the CQ first comes up empty past the spins: a completion that is there
    // (or comes within them) costs no clock reading, which on some clocks (an emulated HPET in a
    // VM: about 1 us) is a good part of an operation.
    std::chrono::steady_clock::time_point deadline{};
    for (uint32_t spins = 0;; ++spins) {
      ibv_wc wc[4];
      const int got = ibv_poll_cq(conn->cq.get(), 4, wc);
      if (got < 0) {
        broken = true;
        return Error(ErrorCode::kConnection, "ibv_poll_cq failed");
      }
      bool found = false;
      for (int i = 0; i < got; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          broken = true;
          return Error(ErrorCode::kConnection, std::string("RDMA operation failed: ") +
                                                   ibv_wc_status_str(wc[i].status) +
                                                   " (the connection to lockd is lost)");
        }
        // RC completes in order: everything posted before a completed WR has completed.
        if (wc[i].wr_id > last_unsignalled) posted = 0;
        if (started_want != 0 && wc[i].wr_id >= started_want) {
          Results(started_ops, [this](size_t k) { return start_buf(k); });
          started_want = 0;
          started_done = true;
        }
        if (wc[i].wr_id == want) found = true;
      }
      if (found) return Status::Ok();
      if (got == 0 && spins > 64) {
        if (deadline == std::chrono::steady_clock::time_point{}) {
          deadline = std::chrono::steady_clock::now() + kCompletionTimeout;
        } else if (std::chrono::steady_clock::now() > deadline) {
          broken = true;
          return Error(ErrorCode::kConnection, "no completion from lockd within 5 s");
        }
        // While waiting, look for a disconnect on the connection's rdma_cm channel (lockd
        // stopped or dropped us): fail at once instead of waiting out RC retries.
        if (spins % 256 == 0) RDMALOCK_RETURN_IF_ERROR(CheckDisconnect());
        std::this_thread::yield();
      }
    }
  }

  Status PostAndWait(size_t n) {
    uint64_t want = 0;
    RDMALOCK_RETURN_IF_ERROR(Post(n, &want));
    return WaitFor(want);
  }

  Status CheckDisconnect() {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(conn->channel.get(), &ev) != 0) return Status::Ok();  // none pending
    const rdma_cm_event_type type = ev->event;
    rdma_ack_cm_event(ev);
    if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
        type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
      broken = true;
      return Error(ErrorCode::kConnection,
                   std::string("connection to lockd lost (") + rdma_event_str(type) + ")");
    }
    return Status::Ok();
  }
};

VerbsMemory::VerbsMemory(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)), fork_gen_(fork_guard::Generation()) {}

// In a forked child, the QP, cm_id, CQ, PD and MR are the parent's (the rdma files are shared):
// destroying them would disconnect the parent's connection. The child keeps its copy, untouched.
VerbsMemory::~VerbsMemory() {
  if (fork_guard::Generation() != fork_gen_) {
    fork_guard::Bury(std::shared_ptr<Impl>(std::move(impl_)));
  }
}

namespace {
constexpr const char* kNoListener = "no rdmalock reason given";
}  // namespace

bool IsNotListening(const Status& st) {
  return st.code() == ErrorCode::kConnection && st.message().find(kNoListener) != std::string::npos;
}

Status RejectStatus(const std::string& where, const std::vector<uint8_t>& data) {
  proto::RejectReply r;
  if (!proto::RejectReply::Decode(data, &r)) {
    return Error(ErrorCode::kConnection, "lockd at " + where + " refused the connection (" +
                                             kNoListener +
                                             ": is "
                                             "lockd listening on that port?)");
  }
  std::string msg = "lockd at " + where +
                    " rejected the connection: " + std::string(proto::RejectReasonName(r.reason));
  if (!r.detail.empty()) msg += " (" + r.detail + ")";
  if (r.reason == proto::RejectReason::kBadVersion) {
    msg += "; server speaks versions " + std::to_string(r.min_version) + ".." +
           std::to_string(r.max_version);
  }
  return Error(ErrorCode::kRejected, msg);
}

Result<std::unique_ptr<VerbsMemory>> VerbsMemory::Connect(const ChannelParams& params,
                                                          uint32_t* retry_after_ms,
                                                          proto::RejectReason* reason) {
  fork_guard::Install();  // before any rdma resource exists (see ~VerbsMemory)
  const auto started = std::chrono::steady_clock::now();
  proto::ConnectRequest req;
  req.flags = params.flags;
  req.pid = static_cast<uint32_t>(getpid());
  req.client_name = params.client_name;
  req.join_session = params.join_session;
  req.join_key = params.join_key;
  const auto bytes = req.Encode();
  std::vector<uint8_t> reject;
  const std::string where = params.host + ":" + std::to_string(params.port);
  auto conn = rdma::ConnectRc(params.host, params.port, bytes, params.connect_timeout,
                              budget::kSendQueueDepth, proto::kControlMessageMax, &reject);
  if (!conn.ok()) {
    if (conn.status().code() == ErrorCode::kRejected) {
      proto::RejectReply r;
      // A refusal with a retry time (restart grace, the per-address rate limit) says when lockd
      // will take us; the others are final.
      if (proto::RejectReply::Decode(reject, &r)) {
        if (reason != nullptr) *reason = r.reason;
        if (retry_after_ms != nullptr && r.retry_after_ms > 0) {
          *retry_after_ms = std::max<uint32_t>(r.retry_after_ms, 1);
        }
      }
      return RejectStatus(where, reject);
    }
    return conn.status();
  }
  auto impl = std::make_unique<Impl>();
  impl->conn = std::move(conn).value();
  if (impl->conn->sizes.send_depth < budget::kSendQueueNeed) {
    return Error(ErrorCode::kUnsupported,
                 "this RDMA device allows " + std::to_string(impl->conn->sizes.send_depth) +
                     " send work requests per QP (max_qp_wr); the SDK needs " +
                     std::to_string(budget::kSendQueueNeed));
  }

  // Version 3: lockd's accept is a challenge; our Hello answers it; the Welcome brings the rkeys.
  proto::Challenge challenge;
  if (!proto::Challenge::Decode(impl->conn->accept_data, &challenge)) {
    return Error(ErrorCode::kProtocol, "lockd at " + where + " sent a malformed challenge");
  }
  const bool lockd_auth = (challenge.flags & proto::kChallengeAuthRequired) != 0;
  if (!lockd_auth && !params.auth_key.empty()) {
    return Error(ErrorCode::kRejected,
                 "lockd at " + where +
                     " does not authenticate clients (it has no auth_key_file), but this client "
                     "was given a key: refusing a lockd that cannot prove it holds the key");
  }
  proto::Hello hello;
  hello.nonce = auth::NewNonce();
  if (lockd_auth && !params.auth_key.empty()) {
    hello.flags = proto::kHelloHasProof;
    hello.mac = auth::HelloMac(params.auth_key, challenge.nonce, hello.nonce, bytes);
  }
  std::vector<uint8_t> msg;
  uint32_t kind = 0;
  // What is left of connect_timeout: the connection and the exchange share it.
  const auto left =
      std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                   started + params.connect_timeout - std::chrono::steady_clock::now()),
               std::chrono::milliseconds(1));
  RDMALOCK_RETURN_IF_ERROR(rdma::ExchangeControl(
      impl->conn.get(), hello.Encode(), static_cast<uint32_t>(proto::ControlKind::kHello),
      static_cast<uint32_t>(proto::ControlKind::kRefusal), left, &msg, &kind));
  if (kind == static_cast<uint32_t>(proto::ControlKind::kRefusal)) {
    proto::RejectReply r;
    if (proto::RejectReply::Decode(msg, &r)) {
      if (reason != nullptr) *reason = r.reason;
      if (retry_after_ms != nullptr && r.retry_after_ms > 0) {
        *retry_after_ms = std::max<uint32_t>(r.retry_after_ms, 1);
      }
    }
    Status st = RejectStatus(where, msg);
    if (r.reason == proto::RejectReason::kAuthFailed && params.auth_key.empty()) {
      st = Error(st.code(), st.message() +
                                "; lockd requires authentication: give this client lockd's key "
                                "(auth_key_file in client.yaml, or RDMALOCK_AUTH_KEY_FILE)");
    }
    return st;
  }
  proto::AcceptReply reply;
  if (kind != static_cast<uint32_t>(proto::ControlKind::kWelcome) ||
      !proto::AcceptReply::Decode(msg, &reply)) {
    return Error(ErrorCode::kProtocol, "lockd at " + where + " sent a malformed welcome");
  }
  if (lockd_auth &&
      !auth::MacEqual(reply.mac, auth::WelcomeMac(params.auth_key, hello.nonce, challenge.nonce,
                                                  std::span<const uint8_t>(msg).first(
                                                      proto::AcceptReply::kMac)))) {
    return Error(ErrorCode::kRejected, "lockd at " + where +
                                           " did not prove that it holds the shared key (its "
                                           "welcome's MAC is wrong): not using it");
  }
  if (reply.lock_count == 0 || reply.locks.length < proto::LockTableBytes(reply.lock_count) ||
      reply.lease_ns == 0 || reply.stall_factor == 0) {
    return Error(ErrorCode::kProtocol, "lockd at " + where + " sent an inconsistent layout");
  }
  impl->regions[0] = reply.info;
  impl->regions[1] = reply.locks;
  impl->regions[2] = reply.sessions;
  impl->record = reply.record;
  impl->buffer.assign((2 * kMaxBatch + kPostRing) * kOpScratch + kBulkBytes, 0);
  RDMALOCK_ASSIGN_OR_RETURN(
      impl->mr, rdma::RegisterMr(impl->conn->pd.get(), impl->buffer.data(), impl->buffer.size(),
                                 IBV_ACCESS_LOCAL_WRITE));
  impl->Prepare();
  auto mem = std::unique_ptr<VerbsMemory>(new VerbsMemory(std::move(impl)));
  mem->reply_ = reply;
  mem->connect_started_ = started;
  RDMALOCK_RETURN_IF_ERROR(mem->ProbeByteOrder());
  return mem;
}

Status VerbsMemory::ProbeByteOrder() {
  // Since protocol 7 on the session's own probe word, which no other client can change.
  RemoteOp probe =
      reply_.version >= 7
          ? RemoteOp::FetchAdd(RegionId::kSessions,
                               reply_.session_record_offset + proto::SessionRecord::kProbe, 0)
          : RemoteOp::FetchAdd(RegionId::kLocks, proto::ProbeOffset(reply_.lock_count), 0);
  RDMALOCK_RETURN_IF_ERROR(DoExecute(std::span<RemoteOp>(&probe, 1)));
  if (probe.result[0] == proto::kProbePattern) return Status::Ok();
  if (probe.result[0] == __builtin_bswap64(proto::kProbePattern)) {
    impl_->swap_atomics = true;  // this NIC returns atomic results big-endian
    return Status::Ok();
  }
  return Error(ErrorCode::kProtocol,
               "atomic probe returned an unexpected value; lockd's memory "
               "table layout does not match this client");
}

Status VerbsMemory::DoExecute(std::span<RemoteOp> ops) {
  Impl& m = *impl_;
  if (ops.empty()) return Status::Ok();
  RDMALOCK_RETURN_IF_ERROR(m.Build(
      ops, [&m](size_t i) { return m.op_buf(i); }, m.bulk_buf()));
  const Status st = m.PostAndWait(ops.size());
  if (m.started_done) {
    m.started_done = false;
    StartedDone();
  }
  RDMALOCK_RETURN_IF_ERROR(st);
  m.Results(ops, [&m](size_t i) { return m.op_buf(i); });
  return Status::Ok();
}

Status VerbsMemory::DoStart(std::span<RemoteOp> ops) {
  Impl& m = *impl_;
  if (ops.empty()) return Status::Ok();
  RDMALOCK_RETURN_IF_ERROR(m.Build(
      ops, [&m](size_t i) { return m.start_buf(i); }, nullptr));
  m.started_ops = ops;
  m.started_done = false;
  return m.Post(ops.size(), &m.started_want);
}

Status VerbsMemory::DoAwait() {
  Impl& m = *impl_;
  if (m.started_done) {
    m.started_done = false;
    return Status::Ok();
  }
  if (m.started_want == 0) return Status::Ok();
  const Status st = m.WaitFor(m.started_want);
  m.started_done = false;
  return st;
}

Status VerbsMemory::DoPost(std::span<RemoteOp> ops) {
  Impl& m = *impl_;
  if (m.broken) return Error(ErrorCode::kConnection, "connection to lockd is broken");
  if (ops.empty()) return Status::Ok();
  if (m.posted + ops.size() > kMaxPosted || ops.size() > kMaxBatch) return DoExecute(ops);
  for (size_t i = 0; i < ops.size(); ++i) {
    const RemoteOp& op = ops[i];
    const proto::RegionDesc& r = m.regions[static_cast<int>(op.region)];
    if (op.offset + op.length > r.length || op.length > kOpScratch) {
      return Error(ErrorCode::kInvalidArgument, "remote offset out of range");
    }
    uint8_t* buf = m.ring_buf(m.ring_next);
    m.ring_next = (m.ring_next + 1) % kPostRing;
    std::memcpy(buf, &op.operand, 8);
    std::memcpy(buf + 8, &op.swap, 8);
    m.sges[i].addr = reinterpret_cast<uint64_t>(buf);
    m.sges[i].length = op.length;
    ibv_send_wr& wr = m.wrs[i];  // prepared once (Prepare)
    wr.wr_id = m.next_wr_id++;
    wr.send_flags = 0;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma = {r.addr + op.offset, m.Rkey(op.region, true)};
    // Inline where the device allows: the data is copied at post time, the NIC reads no buffer.
    if (op.length <= m.conn->sizes.max_inline) wr.send_flags = IBV_SEND_INLINE;
    wr.next = i + 1 < ops.size() ? &m.wrs[i + 1] : nullptr;
    m.last_unsignalled = wr.wr_id;
  }
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(m.conn->id->qp, &m.wrs[0], &bad); rc != 0) {
    m.broken = true;
    return rdma::ErrnoStatus(ErrorCode::kConnection, "ibv_post_send", rc);
  }
  m.posted += ops.size();
  return Status::Ok();
}

void VerbsMemory::UseRkeysOf(const proto::AcceptReply& other) {
  impl_->regions[0].rkey = other.info.rkey;
  impl_->regions[1].rkey = other.locks.rkey;
  impl_->regions[2].rkey = other.sessions.rkey;
  impl_->record.rkey = other.record.rkey;
}

uint32_t VerbsMemory::max_inline() const { return impl_->conn->sizes.max_inline; }

void VerbsMemory::Shutdown() {
  impl_->broken = true;
  if (impl_->conn && impl_->conn->id) {
    (void)impl_->conn->id.FenceQp();  // a failure is reported; the disconnect errors the QP too
    (void)rdma_disconnect(impl_->conn->id.get());
  }
}

Status VerbsMemory::CheckConnection() {
  if (impl_->broken) return Error(ErrorCode::kConnection, "connection to lockd is broken");
  return impl_->CheckDisconnect();
}

Status VerbsMemory::ReadBytes(RegionId region, uint64_t offset, std::span<uint8_t> dst) {
  Impl& m = *impl_;
  const proto::RegionDesc& r = m.regions[static_cast<int>(region)];
  if (offset + dst.size() > r.length) {
    return Error(ErrorCode::kInvalidArgument, "read past the end of the region");
  }
  for (size_t done = 0; done < dst.size();) {
    const size_t n = std::min(kBulkBytes, dst.size() - done);
    ibv_sge& sge = m.sges[0];
    sge.addr = reinterpret_cast<uint64_t>(m.bulk_buf());
    sge.length = static_cast<uint32_t>(n);
    ibv_send_wr& wr = m.wrs[0];  // prepared once (Prepare)
    wr.send_flags = 0;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.wr.rdma = {r.addr + offset + done, m.Rkey(region, false)};
    RDMALOCK_RETURN_IF_ERROR(m.PostAndWait(1));
    std::memcpy(dst.data() + done, m.bulk_buf(), n);
    done += n;
  }
  return Status::Ok();
}

}  // namespace rdmalock
