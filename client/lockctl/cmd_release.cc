// lockctl release --force: one request to lockd's admin socket (it fences the holder's session).
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "client/lockctl/commands.h"
#include "client/lockctl/json.h"

namespace lockctl {

// Sends one request line to lockd's admin socket and prints the reply.
int CmdRelease(const Common& c, bool force, const std::string& name, int64_t slot, int64_t session,
               const std::string& socket_path) {
  const int given = (name.empty() ? 0 : 1) + (slot >= 0 ? 1 : 0) + (session >= 0 ? 1 : 0);
  if (!force || given != 1) {
    std::cerr << "lockctl release: give --force and exactly one of NAME, --slot N or --session "
                 "ID (it fences the holder's whole session)\n";
    return kExitUsage;
  }
  std::string request = session >= 0 ? "release-session " + std::to_string(session)
                                     : "release-slot " + std::to_string(slot);
  // A lock name is mapped to its slot by the lock count of the lockd lockctl reaches over RDMA;
  // a slot or session is meant for the lockd --server, --port or the map's --shard names, when
  // one is named. Either way the request names that lockd (its epoch and start time, from its
  // info page), and a lockd behind --admin-socket that is another one (another shard on this
  // host, say) refuses it, instead of fencing whoever holds that slot number or session id in its
  // own table. Without a lockd named, --slot and --session are for --admin-socket's own lockd.
  const bool named =
      !c.server.empty() || c.port_given || !c.cluster_file.empty() || !c.etcd.empty();
  if (!name.empty() || named) {
    int code = 0;
    auto client = ConnectOrDie(c, &code);
    if (!client) return code;
    auto info = client->Info();
    if (!info.ok()) {
      std::cerr << "lockctl: lockd's info page: " << info.status().ToString() << "\n";
      return kExitUnavailable;
    }
    if (!name.empty()) request = "release-slot " + std::to_string(client->SlotOf(name));
    request +=
        " lockd " + std::to_string(info->epoch) + " " + std::to_string(info->start_time_unix_ns);
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || socket_path.size() >= sizeof(addr.sun_path)) {
    std::cerr << "lockctl: bad admin socket path " << socket_path << "\n";
    if (fd >= 0) close(fd);
    return kExitUsage;
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  // The whole exchange within --connect-timeout-ms: a lockd that is stopped, or whose event loop
  // is stuck, still has its connection taken by the kernel's backlog, and never answers.
  const int limit_ms = std::max(c.connect_timeout_ms, 1);
  const timeval tv{limit_ms / 1000, (limit_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const auto silent = [&] {
    std::cerr << "lockctl: lockd's admin socket " << socket_path << " did not answer within "
              << limit_ms << " ms (--connect-timeout-ms): is lockd stopped or stuck?\n";
    close(fd);
    return kExitUnavailable;
  };
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EAGAIN || errno == EINPROGRESS) return silent();
    std::cerr << "lockctl: cannot reach lockd's admin socket " << socket_path << ": "
              << std::strerror(errno) << " (run this on the lock node, as a user who may "
              << "open it; see admin_socket in lockd.yaml)\n";
    close(fd);
    return kExitUnavailable;
  }
  request += "\n";
  // send(MSG_NOSIGNAL), not write: a lockd that closed the connection first (busy) would end
  // lockctl with SIGPIPE.
  const auto closed = [&] {
    std::cerr << "lockctl: lockd's admin socket " << socket_path
              << " closed the connection without answering (busy, or lockd stopping): try "
                 "again\n";
    close(fd);
    return kExitUnavailable;
  };
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return silent();
    if (errno != EPIPE && errno != ECONNRESET) {
      std::cerr << "lockctl: write to the admin socket failed: " << std::strerror(errno) << "\n";
      close(fd);
      return kExitUnavailable;
    }
    // Closed before the request went out: lockd may have said why first (busy); read it.
  }
  std::string reply;
  char buf[512];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      reply.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // Each read waits up to the limit: a lockd that sends part of a line and stops is silent too.
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return silent();
    break;
  }
  if (reply.empty()) return closed();
  close(fd);
  while (!reply.empty() && reply.back() == '\n') reply.pop_back();
  const bool ok = reply.rfind("ok ", 0) == 0;
  if (c.json) {
    const Json out = {
        {"ok", ok},
        {"reply", reply.substr(reply.find(' ') == std::string::npos ? 0 : reply.find(' ') + 1)}};
    std::fputs(JsonLine(out).c_str(), stdout);
  } else if (ok) {
    std::printf("%s\n", reply.c_str());
  } else {
    // A refusal (or lockd's "busy") is an error: on stderr, not in the output a script
    // captures. lockd's line starts with "error "; the reason follows it.
    const std::string why = reply.rfind("error ", 0) == 0 ? reply.substr(6) : reply;
    std::cerr << "lockctl: lockd did not carry out the forced release: " << why << "\n";
  }
  return ok ? 0 : 1;
}

}  // namespace lockctl
