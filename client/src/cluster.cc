#include "rdmalock/cluster.h"

#include <algorithm>
#include <chrono>
#include <mutex>

namespace rdmalock {

class ClusterClient::Impl {
 public:
  ClusterMap map;
  ClientOptions options;
  std::vector<size_t> order;  // shard indexes in ascending shard name: the global lock order
  std::mutex mu;
  std::vector<std::unique_ptr<Client>> clients;  // by shard index; null until first use

  Result<Client*> Shard(size_t i) {
    if (i >= map.shards.size()) {
      return Error(ErrorCode::kInvalidArgument, "no shard " + std::to_string(i));
    }
    std::lock_guard lk(mu);
    if (clients[i] == nullptr) {
      ClientOptions o = options;
      o.server = map.shards[i].server;
      o.port = map.shards[i].port;
      auto c = Client::Connect(o);
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
  RDMALOCK_RETURN_IF_ERROR(map.Validate());
  auto impl = std::make_unique<Impl>();
  impl->map = map;
  impl->options = options;
  impl->clients.resize(map.shards.size());
  for (size_t i = 0; i < map.shards.size(); ++i) impl->order.push_back(i);
  std::sort(impl->order.begin(), impl->order.end(),
            [&map](size_t a, size_t b) { return map.shards[a].name < map.shards[b].name; });
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
