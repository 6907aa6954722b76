// server/admin: the admin socket's request parser (pure), and the socket itself on a path in a
// temporary directory (no verbs): who may take the path, and what a request line may be.
#include "server/admin.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/test_env.h"

namespace fs = std::filesystem;
using rdmalock::lockd::AdminRequest;
using rdmalock::lockd::AdminSocket;
using rdmalock::lockd::ParseAdminCommand;
using rdmalock::testing::TempDir;

namespace {

// A Unix stream socket connected to `path`, or -1.
int ConnectTo(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

// A socket file at `path` that nothing serves, as a lockd killed with SIGKILL leaves it: bound,
// then closed without unlinking.
void LeaveStaleSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd, 1) == 0);
  close(fd);
}

// Sends `request` to the socket at `path` and serves `admin` as lockd's event loop does (accept,
// poll the connections, read, answer) until the reply comes, for up to a second. Returns the
// reply line without its newline, or "" when none came; the lines the handler was given are
// appended to *handled. With `then_shut`, the request is followed by the end of the stream
// (shutdown SHUT_WR), as a tool that writes and closes its side sends it.
std::string Ask(AdminSocket& admin, const std::string& path, const std::string& request,
                std::vector<std::string>* handled, bool then_shut = false) {
  const int fd = ConnectTo(path);
  if (fd < 0) return "";
  (void)!write(fd, request.data(), request.size());
  if (then_shut) shutdown(fd, SHUT_WR);
  const AdminSocket::Handler handler = [handled](const std::string& line, const std::string&) {
    handled->push_back(line);
    return "ok " + line;
  };
  std::string reply;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < until && reply.find('\n') == std::string::npos) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<pollfd> fds = {{admin.listen_fd(now), POLLIN, 0}};
    admin.AddConnFds(&fds);
    if (poll(fds.data(), fds.size(), 10) > 0) {
      admin.OnConnsReady(fds.data() + 1, fds.size() - 1, handler);
      if (fds[0].revents != 0) admin.OnAcceptable(std::chrono::steady_clock::now());
    }
    pollfd mine{fd, POLLIN, 0};
    char buf[512];
    ssize_t n = 0;
    if (poll(&mine, 1, 0) > 0 && (n = read(fd, buf, sizeof(buf))) > 0) {
      reply.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (auto nl = reply.find('\n'); nl != std::string::npos) reply.resize(nl);
  return reply;
}

}  // namespace

TEST_CASE("admin parser: the two requests, with their number") {
  std::string error;
  auto slot = ParseAdminCommand("release-slot 42", &error);
  REQUIRE(slot);
  CHECK(slot->kind == AdminRequest::Kind::kReleaseSlot);
  CHECK(slot->number == 42);
  CHECK(slot->arg == "42");
  auto session = ParseAdminCommand("  release-session   7 ", &error);
  REQUIRE(session);
  CHECK(session->kind == AdminRequest::Kind::kReleaseSession);
  CHECK(session->number == 7);
  // 19 digits is the most taken (always fits 64 bits).
  auto big = ParseAdminCommand("release-session 9999999999999999999", &error);
  REQUIRE(big);
  CHECK(big->number == 9999999999999999999ull);
}

// lockctl release --force NAME maps the name by the lock count of the lockd it reached over RDMA,
// and says which lockd that was: one behind --admin-socket that is another refuses the slot
// (found by review, 2026-12-05; lockd's check runs in the RDMA test 'lockctl release --force of a
// name refuses an admin socket of another lockd'). --slot and --session name the lockd too when
// --server, --port or --shard named one (2026-12-06; RDMA test 'lockctl release --force --slot or
// --session refuses an admin socket of another lockd').
TEST_CASE("admin parser: a request may name the lockd it is meant for") {
  std::string error;
  auto r = ParseAdminCommand("release-slot 42 lockd 3 1764979200123456789", &error);
  INFO(error);
  REQUIRE(r);
  CHECK(r->number == 42);
  REQUIRE(r->meant_for);
  CHECK(r->meant_for->epoch == 3);
  CHECK(r->meant_for->start_time_unix_ns == 1764979200123456789ull);
  auto plain = ParseAdminCommand("release-slot 42", &error);
  REQUIRE(plain);
  CHECK_FALSE(plain->meant_for);
  auto session = ParseAdminCommand("release-session 7 lockd 3 1764979200123456789", &error);
  INFO(error);
  REQUIRE(session);
  CHECK(session->kind == AdminRequest::Kind::kReleaseSession);
  CHECK(session->number == 7);
  REQUIRE(session->meant_for);
  CHECK(session->meant_for->epoch == 3);
}

TEST_CASE("admin parser: a malformed line is an error reply that quotes it") {
  for (const std::string line :
       {"", "release-slot", "release-slot x", "release-slot -1", "release-slot 1 2",
        "release-lock 3", "release-slot 0x10", "release-session 12345678901234567890",
        "RELEASE-SLOT 1", "release-slot 1 lockd 3", "release-slot 1 lockd 3 x",
        "release-slot 1 node 3 4", "release-session 1 lockd 3", "release-slot 1 lockd 3 4 5"}) {
    std::string error;
    INFO(line);
    CHECK_FALSE(ParseAdminCommand(line, &error));
    CHECK(error.rfind("error bad request '", 0) == 0);
    CHECK(error.find("(expected: release-slot SLOT | release-session ID, either followed by [lockd "
                     "EPOCH START_NS])") != std::string::npos);
  }
  // The quote is cut at 80 characters: a peer cannot make lockd echo a long line.
  std::string error;
  CHECK_FALSE(ParseAdminCommand(std::string(500, 'a'), &error));
  CHECK(error.size() < 200);
}

// Open unlinked whatever was at the path before binding, and the destructor unlinked the path at
// exit. A second lockd with the same admin_socket (the default is one path per host, e.g. two
// cluster-mode shards on one node) silently took the path: `lockctl release --force` then fenced
// a holder in the second lockd's table, and the first could no longer be reached (found by
// review, 2026-12-05). Open now asks the socket first and refuses a path something answers on.
TEST_CASE(
    "admin socket: a second Open of a path that is served fails, and the first still answers") {
  TempDir dir;
  const std::string path = dir.str() + "/lockd.sock";
  auto first = AdminSocket::Open(path);
  REQUIRE(first.ok());
  auto second = AdminSocket::Open(path);
  INFO("second Open: " << (second.ok() ? std::string("ok") : second.status().ToString()));
  CHECK_FALSE(second.ok());
  if (!second.ok()) {
    CHECK(second.status().message().find(path) != std::string::npos);
    CHECK(second.status().message().find("in use") != std::string::npos);
  }
  std::vector<std::string> handled;
  CHECK(Ask(**first, path, "release-slot 7\n", &handled) == "ok release-slot 7");
}

// A regular file at admin_socket (a typo in lockd.yaml naming some file) was deleted by Open
// (found by review, 2026-12-05). Open now refuses anything at the path that is not a socket, and
// leaves it alone.
TEST_CASE("admin socket: a file at the path that is not a socket is refused and left intact") {
  TempDir dir;
  const std::string path = dir.str() + "/lockd.sock";
  std::ofstream(path) << "keep me\n";
  auto opened = AdminSocket::Open(path);
  INFO("Open: " << (opened.ok() ? std::string("ok") : opened.status().ToString()));
  CHECK_FALSE(opened.ok());
  if (!opened.ok()) {
    CHECK(opened.status().message().find(path) != std::string::npos);
    CHECK(opened.status().message().find("not a socket") != std::string::npos);
  }
  CHECK(fs::is_regular_file(path));
  std::ifstream in(path);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "keep me\n");
}

// What a lockd that was killed leaves behind, a socket nothing listens on, is still replaced (a
// guard for the check above: it passed before the fix too).
TEST_CASE("admin socket: a stale socket at the path is replaced") {
  TempDir dir;
  const std::string path = dir.str() + "/lockd.sock";
  LeaveStaleSocket(path);
  auto opened = AdminSocket::Open(path);
  INFO("Open: " << (opened.ok() ? std::string("ok") : opened.status().ToString()));
  REQUIRE(opened.ok());
  std::vector<std::string> handled;
  CHECK(Ask(**opened, path, "release-session 3\n", &handled) == "ok release-session 3");
}

// The destructor unlinked the path whatever it was by then: a lockd stopping after another had
// taken the path (or an operator had put something else there) removed the other's socket
// (found by review, 2026-12-05). It now unlinks only the socket it bound (same device and inode).
TEST_CASE("admin socket: destroying one whose path was since replaced leaves the new one") {
  TempDir dir;
  const std::string path = dir.str() + "/lockd.sock";
  auto old = AdminSocket::Open(path);
  REQUIRE(old.ok());
  fs::remove(path);
  auto now = AdminSocket::Open(path);  // the path is free again: taken
  REQUIRE(now.ok());
  old->reset();
  CHECK(fs::exists(path));
  std::vector<std::string> handled;
  CHECK(Ask(**now, path, "release-slot 1\n", &handled) == "ok release-slot 1");
  now->reset();  // its own socket: removed at exit, as before
  CHECK_FALSE(fs::exists(path));
  // A regular file put in place of the socket is left too.
  auto third = AdminSocket::Open(path);
  REQUIRE(third.ok());
  fs::remove(path);
  std::ofstream(path) << "other\n";
  third->reset();
  CHECK(fs::is_regular_file(path));
}

// A request line longer than kMaxLine (1024 bytes) was handed to the handler cut to its first
// 1024 bytes: 1005 spaces and "release-slot 1234567890" fenced slot 123456 (found by review,
// 2026-12-05). Such a line is now answered with an error, the handler is not called, and the
// connection is closed (one request per connection: the rest of the line is never read).
TEST_CASE("admin socket: a request line longer than 1024 bytes is refused, not cut") {
  TempDir dir;
  const std::string path = dir.str() + "/lockd.sock";
  auto admin = AdminSocket::Open(path);
  REQUIRE(admin.ok());
  std::vector<std::string> handled;
  const std::string cut = std::string(1005, ' ') + "release-slot 1234567890\n";
  CHECK(Ask(**admin, path, cut, &handled) == "error request line too long, max 1024 bytes");
  {
    const std::string given = handled.empty() ? "" : handled[0];
    INFO("the handler was given " << given.size() << " bytes, ending '"
                                  << given.substr(given.size() > 30 ? given.size() - 30 : 0)
                                  << "'");
    CHECK(handled.empty());
  }
  // Longer still, and with no newline at all: the same.
  handled.clear();
  CHECK(Ask(**admin, path, std::string(5000, 'x'), &handled) ==
        "error request line too long, max 1024 bytes");
  CHECK(handled.empty());
  // 1024 bytes with the newline is the longest line taken.
  handled.clear();
  const std::string longest = std::string(1024 - 15, ' ') + "release-slot 7\n";
  REQUIRE(longest.size() == 1024);
  CHECK(Ask(**admin, path, longest, &handled) == "ok " + longest.substr(0, 1023));
  CHECK(handled.size() == 1);
}

// A request whose stream ended before its newline (a tool that wrote it in pieces and was cut
// off, a peer reset) was carried out as it was: "release-slot 12" of a "release-slot 1234"
// fenced slot 12's holder, and one cut before its "lockd EPOCH START_NS" lost the check that it
// reaches the lockd it is meant for (found by review, 2026-12-06). Only a line with its newline
// is a request.
TEST_CASE("admin socket: a request cut off before its newline is refused, not carried out") {
  TempDir dir;
  const std::string path = dir.str() + "/lockd.sock";
  auto admin = AdminSocket::Open(path);
  REQUIRE(admin.ok());
  std::vector<std::string> handled;
  const std::string reply = Ask(**admin, path, "release-slot 12", &handled, /*then_shut=*/true);
  CHECK(reply == "error request has no newline (cut off?); nothing done");
  {
    INFO("the handler was given: " << (handled.empty() ? "nothing" : handled[0]));
    CHECK(handled.empty());
  }
  // With its newline it is a request, the stream ended or not.
  handled.clear();
  CHECK(Ask(**admin, path, "release-slot 12\n", &handled, /*then_shut=*/true) ==
        "ok release-slot 12");
  CHECK(handled.size() == 1);
}

// Found by review (2026-12-06): with its 16 connections taken (anyone who may open the socket can
// hold them, each for up to 2 s), lockd accepted the next and closed it without a word, so
// lockctl printed an empty line (or died of SIGPIPE writing its request). It now says why.
TEST_CASE("admin socket: a connection over the limit is told lockd is busy, not dropped silently") {
  TempDir dir;
  const std::string path = dir.str() + "/lockd.sock";
  auto admin = AdminSocket::Open(path);
  REQUIRE(admin.ok());
  std::vector<int> held;
  for (size_t i = 0; i < AdminSocket::kMaxConns; ++i) {
    const int fd = ConnectTo(path);
    REQUIRE(fd >= 0);
    held.push_back(fd);
    const auto now = std::chrono::steady_clock::now();
    pollfd p{admin->get()->listen_fd(now), POLLIN, 0};
    REQUIRE(poll(&p, 1, 1000) == 1);
    admin->get()->OnAcceptable(now);
  }
  std::vector<std::string> handled;
  const std::string reply = Ask(**admin, path, "release-slot 1\n", &handled);
  INFO("the 17th connection's reply: '" << reply << "'");
  CHECK(reply.rfind("error busy", 0) == 0);
  CHECK(handled.empty());
  for (const int fd : held) close(fd);
  // Once they are gone, requests are served again.
  handled.clear();
  std::string again;
  for (int i = 0; i < 3 && again.empty(); ++i)
    again = Ask(**admin, path, "release-slot 2\n", &handled);
  CHECK(again == "ok release-slot 2");
}
