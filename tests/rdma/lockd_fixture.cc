#include "tests/rdma/lockd_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace rdmalock::rdma_test {

using namespace std::chrono_literals;

std::string RxeIp() {
  const char* ip = std::getenv("RXE_IP");
  if (ip == nullptr || *ip == '\0') {
    FAIL(
        "RXE_IP is not set: run the RDMA tests through deploy/softroce/rxe-run (it provides "
        "rdma_rxe and RXE_IP)");
  }
  return ip;
}

std::string TempDir() {
  const char* t = std::getenv("TMPDIR");
  std::string base = t != nullptr ? t : "/tmp";
  std::string tmpl = base + "/rdmalock-test.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  REQUIRE(mkdtemp(buf.data()) != nullptr);
  return buf.data();
}

int WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -2;  // timed out
    }
    std::this_thread::sleep_for(10ms);
  }
}

Lockd::Lockd(uint16_t port, uint64_t lock_count, uint64_t lease_ms, uint32_t max_clients,
             std::string state_dir, std::vector<std::string> extra)
    : port_(port) {
  dir_ = TempDir();
  state_ = state_dir.empty() ? dir_ : state_dir;
  log_ = dir_ + "/lockd.log";
  admin_ = dir_ + "/admin.sock";
  args_ = {"lockd",
           "--port",
           std::to_string(port),
           "--lock-count",
           std::to_string(lock_count),
           "--lease-ms",
           std::to_string(lease_ms),
           "--max-clients",
           std::to_string(max_clients),
           "--state-dir",
           state_,
           "--admin-socket",
           admin_};
  // "--test-auth-key KEY": lockd requires that key (written to a 0600 file); Connect() uses it.
  if (auto it = std::find(extra.begin(), extra.end(), "--test-auth-key"); it != extra.end()) {
    key_ = *(it + 1);
    extra.erase(it, it + 2);
    const std::string key_file = dir_ + "/auth.key";
    const int fd = open(key_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, key_.data(), key_.size()) == static_cast<ssize_t>(key_.size()));
    close(fd);
    args_.insert(args_.end(), {"--auth-key-file", key_file});
  }
  // "--test-no-wait": ready when lockd logs that it listens (it may refuse this host).
  no_wait_ = std::erase(extra, std::string("--test-no-wait")) > 0;
  // "--test-config-log-level": leave log_level to the config file (the reload test changes it).
  if (std::erase(extra, std::string("--test-config-log-level")) == 0) {
    args_.insert(args_.end(), {"--log-level", "debug"});
  }
  // No metrics endpoint unless the test asks for one: lockds of tests (and a lockd of the host)
  // would compete for the default port.
  if (std::find(extra.begin(), extra.end(), "--metrics-address") == extra.end()) {
    args_.insert(args_.end(), {"--metrics-address", ""});
  }
  args_.insert(args_.end(), extra.begin(), extra.end());
  Start();
}

void Lockd::Start() {
  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    FILE* f = std::freopen(log_.c_str(), "a", stderr);
    (void)f;
    std::vector<char*> argv;
    for (auto& a : args_) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(LOCKD_PATH, argv.data());
    _exit(127);
  }
  // Ready once a client can connect.
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (no_wait_ && Log().find("listening on") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(50ms);
  }
  for (; !no_wait_;) {
    auto c = Connect();
    if (c.ok()) break;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      FAIL("lockd exited during start-up:\n" << Log());
    }
    if (std::chrono::steady_clock::now() > end) {
      FAIL("lockd did not accept a client within 20 s: " << c.status().ToString() << "\n" << Log());
    }
    std::this_thread::sleep_for(100ms);
  }
}

Lockd::~Lockd() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    WaitExit(pid_, 10s);
  }
}

Result<std::unique_ptr<Client>> Lockd::Connect(bool auto_renew, bool local_handover) const {
  ClientOptions o;
  o.server = RxeIp();
  o.port = port_;
  o.connect_timeout = 3s;
  o.auto_renew = auto_renew;
  o.local_handover = local_handover;
  o.auth_key = key_;
  return Client::Connect(o);
}

std::string Lockd::Log() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Lockd::Stop() {
  REQUIRE(pid_ > 0);
  kill(pid_, SIGTERM);
  REQUIRE(WaitExit(pid_, 20s) == 0);
  pid_ = -1;
}

void Lockd::Kill9() {
  REQUIRE(pid_ > 0);
  kill(pid_, SIGKILL);
  REQUIRE(WaitExit(pid_, 10s) == 128 + SIGKILL);
  pid_ = -1;
}

std::unique_ptr<Client> MustConnect(const Lockd& d, bool auto_renew) {
  auto c = d.Connect(auto_renew);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(c).value();
}

std::unique_ptr<Client> MustConnectQueuingAtLockd(const Lockd& d) {
  auto c = d.Connect(/*auto_renew=*/true, /*local_handover=*/false);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return std::move(c).value();
}

std::unique_ptr<VerbsMemory> RawChannel(const Lockd& lockd, const std::string& name) {
  ChannelParams p{RxeIp(), lockd.port(), 3s, name, 0};
  p.auth_key = lockd.key();
  auto m = VerbsMemory::Connect(p);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return std::move(m).value();
}

void WaitForLog(const Lockd& lockd, const std::string& text, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (lockd.Log().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > end)
      FAIL("lockd never logged '" << text << "':\n" << lockd.Log());
    std::this_thread::sleep_for(50ms);
  }
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0 && waitpid(pid, nullptr, WNOHANG) == 0; }

int RunCommand(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::pair<int, std::string> Capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

std::string Lockctl(const Lockd& lockd) {
  return ShellQuoted(LOCKCTL_PATH) + " --server " + RxeIp() + " --port " +
         std::to_string(lockd.port());
}

std::string ShellQuoted(const std::string& path) {
  std::string out = "'";
  for (char ch : path) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

std::string Scrape(const std::string& addr) {
  auto [rc, text] = Capture("curl -sf --max-time 5 http://" + addr + "/metrics");
  INFO(text);
  REQUIRE(rc == 0);
  return text;
}

double Metric(const std::string& page, const std::string& sample) {
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  }
  FAIL("no sample " << sample << " in the metrics page:\n" << page);
  return 0;
}

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace rdmalock::rdma_test
