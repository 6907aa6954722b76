#include "engine/fork_guard.h"

#include <pthread.h>

#include <mutex>
#include <new>
#include <vector>

namespace rdmalock::fork_guard {

namespace internal {
std::atomic<uint64_t> generation{0};
}  // namespace internal

namespace {

// Never destroyed (a child's exit must not run destructors of what it buried), and reachable
// from here, so leak checkers do not report them.
struct Graveyard {
  std::mutex mu;  // guards `buried`; held across fork() by the prepare handler
  std::vector<std::shared_ptr<void>> buried;
};
Graveyard& graveyard() {
  static Graveyard* g = new Graveyard;
  return *g;
}

void Prepare() { graveyard().mu.lock(); }
void Parent() { graveyard().mu.unlock(); }
void Child() {
  internal::generation.fetch_add(1, std::memory_order_relaxed);
  graveyard().mu.unlock();
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
  std::lock_guard lk(g.mu);
  try {
    g.buried.push_back(std::move(inherited));
  } catch (...) {
    (void)new (std::nothrow) std::shared_ptr<void>(std::move(inherited));  // leaked all the same
  }
}

}  // namespace rdmalock::fork_guard
