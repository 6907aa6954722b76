// The cluster map file for the C API. The same format and rules as lockctl's ParseClusterMap
// (client/lockctl/args.cc), which prints its errors; this one returns them, since no library
// writes to stderr.
#include "client/src/shard_map_file.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <exception>
#include <string>

#include "common/text_file.h"
#include "common/yaml_keys.h"

namespace rdmalock {

Result<ClusterMap> ReadClusterMapFile(const std::string& path) {
  auto text = ReadTextFile(path);
  if (!text.ok())
    return Error(ErrorCode::kIo, "cannot read cluster map " + text.status().message());
  YAML::Node root;
  try {
    root = YAML::Load(*text);
  } catch (const YAML::Exception& e) {
    return Error(ErrorCode::kConfig, path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (auto d = FindDuplicateKey(root)) return Error(ErrorCode::kConfig, d->Message(path));
  auto bad = [&](const YAML::Node& n, const std::string& why) {
    return Error(ErrorCode::kConfig, path + ":" + std::to_string(n.Mark().line + 1) + ": " + why);
  };
  if (!root.IsMap() || !root["shards"] || !root["shards"].IsSequence()) {
    return bad(root, "expected 'shards:', a list of {name, server, port}");
  }
  ClusterMap map;
  for (const auto& item : root["shards"]) {
    if (!item.IsMap()) return bad(item, "a shard must be a map of name, server, port");
    ShardSpec s;
    for (const auto& kv : item) {
      const std::string key = kv.first.as<std::string>("");
      if (!kv.second.IsScalar()) return bad(kv.first, "key '" + key + "': expected a value");
      const std::string v = kv.second.Scalar();
      if (key == "name") {
        s.name = v;
      } else if (key == "server") {
        s.server = v;
      } else if (key == "port") {
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1 || n > 65535) {
          return bad(kv.first, "key 'port': '" + v + "' is not a port (1..65535)");
        }
        s.port = static_cast<uint16_t>(n);
      } else {
        return bad(kv.first, "key '" + key + "': unknown (known: name, server, port)");
      }
    }
    map.shards.push_back(s);
  }
  if (Status st = map.Validate(); !st.ok()) {
    return Error(ErrorCode::kConfig, path + ": " + st.message());
  }
  return map;
}

}  // namespace rdmalock
