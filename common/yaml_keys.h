// A key written twice in one YAML mapping. yaml-cpp keeps both pairs and answers node["key"]
// with one of them, so a file that says a key twice loses one of its values without a word (a
// second `shards:` block, a second `lease_ms:`). Every YAML file the project reads (lockd.yaml,
// lockctl's client.yaml, a cluster map) is checked with this after it is loaded.
// Header-only; stateless.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <optional>
#include <string>

namespace rdmalock {

struct DuplicateKey {
  std::string key;
  int line = 0;        // the second occurrence's (1-based)
  int first_line = 0;  // the first's
  // "ORIGIN:LINE: key 'K' appears twice (also line FIRST)"
  std::string Message(const std::string& origin) const {
    return origin + ":" + std::to_string(line) + ": key '" + key + "' appears twice (also line " +
           std::to_string(first_line) + ")";
  }
};

// The first key written twice in a mapping of `node`, at any depth, in file order of the second
// occurrence within each mapping (outer mappings first).
inline std::optional<DuplicateKey> FindDuplicateKey(const YAML::Node& node) {
  if (node.IsMap()) {
    std::map<std::string, int> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) continue;
      const int line = kv.first.Mark().line + 1;
      auto [it, fresh] = seen.emplace(kv.first.Scalar(), line);
      if (!fresh) return DuplicateKey{kv.first.Scalar(), line, it->second};
    }
    for (const auto& kv : node) {
      if (auto d = FindDuplicateKey(kv.second)) return d;
    }
  } else if (node.IsSequence()) {
    for (const auto& item : node) {
      if (auto d = FindDuplicateKey(item)) return d;
    }
  }
  return std::nullopt;
}

}  // namespace rdmalock
