// lockd's configuration: every key has a default, so lockd runs with no file at all. Unknown keys
// and bad values are errors that name the file, the line and the key.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rdmalock/status.h"

namespace rdmalock::lockd {

// The ranges of lockd.yaml's time keys, in their units (milliseconds; etcd_lease_ttl_s in
// seconds). The command line's time flags have the same ranges (main.cc).
struct TimeRange {
  int64_t lo, hi;
};
inline constexpr TimeRange kLeaseMsRange{10, 3'600'000};
inline constexpr TimeRange kHeartbeatIntervalMsRange{10, 600'000};
inline constexpr TimeRange kHeartbeatTimeoutMsRange{20, 3'600'000};
inline constexpr TimeRange kRestartGraceMsRange{0, 3'600'000};
inline constexpr TimeRange kEtcdLeaseTtlSRange{2, 600};
inline constexpr TimeRange kLivenessTimeoutMsRange{0, 3'600'000};
// The most max_clients may be (lockd.yaml's key and --max-clients): every session's requests on
// one lock word must fit the 32,767 a 16-bit field counts, and the SDK gives each
// 32,767 / max_clients (at least 4; issue 16, finding 11).
inline constexpr uint32_t kMaxClientsLimit = 8191;

struct Config {
  std::string address = "0.0.0.0";  // address to listen on (an IP of the RDMA device, or any)
  uint16_t port = 7471;             // rdma_cm port
  uint64_t lock_count = 65536;      // slots in the lock table (16 bytes each, pinned)
  uint64_t lease_ms = 2000;         // L: a holder's lease
  uint32_t stall_factor = 2;        // F: waiters recover after F x L without progress (F >= 2)
  uint32_t max_clients = 1024;      // client sessions at once (a session's threads share one)
  // Connection attempts admitted per second from one address (a burst of as many); 0: no limit.
  // A thread joining its own session with the right key is not counted.
  uint32_t max_connects_per_second = 100;
  uint64_t heartbeat_interval_ms = 200;  // how often clients write their heartbeat
  uint64_t heartbeat_timeout_ms = 1000;  // a session whose heartbeat stops this long is fenced
  uint64_t restart_grace_ms = 0;         // refuse clients this long after an unclean stop
                                         // (0: one lease; otherwise at least one lease)
  std::string state_dir = "/var/lib/rdmalock";  // where the epoch persists; "" keeps it in memory
  std::string admin_socket = "/run/rdmalock/lockd.sock";  // local admin socket; "" disables
  std::string log_level = "info";  // trace, debug, info, warn, error, critical, off
  // Where lockd serves Prometheus metrics over HTTP (GET /metrics), HOST:PORT; "" serves none.
  std::string metrics_address = "127.0.0.1:9477";
  // A file holding the shared key clients must prove they know (mode 0600, the service user's);
  // "" admits any client that reaches the port.
  std::string auth_key_file;
  // Address ranges clients may connect from (CIDR); empty: any.
  std::vector<std::string> allow_from;
  // Hand each connection type-2 memory windows bound to its QP instead of the regions' rkeys, so
  // that a fenced client's rkeys stop working at once, and scope writes to the client's own
  // session record. Off only for a device without memory windows.
  bool memory_windows = true;
  // QPs (threads) one session may open, the first included. Each brings up to rd_atomic
  // outstanding READs/atomics (the NIC enforces that), so this bounds a session's requests.
  uint32_t max_connections_per_session = 256;

  // Cluster mode (docs/operations.md, "Failover with etcd"): with etcd endpoints, lockd serves
  // only while it is its shard's primary in etcd, and campaigns for that with a standby of the
  // same shard. Without, lockd serves alone (the default).
  std::vector<std::string> etcd_endpoints;  // http://HOST:PORT, any number of etcd members
  std::string cluster = "default";          // the etcd key prefix: /rdmalock/<cluster>/
  std::string shard;                        // this lockd's shard (required with etcd_endpoints)
  // What clients are told to connect to, HOST:PORT; "" means address:port (address must then be
  // a real address, not 0.0.0.0).
  std::string advertise_address;
  // The TTL of lockd's lease in etcd: a dead primary is detected within it, and a primary cut
  // off from etcd stops serving before it ends. etcd raises TTLs under 2 s to 2 s.
  uint32_t etcd_lease_ttl_s = 5;
  uint64_t liveness_timeout_ms = 0;  // T (cluster mode); 0: twice heartbeat_timeout_ms
  // For https:// endpoints: the CA of etcd's certificate ("" trusts the system's), and this
  // lockd's client certificate and key if etcd requires one (both or neither).
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;

  // The effective configuration as YAML, every key included.
  std::string ToYaml() const;
  // The restart grace period in effect (restart_grace_ms, or one lease when 0).
  uint64_t GraceMs() const { return restart_grace_ms == 0 ? lease_ms : restart_grace_ms; }
  bool cluster_mode() const { return !etcd_endpoints.empty(); }
  // The grace period a new primary waits before it serves: a client lease plus the old
  // primary's etcd lease, at least (restart_grace_ms if that is longer).
  // T (cluster mode): a client trusts its leases only while it has seen lockd's event loop tick
  // within this time. 0 in the file means twice heartbeat_timeout_ms.
  uint64_t LivenessTimeoutMs() const {
    return liveness_timeout_ms != 0 ? liveness_timeout_ms : 2 * heartbeat_timeout_ms;
  }
  // A new primary serves only once every lease of the old one has ended: the old primary's
  // clients stop trusting it T after its last tick, which came no later than its etcd lease's
  // end; their leases end L after their last renewal at the latest.
  // etcd_ttl_s: the TTL etcd grants (it raises one below its minimum), if more than configured.
  uint64_t TakeoverGraceMs(uint64_t etcd_ttl_s = 0) const {
    const uint64_t ttl_s = std::max<uint64_t>(etcd_lease_ttl_s, etcd_ttl_s);
    return std::max<uint64_t>(GraceMs(), lease_ms + ttl_s * 1000 + LivenessTimeoutMs());
  }
  // The event loop's tick (heartbeat and QP checks, the info page's clock): a fraction of the
  // heartbeat timeout, no finer, within 5 ms to 1 s.
  uint64_t LivenessTickMs() const {
    return std::clamp<uint64_t>(std::min(heartbeat_interval_ms, heartbeat_timeout_ms / 4), 5, 1000);
  }
  // advertise_address, or address:port.
  std::string Advertised() const;
};

// lockd fences a client that stopped within heartbeat_timeout_ms plus two ticks (one to see its
// heartbeat's last move, one to see the timeout), and reads its record then; waiters may recover
// its locks from (stall_factor - 1) x lease_ms after it stopped. A warning (else empty) when the
// fence may come later: a shared request of that record could then be one waiters recovered
// before the slot was reset, and lockd's reap of it would count a release for a later reader
// (docs/protocol.md section 11). Not refused: it takes 32,768 requests on one lock in that window.
std::string FenceMarginWarning(const Config& c);

// Parses YAML text and validates the result; `origin` names the file in messages.
Result<Config> ParseConfig(const std::string& text, const std::string& origin);
// Reads a file: each key checked on its own (type, unit, range; a message names its line), then
// `overrides` (lockd's command line, which stands in for the file's keys) applied over them, then
// the whole validated as lockd will run it (Validate; its message names the file, and says when
// the command line changed any key). So a file that names etcd but leaves the shard to --shard
// is valid with --shard and refused without it.
Result<Config> LoadConfig(const std::string& path,
                          const std::function<void(Config*)>& overrides = nullptr);
// Checks ranges and relations between keys.
Status Validate(const Config& c);
// The keys whose values differ between two configs, in file order (a reload applies log_level at
// once; every other key needs a restart).
std::vector<std::string> ChangedKeys(const Config& a, const Config& b);

// What one RDMA device can hold (from ibv_query_device).
struct DeviceLimits {
  std::string name;
  uint64_t max_qp = 0, max_mr = 0, max_mw = 0;
};
// Checks the configured limits against a device's. Every session needs one QP, one registration
// of its record and (with memory windows) 4 windows per connection, besides lockd's own 3
// registrations and its loopback: max_clients sessions that cannot fit are an error naming the
// key to lower. A session's further connections past what the device holds are only a warning
// (`*warning`, else empty): such joins are refused as no_resources, and only the joining thread
// fails.
Status CheckDeviceLimits(const Config& c, const DeviceLimits& d, std::string* warning);

// Whether `address` is a wildcard (every device's address): "0.0.0.0", "::" or "*".
bool IsAnyAddress(const std::string& address);

// An RDMA device lockd could serve clients through, and whether its atomics are atomic against
// other devices' too (atomic_cap IBV_ATOMIC_GLOB) or only against its own (IBV_ATOMIC_HCA).
struct DeviceAtomics {
  std::string name;
  bool global = false;
};
// The lock words take FETCH_AND_ADD and COMPARE_AND_SWAP from every client and from lockd's
// loopback, and a device's atomics are atomic only against that device's unless it says GLOB: two
// clients reaching the lock table through two devices could both be granted one lock. So a
// wildcard address, which serves every device, is refused with more than one device unless all
// are GLOB; a single address (one device's IP) serves its device only, and the loopback connects
// through that address too.
Status CheckAtomicScope(const Config& c, const std::vector<DeviceAtomics>& devices);

}  // namespace rdmalock::lockd
