// The mutex, scoped lock and condition variable the project's code uses, annotated for clang's
// thread-safety analysis (common/sync/thread_annotations.h). std::mutex carries no annotations in
// libstdc++, so a field GUARDED_BY a std::mutex could not be checked; these wrap it one to one
// (no extra state, no extra cost) and keep TSan's view of it (it still sees std::mutex).
//
//   class Table {
//     Mutex mu_;
//     std::vector<int> rows_ GUARDED_BY(mu_);
//     void Add(int r) EXCLUDES(mu_) { MutexLock l(&mu_); rows_.push_back(r); }
//   };
//
// A condition variable's predicate runs with the mutex held, which the analysis cannot see through
// the standard library: a predicate that reads guarded fields starts with mu_.AssertHeld().
// Thread-safety: as std::mutex and std::condition_variable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "common/sync/thread_annotations.h"

namespace rdmalock {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  [[nodiscard]] bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds this mutex (a condition variable's predicate, a callback
  // documented to run under it). Checks nothing at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope; Unlock() and Lock() let a scope drop it around a slow call.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// A condition variable waited on with a MutexLock held (std::condition_variable underneath).
class CondVar {
 public:
  void Wait(MutexLock& lock) { cv_.wait(lock.lock_); }
  template <class Predicate>
  void Wait(MutexLock& lock, Predicate done) {
    cv_.wait(lock.lock_, std::move(done));
  }
  // False if `deadline` passed with `done` still false.
  template <class Clock, class Duration, class Predicate>
  bool WaitUntil(MutexLock& lock, const std::chrono::time_point<Clock, Duration>& deadline,
                 Predicate done) {
    return cv_.wait_until(lock.lock_, deadline, std::move(done));
  }
  template <class Rep, class Period, class Predicate>
  bool WaitFor(MutexLock& lock, const std::chrono::duration<Rep, Period>& timeout, Predicate done) {
    return cv_.wait_for(lock.lock_, timeout, std::move(done));
  }
  template <class Clock, class Duration>
  std::cv_status WaitUntil(MutexLock& lock,
                           const std::chrono::time_point<Clock, Duration>& deadline) {
    return cv_.wait_until(lock.lock_, deadline);
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace rdmalock
