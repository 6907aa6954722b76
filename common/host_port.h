// HOST:PORT as lockd writes its address and clients read it back: an IPv6 host in brackets
// ([fe80::1]:7471). Thread-safety: a pure function; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace rdmalock {

inline std::string JoinHostPort(std::string_view host, uint16_t port) {
  // Appended, not operator+: GCC 12 at -O3 misreports a restrict overlap in the chain.
  const bool v6 = host.find(':') != std::string_view::npos;
  std::string out;
  out.reserve(host.size() + 8);
  if (v6) out += '[';
  out.append(host);
  if (v6) out += ']';
  out += ':';
  out += std::to_string(port);
  return out;
}

}  // namespace rdmalock
