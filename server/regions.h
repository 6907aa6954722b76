// lockd's regions and devices: the memory clients reach (the info page, the lock table, the
// session table: anonymous, zeroed, page-aligned mappings) and, per RDMA device with RC atomics,
// its protection domain, the three regions registered in it, and the completion channel and CQ
// its connections' handshakes complete on.
//
// Threading: built by Server::Create before the event loop starts; from then on the event loop
// owns the device objects (CQ polling, async events). The memory itself is read and written by
// the NIC at any time and by lockd's threads with relaxed 8-byte loads and stores only
// (server/words.h). Destruction order (one, written down in ~Regions): devices (CQs, MRs, PDs,
// channels), then the device list, then the memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rdma/verbs.h"
#include "rdmalock/proto/layout.h"
#include "rdmalock/status.h"
#include "server/config.h"

namespace rdmalock::lockd {

// Anonymous, zeroed, page-aligned memory released with munmap.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();
  static Result<std::unique_ptr<Mapping>> Create(size_t len);
  uint8_t* data() const { return static_cast<uint8_t*>(addr_); }
  size_t size() const { return len_; }

 private:
  void* addr_ = nullptr;
  size_t len_ = 0;
};

// The regions registered on one device.
struct Device {
  ibv_context* ctx = nullptr;  // owned by the device list
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

class Regions {
 public:
  // Maps the memory (zeroed), writes the probe word and `page` (before any NIC can reach them),
  // then opens every device with RC atomics and registers the regions on it.
  static Result<std::unique_ptr<Regions>> Create(const Config& config, const proto::InfoPage& page);
  ~Regions();
  Regions(const Regions&) = delete;
  Regions& operator=(const Regions&) = delete;

  uint8_t* info() const { return info_->data(); }
  uint8_t* locks() const { return locks_->data(); }
  uint8_t* sessions() const { return sessions_->data(); }
  size_t sessions_size() const { return sessions_->size(); }
  const std::vector<std::unique_ptr<Device>>& devices() const { return devices_; }
  Device* DeviceFor(ibv_context* ctx) const;

 private:
  Regions() = default;
  Status OpenDevices(const Config& config);

  // Declaration order is destruction order reversed (see ~Regions).
  std::unique_ptr<Mapping> info_, locks_, sessions_;
  rdma::DeviceList device_list_;
  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace rdmalock::lockd
