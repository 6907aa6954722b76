#include "rdmalock/cluster.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>

#include "cluster_test_peer.h"
#include "etcd.h"

namespace rdmalock {
namespace {

constexpr std::chrono::milliseconds kEtcdTimeout{2000};

etcd::Tls TlsOf(const EtcdCluster& e) { return {e.ca_file, e.cert_file, e.key_file}; }

std::string MapKey(const EtcdCluster& e) { return "/rdmalock/" + e.cluster + "/map"; }
std::string PrimaryKey(const EtcdCluster& e, const std::string& shard) {
  return "/rdmalock/" + e.cluster + "/shard/" + shard + "/primary";
}

Result<std::vector<std::string>> ParseShardList(const std::string& text, const std::string& key) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string name = text.substr(pos, comma - pos);
    name.erase(0, name.find_first_not_of(" \t\n"));
    name.erase(name.find_last_not_of(" \t\n") + 1);
    bool ok = !name.empty() && name.size() <= 64 && seen.insert(name).second;
    for (const char ch : name) {
      ok = ok &&
           (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.');
    }
    if (!ok) {
      return Error(ErrorCode::kConfig,
                   "etcd key " + key + " holds '" + text +
                       "': expected distinct shard names (letters, digits, '-', '_', '.'), "
                       "comma-separated");
    }
    out.push_back(name);
    pos = comma + 1;
  }
  return out;
}

// HOST:PORT or [HOST]:PORT, as lockd writes its advertise address.
Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& s,
                                                       const std::string& key) {
  const size_t colon = s.rfind(':');
  unsigned port = 0;
  if (colon != std::string::npos && colon > 0) {
    auto [p, ec] = std::from_chars(s.data() + colon + 1, s.data() + s.size(), port);
    if (ec == std::errc() && p == s.data() + s.size() && port > 0 && port < 65536) {
      std::string host = s.substr(0, colon);
      if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
      }
      return std::make_pair(host, static_cast<uint16_t>(port));
    }
  }
  return Error(ErrorCode::kProtocol, "etcd key " + key + " holds '" + s + "', not HOST:PORT");
}

Result<std::pair<std::string, uint16_t>> Primary(etcd::Client& etcd, const EtcdCluster& e,
                                                 const std::string& shard) {
  const std::string key = PrimaryKey(e, shard);
  RDMALOCK_ASSIGN_OR_RETURN(auto kv, etcd.Get(key, kEtcdTimeout));
  if (!kv.has_value()) {
    return Error(ErrorCode::kConnection,
                 "shard '" + shard + "' has no primary in etcd now (" + key +
                     " is absent; a standby takes it over within its grace period)");
  }
  return ParseHostPort(kv->value, key);
}

}  // namespace

Result<ClusterMap> ReadClusterMap(const EtcdCluster& e) {
  RDMALOCK_ASSIGN_OR_RETURN(auto etcd, etcd::Client::Create(e.endpoints, TlsOf(e)));
  RDMALOCK_ASSIGN_OR_RETURN(auto kv, etcd->Get(MapKey(e), kEtcdTimeout));
  if (!kv.has_value()) {
    return Error(ErrorCode::kConfig, "etcd has no cluster map for cluster '" + e.cluster + "' (" +
                                         MapKey(e) +
                                         "); write one with lockctl --etcd ... cluster init");
  }
  RDMALOCK_ASSIGN_OR_RETURN(auto names, ParseShardList(kv->value, MapKey(e)));
  ClusterMap map;
  for (const auto& n : names) {
    ShardSpec s{n, "", 0};
    if (auto p = Primary(*etcd, e, n); p.ok()) std::tie(s.server, s.port) = *p;
    map.shards.push_back(s);
  }
  return map;
}

Status PublishClusterMap(const EtcdCluster& e, const std::vector<std::string>& shards,
                         bool replace) {
  std::string text;
  for (const auto& s : shards) text += (text.empty() ? "" : ",") + s;
  if (auto parsed = ParseShardList(text, MapKey(e)); !parsed.ok()) {
    return Error(
        ErrorCode::kInvalidArgument,
        "shard names '" + text + "': expected distinct names of letters, digits, '-', '_' and '.'");
  }
  RDMALOCK_ASSIGN_OR_RETURN(auto etcd, etcd::Client::Create(e.endpoints, TlsOf(e)));
  std::optional<etcd::KeyValue> existing;
  RDMALOCK_ASSIGN_OR_RETURN(bool created,
                            etcd->CreateIfAbsent(MapKey(e), text, 0, kEtcdTimeout, &existing));
  if (created || (existing && existing->value == text)) return Status::Ok();
  if (!replace) {
    return Error(ErrorCode::kBusy, "etcd already has a different map for cluster '" + e.cluster +
                                       "': " + (existing ? existing->value : "") +
                                       " (replacing it moves lock names between shards)");
  }
  return etcd->Put(MapKey(e), text, 0, kEtcdTimeout);
}

class ClusterClient::Impl {
 public:
  Impl(ClusterMap m, ClientOptions o)
      : map(std::move(m)), options(std::move(o)), clients(map.shards.size()) {
    for (size_t i = 0; i < map.shards.size(); ++i) order.push_back(i);
    std::sort(order.begin(), order.end(),
              [this](size_t a, size_t b) { return map.shards[a].name < map.shards[b].name; });
  }

  // The library's way to make a shard's session (ClusterTestPeer::ShardConnector).
  static Result<std::unique_ptr<Client>> LibraryConnect(const ClientOptions& o,
                                                        ClusterTestPeer::Resolve resolve) {
    if (resolve) return Client::ConnectResolving(o, std::move(resolve));
    return Client::Connect(o);
  }

  ClusterMap map;
  ClientOptions options;
  std::vector<size_t> order;  // shard indexes in ascending shard name: the global lock order
  std::mutex mu;
  std::vector<std::unique_ptr<Client>> clients;  // by shard index; null until first use
  std::optional<EtcdCluster> etcd_cluster;       // where primaries are looked up, if anywhere
  std::shared_ptr<etcd::Client> etcd;
  ClusterTestPeer::ShardConnector
      connect;  // makes a shard's session (Client::Connect but in tests)

  Result<Client*> Shard(size_t i) {
    if (i >= map.shards.size()) {
      return Error(ErrorCode::kInvalidArgument, "no shard " + std::to_string(i));
    }
    std::lock_guard lk(mu);
    if (clients[i] == nullptr) {
      ClientOptions o = options;
      o.server = map.shards[i].server;
      o.port = map.shards[i].port;
      ClusterTestPeer::Resolve resolve;
      if (etcd != nullptr) {
        resolve = [e = etcd, cluster = *etcd_cluster, shard = map.shards[i].name] {
          return Primary(*e, cluster, shard);
        };
      }
      Result<std::unique_ptr<Client>> c = connect(o, std::move(resolve));
      if (!c.ok()) {
        return Error(c.status().code(),
                     "shard '" + map.shards[i].name + "': " + c.status().message());
      }
      clients[i] = std::move(c).value();
    }
    return clients[i].get();
  }
};

ClusterClient::ClusterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterClient::~ClusterClient() = default;

Result<std::unique_ptr<ClusterClient>> ClusterClient::Connect(const ClusterMap& map,
                                                              const ClientOptions& options) {
  return ClusterTestPeer::Connect(map, options, Impl::LibraryConnect);
}

Result<std::unique_ptr<ClusterClient>> ClusterClient::Connect(const EtcdCluster& etcd,
                                                              const ClientOptions& options) {
  return ClusterTestPeer::Connect(etcd, options, Impl::LibraryConnect);
}

Result<std::unique_ptr<ClusterClient>> ClusterTestPeer::Connect(const ClusterMap& map,
                                                                const ClientOptions& options,
                                                                ShardConnector connector) {
  RDMALOCK_RETURN_IF_ERROR(map.Validate());
  auto impl = std::make_unique<ClusterClient::Impl>(map, options);
  impl->connect = std::move(connector);
  return std::unique_ptr<ClusterClient>(new ClusterClient(std::move(impl)));
}

Result<std::unique_ptr<ClusterClient>> ClusterTestPeer::Connect(const EtcdCluster& etcd,
                                                                const ClientOptions& options,
                                                                ShardConnector connector) {
  RDMALOCK_ASSIGN_OR_RETURN(ClusterMap map, ReadClusterMap(etcd));
  RDMALOCK_ASSIGN_OR_RETURN(auto client, etcd::Client::Create(etcd.endpoints, TlsOf(etcd)));
  auto impl = std::make_unique<ClusterClient::Impl>(map, options);
  impl->etcd_cluster = etcd;
  impl->etcd = std::move(client);
  impl->connect = std::move(connector);
  return std::unique_ptr<ClusterClient>(new ClusterClient(std::move(impl)));
}

size_t ClusterClient::ShardOf(std::string_view name) const {
  return ShardForName(impl_->map, name);
}

const ClusterMap& ClusterClient::map() const { return impl_->map; }

Result<Client*> ClusterClient::Shard(size_t index) { return impl_->Shard(index); }

Result<LockHandle> ClusterClient::Lock(std::string_view name, const LockOptions& options) {
  RDMALOCK_ASSIGN_OR_RETURN(Client * c, impl_->Shard(ShardOf(name)));
  return c->Lock(name, options);
}

Result<LockHandle> ClusterClient::TryLock(std::string_view name, LockMode mode) {
  RDMALOCK_ASSIGN_OR_RETURN(Client * c, impl_->Shard(ShardOf(name)));
  return c->TryLock(name, mode);
}

Result<std::vector<LockHandle>> ClusterClient::LockMany(std::span<const LockRequest> requests,
                                                        const LockOptions& options) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<LockRequest>> by_shard(impl_->map.shards.size());
  for (const LockRequest& r : requests) by_shard[ShardOf(r.name)].push_back(r);
  const auto start = Clock::now();
  std::vector<LockHandle> held;
  for (size_t i : impl_->order) {
    if (by_shard[i].empty()) continue;
    LockOptions o = options;
    if (options.timeout.has_value() && options.timeout->count() > 0) {
      // One deadline for the whole set; a shard reached late gets what is left (at least one
      // attempt).
      const auto used = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      o.timeout = std::max(std::chrono::milliseconds(0), *options.timeout - used);
    }
    auto c = impl_->Shard(i);
    auto part =
        c.ok() ? (*c)->LockMany(by_shard[i], o) : Result<std::vector<LockHandle>>(c.status());
    if (!part.ok()) {
      for (LockHandle& h : held) (void)h.Release();  // all or none
      return part.status();
    }
    for (LockHandle& h : *part) held.push_back(std::move(h));
  }
  return held;
}

}  // namespace rdmalock
