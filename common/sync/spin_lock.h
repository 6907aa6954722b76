// SpinLock: a mutual-exclusion lock for critical sections of a few instructions that never block
// (a list's links), where std::mutex's out-of-line lock and unlock cost more than the section
// itself. Taking a free one is one atomic exchange, giving it back one store. A waiter spins
// briefly, then yields its CPU between tries: a holder descheduled on a machine with few CPUs
// (the project's 2-core hosts, the VM) gets to run. Keep its sections short: never hold one
// across a call that can block or take another lock that waits.
// Thread-safety: any thread; the analysis treats it as a mutex (CAPABILITY). ThreadSanitizer sees
// the acquire/release ordering of the exchange and the store.
#pragma once

#include <atomic>
#include <thread>

#include "common/sync/thread_annotations.h"

namespace rdmalock {

class CAPABILITY("mutex") SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void Lock() ACQUIRE() {
    for (int tries = 0; held_.exchange(true, std::memory_order_acquire); ++tries) {
      // Wait for it to look free before trying the exchange again (no cache-line ping-pong).
      while (held_.load(std::memory_order_relaxed)) {
        if (++tries > kSpins) std::this_thread::yield();
      }
    }
  }
  void Unlock() RELEASE() { held_.store(false, std::memory_order_release); }

 private:
  static constexpr int kSpins = 64;  // then yield between looks
  std::atomic<bool> held_{false};
};

class SCOPED_CAPABILITY SpinLockGuard {
 public:
  explicit SpinLockGuard(SpinLock* l) ACQUIRE(l) : l_(l) { l_->Lock(); }
  ~SpinLockGuard() RELEASE() { l_->Unlock(); }
  SpinLockGuard(const SpinLockGuard&) = delete;
  SpinLockGuard& operator=(const SpinLockGuard&) = delete;

 private:
  SpinLock* const l_;
};

}  // namespace rdmalock
