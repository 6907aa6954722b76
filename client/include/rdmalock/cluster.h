// A sharded lock space: many lockds (shards) behind one client. A lock name picks its shard by
// rendezvous hashing, then its slot inside that shard as with one lockd (SlotForName). The client
// keeps one session per shard it uses, opened on first use.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmalock/client.h"
#include "rdmalock/export.h"
#include "rdmalock/status.h"

namespace rdmalock {

// One shard: its name (what the hash uses: renaming a shard moves its locks) and its lockd.
struct ShardSpec {
  std::string name;
  std::string server;
  uint16_t port = 7471;
};

// The cluster map: every shard, in any order (the hash does not depend on the order).
struct RDMALOCK_EXPORT ClusterMap {
  std::vector<ShardSpec> shards;
  // At least one shard; names unique, each 1 to 64 letters, digits, '-', '_' or '.'; servers
  // non-empty, no server:port named twice.
  Status Validate() const;
};

// The index in `map.shards` of the shard that owns `name`: the shard with the highest
// XXH3-64(lock name, seed XXH3-64(shard name)). Adding or removing a shard moves only the
// names that shard gains or loses (about 1/n of them).
RDMALOCK_EXPORT size_t ShardForName(const ClusterMap& map, std::string_view name);

// A cluster whose map and primaries live in etcd (lockd's cluster mode; docs/operations.md,
// "Failover with etcd"). The map is the shard names in /rdmalock/<cluster>/map; each shard's
// primary is in /rdmalock/<cluster>/shard/<name>/primary, and moves when a standby takes over.
struct EtcdCluster {
  // http://HOST:PORT or https://HOST:PORT of etcd members (any number, >= 1)
  std::vector<std::string> endpoints;
  std::string cluster = "default";
  // For https: the CA of etcd's certificate ("" trusts the system's CAs), and a client
  // certificate and its key for an etcd that requires one (both or neither). PEM files.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // How often a ClusterClient re-reads the map: 0 (never) or 1 ms to kMaxMapRefresh, else
  // ClusterClient::Connect fails kInvalidArgument. A new map (lockctl cluster init --replace)
  // routes new acquires from then on; see ClusterClient.
  std::chrono::milliseconds map_refresh{1000};
  static constexpr std::chrono::hours kMaxMapRefresh{24 * 366};
};

// Reads the map from etcd: every shard, with its current primary as server ("" if it has none
// now). A failed read of the map or of the primaries is the error (kConnection for etcd
// unreachable or failing), never a map whose shards seem to have no primary. A primary key that
// holds no HOST:PORT (not lockd's writing) also reads as "" (lockctl cluster names it).
RDMALOCK_EXPORT Result<ClusterMap> ReadClusterMap(const EtcdCluster& etcd);
// Writes the shard names as the cluster's map. Each name is checked as given (letters, digits,
// '-', '_', '.'; distinct; at least one), else kInvalidArgument naming it. A map in etcd with the
// same names in the same order is this map (Ok). An existing, different map is replaced only with
// `replace` (renaming, adding or removing a shard moves names between shards; see
// docs/operations.md before doing it on a live cluster), and only if it is still the map read:
// kBusy if another writer changed it meanwhile (of two replaces at once, one is told it lost).
RDMALOCK_EXPORT Status PublishClusterMap(const EtcdCluster& etcd,
                                         const std::vector<std::string>& shards, bool replace);

// Thread-safety: any number of threads may share a ClusterClient. Each shard's session is made
// on the first use of that shard, by that caller; only callers of the same shard wait for it.
//
// A map kept in etcd is re-read every EtcdCluster::map_refresh. When it changes (its etcd
// revision moves), new acquires route by the new map; a handle already granted keeps its shard
// (it renews and releases there, and stays held), and so does the session of a shard the new
// map drops, until the client closes. A name that moved can therefore be held on its old shard
// and on its new one at once: change the map only while the names that move are not in use
// (docs/operations.md, "Changing the map").
class RDMALOCK_EXPORT ClusterClient {
 public:
  // Checks the map; connects to no shard yet. `options.server` and `.port` are ignored (each
  // shard's come from the map); everything else applies to every shard's session.
  static Result<std::unique_ptr<ClusterClient>> Connect(const ClusterMap& map,
                                                        const ClientOptions& options);
  // Reads the map from etcd; each shard's session connects to the shard's primary as etcd names
  // it, and reconnects to whichever lockd etcd names next when the session ends (a failover).
  // Locks held through a failover are reported lost, as with a lockd restart.
  static Result<std::unique_ptr<ClusterClient>> Connect(const EtcdCluster& etcd,
                                                        const ClientOptions& options);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // As Client::Lock and Client::TryLock, on the shard that owns `name` (connected first if this
  // is its first use). A try (TryLock, or a zero timeout) does not wait while another thread of
  // this client connects that shard: kBusy, as for a lock found taken. A timeout bounds the wait
  // for another thread's connection of the shard and counts the time connecting took, but the
  // connection this call makes itself takes up to ClientOptions::connect_timeout (the session it
  // makes is the shard's, for every later call).
  Result<LockHandle> Lock(std::string_view name, const LockOptions& options = {});
  Result<LockHandle> TryLock(std::string_view name, LockMode mode = LockMode::kExclusive);
  // A set of locks across shards, all or none. Shards are taken one after another in the map's
  // order of shard names, each shard's part with Client::LockMany (ascending slots when it must
  // wait), so two sets never deadlock: every client follows one global order, (shard name,
  // slot). The whole set is routed by one map. On failure no lock of the set is held: kTimeout
  // when the timeout (one budget for the whole set) runs out, kBusy only for a zero timeout,
  // kLockLost when a part taken earlier was lost (its session ended, its lease ran out) while a
  // later part was being taken. The handles come back grouped by shard in that order, every one
  // held when the call returns.
  Result<std::vector<LockHandle>> LockMany(std::span<const LockRequest> requests,
                                           const LockOptions& options = {});

  // The index in map() of the shard that owns `name` now. A map in etcd can change between this
  // call and the next (map(), Shard(index)), and an index then names another shard (a map's
  // shards reordered or one added): to act on a name's shard, use ShardFor.
  size_t ShardOf(std::string_view name) const;
  // The session with the shard that owns `name` now, connected on first use, and (if
  // `shard_name` is set) that shard's name: both by one map.
  Result<Client*> ShardFor(std::string_view name, std::string* shard_name = nullptr);
  // The map in use now (a copy: a map in etcd can change under it).
  ClusterMap map() const;
  // The etcd revision of the map in use (its key's mod_revision); 0 for a map given in code.
  int64_t map_revision() const;
  // The session with shard `index` of map() as it is now, connected on first use (kConnection
  // if it cannot be reached). The Client lives as long as this ClusterClient.
  Result<Client*> Shard(size_t index);

  class Impl;

 private:
  friend class ClusterTestPeer;  // tests' seam (client/src/cluster_test_peer.h), not installed
  explicit ClusterClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdmalock
