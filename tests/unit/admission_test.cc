// lockd's admission parts that need no verbs: the refusal log's throttle.
#include <catch2/catch.hpp>
#include <string>

#include "server/refusal_log.h"

using rdmalock::lockd::RefusalLog;

TEST_CASE("refusal log: one line a second per address and reason") {
  RefusalLog log(16);
  const auto t0 = RefusalLog::Clock::now();
  CHECK(log.ShouldLog("10.0.0.1/auth", t0));
  CHECK_FALSE(log.ShouldLog("10.0.0.1/auth", t0 + std::chrono::milliseconds(999)));
  CHECK(log.ShouldLog("10.0.0.1/not_allowed", t0));
  CHECK(log.ShouldLog("10.0.0.2/auth", t0));
  CHECK(log.ShouldLog("10.0.0.1/auth", t0 + std::chrono::seconds(1)));
}

// Issue 17 finding 3: one more key than the table tracks made the throttle forget its table and
// then write through the iterator it had taken before (heap-use-after-free under ASan; a stray
// write into freed memory otherwise). Reachable by an unauthenticated peer with many addresses.
TEST_CASE("issue 17 finding 3: the refusal log stays bounded and sound past its capacity") {
  constexpr size_t kCap = 64;
  RefusalLog log(kCap);
  const auto t0 = RefusalLog::Clock::now();
  for (size_t i = 0; i < 4 * kCap + 1; ++i) {
    const std::string key =
        "10.1." + std::to_string(i / 256) + "." + std::to_string(i % 256) + "/auth";
    CHECK(log.ShouldLog(key, t0));
    REQUIRE(log.tracked() <= kCap);
  }
  // The key logged last is remembered: its next refusal within the second is not logged again.
  const std::string last =
      "10.1." + std::to_string((4 * kCap) / 256) + "." + std::to_string((4 * kCap) % 256) + "/auth";
  CHECK_FALSE(log.ShouldLog(last, t0 + std::chrono::milliseconds(10)));
}
