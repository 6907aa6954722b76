#include "server/config.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "server/lockd.h"
#include "server/metrics.h"

using rdmalock::ErrorCode;
using rdmalock::lockd::ParseConfig;

TEST_CASE("an empty config gives every default") {
  auto c = ParseConfig("", "empty.yaml");
  REQUIRE(c.ok());
  REQUIRE(c->port == 7471);
  REQUIRE(c->lock_count == 65536);
  REQUIRE(c->lease_ms == 2000);
  REQUIRE(c->stall_factor == 2);
}

TEST_CASE("a full config is read") {
  auto c = ParseConfig(
      "address: 192.0.2.1\nport: 9000\nlock_count: 1048576\nlease_ms: 500\n"
      "stall_factor: 3\nmax_clients: 64\nstate_dir: /tmp/x\nlog_level: debug\n",
      "full.yaml");
  REQUIRE(c.ok());
  REQUIRE(c->address == "192.0.2.1");
  REQUIRE(c->port == 9000);
  REQUIRE(c->lock_count == 1048576);
  REQUIRE(c->lease_ms == 500);
  REQUIRE(c->stall_factor == 3);
  REQUIRE(c->max_clients == 64);
  REQUIRE(c->state_dir == "/tmp/x");
  REQUIRE(c->log_level == "debug");
}

TEST_CASE("the shipped example config is valid") {
  auto c = rdmalock::lockd::LoadConfig(RDMALOCK_SOURCE_DIR "/config/lockd.yaml");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
}

// Found by review (2026-12-06): a directory given as the config file opened (ifstream does), read
// as nothing, and an empty config is a working lockd: `lockd --config /etc/rdmalock/` started
// with every default, the operator's settings (auth_key_file, allow_from) ignored without a word.
TEST_CASE("a config path that is a directory is an error naming it, not an empty config") {
  const auto c = rdmalock::lockd::LoadConfig(RDMALOCK_SOURCE_DIR "/config");
  INFO(c.status().ToString());
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == rdmalock::ErrorCode::kConfig);
  CHECK(c.status().message().find(RDMALOCK_SOURCE_DIR "/config") != std::string::npos);
  CHECK(c.status().message().find("Is a directory") != std::string::npos);
  const auto missing = rdmalock::lockd::LoadConfig("/nonexistent/lockd.yaml");
  CHECK(missing.status().message().find("No such file or directory") != std::string::npos);
}

TEST_CASE("bad configs name the file, line and key") {
  auto check = [](const std::string& text, const std::string& needle) {
    auto c = ParseConfig(text, "bad.yaml");
    REQUIRE_FALSE(c.ok());
    REQUIRE(c.status().code() == ErrorCode::kConfig);
    INFO(c.status().message());
    REQUIRE(c.status().message().find(needle) != std::string::npos);
  };
  check("port: 7471\nlokc_count: 5\n", "bad.yaml:2: key 'lokc_count': unknown key");
  check("port: 70000\n", "bad.yaml:1: key 'port'");
  check("port: -1\n", "not a non-negative integer");
  check("lock_count: many\n", "key 'lock_count'");
  check("lock_count: 0\n", "out of range");
  check("stall_factor: 1\n", "key 'stall_factor'");
  check("lease_ms: 12.5\n", "key 'lease_ms'");
  check("log_level: loud\n", "key 'log_level'");
  check("port: [1, 2]\n", "expected a number");
  check("- a\n- b\n", "top level must be a mapping");
  check("port: 1\n  bad indent: : :\n", "bad.yaml:");
  check("port: 1\nmetrics_address: localhost\n", "bad.yaml:2: key 'metrics_address'");
  check("metrics_address: 127.0.0.1:0\n", "not in 1..65535");
  check("metrics_address: ::1:9477\n", "without brackets");
  check("max_connects_per_second: -5\n", "key 'max_connects_per_second'");
  // A key written twice: yaml-cpp kept one of the values without a word.
  auto twice = ParseConfig("port: 1\nlease_ms: 1000\nlease_ms: 2000\n", "t.yaml");
  REQUIRE(twice.status().code() == ErrorCode::kConfig);
  CHECK(twice.status().message() == "t.yaml:3: key 'lease_ms' appears twice (also line 2)");
}

TEST_CASE("time keys take durations as people write them, and plain numbers as before") {
  auto c = ParseConfig(
      "lease_ms: 2s\nheartbeat_interval_ms: 250ms\nheartbeat_timeout_ms: 1.5s\n"
      "restart_grace_ms: 1m\netcd_lease_ttl_s: 1m\nliveness_timeout_ms: 1m30s\n",
      "d.yaml");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->lease_ms == 2000);
  CHECK(c->heartbeat_interval_ms == 250);
  CHECK(c->heartbeat_timeout_ms == 1500);
  CHECK(c->restart_grace_ms == 60000);
  CHECK(c->etcd_lease_ttl_s == 60);
  CHECK(c->liveness_timeout_ms == 90000);
  // A plain number is in the key's own unit, as it always was.
  auto plain = ParseConfig("lease_ms: 3000\netcd_lease_ttl_s: 7\n", "p.yaml");
  REQUIRE(plain.ok());
  CHECK(plain->lease_ms == 3000);
  CHECK(plain->etcd_lease_ttl_s == 7);
  // What --print-config writes reads back the same.
  auto again = ParseConfig(c->ToYaml(), "again.yaml");
  REQUIRE(again.ok());
  CHECK(again->ToYaml() == c->ToYaml());
  auto bad = [](const std::string& text, const std::string& message) {
    auto r = ParseConfig(text, "bad.yaml");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::kConfig);
    CHECK(r.status().message() == message);
  };
  bad("lease_ms: 60x\n",
      "bad.yaml:1: key 'lease_ms': \"60x\" is not a duration (examples: 500ms, 10s, 2m, or "
      "milliseconds as a number)");
  bad("port: 7471\nlease_ms: 2h\n",
      "bad.yaml:2: key 'lease_ms': \"2h\" is out of range: between 10ms and 1h");
  bad("etcd_lease_ttl_s: 2500ms\n",
      "bad.yaml:1: key 'etcd_lease_ttl_s': \"2500ms\" is not a whole number of seconds");
  bad("restart_grace_ms: -2s\n",
      "bad.yaml:1: key 'restart_grace_ms': \"-2s\" is negative: a duration is 0 or more");
  bad("heartbeat_timeout_ms: [1s]\n",
      "bad.yaml:1: key 'heartbeat_timeout_ms': expected a duration (2s, or milliseconds as a "
      "number)");
}

TEST_CASE("metrics_address: a default, HOST:PORT or IPv6 in brackets, or empty to disable") {
  REQUIRE(ParseConfig("", "m.yaml")->metrics_address == "127.0.0.1:9477");
  REQUIRE(ParseConfig("metrics_address: \"\"\n", "m.yaml")->metrics_address.empty());
  REQUIRE(ParseConfig("metrics_address: \"[::1]:9100\"\n", "m.yaml")->metrics_address ==
          "[::1]:9100");
  std::string host;
  uint16_t port = 0;
  REQUIRE(rdmalock::lockd::ParseHostPort("[::1]:9100", &host, &port).ok());
  REQUIRE(host == "::1");
  REQUIRE(port == 9100);
  REQUIRE(rdmalock::lockd::ParseHostPort("0.0.0.0:80", &host, &port).ok());
  REQUIRE(host == "0.0.0.0");
  REQUIRE_FALSE(rdmalock::lockd::ParseHostPort(":80", &host, &port).ok());
  REQUIRE_FALSE(rdmalock::lockd::ParseHostPort("h:80x", &host, &port).ok());
}

TEST_CASE("session keys: heartbeat and restart grace are read and checked") {
  auto c = ParseConfig(
      "heartbeat_interval_ms: 50\nheartbeat_timeout_ms: 300\nrestart_grace_ms: 5000\n"
      "admin_socket: /tmp/a.sock\n",
      "s.yaml");
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  REQUIRE(c->heartbeat_interval_ms == 50);
  REQUIRE(c->heartbeat_timeout_ms == 300);
  REQUIRE(c->restart_grace_ms == 5000);
  REQUIRE(c->GraceMs() == 5000);
  REQUIRE(c->admin_socket == "/tmp/a.sock");
  auto d = ParseConfig("lease_ms: 700\n", "d.yaml");
  REQUIRE(d.ok());
  REQUIRE(d->GraceMs() == 700);  // 0 means one lease
  auto bad = [](const std::string& text, const std::string& needle) {
    auto r = ParseConfig(text, "bad.yaml");
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    REQUIRE(r.status().message().find(needle) != std::string::npos);
  };
  bad("heartbeat_interval_ms: 500\nheartbeat_timeout_ms: 600\n", "at least twice");
  bad("lease_ms: 2000\nrestart_grace_ms: 1000\n", "restart_grace_ms (1000) must be 0");
  bad("heartbeat_interval_ms: 1\n", "key 'heartbeat_interval_ms'");
}

TEST_CASE("ChangedKeys names what a reload would change, in file order") {
  rdmalock::lockd::Config a, b;
  REQUIRE(rdmalock::lockd::ChangedKeys(a, b).empty());
  b.log_level = "debug";
  b.lease_ms = 3000;
  b.admin_socket = "";
  const auto keys = rdmalock::lockd::ChangedKeys(a, b);
  REQUIRE(keys == std::vector<std::string>{"lease_ms", "admin_socket", "log_level"});
}

TEST_CASE(
    "lockd --print-config output parses back to the same configuration, whatever the strings") {
  rdmalock::lockd::Config c;
  c.state_dir = "/var/lib/odd \"dir\" \\ with: colon # and\nnewline\ttab";
  c.admin_socket = "";
  c.address = "192.0.2.1";
  c.metrics_address = "[::1]:9100";
  c.auth_key_file = "/etc/rdmalock/lockd.key";
  c.allow_from = {"10.0.0.0/8", "fd00::/8"};
  c.memory_windows = false;
  c.max_connections_per_session = 9;
  const auto again = ParseConfig(c.ToYaml(), "printed.yaml");
  INFO(c.ToYaml());
  REQUIRE(again.ok());
  REQUIRE(again->state_dir == c.state_dir);
  REQUIRE(again->admin_socket.empty());
  REQUIRE(rdmalock::lockd::ChangedKeys(c, *again).empty());
}

TEST_CASE("security keys: auth_key_file, allow_from, memory_windows, max_connections_per_session") {
  auto c = ParseConfig(
      "auth_key_file: /etc/rdmalock/lockd.key\nallow_from: [10.0.0.0/8, 192.0.2.7]\n"
      "memory_windows: false\nmax_connections_per_session: 8\n",
      "sec.yaml");
  REQUIRE(c.ok());
  REQUIRE(c->auth_key_file == "/etc/rdmalock/lockd.key");
  REQUIRE(c->allow_from.size() == 2);
  REQUIRE_FALSE(c->memory_windows);
  REQUIRE(c->max_connections_per_session == 8);
  auto d = ParseConfig("", "empty.yaml");
  REQUIRE(d->memory_windows);
  REQUIRE(d->auth_key_file.empty());
  REQUIRE(d->allow_from.empty());

  auto bad_range = ParseConfig("port: 1\nallow_from:\n  - 10.0.0.0/8\n  - 10.1.2.3/8\n", "r.yaml");
  REQUIRE(bad_range.status().code() == ErrorCode::kConfig);
  REQUIRE(bad_range.status().message().find("r.yaml:4: key 'allow_from'") != std::string::npos);
  auto not_list = ParseConfig("allow_from: 10.0.0.0/8\n", "l.yaml");
  REQUIRE(not_list.status().message().find("expected a list") != std::string::npos);
  auto not_bool = ParseConfig("memory_windows: maybe\n", "b.yaml");
  REQUIRE(not_bool.status().message().find("expected true or false") != std::string::npos);
  REQUIRE_FALSE(ParseConfig("max_connections_per_session: 0\n", "m.yaml").ok());
}

TEST_CASE("cluster keys: etcd endpoints, shard, advertise address, TTL; what each needs") {
  auto c = ParseConfig(
      "address: 192.0.2.1\netcd_endpoints: [http://10.0.9.1:2379, http://10.0.9.2:2379]\n"
      "cluster: prod\nshard: a\netcd_lease_ttl_s: 3\n",
      "c.yaml");
  REQUIRE(c.ok());
  REQUIRE(c->cluster_mode());
  REQUIRE(c->etcd_endpoints.size() == 2);
  REQUIRE(c->Advertised() == "192.0.2.1:7471");
  // The takeover grace: a client lease plus the etcd TTL.
  // lease + TTL + the liveness timeout (default: twice heartbeat_timeout_ms)
  REQUIRE(c->TakeoverGraceMs() == c->lease_ms + 3000 + 2 * c->heartbeat_timeout_ms);
  auto again = ParseConfig(c->ToYaml(), "printed.yaml");
  REQUIRE(again.ok());
  REQUIRE(again->etcd_endpoints == c->etcd_endpoints);
  REQUIRE(again->shard == "a");
  REQUIRE_FALSE(ParseConfig("", "e.yaml")->cluster_mode());

  auto msg = [](const std::string& text) {
    auto r = ParseConfig(text, "x.yaml");
    REQUIRE_FALSE(r.ok());
    return r.status().message();
  };
  CHECK(msg("etcd_endpoints: [http://e:2379]\naddress: 10.0.0.1\n").find("shard is not") !=
        std::string::npos);
  CHECK(msg("etcd_endpoints: [http://e:2379]\nshard: a\n").find("advertise_address") !=
        std::string::npos);  // address 0.0.0.0 cannot be told to clients
  CHECK(msg("etcd_endpoints: [e:2379]\n").find("x.yaml:1: key 'etcd_endpoints'") !=
        std::string::npos);
  CHECK(msg("etcd_endpoints: [http://e:2379]\naddress: 10.0.0.1\nshard: a/b\n")
            .find("letters, digits") != std::string::npos);
  CHECK(msg("etcd_lease_ttl_s: 1\n").find("out of range") != std::string::npos);
  // TLS files with an http:// endpoint would be unused and the campaign in plain text.
  CHECK(msg("etcd_endpoints: [http://e:2379]\naddress: 10.0.0.1\nshard: a\n"
            "etcd_ca_file: /etc/hostname\n")
            .find("http://e:2379") != std::string::npos);
  auto adv = ParseConfig(
      "etcd_endpoints: [http://e:2379]\nshard: a\nadvertise_address: 10.0.0.1:7000\n", "a.yaml");
  REQUIRE(adv.ok());
  REQUIRE(adv->Advertised() == "10.0.0.1:7000");
}

// Cluster mode refuses a wildcard address without advertise_address (clients must be told where
// to connect), but the check knew only 0.0.0.0 and ::, while IsAnyAddress, which lockd listens
// by, takes "*" too: address "*" passed and clients were told "*:7471" (found by review,
// 2026-12-05). The check uses IsAnyAddress.
TEST_CASE("cluster mode: address \"*\" without advertise_address is refused like 0.0.0.0 and ::") {
  for (const std::string addr : {"0.0.0.0", "::", "*"}) {
    INFO("address " << addr);
    auto r = ParseConfig("etcd_endpoints: [http://e:2379]\nshard: a\naddress: \"" + addr + "\"\n",
                         "x.yaml");
    INFO((r.ok() ? "accepted; clients would be told " + r->Advertised() : r.status().ToString()));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("advertise_address") != std::string::npos);
    CHECK(r.status().message().find("(not " + addr + ")") != std::string::npos);
    // With advertise_address the wildcard is fine: that is what clients are told.
    auto adv = ParseConfig("etcd_endpoints: [http://e:2379]\nshard: a\naddress: \"" + addr +
                               "\"\nadvertise_address: 10.0.0.1:7000\n",
                           "a.yaml");
    INFO(adv.status().ToString());
    REQUIRE(adv.ok());
    CHECK(adv->Advertised() == "10.0.0.1:7000");
  }
}

TEST_CASE("finding 6: without a state_dir lockd could not keep its epoch, so it does not start") {
  auto c = ParseConfig("state_dir: \"\"\n", "s.yaml");
  REQUIRE_FALSE(c.ok());
  REQUIRE(c.status().message().find("state_dir") != std::string::npos);
  // In cluster mode the epoch lives in etcd: no state_dir is needed.
  auto cluster = ParseConfig(
      "state_dir: \"\"\netcd_endpoints: [\"http://127.0.0.1:2379\"]\nshard: a\n"
      "address: 192.0.2.1\n",
      "c.yaml");
  INFO(cluster.status().ToString());
  REQUIRE(cluster.ok());
}

TEST_CASE("finding 11: max_clients is bounded by what one lock word can count") {
  auto ok = ParseConfig("max_clients: 8191\n", "m.yaml");
  INFO(ok.status().ToString());
  REQUIRE(ok.ok());
  auto big = ParseConfig("max_clients: 8192\n", "m.yaml");
  REQUIRE_FALSE(big.ok());
  REQUIRE(big.status().message().find("max_clients") != std::string::npos);
  rdmalock::lockd::Config c;
  c.max_clients = 65536;  // as --max-clients would set it
  REQUIRE_FALSE(rdmalock::lockd::Validate(c).ok());
}

// Found by review (2026-12-05): lockd registered its lock table on every RDMA device and, at a
// wildcard address (the default, 0.0.0.0), served clients through any of them, while a device's
// atomics are atomic only against its own (IBV_ATOMIC_HCA): two clients on two NICs (or the two
// ports of a dual-port card, two devices) could both be granted one lock. rdma_rxe cannot show the
// race (its atomics run under one lock on the host CPU), so this checks the refusal itself.
TEST_CASE("lockd refuses to serve one lock table through devices whose atomics are not shared") {
  rdmalock::lockd::Config c;
  c.address = "0.0.0.0";
  using rdmalock::lockd::CheckAtomicScope;
  const std::vector<rdmalock::lockd::DeviceAtomics> two_hca = {{"mlx5_0", false},
                                                               {"mlx5_1", false}};
  auto bad = CheckAtomicScope(c, two_hca);
  INFO(bad.ToString());
  CHECK(bad.code() == rdmalock::ErrorCode::kConfig);
  CHECK(bad.message().find("mlx5_0, mlx5_1") != std::string::npos);
  CHECK(bad.message().find("Set address") != std::string::npos);
  c.address = "::";
  CHECK_FALSE(CheckAtomicScope(c, two_hca).ok());
  // One device, devices whose atomics are global, or one device's address: served.
  c.address = "0.0.0.0";
  CHECK(CheckAtomicScope(c, {{"rxe0", false}}).ok());
  CHECK(CheckAtomicScope(c, {{"mlx5_0", true}, {"mlx5_1", true}}).ok());
  c.address = "192.168.1.10";
  CHECK(CheckAtomicScope(c, two_hca).ok());
}

TEST_CASE("issue 17 finding 4: lockd's limits are checked against the device's at start") {
  rdmalock::lockd::Config c;
  c.max_clients = 1024;
  c.max_connections_per_session = 256;
  c.memory_windows = true;
  std::string warning;
  // rdma_rxe's limits (ibv_devinfo -v): every session fits; not every thread of every session.
  const rdmalock::lockd::DeviceLimits rxe{"rxe0", 65536, 65536, 65536};
  auto ok = rdmalock::lockd::CheckDeviceLimits(c, rxe, &warning);
  INFO(ok.ToString());
  CHECK(ok.ok());
  CHECK(warning.find("max_connections_per_session") != std::string::npos);
  // A device that cannot hold max_clients sessions' windows: refused, naming the key to lower.
  const rdmalock::lockd::DeviceLimits small{"mlx5_0", 65536, 65536, 2048};
  auto bad = rdmalock::lockd::CheckDeviceLimits(c, small, &warning);
  INFO(bad.ToString());
  CHECK_FALSE(bad.ok());
  CHECK(bad.message().find("max_mw") != std::string::npos);
  CHECK(bad.message().find("lower max_clients") != std::string::npos);
  c.memory_windows = false;
  CHECK(rdmalock::lockd::CheckDeviceLimits(c, small, &warning).ok());
  const rdmalock::lockd::DeviceLimits few_qps{"dev", 512, 65536, 65536};
  auto qps = rdmalock::lockd::CheckDeviceLimits(c, few_qps, &warning);
  CHECK(qps.message().find("max_qp") != std::string::npos);
}

// The start check counted one QP and one registration per session (max_clients + 1 QPs, + 3
// registrations), where a client makes 3 connections at connect (the calling thread's, the
// keeper's and the reaper's), each with a QP, a registration of its control buffer and 4
// windows, and a session with windows registers its record too. A device over those limits let
// lockd start and then refused clients below max_clients as `internal` (found by review,
// 2026-12-06). Now the check counts what max_clients clients need at the least.
TEST_CASE("lockd's start check counts every client's 3 connections and their registrations") {
  rdmalock::lockd::Config c;
  c.max_clients = 100;
  c.max_connections_per_session = 3;
  c.memory_windows = true;
  std::string warning;
  // 100 clients x 3 connections + lockd's loopback (one connection, and its client end's QP).
  const rdmalock::lockd::DeviceLimits enough{"dev", 302, 3 + 300 + 1 + 101 + 1, 301 * 4};
  auto ok = rdmalock::lockd::CheckDeviceLimits(c, enough, &warning);
  INFO(ok.ToString());
  CHECK(ok.ok());
  const rdmalock::lockd::DeviceLimits few_qps{"dev", 301, 100000, 100000};
  auto qps = rdmalock::lockd::CheckDeviceLimits(c, few_qps, &warning);
  INFO(qps.ToString());
  CHECK_FALSE(qps.ok());
  CHECK(qps.message().find("holds 301 QPs (max_qp), and max_clients 100 needs 302") !=
        std::string::npos);
  const rdmalock::lockd::DeviceLimits few_mrs{"dev", 100000, 405, 100000};
  auto mrs = rdmalock::lockd::CheckDeviceLimits(c, few_mrs, &warning);
  INFO(mrs.ToString());
  CHECK_FALSE(mrs.ok());
  CHECK(mrs.message().find("(max_mr), and max_clients 100 needs 406") != std::string::npos);
  const rdmalock::lockd::DeviceLimits few_mws{"dev", 100000, 100000, 1203};
  auto mws = rdmalock::lockd::CheckDeviceLimits(c, few_mws, &warning);
  INFO(mws.ToString());
  CHECK_FALSE(mws.ok());
  CHECK(mws.message().find("(max_mw), and max_clients 100 needs 1204") != std::string::npos);
  // Without windows: no record registrations and no windows.
  c.memory_windows = false;
  const rdmalock::lockd::DeviceLimits no_windows{"dev", 302, 3 + 300 + 1 + 1, 0};
  auto nw = rdmalock::lockd::CheckDeviceLimits(c, no_windows, &warning);
  INFO(nw.ToString());
  CHECK(nw.ok());
}

// lockd reads a stopped client's record when it fences it, within heartbeat_timeout_ms and two
// ticks; waiters may recover its locks from (stall_factor - 1) x lease_ms after it stopped. A
// configuration whose fence may come later is warned about at start (docs/protocol.md §11).
TEST_CASE("lockd warns when a stopped client may be fenced after waiters can recover its locks") {
  rdmalock::lockd::Config c;  // the defaults: fenced within 1,400 ms, recovered from 2,000 ms
  CHECK(c.LivenessTickMs() == 200);
  CHECK(rdmalock::lockd::FenceMarginWarning(c).empty());
  c.lease_ms = 1000;  // recovered from 1,000 ms
  const std::string w = rdmalock::lockd::FenceMarginWarning(c);
  INFO(w);
  CHECK(w.find("heartbeat_timeout_ms 1000") != std::string::npos);
  CHECK(w.find("1400 ms") != std::string::npos);
  CHECK(w.find("= 1000 ms") != std::string::npos);
  c.stall_factor = 3;  // from 2,000 ms again
  CHECK(rdmalock::lockd::FenceMarginWarning(c).empty());
  c.stall_factor = 2;
  c.heartbeat_timeout_ms = 500;  // fenced within 600 ms (ticks of 125 ms)
  CHECK(c.LivenessTickMs() == 125);
  CHECK(rdmalock::lockd::FenceMarginWarning(c).empty());
}
