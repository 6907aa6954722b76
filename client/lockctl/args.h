// lockctl's command line and client config file, parsed without touching the network (so that
// the parsing can be fuzzed on its own: tests/fuzz/fuzz_lockctl_args.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/lockctl/bench.h"
#include "rdmalock/cluster.h"

namespace lockctl {

// Exit codes (also in --help, lockctl(1) and the README).
inline constexpr int kExitUsage = 64;
inline constexpr int kExitUnavailable = 69;
inline constexpr int kExitInternal = 70;
inline constexpr int kExitIo = 74;  // standard output could not be written (sysexits' EX_IOERR)
inline constexpr int kExitTimeout = 75;
inline constexpr int kExitLost = 76;

// bench's limits.
inline constexpr int kMaxProcesses = 256;
inline constexpr int kMaxThreads = 1024;                  // per process
inline constexpr uint64_t kMaxLocks = uint64_t{1} << 28;  // lockd's largest lock table

struct Common {
  std::string server;
  int port = 7471;
  int connect_timeout_ms = 5000;
  bool port_given = false, timeout_given = false;  // on the command line
  bool json = false;
  bool record_requests = true;
  bool local_handover = true;  // ClientOptions::local_handover (bench --no-local-handover)
  std::string auth_key_file;   // --auth-key-file
  // --cluster FILE: a cluster map; the command's lock name (route_name, set from the command's
  // arguments) or --shard picks the lockd.
  std::string cluster_file, shard, route_name;
  // The lock names the command acts on (acquire, release --force) or labels (top --name): with
  // --shard each must be on that shard by the map. (inspect routes by its name, but may look at
  // any shard's slot.)
  std::vector<std::string> check_names;
  // --etcd URL (repeatable) and --etcd-cluster NAME: the cluster map and each shard's primary
  // come from etcd (lockd's cluster mode) instead of a file.
  std::vector<std::string> etcd;
  std::string etcd_cluster = "default";
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file;  // for https:// endpoints
  // The descriptors from 3 up that lockctl was started with (`3<file`), ascending: acquire's
  // command gets them, and none of lockctl's own.
  std::vector<int> inherited_fds;
  rdmalock::EtcdCluster Etcd() const {
    return {etcd, etcd_cluster, etcd_ca_file, etcd_cert_file, etcd_key_file};
  }
};

// Where lockctl finds lockd: --server, else $RDMALOCK_SERVER, else the client config file
// ($XDG_CONFIG_HOME/rdmalock/client.yaml or ~/.config/rdmalock/client.yaml: keys server, port,
// connect_timeout_ms). --port and --connect-timeout-ms given on the command line win over the
// file.
struct Target {
  std::string server, source;
  std::string auth_key_file;  // --auth-key-file, else 'auth_key_file' in the file
  int port = 7471;
  int connect_timeout_ms = 5000;
  bool usage_error = false;
  bool unavailable = false;  // with usage_error: the map is fine but the shard has no lockd now
};

enum class Command {
  kStatus,
  kClients,
  kInspect,
  kRelease,
  kAcquire,
  kTop,
  kBench,
  kKeygen,
  kCluster
};

// Reads a cluster map (YAML: `shards:` a list of {name, server, port}); on error prints it (file,
// line, key) and returns false.
bool ParseClusterMap(const std::string& text, const std::string& path, rdmalock::ClusterMap* out);

// Everything the command line says.
struct Args {
  Common common;
  Command command = Command::kStatus;
  std::string inspect_name;
  int64_t inspect_slot = -1;
  bool rel_force = false;
  std::string rel_name, rel_socket = "/run/rdmalock/lockd.sock";
  int64_t rel_slot = -1, rel_session = -1;
  std::string acq_name;
  bool acq_shared = false;
  int64_t acq_timeout = -1;
  int acq_grace = -1;  // ms from SIGTERM to SIGKILL; -1: a quarter of lockd's lease
  std::vector<std::string> acq_cmd;
  // cluster [init SHARDS [--replace]]
  std::string cluster_init;
  bool cluster_replace = false;
  int top_interval = 1000, top_rows = 20, top_iterations = 0;
  std::vector<std::string> top_names;
  BenchOptions bench;
};

// Parses argv into *args. Returns -1 when args->command should run; otherwise the exit status
// (0 after --help or --version, kExitUsage for a usage error), having printed what to print.
int ParseArgs(int argc, char** argv, Args* args);

// $XDG_CONFIG_HOME/rdmalock/client.yaml, else ~/.config/rdmalock/client.yaml ("" if neither is
// set).
std::string ClientConfigPath();
// Applies the client config `text` (read from `path`, named in messages) to `t`: only the keys
// the command line left open. False after printing a message that names the file, line and key.
bool ParseClientConfig(const std::string& text, const std::string& path, bool have_server,
                       bool have_port, bool have_timeout, Target* t);
// The same for the file at `path`; a missing file is fine.
bool ReadClientConfig(const std::string& path, bool have_server, bool have_port, bool have_timeout,
                      Target* t);

}  // namespace lockctl
