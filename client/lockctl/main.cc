// lockctl: the rdmalock admin and scripting CLI. This file parses the command line (args.h) and
// calls the command (commands.h; one file each, cmd_*.cc).
//
// Exit codes (also in docs and --help):
//   0        success (for `acquire`: the command's own status, 128+N if killed by signal N)
//   64       usage error
//   69       cannot reach or handshake with lockd
//   70       internal error
//   74       standard output could not be written (a full disk, a closed pipe)
//   75       `acquire`: the lock was not granted within --timeout
//   76       `acquire`: the lock was lost while the command ran (the command was terminated)
//   127/126  `acquire`: the command was not found / was found but could not be run
//   1        `release --force`: lockd refused (no such session, no recorded holder)
#include <dirent.h>
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <vector>

#include "client/lockctl/args.h"
#include "client/lockctl/commands.h"
#include "common/auth/auth.h"

namespace lockctl {
namespace {

int Run(Args& a) {
  // With --cluster, the lock a command is about picks the shard.
  if (a.command == Command::kAcquire) a.common.route_name = a.acq_name;
  if (a.command == Command::kInspect && a.inspect_slot < 0) a.common.route_name = a.inspect_name;
  // release --force goes to this node's admin socket, so it names its shard with --shard (a
  // name is not routed: the lockd it reached would not be the one it releases on).
  // top's labels name locks too: a name on another shard would label this shard's slot of that
  // number, another lock.
  if (a.command == Command::kAcquire && !a.acq_name.empty()) a.common.check_names = {a.acq_name};
  if (a.command == Command::kRelease && !a.rel_name.empty()) a.common.check_names = {a.rel_name};
  if (a.command == Command::kTop) {
    for (const auto& n : a.top_names) {
      if (!n.empty()) a.common.check_names.push_back(n);
    }
  }
  const Common& c = a.common;
  switch (a.command) {
    case Command::kStatus:
      return CmdStatus(c);
    case Command::kClients:
      return CmdClients(c);
    case Command::kInspect:
      return CmdInspect(c, a.inspect_name, a.inspect_slot);
    case Command::kTop:
      return CmdTop(c, a.top_interval, a.top_rows, a.top_iterations, a.top_names);
    case Command::kRelease:
      return CmdRelease(c, a.rel_force, a.rel_name, a.rel_slot, a.rel_session, a.rel_socket);
    case Command::kAcquire:
      return CmdAcquire(c, a.acq_name, a.acq_shared, a.acq_timeout, a.acq_grace, a.acq_cmd);
    case Command::kKeygen:
      std::cout << rdmalock::auth::NewKeyHex() << "\n";
      return 0;
    case Command::kCluster:
      return CmdCluster(c, a.cluster_init, a.cluster_replace);
    case Command::kBench:
      return CmdBench(c, a.bench);
  }
  return kExitUsage;
}

}  // namespace
}  // namespace lockctl

namespace {

// The descriptors from 3 up this process has now, ascending (none if /proc cannot say).
std::vector<int> OpenDescriptors() {
  std::vector<int> fds;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return fds;
  const int own = dirfd(d);
  while (const dirent* e = readdir(d)) {
    int fd = -1;
    const char* end = e->d_name + std::strlen(e->d_name);
    if (auto [p, ec] = std::from_chars(e->d_name, end, fd);
        ec == std::errc() && p == end && fd >= 3 && fd != own) {
      fds.push_back(fd);
    }
  }
  closedir(d);
  std::sort(fds.begin(), fds.end());
  return fds;
}

// lockctl's exit status `rc` once what it wrote to standard output is out: a key, a status or
// JSON that could not be written (a full disk, a closed pipe with SIGPIPE ignored) is an error,
// exit 74, not a success with a truncated or empty file behind it (`lockctl keygen > key.new &&
// mv key.new key` put an empty key in place; found by review, 2026-12-07). A failure that rc
// already reports keeps its code.
int OutputWritten(int rc) {
  // A write that failed earlier (std::endl flushes) left its reason in errno, if nothing came
  // after it; only a reason a write gives is taken from there.
  int err = errno;
  errno = 0;
  std::cout.flush();  // through stdio (std::cout is synced with it): errno says why it failed
  if (errno != 0) err = errno;
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (!flushed && errno != 0) err = errno;
  if (flushed && std::ferror(stdout) == 0 && !std::cout.bad()) return rc;
  const bool write_error =
      err == ENOSPC || err == EPIPE || err == EIO || err == EDQUOT || err == EFBIG;
  std::cerr << "lockctl: writing standard output: "
            << (write_error ? std::strerror(err) : "write error") << "\n";
  return rc == 0 ? lockctl::kExitIo : rc;
}

}  // namespace

int main(int argc, char** argv) {
  // Standard input, output and error are open, on /dev/null if lockctl was started without them
  // (a daemon's child, `>&-`): else its RDMA descriptors would take their numbers, and the
  // command of `lockctl acquire` (which keeps 0, 1 and 2) would write to the RDMA device and keep
  // lockctl's connections alive after lockctl died (found by review, 2026-12-06).
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF && open("/dev/null", O_RDWR) != fd) {
      return lockctl::kExitInternal;
    }
  }
  // No exception leaves main: what the libraries lockctl uses may throw (an allocation, a JSON
  // value) is an internal error with a message, not an abort.
  try {
    // Before lockctl opens anything from 3 up: what its caller gave it, for acquire's command.
    std::vector<int> inherited = OpenDescriptors();
    lockctl::Args a;
    if (const int rc = lockctl::ParseArgs(argc, argv, &a); rc >= 0) return OutputWritten(rc);
    a.common.inherited_fds = std::move(inherited);
    return OutputWritten(lockctl::Run(a));
  } catch (const std::exception& e) {
    std::cerr << "lockctl: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "lockctl: internal error\n";
  }
  return lockctl::kExitInternal;
}
