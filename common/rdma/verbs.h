// RAII for verbs and rdma_cm objects. One owning type per object: non-copyable, movable, released
// in the right call. Members of a class that holds several must be declared in construction order
// so they are destroyed in reverse: event channel, cm_id (with its QP), CQ, PD users, MR, memory.
//
// This header and its .cc, with client/src/verbs_memory.* and server/listener.*, are the only
// code in rdmalock that includes <infiniband/verbs.h> or <rdma/rdma_cma.h>.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rdmalock/status.h"

namespace rdmalock::rdma {

template <auto Fn>
struct Deleter {
  template <typename T>
  void operator()(T* p) const {
    if (p != nullptr) (void)Fn(p);
  }
};

using EventChannel = std::unique_ptr<rdma_event_channel, Deleter<rdma_destroy_event_channel>>;
using ProtectionDomain = std::unique_ptr<ibv_pd, Deleter<ibv_dealloc_pd>>;
using CompletionQueue = std::unique_ptr<ibv_cq, Deleter<ibv_destroy_cq>>;
using MemoryRegion = std::unique_ptr<ibv_mr, Deleter<ibv_dereg_mr>>;
using CmEvent = std::unique_ptr<rdma_cm_event, Deleter<rdma_ack_cm_event>>;
using CompChannel = std::unique_ptr<ibv_comp_channel, Deleter<ibv_destroy_comp_channel>>;
// ibv_dealloc_mw is static inline in verbs.h; a deleter needs a function with linkage.
int DeallocMw(ibv_mw* mw);
// A type-2 memory window: deallocating it invalidates its rkey at once.
using MemoryWindow = std::unique_ptr<ibv_mw, Deleter<DeallocMw>>;

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
  // Moves the QP to ERR so that nothing more executes on it; outstanding work flushes.
  void FenceQp();
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

// Connects an RC QP to `host:port` with `private_data`, waiting at most `timeout` for each step.
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
Status ExchangeControl(ActiveConnection* c, std::span<const uint8_t> msg, uint32_t imm,
                       std::chrono::milliseconds timeout, std::vector<uint8_t>* reply,
                       uint32_t* reply_imm);

}  // namespace rdmalock::rdma
