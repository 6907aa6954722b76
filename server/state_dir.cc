#include "server/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "common/rdma/verbs.h"

namespace rdmalock::lockd {

Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           const std::string& text) {
  const std::string path = dir + "/" + name;
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "open " + tmp, errno);
  const bool ok =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return rdma::ErrnoStatus(ErrorCode::kIo, "write " + tmp, err);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return rdma::ErrnoStatus(ErrorCode::kIo, "rename " + tmp, errno);
  }
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "open " + dir, errno);
  const bool synced = fsync(dfd) == 0;
  const int derr = errno;
  close(dfd);
  if (!synced) return rdma::ErrnoStatus(ErrorCode::kIo, "fsync " + dir, derr);
  return Status::Ok();
}

Result<std::optional<std::string>> ReadSmallFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return rdma::ErrnoStatus(ErrorCode::kIo, "open " + path, errno);
  }
  std::string text;
  char buf[256];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      const int err = errno;
      close(fd);
      return rdma::ErrnoStatus(ErrorCode::kIo, "read " + path, err);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > 4096) {
      close(fd);
      return Error(ErrorCode::kIo, path + " is larger than an epoch file can be");
    }
  }
  close(fd);
  return std::optional<std::string>(std::move(text));
}

Result<StateDirLock> StateDirLock::Acquire(const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    return Error(ErrorCode::kIo, "cannot create state_dir " + state_dir + ": " + ec.message());
  }
  const std::string path = state_dir + "/lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return rdma::ErrnoStatus(ErrorCode::kIo, "open " + path, errno);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      close(fd);
      return rdma::ErrnoStatus(ErrorCode::kIo, "flock " + path, err);
    }
    char buf[32] = {};
    const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    std::string pid(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return Error(ErrorCode::kConfig,
                 "state_dir " + state_dir + " is in use by another lockd (pid " +
                     (pid.empty() ? std::string("unknown") : pid) +
                     "): each lockd needs a state_dir of its own (its epoch and running mark), "
                     "as it needs its own admin_socket");
  }
  const std::string me = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int err = errno;
    close(fd);
    return rdma::ErrnoStatus(ErrorCode::kIo, "write " + path, err);
  }
  return StateDirLock(fd);
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) close(fd_);  // the flock goes with it
}

Result<bool> MarkRunning(const std::string& state_dir) {
  if (state_dir.empty()) return true;  // nothing tells us how the last run ended: assume the worst
  // lstat, not std::filesystem::exists: that answers false, not an error, for a mark it cannot
  // look at (ELOOP, EIO), and follows a link (a dangling one read as no mark). Anything there
  // is a mark; anything but "not there" that stops us looking is an error, never a clean stop.
  const std::string path = state_dir + "/running";
  struct stat st {};
  bool unclean = true;
  if (lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err != ENOENT) return rdma::ErrnoStatus(ErrorCode::kIo, "look at " + path, err);
    unclean = false;
  }
  // The mark holds lockd's pid, for an operator; what counts is that it exists.
  RDMALOCK_RETURN_IF_ERROR(
      WriteFileAtomically(state_dir, "running", std::to_string(getpid()) + "\n"));
  return unclean;
}

void MarkStoppedCleanly(const std::string& state_dir) {
  if (!state_dir.empty()) unlink((state_dir + "/running").c_str());
}

Result<uint64_t> NextEpoch(const std::string& state_dir) {
  if (state_dir.empty()) {
    return Error(ErrorCode::kConfig, "state_dir is empty: nowhere to keep the epoch");
  }
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    return Error(ErrorCode::kIo, "cannot create state_dir " + state_dir + ": " + ec.message());
  }
  const std::string path = state_dir + "/epoch";
  uint64_t epoch = 0;
  RDMALOCK_ASSIGN_OR_RETURN(const std::optional<std::string> old, ReadSmallFile(path));
  if (old) {
    std::string text = *old;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    // Decimal digits only: std::stoull, used before, also took a sign and leading blanks, and
    // "-1" read as 2^64 - 1, which the increment wrapped to epoch 0 (found by review).
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
      return Error(ErrorCode::kIo, path + " does not hold an epoch number ('" + text +
                                       "'); lockd will not guess one (tokens must only grow)");
    }
    for (const char ch : text) {
      epoch = std::min<uint64_t>(epoch * 10 + static_cast<uint64_t>(ch - '0'), 0x10000);
    }
    // Checked before the increment (the value saturates at 65536 above, so nothing wraps).
    if (epoch >= 0xffff) {
      return Error(ErrorCode::kIo, path + " holds epoch " + text +
                                       ": the next would exceed 65535, the width of the token's "
                                       "epoch field");
    }
  }
  return epoch + 1;
}

Status StoreEpoch(const std::string& state_dir, uint64_t epoch) {
  return WriteFileAtomically(state_dir, "epoch", std::to_string(epoch) + "\n");
}

Result<uint64_t> BumpEpoch(const std::string& state_dir) {
  RDMALOCK_ASSIGN_OR_RETURN(const uint64_t epoch, NextEpoch(state_dir));
  RDMALOCK_RETURN_IF_ERROR(StoreEpoch(state_dir, epoch));
  return epoch;
}

}  // namespace rdmalock::lockd
