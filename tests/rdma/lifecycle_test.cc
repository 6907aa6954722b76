// RDMA integration tests: lockd's life cycle. A clean stop on SIGTERM with clients connected;
// restarts (the persisted epoch keeps tokens increasing; kill -9 and restart: the grace period,
// clients reconnecting, held locks reported lost; a clean stop after a heartbeat fence keeps the
// grace); systemd notifications and SIGHUP reloads; a key rotated under lockd's own loopback
// handshake (an in-process lockd::Server).
// Run on rdma_rxe only (tests/rdma/lockd_fixture.h).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/auth/auth.h"
#include "rdmalock/client.h"
#include "server/config.h"
#include "server/lockd.h"
#include "tests/rdma/clients.h"
#include "tests/rdma/lockd_fixture.h"
#include "tests/rdma/raw_peer.h"

using namespace rdmalock;
using namespace rdmalock::rdma_test;
using namespace std::chrono_literals;

TEST_CASE("lockd stops cleanly on SIGTERM with clients connected") {
  auto lockd = std::make_unique<Lockd>(7608);
  auto a = MustConnect(*lockd);
  auto b = MustConnect(*lockd);
  auto h = a->Lock("held-at-shutdown");
  REQUIRE(h.ok());
  const pid_t pid = lockd->pid();
  REQUIRE(kill(pid, SIGTERM) == 0);
  const int rc = WaitExit(pid, 15s);
  const std::string log = lockd->Log();
  lockd->Forget();
  INFO(log);
  REQUIRE(rc == 0);
  REQUIRE(log.find("stopped cleanly") != std::string::npos);
  // The clients see the connection gone: an error, not a hang.
  auto r = b->Lock("after-shutdown", {.timeout = 5000ms});
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.status().code() == ErrorCode::kConnection);
}

TEST_CASE("fencing tokens keep increasing across a lockd restart (persisted epoch)") {
  const std::string state = TempDir();
  uint64_t first = 0, epoch = 0;
  {
    Lockd lockd(7625, 64, 2000, 64, state);
    auto c = MustConnect(lockd);
    auto info = c->Info();
    REQUIRE(info.ok());
    epoch = info->epoch;
    for (int i = 0; i < 3; ++i) {
      auto h = c->Lock("restart");
      REQUIRE(h.ok());
      REQUIRE(h->fencing_token() > first);
      first = h->fencing_token();
    }
  }  // lockd stops (SIGTERM); the lock table is gone, the epoch file stays
  Lockd lockd(7625, 64, 2000, 64, state);
  auto c = MustConnect(lockd);
  auto info = c->Info();
  REQUIRE(info.ok());
  REQUIRE(info->epoch == epoch + 1);
  auto h = c->Lock("restart");
  REQUIRE(h.ok());
  REQUIRE(h->fencing_token() > first);
}

TEST_CASE("lockd kill -9 and restart: grace, clients reconnect, locks reported lost, tokens grow") {
  const std::string state = TempDir();
  Lockd lockd(7627, 64, 1000, 64, state);
  auto c = MustConnect(lockd);
  const uint64_t epoch = c->epoch();
  auto held = c->Lock("restart-held");
  REQUIRE(held.ok());
  const uint64_t old_token = held->fencing_token();
  std::atomic<bool> lost{false};
  held->OnLost([&](const Status&) { lost = true; });

  lockd.Kill9();
  const auto killed_at = std::chrono::steady_clock::now();
  // The client notices at once (rdma_cm DISCONNECTED) and reports the held lock lost.
  while (!lost && std::chrono::steady_clock::now() - killed_at < 5s) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(lost);
  const double lost_ms = Ms(std::chrono::steady_clock::now() - killed_at);
  REQUIRE(held->state() == LockState::kLost);
  REQUIRE(held->Release().code() == ErrorCode::kLockLost);

  const auto started_at = std::chrono::steady_clock::now();
  lockd.Start();  // unclean stop: lockd refuses clients for one lease (1000 ms)
  // A new client that will not wait is refused with the grace reason.
  {
    ClientOptions o;
    o.server = RxeIp();
    o.port = lockd.port();
    o.connect_timeout = 100ms;
    auto early = Client::Connect(o);
    if (std::chrono::steady_clock::now() - started_at < 900ms) {
      REQUIRE_FALSE(early.ok());
      INFO(early.status().ToString());
      REQUIRE(early.status().message().find("grace") != std::string::npos);
    }
  }
  // The old client reconnects by itself and serves again.
  auto again = c->Lock("restart-held", {.timeout = 20000ms});
  const double serving_ms = Ms(std::chrono::steady_clock::now() - started_at);
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  WARN("lockd restart: held lock reported lost "
       << lost_ms << " ms after kill -9; clients serving again " << serving_ms
       << " ms after lockd was started (grace 1000 ms)");
  REQUIRE(serving_ms >= 1000);  // the grace period held everyone off
  REQUIRE(c->epoch() == epoch + 1);
  REQUIRE(again->fencing_token() > old_token);
  REQUIRE(c->Stats().sessions_lost == 1);
  REQUIRE(c->Stats().reconnects == 1);
  REQUIRE(lockd.Log().find("did not stop cleanly") != std::string::npos);
  REQUIRE(again->Release().ok());
}

TEST_CASE("lockd tells systemd READY, RELOADING and STOPPING; SIGHUP re-reads log_level") {
  // A datagram socket standing in for systemd's NOTIFY_SOCKET.
  const std::string dir = TempDir();
  const std::string sock_path = dir + "/notify.sock";
  const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  REQUIRE(sock >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock_path.c_str());
  REQUIRE(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  auto next_message = [&](std::chrono::milliseconds timeout) -> std::string {
    pollfd p{sock, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return "";
    char buf[512];
    const ssize_t n = recv(sock, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  };
  const std::string config = dir + "/lockd.yaml";
  std::ofstream(config) << "log_level: info\nlease_ms: 2000\nstall_factor: 4\n";
  REQUIRE(setenv("NOTIFY_SOCKET", sock_path.c_str(), 1) == 0);
  Lockd lockd(7643, 64, 2000, 64, "", {"--config", config, "--test-config-log-level"});
  REQUIRE(unsetenv("NOTIFY_SOCKET") == 0);
  const std::string ready = next_message(5000ms);
  INFO(ready);
  REQUIRE(ready.find("READY=1") != std::string::npos);
  REQUIRE(ready.find("STATUS=serving 64 locks") != std::string::npos);

  // Reload: log_level applies at once; stall_factor needs a restart and says so. lease_ms is
  // overridden on the command line (the harness passes --lease-ms), so its change in the file is
  // not reported: a restart would keep the override (issue 17 finding 16).
  std::ofstream(config) << "log_level: debug\nlease_ms: 3000\nstall_factor: 5\n";
  REQUIRE(kill(lockd.pid(), SIGHUP) == 0);
  const std::string reloading = next_message(5000ms);
  REQUIRE(reloading.find("RELOADING=1") != std::string::npos);
  REQUIRE(reloading.find("MONOTONIC_USEC=") != std::string::npos);
  REQUIRE(next_message(5000ms).find("READY=1") != std::string::npos);
  std::string log = lockd.Log();
  INFO(log);
  REQUIRE(log.find("reload: log_level info -> debug") != std::string::npos);
  REQUIRE(log.find("changed stall_factor: restart lockd to apply") != std::string::npos);
  REQUIRE(log.find("lease_ms: restart") == std::string::npos);
  // A broken file changes nothing, and lockd keeps serving.
  std::ofstream(config) << "lease_ms: soon\n";
  REQUIRE(kill(lockd.pid(), SIGHUP) == 0);
  REQUIRE(next_message(5000ms).find("RELOADING=1") != std::string::npos);
  REQUIRE(next_message(5000ms).find("READY=1") != std::string::npos);
  REQUIRE(lockd.Log().find("keeping the running configuration") != std::string::npos);
  auto c = MustConnect(lockd);
  REQUIRE(c->Lock("after-reload").ok());
  c.reset();

  REQUIRE(kill(lockd.pid(), SIGTERM) == 0);
  const std::string stopping = next_message(5000ms);
  REQUIRE(stopping.find("STOPPING=1") != std::string::npos);
  REQUIRE(WaitExit(lockd.pid(), 10s) == 0);
  lockd.Forget();
  close(sock);
}

TEST_CASE("finding 5: a clean stop after a heartbeat fence keeps the restart grace") {
  // A holder with a 4 s lease stops (SIGSTOP); lockd fences it by heartbeat after 200 ms, but its
  // lease may run until 4 s after its last renewal. lockd is then stopped cleanly, with no client
  // connected, and started again: nobody may be granted the lock before the stopped holder's
  // lease could have ended.
  const std::string state = TempDir();
  Lockd lockd(7662, 64, 4000, 64, state,
              {"--heartbeat-interval-ms", "50", "--heartbeat-timeout-ms", "200"});
  SharedFile shf;
  const pid_t holder = StartHolder(lockd, shf, "f5", false);
  REQUIRE(kill(holder, SIGSTOP) == 0);
  const auto stopped_at = std::chrono::steady_clock::now();
  WaitForLog(lockd, "no heartbeat for");
  lockd.Stop();
  lockd.Start();
  auto c = MustConnect(lockd);
  auto h = c->Lock("f5", {.timeout = 20000ms});
  const double ms = Ms(std::chrono::steady_clock::now() - stopped_at);
  INFO(lockd.Log());
  REQUIRE(h.ok());
  WARN("finding 5: holder stopped -> fenced -> lockd stopped cleanly and restarted -> next grant "
       << ms << " ms after the stop (lease 4000 ms)");
  kill(holder, SIGKILL);
  WaitExit(holder, 10s);
  REQUIRE(ms >= 4000);
}

// The SDK's fork() promise (docs/sdk.md: a parent keeps its session and locks across a fork, the
// C API's and the Python module's fork tests) relies on the kernel copying DMA-pinned pages for
// the child: else the pages the NIC writes the parent's results into turn copy-on-write, and the
// parent's next write to one leaves the NIC writing into the child's copy. libibverbs says which.
TEST_CASE("the kernel copies DMA-pinned pages at fork, which the SDK's fork() promise needs") {
  Lockd lockd(7688, 64);
  auto c = MustConnect(lockd);  // with memory registered, as in an application that forks
  CHECK(KernelCopiesPinnedPagesAtFork());
}

// In cluster mode a reload may replace the shared key while a new term's server is still
// connecting its own loopback: lockd read the key, then connected, and the server challenged
// with the key of that later moment. The probe failed (authentication failed) and lockd exited.
// Seen in CI, 2026-12-06: the operator check f16_cluster_rotated_key_file_kept_across_terms
// reloaded just after the win and found no second term. Here the key changes every millisecond
// for the probe's first 300 ms, then stays: the loopback must end up proving the key in force.
TEST_CASE("a key rotated while lockd connects its own loopback: the probe proves the new key") {
  const std::string dir = TempDir();
  const std::string first_key = auth::NewKeyHex();
  {
    std::ofstream f(dir + "/lockd.key");
    f << first_key << "\n";
  }
  REQUIRE(chmod((dir + "/lockd.key").c_str(), 0600) == 0);
  lockd::Config c;
  c.address = RxeIp();
  c.port = 7695;
  c.lock_count = 64;
  c.state_dir = dir;  // Validate asks for one; Create itself writes nothing there
  c.admin_socket = "";
  c.metrics_address = "";
  c.auth_key_file = dir + "/lockd.key";
  auto server = lockd::Server::Create(c, 1, /*unclean_start=*/false, first_key);
  const std::string created = server.ok() ? std::string("ok") : server.status().ToString();
  INFO("lockd::Server::Create: " << created);
  REQUIRE(server.ok());
  Status loop_status;
  std::thread loop([&] { loop_status = (*server)->Run(); });
  int rotations = 0;
  std::thread rotate([&] {
    const auto until = std::chrono::steady_clock::now() + 300ms;
    while (std::chrono::steady_clock::now() < until) {
      (*server)->SetAuthKey(auth::NewKeyHex());
      ++rotations;
      std::this_thread::sleep_for(1ms);
    }
  });
  const auto started = std::chrono::steady_clock::now();
  const Status probe = (*server)->ProbeLoopback(10s);
  const auto took = std::chrono::steady_clock::now() - started;
  rotate.join();
  (*server)->RequestStop();
  loop.join();
  const std::string outcome = probe.ok() ? std::string("ok") : probe.ToString();
  INFO("the probe: " << outcome << " after "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                     << " ms; " << rotations << " key rotations");
  CHECK(loop_status.ok());
  REQUIRE(probe.ok());
}
