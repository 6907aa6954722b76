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
// They use common/rdma/verbs.h's RAII types (EventChannel, CmId, ProtectionDomain,
// MemoryWindow) wherever one exists, and local ones (device list, device context) where not.
//
// Threads: each object is used by the test thread that made it; REQUIRE fails the test on any
// setup error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rdma/verbs.h"

namespace rdmalock::rdma_test {

// A client that sends a valid connect request and never completes the handshake: it asks
// rdma_cm to connect without a QP, receives lockd's accept (with the rkeys) and never calls
// rdma_establish, so lockd never sees the connection established.
class HalfOpenClient {
 public:
  HalfOpenClient(const std::string& ip, uint16_t port);
  HalfOpenClient(const HalfOpenClient&) = delete;
  HalfOpenClient& operator=(const HalfOpenClient&) = delete;

 private:
  void Expect(rdma_cm_event_type want);
  // Declared in construction order: the id is destroyed before its channel.
  rdma::EventChannel ch_;
  rdma::CmId id_;
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

}  // namespace rdmalock::rdma_test
