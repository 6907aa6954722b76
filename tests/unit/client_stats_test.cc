// ClientStats arithmetic (client/src/client_stats.cc): every counter, the histogram's included,
// is summed and subtracted. The stats are all uint64_t counters (client_stats.cc static_asserts
// it), so the test sets each word to a distinct value and checks each word.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>

#include "rdmalock/client.h"

namespace {

constexpr size_t kWords = sizeof(rdmalock::ClientStats) / sizeof(uint64_t);

rdmalock::ClientStats Numbered(uint64_t base) {
  uint64_t w[kWords];
  for (size_t i = 0; i < kWords; ++i) w[i] = base + i;
  rdmalock::ClientStats s;
  std::memcpy(&s, w, sizeof(s));
  return s;
}

uint64_t Word(const rdmalock::ClientStats& s, size_t i) {
  uint64_t w[kWords];
  std::memcpy(w, &s, sizeof(s));
  return w[i];
}

}  // namespace

TEST_CASE("ClientStats += and -= cover every counter and histogram bucket") {
  static_assert(sizeof(rdmalock::ClientStats) % sizeof(uint64_t) == 0);
  rdmalock::ClientStats a = Numbered(1000);
  const rdmalock::ClientStats b = Numbered(7);
  a += b;
  for (size_t i = 0; i < kWords; ++i) {
    INFO("word " << i);
    REQUIRE(Word(a, i) == 1000 + i + 7 + i);
  }
  a -= b;
  for (size_t i = 0; i < kWords; ++i) {
    INFO("word " << i);
    REQUIRE(Word(a, i) == 1000 + i);
  }
  REQUIRE(a.acquire_latency.count == Numbered(1000).acquire_latency.count);
}
