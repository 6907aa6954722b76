// Bell: a 32-bit word one thread parks on (a Linux futex) and others ring. Unlike a condition
// variable it needs no mutex around the wake-up, and waking costs no access to the Bell's memory
// (Wake is the system call alone, on the word's address), so a ringer may wake it after the
// parked thread could have seen why and gone, with the Bell (on that thread's stack): a late
// wake-up of an address nobody waits on is a no-op, and one of a word reused since is a spurious
// wake-up its waiter tolerates, as every futex waiter does (glibc's mutex unlock does the same:
// its futex wake may follow the mutex's destruction, which POSIX allows right after an unlock).
//
//   parker, under its mutex:      seen = bell.Read(); ... unlock; bell.WaitUntil(seen, deadline);
//   ringer, under the same mutex: (decide) bell.Ring();   then, unlocked:  Bell::Wake(&bell);
//
// Ring while the Bell is certainly alive (the parker cannot leave without the mutex the ringer
// holds); Wake after. A Ring between the parker's Read and its wait makes the wait return at once,
// so no wake-up is lost.
// Thread-safety: any thread; Read, Ring and WaitUntil are atomic on the word.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <type_traits>

namespace rdmalock {

class Bell {
 public:
  // libstdc++'s steady_clock is CLOCK_MONOTONIC, the clock of FUTEX_WAIT_BITSET's deadline.
  using Clock = std::chrono::steady_clock;

  uint32_t Read() const { return word_.load(std::memory_order_acquire); }
  void Ring() { word_.fetch_add(1, std::memory_order_release); }
  // Wakes one thread parked on `bell` (rung before); nothing if `bell` is null. Touches no
  // memory of the Bell: it may run after the Bell's end.
  static void Wake(const Bell* bell) {
    if (bell == nullptr) return;
    syscall(SYS_futex, reinterpret_cast<const uint32_t*>(bell), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
  }
  // Parks while the word is still `seen`, until a Wake, a spurious wake-up or `deadline`
  // (Clock::time_point::max(): none). False once the deadline has passed.
  bool WaitUntil(uint32_t seen, Clock::time_point deadline) {
    if (deadline == Clock::time_point::max()) {
      syscall(SYS_futex, &word_, FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
      return true;
    }
    const auto ns = deadline.time_since_epoch() / std::chrono::nanoseconds(1);
    if (ns <= 0) return false;
    timespec at{};
    at.tv_sec = static_cast<time_t>(ns / 1000000000);
    at.tv_nsec = static_cast<long>(ns % 1000000000);
    // An absolute CLOCK_MONOTONIC deadline (FUTEX_WAIT_BITSET without FUTEX_CLOCK_REALTIME).
    const long r = syscall(SYS_futex, &word_, FUTEX_WAIT_BITSET_PRIVATE, seen, &at, nullptr,
                           FUTEX_BITSET_MATCH_ANY);
    return !(r != 0 && errno == ETIMEDOUT);
  }

 private:
  std::atomic<uint32_t> word_{0};
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "a futex word is a plain, lock-free 32-bit word");
// Wake passes the Bell's own address as the word's: the word is all there is.
static_assert(std::is_standard_layout_v<Bell> && sizeof(Bell) == sizeof(uint32_t),
              "a Bell's address is its futex word's");

}  // namespace rdmalock
