// The narrow interface the lock protocol engine runs on: one-sided operations on lockd's regions,
// posted in batches on one channel and completed in order. Two implementations: the verbs backend
// (an RC QP; client/src/verbs_memory.*) and the in-process backend for host tests
// (client/src/inproc_memory.*).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>

#include "rdmalock/status.h"

namespace rdmalock {

using Clock = std::chrono::steady_clock;

enum class RegionId : uint8_t { kInfo = 0, kLocks = 1, kSessions = 2 };

struct RemoteOp {
  enum class Kind : uint8_t { kFetchAdd, kCompareSwap, kRead, kWrite };

  Kind kind = Kind::kRead;
  RegionId region = RegionId::kLocks;
  // READ and WRITE: 8 or 16 bytes (a READ `into`: up to budget::kMaxBlockRead). Atomics: 8.
  uint32_t length = 8;
  uint64_t offset = 0;          // byte offset in the region; 8-byte aligned
  uint64_t operand = 0;         // FA: the addend. CAS: the compare value. WRITE: the first word.
  uint64_t swap = 0;            // CAS: the swap value. WRITE: the second word.
  uint64_t result[2] = {0, 0};  // FA and CAS: the old value in result[0]. READ: the data.
  // A READ of more than 16 bytes (a multiple of 8, at most budget::kMaxBlockRead) lands here,
  // not in `result`: the caller's buffer of length / 8 words, valid until the batch completes.
  // Execute() only, and at most one such READ per batch (the verbs backend's bounce buffer).
  uint64_t* into = nullptr;

  static RemoteOp FetchAdd(RegionId r, uint64_t off, uint64_t add) {
    RemoteOp op;
    op.kind = Kind::kFetchAdd, op.region = r, op.offset = off, op.operand = add;
    return op;
  }
  static RemoteOp CompareSwap(RegionId r, uint64_t off, uint64_t compare, uint64_t swap) {
    RemoteOp op;
    op.kind = Kind::kCompareSwap, op.region = r, op.offset = off, op.operand = compare,
    op.swap = swap;
    return op;
  }
  static RemoteOp Read(RegionId r, uint64_t off, uint32_t len) {
    RemoteOp op;
    op.kind = Kind::kRead, op.region = r, op.offset = off, op.length = len;
    return op;
  }
  static RemoteOp ReadInto(RegionId r, uint64_t off, uint32_t len, uint64_t* into) {
    RemoteOp op = Read(r, off, len);
    op.into = into;
    return op;
  }
  static RemoteOp Write(RegionId r, uint64_t off, uint64_t w0) {
    RemoteOp op;
    op.kind = Kind::kWrite, op.region = r, op.offset = off, op.operand = w0;
    return op;
  }
  static RemoteOp Write16(RegionId r, uint64_t off, uint64_t w0, uint64_t w1) {
    RemoteOp op;
    op.kind = Kind::kWrite, op.region = r, op.offset = off, op.operand = w0, op.swap = w1,
    op.length = 16;
    return op;
  }
};

// A counter with one writing thread that any thread may read (relaxed; no lock-prefixed add).
class Counter {
 public:
  void operator++() { Add(1); }
  void Add(uint64_t n) {
    v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint64_t get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Counts of operations issued through one channel.
struct OpCounters {
  Counter fetch_add;
  Counter compare_swap;
  Counter read;
  Counter write;
  Counter batches;
  uint64_t Total() const { return fetch_add.get() + compare_swap.get() + read.get() + write.get(); }
};

// One channel of remote-memory operations (one QP). Not thread-safe: a channel belongs to one
// thread at a time.
class RemoteMemory {
 public:
  virtual ~RemoteMemory() = default;

  // Posts `ops` together (one doorbell where the transport allows) and returns once all have
  // completed; they execute in order at the target. On error the channel is unusable.
  Status Execute(std::span<RemoteOp> ops);
  Status Execute(RemoteOp& op) { return Execute(std::span<RemoteOp>(&op, 1)); }

  // Posts WRITEs without waiting for them: they land before anything posted later on this
  // channel, and a failure surfaces at the next Execute(). Only kWrite ops.
  Status Post(std::span<RemoteOp> ops);
  Status Post(RemoteOp& op) { return Post(std::span<RemoteOp>(&op, 1)); }

  // Posts `ops` and returns without waiting: they land in order, before anything posted later on
  // this channel. One started batch at a time. `ops` must stay valid until Await() (or a later
  // Execute(), which completes it first) fills in their results. A failure surfaces at Await()
  // and at every later call.
  Status Start(std::span<RemoteOp> ops);
  // Waits for the started batch, if any, to complete. Returns at once when it already has.
  Status Await();
  bool started() const { return started_; }

  // Reads `dst.size()` bytes from a region (monitoring and the info page; not the lock path).
  virtual Status ReadBytes(RegionId region, uint64_t offset, std::span<uint8_t> dst) = 0;

  const OpCounters& counters() const { return counters_; }
  // When the last Execute() was posted and when it completed (steady clock). The engine takes a
  // lease's start from the first, and the SDK a grant's latency from the second, so that the lock
  // path reads the clock no more often than the round-trip estimate needs (issue 19).
  Clock::time_point last_issued() const { return last_issued_; }
  Clock::time_point last_completed() const { return last_completed_; }
  // Smoothed time of a batch, used to size poll intervals. Starts at 20 us.
  std::chrono::nanoseconds round_trip() const { return std::max(round_trip_, min_round_trip_); }
  // A floor for round_trip(): the in-process backend answers in nanoseconds, and tests use this
  // to poll at a network's cadence instead of spinning.
  void set_min_round_trip(std::chrono::nanoseconds d) { min_round_trip_ = d; }
  // The waiting engine's estimate of one lock handover on `slot`, kept with the channel (a thread
  // that waits on a hot lock tends to wait on it again). Zero when unknown.
  std::chrono::nanoseconds handover_estimate(uint64_t slot) const {
    return slot == handover_slot_ ? handover_ : std::chrono::nanoseconds::zero();
  }
  void set_handover_estimate(uint64_t slot, std::chrono::nanoseconds d) {
    handover_slot_ = slot;
    handover_ = d;
  }

 protected:
  virtual Status DoExecute(std::span<RemoteOp> ops) = 0;
  // Default: executes and waits.
  virtual Status DoPost(std::span<RemoteOp> ops) { return DoExecute(ops); }
  // Default: executes at once (DoAwait then has nothing to wait for).
  virtual Status DoStart(std::span<RemoteOp> ops) { return DoExecute(ops); }
  virtual Status DoAwait() { return Status::Ok(); }
  // For backends: the started batch completed (its results are in place).
  void StartedDone() { started_ = false; }
  // For test backends: runs in Execute() before the issue time is read, as a thread descheduled
  // just before posting would be (the in-process backend's hooks run after it).
  void set_before_issue(std::function<void()> fn) { before_issue_ = std::move(fn); }

 private:
  void Count(std::span<const RemoteOp> ops);

  OpCounters counters_;
  bool started_ = false;
  std::chrono::nanoseconds round_trip_{20'000};
  Clock::time_point last_issued_{}, last_completed_{};
  std::chrono::nanoseconds min_round_trip_{0};
  uint64_t handover_slot_ = ~uint64_t{0};
  std::chrono::nanoseconds handover_{0};
  std::function<void()> before_issue_;  // tests only (set_before_issue)
};

}  // namespace rdmalock
