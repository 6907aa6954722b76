// RDMA integration tests: a lock space sharded over two lockds (ClusterClient and lockctl
// --cluster).
// Run on rdma_rxe only (tests/rdma/lockd_fixture.h).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rdmalock/client.h"
#include "rdmalock/cluster.h"
#include "tests/rdma/clients.h"
#include "tests/rdma/lockd_fixture.h"

using namespace rdmalock;
using namespace rdmalock::rdma_test;
using namespace std::chrono_literals;

TEST_CASE("a sharded lock space: names spread over two lockds as the hash says; sets span both") {
  Lockd a(7660, 1 << 20), b(7661, 1 << 20);
  ClusterMap map;
  map.shards = {{"shard-a", RxeIp(), 7660}, {"shard-b", RxeIp(), 7661}};
  ClientOptions o;
  o.connect_timeout = 3s;
  auto cc = ClusterClient::Connect(map, o);
  REQUIRE(cc.ok());
  auto other = ClusterClient::Connect(map, o);
  REQUIRE(other.ok());
  // 200 names: each is held on the shard the hash names, and only there.
  int on[2] = {0, 0};
  for (int i = 0; i < 200; ++i) {
    const std::string name = "sharded/" + std::to_string(i);
    const size_t s = (*cc)->ShardOf(name);
    REQUIRE(s == rdmalock::ShardForName(map, name));
    auto h = (*cc)->Lock(name, {.timeout = 2000ms});
    REQUIRE(h.ok());
    ++on[s];
    auto shard = (*cc)->Shard(s);
    REQUIRE(shard.ok());
    auto st = (*shard)->Inspect((*shard)->SlotOf(name));
    REQUIRE(st.ok());
    REQUIRE(st->exclusive_held);
    REQUIRE((*other)->TryLock(name).status().code() == ErrorCode::kBusy);
    REQUIRE(h->Release().ok());  // (two names may share a slot: hold one at a time)
  }
  // lockctl with the same map finds a held lock on its shard.
  {
    const std::string map_file = TempDir() + "/cluster.yaml";
    std::ofstream(map_file) << "shards:\n  - {name: shard-a, server: " << RxeIp()
                            << ", port: 7660}\n  - {name: shard-b, server: " << RxeIp()
                            << ", port: 7661}\n";
    auto h = (*cc)->Lock("sharded/lockctl");
    REQUIRE(h.ok());
    auto [rc, text] = Capture(ShellQuoted(LOCKCTL_PATH) + " --cluster " + map_file +
                              " inspect sharded/lockctl 2>&1");
    INFO(text);
    REQUIRE(rc == 0);
    REQUIRE(text.find("held exclusive") != std::string::npos);
    // The other shard's lockd has nothing there (its slot for the name is free).
    const std::string other_shard = (*cc)->ShardOf("sharded/lockctl") == 0 ? "shard-b" : "shard-a";
    auto [rc2, text2] = Capture(ShellQuoted(LOCKCTL_PATH) + " --cluster " + map_file + " --shard " +
                                other_shard + " inspect sharded/lockctl 2>&1");
    INFO(text2);
    REQUIRE(rc2 == 0);
    REQUIRE(text2.find("held") == std::string::npos);
  }
  WARN("200 names: " << on[0] << " on shard-a, " << on[1] << " on shard-b");
  REQUIRE(on[0] >= 70);
  REQUIRE(on[1] >= 70);

  // A set across both shards: all or none.
  std::vector<std::string> names;
  for (int i = 0; i < 8; ++i) names.push_back("set/" + std::to_string(i));
  std::vector<rdmalock::LockRequest> reqs;
  for (auto& n : names) reqs.push_back({n, LockMode::kExclusive});
  std::set<size_t> shards_used;
  for (auto& n : names) shards_used.insert((*cc)->ShardOf(n));
  REQUIRE(shards_used.size() == 2);
  {
    auto set = (*cc)->LockMany(reqs, {.timeout = 2000ms});
    REQUIRE(set.ok());
    REQUIRE(set->size() == names.size());
    for (auto& n : names) REQUIRE((*other)->TryLock(n).status().code() == ErrorCode::kBusy);
    for (auto& h : *set) REQUIRE(h.Release().ok());
  }
  // One lock of the set is taken elsewhere, on the shard that comes last in the global order:
  // the set times out and holds nothing (the first shard's part was given back).
  std::string blocker;
  for (auto& n : names) {
    if (map.shards[(*cc)->ShardOf(n)].name == "shard-b") blocker = n;
  }
  auto block = (*other)->Lock(blocker);
  REQUIRE(block.ok());
  auto failed = (*cc)->LockMany(reqs, {.timeout = 300ms});
  REQUIRE(failed.status().code() == ErrorCode::kTimeout);
  for (auto& n : names) {
    if (n == blocker) continue;
    auto h = (*other)->TryLock(n);
    INFO(n);
    REQUIRE(h.ok());
  }
}
