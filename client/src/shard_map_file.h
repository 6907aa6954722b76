// The cluster map file (YAML `shards: - {name, server, port}`, as lockctl --cluster reads it) for
// the C API's rdmalock_cluster_open. Internal to librdmalock: not installed, not exported.
// Thread-safety: a pure function of the file; any thread.
#pragma once

#include <string>

#include "rdmalock/cluster.h"
#include "rdmalock/status.h"

namespace rdmalock {

// Reads and validates the map at `path`: kIo if it cannot be read, kConfig (naming the file, the
// line and the key) if it is not a valid map.
Result<ClusterMap> ReadClusterMapFile(const std::string& path);

}  // namespace rdmalock
