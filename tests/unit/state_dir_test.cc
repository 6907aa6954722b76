// server/state_dir: the epoch and the running mark, over one write-file-atomically helper.
#include "server/state_dir.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/test_env.h"

namespace fs = std::filesystem;
using namespace rdmalock::lockd;
using rdmalock::testing::TempDir;

namespace {

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("state_dir: the epoch starts at 1 and grows by one at every start") {
  TempDir dir;
  const std::string sub = dir.str() + "/nested/state";  // created on first use
  auto e1 = BumpEpoch(sub);
  REQUIRE(e1.ok());
  CHECK(*e1 == 1);
  auto e2 = BumpEpoch(sub);
  REQUIRE(e2.ok());
  CHECK(*e2 == 2);
  CHECK(Slurp(sub + "/epoch") == "2\n");
  CHECK_FALSE(fs::exists(sub + "/epoch.tmp"));  // renamed over, not left behind
}

TEST_CASE("state_dir: an empty state_dir has nowhere to keep the epoch") {
  auto e = BumpEpoch("");
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().code() == rdmalock::ErrorCode::kConfig);
}

TEST_CASE("state_dir: an epoch file that is not a number refuses the start") {
  TempDir dir;
  std::ofstream(dir.path / "epoch") << "12abc\n";
  auto e = BumpEpoch(dir.str());
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().message().find("does not hold an epoch number") != std::string::npos);
  CHECK(Slurp(dir.path / "epoch") == "12abc\n");  // left as it was
}

TEST_CASE("state_dir: an epoch file that cannot be read refuses the start") {
  TempDir dir;
  // A directory where the file should be: it exists, but read() fails (EISDIR). (Root ignores
  // file modes, so a chmod 000 file would not do.)
  fs::create_directory(dir.path / "epoch");
  auto e = BumpEpoch(dir.str());
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().code() == rdmalock::ErrorCode::kIo);
}

TEST_CASE("state_dir: an epoch file too large or past the token's 16 bits is refused") {
  TempDir dir;
  std::ofstream(dir.path / "epoch") << "65535\n";
  auto e = BumpEpoch(dir.str());
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().message().find("65535") != std::string::npos);
  std::ofstream(dir.path / "epoch") << std::string(5000, '1');
  CHECK_FALSE(BumpEpoch(dir.str()).ok());
}

// The epoch file was read with std::stoull, which takes a sign and leading blanks: "-1" read as
// 2^64 - 1, one more wrapped to 0 and passed the 65535 check, and lockd ran at epoch 0, its
// fencing tokens below every earlier run's (found by review, 2026-12-05). Only decimal digits
// (then blanks or a newline) are an epoch now, and one at 65535 or above is refused before the
// increment; either error names the file and what it holds.
TEST_CASE("state_dir: an epoch file with a sign, a wrapping number or blanks first is refused") {
  for (const std::string text :
       {"-1\n", "18446744073709551615\n", "+5\n", " 5\n", "-0\n", "\n", "99999999999999999999\n"}) {
    TempDir dir;
    std::ofstream(dir.path / "epoch") << text;
    auto e = BumpEpoch(dir.str());
    INFO("epoch file '" << text << "': "
                        << (e.ok() ? "epoch " + std::to_string(*e) : e.status().ToString()));
    CHECK_FALSE(e.ok());
    if (!e.ok()) {  // the message names the file and quotes what it holds
      CHECK(e.status().message().find(dir.str() + "/epoch") != std::string::npos);
      CHECK(e.status().message().find(text.substr(0, text.size() - 1)) != std::string::npos);
    }
    CHECK(Slurp(dir.path / "epoch") == text);  // left as it was
  }
  // Digits with trailing blanks and newlines still read, as before.
  TempDir dir;
  std::ofstream(dir.path / "epoch") << "41 \n\n";
  auto e = BumpEpoch(dir.str());
  REQUIRE(e.ok());
  CHECK(*e == 42);
}

TEST_CASE("state_dir: the running mark tells an unclean stop from a clean one") {
  TempDir dir;
  auto first = MarkRunning(dir.str());
  REQUIRE(first.ok());
  CHECK_FALSE(*first);  // no mark before: the last run (none) stopped cleanly
  CHECK(Slurp(dir.path / "running") == std::to_string(getpid()) + "\n");
  auto again = MarkRunning(dir.str());  // the mark is still there: a crash
  REQUIRE(again.ok());
  CHECK(*again);
  MarkStoppedCleanly(dir.str());
  CHECK_FALSE(fs::exists(dir.path / "running"));
  auto after = MarkRunning(dir.str());
  REQUIRE(after.ok());
  CHECK_FALSE(*after);
  // Without a state_dir nothing tells how the last run ended: assume the worst.
  auto none = MarkRunning("");
  REQUIRE(none.ok());
  CHECK(*none);
}

// MarkRunning asked std::filesystem::exists, which answers false, not an error, when the mark
// cannot be looked at (ELOOP, EIO): the start counted as clean and served with no restart grace,
// beside clients of the crashed run that still believed in their leases (found by review,
// 2026-12-06). A mark that is there in any form (even a dangling link) is an unclean stop; a
// mark that cannot be looked at is an error.
TEST_CASE("state_dir: a running mark that cannot be looked at is no clean stop") {
  TempDir dir;
  fs::create_symlink("running", dir.path / "running");  // a link to itself: stat fails, ELOOP
  auto looped = MarkRunning(dir.str());
  INFO((looped.ok() ? std::string(*looped ? "unclean" : "clean") : looped.status().message()));
  CHECK((!looped.ok() || *looped));
  fs::remove(dir.path / "running");
  fs::create_symlink("nowhere", dir.path / "running");  // a dangling link is still a mark
  auto dangling = MarkRunning(dir.str());
  REQUIRE(dangling.ok());
  CHECK(*dangling);
}

TEST_CASE("state_dir: WriteFileAtomically replaces the whole file") {
  TempDir dir;
  REQUIRE(WriteFileAtomically(dir.str(), "f", "a long first version\n").ok());
  REQUIRE(WriteFileAtomically(dir.str(), "f", "short\n").ok());
  CHECK(Slurp(dir.path / "f") == "short\n");
  CHECK_FALSE(WriteFileAtomically(dir.str() + "/missing", "f", "x").ok());
}

TEST_CASE("finding 6 (and issue 17's 6): the epoch file is replaced atomically and never guessed") {
  const TempDir tmp;
  const std::string dir = tmp.str();
  auto e1 = rdmalock::lockd::BumpEpoch(dir);
  auto e2 = rdmalock::lockd::BumpEpoch(dir);
  REQUIRE(e1.ok());
  REQUIRE(e2.ok());
  REQUIRE(*e2 == *e1 + 1);
  REQUIRE_FALSE(fs::exists(dir + "/epoch.tmp"));
  // An epoch file that exists but cannot be read is an error naming it, not a fresh start at 1.
  fs::remove(dir + "/epoch");
  fs::create_directory(dir + "/epoch");
  auto bad = rdmalock::lockd::BumpEpoch(dir);
  REQUIRE_FALSE(bad.ok());
  INFO(bad.status().ToString());
  REQUIRE(bad.status().message().find(dir + "/epoch") != std::string::npos);
}

// Issue 17 finding 6: an epoch file lockd may not read (EACCES) was taken for a first start, and
// the epoch began again at 1, so fencing tokens went backwards. As root, permissions do not stop a
// read, so the check runs in a child that drops to an unprivileged user first.
TEST_CASE("issue 17 finding 6: an epoch file lockd may not read stops the start, naming it") {
  const TempDir tmp;
  const std::string dir = tmp.str();
  const std::string path = dir + "/epoch";
  { std::ofstream(path) << "41\n"; }
  fs::permissions(dir, fs::perms::all);  // the child may create and rename files here
  fs::permissions(path, fs::perms::none);
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    if (geteuid() == 0 && setresuid(65534, 65534, 65534) != 0) {
      out = "setresuid failed";
    } else {
      auto r = rdmalock::lockd::BumpEpoch(dir);
      out = r.ok() ? "epoch " + std::to_string(*r) : "error " + r.status().ToString();
    }
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;)
    out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  INFO("BumpEpoch as an unprivileged user: " << out);
  CHECK(out.rfind("error ", 0) == 0);
  CHECK(out.find(path) != std::string::npos);
  CHECK(out.find("Permission denied") != std::string::npos);
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  std::ifstream in(path);
  std::string kept;
  in >> kept;
  CHECK(kept == "41");  // the file is left as it was
}

TEST_CASE("state_dir: a second lockd on one state_dir is refused, naming the first") {
  // Found by review (2026-12-06): nothing kept two lockds (two shards on one host, the default
  // state_dir) apart. They shared the running mark, so the first's clean stop removed the
  // second's, and a kill -9 of the second went unseen (no restart grace); and the epoch file.
  TempDir d;
  const std::string dir = d.str() + "/state";
  {
    auto first = StateDirLock::Acquire(dir);
    REQUIRE(first.ok());
    CHECK(Slurp(fs::path(dir) / "lock") == std::to_string(getpid()) + "\n");
    auto second = StateDirLock::Acquire(dir);  // another open file: flock refuses it
    REQUIRE_FALSE(second.ok());
    CHECK(second.status().code() == rdmalock::ErrorCode::kConfig);
    INFO(second.status().message());
    CHECK(second.status().message().find("in use by another lockd (pid " +
                                         std::to_string(getpid()) + ")") != std::string::npos);
    // A child process too (a flock is not per process, but be sure across processes).
    const pid_t child = fork();
    if (child == 0) _exit(StateDirLock::Acquire(dir).ok() ? 1 : 0);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  // Let go with the first (as when lockd exits, however it exits): the next start takes it.
  CHECK(StateDirLock::Acquire(dir).ok());
}
