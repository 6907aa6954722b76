#include "engine/fork_guard.h"

#include <pthread.h>

#include <mutex>
#include <new>
#include <vector>

#include "common/sync/mutex.h"

namespace rdmalock::fork_guard {

namespace internal {
std::atomic<uint64_t> generation{0};
}  // namespace internal

namespace {

// Never destroyed (a child's exit must not run destructors of what it buried), and reachable
// from here, so leak checkers do not report them.
struct Graveyard {
  Mutex mu;  // held across fork() by the prepare handler
  std::vector<std::shared_ptr<void>> buried GUARDED_BY(mu);
};
Graveyard& graveyard() {
  static Graveyard* g = new Graveyard;
  return *g;
}

// The mutex is taken in one handler and released in another (across fork()), which the
// thread-safety analysis cannot follow.
void Prepare() NO_THREAD_SAFETY_ANALYSIS { graveyard().mu.Lock(); }
void Parent() NO_THREAD_SAFETY_ANALYSIS { graveyard().mu.Unlock(); }
void Child() NO_THREAD_SAFETY_ANALYSIS {
  internal::generation.fetch_add(1, std::memory_order_relaxed);
  graveyard().mu.Unlock();
}

}  // namespace

void Install() {
  static std::once_flag once;
  std::call_once(once, [] {
    (void)graveyard();
    (void)pthread_atfork(Prepare, Parent, Child);
  });
}

void Bury(std::shared_ptr<void> inherited) {
  Graveyard& g = graveyard();
  MutexLock lk(&g.mu);
  try {
    g.buried.push_back(std::move(inherited));
  } catch (...) {
    (void)new (std::nothrow) std::shared_ptr<void>(std::move(inherited));  // leaked all the same
  }
}

}  // namespace rdmalock::fork_guard
