#include "server/config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "common/duration.h"
#include "common/etcd/etcd.h"
#include "common/host_port.h"
#include "common/text_file.h"
#include "common/yaml_keys.h"
#include "rdmalock/proto/layout.h"
#include "server/acl.h"
#include "server/budgets.h"
#include "server/metrics.h"

namespace rdmalock::lockd {
namespace {

std::string Where(const std::string& origin, const YAML::Node& node, const std::string& key) {
  return origin + ":" + std::to_string(node.Mark().line + 1) + ": key '" + key + "'";
}

template <typename T>
Status ReadUnsigned(const std::string& origin, const std::string& key, const YAML::Node& node,
                    uint64_t lo, uint64_t hi, T* out) {
  if (!node.IsScalar())
    return Error(ErrorCode::kConfig, Where(origin, node, key) + ": expected a number");
  const std::string s = node.Scalar();
  uint64_t v = 0;
  size_t used = 0;
  try {
    if (s.empty() || s[0] == '-') throw std::invalid_argument("negative");
    v = std::stoull(s, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size()) {
    return Error(ErrorCode::kConfig,
                 Where(origin, node, key) + ": '" + s + "' is not a non-negative integer");
  }
  if (v < lo || v > hi) {
    return Error(ErrorCode::kConfig, Where(origin, node, key) + ": " + s + " is out of range [" +
                                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

// A time key: "2s", "500ms", "1m30s", or a plain number in the key's unit (what the file held
// before units were accepted), stored as a whole count of `unit` in [lo, hi].
template <typename T>
Status ReadDuration(const std::string& origin, const std::string& key, const YAML::Node& node,
                    DurationUnit unit, uint64_t lo, uint64_t hi, T* out) {
  if (!node.IsScalar()) {
    return Error(ErrorCode::kConfig, Where(origin, node, key) + ": expected a duration (2s, or " +
                                         BareUnitHint(unit) + ")");
  }
  auto v = ParseDurationIn(node.Scalar(), unit, static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  if (!v.ok())
    return Error(ErrorCode::kConfig, Where(origin, node, key) + ": " + v.status().message());
  *out = static_cast<T>(*v);
  return Status::Ok();
}

Status ReadString(const std::string& origin, const std::string& key, const YAML::Node& node,
                  std::string* out) {
  if (!node.IsScalar() && !node.IsNull()) {
    return Error(ErrorCode::kConfig, Where(origin, node, key) + ": expected a string");
  }
  *out = node.IsNull() ? "" : node.Scalar();
  return Status::Ok();
}

// A list of strings, each checked by `check` (whose message is given with the item's line); null
// is the empty list.
template <typename Check>
Status ReadList(const std::string& origin, const std::string& key, const YAML::Node& node,
                const char* what, Check check, std::vector<std::string>* out) {
  out->clear();
  if (node.IsNull()) return Status::Ok();
  if (!node.IsSequence()) {
    return Error(ErrorCode::kConfig, Where(origin, node, key) + ": expected a list of " + what);
  }
  for (const auto& item : node) {
    std::string s;
    RDMALOCK_RETURN_IF_ERROR(ReadString(origin, key, item, &s));
    if (Status st = check(s); !st.ok()) {
      return Error(ErrorCode::kConfig, Where(origin, item, key) + ": " + st.message());
    }
    out->push_back(s);
  }
  return Status::Ok();
}

Status ReadBool(const std::string& origin, const std::string& key, const YAML::Node& node,
                bool* out) {
  if (node.IsScalar()) {
    const std::string v = node.Scalar();
    if (v == "true" || v == "yes" || v == "on") {
      *out = true;
      return Status::Ok();
    }
    if (v == "false" || v == "no" || v == "off") {
      *out = false;
      return Status::Ok();
    }
  }
  return Error(ErrorCode::kConfig, Where(origin, node, key) + ": expected true or false");
}

const std::set<std::string>& LogLevels() {
  static const std::set<std::string> levels = {"trace", "debug",    "info", "warn",
                                               "error", "critical", "off"};
  return levels;
}

}  // namespace

Status Validate(const Config& c) {
  if (c.lock_count < proto::kMinLockCount || c.lock_count > proto::kMaxLockCount) {
    return Error(ErrorCode::kConfig,
                 "lock_count must be in [1, " + std::to_string(proto::kMaxLockCount) + "]");
  }
  if (c.stall_factor < 2) {
    return Error(ErrorCode::kConfig, "stall_factor must be at least 2 (one lease of margin)");
  }
  if (LogLevels().count(c.log_level) == 0) {
    return Error(ErrorCode::kConfig, "log_level '" + c.log_level +
                                         "' is not one of trace, debug, info, warn, error, "
                                         "critical, off");
  }
  if (c.address.empty()) return Error(ErrorCode::kConfig, "address is empty");
  for (const std::string& r : c.allow_from) {
    RDMALOCK_RETURN_IF_ERROR(Cidr::Parse(r).status().WithContext("allow_from"));
  }
  if (c.max_connections_per_session == 0) {
    return Error(ErrorCode::kConfig, "max_connections_per_session must be at least 1");
  }
  if (!c.metrics_address.empty()) {
    std::string host;
    uint16_t port = 0;
    RDMALOCK_RETURN_IF_ERROR(
        ParseHostPort(c.metrics_address, &host, &port).WithContext("metrics_address"));
  }
  if (c.heartbeat_timeout_ms < 2 * c.heartbeat_interval_ms) {
    return Error(ErrorCode::kConfig, "heartbeat_timeout_ms (" +
                                         std::to_string(c.heartbeat_timeout_ms) +
                                         ") must be at least twice heartbeat_interval_ms (" +
                                         std::to_string(c.heartbeat_interval_ms) + ")");
  }
  if (c.cluster_mode()) {
    for (const auto& e : c.etcd_endpoints) {
      RDMALOCK_RETURN_IF_ERROR(etcd::ParseEndpoint(e).status().WithContext("etcd_endpoints"));
    }
    auto name_ok = [](const std::string& n) {
      if (n.empty() || n.size() > 64) return false;
      for (const char ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') {
          return false;
        }
      }
      return true;
    };
    if (c.shard.empty()) {
      return Error(ErrorCode::kConfig,
                   "etcd_endpoints is set but shard is not: name the shard this lockd serves");
    }
    RDMALOCK_RETURN_IF_ERROR(etcd::CheckTlsEndpoints(
        c.etcd_endpoints, {c.etcd_ca_file, c.etcd_cert_file, c.etcd_key_file}));
    if (c.etcd_cert_file.empty() != c.etcd_key_file.empty()) {
      return Error(ErrorCode::kConfig,
                   "etcd_cert_file and etcd_key_file go together: give both or neither");
    }
    if (!name_ok(c.shard) || !name_ok(c.cluster)) {
      return Error(ErrorCode::kConfig, "shard '" + c.shard + "' and cluster '" + c.cluster +
                                           "' must be 1-64 letters, digits, '-', '_' or '.'");
    }
    std::string host;
    uint16_t port = 0;
    if (c.advertise_address.empty()) {
      // Every wildcard lockd listens on (IsAnyAddress: "*" too), or clients are told "*:7471".
      if (IsAnyAddress(c.address)) {
        return Error(ErrorCode::kConfig,
                     "in cluster mode clients must be told where to connect: set "
                     "advertise_address (HOST:PORT) or a real address (not " +
                         c.address + ")");
      }
    } else {
      RDMALOCK_RETURN_IF_ERROR(
          ParseHostPort(c.advertise_address, &host, &port).WithContext("advertise_address"));
    }
  }
  if (c.max_clients < 1 || c.max_clients > kMaxClientsLimit) {
    return Error(ErrorCode::kConfig,
                 "max_clients (" + std::to_string(c.max_clients) + ") must be 1 to " +
                     std::to_string(kMaxClientsLimit) +
                     ": the requests of every session on one lock word must "
                     "fit the 32767 a 16-bit counter holds (each session gets 32767 / "
                     "max_clients of them)");
  }
  if (c.state_dir.empty() && !c.cluster_mode()) {
    // The epoch leads every fencing token and must grow across restarts; without a place to keep
    // it, every start would be epoch 1 and tokens would go backwards (issue 16, finding 6).
    return Error(ErrorCode::kConfig,
                 "state_dir is empty: lockd keeps its epoch there so that fencing tokens grow "
                 "across restarts; name a directory (in cluster mode etcd keeps it instead)");
  }
  if (c.LivenessTimeoutMs() < c.heartbeat_timeout_ms + 2 * c.heartbeat_interval_ms) {
    // Clients see lockd tick through their heartbeat READs: T must cover a tick interval (at
    // most a quarter of the heartbeat timeout) and two heartbeat intervals, with room to spare.
    return Error(ErrorCode::kConfig,
                 "liveness_timeout_ms (" + std::to_string(c.LivenessTimeoutMs()) +
                     ") must be at least heartbeat_timeout_ms + 2 x heartbeat_interval_ms (" +
                     std::to_string(c.heartbeat_timeout_ms + 2 * c.heartbeat_interval_ms) +
                     "), or 0 for twice heartbeat_timeout_ms");
  }
  if (c.restart_grace_ms != 0 && c.restart_grace_ms < c.lease_ms) {
    return Error(ErrorCode::kConfig, "restart_grace_ms (" + std::to_string(c.restart_grace_ms) +
                                         ") must be 0 (one lease) or at least lease_ms (" +
                                         std::to_string(c.lease_ms) +
                                         "): old holders' leases must run out first");
  }
  return Status::Ok();
}

namespace {

// The keys of YAML text, each checked on its own; the checks across keys are Validate's.
Result<Config> ParseKeys(const std::string& text, const std::string& origin) {
  Config c;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Error(ErrorCode::kConfig,
                 origin + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
  if (root.IsNull()) return c;  // an empty file: all defaults
  if (!root.IsMap()) {
    return Error(ErrorCode::kConfig, origin + ": the top level must be a mapping of keys");
  }
  if (auto d = FindDuplicateKey(root)) return Error(ErrorCode::kConfig, d->Message(origin));
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      Status st;
      if (key == "address") {
        st = ReadString(origin, key, v, &c.address);
      } else if (key == "port") {
        st = ReadUnsigned(origin, key, v, 1, 65535, &c.port);
      } else if (key == "lock_count") {
        st =
            ReadUnsigned(origin, key, v, proto::kMinLockCount, proto::kMaxLockCount, &c.lock_count);
      } else if (key == "lease_ms") {
        st = ReadDuration(origin, key, v, DurationUnit::kMilliseconds, kLeaseMsRange.lo,
                          kLeaseMsRange.hi, &c.lease_ms);
      } else if (key == "stall_factor") {
        st = ReadUnsigned(origin, key, v, 2, 100, &c.stall_factor);
      } else if (key == "max_clients") {
        // At most 8,191 (kMaxClientsLimit, config.h: why).
        st = ReadUnsigned(origin, key, v, 1, kMaxClientsLimit, &c.max_clients);
      } else if (key == "max_connects_per_second") {
        st = ReadUnsigned(origin, key, v, 0, 1'000'000, &c.max_connects_per_second);
      } else if (key == "heartbeat_interval_ms") {
        st = ReadDuration(origin, key, v, DurationUnit::kMilliseconds, kHeartbeatIntervalMsRange.lo,
                          kHeartbeatIntervalMsRange.hi, &c.heartbeat_interval_ms);
      } else if (key == "heartbeat_timeout_ms") {
        st = ReadDuration(origin, key, v, DurationUnit::kMilliseconds, kHeartbeatTimeoutMsRange.lo,
                          kHeartbeatTimeoutMsRange.hi, &c.heartbeat_timeout_ms);
      } else if (key == "restart_grace_ms") {
        st = ReadDuration(origin, key, v, DurationUnit::kMilliseconds, kRestartGraceMsRange.lo,
                          kRestartGraceMsRange.hi, &c.restart_grace_ms);
      } else if (key == "admin_socket") {
        st = ReadString(origin, key, v, &c.admin_socket);
      } else if (key == "metrics_address") {
        st = ReadString(origin, key, v, &c.metrics_address);
        std::string host;
        uint16_t port = 0;
        if (st.ok() && !c.metrics_address.empty()) {
          st = ParseHostPort(c.metrics_address, &host, &port);
          if (!st.ok()) st = Error(ErrorCode::kConfig, Where(origin, v, key) + ": " + st.message());
        }
      } else if (key == "auth_key_file") {
        st = ReadString(origin, key, v, &c.auth_key_file);
      } else if (key == "allow_from") {
        st = ReadList(
            origin, key, v, "address ranges, e.g. [10.0.0.0/8, 192.0.2.7]",
            [](const std::string& r) { return Cidr::Parse(r).status(); }, &c.allow_from);
      } else if (key == "memory_windows") {
        st = ReadBool(origin, key, v, &c.memory_windows);
      } else if (key == "max_connections_per_session") {
        st = ReadUnsigned(origin, key, v, 1, 65536, &c.max_connections_per_session);
      } else if (key == "etcd_endpoints") {
        st = ReadList(
            origin, key, v, "etcd endpoints, e.g. [http://10.0.0.1:2379, http://10.0.0.2:2379]",
            [](const std::string& e) { return etcd::ParseEndpoint(e).status(); },
            &c.etcd_endpoints);
      } else if (key == "cluster") {
        st = ReadString(origin, key, v, &c.cluster);
      } else if (key == "shard") {
        st = ReadString(origin, key, v, &c.shard);
      } else if (key == "advertise_address") {
        st = ReadString(origin, key, v, &c.advertise_address);
      } else if (key == "etcd_ca_file") {
        st = ReadString(origin, key, v, &c.etcd_ca_file);
      } else if (key == "etcd_cert_file") {
        st = ReadString(origin, key, v, &c.etcd_cert_file);
      } else if (key == "etcd_key_file") {
        st = ReadString(origin, key, v, &c.etcd_key_file);
      } else if (key == "etcd_lease_ttl_s") {
        st = ReadDuration(origin, key, v, DurationUnit::kSeconds, kEtcdLeaseTtlSRange.lo,
                          kEtcdLeaseTtlSRange.hi, &c.etcd_lease_ttl_s);
      } else if (key == "liveness_timeout_ms") {
        st = ReadDuration(origin, key, v, DurationUnit::kMilliseconds, kLivenessTimeoutMsRange.lo,
                          kLivenessTimeoutMsRange.hi, &c.liveness_timeout_ms);
      } else if (key == "state_dir") {
        st = ReadString(origin, key, v, &c.state_dir);
      } else if (key == "log_level") {
        st = ReadString(origin, key, v, &c.log_level);
        if (st.ok() && LogLevels().count(c.log_level) == 0) {
          st = Error(ErrorCode::kConfig, Where(origin, v, key) + ": '" + c.log_level +
                                             "' is not one of trace, debug, info, warn, error, "
                                             "critical, off");
        }
      } else {
        st = Error(ErrorCode::kConfig, Where(origin, kv.first, key) + ": unknown key");
      }
      RDMALOCK_RETURN_IF_ERROR(st);
    }
  } catch (const YAML::Exception& e) {
    return Error(ErrorCode::kConfig, origin + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  return c;
}

}  // namespace

Result<Config> ParseConfig(const std::string& text, const std::string& origin) {
  auto c = ParseKeys(text, origin);
  if (!c.ok()) return c;
  RDMALOCK_RETURN_IF_ERROR(Validate(*c).WithContext(origin));
  return c;
}

Result<Config> LoadConfig(const std::string& path, const std::function<void(Config*)>& overrides) {
  auto text = ReadTextFile(path);
  if (!text.ok())
    return Error(ErrorCode::kConfig, "cannot read config file " + text.status().message());
  auto c = ParseKeys(*text, path);
  if (!c.ok()) return c;
  std::string origin = path;
  if (overrides) {
    const std::string file_only = c->ToYaml();
    overrides(&*c);
    // A value that is wrong may be the command line's: the message says it took part.
    if (c->ToYaml() != file_only) origin += " with the command line's keys over it";
  }
  RDMALOCK_RETURN_IF_ERROR(Validate(*c).WithContext(origin));
  return c;
}

namespace {

// A YAML double-quoted scalar: parses back to exactly `v`, whatever it holds.
std::string Quoted(const std::string& v) {
  std::string o = "\"";
  for (const char ch : v) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      o += buf;
    } else {
      o += ch;
    }
  }
  return o + "\"";
}

}  // namespace

std::string Config::ToYaml() const {
  std::ostringstream o;
  o << "address: " << Quoted(address) << "\n"
    << "port: " << port << "\n"
    << "lock_count: " << lock_count << "\n"
    << "lease_ms: " << lease_ms << "\n"
    << "stall_factor: " << stall_factor << "\n"
    << "max_clients: " << max_clients << "\n"
    << "max_connects_per_second: " << max_connects_per_second << "\n"
    << "heartbeat_interval_ms: " << heartbeat_interval_ms << "\n"
    << "heartbeat_timeout_ms: " << heartbeat_timeout_ms << "\n"
    << "restart_grace_ms: " << restart_grace_ms << "\n"
    << "state_dir: " << Quoted(state_dir) << "\n"
    << "admin_socket: " << Quoted(admin_socket) << "\n"
    << "log_level: " << Quoted(log_level) << "\n"
    << "metrics_address: " << Quoted(metrics_address) << "\n"
    << "auth_key_file: " << Quoted(auth_key_file) << "\n"
    << "allow_from: [";
  for (size_t i = 0; i < allow_from.size(); ++i) o << (i ? ", " : "") << Quoted(allow_from[i]);
  o << "]\n"
    << "memory_windows: " << (memory_windows ? "true" : "false") << "\n"
    << "max_connections_per_session: " << max_connections_per_session << "\n"
    << "etcd_endpoints: [";
  for (size_t i = 0; i < etcd_endpoints.size(); ++i) {
    o << (i ? ", " : "") << Quoted(etcd_endpoints[i]);
  }
  o << "]\n"
    << "cluster: " << Quoted(cluster) << "\n"
    << "shard: " << Quoted(shard) << "\n"
    << "advertise_address: " << Quoted(advertise_address) << "\n"
    << "etcd_lease_ttl_s: " << etcd_lease_ttl_s << "\n"
    << "liveness_timeout_ms: " << liveness_timeout_ms << "\n"
    << "etcd_ca_file: " << Quoted(etcd_ca_file) << "\n"
    << "etcd_cert_file: " << Quoted(etcd_cert_file) << "\n"
    << "etcd_key_file: " << Quoted(etcd_key_file) << "\n";
  return o.str();
}

}  // namespace rdmalock::lockd

namespace rdmalock::lockd {

std::string Config::Advertised() const {
  if (!advertise_address.empty()) return advertise_address;
  return JoinHostPort(address, port);
}

bool IsAnyAddress(const std::string& a) { return a == "0.0.0.0" || a == "::" || a == "*"; }

Status CheckAtomicScope(const Config& c, const std::vector<DeviceAtomics>& devices) {
  if (!IsAnyAddress(c.address) || devices.size() < 2) return Status::Ok();
  std::string names, local;
  for (const DeviceAtomics& d : devices) {
    names += (names.empty() ? "" : ", ") + d.name;
    if (!d.global) local += (local.empty() ? "" : ", ") + d.name;
  }
  if (local.empty()) return Status::Ok();
  return Error(ErrorCode::kConfig,
               "address " + c.address + " serves the lock table through " +
                   std::to_string(devices.size()) + " RDMA devices (" + names +
                   "), and the atomics of " + local +
                   " are atomic only within their own device (atomic_cap HCA, not GLOB): two "
                   "clients connected through different devices could both be granted one lock. "
                   "Set address (lockd.yaml, --address) to the IP of one device's port");
}

std::string FenceMarginWarning(const Config& c) {
  const uint64_t fence = c.heartbeat_timeout_ms + 2 * c.LivenessTickMs();
  const uint64_t recover = uint64_t{c.stall_factor - 1} * c.lease_ms;
  if (fence < recover) return "";
  return "heartbeat_timeout_ms " + std::to_string(c.heartbeat_timeout_ms) +
         " (a stopped client is fenced within " + std::to_string(fence) +
         " ms) is not below (stall_factor - 1) x lease_ms = " + std::to_string(recover) +
         " ms (when waiters may recover its locks): lockd may read its record after waiters "
         "recovered a request there, and a reset of that lock since would let lockd free a later "
         "reader's grant; lower heartbeat_timeout_ms or raise lease_ms or stall_factor "
         "(docs/protocol.md, section 11)";
}

Status CheckDeviceLimits(const Config& c, const DeviceLimits& d, std::string* warning) {
  warning->clear();
  const uint64_t sessions = uint64_t{c.max_clients} + 1;  // and lockd's own loopback
  const uint64_t windows_per_conn = c.memory_windows ? kWindowsPerConnection : 0;
  // What max_clients clients need at the least: each makes kConnectionsPerClient connections at
  // connect, each with a QP, a registration of its control buffer (handshake.cc, kept for the
  // connection's life) and its windows; each session with windows registers its record on the
  // device. lockd's loopback session has one connection, and its client end a QP and one
  // registration of its own; the regions are 3 registrations (info page, locks, sessions).
  const uint64_t min_conns = uint64_t{c.max_clients} * kConnectionsPerClient + 1;
  const uint64_t need_qps = min_conns + 1;
  const uint64_t need_mrs = 3 + min_conns + (c.memory_windows ? sessions : 0) + 1;
  const uint64_t need_mws = min_conns * windows_per_conn;
  auto too_many = [&](const std::string& what, uint64_t need, uint64_t have,
                      const std::string& lower) {
    return Error(ErrorCode::kConfig, "device " + d.name + " holds " + std::to_string(have) + " " +
                                         what + ", and max_clients " +
                                         std::to_string(c.max_clients) + " needs " +
                                         std::to_string(need) + ": lower " + lower);
  };
  if (need_qps > d.max_qp) return too_many("QPs (max_qp)", need_qps, d.max_qp, "max_clients");
  if (need_mrs > d.max_mr) {
    return too_many("memory registrations (max_mr)", need_mrs, d.max_mr, "max_clients");
  }
  if (need_mws > d.max_mw) {
    return too_many("memory windows (max_mw)", need_mws, d.max_mw,
                    "max_clients (or set memory_windows: false)");
  }
  const uint64_t conns = sessions * c.max_connections_per_session;
  if (conns > d.max_qp || conns * windows_per_conn > d.max_mw) {
    *warning = "device " + d.name + " holds " + std::to_string(d.max_qp) + " QPs and " +
               std::to_string(d.max_mw) + " memory windows, fewer than max_clients " +
               std::to_string(c.max_clients) + " x max_connections_per_session " +
               std::to_string(c.max_connections_per_session) +
               " connections need: past that, a client thread's join is refused (no_resources) "
               "and only that thread fails; lower max_connections_per_session to make the limit "
               "explicit";
  }
  return Status::Ok();
}

std::vector<std::string> ChangedKeys(const Config& a, const Config& b) {
  std::vector<std::string> out;
  auto cmp = [&](const char* key, const auto& x, const auto& y) {
    if (x != y) out.emplace_back(key);
  };
  cmp("address", a.address, b.address);
  cmp("port", a.port, b.port);
  cmp("lock_count", a.lock_count, b.lock_count);
  cmp("lease_ms", a.lease_ms, b.lease_ms);
  cmp("stall_factor", a.stall_factor, b.stall_factor);
  cmp("max_clients", a.max_clients, b.max_clients);
  cmp("max_connects_per_second", a.max_connects_per_second, b.max_connects_per_second);
  cmp("heartbeat_interval_ms", a.heartbeat_interval_ms, b.heartbeat_interval_ms);
  cmp("heartbeat_timeout_ms", a.heartbeat_timeout_ms, b.heartbeat_timeout_ms);
  cmp("restart_grace_ms", a.restart_grace_ms, b.restart_grace_ms);
  cmp("state_dir", a.state_dir, b.state_dir);
  cmp("admin_socket", a.admin_socket, b.admin_socket);
  cmp("log_level", a.log_level, b.log_level);
  cmp("metrics_address", a.metrics_address, b.metrics_address);
  cmp("auth_key_file", a.auth_key_file, b.auth_key_file);
  cmp("allow_from", a.allow_from, b.allow_from);
  cmp("memory_windows", a.memory_windows, b.memory_windows);
  cmp("max_connections_per_session", a.max_connections_per_session, b.max_connections_per_session);
  cmp("etcd_endpoints", a.etcd_endpoints, b.etcd_endpoints);
  cmp("cluster", a.cluster, b.cluster);
  cmp("shard", a.shard, b.shard);
  cmp("advertise_address", a.advertise_address, b.advertise_address);
  cmp("etcd_lease_ttl_s", a.etcd_lease_ttl_s, b.etcd_lease_ttl_s);
  cmp("liveness_timeout_ms", a.liveness_timeout_ms, b.liveness_timeout_ms);
  cmp("etcd_ca_file", a.etcd_ca_file, b.etcd_ca_file);
  cmp("etcd_cert_file", a.etcd_cert_file, b.etcd_cert_file);
  cmp("etcd_key_file", a.etcd_key_file, b.etcd_key_file);
  return out;
}

}  // namespace rdmalock::lockd
