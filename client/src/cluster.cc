#include "rdmalock/cluster.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "client/src/cluster_test_peer.h"
#include "client/src/deadline.h"
#include "client/src/options_check.h"
#include "client/src/shard_name.h"
#include "common/etcd/etcd.h"
#include "common/host_port.h"
#include "common/sync/mutex.h"
#include "common/sync/thread_annotations.h"
#include "engine/fork_guard.h"

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
    if (!IsShardName(name) || !seen.insert(name).second) {
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
  if (auto hp = SplitHostPort(s)) return *std::move(hp);
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

// The map in etcd, each shard with its primary now ("" if none), and the map key's mod_revision.
// A primary key holding what is not HOST:PORT leaves that shard's server empty too: one shard's
// garbage must not stop a ClusterClient, or lockctl's commands on another shard (that shard's
// connection fails naming the key when it is used; lockctl cluster names it).
Result<std::pair<ClusterMap, int64_t>> ReadMapAt(etcd::Client& etcd, const EtcdCluster& e,
                                                 std::chrono::milliseconds timeout) {
  auto kv = etcd.Get(MapKey(e), timeout);
  if (!kv.ok()) {
    // kConnection whatever failed, as for the primaries below (cluster.h).
    return Error(ErrorCode::kConnection,
                 "reading the cluster map (" + MapKey(e) + ") from etcd: " + kv.status().message());
  }
  if (!kv->has_value()) {
    return Error(ErrorCode::kConfig, "etcd has no cluster map for cluster '" + e.cluster + "' (" +
                                         MapKey(e) +
                                         "); write one with lockctl --etcd ... cluster init");
  }
  RDMALOCK_ASSIGN_OR_RETURN(auto names, ParseShardList((*kv)->value, MapKey(e)));
  // Every shard's primary in one read (one timeout however many shards); a shard without one
  // leaves its server empty. A read that fails is the map's error: "no primary now" for every
  // shard would be a guess (an operator's lockctl cluster showed it during an etcd hiccup).
  const std::string shards = "/rdmalock/" + e.cluster + "/shard/";
  auto all = etcd.GetPrefix(shards, timeout);
  if (!all.ok()) {
    // kConnection whatever failed (unreachable, an error status, a reply that is no etcd
    // answer): etcd could not be read now, as cluster.h says.
    return Error(ErrorCode::kConnection, "reading the shards' primaries (" + shards +
                                             "*) from etcd: " + all.status().message());
  }
  std::map<std::string, std::string> primaries;
  for (auto& k : *all) primaries[k.key] = std::move(k.value);
  ClusterMap map;
  for (const auto& n : names) {
    ShardSpec s{n, "", 0};
    const std::string key = PrimaryKey(e, n);
    if (auto it = primaries.find(key); it != primaries.end()) {
      if (auto p = SplitHostPort(it->second)) std::tie(s.server, s.port) = *std::move(p);
    }
    map.shards.push_back(s);
  }
  return std::make_pair(std::move(map), (*kv)->mod_revision);
}

}  // namespace

Result<ClusterMap> ReadClusterMap(const EtcdCluster& e) {
  RDMALOCK_ASSIGN_OR_RETURN(auto etcd, etcd::Client::Create(e.endpoints, TlsOf(e)));
  RDMALOCK_ASSIGN_OR_RETURN(auto read, ReadMapAt(*etcd, e, kEtcdTimeout));
  return std::move(read.first);
}

Status PublishClusterMap(const EtcdCluster& e, const std::vector<std::string>& shards,
                         bool replace) {
  // Each name as given: joined and parsed again, {"a,b"} was two shards and " b" lost its space.
  if (shards.empty()) {
    return Error(ErrorCode::kInvalidArgument, "no shard names: a map has at least one shard");
  }
  std::set<std::string> seen;
  for (const auto& s : shards) {
    if (!IsShardName(s) || !seen.insert(s).second) {
      return Error(ErrorCode::kInvalidArgument,
                   "shard name '" + s + "'" + (IsShardName(s) ? " given twice" : "") +
                       ": expected distinct names of letters, digits, '-', '_' and '.'");
    }
  }
  std::string text;
  for (const auto& s : shards) text += (text.empty() ? "" : ",") + s;
  RDMALOCK_ASSIGN_OR_RETURN(auto etcd, etcd::Client::Create(e.endpoints, TlsOf(e)));
  std::optional<etcd::KeyValue> existing;
  RDMALOCK_ASSIGN_OR_RETURN(bool created,
                            etcd->CreateIfAbsent(MapKey(e), text, 0, kEtcdTimeout, &existing));
  if (created) return Status::Ok();
  if (!existing) {
    // CreateIfAbsent did not write, and then says what is there; a key gone again since is a
    // map being changed by someone else now.
    return Error(ErrorCode::kBusy, "the map of cluster '" + e.cluster + "' (" + MapKey(e) +
                                       ") changed while it was written; read it and try again");
  }
  // The same names in the same order is the same map, however the text was written.
  const auto is_this_map = [&](const std::string& value) {
    auto have = ParseShardList(value, MapKey(e));
    return have.ok() && *have == shards;
  };
  if (is_this_map(existing->value)) return Status::Ok();
  if (!replace) {
    return Error(ErrorCode::kBusy, "etcd already has a different map for cluster '" + e.cluster +
                                       "': " + existing->value +
                                       " (replacing it moves lock names between shards)");
  }
  // Over the map just read only: of two replaces at once, one is told it lost, not both that
  // they won.
  RDMALOCK_ASSIGN_OR_RETURN(
      bool wrote, etcd->CompareAndPut(MapKey(e), existing->mod_revision, text, kEtcdTimeout));
  if (!wrote) {
    // A write that landed while its answer came too late, and was tried again on another member,
    // reads as "changed" too: the map in etcd says which.
    auto now = etcd->Get(MapKey(e), kEtcdTimeout);
    if (!now.ok()) {
      // Whether the replace landed is not known: not "another writer" (a usage error to lockctl).
      return Error(ErrorCode::kConnection,
                   "replacing the map of cluster '" + e.cluster + "' (" + MapKey(e) +
                       "): etcd refused the write, and the map could not be read back to see "
                       "whose map is there: " +
                       now.status().message() + "; read it with lockctl cluster");
    }
    if (now->has_value() && is_this_map((*now)->value)) return Status::Ok();
    return Error(ErrorCode::kBusy, "the map of cluster '" + e.cluster + "' (" + MapKey(e) +
                                       ") changed while it was replaced (it was " +
                                       existing->value + "); read it and try again");
  }
  return Status::Ok();
}

// The cluster client's state. Every method may be called from any thread.
// - mu_ guards view_ (swapped whole when etcd has a new map), sessions_ (every shard session ever
//   made, by shard name) and stop_. It is held only to copy or swap pointers: never while
//   connecting a shard or talking to etcd, so one shard's failover stalls no other shard.
// - The refresher thread (a cluster in etcd) re-reads the map every map_refresh; it is the only
//   writer of view_ after construction, and is joined by the destructor.
// - options, connect, etcd_cluster and etcd are set before the client is shared, then const.
class ClusterClient::Impl {
 public:
  // One shard's session, made on first use and kept until the ClusterClient closes (also when a new
  // map drops the shard: handles granted there still renew and release through it).
  // Thread-safety: as below; `client`, once set, is published through `ready`, which the lock
  // path reads without a lock.
  struct ShardSession {
    explicit ShardSession(std::string n) : name(std::move(n)) {}
    const std::string name;
    // connect_mu guards `connecting` and `client`; one thread connects at a time, outside it, and
    // the others wait on `connected` (each until its own deadline). A condition variable rather
    // than a timed_mutex: TSan (GCC 12) does not see pthread_mutex_clocklock, which
    // timed_mutex::try_lock_until uses, and reported its unlock as of an unlocked mutex.
    Mutex connect_mu;
    CondVar connected;
    bool connecting GUARDED_BY(connect_mu) = false;
    std::unique_ptr<Client> client GUARDED_BY(connect_mu);  // set once
    std::atomic<Client*> ready{nullptr};
  };

  // A map in use: immutable once published. An operation routes all of its names by one view.
  struct MapView {
    ClusterMap map;
    std::vector<size_t> order;  // shard indexes in ascending shard name: the global lock order
    std::vector<std::shared_ptr<ShardSession>> sessions;  // by shard index
    int64_t revision = 0;  // the map key's mod_revision in etcd (0: a map given in code)
  };

  Impl(const ClusterMap& m, ClientOptions o, int64_t revision) : options(std::move(o)) {
    view_ = MakeView(m, revision);
  }
  // A forked child's copy (fork_guard.h): its shards' sessions, refresher thread and mutexes are
  // the parent's. Every call fails then, and ~ClusterClient keeps it untouched.
  bool inherited() const { return fork_guard::Generation() != fork_gen; }
  static Status InheritedError() {
    return Error(ErrorCode::kUnsupported,
                 "this cluster client was inherited across fork(): its shards' sessions are the "
                 "parent process's; a child connects a cluster client of its own (after exec)");
  }
  ~Impl() {
    {
      MutexLock lk(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    // etcd calls in flight (the refresher's, a shard keeper's lookup of its primary) end now, and
    // later ones fail at once: the close waited out each one's timeout (2 s) before.
    if (etcd != nullptr) etcd->Cancel();
    if (refresher_.joinable()) refresher_.join();
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The fork generation it was made in (fork_guard::Install first, so that a fork is counted).
  const uint64_t fork_gen = (fork_guard::Install(), fork_guard::Generation());

  // The library's way to make a shard's session (ClusterTestPeer::ShardConnector).
  static Result<std::unique_ptr<Client>> LibraryConnect(const ClientOptions& o,
                                                        ClusterTestPeer::Resolve resolve) {
    if (resolve) return Client::ConnectResolving(o, std::move(resolve));
    return Client::Connect(o);
  }

  std::shared_ptr<const MapView> view() const EXCLUDES(mu_) {
    MutexLock lk(&mu_);
    return view_;
  }

  // A try's shard (TryLock, or a zero timeout): one that another thread of this client is
  // connecting is not waited for, and that is kBusy (not now), as a try reports, not the
  // kTimeout of a call whose time ran out.
  Result<Client*> TryShard(const MapView& v, size_t i) {
    bool another_connects = false;
    auto c = Shard(v, i, std::chrono::steady_clock::now(), &another_connects);
    if (another_connects) return Error(ErrorCode::kBusy, c.status().message());
    return c;  // this thread's own connection's error as it is (a connect timeout, say)
  }

  // The session of shard `i` of `v`, connected on first use. Only this shard's callers wait for
  // its connection, and none past its own `deadline` (kTimeout) for another thread's: a caller
  // that finds another thread connecting the shard waits for it until then (and then sets
  // *another_connects). The caller that connects takes up to the options' connect_timeout,
  // whatever its deadline: the session is the shard's, not this call's.
  Result<Client*> Shard(
      const MapView& v, size_t i,
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
      bool* another_connects = nullptr) {
    if (i >= v.map.shards.size()) {
      return Error(ErrorCode::kInvalidArgument, "no shard " + std::to_string(i));
    }
    ShardSession& s = *v.sessions[i];
    if (Client* c = s.ready.load(std::memory_order_acquire); c != nullptr) return c;
    MutexLock lk(&s.connect_mu);
    while (s.connecting) {
      if (deadline == std::chrono::steady_clock::time_point::max()) {
        s.connected.Wait(lk);
      } else if (s.connected.WaitUntil(lk, deadline) == std::cv_status::timeout && s.connecting) {
        if (another_connects != nullptr) *another_connects = true;
        return Error(ErrorCode::kTimeout,
                     "shard '" + s.name +
                         "' is being connected by another thread of this client, and this "
                         "call's time ran out");
      }
    }
    if (s.client != nullptr) return s.client.get();
    s.connecting = true;
    lk.Unlock();
    ClientOptions o = options;
    o.server = v.map.shards[i].server;
    o.port = v.map.shards[i].port;
    ClusterTestPeer::Resolve resolve;
    if (etcd != nullptr) {
      resolve = [e = etcd, cluster = *etcd_cluster, shard = s.name] {
        return Primary(*e, cluster, shard);
      };
    }
    // An exception (no thread left for the session's keeper, no memory) is an error here: the
    // shard must not stay marked as connecting, and no exception leaves the SDK.
    Result<std::unique_ptr<Client>> c = Error(ErrorCode::kInternal, "not connected");
    try {
      c = connect(o, std::move(resolve));
    } catch (const std::exception& e) {
      c = Error(ErrorCode::kResource, std::string("connecting failed: ") + e.what());
    }
    lk.Lock();
    s.connecting = false;
    s.connected.SignalAll();
    if (!c.ok()) {
      return Error(c.status().code(), "shard '" + s.name + "': " + c.status().message());
    }
    s.client = std::move(c).value();
    s.ready.store(s.client.get(), std::memory_order_release);
    return s.client.get();
  }

  // Starts re-reading the map from etcd every `every` (a cluster in etcd; once, before use).
  // kResource when the thread cannot be made (std::thread throws; no exception leaves the SDK).
  Status StartRefresh(std::chrono::milliseconds every) {
    if (every.count() <= 0) return Status::Ok();
    try {
      refresher_ = std::thread([this, every] { RefreshLoop(every); });
    } catch (const std::exception& e) {  // std::system_error, std::bad_alloc
      return Error(ErrorCode::kResource,
                   std::string("cannot start the cluster map's refresh thread: ") + e.what());
    }
    return Status::Ok();
  }

  ClientOptions options;
  // Makes a shard's session (Impl::LibraryConnect, but in tests).
  ClusterTestPeer::ShardConnector connect;
  std::optional<EtcdCluster> etcd_cluster;  // where primaries are looked up, if anywhere
  std::shared_ptr<etcd::Client> etcd;

 private:
  // A view of `m`, reusing the sessions of shards already known by name. Takes mu_.
  std::shared_ptr<const MapView> MakeView(const ClusterMap& m, int64_t revision) EXCLUDES(mu_) {
    auto v = std::make_shared<MapView>();
    v->map = m;
    v->revision = revision;
    for (size_t i = 0; i < m.shards.size(); ++i) v->order.push_back(i);
    std::sort(v->order.begin(), v->order.end(),
              [&m](size_t a, size_t b) { return m.shards[a].name < m.shards[b].name; });
    MutexLock lk(&mu_);
    for (const ShardSpec& spec : m.shards) {
      auto& s = sessions_[spec.name];
      if (s == nullptr) s = std::make_shared<ShardSession>(spec.name);
      v->sessions.push_back(s);
    }
    return v;
  }

  void RefreshLoop(std::chrono::milliseconds every) EXCLUDES(mu_) {
    MutexLock lk(&mu_);
    for (;;) {
      if (cv_.WaitFor(lk, every, [this] {
            mu_.AssertHeld();
            return stop_;
          })) {
        return;
      }
      const int64_t have = view_->revision;
      lk.Unlock();
      // A map that cannot be read now (etcd unreachable, the key deleted or garbled) leaves the
      // one in use as it is. Each call has etcd's usual timeout, whatever the interval: with
      // min(every, 2 s), a map_refresh shorter than etcd's answers (each call a new connection,
      // over TLS a handshake too) failed every refresh, and the first map stayed for ever.
      auto read = ReadMapAt(*etcd, *etcd_cluster, kEtcdTimeout);
      std::shared_ptr<const MapView> fresh;
      if (read.ok() && read->second != have) fresh = MakeView(read->first, read->second);
      lk.Lock();
      if (fresh != nullptr) view_ = std::move(fresh);
    }
  }

  mutable Mutex mu_;
  CondVar cv_;  // stop_
  std::shared_ptr<const MapView> view_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<ShardSession>> sessions_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread refresher_;
};

ClusterClient::ClusterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterClient::~ClusterClient() {
  // A forked child's copy: nothing of it is torn down (no join of the parent's refresher, no
  // mutex a parent's thread may have held at fork(), no shard session closed).
  if (impl_ != nullptr && impl_->inherited())
    fork_guard::Bury(std::shared_ptr<Impl>(std::move(impl_)));
}

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
  RDMALOCK_RETURN_IF_ERROR(sdk::CheckClientOptions(options, /*port_elsewhere=*/true));
  auto impl = std::make_unique<ClusterClient::Impl>(map, options, 0);
  impl->connect = std::move(connector);
  return std::unique_ptr<ClusterClient>(new ClusterClient(std::move(impl)));
}

Result<std::unique_ptr<ClusterClient>> ClusterTestPeer::Connect(const EtcdCluster& etcd,
                                                                const ClientOptions& options,
                                                                ShardConnector connector) {
  RDMALOCK_RETURN_IF_ERROR(sdk::CheckClientOptions(options, /*port_elsewhere=*/true));
  // Checked here: the refresher's wait adds it to now(), and near milliseconds::max() that
  // overflowed (stop 55's review); a negative one meant "never" without saying so.
  if (etcd.map_refresh.count() < 0 || etcd.map_refresh > EtcdCluster::kMaxMapRefresh) {
    return Error(ErrorCode::kInvalidArgument, "EtcdCluster::map_refresh is " +
                                                  std::to_string(etcd.map_refresh.count()) +
                                                  " ms; give 0 (never) or 1 ms to 366 days");
  }
  RDMALOCK_ASSIGN_OR_RETURN(auto client, etcd::Client::Create(etcd.endpoints, TlsOf(etcd)));
  RDMALOCK_ASSIGN_OR_RETURN(auto read, ReadMapAt(*client, etcd, kEtcdTimeout));
  auto impl = std::make_unique<ClusterClient::Impl>(read.first, options, read.second);
  impl->etcd_cluster = etcd;
  impl->etcd = std::move(client);
  impl->connect = std::move(connector);
  RDMALOCK_RETURN_IF_ERROR(impl->StartRefresh(etcd.map_refresh));
  return std::unique_ptr<ClusterClient>(new ClusterClient(std::move(impl)));
}

size_t ClusterClient::ShardOf(std::string_view name) const {
  if (impl_->inherited()) return 0;
  return ShardForName(impl_->view()->map, name);
}

ClusterMap ClusterClient::map() const {
  return impl_->inherited() ? ClusterMap{} : impl_->view()->map;
}

int64_t ClusterClient::map_revision() const {
  return impl_->inherited() ? 0 : impl_->view()->revision;
}

Result<Client*> ClusterClient::ShardFor(std::string_view name, std::string* shard_name) {
  if (impl_->inherited()) return Impl::InheritedError();
  auto v = impl_->view();
  const size_t index = ShardForName(v->map, name);
  if (shard_name != nullptr) *shard_name = v->map.shards[index].name;
  return impl_->Shard(*v, index);
}

Result<Client*> ClusterClient::Shard(size_t index) {
  if (impl_->inherited()) return Impl::InheritedError();
  auto v = impl_->view();
  return impl_->Shard(*v, index);
}

namespace {
// The latest a call with `options` may wait for a shard's connection.
std::chrono::steady_clock::time_point DeadlineOf(const LockOptions& options) {
  using SteadyClock = std::chrono::steady_clock;
  if (!options.timeout.has_value()) return SteadyClock::time_point::max();
  return sdk::DeadlineAfter(SteadyClock::now(), *options.timeout);
}
}  // namespace

namespace {
// Refused before a shard is picked and connected (Client::Lock would refuse it only then).
Status CheckName(std::string_view name) {
  if (name.empty()) return Error(ErrorCode::kInvalidArgument, "lock name is empty");
  return Status::Ok();
}
}  // namespace

Result<LockHandle> ClusterClient::Lock(std::string_view name, const LockOptions& options) {
  if (impl_->inherited()) return Impl::InheritedError();
  RDMALOCK_RETURN_IF_ERROR(CheckName(name));
  auto v = impl_->view();
  const auto start = std::chrono::steady_clock::now();
  RDMALOCK_ASSIGN_OR_RETURN(
      Client * c, options.timeout.has_value() && options.timeout->count() <= 0
                      ? impl_->TryShard(*v, ShardForName(v->map, name))
                      : impl_->Shard(*v, ShardForName(v->map, name), DeadlineOf(options)));
  if (!options.timeout.has_value() || options.timeout->count() <= 0) return c->Lock(name, options);
  // The time the shard's connection took (its first use, or the wait for another thread's)
  // counts in the timeout: the lock gets what is left, and at least one attempt (as a set's
  // shards, LockMany).
  LockOptions o = options;
  const auto used = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  o.timeout = std::max(std::chrono::milliseconds(0), *options.timeout - used);
  auto h = c->Lock(name, o);
  // Its time ran out, whatever the last attempt (a try, with nothing left) said.
  if (!h.ok() && h.status().code() == ErrorCode::kBusy) {
    return Error(ErrorCode::kTimeout, "the " + std::to_string(options.timeout->count()) +
                                          " ms ran out (connecting its shard took " +
                                          std::to_string(used.count()) +
                                          " ms): " + h.status().message());
  }
  return h;
}

Result<LockHandle> ClusterClient::TryLock(std::string_view name, LockMode mode) {
  if (impl_->inherited()) return Impl::InheritedError();
  RDMALOCK_RETURN_IF_ERROR(CheckName(name));
  auto v = impl_->view();
  RDMALOCK_ASSIGN_OR_RETURN(Client * c, impl_->TryShard(*v, ShardForName(v->map, name)));
  return c->TryLock(name, mode);
}

Result<std::vector<LockHandle>> ClusterClient::LockMany(std::span<const LockRequest> requests,
                                                        const LockOptions& options) {
  using SteadyClock = std::chrono::steady_clock;
  if (impl_->inherited()) return Impl::InheritedError();
  for (const LockRequest& r : requests) RDMALOCK_RETURN_IF_ERROR(CheckName(r.name));
  const auto v = impl_->view();  // the whole set is routed by one map
  std::vector<std::vector<LockRequest>> by_shard(v->map.shards.size());
  for (const LockRequest& r : requests) by_shard[ShardForName(v->map, r.name)].push_back(r);
  const auto start = SteadyClock::now();
  const bool budget = options.timeout.has_value() && options.timeout->count() > 0;
  std::vector<LockHandle> held;
  // All or none: on any failure, what the set holds so far is released.
  auto fail = [&held](Status st) -> Result<std::vector<LockHandle>> {
    for (LockHandle& h : held) (void)h.Release();
    return st;
  };
  // A part granted earlier can be lost while a later shard's part waits (its session ended, its
  // lease ran out): the set is then not held, and must not be returned as if it were.
  auto lost = [&held, &v](const std::string& after) -> Status {
    for (const LockHandle& h : held) {
      if (h.state() != LockState::kHeld) {
        return Error(ErrorCode::kLockLost, "a lock of the set was lost while " + after +
                                               " (map revision " + std::to_string(v->revision) +
                                               ")");
      }
    }
    return Status::Ok();
  };
  for (size_t i : v->order) {
    if (by_shard[i].empty()) continue;
    const std::string& shard = v->map.shards[i].name;
    // A zero timeout (a try) waits for no other thread's connection of the shard: kBusy, as
    // TryLock.
    auto c = options.timeout && options.timeout->count() <= 0
                 ? impl_->TryShard(*v, i)
                 : impl_->Shard(*v, i,
                                options.timeout ? sdk::DeadlineAfter(start, *options.timeout)
                                                : SteadyClock::time_point::max());
    if (!c.ok()) return fail(c.status());
    LockOptions o = options;
    if (budget) {
      // One deadline for the whole set; a shard reached late gets what is left (at least one
      // attempt).
      const auto used =
          std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - start);
      o.timeout = std::max(std::chrono::milliseconds(0), *options.timeout - used);
    }
    auto part = (*c)->LockMany(by_shard[i], o);
    if (!part.ok()) {
      Status st = part.status();
      // The caller gave a budget, and it ran out: that is a timeout, whatever the last
      // attempt (a try, with nothing left) said.
      if (budget && st.code() == ErrorCode::kBusy) {
        st =
            Error(ErrorCode::kTimeout, "the set's " + std::to_string(options.timeout->count()) +
                                           " ms ran out at shard '" + shard + "': " + st.message());
      }
      return fail(st);
    }
    for (LockHandle& h : *part) held.push_back(std::move(h));
    if (Status st = lost("shard '" + shard + "' was taken"); !st.ok()) return fail(st);
  }
  return held;
}

}  // namespace rdmalock
