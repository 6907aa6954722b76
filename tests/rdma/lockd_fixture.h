// The lockd process the RDMA integration tests run against, and what a test needs around it:
// the rdma_rxe address, scratch directories, waiting for a process, lockd's log, its admin socket
// and metrics page, lockctl command lines. Every tests/rdma/*_test.cc shares these instead of a
// copy each.
//
// Threads: everything here runs on the Catch2 test's thread (REQUIRE and FAIL may only be used
// there); a Lockd is owned by the test case that made it and stopped when it goes out of scope.
//
// The tests need an RDMA device and RXE_IP (the address rdma_cm reaches it by);
// deploy/softroce/rxe-run provides both, in the Soft-RoCE VM where the host kernel has no RDMA.
// Without them every test FAILS: an RDMA test that cannot run must not pass.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/verbs_memory.h"
#include "rdmalock/client.h"

namespace rdmalock::rdma_test {

// RXE_IP, the address of the rdma_rxe device; fails the test when it is not set.
std::string RxeIp();

// A new scratch directory under $TMPDIR (or /tmp).
std::string TempDir();

// Waits for child `pid` to exit: its exit status, 128 + the signal that ended it, or -2 if it
// ran past `timeout` (it is then killed with SIGKILL).
int WaitExit(pid_t pid, std::chrono::milliseconds timeout);

// A lockd process for the duration of a test.
class Lockd {
 public:
  // Pseudo-flags in `extra`, taken out before lockd sees the rest:
  //   "--test-auth-key KEY": lockd requires that key (written to a 0600 file); Connect() uses it.
  //   "--test-no-wait": ready when lockd logs that it listens (it may refuse this host).
  //   "--test-config-log-level": leave log_level to the config file (the reload test changes
  //   it); otherwise lockd runs with --log-level debug.
  // No metrics endpoint unless `extra` has --metrics-address.
  explicit Lockd(uint16_t port, uint64_t lock_count = 1024, uint64_t lease_ms = 2000,
                 uint32_t max_clients = 64, std::string state_dir = "",
                 std::vector<std::string> extra = {});
  ~Lockd();
  Lockd(const Lockd&) = delete;
  Lockd& operator=(const Lockd&) = delete;

  // Starts lockd (again, after Kill9()) and waits until a client can connect.
  void Start();
  Result<std::unique_ptr<Client>> Connect(bool auto_renew = true, bool local_handover = true) const;
  const std::string& key() const { return key_; }
  // All lockd wrote to stderr so far (every start appends).
  std::string Log() const;
  pid_t pid() const { return pid_; }
  // The test stopped lockd itself (and waited for it): the destructor leaves it.
  void Forget() { pid_ = -1; }
  uint16_t port() const { return port_; }
  const std::string& admin_socket() const { return admin_; }
  // SIGTERM (a clean stop) and waits for lockd to exit 0.
  void Stop();
  // kill -9 (an unclean stop: the next start has a restart grace period).
  void Kill9();

 private:
  uint16_t port_;
  pid_t pid_ = -1;
  std::string dir_, log_, state_, admin_, key_;
  bool no_wait_ = false;
  std::vector<std::string> args_;
};

std::unique_ptr<Client> MustConnect(const Lockd& d, bool auto_renew = true);
// A client whose threads each queue at lockd (ClientOptions::local_handover off): for tests that
// want one client's threads to show as lockd's waiters; with the default, the second thread of a
// client to want a lock waits in-process behind the first (cohort handover).
std::unique_ptr<Client> MustConnectQueuingAtLockd(const Lockd& d);

// A raw channel to lockd (no session keeper: it never heartbeats, so lockd fences it after
// heartbeat_timeout_ms).
std::unique_ptr<VerbsMemory> RawChannel(const Lockd& lockd, const std::string& name);

// Waits until lockd's log contains `text`; fails with the log after `limit`.
void WaitForLog(const Lockd& lockd, const std::string& text,
                std::chrono::seconds limit = std::chrono::seconds(15));

// Whether child `pid` is still running.
bool Alive(pid_t pid);

// Runs a shell command; its exit status (-1 if it did not exit).
int RunCommand(const std::string& cmd);

// Runs a shell command and returns its exit status and stdout.
std::pair<int, std::string> Capture(const std::string& cmd);

// "lockctl --server RXE_IP --port PORT", to append a command to.
std::string Lockctl(const Lockd& lockd);
// `path` quoted for sh (a build in a path with spaces: the README's "a clone in any folder").
std::string ShellQuoted(const std::string& path);

// lockd's metrics page, fetched with curl.
std::string Scrape(const std::string& addr);

// The value of one sample ("name" or "name{labels}"); fails if the page lacks it.
double Metric(const std::string& page, const std::string& sample);

// A duration in milliseconds, for reports and bounds.
double Ms(std::chrono::steady_clock::duration d);

}  // namespace rdmalock::rdma_test
