// What a shard may be named, in a cluster map from a file (ClusterMap::Validate) as in etcd's
// (ParseShardList): 1 to 64 letters, digits, '-', '_' and '.'. Internal to librdmalock.
// Thread-safety: a pure function; any thread.
#pragma once

#include <string_view>

namespace rdmalock {

inline constexpr size_t kMaxShardName = 64;

inline bool IsShardName(std::string_view name) {
  if (name.empty() || name.size() > kMaxShardName) return false;
  // ASCII by hand, not std::isalnum: its answer for bytes past 0x7f depends on the locale, which
  // a program linking the SDK (Python sets LC_CTYPE) may have set.
  for (const char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace rdmalock
