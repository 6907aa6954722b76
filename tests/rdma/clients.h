// The clients an RDMA integration test drives besides its own Client: rdma_worker processes (and
// the file they report through), forked children, and threads that wait for a lock.
//
// Threads: the free functions run on the Catch2 test's thread (they REQUIRE). BackgroundLock and
// LockAndRelease each start one thread that only calls the Client it was given (thread-safe) and
// writes its own fields; the test's thread reads them after Join()/ok(), which join the thread.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "rdmalock/client.h"
#include "tests/rdma/lockd_fixture.h"
#include "tests/rdma/worker_shared.h"

namespace rdmalock::rdma_test {

// A file-backed WorkerShared that rdma_worker processes map too.
class SharedFile {
 public:
  SharedFile();
  WorkerShared* get() const { return shared_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  WorkerShared* shared_ = nullptr;
};

// Starts an rdma_worker process (exec'd: a fork of this process could not use rdma_cm).
pid_t Worker(const std::vector<std::string>& args);

// Runs `fn` in a forked child (which must not use rdma_cm itself); returns its pid.
template <typename Fn>
pid_t Spawn(Fn fn) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(fn());
  return pid;
}

// Starts a "hold" worker and waits until it holds the lock. `record`: with request records (so
// lockd can free the lock the moment the worker dies); without, only stall recovery can.
// `warm`: the worker takes and releases the lock once first, without fencing tokens, so that the
// held request's entry is tagged from the session's generation table (no READ of word1).
pid_t StartHolder(const Lockd& lockd, SharedFile& shf, const std::string& name, bool shared,
                  bool record = true, bool warm = false);

// Waits until `n` requests are queued on the slot (tickets issued minus released).
void WaitQueued(Client& c, uint64_t slot, uint32_t n);

// Takes a lock on a thread of its own; Join() waits for the outcome.
class BackgroundLock {
 public:
  BackgroundLock(Client& c, const std::string& name);
  ~BackgroundLock();
  Result<LockHandle>& Join();
  std::chrono::steady_clock::time_point granted_at() const { return granted_at_; }

 private:
  Result<LockHandle> result_ = Error(ErrorCode::kInternal, "not run");
  std::chrono::steady_clock::time_point granted_at_;
  std::thread thread_;
};

// A thread that waits for a lock and releases it at once; ok() once it did both.
class LockAndRelease {
 public:
  LockAndRelease(Client& c, const std::string& name);
  ~LockAndRelease();
  bool ok();

 private:
  bool ok_ = false;
  std::thread thread_;
};

}  // namespace rdmalock::rdma_test
