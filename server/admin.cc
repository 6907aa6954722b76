#include "server/admin.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/rdma/verbs.h"

namespace rdmalock::lockd {

std::optional<AdminRequest> ParseAdminCommand(const std::string& line, std::string* error) {
  std::istringstream in(line);
  std::string cmd, arg, extra;
  in >> cmd >> arg >> extra;
  const bool numeric =
      !arg.empty() && arg.size() <= 19 && arg.find_first_not_of("0123456789") == std::string::npos;
  if (!extra.empty() || !numeric || (cmd != "release-slot" && cmd != "release-session")) {
    *error = "error bad request '" + line.substr(0, 80) +
             "' (expected: release-slot SLOT | release-session ID)";
    return std::nullopt;
  }
  AdminRequest r;
  r.kind = cmd == "release-slot" ? AdminRequest::Kind::kReleaseSlot
                                 : AdminRequest::Kind::kReleaseSession;
  r.number = std::stoull(arg);  // at most 19 digits: fits
  r.arg = arg;
  return r;
}

Result<std::unique_ptr<AdminSocket>> AdminSocket::Open(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return Error(ErrorCode::kConfig, "admin_socket path is too long: " + path);
  }
  std::error_code ec;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "socket(AF_UNIX)", errno);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  unlink(path.c_str());  // a stale socket of an earlier run
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      chmod(path.c_str(), 0660) != 0 || listen(fd, 16) != 0) {
    const int err = errno;
    close(fd);
    return rdma::ErrnoStatus(ErrorCode::kIo, "admin socket " + path, err);
  }
  spdlog::info("admin socket: {}", path);
  return std::unique_ptr<AdminSocket>(new AdminSocket(fd, path));
}

AdminSocket::~AdminSocket() {
  for (auto& c : conns_) close(c.fd);
  close(fd_);
  unlink(path_.c_str());
}

void AdminSocket::AddConnFds(std::vector<pollfd>* fds) const {
  for (const auto& c : conns_) fds->push_back({c.fd, POLLIN, 0});
}

void AdminSocket::OnConnsReady(const pollfd* fds, size_t n, const Handler& handler) {
  std::vector<Conn> keep;
  for (size_t i = 0; i < conns_.size(); ++i) {
    const bool ready = i < n && fds[i].revents != 0;
    if (!ready || OnReadable(conns_[i], handler)) keep.push_back(std::move(conns_[i]));
  }
  conns_.swap(keep);
}

void AdminSocket::OnAcceptable(Clock::time_point now) {
  const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) return;
    // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays queued and
    // the socket stays readable, so polling it again at once would spin the event loop. Stop
    // polling it for a while instead; the request waits in the listen backlog.
    paused_until_ = now + kPauseOnError;
    if (now >= error_logged_ + std::chrono::seconds(10)) {
      error_logged_ = now;
      spdlog::error("admin socket: accept failed ({}); not accepting for {} ms", std::strerror(err),
                    kPauseOnError.count());
    }
    return;
  }
  if (conns_.size() >= kMaxConns) {
    close(fd);
    return;
  }
  Conn c;
  c.fd = fd;
  c.deadline = now + kTimeout;
  socklen_t len = sizeof(c.cred);
  (void)getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len);
  conns_.push_back(std::move(c));
}

bool AdminSocket::OnReadable(Conn& c, const Handler& handler) {
  char buf[256];
  bool done = false;
  for (;;) {
    const ssize_t n = read(c.fd, buf, sizeof(buf));
    if (n > 0) {
      c.line.append(buf, static_cast<size_t>(n));
      if (c.line.find('\n') != std::string::npos || c.line.size() >= kMaxLine) {
        done = true;
        break;
      }
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    done = true;  // EOF or an error: answer what came
    break;
  }
  if (!done) return true;
  if (auto nl = c.line.find('\n'); nl != std::string::npos) c.line.resize(nl);
  const std::string asker =
      "uid " + std::to_string(c.cred.uid) + " pid " + std::to_string(c.cred.pid);
  const std::string reply = handler(c.line, asker) + "\n";
  (void)!send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(c.fd);
  return false;
}

void AdminSocket::Expire(Clock::time_point now) {
  std::erase_if(conns_, [now](const Conn& c) {
    if (now < c.deadline) return false;
    close(c.fd);
    return true;
  });
}

}  // namespace rdmalock::lockd
