// Small helpers the host tests share.
#pragma once

#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace rdmalock::testing {

// How a child process ended, once it has: `waited` false if waitpid failed; `clean` for exit 0;
// `how` "exit N" or "signal N", for a test's message.
struct ChildEnd {
  bool waited = false;
  bool clean = false;
  std::string how;
};
inline ChildEnd WaitChild(pid_t pid) {
  ChildEnd end;
  int status = 0;
  end.waited = waitpid(pid, &status, 0) == pid;
  if (!end.waited) return end;
  end.clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  end.how = WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                              : "signal " + std::to_string(WTERMSIG(status));
  return end;
}

// An integer from the environment (a test's scale knob), or `def` when unset or empty.
inline int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}

// RDMALOCK_STRESS_SEED: mixed into every seed of the randomized stress tests, so that repeated
// runs can draw other request sequences and fault schedules (0, the default: the sequences the
// tests always drew). A failing run's seed is in its report (each stress test CAPTUREs it).
inline unsigned StressSeed() { return static_cast<unsigned>(EnvInt("RDMALOCK_STRESS_SEED", 0)); }
// A stress test's generator seed `base` with StressSeed()'s `seed` mixed in: `base` itself for 0.
inline uint64_t MixSeed(uint64_t base, unsigned seed) {
  return base + uint64_t{seed} * 0x9e3779b97f4a7c15ull;
}

// A fresh directory under the temporary directory (mkdtemp), removed with what it holds when the
// test ends.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rdmalock-test-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
};

}  // namespace rdmalock::testing
