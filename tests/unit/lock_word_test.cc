// Unit tests of proto/rdmalock/proto/lock_word.h: the lock word's fields, the ticket rules
// (grant, skip, ahead), frozen and drained words, occupancy, recovery and fencing tokens.
#include "rdmalock/proto/lock_word.h"

#include <catch2/catch.hpp>

using namespace rdmalock::proto;

TEST_CASE("word0 encodes fields at their documented bit positions") {
  Word0 w{.max_s = 0x1111, .max_x = 0x2222, .n_s = 0x3333, .n_x = 0x4444};
  REQUIRE(w.Encode() == 0x4444333322221111ull);
  REQUIRE(Word0::Decode(0x4444333322221111ull) == w);
  REQUIRE(kAcquireShared == 1);
  REQUIRE(Word0::Decode(kAcquireExclusive).max_x == 1);
  REQUIRE(Word0::Decode(kReleaseShared).n_s == 1);
  REQUIRE(Word0::Decode(kReleaseExclusive).n_x == 1);
}

TEST_CASE("grant, skip and ahead follow the ticket rules") {
  // Two X before us, one S before us; we are X.
  const Word0 ticket{.max_s = 1, .max_x = 2, .n_s = 0, .n_x = 0};
  REQUIRE_FALSE(Granted(ticket, ticket, Mode::kExclusive));
  REQUIRE(Ahead(ticket, ticket, Mode::kExclusive) == 3);
  REQUIRE(Ahead(ticket, ticket, Mode::kShared) == 2);  // S waits for X only
  Word0 now{.max_s = 1, .max_x = 3, .n_s = 1, .n_x = 2};
  REQUIRE(Granted(now, ticket, Mode::kExclusive));
  REQUIRE(Granted(now, ticket, Mode::kShared));
  now.n_s = 0;
  REQUIRE_FALSE(Granted(now, ticket, Mode::kExclusive));
  REQUIRE(Granted(now, ticket, Mode::kShared));  // readers ignore other readers
  now.n_x = 3;
  REQUIRE(Skipped(now, ticket, Mode::kExclusive));
  REQUIRE(Skipped(now, ticket, Mode::kShared));
  now = Word0{.max_s = 1, .max_x = 3, .n_s = 2, .n_x = 2};
  REQUIRE(Skipped(now, ticket, Mode::kExclusive));
  REQUIRE_FALSE(Skipped(now, ticket, Mode::kShared));  // S never tests nS
}

TEST_CASE("frozen and drained words") {
  REQUIRE(Word0{.max_s = 0, .max_x = kCountMax}.Frozen());
  REQUIRE(Word0{.max_s = kCountMax}.Frozen());
  REQUIRE_FALSE(Word0{.max_s = kCountMax - 1, .max_x = kCountMax - 1}.Frozen());
  REQUIRE(Word0{.max_s = 3, .max_x = 5, .n_s = 3, .n_x = 5}.Drained());
  REQUIRE_FALSE(Word0{.max_s = 3, .max_x = 5, .n_s = 2, .n_x = 5}.Drained());
}

TEST_CASE("a frozen word with nothing but bounces left in it is resettable") {
  constexpr uint16_t c = kCountMax;
  // Frozen and drained.
  CHECK(Word0{.max_s = 2, .max_x = c, .n_s = 2, .n_x = c}.Resettable());
  CHECK(Word0{.max_s = c, .max_x = 7, .n_s = c, .n_x = 7}.Resettable());
  // Bounces' increments left in the frozen field, every admitted ticket released.
  CHECK(Word0{.max_s = 2, .max_x = uint16_t(c + 3), .n_s = 2, .n_x = c}.Resettable());
  CHECK(Word0{.max_s = uint16_t(c + 1), .max_x = 7, .n_s = c, .n_x = 7}.Resettable());
  // The frozen field's last ticket outstanding (held or waiting).
  CHECK_FALSE(Word0{.max_s = 2, .max_x = uint16_t(c + 3), .n_s = 2, .n_x = c - 1}.Resettable());
  CHECK_FALSE(Word0{.max_s = uint16_t(c + 1), .max_x = 7, .n_s = c - 1, .n_x = 7}.Resettable());
  // The other field not drained: an admitted request's, or a bounce's (cannot be told apart).
  CHECK_FALSE(Word0{.max_s = 3, .max_x = c, .n_s = 2, .n_x = c}.Resettable());
  CHECK_FALSE(Word0{.max_s = c, .max_x = 8, .n_s = c, .n_x = 7}.Resettable());
  // Both fields at COUNT_MAX or past it: the other one by bounces, not drained.
  CHECK_FALSE(Word0{.max_s = uint16_t(c + 2), .max_x = c, .n_s = 5, .n_x = c}.Resettable());
  // Not frozen.
  CHECK_FALSE(Word0{.max_s = 3, .max_x = 5, .n_s = 3, .n_x = 5}.Resettable());
  CHECK_FALSE(Word0{}.Resettable());
}

TEST_CASE("occupancy: holders and waiters from the counters") {
  const Occupancy free = OccupancyOf(Word0{.max_s = 3, .max_x = 5, .n_s = 3, .n_x = 5});
  REQUIRE(free.holders == 0);
  REQUIRE(free.waiting == 0);
  REQUIRE_FALSE(free.exclusive_held);
  // Three exclusive requests outstanding: one holds, two wait.
  const Occupancy x = OccupancyOf(Word0{.max_s = 1, .max_x = 8, .n_s = 1, .n_x = 5});
  REQUIRE(x.holders == 1);
  REQUIRE(x.waiting == 2);
  REQUIRE(x.exclusive_held);
  // Only shared outstanding: all hold.
  const Occupancy s = OccupancyOf(Word0{.max_s = 7, .max_x = 2, .n_s = 3, .n_x = 2});
  REQUIRE(s.holders == 4);
  REQUIRE(s.waiting == 0);
  REQUIRE_FALSE(s.exclusive_held);
  // Mixed: one head holds (a lower bound), the rest count as waiting; no exclusive claim.
  const Occupancy m = OccupancyOf(Word0{.max_s = 2, .max_x = 2, .n_s = 0, .n_x = 1});
  REQUIRE(m.exclusive_outstanding == 1);
  REQUIRE(m.shared_outstanding == 2);
  REQUIRE(m.holders == 1);
  REQUIRE(m.waiting == 2);
  REQUIRE_FALSE(m.exclusive_held);
}

TEST_CASE(
    "requests between two readings: the counters' rise, and after a reset what the word shows") {
  const Word0 before{.max_s = 10, .max_x = 30000};
  REQUIRE(RequestsBetween(before, 7, Word0{.max_s = 12, .max_x = 30005}, 7) == 7);
  REQUIRE(RequestsBetween(before, 7, Word0{.max_s = 9, .max_x = 29999}, 7) == 0);  // withdrawn
  REQUIRE(RequestsBetween(before, 7, Word0{.max_s = 1, .max_x = 2}, 8) == 3);      // reset
  REQUIRE(RequestsBetween(before, 7, before, 7) == 0);
  // A frozen word with a new generation: the reset's bump landed, its word0 CAS not yet.
  const Word0 frozen{.max_s = 10, .max_x = kCountMax};
  REQUIRE(RequestsBetween(before, 7, frozen, 8) == kCountMax - 30000);
  REQUIRE(GenerationSeen(7, frozen, 8) == 7);
  REQUIRE(GenerationSeen(7, Word0{.max_x = 2}, 8) == 8);
}

TEST_CASE("recovered word marks everything up to the waiter as done") {
  const Word0 seen{.max_s = 4, .max_x = 6, .n_s = 2, .n_x = 3};
  const Word0 tx{.max_s = 3, .max_x = 5};
  const Word0 rx = RecoveredWord(seen, tx, Mode::kExclusive);
  REQUIRE(rx.n_x == 6);
  REQUIRE(rx.n_s == 3);
  REQUIRE(rx.max_x == 6);
  REQUIRE(rx.max_s == 4);
  const Word0 rs = RecoveredWord(seen, tx, Mode::kShared);
  REQUIRE(rs.n_x == 5);
  REQUIRE(rs.n_s == 3);
}

TEST_CASE("fencing token layout") {
  // epoch:16 | generation:29 | ticket:15 | local:4
  REQUIRE(FencingToken(0x0102, 0x1, 0x0, 0) == 0x0102000000080000ull);
  REQUIRE(FencingToken(0x0102, 0, 0x7fff, 0) == 0x010200000007fff0ull);
  REQUIRE(FencingToken(0x0102, 0x1fffffff, 0, 0) == 0x0102fffffff80000ull);
  REQUIRE(FencingToken(0x0102, 0, 0, 0xf) == 0x010200000000000full);
  REQUIRE(FencingToken(1, 0, 5) < FencingToken(1, 1, 0));
  REQUIRE(FencingToken(1, 0x1fffffff, 0x7fff, 0xf) < FencingToken(2, 0, 0));
  // A local handover's token lies between its remote grant's and the next ticket's.
  const uint64_t remote = FencingToken(3, 77, 100);
  REQUIRE(LocalHandoverToken(remote, 0) == remote);
  for (uint64_t k = 1; k <= kTokenLocalMax; ++k) {
    REQUIRE(LocalHandoverToken(remote, k) > LocalHandoverToken(remote, k - 1));
    REQUIRE(LocalHandoverToken(remote, k) < FencingToken(3, 77, 101));
  }
  // Ticket 32767 (the last before a reset) is below the next generation's first ticket.
  REQUIRE(LocalHandoverToken(FencingToken(3, 77, kCountMax - 1), kTokenLocalMax) <
          FencingToken(3, 78, 0));
}
