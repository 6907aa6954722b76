// The C API's cluster (rdmalock_cluster_*, rdmalock.h) on the host. Locks go through the C entry
// points over a ClusterClient whose shards are test lockds (tests/support/fake_lockd.h), wrapped
// by the C API's test seam (client/src/c_api_internal.h); opening goes through
// rdmalock_cluster_open itself, from a map file and from a real etcd (tests/support/local_etcd.h).
// rdmalock_cluster_open connects to no shard, so opening needs no lockd.
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "client/src/c_api_internal.h"
#include "client/src/client_test_peer.h"
#include "client/src/cluster_test_peer.h"
#include "common/etcd/etcd.h"
#include "rdmalock/cluster.h"
#include "rdmalock/rdmalock.h"
#include "tests/support/fake_lockd.h"
#include "tests/support/local_etcd.h"
#include "tests/support/test_env.h"

using namespace rdmalock;
using namespace std::chrono_literals;

// c_api_enum_helper.c: C API calls with any int where an enum goes, as a C caller may make them.
extern "C" const char* rdmalock_test_error_name_of(int code);
extern "C" rdmalock_status_t rdmalock_test_cluster_try_lock_mode(rdmalock_cluster_t* cluster,
                                                                 const char* name, int mode,
                                                                 rdmalock_lock_t** out);

namespace {

// Test lockds by host name, reached through ClusterTestPeer's connector (as cluster_test.cc).
// Thread-safety: the map is written before use and only read afterwards.
struct FakeShards {
  explicit FakeShards(std::initializer_list<std::string> hosts) {
    for (const auto& h : hosts)
      lockds[h] = std::make_unique<testing::FakeLockd>(testing::FakeLockd::Options{});
  }
  ClusterTestPeer::ShardConnector connector() {
    return [this](const ClientOptions& o, ClusterTestPeer::Resolve) {
      Connector c = [this](const ChannelParams& p, uint32_t* retry,
                           proto::RejectReason* reason) -> Result<std::unique_ptr<Connection>> {
        auto it = lockds.find(p.host);
        if (it == lockds.end()) return Error(ErrorCode::kConnection, "no lockd at " + p.host);
        return it->second->connector()(p, retry, reason);
      };
      return ClientTestPeer::Connect(o, std::move(c));
    };
  }
  std::map<std::string, std::unique_ptr<testing::FakeLockd>> lockds;
};

ClusterMap TwoShards() {
  ClusterMap m;
  m.shards.push_back({"shard-a", "host-a", 7471});
  m.shards.push_back({"shard-b", "host-b", 7471});
  return m;
}

std::string ShardOf(rdmalock_cluster_t* c, const std::string& name) {
  char buf[65] = {};
  REQUIRE(rdmalock_cluster_shard_of(c, name.c_str(), buf, sizeof(buf)) == RDMALOCK_OK);
  return buf;
}

// A name the cluster puts on `shard`.
std::string NameOn(rdmalock_cluster_t* c, const std::string& shard) {
  for (int i = 0;; ++i) {
    const std::string n = "c-api/" + std::to_string(i);
    if (ShardOf(c, n) == shard) return n;
  }
}

// A file in a temporary directory, removed at the end.
struct TempFile {
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/rdmalock-cmap-XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
    std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
  std::string path;
};

}  // namespace

// A C caller may pass any int where the C API takes an enum (a C enum is an int); in C++ a value
// outside the enum's values (0 to 15 for a status's 0 to 13; nothing negative) is undefined
// behaviour, which clang's UBSan (-fsanitize=enum, the ASan+UBSan build) stops at. The library
// must take such a value as an int: a name, "unknown" (rdmalock_error_name takes an int), or
// INVALID_ARGUMENT naming the mode (the mode enum's members make every int one of its values).
TEST_CASE("C API: any int where a status goes is named, or unknown, never undefined behaviour") {
  CHECK(std::string(rdmalock_test_error_name_of(RDMALOCK_ERR_BUSY)) == "busy");
  CHECK(std::string(rdmalock_test_error_name_of(RDMALOCK_ERR_INTERNAL)) == "internal");
  CHECK(std::string(rdmalock_test_error_name_of(99)) == "unknown");
  CHECK(std::string(rdmalock_test_error_name_of(-1)) == "unknown");
  CHECK(std::string(rdmalock_test_error_name_of(INT32_MAX)) == "unknown");
  CHECK(std::string(rdmalock_test_error_name_of(INT32_MIN)) == "unknown");
}

TEST_CASE(
    "C API: any int where a mode goes is refused INVALID_ARGUMENT, never undefined behaviour") {
  FakeShards f{"host-a", "host-b"};
  auto cc = ClusterTestPeer::Connect(TwoShards(), testing::FakeClientOptions("c-api-enum"),
                                     f.connector());
  REQUIRE(cc.ok());
  rdmalock_cluster_t* c = WrapClusterForTesting(std::move(cc).value());
  for (const int mode : {7, -1, INT32_MAX, INT32_MIN}) {
    rdmalock_lock_t* out = nullptr;
    CAPTURE(mode);
    CHECK(rdmalock_test_cluster_try_lock_mode(c, "x", mode, &out) == RDMALOCK_ERR_INVALID_ARGUMENT);
    CHECK_THAT(rdmalock_last_error(), Catch::Contains("mode " + std::to_string(mode)));
    CHECK(out == nullptr);
  }
  rdmalock_lock_t* ok = nullptr;
  CHECK(rdmalock_test_cluster_try_lock_mode(c, "x", RDMALOCK_SHARED, &ok) == RDMALOCK_OK);
  rdmalock_lock_free(ok);
  rdmalock_cluster_close(c);
}

TEST_CASE("c api cluster: locks land on the name's shard, with the single client's codes") {
  FakeShards f{"host-a", "host-b"};
  auto cc = ClusterTestPeer::Connect(TwoShards(), testing::FakeClientOptions("c-api-cluster"),
                                     f.connector());
  REQUIRE(cc.ok());
  rdmalock_cluster_t* c = WrapClusterForTesting(std::move(cc).value());
  CHECK(rdmalock_cluster_shard_count(c) == 2);
  const std::string on_a = NameOn(c, "shard-a"), on_b = NameOn(c, "shard-b");

  rdmalock_lock_t* a = nullptr;
  REQUIRE(rdmalock_cluster_lock(c, on_a.c_str(), RDMALOCK_EXCLUSIVE, 2000, &a) == RDMALOCK_OK);
  CHECK(std::string(rdmalock_last_error()).empty());
  CHECK(f.lockds["host-a"]->Sessions().size() == 1);
  CHECK(f.lockds["host-b"]->Sessions().empty());  // shard b not used yet: no session
  CHECK(rdmalock_lock_get_state(a) == RDMALOCK_HELD);
  CHECK(rdmalock_lock_get_token(a) != 0);

  rdmalock_lock_t* b = nullptr;
  REQUIRE(rdmalock_cluster_try_lock(c, on_b.c_str(), RDMALOCK_EXCLUSIVE, &b) == RDMALOCK_OK);
  CHECK(f.lockds["host-b"]->Sessions().size() == 1);

  // The same name again: taken, so BUSY for one attempt and TIMEOUT for a short wait.
  rdmalock_lock_t* again = reinterpret_cast<rdmalock_lock_t*>(&f);  // must be reset to NULL
  CHECK(rdmalock_cluster_try_lock(c, on_a.c_str(), RDMALOCK_EXCLUSIVE, &again) ==
        RDMALOCK_ERR_BUSY);
  CHECK(again == nullptr);
  CHECK(std::string(rdmalock_last_error()).rfind("rdmalock_cluster_try_lock: ", 0) == 0);
  CHECK(rdmalock_cluster_lock(c, on_a.c_str(), RDMALOCK_EXCLUSIVE, 50, &again) ==
        RDMALOCK_ERR_TIMEOUT);

  CHECK(rdmalock_release(a) == RDMALOCK_OK);
  CHECK(rdmalock_lock_get_state(a) == RDMALOCK_RELEASED);
  CHECK(rdmalock_release(a) == RDMALOCK_ERR_NOT_HELD);
  rdmalock_lock_free(a);
  rdmalock_lock_free(b);  // still held: released by the free

  // Argument errors, as the single client's.
  rdmalock_lock_t* out = nullptr;
  CHECK(rdmalock_cluster_lock(nullptr, "x", RDMALOCK_EXCLUSIVE, 0, &out) ==
        RDMALOCK_ERR_INVALID_ARGUMENT);
  CHECK(rdmalock_cluster_lock(c, nullptr, RDMALOCK_EXCLUSIVE, 0, &out) ==
        RDMALOCK_ERR_INVALID_ARGUMENT);
  CHECK(rdmalock_cluster_lock(c, "x", static_cast<rdmalock_mode_t>(7), 0, &out) ==
        RDMALOCK_ERR_INVALID_ARGUMENT);
  CHECK(rdmalock_cluster_lock(c, "x", RDMALOCK_EXCLUSIVE, -2, &out) ==
        RDMALOCK_ERR_INVALID_ARGUMENT);
  CHECK(rdmalock_cluster_lock(c, "x", RDMALOCK_EXCLUSIVE, 0, nullptr) ==
        RDMALOCK_ERR_INVALID_ARGUMENT);
  char tiny[3];
  CHECK(rdmalock_cluster_shard_of(c, on_a.c_str(), tiny, sizeof(tiny)) ==
        RDMALOCK_ERR_INVALID_ARGUMENT);
  rdmalock_cluster_close(c);
  rdmalock_cluster_close(nullptr);
}

// Found by the CI (2026-12-05): a lost callback may end its thread (pthread_exit, as Python does
// to a thread that takes the GIL while the interpreter exits; the Python test of issue 17 finding
// 9 died so, one run in three). glibc unwinds the thread; the C API's callback wrapper caught that
// unwind and did not rethrow it, and glibc aborted the process: "FATAL: exception not rethrown".
// In a child process (an abort there is a signal the parent reads).
namespace {
std::atomic<int> exiting_callbacks{0};
void EndThisThread(rdmalock_status_t, const char*, void*) {
  exiting_callbacks.fetch_add(1);
  pthread_exit(nullptr);
}
}  // namespace

TEST_CASE("c api: a lost callback that ends its thread (pthread_exit) does not abort") {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a child that hangs is killed: the parent reads SIGALRM
    int code = 0;
    {
      FakeShards f{"host-a", "host-b"};
      auto cc = ClusterTestPeer::Connect(TwoShards(), testing::FakeClientOptions("c-api-exit"),
                                         f.connector());
      if (!cc.ok()) _exit(2);
      rdmalock_cluster_t* c = WrapClusterForTesting(std::move(cc).value());
      const std::string name = NameOn(c, "shard-a");
      rdmalock_lock_t* l = nullptr;
      if (rdmalock_cluster_lock(c, name.c_str(), RDMALOCK_EXCLUSIVE, 2000, &l) != RDMALOCK_OK ||
          rdmalock_lock_on_lost(l, EndThisThread, nullptr) != RDMALOCK_OK) {
        _exit(2);
      }
      f.lockds["host-a"]->Fence(f.lockds["host-a"]->Sessions().at(0));
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (exiting_callbacks.load() == 0 && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (exiting_callbacks.load() == 0) code = 3;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the thread unwinds
      if (code == 0 && rdmalock_lock_get_state(l) != RDMALOCK_LOST) code = 4;
      rdmalock_lock_free(l);
      rdmalock_cluster_close(c);  // joins the client's threads, the ended one too
    }
    _exit(code);
  }
  REQUIRE(pid > 0);
  const testing::ChildEnd child = testing::WaitChild(pid);
  REQUIRE(child.waited);
  INFO("child (2 no lock, 3 no callback, 4 not lost): " << child.how);
  CHECK(child.clean);
}

// rdmalock.h: a lost callback "may ... close the client". rdmalock_close (and
// rdmalock_cluster_close) tell the locks still held that they are lost, on the closing thread: a
// callback that closes the client on a loss (an application's "shut down on loss") then ran
// rdmalock_close inside rdmalock_close, and the client was freed twice (found by review,
// 2026-12-07). In a child process: a double free aborts it, and the parent reads the signal.
namespace {
std::atomic<int> closing_callbacks{0};
void CloseCluster(rdmalock_status_t, const char*, void* cluster) {
  closing_callbacks.fetch_add(1);
  rdmalock_cluster_close(static_cast<rdmalock_cluster_t*>(cluster));
}
void CloseClient(rdmalock_status_t, const char*, void* client) {
  closing_callbacks.fetch_add(1);
  rdmalock_close(static_cast<rdmalock_client_t*>(client));
}
}  // namespace

TEST_CASE(
    "c api: a lost callback that closes the client, run by that client's close, frees it "
    "once") {
  for (const bool cluster : {true, false}) {
    INFO((cluster ? "rdmalock_cluster_close" : "rdmalock_close"));
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(20);  // a child that hangs is killed: the parent reads SIGALRM
      closing_callbacks.store(0);
      FakeShards f{"host-a", "host-b"};
      rdmalock_lock_t* l = nullptr;
      if (cluster) {
        auto cc = ClusterTestPeer::Connect(TwoShards(), testing::FakeClientOptions("c-api-close"),
                                           f.connector());
        if (!cc.ok()) _exit(2);
        rdmalock_cluster_t* c = WrapClusterForTesting(std::move(cc).value());
        const std::string name = NameOn(c, "shard-a");
        if (rdmalock_cluster_lock(c, name.c_str(), RDMALOCK_EXCLUSIVE, 2000, &l) != RDMALOCK_OK ||
            rdmalock_lock_on_lost(l, CloseCluster, c) != RDMALOCK_OK) {
          _exit(2);
        }
        rdmalock_cluster_close(c);  // tells l's callback, which closes c again
      } else {
        auto cc = ClientTestPeer::Connect(testing::FakeClientOptions("c-api-close"),
                                          f.lockds["host-a"]->connector());
        if (!cc.ok()) _exit(2);
        rdmalock_client_t* c = WrapClientForTesting(std::move(cc).value());
        if (rdmalock_lock(c, "x", RDMALOCK_EXCLUSIVE, 2000, &l) != RDMALOCK_OK ||
            rdmalock_lock_on_lost(l, CloseClient, c) != RDMALOCK_OK) {
          _exit(2);
        }
        rdmalock_close(c);
      }
      if (closing_callbacks.load() != 1) _exit(3);
      if (rdmalock_lock_get_state(l) != RDMALOCK_LOST) _exit(4);
      rdmalock_lock_free(l);
      _exit(0);
    }
    REQUIRE(pid > 0);
    const testing::ChildEnd child = testing::WaitChild(pid);
    REQUIRE(child.waited);
    INFO("child (2 no lock, 3 callbacks not 1, 4 not lost): " << child.how);
    CHECK(child.clean);
  }
}

// rdmalock.h: a loss found while no callback is set is told to the next one set, and a NULL fn
// drops it. As the lock's first rdmalock_lock_on_lost, NULL wired the handle to the gate, which
// kept the loss for the next callback instead (found by review, 2026-12-06).
TEST_CASE("c api: a first rdmalock_lock_on_lost(NULL) drops a loss found before it") {
  FakeShards f{"host-a", "host-b"};
  auto cc = ClusterTestPeer::Connect(TwoShards(), testing::FakeClientOptions("c-api-null-cb"),
                                     f.connector());
  REQUIRE(cc.ok());
  rdmalock_cluster_t* c = WrapClusterForTesting(std::move(cc).value());
  const std::string name = NameOn(c, "shard-a");
  rdmalock_lock_t* l = nullptr;
  REQUIRE(rdmalock_cluster_lock(c, name.c_str(), RDMALOCK_EXCLUSIVE, 2000, &l) == RDMALOCK_OK);
  f.lockds["host-a"]->Fence(f.lockds["host-a"]->Sessions().at(0));
  REQUIRE(testing::WaitFor([&] { return rdmalock_lock_get_state(l) == RDMALOCK_LOST; }));
  // LOST is read once the lease runs out too; the keeper's report of the session's end (kept by
  // the handle, no callback set) comes within a tick or two.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::atomic<int> told{0};
  REQUIRE(rdmalock_lock_on_lost(l, nullptr, nullptr) == RDMALOCK_OK);  // drops the loss
  REQUIRE(rdmalock_lock_on_lost(
              l,
              [](rdmalock_status_t, const char*, void* n) { ++*static_cast<std::atomic<int>*>(n); },
              &told) == RDMALOCK_OK);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(told.load() == 0);
  rdmalock_lock_free(l);
  rdmalock_cluster_close(c);
}

TEST_CASE("c api cluster: rdmalock_cluster_open reads a map file and routes as ShardForName") {
  TempFile good(
      "shards:\n"
      "  - {name: shard-a, server: 192.0.2.1}\n"
      "  - {name: shard-b, server: 192.0.2.2, port: 7472}\n");
  rdmalock_cluster_options_t o;
  rdmalock_cluster_options_init(&o);
  CHECK(o.struct_size == sizeof(o));
  o.shard_map_file = good.path.c_str();
  rdmalock_cluster_t* c = nullptr;
  REQUIRE(rdmalock_cluster_open(&o, &c) == RDMALOCK_OK);
  CHECK(rdmalock_cluster_shard_count(c) == 2);
  ClusterMap m;
  m.shards.push_back({"shard-a", "192.0.2.1", 7471});
  m.shards.push_back({"shard-b", "192.0.2.2", 7472});
  for (int i = 0; i < 50; ++i) {
    const std::string n = "orders/" + std::to_string(i);
    CHECK(ShardOf(c, n) == m.shards[ShardForName(m, n)].name);
  }
  rdmalock_cluster_close(c);

  // Per-shard session options are read as rdmalock_connect reads them (server is not required).
  rdmalock_options_t client;
  rdmalock_options_init(&client);
  client.client_name = "c-api-test";
  o.client = &client;
  REQUIRE(rdmalock_cluster_open(&o, &c) == RDMALOCK_OK);
  rdmalock_cluster_close(c);
  client.struct_size = 1;
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_INVALID_ARGUMENT);
  CHECK(c == nullptr);
  CHECK(std::string(rdmalock_last_error()).find("options->client->struct_size") !=
        std::string::npos);
}

TEST_CASE("c api cluster: rdmalock_cluster_open refuses what it cannot use, naming it") {
  rdmalock_cluster_options_t o;
  rdmalock_cluster_options_init(&o);
  rdmalock_cluster_t* c = reinterpret_cast<rdmalock_cluster_t*>(&o);
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_INVALID_ARGUMENT);  // neither source
  CHECK(c == nullptr);
  CHECK(std::string(rdmalock_last_error()).find("neither shard_map_file nor etcd_endpoints") !=
        std::string::npos);
  CHECK(rdmalock_cluster_open(nullptr, &c) == RDMALOCK_ERR_INVALID_ARGUMENT);
  CHECK(rdmalock_cluster_open(&o, nullptr) == RDMALOCK_ERR_INVALID_ARGUMENT);

  o.shard_map_file = "/nonexistent/cluster.yaml";
  o.etcd_endpoints = "http://127.0.0.1:2379";
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_INVALID_ARGUMENT);  // both
  o.etcd_endpoints = nullptr;
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_IO);
  CHECK(std::string(rdmalock_last_error()).find("/nonexistent/cluster.yaml") != std::string::npos);
  // A directory cannot be read either (found by review, 2026-12-06: it opened, read as nothing,
  // and was CONFIG "...:0: expected 'shards:'").
  o.shard_map_file = "/tmp";
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_IO);
  CHECK(std::string(rdmalock_last_error()).find("/tmp: Is a directory") != std::string::npos);

  TempFile unknown_key("shards:\n  - {name: a, server: h}\n  - {name: b, host: h}\n");
  o.shard_map_file = unknown_key.path.c_str();
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_CONFIG);
  const std::string why = rdmalock_last_error();
  INFO(why);
  CHECK(why.find(unknown_key.path + ":3: key 'host': unknown") != std::string::npos);
  TempFile twice("shards:\n  - {name: a, server: h}\n  - {name: a, server: i}\n");
  o.shard_map_file = twice.path.c_str();
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_CONFIG);
  // A key written twice: yaml-cpp keeps one value, so the shards of a second `shards:` block
  // went unused by every client (found by review, 2026-12-06).
  TempFile two_blocks("shards:\n  - {name: a, server: h}\nshards:\n  - {name: b, server: i}\n");
  o.shard_map_file = two_blocks.path.c_str();
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_CONFIG);
  CHECK(std::string(rdmalock_last_error())
            .find(two_blocks.path + ":3: key 'shards' appears twice (also line 1)") !=
        std::string::npos);
  TempFile two_servers("shards:\n  - name: a\n    server: h\n    server: i\n");
  o.shard_map_file = two_servers.path.c_str();
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_CONFIG);
  CHECK(std::string(rdmalock_last_error())
            .find(two_servers.path + ":4: key 'server' appears twice (also line 3)") !=
        std::string::npos);
  TempFile not_yaml("shards: [\n");
  o.shard_map_file = not_yaml.path.c_str();
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_CONFIG);

  o.shard_map_file = nullptr;
  o.etcd_endpoints = "http://127.0.0.1:1, ";
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_INVALID_ARGUMENT);
  o.etcd_endpoints = "http://127.0.0.1:1";
  o.etcd_cert_file = "/x.crt";
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_INVALID_ARGUMENT);
  CHECK(std::string(rdmalock_last_error()).find("etcd_key_file") != std::string::npos);

  // A newer caller's struct with a field this library does not know set: refused, not ignored.
  struct Newer {
    rdmalock_cluster_options_t known;
    int future;
  } n;
  rdmalock_cluster_options_init_sized(&n.known, sizeof(n));
  CHECK(n.known.struct_size == sizeof(n));
  n.known.shard_map_file = "/nonexistent";
  n.future = 1;
  CHECK(rdmalock_cluster_open(&n.known, &c) == RDMALOCK_ERR_UNSUPPORTED);
  o.struct_size = 4;
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_INVALID_ARGUMENT);
}

// A port or connect timeout of 0 reached the C++ library, whose message named its own fields
// ("ClientOptions::port is 0"), not the C caller's (stop 59's review of the C API, 2026-12-07).
TEST_CASE("c api: a port or connect timeout of 0 is refused naming the C field") {
  rdmalock_options_t o;
  rdmalock_options_init(&o);
  o.server = "192.0.2.1";
  // The status, the output left NULL (read after the call), and the field the message names.
  auto refused = [](rdmalock_status_t st, auto* out, const char* field) {
    CHECK(st == RDMALOCK_ERR_INVALID_ARGUMENT);
    CHECK(*out == nullptr);
    CHECK_THAT(rdmalock_last_error(), Catch::Contains(field));
  };
  rdmalock_client_t* c = nullptr;
  o.port = 0;
  refused(rdmalock_connect(&o, &c), &c, "options->port is 0");
  o.port = 7471;
  o.connect_timeout_ms = 0;
  refused(rdmalock_connect(&o, &c), &c, "options->connect_timeout_ms is 0");

  // A cluster's shard options: the timeout is checked; the port is the map's, so 0 is ignored.
  TempFile map("shards:\n  - {name: a, server: 192.0.2.1}\n");
  rdmalock_cluster_options_t co;
  rdmalock_cluster_options_init(&co);
  co.shard_map_file = map.path.c_str();
  co.client = &o;
  rdmalock_cluster_t* cc = nullptr;
  refused(rdmalock_cluster_open(&co, &cc), &cc, "options->client->connect_timeout_ms is 0");
  o.connect_timeout_ms = 5000;
  o.port = 0;
  CHECK(rdmalock_cluster_open(&co, &cc) == RDMALOCK_OK);
  if (cc != nullptr) rdmalock_cluster_close(cc);
}

// A map file's cluster took the etcd options too and dropped them without a word: the etcd CA,
// certificate, key and cluster name are for an etcd source only (stop 59's review, 2026-12-07).
TEST_CASE("c api cluster: a map file with etcd options is refused and names them") {
  TempFile good("shards:\n  - {name: a, server: 192.0.2.1}\n");
  for (const char* field : {"etcd_cluster", "etcd_ca_file", "etcd_cert_file", "etcd_key_file"}) {
    rdmalock_cluster_options_t o;
    rdmalock_cluster_options_init(&o);
    o.shard_map_file = good.path.c_str();
    const std::string f = field;
    (f == "etcd_cluster"     ? o.etcd_cluster
     : f == "etcd_ca_file"   ? o.etcd_ca_file
     : f == "etcd_cert_file" ? o.etcd_cert_file
                             : o.etcd_key_file) = "x";
    rdmalock_cluster_t* c = nullptr;
    const rdmalock_status_t st = rdmalock_cluster_open(&o, &c);
    INFO(field << ": " << rdmalock_error_name(st) << ": " << rdmalock_last_error());
    CHECK(st == RDMALOCK_ERR_INVALID_ARGUMENT);
    CHECK(c == nullptr);
    CHECK(std::string(rdmalock_last_error()).find(field) != std::string::npos);
    if (c != nullptr) rdmalock_cluster_close(c);
  }
}

TEST_CASE("c api cluster: rdmalock_cluster_open reads a map kept in etcd", "[etcd]") {
  testing::LocalEtcd server;
  const EtcdCluster e{{server.url()}, "capi"};
  auto kv = etcd::Client::Create({server.url()});
  REQUIRE(kv.ok());
  REQUIRE((*kv)->Put("/rdmalock/capi/shard/a/primary", "192.0.2.1:7471", 0, 2000ms).ok());
  REQUIRE((*kv)->Put("/rdmalock/capi/shard/b/primary", "192.0.2.2:7471", 0, 2000ms).ok());
  rdmalock_cluster_options_t o;
  rdmalock_cluster_options_init(&o);
  const std::string endpoints = server.url();
  o.etcd_endpoints = endpoints.c_str();
  o.etcd_cluster = "capi";
  rdmalock_cluster_t* c = nullptr;
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_CONFIG);  // no map published yet
  CHECK(std::string(rdmalock_last_error()).find("no cluster map") != std::string::npos);

  REQUIRE(PublishClusterMap(e, {"a", "b"}, false).ok());
  REQUIRE(rdmalock_cluster_open(&o, &c) == RDMALOCK_OK);
  CHECK(rdmalock_cluster_shard_count(c) == 2);
  ClusterMap m;
  m.shards.push_back({"a", "x", 7471});
  m.shards.push_back({"b", "y", 7471});
  for (int i = 0; i < 20; ++i) {
    const std::string n = "jobs/" + std::to_string(i);
    CHECK(ShardOf(c, n) == m.shards[ShardForName(m, n)].name);
  }
  rdmalock_cluster_close(c);

  o.etcd_endpoints = "http://127.0.0.1:1";  // nothing listens
  CHECK(rdmalock_cluster_open(&o, &c) == RDMALOCK_ERR_CONNECTION);
}
