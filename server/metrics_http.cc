// MetricsServer: lockd's HTTP endpoint for Prometheus, a small server of its own.
//
// It was cpp-httplib's (0.11, Debian 12's), which a peer could use against lockd (found by
// review, 2026-12-06): it read a request's whole first line and each header line into memory
// before it checked their length (a stream with no newline grew lockd until the OOM killer ended
// it), and it bounded each read but not a request (two peers sending a byte every few seconds
// held both its workers for as long as they liked: every scrape waited, and lockd's stop waited
// in the workers' join past systemd's stop timeout). The endpoint serves two pages to GET and
// HEAD, so this server does only that, with every resource bounded:
// - one thread, one poll loop; at most kMaxConnections open (further peers wait in the listen
//   backlog and hold no descriptor of lockd's);
// - a request is read into at most kMaxRequestBytes; its header must end there (431 if not);
// - a connection lives at most kConnectionDeadline from its accept, whatever the peer sends;
// - each reply is followed by the connection's close (Connection: close; Prometheus opens one per
//   scrape anyway), after the peer has read it: the write side is shut, and what the peer still
//   sends is read and dropped until it closes too or the deadline, so an unread request body
//   cannot turn the close into a reset that destroys the reply in flight (up to kMaxDrainBytes:
//   a peer streaming at the server is cut off);
// - the stop wakes the loop through an eventfd and closes every connection at once.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/rdma/verbs.h"
#include "server/metrics.h"

namespace rdmalock::lockd {

namespace {

using Clock = std::chrono::steady_clock;
using rdma::Fd;

constexpr size_t kMaxConnections = 8;
constexpr size_t kMaxRequestBytes = 8192;
constexpr auto kConnectionDeadline = std::chrono::seconds(5);
// What is read and dropped after a reply before the connection is closed regardless: enough for
// any request a scraper sends, and a peer streaming bytes at the server gets no more.
constexpr size_t kMaxDrainBytes = 64 * 1024;
// After a failed accept (no descriptors left), the listening socket is not polled for this long:
// it stays readable, and polling it again at once would spin.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

struct Conn {
  enum class Phase { kReading, kWriting, kDraining };
  Fd fd;
  Phase phase = Phase::kReading;
  std::string in;      // the request so far, at most kMaxRequestBytes
  std::string out;     // the reply
  size_t sent = 0;     // bytes of `out` sent
  size_t drained = 0;  // bytes read and dropped after the reply
  Clock::time_point deadline;
};

std::string Reply(std::string_view status, std::string_view type, const std::string& body,
                  bool with_body, std::string_view extra_headers = {}) {
  std::string r = "HTTP/1.1 ";
  r += status;
  r += "\r\nContent-Type: ";
  r += type;
  r += "\r\nContent-Length: " + std::to_string(body.size());
  r += "\r\nConnection: close\r\n";
  r += extra_headers;
  r += "\r\n";
  if (with_body) r += body;
  return r;
}

std::string ErrorReply(std::string_view status, std::string_view extra_headers = {}) {
  return Reply(status, "text/plain", std::string(status) + "\n", true, extra_headers);
}

// Where a request's header ends (just past its blank line), or npos if it has not yet.
size_t HeaderEnd(const std::string& in) {
  const size_t crlf = in.find("\r\n\r\n");
  const size_t lf = in.find("\n\n");
  if (crlf == std::string::npos && lf == std::string::npos) return std::string::npos;
  return crlf < lf ? crlf + 4 : lf + 2;
}

// A complete request's header in; the whole reply out.
std::string AnswerMetricsRequest(std::string_view request, const MetricsServer::Render& render) {
  const size_t eol = request.find('\n');
  std::string_view line = request.substr(0, eol);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  // METHOD SP TARGET SP HTTP/1.x
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos ||
      line.substr(sp2 + 1).substr(0, 7) != "HTTP/1." || sp2 == sp1 + 1) {
    return ErrorReply("400 Bad Request");
  }
  const std::string_view method = line.substr(0, sp1);
  std::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET" && method != "HEAD") {
    return ErrorReply("405 Method Not Allowed", "Allow: GET, HEAD\r\n");
  }
  const bool body = method == "GET";
  if (path == "/metrics") {
    return Reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", render(), body);
  }
  if (path == "/") return Reply("200 OK", "text/plain", "lockd: metrics are at /metrics\n", body);
  return ErrorReply("404 Not Found");
}

}  // namespace

// Threading: the server's one thread owns everything here but `wake`, which the destructor
// writes; no mutex.
struct MetricsServer::Impl {
  Render render;
  Fd listener;
  Fd wake;  // an eventfd: readable once the server is to stop
  std::vector<Conn> conns;
  Clock::time_point accept_paused_until{};
  Clock::time_point accept_error_logged{};
  std::thread thread;

  void Run();
  void Accept(Clock::time_point now);
  // Moves the connection on with what poll said of it; false once it is to be closed.
  bool Serve(Conn& c, short revents);
};

void MetricsServer::Impl::Run() {
  std::vector<pollfd> fds;
  for (;;) {
    const Clock::time_point now = Clock::now();
    std::erase_if(conns, [now](const Conn& c) { return now >= c.deadline; });
    fds.clear();
    fds.push_back({wake.get(), POLLIN, 0});
    const bool paused = now < accept_paused_until;
    const bool accepting = conns.size() < kMaxConnections && !paused;
    fds.push_back({accepting ? listener.get() : -1, POLLIN, 0});
    // Woken by a deadline, or by the end of an accept pause. Not by a pause long over: with every
    // connection taken, that timeout of 0 spun the thread (found by the diff review, 2026-12-06).
    Clock::time_point next = paused ? accept_paused_until : Clock::time_point::max();
    for (const Conn& c : conns) {
      fds.push_back(
          {c.fd.get(), static_cast<short>(c.phase == Conn::Phase::kWriting ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    int timeout_ms = -1;
    if (next != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("metrics: poll failed ({}); no more metrics are served", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;  // stopping: the connections close with this object
    std::vector<Conn> keep;
    keep.reserve(conns.size());
    for (size_t i = 0; i < conns.size(); ++i) {
      const short revents = fds[i + 2].revents;
      if (revents == 0 || Serve(conns[i], revents)) keep.push_back(std::move(conns[i]));
    }
    conns.swap(keep);
    if (fds[1].revents != 0) Accept(Clock::now());
  }
}

void MetricsServer::Impl::Accept(Clock::time_point now) {
  while (conns.size() < kMaxConnections) {
    const int fd = accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED) continue;
      accept_paused_until = now + kAcceptPause;  // no descriptors or memory: the peer waits
      if (now >= accept_error_logged + std::chrono::seconds(10)) {
        accept_error_logged = now;
        spdlog::error("metrics: accept failed ({}); not accepting for {} ms", std::strerror(err),
                      kAcceptPause.count());
      }
      return;
    }
    Conn c;
    c.fd = Fd(fd);
    c.deadline = now + kConnectionDeadline;
    conns.push_back(std::move(c));
  }
}

bool MetricsServer::Impl::Serve(Conn& c, short revents) {
  char buf[4096];
  if (c.phase == Conn::Phase::kReading) {
    for (;;) {
      const size_t room = kMaxRequestBytes - c.in.size();
      const ssize_t n = recv(c.fd.get(), buf, std::min(room, sizeof(buf)), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n <= 0) return false;  // gone before its request was whole: nothing to answer
      c.in.append(buf, static_cast<size_t>(n));
      const size_t end = HeaderEnd(c.in);
      if (end != std::string::npos) {
        c.out = AnswerMetricsRequest(std::string_view(c.in).substr(0, end), render);
        break;
      }
      if (c.in.size() >= kMaxRequestBytes) {
        c.out = ErrorReply("431 Request Header Fields Too Large");
        break;
      }
    }
    c.in.clear();
    c.in.shrink_to_fit();
    c.phase = Conn::Phase::kWriting;
    revents = POLLOUT;  // try the send at once: a reply this small usually fits
  }
  if (c.phase == Conn::Phase::kWriting) {
    if ((revents & (POLLOUT | POLLERR | POLLHUP)) == 0) return true;
    while (c.sent < c.out.size()) {
      const ssize_t n = send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n <= 0) return false;
      c.sent += static_cast<size_t>(n);
    }
    c.out.clear();
    c.out.shrink_to_fit();
    shutdown(c.fd.get(), SHUT_WR);
    c.phase = Conn::Phase::kDraining;
    return true;
  }
  // Draining: what the peer still sends is dropped until it closes (or the deadline, or
  // kMaxDrainBytes).
  for (;;) {
    const ssize_t n = recv(c.fd.get(), buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) return false;
    c.drained += static_cast<size_t>(n);
    if (c.drained > kMaxDrainBytes) return false;
  }
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() {
  const uint64_t one = 1;
  (void)!write(impl_->wake.get(), &one, sizeof(one));
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                            Render render) {
  std::string host;
  uint16_t port = 0;
  RDMALOCK_RETURN_IF_ERROR(ParseHostPort(address, &host, &port).WithContext("metrics_address"));
  const auto cannot = [&](const std::string& why) {
    return Error(ErrorCode::kConfig, "metrics_address " + address + ": cannot listen (" + why +
                                         "); set metrics_address to a free HOST:PORT, or \"\" "
                                         "to serve no metrics");
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return cannot(gai_strerror(rc));
  }
  auto impl = std::make_unique<Impl>();
  impl->render = std::move(render);
  int err = 0;
  for (addrinfo* ai = found; ai != nullptr && !impl->listener; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    const int on = 1;
    if (!fd || setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
        bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        listen(fd.get(), static_cast<int>(kMaxConnections) * 2) != 0) {
      err = errno;
      continue;
    }
    impl->listener = std::move(fd);
  }
  freeaddrinfo(found);
  if (!impl->listener) return cannot(err != 0 ? std::strerror(err) : "no address");
  impl->wake = Fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake) return cannot(std::string("eventfd: ") + std::strerror(errno));
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  spdlog::info("metrics: serving Prometheus text at http://{}/metrics", address);
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

}  // namespace rdmalock::lockd
