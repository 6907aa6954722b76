// The etcd client and lockd's campaign, against a real etcd (Debian's etcd-server) started by the
// test on loopback ports of its own. No etcd binary is a failure, not a skip.
#include "etcd.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../support/local_etcd.h"
#include "campaign.h"
#include "config.h"

using rdmalock::ErrorCode;
using std::chrono::milliseconds;
namespace etcd = rdmalock::etcd;
using rdmalock::testing::LocalEtcd;

namespace {

rdmalock::lockd::Config ShardConfig(const std::string& url, const std::string& me) {
  rdmalock::lockd::Config c;
  c.etcd_endpoints = {url};
  c.cluster = "test";
  c.shard = "a";
  c.address = "127.0.0.1";
  c.advertise_address = me;
  c.etcd_lease_ttl_s = 2;
  REQUIRE(rdmalock::lockd::Validate(c).ok());
  return c;
}

}  // namespace

TEST_CASE("etcd: endpoints are http://HOST:PORT, and a bad one is named", "[etcd]") {
  auto ok = etcd::ParseEndpoint("http://10.0.0.1:2379");
  REQUIRE(ok.ok());
  CHECK(ok->first == "10.0.0.1");
  CHECK(ok->second == 2379);
  auto v6 = etcd::ParseEndpoint("http://[fd00::1]:2379/");
  REQUIRE(v6.ok());
  CHECK(v6->first == "fd00::1");
  CHECK(etcd::ParseEndpoint("https://etcd.example:2379").ok());
  for (const char* bad : {"10.0.0.1:2379", "ftp://h:2379", "http://h", "http://:2379", "http://h:0",
                          "http://h:70000", "http://h:2379/v3", "http://[::1"}) {
    auto r = etcd::ParseEndpoint(bad);
    INFO(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::kConfig);
    CHECK(r.status().message().find(bad) != std::string::npos);
  }
  CHECK_FALSE(etcd::Client::Create({}).ok());
  // A client certificate needs its key; TLS files must be readable.
  auto half = etcd::Client::Create({"https://h:2379"}, {"", "/etc/hostname", ""});
  REQUIRE_FALSE(half.ok());
  CHECK(half.status().message().find("both") != std::string::npos);
  auto missing = etcd::Client::Create({"https://h:2379"}, {"/nonexistent/ca.crt", "", ""});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("/nonexistent/ca.crt") != std::string::npos);
}

TEST_CASE("etcd: keys, transactions and leases against a real etcd", "[etcd]") {
  LocalEtcd server;
  auto c = etcd::Client::Create({"http://127.0.0.1:1", server.url()});  // the first is dead
  REQUIRE(c.ok());
  etcd::Client& e = **c;
  const milliseconds t(2000);

  auto none = e.Get("/k", t);
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  // Binary-safe keys and values.
  const std::string value("v\0\xff/=", 5);
  REQUIRE(e.Put("/k", value, 0, t).ok());
  auto got = e.Get("/k", t);
  REQUIRE(got.ok());
  REQUIRE(got->has_value());
  CHECK((*got)->value == value);
  CHECK((*got)->mod_revision > 0);

  std::optional<etcd::KeyValue> existing;
  auto created = e.CreateIfAbsent("/k", "other", 0, t, &existing);
  REQUIRE(created.ok());
  CHECK_FALSE(*created);
  REQUIRE(existing.has_value());
  CHECK(existing->value == value);

  CHECK(*e.CompareAndPut("/k", (*got)->mod_revision, "2", t));
  CHECK_FALSE(*e.CompareAndPut("/k", (*got)->mod_revision, "3", t));  // stale revision
  CHECK_FALSE(*e.CompareAndPut("/k", 0, "4", t));                     // exists
  CHECK(*e.CompareAndPut("/new", 0, "1", t));
  // A prefix: its keys in order, and nothing past it.
  REQUIRE(e.Put("/p/b", "2", 0, t).ok());
  REQUIRE(e.Put("/p/a", "1", 0, t).ok());
  REQUIRE(e.Put("/q", "x", 0, t).ok());
  auto under = e.GetPrefix("/p/", t);
  REQUIRE(under.ok());
  REQUIRE(under->size() == 2);
  CHECK((*under)[0].key == "/p/a");
  CHECK((*under)[1].value == "2");
  CHECK(e.GetPrefix("/none/", t)->empty());
  REQUIRE(e.Delete("/k", t).ok());
  CHECK_FALSE(e.Get("/k", t)->has_value());

  // A key on a lease goes with the lease.
  auto lease = e.GrantLease(1, t);
  REQUIRE(lease.ok());
  CHECK(lease->ttl_s >= 1);
  CHECK(*e.CreateIfAbsent("/leased", "x", lease->id, t));
  auto leased = e.Get("/leased", t);
  REQUIRE(leased->has_value());
  CHECK((*leased)->lease == lease->id);
  CHECK(*e.KeepAlive(lease->id, t) > 0);
  REQUIRE(e.Revoke(lease->id, t).ok());
  CHECK_FALSE(e.Get("/leased", t)->has_value());
  CHECK(*e.KeepAlive(lease->id, t) == 0);  // gone

  // No etcd at all: a connection error that names the endpoint.
  auto dead = etcd::Client::Create({"http://127.0.0.1:1"});
  auto r = (*dead)->Get("/k", milliseconds(300));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == ErrorCode::kConnection);
  CHECK(r.status().message().find("127.0.0.1:1") != std::string::npos);
}

TEST_CASE("campaign: one primary per shard, and each new primary's epoch is higher", "[etcd]") {
  LocalEtcd server;
  auto a = rdmalock::lockd::Campaign::Create(ShardConfig(server.url(), "10.0.0.1:7471"));
  auto b = rdmalock::lockd::Campaign::Create(ShardConfig(server.url(), "10.0.0.2:7471"));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::atomic<bool> stop{false};
  auto ea = (*a)->Win(stop);
  REQUIRE(ea.ok());
  CHECK(*ea == 1);

  // b campaigns while a holds: it must not win.
  std::atomic<bool> b_stop{false};
  rdmalock::Result<uint64_t> eb = rdmalock::Error(ErrorCode::kInternal, "not run");
  std::atomic<bool> b_done{false};
  std::thread tb([&] {
    eb = (*b)->Win(b_stop);
    b_done.store(true);
  });
  const auto until = std::chrono::steady_clock::now() + milliseconds(3000);  // > the TTL
  while (std::chrono::steady_clock::now() < until) {
    REQUIRE((*a)->Hold(stop));  // a keeps its lease alive
    REQUIRE_FALSE(b_done.load());
  }
  auto e = etcd::Client::Create({server.url()});
  // Both are members of the shard (lockctl cluster lists them), the standby too.
  auto members = (*e)->GetPrefix("/rdmalock/test/shard/a/members/", milliseconds(2000));
  REQUIRE(members.ok());
  REQUIRE(members->size() == 2);
  CHECK((*members)[0].value == "10.0.0.1:7471");
  CHECK((*members)[1].value == "10.0.0.2:7471");
  auto primary = (*e)->Get((*a)->primary_key(), milliseconds(2000));
  REQUIRE(primary->has_value());
  CHECK((*primary)->value == "10.0.0.1:7471");

  // a resigns (a clean stop): b wins at once, with the next epoch.
  (*a)->Resign();
  tb.join();
  REQUIRE(eb.ok());
  CHECK(*eb == 2);
  primary = (*e)->Get((*b)->primary_key(), milliseconds(2000));
  REQUIRE(primary->has_value());
  CHECK((*primary)->value == "10.0.0.2:7471");

  // A stopped campaign returns.
  stop.store(true);
  CHECK_FALSE((*a)->Win(stop).ok());
}

TEST_CASE("campaign: a primary cut off from etcd gives up before its lease can expire", "[etcd]") {
  LocalEtcd server;
  auto a = rdmalock::lockd::Campaign::Create(ShardConfig(server.url(), "10.0.0.1:7471"));
  REQUIRE(a.ok());
  std::atomic<bool> stop{false};
  REQUIRE((*a)->Win(stop).ok());
  for (int i = 0; i < 4; ++i) REQUIRE((*a)->Hold(stop));
  // Freeze etcd: every request now hangs, as in a partition.
  server.Pause();
  const auto cut = std::chrono::steady_clock::now();
  bool held = true;
  while (held && std::chrono::steady_clock::now() < cut + milliseconds(5000)) {
    held = (*a)->Hold(stop);
  }
  const auto gave_up = std::chrono::steady_clock::now();
  server.Resume();
  REQUIRE_FALSE(held);
  INFO((*a)->why_lost());
  // Before the deadline, with about the margin to spare (no more than a refresh's timeout late).
  CHECK(gave_up < (*a)->deadline());
  CHECK((*a)->deadline() - gave_up > (*a)->margin() / 2);
  CHECK((*a)->why_lost().find("could not be refreshed") != std::string::npos);

  // Once etcd is back, a standby wins with the next epoch (after a's lease expires).
  auto b = rdmalock::lockd::Campaign::Create(ShardConfig(server.url(), "10.0.0.2:7471"));
  auto eb = (*b)->Win(stop);
  REQUIRE(eb.ok());
  CHECK(*eb == 2);
}

TEST_CASE("etcd over TLS: etcd's certificate is verified, and a client certificate offered",
          "[etcd]") {
  LocalEtcd server(/*tls=*/true);
  const milliseconds t(3000);
  auto good = etcd::Client::Create({server.url()}, {server.ca(), server.cert(), server.key()});
  REQUIRE(good.ok());
  REQUIRE((*good)->Put("/tls", "yes", 0, t).ok());
  auto v = (*good)->Get("/tls", t);
  REQUIRE(v.ok());
  REQUIRE(v->has_value());
  CHECK((*v)->value == "yes");

  // Without our CA, etcd's certificate does not verify (the system's CAs did not sign it).
  auto no_ca = etcd::Client::Create({server.url()}, {"", server.cert(), server.key()});
  auto r1 = (*no_ca)->Get("/tls", t);
  REQUIRE_FALSE(r1.ok());
  CHECK(r1.status().message().find("did not verify") != std::string::npos);
  // Without a client certificate, etcd (--client-cert-auth) refuses the handshake.
  auto no_cert = etcd::Client::Create({server.url()}, {server.ca(), "", ""});
  auto r2 = (*no_cert)->Get("/tls", t);
  REQUIRE_FALSE(r2.ok());
  INFO(r2.status().message());
  CHECK(r2.status().code() == ErrorCode::kConnection);
}
