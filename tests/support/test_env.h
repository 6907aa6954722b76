// Small helpers the host tests share.
#pragma once

#include <cstdlib>

namespace rdmalock::testing {

// An integer from the environment (a test's scale knob), or `def` when unset or empty.
inline int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}

}  // namespace rdmalock::testing
