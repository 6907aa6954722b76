// Small helpers the host tests share.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace rdmalock::testing {

// An integer from the environment (a test's scale knob), or `def` when unset or empty.
inline int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
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
