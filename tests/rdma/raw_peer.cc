#include "tests/rdma/raw_peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>

#include "rdmalock/proto/handshake.h"

namespace rdmalock::rdma_test {

using namespace std::chrono_literals;

namespace {

// How long a step of the half-open handshake may take (rdma_cm's own timeouts are 2 s).
constexpr auto kEventTimeout = 10s;

using DeviceList = std::unique_ptr<ibv_device*, rdma::Deleter<ibv_free_device_list>>;

// The value of `r`, or a failed test that names its error.
template <typename T>
T Must(Result<T> r) {
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

// The next event on `ch`, acknowledged, must be `want`.
void ExpectEvent(rdma_event_channel* ch, rdma_cm_event_type want) {
  rdma_cm_event_type got;
  {
    auto ev = rdma::GetEvent(ch, kEventTimeout);
    INFO(ev.status().ToString() << ", waiting for " << rdma_event_str(want));
    REQUIRE(ev.ok());
    got = (*ev)->event;
  }  // acknowledged here
  INFO("rdma_cm event " << rdma_event_str(got) << ", wanted " << rdma_event_str(want));
  REQUIRE(got == want);
}

// Waits for lockd's answer to a connect: true when `want` came; false when lockd refused, with
// its reason in *rejected (a refusal without lockd's reply fails the test, naming that).
bool AwaitAnswer(rdma_event_channel* ch, rdma_cm_event_type want, proto::RejectReason* rejected) {
  auto ev = rdma::GetEvent(ch, kEventTimeout);
  INFO(ev.status().ToString());
  REQUIRE(ev.ok());
  if ((*ev)->event == RDMA_CM_EVENT_REJECTED) {
    const auto* data = static_cast<const uint8_t*>((*ev)->param.conn.private_data);
    std::vector<uint8_t> reject(data, data + (data ? (*ev)->param.conn.private_data_len : 0));
    proto::RejectReply r;
    INFO("a rejection with " << reject.size() << " bytes of private data, not lockd's reply");
    REQUIRE(proto::RejectReply::Decode(reject, &r));
    *rejected = r.reason;
    return false;
  }
  INFO("rdma_cm event " << rdma_event_str((*ev)->event) << ", wanted " << rdma_event_str(want));
  REQUIRE((*ev)->event == want);
  return true;
}

// Makes *ch and *id, and resolves the address and the route to ip:port.
void ResolveTo(const std::string& ip, uint16_t port, rdma::EventChannel* ch, rdma::CmId* id) {
  *ch = Must(rdma::CreateEventChannel());
  *id = Must(rdma::CreateId(ch->get(), nullptr));
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  REQUIRE(inet_pton(AF_INET, ip.c_str(), &sin.sin_addr) == 1);
  REQUIRE(rdma_resolve_addr(id->get(), nullptr, reinterpret_cast<sockaddr*>(&sin), 2000) == 0);
  ExpectEvent(ch->get(), RDMA_CM_EVENT_ADDR_RESOLVED);
  REQUIRE(rdma_resolve_route(id->get(), 2000) == 0);
  ExpectEvent(ch->get(), RDMA_CM_EVENT_ROUTE_RESOLVED);
}

// SENDs `data` (registered under `lkey`) with immediate data `imm` on `qp`, and waits (up to
// kEventTimeout) for its completion on `cq`.
Status SendAndWait(ibv_qp* qp, ibv_cq* cq, std::span<const uint8_t> data, uint32_t lkey,
                   uint32_t imm) {
  ibv_sge sge{reinterpret_cast<uint64_t>(data.data()), static_cast<uint32_t>(data.size()), lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.imm_data = htonl(imm);
  wr.send_flags = IBV_SEND_SIGNALED;
  RDMALOCK_RETURN_IF_ERROR(rdma::PostSend(qp, &wr));
  const auto deadline = std::chrono::steady_clock::now() + kEventTimeout;
  for (;;) {
    ibv_wc wc[1];
    if (rdma::PollCq(cq, wc) > 0) {
      if (wc[0].status != IBV_WC_SUCCESS) {
        return Error(ErrorCode::kConnection,
                     std::string("the SEND failed: ") + rdma::WcStatusName(wc[0].status));
      }
      return Status::Ok();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Error(ErrorCode::kTimeout, "the SEND did not complete");
    }
    std::this_thread::sleep_for(1ms);
  }
}

}  // namespace

HalfOpenClient::HalfOpenClient(const std::string& ip, uint16_t port, uint64_t join_session,
                               uint64_t join_key) {
  ResolveTo(ip, port, &ch_, &id_);
  proto::ConnectRequest req;
  req.client_name = "half-open";
  if (join_session != 0) {
    req.flags = proto::kFlagJoin;
    req.join_session = join_session;
    req.join_key = join_key;
  }
  const auto bytes = req.Encode();
  rdma_conn_param p{};
  p.private_data = bytes.data();
  p.private_data_len = static_cast<uint8_t>(bytes.size());
  // No QP behind it. Distinct numbers: the CM refuses a second request from the same QPN
  // as a stale connection.
  static std::atomic<uint32_t> next_qpn{0x4242};
  p.qp_num = next_qpn++;
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.retry_count = 7;
  REQUIRE(rdma_connect(id_.get(), &p) == 0);
  // Accepted (no RTU follows), or refused.
  (void)AwaitAnswer(ch_.get(), RDMA_CM_EVENT_CONNECT_RESPONSE, &rejected_);
}

DeafClient::DeafClient(const std::string& ip, uint16_t port, const std::string& name) {
  ResolveTo(ip, port, &ch_, &id_);
  rdma::QpSizes sizes = Must(rdma::DeviceQpSizes(id_->verbs, 4));
  pd_ = Must(rdma::AllocPd(id_->verbs));
  cq_ = Must(rdma::CreateCq(id_->verbs, 8));
  REQUIRE(rdma::CreateRcQp(id_.get(), pd_.get(), cq_.get(), &sizes).ok());
  const auto hello = proto::Hello{}.Encode();
  hello_.assign(hello.begin(), hello.end());
  mr_ = Must(rdma::RegisterMr(pd_.get(), hello_.data(), hello_.size(), IBV_ACCESS_LOCAL_WRITE));
  proto::ConnectRequest req;
  req.client_name = name;
  const auto bytes = req.Encode();
  rdma_conn_param p{};
  p.private_data = bytes.data();
  p.private_data_len = static_cast<uint8_t>(bytes.size());
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;  // lockd's Welcome, unreceived, is retried without end
  REQUIRE(rdma_connect(id_.get(), &p) == 0);
  if (!AwaitAnswer(ch_.get(), RDMA_CM_EVENT_ESTABLISHED, &rejected_)) return;
  const Status sent = SendAndWait(id_->qp, cq_.get(), hello_, mr_->lkey,
                                  static_cast<uint32_t>(proto::ControlKind::kHello));
  INFO("the hello's SEND: " << sent.ToString());
  REQUIRE(sent.ok());  // lockd has a receive for the hello: it is delivered
}

MemoryWindowHog::MemoryWindowHog() {
  int n = 0;
  DeviceList list(ibv_get_device_list(&n));
  const char* want = std::getenv("RXE_DEV");
  for (int i = 0; list != nullptr && i < n && ctx_ == nullptr; ++i) {
    if (want == nullptr || std::string(ibv_get_device_name(list.get()[i])) == want) {
      ctx_.reset(ibv_open_device(list.get()[i]));
    }
  }
  list.reset();
  if (ctx_ != nullptr) {
    auto pd = rdma::AllocPd(ctx_.get());
    if (pd.ok()) pd_ = std::move(pd).value();
  }
  while (pd_ != nullptr && mws_.size() < (1u << 20)) {
    auto mw = rdma::AllocMw(pd_.get());
    if (!mw.ok()) break;
    mws_.push_back(std::move(mw).value());
  }
}

void MemoryWindowHog::Free() {
  mws_.clear();
  pd_.reset();
  ctx_.reset();
}

UnreceivingPeer::UnreceivingPeer(const std::string& ip, uint16_t port, uint32_t imm,
                                 std::span<const uint8_t> answer,
                                 std::chrono::milliseconds accept_after,
                                 std::span<const uint8_t> accept_data)
    : imm_(imm),
      answer_(answer.begin(), answer.end()),
      accept_after_(accept_after),
      accept_data_(accept_data.begin(), accept_data.end()) {
  ch_ = Must(rdma::CreateEventChannel());
  listener_ = Must(rdma::CreateId(ch_.get(), nullptr));
  rdma::SockAddr addr = Must(rdma::ResolveAddress(ip, port, true));
  const Status listening = rdma::Listen(listener_.get(), addr.get(), 1, ip);
  INFO(listening.ToString());
  REQUIRE(listening.ok());
  thread_ = std::thread([this] { served_ = Serve(); });
}

UnreceivingPeer::~UnreceivingPeer() {
  if (thread_.joinable()) thread_.join();
}

Status UnreceivingPeer::Wait() {
  if (thread_.joinable()) thread_.join();
  return served_;
}

Status UnreceivingPeer::Serve() {
  rdma_cm_id* id = nullptr;
  {
    RDMALOCK_ASSIGN_OR_RETURN(rdma::CmEvent ev, rdma::GetEvent(ch_.get(), kEventTimeout));
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      return Error(ErrorCode::kConnection,
                   std::string("expected a connect request, got ") + rdma_event_str(ev->event));
    }
    id = ev->id;
  }
  conn_ = rdma::CmId(id);
  RDMALOCK_ASSIGN_OR_RETURN(rdma::QpSizes sizes, rdma::DeviceQpSizes(id->verbs, 4));
  RDMALOCK_ASSIGN_OR_RETURN(pd_, rdma::AllocPd(id->verbs));
  RDMALOCK_ASSIGN_OR_RETURN(cq_, rdma::CreateCq(id->verbs, 8));
  RDMALOCK_RETURN_IF_ERROR(rdma::CreateRcQp(id, pd_.get(), cq_.get(), &sizes));
  if (!answer_.empty()) {
    RDMALOCK_ASSIGN_OR_RETURN(
        mr_, rdma::RegisterMr(pd_.get(), answer_.data(), answer_.size(), IBV_ACCESS_LOCAL_WRITE));
  }
  std::this_thread::sleep_for(accept_after_);
  rdma_conn_param param{};
  param.initiator_depth = 1;
  param.responder_resources = 1;
  param.rnr_retry_count = 7;
  param.private_data = accept_data_.empty() ? nullptr : accept_data_.data();
  param.private_data_len = static_cast<uint8_t>(accept_data_.size());
  RDMALOCK_RETURN_IF_ERROR(rdma::Accept(id, &param));
  {
    RDMALOCK_ASSIGN_OR_RETURN(rdma::CmEvent ev, rdma::GetEvent(ch_.get(), kEventTimeout));
    if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
      return Error(ErrorCode::kConnection,
                   std::string("expected established, got ") + rdma_event_str(ev->event));
    }
  }
  if (answer_.empty()) return Status::Ok();  // silent: the connection stays until destroyed
  return SendAndWait(id->qp, cq_.get(), answer_, mr_->lkey, imm_);
}

bool KernelCopiesPinnedPagesAtFork() { return ibv_is_fork_initialized() == IBV_FORK_UNNEEDED; }

}  // namespace rdmalock::rdma_test
