// lockctl bench's progress line (issue 20, item 5): its text, its counters, and that it is drawn
// only on a terminal and never with --json.
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>

#include "client/lockctl/bench/progress.h"

using lockctl::bench::FormatProgress;
using lockctl::bench::ProgressCounters;
using lockctl::bench::ShouldShowProgress;

TEST_CASE("bench progress: the line says elapsed, acquisitions so far and the current rate") {
  CHECK(FormatProgress(false, 2.04, 5, 123456, 61728.4) ==
        "bench: 2.0s of 5s  123456 acquisitions  61728/s now");
  CHECK(FormatProgress(false, 0.31, 1.5, 0, 0) == "bench: 0.3s of 1.5s  0 acquisitions  0/s now");
  CHECK(FormatProgress(true, 0.3, 0.5, 99, 12) == "bench: warm-up 0.3s of 0.5s");
  // A rate that cannot be measured (no interval yet) is 0, not nan or inf.
  CHECK(FormatProgress(false, 1, 5, 7, std::numeric_limits<double>::infinity()) ==
        "bench: 1.0s of 5s  7 acquisitions  0/s now");
  // One short line: no newline or carriage return of its own (the caller adds \r).
  const std::string big = FormatProgress(false, 1e6, 1e6, UINT64_MAX, 1e15);
  CHECK(big.find_first_of("\r\n") == std::string::npos);
  CHECK(big.size() < 100);
}

TEST_CASE("bench progress: the counters sum every slot, also across a fork") {
  auto pc = ProgressCounters::Create(3);
  REQUIRE(pc != nullptr);
  CHECK(pc->Sum() == 0);
  pc->slot(0)->Add(5);
  pc->slot(2)->Add(7);
  CHECK(pc->Sum() == 12);
  // The mapping is shared: a child's count is seen by the parent (forked bench processes).
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    pc->slot(1)->Add(30);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(pc->Sum() == 42);
  CHECK(ProgressCounters::Create(0) == nullptr);
}

TEST_CASE("bench progress: drawn on a terminal only, never with --json") {
  int p[2];
  REQUIRE(pipe(p) == 0);
  CHECK_FALSE(ShouldShowProgress(false, p[1]));  // stdout a pipe: nothing
  CHECK_FALSE(ShouldShowProgress(true, p[1]));
  close(p[0]);
  close(p[1]);
  int master = -1, slave = -1;
  REQUIRE(openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
  CHECK(ShouldShowProgress(false, slave));       // a terminal: the line
  CHECK_FALSE(ShouldShowProgress(true, slave));  // --json: never
  close(master);
  close(slave);
}
