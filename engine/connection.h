// One connection to lockd as the SDK uses it: a channel of remote-memory operations together
// with what lockd's handshake answered. Two kinds: VerbsMemory (an RC QP over rdma_cm) and, in
// host tests, InProcessMemory with a test lockd (tests/support/fake_lockd.h). The SDK makes
// every connection through one Connector, so that its session logic (joins, reconnects, the
// keeper, the reaper, OnLost) runs on the host without RDMA (issue 16).
// Thread-safety: as RemoteMemory (one thread at a time), except Shutdown().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/remote_memory.h"
#include "rdmalock/proto/handshake.h"

namespace rdmalock {

struct ChannelParams {
  std::string host;
  uint16_t port = 7471;
  std::chrono::milliseconds connect_timeout{5000};
  std::string client_name;
  uint32_t flags = 0;
  uint64_t join_session = 0;  // with proto::kFlagJoin
  uint64_t join_key = 0;
  // The shared key lockd authenticates clients with ("": none; then lockd must require none).
  std::string auth_key;
};

class Connection : public RemoteMemory {
 public:
  // The handshake's answer: the session, its record, the regions, lockd's parameters.
  virtual const proto::AcceptReply& reply() const = 0;
  // Fails if lockd disconnected this channel or it broke.
  virtual Status CheckConnection() = 0;
  // Fences the channel and disconnects; later calls fail. Safe from any thread (that thread's
  // pending operation then fails).
  virtual void Shutdown() = 0;
  // When the connection attempt began: lockd answered the handshake after it.
  virtual std::chrono::steady_clock::time_point connect_started() const = 0;
};

// Makes a connection: connects, completes the handshake. A refusal sets *reason (when given),
// and lockd's retry-after sets *retry_after_ms (when given).
using Connector = std::function<Result<std::unique_ptr<Connection>>(
    const ChannelParams& params, uint32_t* retry_after_ms, proto::RejectReason* reason)>;

}  // namespace rdmalock
