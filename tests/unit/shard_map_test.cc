// The cluster map and rendezvous hashing (client/src/shard_map.cc).
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "rdmalock/client.h"
#include "rdmalock/cluster.h"

using rdmalock::ClusterMap;
using rdmalock::ErrorCode;
using rdmalock::ShardForName;

namespace {

// Shards of the given names, each on a lockd of its own (192.0.2.1, .2, ...).
ClusterMap Map(std::initializer_list<const char*> names) {
  ClusterMap m;
  for (const char* n : names) {
    m.shards.push_back({n, "192.0.2." + std::to_string(m.shards.size() + 1), 7471});
  }
  return m;
}

}  // namespace

TEST_CASE("cluster maps: at least one shard, names unique and set, servers set") {
  REQUIRE(Map({"a", "b"}).Validate().ok());
  REQUIRE(Map({}).Validate().code() == ErrorCode::kInvalidArgument);
  REQUIRE(Map({"a", "a"}).Validate().message().find("appears twice") != std::string::npos);
  REQUIRE(Map({""}).Validate().message().find("no name") != std::string::npos);
  ClusterMap no_server = Map({"a"});
  no_server.shards[0].server.clear();
  REQUIRE(no_server.Validate().message().find("no server") != std::string::npos);
}

// Found by review (2026-12-06): a map file took any shard name, where etcd's map takes 1 to 64
// letters, digits, '-', '_' and '.'. A name of 300 bytes made Python's Cluster.shard_of fail (its
// buffer is sized for 64), and one with a NUL ("a\0b", hashed as 3 bytes) came back from the C
// API and Python as "a", so two such shards printed alike.
TEST_CASE("cluster maps: a shard name is 1-64 letters, digits, '-', '_' or '.', as in etcd's") {
  REQUIRE(Map({"shard-a.1_x"}).Validate().ok());
  REQUIRE(
      Map({"0123456789012345678901234567890123456789012345678901234567890123"}).Validate().ok());
  ClusterMap m = Map({"a"});
  for (const std::string& bad :
       {std::string(65, 's'), std::string(300, 's'), std::string("a\0b", 3), std::string("a b"),
        std::string("a/b"), std::string("\xc3\xa9")}) {
    m.shards[0].name = bad;
    INFO("shard name of " << bad.size() << " bytes: " << m.Validate().ToString());
    CHECK(m.Validate().code() == ErrorCode::kInvalidArgument);
    CHECK(m.Validate().message().find("letters, digits") != std::string::npos);
  }
}

// Two shards on one lockd share its lock table, and the global lock order of sets (shard name,
// slot) is then no order over that table: two sets could each hold one part and wait for the
// other's, for ever (found by review, 2026-12-05). A map naming one lockd twice is refused.
TEST_CASE("cluster maps: two shards may not name the same lockd") {
  ClusterMap m = Map({"a", "b"});
  m.shards[1].server = m.shards[0].server;
  const auto st = m.Validate();
  INFO(st.ToString());
  CHECK(st.code() == ErrorCode::kInvalidArgument);
  CHECK(st.message().find("shards 'a' and 'b' both name lockd 192.0.2.1:7471") !=
        std::string::npos);
  m.shards[1].port = 7472;  // another lockd on the same host
  CHECK(m.Validate().ok());
}

TEST_CASE("rendezvous hashing: even spread, order-free, and a new shard moves only its own") {
  const ClusterMap two = Map({"shard-a", "shard-b"});
  const ClusterMap two_swapped = Map({"shard-b", "shard-a"});
  const ClusterMap three = Map({"shard-a", "shard-b", "shard-c"});
  std::map<std::string, int> count2, count3;
  int moved = 0, moved_elsewhere = 0;
  const int n = 30000;
  for (int i = 0; i < n; ++i) {
    const std::string name = "orders/" + std::to_string(i);
    const std::string s2 = two.shards[ShardForName(two, name)].name;
    // The map's order does not matter, only the shard names.
    REQUIRE(two_swapped.shards[ShardForName(two_swapped, name)].name == s2);
    const std::string s3 = three.shards[ShardForName(three, name)].name;
    ++count2[s2];
    ++count3[s3];
    if (s3 != s2) {
      ++moved;
      if (s3 != "shard-c") ++moved_elsewhere;
    }
  }
  // Even within a few percent (binomial sd at n/2 is under 1%).
  REQUIRE(count2["shard-a"] > n * 0.47);
  REQUIRE(count2["shard-b"] > n * 0.47);
  for (const char* s : {"shard-a", "shard-b", "shard-c"}) REQUIRE(count3[s] > n * 0.30);
  // Adding a third shard moves about a third of the names, all of them to the new shard.
  REQUIRE(moved_elsewhere == 0);
  REQUIRE(moved > n * 0.30);
  REQUIRE(moved < n * 0.37);
  // One shard: everything there.
  REQUIRE(ShardForName(Map({"only"}), "anything") == 0);
}

// Every client must map a name to the same slot and the same shard, whatever machine and build it
// runs on: the mapping is XXH3-64 (seed 0 for the slot; seeded with the shard name's XXH3-64 for
// the shard), whose output xxHash froze in 0.8.0 (CMakeLists.txt requires libxxhash >= 0.8.0).
// These values were computed with the C library outside the SDK (xxHash 0.8.1); XXH3-64 of ""
// is the reference vector 0x2D06800538D394C2. A build whose mapping differs fails here.
TEST_CASE("names map to slots and shards by XXH3-64 as xxHash 0.8 froze it (known values)") {
  CHECK(rdmalock::SlotForName("", uint64_t{1} << 63) == 0x2D06800538D394C2 % (uint64_t{1} << 63));
  struct Known {
    const char* name;
    uint64_t slot_of_65536, slot_of_1000;
    const char* shard;  // of shard-a and shard-b
  };
  const Known known[] = {
      {"orders/42", 63829, 565, "shard-b"},
      {"lock-0", 22637, 685, "shard-b"},
      {"a", 19999, 719, "shard-b"},
      {"a-somewhat-longer-lock-name-of-more-than-sixteen-bytes/with/a/path/0123456789", 806, 598,
       "shard-a"},
  };
  const ClusterMap two = Map({"shard-a", "shard-b"});
  const ClusterMap reversed = Map({"shard-b", "shard-a"});
  for (const Known& k : known) {
    INFO(k.name);
    CHECK(rdmalock::SlotForName(k.name, 65536) == k.slot_of_65536);
    CHECK(rdmalock::SlotForName(k.name, 1000) == k.slot_of_1000);
    CHECK(two.shards[ShardForName(two, k.name)].name == k.shard);
    CHECK(reversed.shards[ShardForName(reversed, k.name)].name == k.shard);
  }
}

// Found by review (2026-12-06): the C API's rdmalock_slot_for_name and Python's slot_for_name
// give 0 for a count of 0, and the C++ SlotForName divided by it (SIGFPE, the process gone).
TEST_CASE("SlotForName of no slots is 0, as in the C API and Python, not a division by zero") {
  CHECK(rdmalock::SlotForName("x", 0) == 0);
  CHECK(rdmalock::SlotForName("", 0) == 0);
  CHECK(rdmalock::SlotForName("x", 1) == 0);
}
