// GenerationTable (engine/generation_table.h): what a session learned of its slots' generations.
// A wrong answer here could tag a request's record entry with another slot's generation, which
// lockd would then act on in the wrong generation; so: a slot's hint is only ever that slot's,
// a torn entry is a miss, and forgetting is forgetting.
#include "engine/generation_table.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

using namespace rdmalock;
using namespace std::chrono_literals;
using Hint = GenerationTable::Hint;

TEST_CASE("generation table: a slot's hint, its age, and forgetting it") {
  GenerationTable t(8);
  Hint h;
  CHECK_FALSE(t.Find(3, &h));  // nothing learned yet (nothing allocated either)
  const auto now = GenerationTable::Clock::now();
  t.Learn(3, {7, 120, now - 50ms});
  REQUIRE(t.Find(3, &h));
  CHECK(h.generation == 7);
  CHECK(h.tickets == 120);
  // The age is kept to about a millisecond (2^20 ns).
  const auto age = GenerationTable::Age(h, now);
  CHECK(age >= 48ms);
  CHECK(age <= 52ms);
  CHECK_FALSE(t.Find(4, &h));
  t.Forget(4);  // another slot's (none): 3's hint stays
  CHECK(t.Find(3, &h));
  t.Forget(3);
  CHECK_FALSE(t.Find(3, &h));
  // A count above 16 bits is kept as 65,535: a stricter check, never a looser one.
  t.Learn(3, {1, 70'000, now});
  REQUIRE(t.Find(3, &h));
  CHECK(h.tickets == 65'535);
}

TEST_CASE("generation table: slots sharing an entry never answer for each other") {
  // A lock table larger than kMaxEntries shares entries between slots (slot mod size).
  GenerationTable t(GenerationTable::kMaxEntries * 4);
  const uint64_t a = 5, b = 5 + GenerationTable::kMaxEntries;
  const auto now = GenerationTable::Clock::now();
  t.Learn(a, {1, 10, now});
  Hint h;
  CHECK(t.Find(a, &h));
  CHECK_FALSE(t.Find(b, &h));
  t.Learn(b, {2, 20, now});
  CHECK_FALSE(t.Find(a, &h));
  REQUIRE(t.Find(b, &h));
  CHECK(h.generation == 2);
  t.Forget(a);  // a's hint is gone already; b's stays
  CHECK(t.Find(b, &h));
  // The largest slot a lock table may have is told apart too.
  const uint64_t top = (uint64_t{1} << 28) - 1;
  GenerationTable big(uint64_t{1} << 28);
  big.Learn(top, {9, 1, now});
  REQUIRE(big.Find(top, &h));
  CHECK(h.generation == 9);
  CHECK_FALSE(big.Find(top % GenerationTable::kMaxEntries, &h));
}

TEST_CASE("generation table: threads learning one entry never mix two slots' hints") {
  // Writers learn slot a with generation == tickets == 2a+1 and slot b likewise, all into one
  // entry; readers check that whatever they find belongs to the slot they asked for.
  GenerationTable t(GenerationTable::kMaxEntries * 2);
  const uint64_t slots[2] = {11, 11 + GenerationTable::kMaxEntries};
  t.Learn(slots[0], {23, 23, GenerationTable::Clock::now()});  // 2 * 11 + 1: allocated, found
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> found{0}, wrong{0};
  std::vector<std::thread> ts;
  for (int w = 0; w < 2; ++w) {
    ts.emplace_back([&, w] {
      const auto now = GenerationTable::Clock::now();
      for (uint32_t i = 0; !stop.load(); ++i) {
        const uint64_t s = slots[(i + w) % 2];
        const auto g = static_cast<uint32_t>(2 * s + 1);
        t.Learn(s, {g, g & 0xffff, now});
      }
    });
  }
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      // Until the writers have run a while (a writer preempted in the middle of a write makes
      // every read of the entry a miss until it runs again).
      for (uint64_t i = 0; !stop.load() || found.load() == 0; ++i) {
        const uint64_t s = slots[(i + r) % 2];
        Hint h;
        if (!t.Find(s, &h)) continue;
        found.fetch_add(1);
        const auto g = static_cast<uint32_t>(2 * s + 1);
        if (h.generation != g || h.tickets != (g & 0xffff)) wrong.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(300ms);
  stop = true;
  for (auto& th : ts) th.join();
  INFO("found " << found.load() << " wrong " << wrong.load());
  CHECK(wrong.load() == 0);
  INFO("found " << found.load());
  CHECK(found.load() > 0);
}
