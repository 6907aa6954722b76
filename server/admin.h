// lockd's admin socket (a Unix stream socket lockctl talks to): one request line per connection,
// one reply line. ParseAdminCommand is the pure half (unit-tested, tests/unit/admin_test.cc);
// AdminSocket does the I/O and hands each complete line to a handler; carrying a request out
// (fencing sessions) is the server's.
//
// Threading: AdminSocket is owned by lockd's event loop and used only from it (no mutex). It
// never blocks the loop (issue 16, finding 4: a peer that trickled its line could hold it for up
// to 1024 s before): each connection is non-blocking, read as bytes arrive, answered with a
// non-blocking send (MSG_NOSIGNAL: a peer that has gone cannot raise SIGPIPE), and dropped after
// kTimeout. At most kMaxConns are open at once.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmalock/status.h"

namespace rdmalock::lockd {

// One admin request: "release-slot SLOT" or "release-session ID", either optionally followed by
// "lockd EPOCH START_NS".
struct AdminRequest {
  enum class Kind { kReleaseSlot, kReleaseSession };
  Kind kind = Kind::kReleaseSlot;
  uint64_t number = 0;  // the slot or the session id
  std::string arg;      // the number as sent (for replies and logs)
  // "... lockd EPOCH START_NS": the lockd the request is meant for, which lockctl reached over
  // RDMA and read the info page of (the one whose lock count mapped a lock name to SLOT, or the
  // one --server, --port or --shard named); any other lockd refuses the request.
  struct Identity {
    uint64_t epoch = 0;
    uint64_t start_time_unix_ns = 0;
  };
  std::optional<Identity> meant_for;
};

// Parses one request line (without its newline). On a malformed line returns nullopt and sets
// *error to the reply, which starts with "error ".
std::optional<AdminRequest> ParseAdminCommand(const std::string& line, std::string* error);

class AdminSocket {
 public:
  using Clock = std::chrono::steady_clock;
  // Answers one request line; `asker` names the peer ("uid U pid P"). The reply starts with
  // "ok " or "error ".
  using Handler = std::function<std::string(const std::string& line, const std::string& asker)>;

  static constexpr size_t kMaxConns = 16;
  static constexpr auto kTimeout = std::chrono::seconds(2);
  // After a failed accept (no descriptors left), the socket is not polled for this long.
  static constexpr std::chrono::milliseconds kPauseOnError{100};
  static constexpr size_t kMaxLine = 1024;

  // Binds and listens on `path` (mode 0660, its directory created). A stale socket (connect
  // refused) is replaced; a socket something answers on, or anything else at the path, is an
  // error naming it, and left alone.
  static Result<std::unique_ptr<AdminSocket>> Open(const std::string& path);
  // Closes every connection and the socket, and removes the path if it is still the socket this
  // one bound (the same device and inode).
  ~AdminSocket();
  AdminSocket(const AdminSocket&) = delete;
  AdminSocket& operator=(const AdminSocket&) = delete;

  // The listening socket to poll, or -1 while paused after a failed accept.
  int listen_fd(Clock::time_point now) const { return now < paused_until_ ? -1 : fd_; }
  // Appends one pollfd per open connection, in order.
  void AddConnFds(std::vector<pollfd>* fds) const;
  // After poll: `fds` are the entries AddConnFds appended. Reads the ready connections; answers
  // (with `handler`) and closes those whose line is complete.
  void OnConnsReady(const pollfd* fds, size_t n, const Handler& handler);
  // The listening socket is readable: accepts a connection.
  void OnAcceptable(Clock::time_point now);
  // Drops connections past their deadline.
  void Expire(Clock::time_point now);

 private:
  struct Conn {
    int fd = -1;
    std::string line;
    Clock::time_point deadline;
    ucred cred{};
  };
  AdminSocket(int fd, std::string path, dev_t dev, ino_t ino)
      : fd_(fd), path_(std::move(path)), dev_(dev), ino_(ino) {}
  // Reads what `c` has sent; once its line is complete (or it closed), answers and closes it. A
  // line that does not fit kMaxLine, newline included, or a stream that ends before the newline,
  // is answered with an error and not handed to the handler. Returns false when the connection
  // is gone.
  bool OnReadable(Conn& c, const Handler& handler);

  const int fd_;
  const std::string path_;
  const dev_t dev_;  // the socket file bound at path_, to tell it from a later one there
  const ino_t ino_;
  std::vector<Conn> conns_;
  Clock::time_point paused_until_{}, error_logged_{};
};

}  // namespace rdmalock::lockd
