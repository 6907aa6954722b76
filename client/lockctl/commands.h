// lockctl's commands, one file each (cmd_*.cc), and the connection they share (connect.cc).
// main.cc parses the command line (args.h) and calls one of these; each returns lockctl's exit
// status (the codes in args.h) after printing its output or why it failed.
// Thread-safety: called from main's thread, once per process (acquire and bench fork children of
// their own).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/lockctl/args.h"
#include "client/lockctl/bench.h"
#include "common/etcd/etcd.h"
#include "rdmalock/client.h"
#include "rdmalock/cluster.h"

namespace lockctl {

// ---- connect.cc

// The cluster map of --cluster FILE or --etcd URL; on failure prints why and returns false
// (*unavailable: etcd could not be reached).
bool LoadClusterMap(const Common& c, rdmalock::ClusterMap* map, std::string* source,
                    bool* unavailable);
// How a map from --etcd is named in messages.
std::string EtcdSource(const Common& c);
// For shard `s` of the map from --etcd, shown without a primary: reads its primary key again.
// Absent: true, `s` unchanged (no primary now). A primary since the map's read: true, `s` gets
// it. A value that is not HOST:PORT (the map reads it as none too), or a read that fails: false,
// after saying so on stderr naming the key (both are exit 69, unavailable).
bool RecheckPrimary(const Common& c, rdmalock::etcd::Client& etcd, rdmalock::ShardSpec* s);
// The index in `map` (read from `source`) of shard --shard, once the command's lock names
// (Common::check_names), if any, are on it by the map; map.shards.size() after printing why not.
size_t NamedShard(const Common& c, const rdmalock::ClusterMap& map, const std::string& source);
// Where the command's lockd is (Target::usage_error after printing why not).
Target TargetOf(const Common& c);
// A session with that lockd, or null after printing why not and setting *exit_code.
std::unique_ptr<rdmalock::Client> ConnectOrDie(const Common& c, int* exit_code);
// A session with every shard of the cluster map (--cluster or --etcd), or null as above; each
// connection may take `connect_at_least` if that is longer than the connect timeout.
std::unique_ptr<rdmalock::ClusterClient> ConnectClusterOrDie(
    const Common& c, int* exit_code,
    std::chrono::milliseconds connect_at_least = std::chrono::milliseconds(0));

// ---- the commands

int CmdStatus(const Common& c);
int CmdClients(const Common& c);
int CmdInspect(const Common& c, const std::string& name, int64_t slot);
int CmdRelease(const Common& c, bool force, const std::string& name, int64_t slot, int64_t session,
               const std::string& socket_path);
int CmdTop(const Common& c, int interval_ms, int rows, int iterations,
           const std::vector<std::string>& names);
int CmdAcquire(const Common& c, const std::string& name, bool shared, int64_t timeout_ms,
               int grace_ms, const std::vector<std::string>& cmd);
int CmdCluster(const Common& c, const std::string& init, bool replace);
int CmdBench(const Common& c, const BenchOptions& opts);

}  // namespace lockctl
