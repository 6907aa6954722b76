// Test doubles that speak verbs and rdma_cm by hand: the only test code that makes raw ibv_ or
// rdma_ calls (everything else goes through the SDK, VerbsMemory or common/rdma's helpers).
//
// Why a test needs raw verbs: these peers do what the SDK and common/rdma are written never to
// do, so they cannot be built from them.
//   - HalfOpenClient stops a handshake half-way: it sends a valid connect request with no QP
//     behind it, takes lockd's accept and never completes the connection, so lockd must drop a
//     session that never became established (and count handshakes in progress).
//   - MemoryWindowHog opens the RDMA device directly and takes every memory window it has left,
//     so that lockd's next allocation fails for want of a device resource.
//   - UnreceivingPeer stands in for lockd and answers a client's hello without ever posting a
//     receive for it, so the hello's SEND is never acknowledged: what a lost acknowledgement
//     looks like to the client, made certain.
//   - KernelCopiesPinnedPagesAtFork asks libibverbs whether the kernel copies DMA-pinned pages
//     for a forked child (the SDK's fork() promise relies on it: docs/sdk.md).
// They use common/rdma/verbs.h's RAII types (EventChannel, CmId, ProtectionDomain,
// MemoryWindow) wherever one exists, and local ones (device list, device context) where not.
//
// Threads: each object is used by the test thread that made it; REQUIRE fails the test on any
// setup error.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/rdma/verbs.h"
#include "rdmalock/proto/handshake.h"

namespace rdmalock::rdma_test {

// A client that sends a valid connect request and never completes the handshake: it asks
// rdma_cm to connect without a QP, receives lockd's accept (with the rkeys) and never calls
// rdma_establish, so lockd never sees the connection established.
// With a session and its join key, it asks to join that session (a thread of it), and lockd
// may refuse it: rejected() then says why (kNone: accepted).
class HalfOpenClient {
 public:
  HalfOpenClient(const std::string& ip, uint16_t port, uint64_t join_session = 0,
                 uint64_t join_key = 0);
  proto::RejectReason rejected() const { return rejected_; }
  HalfOpenClient(const HalfOpenClient&) = delete;
  HalfOpenClient& operator=(const HalfOpenClient&) = delete;

 private:
  // Declared in construction order: the id is destroyed before its channel.
  rdma::EventChannel ch_;
  rdma::CmId id_;
  proto::RejectReason rejected_ = proto::RejectReason::kNone;
};

// A client that connects as a new session, sends a valid hello (no key: for a lockd that
// requires none) and never posts a receive: lockd admits it, and its Welcome meets RNR NAKs,
// retried without end (rnr_retry 7), so it is never delivered. Or lockd refuses the connect
// request: rejected() then says why (kNone: accepted).
class DeafClient {
 public:
  DeafClient(const std::string& ip, uint16_t port, const std::string& name);
  proto::RejectReason rejected() const { return rejected_; }
  DeafClient(const DeafClient&) = delete;
  DeafClient& operator=(const DeafClient&) = delete;

 private:
  // Declared so that the id (and its QP) is destroyed first, then the hello's MR, the CQ, the
  // PD, the channel.
  rdma::EventChannel ch_;
  rdma::ProtectionDomain pd_;
  rdma::CompletionQueue cq_;
  std::vector<uint8_t> hello_;
  rdma::MemoryRegion mr_;
  rdma::CmId id_;
  proto::RejectReason rejected_ = proto::RejectReason::kNone;
};

// Takes every memory window the RDMA device has left (lockd runs on the same device, in another
// process; rdma_rxe's windows come from one pool per device), so that lockd's next allocation
// fails; gives them back when destroyed.
class MemoryWindowHog {
 public:
  MemoryWindowHog();
  ~MemoryWindowHog() { Free(); }
  // Gives the windows back: windows, then the PD, then the device.
  void Free();
  size_t taken() const { return mws_.size(); }
  MemoryWindowHog(const MemoryWindowHog&) = delete;
  MemoryWindowHog& operator=(const MemoryWindowHog&) = delete;

 private:
  using DeviceContext = rdma::DeviceContext;
  // Declared in construction order, destroyed in reverse.
  DeviceContext ctx_;
  rdma::ProtectionDomain pd_;
  std::vector<rdma::MemoryWindow> mws_;
};

// Listens on `port` and takes one connection, on which it never posts a receive: the client's
// hello meets RNR NAKs, retried without end (the SDK's rnr_retry is 7), so its SEND never
// completes. Once the connection is established it SENDs `answer` with immediate data `imm`
// unasked, as lockd's answer to that hello; with no answer it sends nothing and keeps the
// connection until destroyed (a lockd that accepted and went silent). It accepts `accept_after`
// the connect request came, with `accept_data` as the accept's private data (lockd's challenge).
// Threads: the constructor listens on the caller's thread and starts the serving thread, which
// alone touches the connection's objects until Wait (or the destructor) joins it.
class UnreceivingPeer {
 public:
  UnreceivingPeer(const std::string& ip, uint16_t port, uint32_t imm,
                  std::span<const uint8_t> answer,
                  std::chrono::milliseconds accept_after = std::chrono::milliseconds(0),
                  std::span<const uint8_t> accept_data = {});
  ~UnreceivingPeer();
  // Joins the serving thread: ok once the answer was delivered (its SEND completed).
  Status Wait();
  UnreceivingPeer(const UnreceivingPeer&) = delete;
  UnreceivingPeer& operator=(const UnreceivingPeer&) = delete;

 private:
  Status Serve();
  const uint32_t imm_;
  std::vector<uint8_t> answer_;
  const std::chrono::milliseconds accept_after_;
  std::vector<uint8_t> accept_data_;
  // Declared in construction order, destroyed in reverse: the connection (and its QP) before
  // the MR, CQ and PD made for it, the listener before the channel.
  rdma::EventChannel ch_;
  rdma::CmId listener_;
  rdma::ProtectionDomain pd_;
  rdma::CompletionQueue cq_;
  rdma::MemoryRegion mr_;
  rdma::CmId conn_;
  std::thread thread_;
  Status served_;  // Serve's result: written by the serving thread, read after the join
};

// Whether this kernel copies DMA-pinned pages for a forked child (ibv_is_fork_initialized()
// says IBV_FORK_UNNEEDED), rather than leaving them copy-on-write for parent and child alike.
bool KernelCopiesPinnedPagesAtFork();

}  // namespace rdmalock::rdma_test
