// A call's deadline from its timeout, for every acquire of the SDK (Client, ClusterClient, the
// async path). Threading: a pure function; any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>

namespace rdmalock::sdk {

// `now + timeout`, or the clock's end for a timeout the clock cannot add (more than its range in
// nanoseconds from now, such as milliseconds::max() or the C API's INT64_MAX ms): such a call
// waits as one without a limit. Added as it is, the conversion to nanoseconds would overflow
// (undefined behaviour; in practice a deadline in the past, and a contended acquire timed out at
// once). A timeout of zero or less is `now`: a try (callers refuse negative timeouts).
inline std::chrono::steady_clock::time_point DeadlineAfter(
    std::chrono::steady_clock::time_point now, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  if (timeout <= std::chrono::milliseconds::zero()) return now;
  // Nanoseconds to milliseconds: a smaller count, never an overflow.
  const auto room =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  return timeout < room ? now + timeout : Clock::time_point::max();
}

// What is left at `now` of a call's `timeout` that ends at `deadline` (DeadlineAfter), for a call
// that goes on to another that takes a timeout (Lock by name waits for the session, then locks
// the slot): whole milliseconds, rounded up, and at least 1 ms, so a wait stays a wait (the
// acquire then tries once). No timeout, a try (0), and one without a limit stay as they are.
inline std::optional<std::chrono::milliseconds> TimeoutLeft(
    const std::optional<std::chrono::milliseconds>& timeout,
    std::chrono::steady_clock::time_point deadline, std::chrono::steady_clock::time_point now) {
  using std::chrono::milliseconds;
  if (!timeout || *timeout <= milliseconds::zero() ||
      deadline == std::chrono::steady_clock::time_point::max()) {
    return timeout;
  }
  if (deadline <= now) return milliseconds(1);
  return std::max(milliseconds(1), std::chrono::ceil<milliseconds>(deadline - now));
}

}  // namespace rdmalock::sdk
