#include "common/rdma/verbs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace rdmalock::rdma {

Status Listen(rdma_cm_id* id, sockaddr* addr, int backlog, const std::string& what) {
  if (rdma_bind_addr(id, addr) != 0) {
    return ErrnoStatus(ErrorCode::kIo, "rdma_bind_addr " + what + " (port in use?)", errno);
  }
  if (rdma_listen(id, backlog) != 0) return ErrnoStatus(ErrorCode::kIo, "rdma_listen", errno);
  return Status::Ok();
}

void DrainCq(ibv_cq* cq) {
  ibv_wc wc[16];
  while (PollCq(cq, wc) > 0) {
  }
}

namespace {
std::atomic<TeardownReporter> g_teardown_reporter{nullptr};
}  // namespace

void SetTeardownReporter(TeardownReporter r) { g_teardown_reporter.store(r); }

void ReportTeardownFailure(const char* call, int rc) {
  if (TeardownReporter r = g_teardown_reporter.load(); r != nullptr) {
    r(call, rc);
  } else {
    std::fprintf(stderr, "rdmalock: %s failed: %d (%s)\n", call, rc,
                 std::strerror(rc > 0 ? rc : errno));
  }
}

#define RDMALOCK_DELETER_NAME(fn)   \
  template <>                       \
  const char* Deleter<fn>::Name() { \
    return #fn;                     \
  }
RDMALOCK_DELETER_NAME(rdma_destroy_event_channel)
RDMALOCK_DELETER_NAME(ibv_dealloc_pd)
RDMALOCK_DELETER_NAME(ibv_destroy_cq)
RDMALOCK_DELETER_NAME(ibv_dereg_mr)
RDMALOCK_DELETER_NAME(rdma_ack_cm_event)
RDMALOCK_DELETER_NAME(ibv_destroy_comp_channel)
RDMALOCK_DELETER_NAME(DeallocMw)
RDMALOCK_DELETER_NAME(ibv_close_device)
#undef RDMALOCK_DELETER_NAME

Result<CmEvent> TryGetEvent(rdma_event_channel* ch) {
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) == 0) return CmEvent(ev);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return CmEvent();
  return ErrnoStatus(ErrorCode::kConnection, "rdma_get_cm_event", errno);
}

const char* EventName(rdma_cm_event_type e) { return rdma_event_str(e); }
const sockaddr* PeerAddr(rdma_cm_id* id) { return rdma_get_peer_addr(id); }
const sockaddr* LocalAddr(rdma_cm_id* id) { return rdma_get_local_addr(id); }

Status Accept(rdma_cm_id* id, rdma_conn_param* param) {
  if (rdma_accept(id, param) != 0) return ErrnoStatus(ErrorCode::kConnection, "rdma_accept", errno);
  return Status::Ok();
}

Status Reject(rdma_cm_id* id, std::span<const uint8_t> private_data) {
  if (rdma_reject(id, private_data.data(), static_cast<uint8_t>(private_data.size())) != 0) {
    return ErrnoStatus(ErrorCode::kConnection, "rdma_reject", errno);
  }
  return Status::Ok();
}

Status PostRecv(ibv_qp* qp, uint64_t wr_id, void* addr, uint32_t len, uint32_t lkey) {
  ibv_sge sge{reinterpret_cast<uint64_t>(addr), len, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (const int rc = ibv_post_recv(qp, &wr, &bad); rc != 0) {
    return ErrnoStatus(ErrorCode::kResource, "ibv_post_recv", rc);
  }
  return Status::Ok();
}

Status PostSend(ibv_qp* qp, ibv_send_wr* first) {
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp, first, &bad); rc != 0) {
    return ErrnoStatus(ErrorCode::kConnection, "ibv_post_send", rc);
  }
  return Status::Ok();
}

uint32_t NextRkey(uint32_t rkey) { return ibv_inc_rkey(rkey); }
const char* WcStatusName(ibv_wc_status s) { return ibv_wc_status_str(s); }

bool TakeCqEvent(ibv_comp_channel* ch, ibv_cq* cq, Status* rearmed) {
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) != 0) return false;
  ibv_ack_cq_events(ev_cq, 1);
  *rearmed = ArmCq(cq);
  return true;
}

Status ArmCq(ibv_cq* cq) {
  if (ibv_req_notify_cq(cq, 0) != 0) {
    return ErrnoStatus(ErrorCode::kResource, "ibv_req_notify_cq", errno);
  }
  return Status::Ok();
}

int PollCq(ibv_cq* cq, std::span<ibv_wc> wc) {
  const int n = ibv_poll_cq(cq, static_cast<int>(wc.size()), wc.data());
  return n < 0 ? 0 : n;
}

bool TakeAsyncEvent(ibv_context* ctx, AsyncEvent* out) {
  ibv_async_event ev{};
  if (ibv_get_async_event(ctx, &ev) != 0) return false;
  out->type = ev.event_type;
  out->qp = nullptr;
  if (ev.event_type == IBV_EVENT_QP_FATAL || ev.event_type == IBV_EVENT_QP_REQ_ERR ||
      ev.event_type == IBV_EVENT_QP_ACCESS_ERR) {
    out->qp = ev.element.qp;
  }
  ibv_ack_async_event(&ev);
  return true;
}

const char* AsyncEventName(ibv_event_type t) { return ibv_event_type_str(t); }
std::string DeviceName(ibv_context* ctx) { return ibv_get_device_name(ctx->device); }

Result<ibv_device_attr> QueryDevice(ibv_context* ctx, const std::string& name) {
  ibv_device_attr attr{};
  if (const int rc = ibv_query_device(ctx, &attr); rc != 0) {
    return ErrnoStatus(ErrorCode::kResource, "ibv_query_device " + name, rc);
  }
  return attr;
}

bool QpInError(rdma_cm_id* id) {
  if (id == nullptr || id->qp == nullptr) return false;
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  return ibv_query_qp(id->qp, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_ERR;
}

void Fd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

DeviceList DeviceList::Get() {
  DeviceList l;
  int n = 0;
  l.list_ = rdma_get_devices(&n);
  l.n_ = l.list_ == nullptr ? 0 : n;
  return l;
}

void DeviceList::Reset() {
  if (list_ != nullptr) rdma_free_devices(list_);
  list_ = nullptr;
  n_ = 0;
}

Status SetNonBlocking(int fd, const std::string& what) {
  if (const int fl = fcntl(fd, F_GETFL); fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    return ErrnoStatus(ErrorCode::kIo, "making " + what + " non-blocking", errno);
  }
  return Status::Ok();
}

Status ErrnoStatus(ErrorCode code, const std::string& what, int err) {
  return Error(code,
               what + " failed: " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
}

Status CmId::FenceQp() {
  if (id_ == nullptr || id_->qp == nullptr) return Status::Ok();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  // rdma-core returns the error number (a provider may return -1 and set errno).
  if (const int rc = ibv_modify_qp(id_->qp, &attr, IBV_QP_STATE); rc != 0) {
    const int err = rc > 0 ? rc : (errno != 0 ? errno : EIO);
    ReportTeardownFailure("ibv_modify_qp(IBV_QPS_ERR)", err);
    return ErrnoStatus(
        ErrorCode::kIo,
        "ibv_modify_qp of QP " + std::to_string(id_->qp->qp_num) + " to ERR (its fence)", err);
  }
  return Status::Ok();
}

void CmId::Disconnect() {
  if (id_ != nullptr) (void)rdma_disconnect(id_);
}

void CmId::Reset() {
  if (id_ == nullptr) return;
  if (id_->qp != nullptr) {
    // To ERR first, so that nothing executes while it goes. Not reported here: a caller whose
    // safety rests on the fence calls FenceQp (which reports) before, and a failure here would be
    // that one's again; the destroy that follows ends the QP either way.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    (void)ibv_modify_qp(id_->qp, &attr, IBV_QP_STATE);
    rdma_destroy_qp(id_);
  }
  if (const int rc = rdma_destroy_id(id_); rc != 0) ReportTeardownFailure("rdma_destroy_id", errno);
  id_ = nullptr;
}

Result<EventChannel> CreateEventChannel() {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr) {
    return ErrnoStatus(ErrorCode::kResource,
                       "rdma_create_event_channel (is an RDMA device present? see "
                       "deploy/softroce)",
                       errno);
  }
  EventChannel owned(ch);
  RDMALOCK_RETURN_IF_ERROR(SetNonBlocking(ch->fd, "the rdma_cm channel"));
  return owned;
}

Result<CmId> CreateId(rdma_event_channel* ch, void* context) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, context, RDMA_PS_TCP) != 0) {
    return ErrnoStatus(ErrorCode::kResource, "rdma_create_id", errno);
  }
  return CmId(id);
}

Result<ProtectionDomain> AllocPd(ibv_context* ctx) {
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) return ErrnoStatus(ErrorCode::kResource, "ibv_alloc_pd", errno);
  return ProtectionDomain(pd);
}

Result<CompletionQueue> CreateCq(ibv_context* ctx, int depth, ibv_comp_channel* ch) {
  ibv_cq* cq = ibv_create_cq(ctx, depth, nullptr, ch, 0);
  if (cq == nullptr) return ErrnoStatus(ErrorCode::kResource, "ibv_create_cq", errno);
  return CompletionQueue(cq);
}

Result<CompChannel> CreateCompChannel(ibv_context* ctx) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  if (ch == nullptr) return ErrnoStatus(ErrorCode::kResource, "ibv_create_comp_channel", errno);
  return CompChannel(ch);
}

int DeallocMw(ibv_mw* mw) { return ibv_dealloc_mw(mw); }

Result<MemoryWindow> AllocMw(ibv_pd* pd) {
  ibv_mw* mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  if (mw == nullptr) return ErrnoStatus(ErrorCode::kResource, "ibv_alloc_mw (type 2)", errno);
  return MemoryWindow(mw);
}

Result<MemoryRegion> RegisterMr(ibv_pd* pd, void* addr, size_t len, int access) {
  ibv_mr* mr = ibv_reg_mr(pd, addr, len, access);
  if (mr == nullptr) {
    return ErrnoStatus(ErrorCode::kResource,
                       "ibv_reg_mr of " + std::to_string(len) +
                           " bytes (is the memlock limit high enough? LimitMEMLOCK=infinity)",
                       errno);
  }
  return MemoryRegion(mr);
}

Result<CmEvent> GetEvent(rdma_event_channel* ch, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) return CmEvent(ev);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return ErrnoStatus(ErrorCode::kConnection, "rdma_get_cm_event", errno);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Error(ErrorCode::kTimeout, "no rdma_cm event in time");
    pollfd pfd{ch->fd, POLLIN, 0};
    (void)poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
  }
}

Result<SockAddr> ResolveAddress(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Error(ErrorCode::kInvalidArgument,
                 "cannot resolve address '" + host + "': " + gai_strerror(rc));
  }
  SockAddr out;
  std::memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

std::string AddressToString(const sockaddr* sa) {
  if (sa == nullptr) return "?";
  char buf[INET6_ADDRSTRLEN] = "?";
  // Built by append, not by "[" + std::string(buf) + "]:": GCC 12 at -O3 misreports the
  // operator+ form as overlapping memcpy arguments (-Werror=restrict, a known false positive).
  std::string out;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    out.append(buf).append(":").append(std::to_string(ntohs(in->sin_port)));
    return out;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    out.append("[").append(buf).append("]:").append(std::to_string(ntohs(in6->sin6_port)));
    return out;
  }
  return "?";
}

Result<QpSizes> DeviceQpSizes(ibv_context* ctx, uint32_t want_send_depth) {
  ibv_device_attr attr{};
  if (const int rc = ibv_query_device(ctx, &attr); rc != 0) {
    return ErrnoStatus(ErrorCode::kResource, "ibv_query_device", rc);
  }
  if (attr.atomic_cap == IBV_ATOMIC_NONE) {
    return Error(ErrorCode::kUnsupported, std::string("device ") +
                                              ibv_get_device_name(ctx->device) +
                                              " does not support RC atomics (atomic_cap NONE)");
  }
  QpSizes s;
  s.send_depth = std::min<uint32_t>(want_send_depth, static_cast<uint32_t>(attr.max_qp_wr));
  s.recv_depth = 1;
  // rdma_cm carries initiator depth and responder resources in 8 bits.
  s.rd_atomic = std::min<uint32_t>({static_cast<uint32_t>(attr.max_qp_rd_atom),
                                    static_cast<uint32_t>(attr.max_qp_init_rd_atom), 255u});
  if (s.rd_atomic == 0) {
    return Error(ErrorCode::kUnsupported, "device allows no outstanding RDMA READ/atomic");
  }
  return s;
}

Status CreateRcQp(rdma_cm_id* id, ibv_pd* pd, ibv_cq* cq, QpSizes* sizes) {
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = cq;
  attr.recv_cq = cq;
  attr.cap.max_send_wr = sizes->send_depth;
  attr.cap.max_recv_wr = sizes->recv_depth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = sizes->max_inline;
  attr.sq_sig_all = 0;  // selective signalling: only the last WR of a batch asks for a completion
  if (rdma_create_qp(id, pd, &attr) != 0) {
    if (sizes->max_inline == 0) return ErrnoStatus(ErrorCode::kResource, "rdma_create_qp", errno);
    attr.cap.max_inline_data = 0;  // a device without inline sends
    if (rdma_create_qp(id, pd, &attr) != 0) {
      return ErrnoStatus(ErrorCode::kResource, "rdma_create_qp", errno);
    }
  }
  // The provider writes back what it granted (possibly more than asked).
  sizes->max_inline = attr.cap.max_inline_data;
  return Status::Ok();
}

ActiveConnection::~ActiveConnection() {
  if (id && id->qp != nullptr) {
    (void)rdma_disconnect(id.get());
  }
}

namespace {

// Work request ids of the control exchange (the one-sided path's ids are small indexes).
constexpr uint64_t kControlRecvId = 0xc0de'0000'0000'0001ULL;
constexpr uint64_t kControlSendId = 0xc0de'0000'0000'0002ULL;

// Waits for `want` on the channel; anything else is an error that names what arrived.
Status Expect(rdma_event_channel* ch, rdma_cm_event_type want, std::chrono::milliseconds timeout,
              const std::string& step, std::vector<uint8_t>* data_out,
              std::vector<uint8_t>* reject_data) {
  RDMALOCK_ASSIGN_OR_RETURN(CmEvent ev, GetEvent(ch, timeout));
  if (ev->event == want) {
    if (data_out != nullptr && ev->param.conn.private_data != nullptr) {
      const auto* p = static_cast<const uint8_t*>(ev->param.conn.private_data);
      data_out->assign(p, p + ev->param.conn.private_data_len);
    }
    return Status::Ok();
  }
  if (ev->event == RDMA_CM_EVENT_REJECTED) {
    if (reject_data != nullptr && ev->param.conn.private_data != nullptr) {
      const auto* p = static_cast<const uint8_t*>(ev->param.conn.private_data);
      reject_data->assign(p, p + ev->param.conn.private_data_len);
    }
    return Error(ErrorCode::kRejected,
                 step + ": connection rejected (status " + std::to_string(ev->status) + ")");
  }
  return Error(ErrorCode::kConnection, step + ": got " + rdma_event_str(ev->event) + " (status " +
                                           std::to_string(ev->status) + ")");
}

}  // namespace

Result<std::unique_ptr<ActiveConnection>> ConnectRc(const std::string& host, uint16_t port,
                                                    std::span<const uint8_t> private_data,
                                                    std::chrono::milliseconds timeout,
                                                    uint32_t send_depth, size_t control_bytes,
                                                    std::vector<uint8_t>* reject_data) {
  auto c = std::make_unique<ActiveConnection>();
  RDMALOCK_ASSIGN_OR_RETURN(c->channel, CreateEventChannel());
  RDMALOCK_ASSIGN_OR_RETURN(c->id, CreateId(c->channel.get(), nullptr));
  // Local ACK timeout 4.096 us x 2^14 = 67 ms, 7 retries: a peer that vanished without a
  // disconnect is noticed in about half a second (left unset, some providers never give up).
  uint8_t ack_timeout = 14;
  if (rdma_set_option(c->id.get(), RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout,
                      sizeof(ack_timeout)) != 0) {
    return ErrnoStatus(ErrorCode::kConnection, "rdma_set_option(ACK_TIMEOUT)", errno);
  }
  RDMALOCK_ASSIGN_OR_RETURN(SockAddr dst, ResolveAddress(host, port, false));
  const std::string where = host + ":" + std::to_string(port);
  // One budget for every step: each got the whole timeout, so a connection could take several
  // times it (found by review, 2026-12-06).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left = [&deadline] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()),
                    std::chrono::milliseconds(1));
  };
  if (rdma_resolve_addr(c->id.get(), nullptr, dst.get(), static_cast<int>(left().count())) != 0) {
    return ErrnoStatus(ErrorCode::kConnection, "rdma_resolve_addr " + where, errno);
  }
  RDMALOCK_RETURN_IF_ERROR(Expect(c->channel.get(), RDMA_CM_EVENT_ADDR_RESOLVED, left(),
                                  "resolving " + where + " (is it an RDMA-capable address?)",
                                  nullptr, nullptr));
  if (rdma_resolve_route(c->id.get(), static_cast<int>(left().count())) != 0) {
    return ErrnoStatus(ErrorCode::kConnection, "rdma_resolve_route " + where, errno);
  }
  RDMALOCK_RETURN_IF_ERROR(Expect(c->channel.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, left(),
                                  "resolving the route to " + where, nullptr, nullptr));
  ibv_context* ctx = c->id->verbs;
  RDMALOCK_ASSIGN_OR_RETURN(c->sizes, DeviceQpSizes(ctx, send_depth));
  c->sizes.max_inline = 16;  // record WRITEs and the heartbeat are 8 or 16 bytes
  RDMALOCK_ASSIGN_OR_RETURN(c->pd, AllocPd(ctx));
  RDMALOCK_ASSIGN_OR_RETURN(c->cq, CreateCq(ctx, static_cast<int>(c->sizes.send_depth + 2)));
  RDMALOCK_RETURN_IF_ERROR(CreateRcQp(c->id.get(), c->pd.get(), c->cq.get(), &c->sizes));
  // The receive for lockd's first control message, posted before the connect so that it is
  // there whenever lockd sends.
  c->control.assign(2 * control_bytes, 0);
  RDMALOCK_ASSIGN_OR_RETURN(c->control_mr, RegisterMr(c->pd.get(), c->control.data(),
                                                      c->control.size(), IBV_ACCESS_LOCAL_WRITE));
  ibv_sge sge{reinterpret_cast<uint64_t>(c->control.data()), static_cast<uint32_t>(control_bytes),
              c->control_mr->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = kControlRecvId;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (const int rc = ibv_post_recv(c->id->qp, &rwr, &bad); rc != 0) {
    return ErrnoStatus(ErrorCode::kConnection, "ibv_post_recv", rc);
  }

  rdma_conn_param param{};
  param.private_data = private_data.data();
  param.private_data_len = static_cast<uint8_t>(private_data.size());
  // Left at 0, atomics and READs never complete: ask for what the device allows.
  param.initiator_depth = static_cast<uint8_t>(c->sizes.rd_atomic);
  param.responder_resources = static_cast<uint8_t>(c->sizes.rd_atomic);
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(c->id.get(), &param) != 0) {
    return ErrnoStatus(ErrorCode::kConnection, "rdma_connect " + where, errno);
  }
  RDMALOCK_RETURN_IF_ERROR(Expect(c->channel.get(), RDMA_CM_EVENT_ESTABLISHED, left(),
                                  "connecting to lockd at " + where, &c->accept_data, reject_data));
  return c;
}

Status ExchangeControl(ActiveConnection* c, std::span<const uint8_t> msg, uint32_t imm,
                       uint32_t closing_imm, std::chrono::milliseconds timeout,
                       std::vector<uint8_t>* reply, uint32_t* reply_imm) {
  const size_t n = c->control.size() / 2;
  if (msg.size() > n) return Error(ErrorCode::kInternal, "control message too large");
  std::memcpy(c->control.data() + n, msg.data(), msg.size());
  ibv_sge sge{reinterpret_cast<uint64_t>(c->control.data() + n), static_cast<uint32_t>(msg.size()),
              c->control_mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = kControlSendId;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(imm);
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(c->id->qp, &wr, &bad); rc != 0) {
    return ErrnoStatus(ErrorCode::kConnection, "ibv_post_send (control message)", rc);
  }
  bool sent = false, received = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!sent || !received) {
    ibv_wc wc[2];
    const int got = ibv_poll_cq(c->cq.get(), 2, wc);
    if (got < 0) return Error(ErrorCode::kConnection, "ibv_poll_cq failed");
    Status failed;
    for (int i = 0; i < got; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        if (failed.ok()) {
          failed = Error(ErrorCode::kConnection,
                         std::string("handshake message ") +
                             (wc[i].wr_id == kControlRecvId ? "receive" : "send") + " failed (" +
                             ibv_wc_status_str(wc[i].status) + "): lockd closed the connection");
        }
      } else if (wc[i].wr_id == kControlSendId) {
        sent = true;
      } else if (wc[i].wr_id == kControlRecvId) {
        received = true;
        reply->assign(c->control.data(), c->control.data() + std::min<size_t>(wc[i].byte_len, n));
        *reply_imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) != 0 ? ntohl(wc[i].imm_data) : 0;
      }
    }
    // A closing reply is the answer even if our SEND's completion failed beside it.
    if (received && *reply_imm == closing_imm) return Status::Ok();
    if (!failed.ok()) return failed;
    if (got > 0) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      return Error(ErrorCode::kTimeout,
                   std::string(sent ? "lockd did not answer the handshake's hello within "
                                    : "the handshake's hello was not acknowledged within ") +
                       std::to_string(timeout.count()) + " ms" +
                       (QpInError(c->id.get()) ? " (the connection is in the error state)" : ""));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Status::Ok();
}

}  // namespace rdmalock::rdma
