// A call's deadline from its timeout, for every acquire of the SDK (Client, ClusterClient, the
// async path). Threading: a pure function; any thread.
#pragma once

#include <chrono>

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

}  // namespace rdmalock::sdk
