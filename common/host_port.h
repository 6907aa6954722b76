// HOST:PORT as lockd writes its address and clients read it back: an IPv6 host in brackets
// ([fe80::1]:7471). Thread-safety: a pure function; any thread.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

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

// HOST:PORT or [HOST]:PORT back into the host (brackets dropped) and a port of 1 to 65535;
// nullopt for anything else (no colon, no host, a port that is not such a number).
inline std::optional<std::pair<std::string, uint16_t>> SplitHostPort(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  unsigned port = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data() + colon + 1, end, port);
  if (ec != std::errc() || p != end || port == 0 || port > 65535) return std::nullopt;
  std::string_view host = s.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(std::string(host), static_cast<uint16_t>(port));
}

}  // namespace rdmalock
