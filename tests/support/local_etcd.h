// A real etcd (Debian's etcd-server) for host tests, started on loopback ports of its own in a
// temporary directory and killed at the end. No etcd binary is a failure, not a skip.
// Thread-safety: one thread (the test's) owns it.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/etcd/etcd.h"

namespace rdmalock::testing {

inline uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

// A single-member etcd on 127.0.0.1, in a temporary directory, killed at the end. With `tls`, it
// serves https with a certificate of a CA made here, and requires a client certificate from the
// same CA (ca(), cert(), key() give a client's files).
class LocalEtcd {
 public:
  // `extra`: more of etcd's flags (e.g. its election timeout).
  explicit LocalEtcd(bool tls = false, const std::vector<std::string>& extra = {}) {
    char tmpl[] = "/tmp/rdmalock-etcd-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    if (tls) MakeCerts();
    const uint16_t client = FreePort(), peer = FreePort();
    url_ = std::string(tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(client);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    const std::string log = dir_ + "/etcd.log";
    std::vector<std::string> args = {"etcd",
                                     "--name",
                                     "t",
                                     "--data-dir",
                                     dir_ + "/data",
                                     "--listen-client-urls",
                                     url_,
                                     "--advertise-client-urls",
                                     url_,
                                     "--listen-peer-urls",
                                     peer_url,
                                     "--initial-advertise-peer-urls",
                                     peer_url,
                                     "--initial-cluster",
                                     "t=" + peer_url};
    if (tls) {
      for (const std::string& a :
           {"--cert-file=" + dir_ + "/server.crt", "--key-file=" + dir_ + "/server.key",
            "--trusted-ca-file=" + ca(), std::string("--client-cert-auth")}) {
        args.push_back(a);
      }
    }
    for (const std::string& a : extra) args.push_back(a);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      // etcd dies with the test, and holds none of its output (a pipe a CI log reads).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (freopen("/dev/null", "w", stdout) == nullptr) _exit(126);
      if (freopen(log.c_str(), "w", stderr) == nullptr) _exit(126);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execvp("etcd", argv.data());
      _exit(127);
    }
    try {
      WaitReady(tls, log);
    } catch (...) {  // a failed REQUIRE: the destructor will not run (keep the log)
      Stop(/*remove_dir=*/false);
      throw;
    }
  }
  ~LocalEtcd() { Stop(); }

  void WaitReady(bool tls, const std::string& log) {
    rdmalock::etcd::Tls client_tls;
    if (tls) client_tls = {ca(), cert(), key()};
    auto c = rdmalock::etcd::Client::Create({url_}, client_tls);
    REQUIRE(c.ok());
    for (int i = 0; i < 300; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("etcd exited (is Debian's etcd-server installed? see " << log << ")");
      }
      if ((*c)->Get("/probe", std::chrono::milliseconds(500)).ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL("etcd did not answer at " << url_ << " within 30 s (see " << log << ")");
  }
  void Stop(bool remove_dir = true) {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    std::error_code ec;
    if (remove_dir) std::filesystem::remove_all(dir_, ec);
  }
  const std::string& url() const { return url_; }
  std::string ca() const { return dir_ + "/ca.crt"; }
  std::string cert() const { return dir_ + "/client.crt"; }
  std::string key() const { return dir_ + "/client.key"; }
  void Pause() { kill(pid_, SIGSTOP); }
  void Resume() { kill(pid_, SIGCONT); }

 private:
  // A CA, a server certificate for 127.0.0.1 (also usable as a client: etcd's gateway dials
  // etcd with it) and a client certificate, with openssl(1).
  void MakeCerts() {
    const std::string d = dir_;
    {
      std::ofstream sh(d + "/make-certs.sh");
      sh << "set -e\ncd " << d << "\nexec 2>openssl.log\n"
         << "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
            "-subj /CN=rdmalock-test-ca\n"
         << "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' "
            ">server.ext\n"
         << "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
            "-subj /CN=127.0.0.1\n"
         << "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
            "-out server.crt -days 1 -extfile server.ext\n"
         << "printf 'extendedKeyUsage=clientAuth\\n' >client.ext\n"
         << "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
            "-subj /CN=client\n"
         << "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
            "-out client.crt -days 1 -extfile client.ext\n";
    }
    INFO("see " << d << "/openssl.log");
    REQUIRE(std::system(("sh " + d + "/make-certs.sh").c_str()) == 0);
  }

  std::string dir_, url_;
  pid_t pid_ = -1;
};

}  // namespace rdmalock::testing
