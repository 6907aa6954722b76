#include "server/admin.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/rdma/verbs.h"

namespace rdmalock::lockd {

std::optional<AdminRequest> ParseAdminCommand(const std::string& line, std::string* error) {
  std::istringstream in(line);
  std::string cmd, arg, kw, epoch, start, extra;
  in >> cmd >> arg >> kw >> epoch >> start >> extra;
  const auto number = [](const std::string& t, uint64_t* v) {
    if (t.empty() || t.size() > 20 || t.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    const auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), *v);
    return ec == std::errc() && p == t.data() + t.size();
  };
  AdminRequest r;
  bool ok = (cmd == "release-slot" || cmd == "release-session") && number(arg, &r.number) &&
            arg.size() <= 19 && extra.empty();
  if (ok && !kw.empty()) {  // ... lockd EPOCH START_NS
    AdminRequest::Identity id;
    ok = kw == "lockd" && number(epoch, &id.epoch) && number(start, &id.start_time_unix_ns);
    r.meant_for = id;
  }
  if (!ok) {
    *error = "error bad request '" + line.substr(0, 80) +
             "' (expected: release-slot SLOT | release-session ID, either followed by "
             "[lockd EPOCH START_NS])";
    return std::nullopt;
  }
  r.kind = cmd == "release-slot" ? AdminRequest::Kind::kReleaseSlot
                                 : AdminRequest::Kind::kReleaseSession;
  r.arg = arg;
  return r;
}

namespace {

// What is at an admin socket's path before lockd binds it.
enum class PathState { kFree, kStale, kServed };

// Tells a stale socket (an earlier lockd that did not remove it: connect is refused) from one
// something serves (connect succeeds, or its backlog is full). Anything that is not a socket is
// an error: lockd does not delete a file it did not make.
Result<PathState> ProbePath(const std::string& path, const sockaddr_un& addr) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return PathState::kFree;
    return rdma::ErrnoStatus(ErrorCode::kIo, "admin socket " + path, errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return Error(ErrorCode::kConfig, "admin socket " + path +
                                         " exists and is not a socket; lockd will not remove it "
                                         "(set admin_socket to another path, or remove it)");
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "socket(AF_UNIX)", errno);
  // Non-blocking: a listener whose backlog is full answers EAGAIN at once instead of making us
  // wait; it is served all the same.
  const int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  close(fd);
  if (rc == 0 || err == EAGAIN || err == EINPROGRESS) return PathState::kServed;
  if (err == ECONNREFUSED) return PathState::kStale;
  if (err == ENOENT) return PathState::kFree;  // removed since the lstat
  return rdma::ErrnoStatus(ErrorCode::kIo, "admin socket " + path + ": cannot tell if it is in use",
                           err);
}

}  // namespace

Result<std::unique_ptr<AdminSocket>> AdminSocket::Open(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return Error(ErrorCode::kConfig, "admin_socket path is too long: " + path);
  }
  std::error_code ec;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  // Only a stale socket of an earlier run is replaced. One that answers is another lockd's (the
  // default path is one per host: two lockds on a node must each set their own) or some other
  // process's: taking it would send `lockctl release --force` to the wrong lock table.
  RDMALOCK_ASSIGN_OR_RETURN(const PathState state, ProbePath(path, addr));
  if (state == PathState::kServed) {
    return Error(ErrorCode::kConfig,
                 "admin socket " + path +
                     " is in use: another lockd (or another process) is serving it; give each "
                     "lockd on this host its own admin_socket");
  }
  if (state == PathState::kStale) unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "socket(AF_UNIX)", errno);
  struct stat st {};
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      lstat(path.c_str(), &st) != 0 || chmod(path.c_str(), 0660) != 0 || listen(fd, 16) != 0) {
    const int err = errno;
    close(fd);
    // EADDRINUSE: something took the path between the check and the bind.
    return rdma::ErrnoStatus(ErrorCode::kIo, "admin socket " + path, err);
  }
  spdlog::info("admin socket: {}", path);
  return std::unique_ptr<AdminSocket>(new AdminSocket(fd, path, st.st_dev, st.st_ino));
}

AdminSocket::~AdminSocket() {
  for (auto& c : conns_) close(c.fd);
  // Only the socket this process bound is removed: the path may since name another's (it was
  // removed and taken again), and deleting that would make its lockd unreachable. Checked while
  // fd_ is open, so that our inode cannot have been reused for the other one.
  struct stat st {};
  if (lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev_ &&
      st.st_ino == ino_) {
    unlink(path_.c_str());
  }
  close(fd_);
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
    // Told, not dropped silently (lockctl printed an empty line): one non-blocking send of a
    // line that fits any socket buffer, whatever the peer does with it.
    static_assert(kMaxConns == 16, "the line below says 16");
    static constexpr char kBusy[] =
        "error busy: lockd's admin socket serves 16 connections at once; try again\n";
    (void)!send(fd, kBusy, sizeof(kBusy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
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
    done = true;  // EOF or an error: answered below (an error if the line has no newline)
    break;
  }
  if (!done) return true;
  const size_t nl = c.line.find('\n');
  std::string reply;
  if (c.line.size() >= kMaxLine && (nl == std::string::npos || nl >= kMaxLine)) {
    // The line (with its newline) does not fit kMaxLine: refused whole. Cut to its first bytes it
    // was another request: 1005 spaces and "release-slot 1234567890" fenced slot 123456. The
    // rest of it is not read: the connection is closed below, as after every reply.
    reply = "error request line too long, max " + std::to_string(kMaxLine) + " bytes\n";
  } else if (nl == std::string::npos) {
    // The stream ended (or failed) before the newline: what came may be a request cut short,
    // "release-slot 12" of "release-slot 1234", or one without its "lockd EPOCH START_NS".
    reply = "error request has no newline (cut off?); nothing done\n";
  } else {
    c.line.resize(nl);
    const std::string asker =
        "uid " + std::to_string(c.cred.uid) + " pid " + std::to_string(c.cred.pid);
    reply = handler(c.line, asker) + "\n";
  }
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
