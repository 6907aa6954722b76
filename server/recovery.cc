#include "server/recovery.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "server/words.h"

namespace rdmalock::lockd {

Recovery::Recovery(EngineParams params, Counters* counters, Connect connect)
    : params_(params), counters_(counters), connect_(std::move(connect)) {}

Recovery::~Recovery() { Stop(); }

Status Recovery::Start(std::unique_ptr<VerbsMemory> loopback) {
  MutexLock lock(&mu_);
  // The event loop ended (and stopped the worker) before lockd's start-up got here: a worker
  // started now would never be joined by it, and race its DropLoopback (found by review).
  if (stop_) return Error(ErrorCode::kConnection, "lockd is stopping: recovery not started");
  loopback_ = std::move(loopback);
  engine_ = std::make_unique<LockEngine>(params_, nullptr);
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void Recovery::Enqueue(RecoveryJob job) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(job));
  counters_->recovery_queue.fetch_add(1, std::memory_order_relaxed);
  cv_.SignalAll();
}

void Recovery::Stop() {
  std::thread worker;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    worker = std::move(thread_);
  }
  cv_.SignalAll();
  if (worker.joinable()) worker.join();
}

void Recovery::DropLoopback() {
  MutexLock lock(&mu_);
  loopback_.reset();
}

void Recovery::Loop() {
  std::vector<RecoveryJob> jobs;
  for (;;) {
    {
      MutexLock lock(&mu_);
      auto wake = Clock::time_point::max();
      bool ready = false;
      for (const auto& j : jobs) {
        if (j.not_before <= Clock::now()) ready = true;
        wake = std::min(wake, j.not_before);
      }
      auto woken = [&] {
        mu_.AssertHeld();
        return stop_ || !queue_.empty();
      };
      if (!ready) {
        if (wake == Clock::time_point::max()) {
          cv_.Wait(lock, woken);
        } else {
          (void)cv_.WaitUntil(lock, wake, woken);
        }
      }
      if (stop_) return;
      while (!queue_.empty()) {
        jobs.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (!loopback_) {  // lost: connect again (the event loop runs on its own thread)
      auto lb = connect_(std::chrono::milliseconds(2000));
      if (lb.ok()) {
        loopback_ = std::move(lb).value();
      } else {
        spdlog::error("recovery cannot proceed: {}; retrying in 1 s", lb.status().ToString());
        MutexLock lock(&mu_);
        (void)cv_.WaitFor(lock, std::chrono::seconds(1), [&] {
          mu_.AssertHeld();
          return stop_;
        });
        continue;
      }
    }
    bool pending = false;
    for (auto& j : jobs) {
      if (j.not_before > Clock::now()) continue;
      for (auto& r : j.items) {
        if (r.outcome != ReapState::Outcome::kPending) continue;
        auto done = engine_->Reap(*loopback_, r);
        if (!done.ok()) {
          spdlog::error("recovery of {}: {} (lockd's loopback connection failed; reconnecting)",
                        j.who, done.status().ToString());
          loopback_.reset();
          break;
        }
        if (!*done) pending = true;
      }
      if (!loopback_) break;
    }
    // Report and drop finished jobs.
    for (auto it = jobs.begin(); it != jobs.end();) {
      bool finished = true;
      RecoveryJob& j = *it;
      j.released = j.already_done = j.recovered = j.gave_up = 0;
      for (const auto& r : j.items) {
        switch (r.outcome) {
          case ReapState::Outcome::kPending:
            finished = false;
            break;
          case ReapState::Outcome::kReleased:
            ++j.released;
            break;
          case ReapState::Outcome::kAlreadyDone:
            ++j.already_done;
            break;
          case ReapState::Outcome::kRecovered:
            ++j.recovered;
            break;
          case ReapState::Outcome::kGaveUp:
            ++j.gave_up;
            break;
        }
      }
      if (!finished) {
        ++it;
        continue;
      }
      counters_->freed_released.fetch_add(j.released, std::memory_order_relaxed);
      counters_->freed_done.fetch_add(j.already_done, std::memory_order_relaxed);
      counters_->freed_recovered.fetch_add(j.recovered, std::memory_order_relaxed);
      counters_->freed_gave_up.fetch_add(j.gave_up, std::memory_order_relaxed);
      counters_->recovery_queue.fetch_sub(1, std::memory_order_relaxed);
      spdlog::info(
          "recovered {}: {} lock(s) released for it, {} already released or recovered, {} "
          "freed by stall recovery, {} left to waiters; {:.1f} ms after it ended",
          j.who, j.released, j.already_done, j.recovered, j.gave_up, MsSince(j.ended));
      it = jobs.erase(it);
    }
    if (pending) {
      std::this_thread::sleep_for(std::max<std::chrono::nanoseconds>(
          loopback_ ? loopback_->round_trip() : std::chrono::milliseconds(1),
          std::chrono::microseconds(100)));
    }
  }
}

}  // namespace rdmalock::lockd
