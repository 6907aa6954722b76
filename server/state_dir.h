// lockd's state directory: the epoch (bumped at every start; it leads every fencing token) and the
// running mark (there while lockd runs; found at start it means the last run did not stop
// cleanly). Both are written by one helper, WriteFileAtomically.
//
// Threading: plain functions with no shared state; lockd's main thread calls them before the
// server starts and after it stopped. Unit-tested on the host (tests/unit/state_dir_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "rdmalock/status.h"

namespace rdmalock::lockd {

// Writes `text` to `dir`/`name` so that a crash leaves the old contents or the new, never a mix or
// nothing: a temporary file, fsync'd, renamed over the file, then the directory fsync'd (without
// it the rename itself may be lost in a crash, and an epoch would be handed out twice).
Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           const std::string& text);

// The whole file, or nullopt when it does not exist. Any other failure is an error: an epoch
// file that exists but cannot be read must not be taken for a first start.
Result<std::optional<std::string>> ReadSmallFile(const std::string& path);

// The epoch after the one persisted in `state_dir` (1 with none), not yet written: lockd stores it
// (StoreEpoch) once its server is made, before it serves anyone, so that a start that fails
// before then (a port in use, no RDMA device) uses up no epoch (under systemd's restarts each did,
// towards the last one, 65,535). An empty state_dir, or an epoch file that exists but cannot be
// read, is an error: an epoch handed out twice would let fencing tokens go backwards.
Result<uint64_t> NextEpoch(const std::string& state_dir);
// Writes `epoch` to `state_dir` (atomically, fsync'd).
Status StoreEpoch(const std::string& state_dir, uint64_t epoch);
// NextEpoch, then StoreEpoch.
Result<uint64_t> BumpEpoch(const std::string& state_dir);

// One lockd per state_dir: an exclusive flock on `state_dir`/lock, held for lockd's life (the
// kernel lets go when lockd exits, however it exits). The file holds the holder's pid, for the
// refusal's message. Two lockds on one directory shared the running mark (the first's clean stop
// removed it, and a crash of the second then went unseen: no restart grace) and the epoch file.
// Owned by lockd's main thread; move-only.
class StateDirLock {
 public:
  // Creates `state_dir` if need be. kConfig naming the other lockd's pid when it is in use.
  static Result<StateDirLock> Acquire(const std::string& state_dir);
  StateDirLock(StateDirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  StateDirLock& operator=(StateDirLock&&) = delete;
  StateDirLock(const StateDirLock&) = delete;
  ~StateDirLock();

 private:
  explicit StateDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Marks lockd as running in `state_dir`; returns whether the previous run did not stop cleanly
// (its mark is still there), or true with no state_dir (nothing to tell).
Result<bool> MarkRunning(const std::string& state_dir);
// Removes the mark at a clean stop with no client connected.
void MarkStoppedCleanly(const std::string& state_dir);

}  // namespace rdmalock::lockd
