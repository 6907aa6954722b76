// What a shard may be named, in a cluster map from a file (ClusterMap::Validate) as in etcd's
// (ParseShardList): 1 to 64 letters, digits, '-', '_' and '.'. Internal to librdmalock.
// Thread-safety: a pure function; any thread.
#pragma once

#include <cctype>
#include <string_view>

namespace rdmalock {

inline constexpr size_t kMaxShardName = 64;

inline bool IsShardName(std::string_view name) {
  if (name.empty() || name.size() > kMaxShardName) return false;
  for (const char ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') {
      return false;
    }
  }
  return true;
}

}  // namespace rdmalock
