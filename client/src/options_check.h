// What Client::Connect checks of its ClientOptions' values before any connection (client.cc), for
// ClusterClient::Connect too, which connects to no shard then: an option found bad at Connect is
// that call's error, not the first lock's.
//
// Thread-safety: a free function, any thread.
#pragma once

#include "rdmalock/client.h"
#include "rdmalock/status.h"

namespace rdmalock::sdk {

// kInvalidArgument for a connect_timeout out of range (1 ms to 366 days) or a port of 0 (unless
// `port_elsewhere`: a resolver or a shard map gives it). The auth key is not checked here: a
// cluster's key errors come from each shard's first connection, with lockctl's exit status for
// a failed connection (69), as a single client's do.
Status CheckClientOptions(const ClientOptions& options, bool port_elsewhere);

}  // namespace rdmalock::sdk
