// lockctl --etcd URL cluster [init SHARDS [--replace]]: publishes a cluster map to etcd, then shows
// each shard's primary and standbys as etcd has them now.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "client/lockctl/commands.h"
#include "client/lockctl/json.h"
#include "common/etcd/etcd.h"

namespace lockctl {

int CmdCluster(const Common& c, const std::string& init, bool replace) {
  const rdmalock::EtcdCluster e = c.Etcd();
  if (!init.empty()) {
    std::vector<std::string> names;
    // A comma-separated list: the spaces around a name are the list's, not the name's. An empty
    // name (",," or a comma at either end) is kept, for PublishClusterMap to refuse.
    for (size_t pos = 0;;) {
      const size_t comma = std::min(init.find(',', pos), init.size());
      std::string n = init.substr(pos, comma - pos);
      n.erase(0, n.find_first_not_of(" \t"));
      n.erase(n.find_last_not_of(" \t") + 1);
      names.push_back(std::move(n));
      if (comma == init.size()) break;
      pos = comma + 1;
    }
    if (auto st = rdmalock::PublishClusterMap(e, names, replace); !st.ok()) {
      std::cerr << "lockctl: " << st.message() << "\n";
      const auto code = st.code();
      return code == rdmalock::ErrorCode::kConnection || code == rdmalock::ErrorCode::kResource
                 ? kExitUnavailable
                 : kExitUsage;
    }
  }
  auto map = rdmalock::ReadClusterMap(e);
  if (!map.ok()) {
    std::cerr << "lockctl: " << map.status().message() << "\n";
    // etcd unreachable, failing, or answering what is no etcd reply: unavailable, not usage.
    const auto code = map.status().code();
    return code == rdmalock::ErrorCode::kConnection || code == rdmalock::ErrorCode::kProtocol
               ? kExitUnavailable
               : kExitUsage;
  }
  // Every lockd of each shard (primary or standby), as each registers itself on its etcd lease.
  // A read that fails is an error: "standby (none)" would be a guess shown as etcd's answer.
  std::vector<std::vector<std::string>> members(map->shards.size());
  auto etcd =
      rdmalock::etcd::Client::Create(c.etcd, {c.etcd_ca_file, c.etcd_cert_file, c.etcd_key_file});
  if (!etcd.ok()) {
    std::cerr << "lockctl: " << etcd.status().message() << "\n";
    return etcd.status().code() == rdmalock::ErrorCode::kConnection ? kExitUnavailable : kExitUsage;
  }
  for (size_t i = 0; i < map->shards.size(); ++i) {
    const std::string prefix =
        "/rdmalock/" + c.etcd_cluster + "/shard/" + map->shards[i].name + "/members/";
    auto kvs = (*etcd)->GetPrefix(prefix, std::chrono::milliseconds(2000));
    if (!kvs.ok()) {
      std::cerr << "lockctl: reading the members of shard '" << map->shards[i].name << "' ("
                << prefix << "*) from etcd: " << kvs.status().message() << "\n";
      return kExitUnavailable;
    }
    for (const auto& kv : *kvs) members[i].push_back(kv.value);
    // A shard the map read shows without a primary: its key is absent, or holds what is not
    // HOST:PORT, which the map reads as none too (that is no "(none now)").
    if (map->shards[i].server.empty() && !RecheckPrimary(c, **etcd, &map->shards[i])) {
      return kExitUnavailable;
    }
  }
  if (c.json) {
    std::cout << ClusterJson(c.etcd_cluster, *map, members);
  } else {
    std::cout << "cluster " << c.etcd_cluster << ": " << map->shards.size() << " shard(s)\n";
    for (size_t i = 0; i < map->shards.size(); ++i) {
      const auto& s = map->shards[i];
      std::cout << "  " << s.name << "  primary "
                << (s.server.empty() ? std::string("(none now)") : ShardAddress(s));
      std::string standbys;
      for (const auto& m : members[i]) {
        if (s.server.empty() || m != ShardAddress(s)) {
          standbys += (standbys.empty() ? "" : ", ") + m;
        }
      }
      std::cout << "  standby " << (standbys.empty() ? "(none)" : standbys) << "\n";
    }
  }
  return 0;
}

}  // namespace lockctl
