// RAII for verbs and rdma_cm objects. One owning type per object: non-copyable, movable, released
// in the right call; a release that fails is reported (ReportTeardownFailure), not ignored.
//
// The one teardown order (members of a class that holds several are declared in construction
// order, so they are destroyed in reverse):
//   1. memory windows (a window bound to a QP holds a reference on it),
//   2. the cm_id with its QP (CmId: the QP moved to ERR, destroyed, then the id) - a connect
//      request's id after its event is acknowledged (CmEvent first),
//   3. the MRs (control buffers, then the regions), then the CQs and completion channels,
//   4. the PDs, then the device list (the contexts), then the event channel,
//   5. the memory the MRs covered.
//
// This header and its .cc, with engine/verbs_memory.*, are the only code in rdmalock that calls
// verbs or rdma_cm (lockd's server/ uses only what is declared here).
// Threading: the types are not thread-safe; each object is used by the thread that owns it.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "rdmalock/status.h"

namespace rdmalock::rdma {

// A deleter's failing return code is reported (a destroy that fails leaks a device resource, or
// tells of a teardown order broken: a PD with MRs left, a CQ with QPs left), never ignored.
// Reports go to the hook set with SetTeardownReporter (lockd logs them), else to stderr.
using TeardownReporter = void (*)(const char* call, int rc);
void SetTeardownReporter(TeardownReporter r);
void ReportTeardownFailure(const char* call, int rc);

template <auto Fn>
struct Deleter {
  static const char* Name();
  template <typename T>
  void operator()(T* p) const {
    if (p == nullptr) return;
    if constexpr (std::is_void_v<decltype(Fn(p))>) {
      Fn(p);
    } else if (const int rc = Fn(p); rc != 0) {
      ReportTeardownFailure(Name(), rc);
    }
  }
};

using EventChannel = std::unique_ptr<rdma_event_channel, Deleter<rdma_destroy_event_channel>>;
using ProtectionDomain = std::unique_ptr<ibv_pd, Deleter<ibv_dealloc_pd>>;
using CompletionQueue = std::unique_ptr<ibv_cq, Deleter<ibv_destroy_cq>>;
using MemoryRegion = std::unique_ptr<ibv_mr, Deleter<ibv_dereg_mr>>;
using CmEvent = std::unique_ptr<rdma_cm_event, Deleter<rdma_ack_cm_event>>;
using CompChannel = std::unique_ptr<ibv_comp_channel, Deleter<ibv_destroy_comp_channel>>;
// A device opened on its own (ibv_open_device), outside a DeviceList.
using DeviceContext = std::unique_ptr<ibv_context, Deleter<ibv_close_device>>;
// ibv_dealloc_mw is static inline in verbs.h; a deleter needs a function with linkage.
int DeallocMw(ibv_mw* mw);
// A type-2 memory window: deallocating it invalidates its rkey at once.
using MemoryWindow = std::unique_ptr<ibv_mw, Deleter<DeallocMw>>;
// Each deleter names its call in a report (defined in verbs.cc).
template <>
const char* Deleter<rdma_destroy_event_channel>::Name();
template <>
const char* Deleter<ibv_dealloc_pd>::Name();
template <>
const char* Deleter<ibv_destroy_cq>::Name();
template <>
const char* Deleter<ibv_dereg_mr>::Name();
template <>
const char* Deleter<rdma_ack_cm_event>::Name();
template <>
const char* Deleter<ibv_destroy_comp_channel>::Name();
template <>
const char* Deleter<DeallocMw>::Name();
template <>
const char* Deleter<ibv_close_device>::Name();

// An rdma_cm id and the QP created on it (if any). Destruction moves the QP to ERR, destroys it,
// then destroys the id.
class CmId {
 public:
  CmId() = default;
  explicit CmId(rdma_cm_id* id) : id_(id) {}
  CmId(CmId&& o) noexcept : id_(std::exchange(o.id_, nullptr)) {}
  CmId& operator=(CmId&& o) noexcept {
    if (this != &o) {
      Reset();
      id_ = std::exchange(o.id_, nullptr);
    }
    return *this;
  }
  CmId(const CmId&) = delete;
  CmId& operator=(const CmId&) = delete;
  ~CmId() { Reset(); }

  rdma_cm_id* get() const { return id_; }
  rdma_cm_id* operator->() const { return id_; }
  explicit operator bool() const { return id_ != nullptr; }
  // Gives up ownership (the caller destroys it).
  rdma_cm_id* release() { return std::exchange(id_, nullptr); }
  // Moves the QP to ERR so that nothing more executes on it; outstanding work flushes. A failure
  // is reported (ReportTeardownFailure) and returned: the QP may then still execute work until
  // it is destroyed, so a caller that relies on the fence must not act as if fenced.
  Status FenceQp();
  // Sends a disconnect request (the peer sees DISCONNECTED); a failure is not an error here.
  void Disconnect();
  void Reset();

 private:
  rdma_cm_id* id_ = nullptr;
};

// A file descriptor (an eventfd, a socket): closed once, by its owner.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void Reset();

 private:
  int fd_ = -1;
};

// The RDMA devices rdma_get_devices lists; their contexts stay open as long as the list.
class DeviceList {
 public:
  DeviceList() = default;
  DeviceList(DeviceList&& o) noexcept
      : list_(std::exchange(o.list_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceList& operator=(DeviceList&& o) noexcept {
    if (this != &o) {
      Reset();
      list_ = std::exchange(o.list_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
  ~DeviceList() { Reset(); }

  // An empty list (no device) is not an error here: the caller says what to do about it.
  static DeviceList Get();
  int size() const { return n_; }
  ibv_context* operator[](int i) const { return list_[i]; }
  void Reset();

 private:
  ibv_context** list_ = nullptr;
  int n_ = 0;
};

// Makes `fd` (a completion channel's, a device's async events', an event channel's)
// non-blocking; `what` names it in the error.
Status SetNonBlocking(int fd, const std::string& what);

// Binds `id` to `addr` and listens with `backlog`; `what` ("ADDRESS:PORT") names it in errors.
Status Listen(rdma_cm_id* id, sockaddr* addr, int backlog, const std::string& what);

// Polls `cq` until it is empty, dropping the completions (flushed work requests at teardown).
void DrainCq(ibv_cq* cq);

// Whether the QP on `id` (if any) is in the error state now (a query: a system call).
bool QpInError(rdma_cm_id* id);

// ---- the passive side's calls (lockd), so that no file outside common/rdma calls verbs or
// rdma_cm directly.

// The next rdma_cm event on a non-blocking channel, or an empty CmEvent if none is queued.
Result<CmEvent> TryGetEvent(rdma_event_channel* ch);
const char* EventName(rdma_cm_event_type e);
const sockaddr* PeerAddr(rdma_cm_id* id);
const sockaddr* LocalAddr(rdma_cm_id* id);
// Accepts a connection request with `param` / rejects it with `private_data`.
Status Accept(rdma_cm_id* id, rdma_conn_param* param);
Status Reject(rdma_cm_id* id, std::span<const uint8_t> private_data);

// Posts one receive of `len` bytes at `addr` (registered as `lkey`).
Status PostRecv(ibv_qp* qp, uint64_t wr_id, void* addr, uint32_t len, uint32_t lkey);
// Posts a chain of send work requests.
Status PostSend(ibv_qp* qp, ibv_send_wr* first);
// The rkey a memory window's next bind gives it.
uint32_t NextRkey(uint32_t rkey);
const char* WcStatusName(ibv_wc_status s);
// Takes and acknowledges one completion-channel event, then re-arms `cq` (before the caller
// polls, so a completion arriving after the last poll still wakes it); *rearmed says whether the
// re-arm worked. False if no event was queued.
bool TakeCqEvent(ibv_comp_channel* ch, ibv_cq* cq, Status* rearmed);
// Asks for a completion event on `cq`'s next completion.
Status ArmCq(ibv_cq* cq);
// Up to wc.size() completions; 0 when empty (an error counts as empty).
int PollCq(ibv_cq* cq, std::span<ibv_wc> wc);

// A device's asynchronous event, taken and acknowledged at once. qp is set for the QP events
// that mean the QP broke (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR).
struct AsyncEvent {
  ibv_event_type type{};
  ibv_qp* qp = nullptr;
};
bool TakeAsyncEvent(ibv_context* ctx, AsyncEvent* out);
const char* AsyncEventName(ibv_event_type t);
std::string DeviceName(ibv_context* ctx);
Result<ibv_device_attr> QueryDevice(ibv_context* ctx, const std::string& name);

// Turns an errno from a failed verbs/rdma_cm call into a Status naming the call.
Status ErrnoStatus(ErrorCode code, const std::string& what, int err);

Result<EventChannel> CreateEventChannel();
Result<CmId> CreateId(rdma_event_channel* ch, void* context);
Result<ProtectionDomain> AllocPd(ibv_context* ctx);
Result<CompletionQueue> CreateCq(ibv_context* ctx, int depth, ibv_comp_channel* ch = nullptr);
Result<CompChannel> CreateCompChannel(ibv_context* ctx);
Result<MemoryWindow> AllocMw(ibv_pd* pd);  // type 2
Result<MemoryRegion> RegisterMr(ibv_pd* pd, void* addr, size_t len, int access);

// Waits for the next event on `ch` for at most `timeout` (the channel is made non-blocking).
Result<CmEvent> GetEvent(rdma_event_channel* ch, std::chrono::milliseconds timeout);

// Resolves `host:port` to a sockaddr for rdma_cm (IPv4 or IPv6, numeric or a name).
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
};
Result<SockAddr> ResolveAddress(const std::string& host, uint16_t port, bool passive);
std::string AddressToString(const sockaddr* sa);

// Queue sizes for an RC QP used for one-sided operations, capped by the device.
struct QpSizes {
  uint32_t send_depth = 64;
  uint32_t recv_depth = 1;
  uint32_t rd_atomic = 16;  // outstanding READs and atomics (initiator depth / responder res.)
  // Bytes a send WR may carry inline: asked for at creation, set to what the device granted
  // (0 where it allows none).
  uint32_t max_inline = 0;
};
Result<QpSizes> DeviceQpSizes(ibv_context* ctx, uint32_t want_send_depth);

// Creates an RC QP on `id` with both queues on `cq`. If the device refuses the inline size asked
// for, the QP is created without inline data; sizes->max_inline says what it got.
Status CreateRcQp(rdma_cm_id* id, ibv_pd* pd, ibv_cq* cq, QpSizes* sizes);

// The state an active-side connect leaves behind: who we reached and the accept private data.
struct ActiveConnection {
  // Destroyed in reverse order: the id (and its QP) before the control buffer's MR, the CQ and
  // the PD, the channel last.
  EventChannel channel;
  ProtectionDomain pd;
  CompletionQueue cq;
  std::vector<uint8_t> control;  // [0, n): the posted receive; [n, 2n): what ExchangeControl sends
  MemoryRegion control_mr;
  CmId id;
  std::vector<uint8_t> accept_data;
  QpSizes sizes;
  ~ActiveConnection();
  ActiveConnection() = default;
  ActiveConnection(ActiveConnection&&) = default;
  ActiveConnection& operator=(ActiveConnection&&) = default;
};

// Connects an RC QP to `host:port` with `private_data`, waiting at most `timeout` for all its steps
// together (address, route, the accept).
// A reject is returned as kRejected with the reject private data in `reject_data`.
// Before connecting it posts one receive of `control_bytes` for the peer's first control message.
Result<std::unique_ptr<ActiveConnection>> ConnectRc(const std::string& host, uint16_t port,
                                                    std::span<const uint8_t> private_data,
                                                    std::chrono::milliseconds timeout,
                                                    uint32_t send_depth, size_t control_bytes,
                                                    std::vector<uint8_t>* reject_data);

// On a connection from ConnectRc: SENDs `msg` with immediate data `imm`, then waits at most
// `timeout` for the peer's control message in the receive posted at connect. The message is
// returned in *reply with its immediate data in *reply_imm.
// A reply whose immediate data is `closing_imm` (lockd's refusal) is returned as soon as it
// arrives: the peer closes the connection after it, so our SEND's own completion is not awaited
// (were the SEND's acknowledgement lost, its retransmission would meet a QP already in error,
// and the caller would see a stall or a transport error instead of the refusal's reason). Any
// other reply also waits for the SEND's completion: the queue is used on, and its completions
// must all be accounted for.
Status ExchangeControl(ActiveConnection* c, std::span<const uint8_t> msg, uint32_t imm,
                       uint32_t closing_imm, std::chrono::milliseconds timeout,
                       std::vector<uint8_t>* reply, uint32_t* reply_imm);

}  // namespace rdmalock::rdma
