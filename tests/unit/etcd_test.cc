// The etcd client (common/etcd), against a real etcd (Debian's etcd-server) started by the test
// on loopback ports of its own. No etcd binary is a failure, not a skip.
#include "common/etcd/etcd.h"

#include <httplib.h>
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

#include "tests/support/etcd_proxy.h"
#include "tests/support/local_etcd.h"

using rdmalock::ErrorCode;
using std::chrono::milliseconds;
namespace etcd = rdmalock::etcd;
using rdmalock::testing::LocalEtcd;

namespace {

// A TCP peer that answers any request with a valid HTTP reply, one byte every `gap`: each read
// the client makes completes well within its read timeout, but the reply takes long.
class TricklingPeer {
 public:
  explicit TricklingPeer(std::chrono::milliseconds gap) : gap_(gap) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(fd_, 8) == 0);
    socklen_t len = sizeof(a);
    REQUIRE(getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    url_ = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this] { Serve(); });
  }
  ~TricklingPeer() {
    stop_.store(true);
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  const std::string& url() const { return url_; }

 private:
  void Serve() {
    const std::string reply =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
    while (!stop_.load()) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      (void)recv(c, buf, sizeof(buf), 0);
      for (char ch : reply) {
        if (stop_.load() || send(c, &ch, 1, MSG_NOSIGNAL) != 1) break;
        std::this_thread::sleep_for(gap_);
      }
      close(c);
    }
  }

  std::chrono::milliseconds gap_;
  int fd_ = -1;
  std::string url_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

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
  // TLS files with an http:// endpoint: that endpoint would carry the traffic in plain text, the
  // files silently unused (a typo of the scheme). Refused, naming the endpoint.
  for (const std::vector<std::string>& eps :
       {std::vector<std::string>{"http://h:2379"},
        std::vector<std::string>{"https://h:2379", "http://g:2379"}}) {
    auto plain = etcd::Client::Create(eps, {"/etc/hostname", "", ""});
    INFO(eps.back());
    REQUIRE_FALSE(plain.ok());
    CHECK(plain.status().code() == ErrorCode::kConfig);
    CHECK(plain.status().message().find(eps.back()) != std::string::npos);
  }
  CHECK(etcd::Client::Create({"https://h:2379", "https://g:2379"}, {"/etc/hostname", "", ""}).ok());
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

// Found by review (2026-12-06): any HTTP 200 was taken as etcd's answer and its member made the
// preferred one, so a member behind a proxy that answers 200 with a page of its own (maintenance,
// a captive portal) took every call, each failing to parse: the other members were never tried,
// and a primary that could not confirm its reads fenced itself with two healthy members left.
TEST_CASE("etcd: a member that answers 200 with no etcd reply is skipped, not preferred",
          "[etcd]") {
  LocalEtcd server;
  auto direct = rdmalock::etcd::Client::Create({server.url()});
  REQUIRE(direct.ok());
  REQUIRE((*direct)->Put("/t/k", "v", 0, milliseconds(2000)).ok());
  rdmalock::testing::DelayingProxy garbling(server.url(), milliseconds(0));
  garbling.garble_ranges.store(true);
  auto both = rdmalock::etcd::Client::Create({garbling.url(), server.url()});
  REQUIRE(both.ok());
  for (int i = 0; i < 3; ++i) {
    auto got = (*both)->Get("/t/k", milliseconds(2000));
    INFO("read " << i << ": " << (got.ok() ? "ok" : got.status().ToString()));
    REQUIRE(got.ok());
    REQUIRE(got->has_value());
    CHECK((*got)->value == "v");
  }
  // With the garbling member alone, the read fails and says why.
  auto alone = rdmalock::etcd::Client::Create({garbling.url()});
  REQUIRE(alone.ok());
  auto got = (*alone)->Get("/t/k", milliseconds(2000));
  REQUIRE_FALSE(got.ok());
  CHECK_THAT(got.status().message(), Catch::Contains("not etcd's"));
  // A JSON object that is not etcd's is no answer either: read as "no kvs", it said the key was
  // absent (the diff review: a primary's confirming read would have fenced it).
  garbling.garble_as_json.store(true);
  got = (*alone)->Get("/t/k", milliseconds(2000));
  const std::string what = got.ok() ? (got->has_value() ? "read: the value" : "read: key absent")
                                    : got.status().ToString();
  INFO(what);
  REQUIRE_FALSE(got.ok());
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

TEST_CASE("issue 17 finding 7: an etcd call takes no longer than its timeout", "[etcd]") {
  // A peer that trickles its reply (each byte well within the read timeout): the call must give
  // up at its timeout, not when the reply is complete.
  TricklingPeer slow(milliseconds(60));
  auto c = etcd::Client::Create({slow.url()});
  REQUIRE(c.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = (*c)->Get("/k", milliseconds(300));
  const auto took =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count();
  INFO("Get with a 300 ms timeout: " << (r.ok() ? std::string("ok") : r.status().ToString())
                                     << " after " << took << " ms");
  CHECK_FALSE(r.ok());
  CHECK(took < 450);

  // Three endpoints share the timeout: the whole call still ends within it.
  TricklingPeer s2(milliseconds(60)), s3(milliseconds(60));
  auto three = etcd::Client::Create({slow.url(), s2.url(), s3.url()});
  REQUIRE(three.ok());
  const auto t1 = std::chrono::steady_clock::now();
  auto r3 = (*three)->Get("/k", milliseconds(300));
  const auto took3 =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t1).count();
  INFO("Get over three endpoints with a 300 ms timeout: "
       << (r3.ok() ? std::string("ok") : r3.status().ToString()) << " after " << took3 << " ms");
  CHECK_FALSE(r3.ok());
  CHECK(took3 < 450);
}

TEST_CASE("an etcd reply whose fields have the wrong JSON types is an error, not an exception",
          "[etcd]") {
  // Not quite etcd (a proxy, a wrong port): fields present with the wrong types. nlohmann's
  // value() throws for those; the client's callers (lockd's campaign, the SDK's keeper and map
  // refresher) catch nothing, so a throw would end the process. Each reply carries etcd's
  // header, so that it gets past the member check (a reply without one is the member's failure,
  // kConnection: test 'etcd: a member that answers 200 with no etcd reply ...') to the parsers.
  httplib::Server fake;
  fake.Post("/v3/kv/range", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"header":{},"kvs":[{"key":1,"value":[2]}]})", "application/json");
  });
  fake.Post("/v3/kv/txn", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"header":{},"succeeded":"yes","responses":[7]})", "application/json");
  });
  fake.Post("/v3/lease/grant", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"header":{},"ID":"0","error":5})", "application/json");
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  REQUIRE(port > 0);
  std::thread serving([&] { fake.listen_after_bind(); });
  while (!fake.is_running()) std::this_thread::sleep_for(milliseconds(1));
  auto c = etcd::Client::Create({"http://127.0.0.1:" + std::to_string(port)});
  REQUIRE(c.ok());
  auto expect_protocol_error = [](const char* what, auto call) {
    INFO(what);
    try {
      auto r = call();
      INFO((r.ok() ? std::string("ok") : r.status().ToString()));
      CHECK_FALSE(r.ok());
      if (!r.ok()) CHECK(r.status().code() == ErrorCode::kProtocol);
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: " << e.what());
    }
  };
  expect_protocol_error("Get", [&] { return (*c)->Get("/k", milliseconds(2000)); });
  expect_protocol_error("GetPrefix", [&] { return (*c)->GetPrefix("/k", milliseconds(2000)); });
  expect_protocol_error("CreateIfAbsent", [&] {
    std::optional<etcd::KeyValue> existing;
    return (*c)->CreateIfAbsent("/k", "v", 0, milliseconds(2000), &existing);
  });
  expect_protocol_error("CompareAndPut",
                        [&] { return (*c)->CompareAndPut("/k", 3, "v", milliseconds(2000)); });
  expect_protocol_error("GrantLease", [&] { return (*c)->GrantLease(5, milliseconds(2000)); });
  fake.stop();
  serving.join();
}
