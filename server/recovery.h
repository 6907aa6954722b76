// Recovery: the worker thread that frees ended sessions' recorded requests in the lock table,
// through lockd's loopback connection to its own NIC (never with CPU stores: a CPU store racing
// a NIC atomic on one word is not atomic).
//
// Threading: one worker thread, started by Start, owns the loopback connection and the lock
// engine from then on. The only entry from other threads is Enqueue (the event loop hands it an
// ended session's requests). Start is lockd's main thread's (at start-up, while the event loop
// already runs); Stop and DropLoopback are the event loop's as it ends, or the destructor's.
// mu_ guards the queue and the stop flag, and orders Start against Stop and DropLoopback: a
// Start after Stop refuses, so the worker's thread and connection are never written by two
// threads at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/sync/mutex.h"
#include "engine/lock_engine.h"
#include "engine/verbs_memory.h"
#include "server/metrics.h"

namespace rdmalock::lockd {

// What lockd frees for an ended session.
struct RecoveryJob {
  uint64_t session_id = 0;
  std::string who;
  std::string why;
  std::chrono::steady_clock::time_point not_before;  // later for sessions that may still live
  std::chrono::steady_clock::time_point ended;
  std::vector<ReapState> items;
  uint32_t released = 0, already_done = 0, recovered = 0, gave_up = 0;
};

class Recovery {
 public:
  using Clock = std::chrono::steady_clock;
  // Connects (again) to this lockd through its own NIC; the event loop runs on its own thread.
  using Connect =
      std::function<Result<std::unique_ptr<VerbsMemory>>(std::chrono::milliseconds timeout)>;

  // `counters` outlives this object.
  Recovery(EngineParams params, Counters* counters, Connect connect);
  ~Recovery();  // Stop()
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  // Starts the worker over `loopback` (the connection lockd's start-up probed); kConnection once
  // Stop has run (the event loop ended meanwhile), and the connection is dropped.
  Status Start(std::unique_ptr<VerbsMemory> loopback) EXCLUDES(mu_);
  // Hands a job to the worker. Any thread. Jobs queued before Start wait for it.
  void Enqueue(RecoveryJob job) EXCLUDES(mu_);
  // Stops the worker and joins it; the loopback connection stays until DropLoopback.
  void Stop() EXCLUDES(mu_);
  // After Stop: closes the loopback connection.
  void DropLoopback() EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  // Constant after construction.
  const EngineParams params_;
  Counters* const counters_;
  const Connect connect_;

  // The worker's own (before Start and after Stop: written under mu_ by Start, Stop and
  // DropLoopback, which stop_ keeps apart from one another and from the worker).
  std::unique_ptr<LockEngine> engine_;
  std::unique_ptr<VerbsMemory> loopback_;
  std::thread thread_;

  Mutex mu_;
  CondVar cv_;
  std::deque<RecoveryJob> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
};

}  // namespace rdmalock::lockd
