// The verbs backend of RemoteMemory: one RC QP connected to lockd with rdma_cm.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/budgets.h"
#include "engine/connection.h"
#include "rdmalock/proto/handshake.h"

namespace rdmalock {
namespace rdma {
struct ActiveConnection;
}

class VerbsMemory : public Connection {
 public:
  // Most operations one Execute() may carry (engine/budgets.h).
  static constexpr size_t kMaxBatch = budget::kMaxOpsPerDoorbell;

  // Connects, completes the handshake and checks the byte order of atomic replies.
  // A rejection in lockd's restart grace sets *retry_after_ms (when given) to lockd's estimate.
  // A refusal sets *reason (when given).
  static Result<std::unique_ptr<VerbsMemory>> Connect(const ChannelParams& params,
                                                      uint32_t* retry_after_ms = nullptr,
                                                      proto::RejectReason* reason = nullptr);
  ~VerbsMemory() override;
  VerbsMemory(const VerbsMemory&) = delete;
  VerbsMemory& operator=(const VerbsMemory&) = delete;

  const proto::AcceptReply& reply() const override { return reply_; }
  // When Connect() began: lockd's CPU answered the handshake after it, so lockd was alive (and
  // admitting clients, so serving) at some moment after this.
  std::chrono::steady_clock::time_point connect_started() const override {
    return connect_started_;
  }
  // For tests: address lockd's regions with the rkeys of `other` (another connection's reply),
  // as a client that kept them would.
  void UseRkeysOf(const proto::AcceptReply& other);
  // Bytes a WRITE may carry inline on this QP (0: the device allows none; WRITEs use buffers).
  uint32_t max_inline() const;
  Status ReadBytes(RegionId region, uint64_t offset, std::span<uint8_t> dst) override;
  // Fails if lockd disconnected this channel (an rdma_cm DISCONNECTED is pending) or it broke.
  Status CheckConnection() override;
  // Fences the QP and disconnects; later calls fail. Safe to call from another thread than the
  // channel's user (that thread's pending operation then fails).
  void Shutdown() override;

 protected:
  Status DoExecute(std::span<RemoteOp> ops) override;
  Status DoPost(std::span<RemoteOp> ops) override;
  Status DoStart(std::span<RemoteOp> ops) override;
  Status DoAwait() override;

 private:
  struct Impl;
  explicit VerbsMemory(std::unique_ptr<Impl> impl);
  Status ProbeByteOrder();

  std::unique_ptr<Impl> impl_;
  uint64_t fork_gen_ = 0;  // fork_guard::Generation() when made: a child's copy is inert
  proto::AcceptReply reply_;
  std::chrono::steady_clock::time_point connect_started_{};
};

// Decodes rdma_cm reject private data into a Status that names lockd's reason.
Status RejectStatus(const std::string& where, const std::vector<uint8_t>& data);
// True for a refusal that came without rdmalock's reply: nothing listens on the port (yet).
bool IsNotListening(const Status& st);

}  // namespace rdmalock
