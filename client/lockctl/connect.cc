// Where lockctl's commands find lockd: the target of --server, RDMALOCK_SERVER, the client config
// file, or a cluster map (--cluster FILE, --etcd URL), and the connection to it.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <tuple>
#include <utility>

#include "client/lockctl/commands.h"
#include "common/etcd/etcd.h"
#include "common/host_port.h"
#include "common/text_file.h"

namespace lockctl {

std::string EtcdSource(const Common& c) { return "etcd cluster " + c.etcd_cluster; }

bool RecheckPrimary(const Common& c, rdmalock::etcd::Client& etcd, rdmalock::ShardSpec* s) {
  // Not "(none now)" or "try again" for a key that holds garbage: an operator would wait for a
  // takeover that happened, or cannot happen while the key is there (listed by an earlier
  // review, left until 2026-12-07).
  const std::string key = "/rdmalock/" + c.etcd_cluster + "/shard/" + s->name + "/primary";
  auto primary = etcd.Get(key, std::chrono::milliseconds(2000));
  if (!primary.ok()) {
    std::cerr << "lockctl: reading the primary of shard '" << s->name << "' (" << key
              << ") from etcd: " << primary.status().message() << "\n";
    return false;
  }
  if (!primary->has_value()) return true;
  if (auto hp = rdmalock::SplitHostPort((*primary)->value)) {
    std::tie(s->server, s->port) = *std::move(hp);
    return true;
  }
  std::cerr << "lockctl: etcd key " << key << " holds '" << (*primary)->value
            << "', not HOST:PORT: shard '" << s->name
            << "' has no primary that clients can reach (lockd writes its advertise address "
               "there; delete the key, and the shard's lockds campaign again)\n";
  return false;
}

bool LoadClusterMap(const Common& c, rdmalock::ClusterMap* map, std::string* source,
                    bool* unavailable) {
  if (!c.etcd.empty()) {
    auto read = rdmalock::ReadClusterMap(c.Etcd());
    if (!read.ok()) {
      std::cerr << "lockctl: " << read.status().message() << "\n";
      *unavailable = read.status().code() == rdmalock::ErrorCode::kConnection;
      return false;
    }
    *map = *read;
    *source = EtcdSource(c);
    return true;
  }
  const auto text = rdmalock::ReadTextFile(c.cluster_file);
  if (!text.ok()) {
    std::cerr << "lockctl: cannot read cluster map " << text.status().message() << "\n";
    return false;
  }
  *source = c.cluster_file;
  return ParseClusterMap(*text, c.cluster_file, map);
}

size_t NamedShard(const Common& c, const rdmalock::ClusterMap& map, const std::string& source) {
  size_t shard = map.shards.size();
  for (size_t i = 0; i < map.shards.size(); ++i) {
    if (map.shards[i].name == c.shard) shard = i;
  }
  if (shard == map.shards.size()) {
    std::cerr << "lockctl: no shard '" << c.shard << "' in " << source << "\n";
    return shard;
  }
  // The command's lock lives where the map puts its name: on another shard, --shard would
  // acquire a lock no other client of the cluster contends for, or force-release whatever
  // holds the same slot on the wrong lockd. (inspect may look at any shard's slot.)
  for (const std::string& name : c.check_names) {
    if (const size_t on = rdmalock::ShardForName(map, name); on != shard) {
      std::cerr << "lockctl: lock '" << name << "' is on shard '" << map.shards[on].name << "' by "
                << source << ", not on --shard '" << c.shard
                << "'; drop --shard, or name the lock's shard\n";
      return map.shards.size();
    }
  }
  return shard;
}

namespace {

// The options of lockctl's sessions, with `t`'s key and connect timeout (from the flags and
// client.yaml).
rdmalock::ClientOptions Options(const Common& c, const Target& t) {
  rdmalock::ClientOptions o;
  o.connect_timeout = std::chrono::milliseconds(t.connect_timeout_ms);
  o.client_name = "lockctl";
  o.record_requests = c.record_requests;
  o.local_handover = c.local_handover;
  // The environment's key (RDMALOCK_AUTH_KEY, RDMALOCK_AUTH_KEY_FILE) wins over the config file's.
  const bool env_key = std::getenv("RDMALOCK_AUTH_KEY") != nullptr ||
                       std::getenv("RDMALOCK_AUTH_KEY_FILE") != nullptr;
  if (!c.auth_key_file.empty() || !env_key) o.auth_key_file = t.auth_key_file;
  return o;
}

// For a map's lockds: the key and connect timeout of the flags, else client.yaml's (its server
// and port are not used). False after printing why the file is bad.
bool ReadKeyAndTimeout(const Common& c, Target* t) {
  t->auth_key_file = c.auth_key_file;
  t->connect_timeout_ms = c.connect_timeout_ms;
  return ReadClientConfig(ClientConfigPath(), true, true, c.timeout_given, t);
}

}  // namespace

Target TargetOf(const Common& c) {
  Target t;
  t.port = c.port;
  t.auth_key_file = c.auth_key_file;
  if (!c.cluster_file.empty() || !c.etcd.empty()) {
    rdmalock::ClusterMap map;
    std::string source;
    if (!LoadClusterMap(c, &map, &source, &t.unavailable)) {
      t.usage_error = true;
      return t;
    }
    size_t shard = map.shards.size();
    if (!c.shard.empty()) {
      shard = NamedShard(c, map, source);
      if (shard == map.shards.size()) {
        t.usage_error = true;
        return t;
      }
    } else if (!c.route_name.empty()) {
      shard = rdmalock::ShardForName(map, c.route_name);
    } else {
      std::cerr << "lockctl: with a cluster map, this command needs --shard NAME\n";
      t.usage_error = true;
      return t;
    }
    if (map.shards[shard].server.empty() && !c.etcd.empty()) {
      auto etcd = rdmalock::etcd::Client::Create(
          c.etcd, {c.etcd_ca_file, c.etcd_cert_file, c.etcd_key_file});
      if (!etcd.ok() || !RecheckPrimary(c, **etcd, &map.shards[shard])) {
        if (!etcd.ok()) std::cerr << "lockctl: " << etcd.status().message() << "\n";
        t.usage_error = true;
        t.unavailable = true;
        return t;
      }
    }
    t.server = map.shards[shard].server;
    t.port = map.shards[shard].port;
    t.source = source + ", shard " + map.shards[shard].name;
    if (t.server.empty()) {  // from etcd: the shard has no primary now
      std::cerr << "lockctl: shard '" << map.shards[shard].name
                << "' has no primary in etcd now (a standby takes over within its grace "
                   "period; try again)\n";
      t.usage_error = true;
      t.unavailable = true;
      return t;
    }
    if (!ReadKeyAndTimeout(c, &t)) t.usage_error = true;
    return t;
  }
  t.connect_timeout_ms = c.connect_timeout_ms;
  if (!c.server.empty()) {
    t.server = c.server, t.source = "--server";
  } else if (const char* env = std::getenv("RDMALOCK_SERVER"); env != nullptr && *env != '\0') {
    t.server = env, t.source = "RDMALOCK_SERVER";
  }
  const std::string path = ClientConfigPath();
  if (!ReadClientConfig(path, !t.server.empty(), c.port_given, c.timeout_given, &t)) {
    t.usage_error = true;
    return t;
  }
  if (t.server.empty()) {
    std::cerr << "lockctl: no server: pass --server ADDRESS, set RDMALOCK_SERVER, or put "
                 "'server: ADDRESS' in "
              << (path.empty() ? "~/.config/rdmalock/client.yaml" : path) << "\n";
    t.usage_error = true;
  }
  return t;
}

std::unique_ptr<rdmalock::Client> ConnectOrDie(const Common& c, int* exit_code) {
  const Target t = TargetOf(c);
  if (t.usage_error) {
    *exit_code = t.unavailable ? kExitUnavailable : kExitUsage;
    return nullptr;
  }
  rdmalock::ClientOptions o = Options(c, t);
  o.server = t.server;
  o.port = static_cast<uint16_t>(t.port);
  auto client = rdmalock::Client::Connect(o);
  if (!client.ok()) {
    std::cerr << "lockctl: lockd at " << t.server << ":" << t.port << " (server from " << t.source
              << "): " << client.status().ToString() << "\n";
    *exit_code = kExitUnavailable;
    return nullptr;
  }
  return std::move(client).value();
}

std::unique_ptr<rdmalock::ClusterClient> ConnectClusterOrDie(
    const Common& c, int* exit_code, std::chrono::milliseconds connect_at_least) {
  // A map from etcd is read once, by ClusterClient::Connect (which routes by it).
  rdmalock::ClusterMap map;
  std::string source = EtcdSource(c);
  bool unavailable = false;
  if (c.etcd.empty() && !LoadClusterMap(c, &map, &source, &unavailable)) {
    *exit_code = unavailable ? kExitUnavailable : kExitUsage;
    return nullptr;
  }
  Target t;
  if (!ReadKeyAndTimeout(c, &t)) {
    *exit_code = kExitUsage;
    return nullptr;
  }
  rdmalock::ClientOptions o = Options(c, t);
  o.connect_timeout = std::max(o.connect_timeout, connect_at_least);
  auto client = c.etcd.empty() ? rdmalock::ClusterClient::Connect(map, o)
                               : rdmalock::ClusterClient::Connect(c.Etcd(), o);
  if (!client.ok()) {
    std::cerr << "lockctl: cluster from " << source << ": " << client.status().ToString() << "\n";
    *exit_code =
        client.status().code() == rdmalock::ErrorCode::kConnection ? kExitUnavailable : kExitUsage;
    return nullptr;
  }
  return std::move(client).value();
}

}  // namespace lockctl
