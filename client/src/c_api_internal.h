// A seam into the C API for host tests: wraps a ClusterClient made over test lockds
// (ClusterTestPeer, cluster_test_peer.h) as an rdmalock_cluster_t, and a Client made over one
// (ClientTestPeer, client_test_peer.h) as an rdmalock_client_t, so the C entry points run over
// fakes. Not installed and not exported from librdmalock.so (hidden visibility); the tests link
// the SDK statically (rdmalock_sdk_testing).
// Thread-safety: a plain function; the handle it returns follows rdmalock.h's rules.
#pragma once

#include <memory>

#include "rdmalock/client.h"
#include "rdmalock/cluster.h"
#include "rdmalock/rdmalock.h"

namespace rdmalock {

// Takes ownership; free the result with rdmalock_cluster_close.
rdmalock_cluster_t* WrapClusterForTesting(std::unique_ptr<ClusterClient> cluster);
// Takes ownership; free the result with rdmalock_close.
rdmalock_client_t* WrapClientForTesting(std::unique_ptr<Client> client);

}  // namespace rdmalock
