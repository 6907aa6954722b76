// server/state_dir: the epoch and the running mark, over one write-file-atomically helper.
#include "server/state_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using namespace rdmalock::lockd;

namespace {

// A fresh directory under the temporary directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "rdmalock-state-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

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

TEST_CASE("state_dir: WriteFileAtomically replaces the whole file") {
  TempDir dir;
  REQUIRE(WriteFileAtomically(dir.str(), "f", "a long first version\n").ok());
  REQUIRE(WriteFileAtomically(dir.str(), "f", "short\n").ok());
  CHECK(Slurp(dir.path / "f") == "short\n");
  CHECK_FALSE(WriteFileAtomically(dir.str() + "/missing", "f", "x").ok());
}
