// lockctl's --json output, built with nlohmann-json. The printers of the commands whose output
// holds strings that come from lockd or etcd (client names, peers, shard names and addresses) are
// here so that host tests can feed them any bytes (issue 17, finding 14); the other commands build
// their objects with Json and print them with JsonLine.
//
// What scripts and tests rely on (tests/operator/run.sh, tests/rdma, deploy/perf/run-perf.sh,
// deploy/run-demo.sh): keys in the order the code adds them (ordered_json), compact output (no
// spaces), one object per line, integers as integers. Fractional figures are rounded as the
// printf of earlier versions did (Fixed) and printed in nlohmann's shortest form (1.5, 2.0).
// Every string is valid UTF-8 in the output whatever bytes it held: invalid sequences become
// U+FFFD (nlohmann's error_handler_t::replace; dump() would throw instead).
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "rdmalock/client.h"
#include "rdmalock/cluster.h"

namespace lockctl {

// Keys stay in insertion order: lockctl's output keeps the order of its first versions.
using Json = nlohmann::ordered_json;

// `j` as one line of compact JSON (with the newline); never throws on invalid UTF-8.
std::string JsonLine(const Json& j);
// `j` as compact JSON without a newline.
std::string JsonText(const Json& j);
// One JSON string value (in quotes) for any bytes.
std::string JsonString(std::string_view in);

// `v` rounded to `decimals` places as printf's %.*f rounds it (the figure earlier versions
// printed), as a double for Json.
double Fixed(double v, int decimals);

// "2026-11-29T17:37:15Z" (UTC) for a Unix time in nanoseconds.
std::string FormatTime(uint64_t unix_ns);

const char* RequestStatusName(rdmalock::RequestInfo::Status s);
const char* ModeName(rdmalock::LockMode m);

// lockctl --json clients; `me` is this lockctl's own session.
std::string ClientsJson(const std::vector<rdmalock::SessionInfo>& sessions, uint64_t me);

// A request on the inspected lock, and the session whose record shows it.
struct InspectWho {
  const rdmalock::SessionInfo* session;
  rdmalock::RequestInfo request;
};

// lockctl --json inspect: the lock word of `name` (empty with --slot), then its requests.
std::string InspectJson(const std::string& name, const rdmalock::SlotState& v, const char* state,
                        const std::vector<InspectWho>& who);

// A shard's lockd as HOST:PORT, an IPv6 host in brackets ([fe80::1]:7471), as lockd writes its
// address into etcd; "" when the shard has no server (no primary now).
std::string ShardAddress(const rdmalock::ShardSpec& s);

// lockctl --etcd URL --json cluster: each shard's primary and members.
std::string ClusterJson(const std::string& cluster, const rdmalock::ClusterMap& map,
                        const std::vector<std::vector<std::string>>& members);

}  // namespace lockctl
