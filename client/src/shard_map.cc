// The cluster map and rendezvous hashing: no RDMA, so host unit tests compile it on its own.
#include <xxhash.h>

#include <cctype>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "client/src/shard_name.h"
#include "rdmalock/cluster.h"

namespace rdmalock {

Status ClusterMap::Validate() const {
  if (shards.empty()) return Error(ErrorCode::kInvalidArgument, "the cluster map has no shard");
  std::set<std::string> names;
  // Each shard is a lockd of its own: two on one lockd would share its lock table, and sets'
  // global order (shard name, slot) would be no order over it (deadlock).
  std::map<std::pair<std::string, uint16_t>, std::string> lockds;
  for (const ShardSpec& s : shards) {
    if (s.name.empty()) return Error(ErrorCode::kInvalidArgument, "a shard has no name");
    if (!IsShardName(s.name)) {
      // Printed with its bytes as they are would garble the message (a NUL ends it in C).
      std::string shown;
      for (const char ch : s.name.substr(0, kMaxShardName)) {
        shown += std::isprint(static_cast<unsigned char>(ch)) ? ch : '?';
      }
      return Error(ErrorCode::kInvalidArgument,
                   "shard name '" + shown + (s.name.size() > kMaxShardName ? "...'" : "'") + " (" +
                       std::to_string(s.name.size()) +
                       " bytes): a shard name is 1 to 64 letters, digits, '-', '_' or '.'");
    }
    if (s.server.empty()) {
      return Error(ErrorCode::kInvalidArgument, "shard '" + s.name + "' has no server");
    }
    if (!names.insert(s.name).second) {
      return Error(ErrorCode::kInvalidArgument, "shard name '" + s.name + "' appears twice");
    }
    if (auto [it, fresh] = lockds.emplace(std::make_pair(s.server, s.port), s.name); !fresh) {
      return Error(ErrorCode::kInvalidArgument,
                   "shards '" + it->second + "' and '" + s.name + "' both name lockd " + s.server +
                       ":" + std::to_string(s.port) + "; each shard needs a lockd of its own");
    }
  }
  return Status::Ok();
}

size_t ShardForName(const ClusterMap& map, std::string_view name) {
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t i = 0; i < map.shards.size(); ++i) {
    const auto& shard = map.shards[i].name;
    const uint64_t score =
        XXH3_64bits_withSeed(name.data(), name.size(), XXH3_64bits(shard.data(), shard.size()));
    // Ties (astronomically rare) go to the smaller shard name, so every client agrees.
    if (i == 0 || score > best_score ||
        (score == best_score && map.shards[i].name < map.shards[best].name)) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

}  // namespace rdmalock
