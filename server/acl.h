// lockd's allow-list: address ranges (CIDR) a client connection may come from.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "rdmalock/status.h"

namespace rdmalock::lockd {

struct Cidr {
  int family = 0;                  // AF_INET or AF_INET6
  std::array<uint8_t, 16> addr{};  // network byte order; IPv4 in the first 4 bytes
  uint32_t prefix = 0;             // bits that must match

  // "10.0.0.0/8", "192.0.2.7" (a /32), "fd00::/8", "::1" (a /128). Host bits must be zero. An
  // IPv4-mapped range ("::ffff:10.0.0.0/104") is kept as the IPv4 range it names (10.0.0.0/8);
  // one shorter than /96 is refused.
  static Result<Cidr> Parse(const std::string& text);
  std::string ToString() const;
};

// True if `sa` is inside one of `ranges` (an IPv4-mapped IPv6 peer matches IPv4 ranges). An
// empty list allows every address.
bool AddressAllowed(const std::vector<Cidr>& ranges, const sockaddr* sa);

// What proves a connection flagged proto::kFlagLoopback is lockd's own (issue 16, finding 7): a
// secret lockd draws at start and carries in the request's join fields, and the same address at
// both ends. The flag skips the restart grace, max_clients and fencing, so a peer that merely sets
// it must be refused, whatever allow_from says.
struct LoopbackSecret {
  uint64_t a = 0, b = 0;
};
bool LoopbackProven(const LoopbackSecret& secret, uint64_t a, uint64_t b, const sockaddr* peer,
                    const sockaddr* local);
// Whether two socket addresses name the same host (the port is ignored).
bool SameHost(const sockaddr* a, const sockaddr* b);

}  // namespace rdmalock::lockd
