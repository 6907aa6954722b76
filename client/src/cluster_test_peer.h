// Seams into a ClusterClient for host tests (issue 17, finding 12). Not installed, not part of the
// API, and not exported from librdmalock.so: the tests link the SDK statically
// (rdmalock_sdk_testing) to make each shard's session over the in-process backend (a test lockd
// per shard: tests/support/fake_lockd.h, through ClientTestPeer::Connect).
// Thread-safety: static functions; the connector is called from whichever thread first uses a
// shard (several shards' connectors may run at once).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "rdmalock/client.h"
#include "rdmalock/cluster.h"

namespace rdmalock {

class ClusterTestPeer {
 public:
  // Where a shard's lockd is now (its primary in etcd), asked before every connection attempt.
  using Resolve = std::function<Result<std::pair<std::string, uint16_t>>()>;
  // Makes one shard's session. `options` carries the shard's server and port from the map;
  // `resolve` is set for a cluster kept in etcd (then server and port are to be ignored). The
  // library's own is Client::Connect, or Client::ConnectResolving with `resolve`.
  using ShardConnector =
      std::function<Result<std::unique_ptr<Client>>(const ClientOptions& options, Resolve resolve)>;

  static Result<std::unique_ptr<ClusterClient>> Connect(const ClusterMap& map,
                                                        const ClientOptions& options,
                                                        ShardConnector connector);
  static Result<std::unique_ptr<ClusterClient>> Connect(const EtcdCluster& etcd,
                                                        const ClientOptions& options,
                                                        ShardConnector connector);
};

}  // namespace rdmalock
