// Breaks each rule of the thread-safety analysis once: tests/thread-safety/check.sh requires clang
// to refuse every one, so the stage cannot pass because the analysis is off. Never built otherwise.
#include "common/sync/mutex.h"

namespace {

class Counter {
 public:
  void AddLocked() REQUIRES(mu_) { ++count_; }
  void Add() {
    AddLocked();  // requires holding mutex 'mu_' exclusively
  }
  int Peek() { return count_; }  // reading variable 'count_' requires holding mutex 'mu_'
  void Twice() {
    mu_.Unlock();  // releasing mutex 'mu_' that was not held
  }
  void Excluded() EXCLUDES(mu_);
  void Call() {
    rdmalock::MutexLock l(&mu_);
    Excluded();  // cannot call function 'Excluded' while mutex 'mu_' is held
  }

 private:
  rdmalock::Mutex mu_;
  int count_ GUARDED_BY(mu_) = 0;
};

void Counter::Excluded() {
  rdmalock::MutexLock l(&mu_);
  AddLocked();
}

}  // namespace
