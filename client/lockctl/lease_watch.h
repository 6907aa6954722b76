// When lockctl acquire's supervisor ends the command (cmd_acquire.cc): a SIGTERM once the lock's
// lease is overdue for renewal, a SIGKILL before it can end. The lease's end is the handle's
// lease_expiry(), which against a cluster-mode lockd is also bounded by the session's trust limit
// (lockd's liveness timeout T, refreshed with every heartbeat), so the time left swings between
// about T - 2 heartbeats and T there, and between 2L/3 and L elsewhere (renewals every L/3).
//
// Thread-safety: a value type, used by lockctl's main thread only. Follow() is pure but for the
// window it keeps.
#pragma once

#include <chrono>

namespace lockctl {

class LeaseWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Times {
    Clock::time_point term_at;  // SIGTERM the command from then
    Clock::time_point kill_at;  // SIGKILL it from then, at the latest
  };

  explicit LeaseWatch(std::chrono::nanoseconds lease) : lease_(lease) {}

  // The times for a lease that ends at `expiry` (lease_expiry() read at `now`): a third of the
  // window before it, and a tenth. The window is the most time left seen so far (at most a
  // lease): L where renewals bound it, about T where the trust limit does. A third of the lease
  // itself stopped a healthy command at once when L/3 exceeded what the trust limit leaves
  // (found by review, 2026-12-05).
  Times Follow(Clock::time_point expiry, Clock::time_point now);

 private:
  const std::chrono::nanoseconds lease_;
  std::chrono::nanoseconds window_{0};
};

}  // namespace lockctl
