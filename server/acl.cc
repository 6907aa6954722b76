#include "server/acl.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace rdmalock::lockd {
namespace {

bool PrefixMatches(const uint8_t* a, const uint8_t* b, uint32_t bits) {
  const uint32_t bytes = bits / 8, rest = bits % 8;
  if (std::memcmp(a, b, bytes) != 0) return false;
  if (rest == 0) return true;
  const auto mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a[bytes] & mask) == (b[bytes] & mask);
}

}  // namespace

Result<Cidr> Cidr::Parse(const std::string& text) {
  Cidr c;
  std::string host = text;
  std::string bits;
  if (const size_t slash = text.find('/'); slash != std::string::npos) {
    host = text.substr(0, slash);
    bits = text.substr(slash + 1);
  }
  uint32_t max_bits = 0;
  if (inet_pton(AF_INET, host.c_str(), c.addr.data()) == 1) {
    c.family = AF_INET;
    max_bits = 32;
  } else if (inet_pton(AF_INET6, host.c_str(), c.addr.data()) == 1) {
    c.family = AF_INET6;
    max_bits = 128;
  } else {
    return Error(ErrorCode::kConfig, "'" + text + "' is not an address range (e.g. 10.0.0.0/8, " +
                                         "192.0.2.7, fd00::/8)");
  }
  c.prefix = max_bits;
  if (text.find('/') != std::string::npos) {
    if (bits.empty() || bits.size() > 3 ||
        bits.find_first_not_of("0123456789") != std::string::npos || std::stoul(bits) > max_bits) {
      return Error(ErrorCode::kConfig,
                   "'" + text + "': the prefix length must be 0.." + std::to_string(max_bits));
    }
    c.prefix = static_cast<uint32_t>(std::stoul(bits));
  }
  // An IPv4-mapped range (::ffff:a.b.c.d/n) is the IPv4 range it names: AddressAllowed compares
  // a mapped peer as IPv4, so kept as IPv6 it would match no one.
  if (c.family == AF_INET6 &&
      IN6_IS_ADDR_V4MAPPED(reinterpret_cast<const in6_addr*>(c.addr.data()))) {
    if (c.prefix < 96) {
      return Error(ErrorCode::kConfig, "'" + text +
                                           "' is an IPv4-mapped range shorter than /96, which "
                                           "names no IPv4 range; write the IPv4 range instead");
    }
    std::array<uint8_t, 16> v4{};
    std::memcpy(v4.data(), c.addr.data() + 12, 4);
    c.addr = v4;
    c.family = AF_INET;
    c.prefix -= 96;
  }
  // Host bits set (10.1.2.3/8) usually means a typo; refuse rather than guess.
  std::array<uint8_t, 16> net{};
  const uint32_t full = c.prefix / 8, rest = c.prefix % 8;
  std::memcpy(net.data(), c.addr.data(), full);
  if (rest != 0) net[full] = static_cast<uint8_t>(c.addr[full] & (0xff << (8 - rest)));
  if (net != c.addr) {
    return Error(
        ErrorCode::kConfig, "'" + text + "' has host bits set beyond /" + std::to_string(c.prefix) +
                                " (the network is " +
                                [&] {
                                  Cidr n = c;
                                  n.addr = net;
                                  return n.ToString();
                                }() +
                                ")");
  }
  return c;
}

std::string Cidr::ToString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(family, addr.data(), buf, sizeof(buf));
  return std::string(buf) + "/" + std::to_string(prefix);
}

bool AddressAllowed(const std::vector<Cidr>& ranges, const sockaddr* sa) {
  if (ranges.empty()) return true;
  if (sa == nullptr) return false;
  int family = sa->sa_family;
  const uint8_t* a = nullptr;
  if (family == AF_INET) {
    a = reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr);
  } else if (family == AF_INET6) {
    const auto* in6 = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    a = reinterpret_cast<const uint8_t*>(in6);
    if (IN6_IS_ADDR_V4MAPPED(in6)) {
      family = AF_INET;
      a += 12;
    }
  } else {
    return false;
  }
  for (const Cidr& c : ranges) {
    if (c.family == family && PrefixMatches(a, c.addr.data(), c.prefix)) return true;
  }
  return false;
}

bool SameHost(const sockaddr* a, const sockaddr* b) {
  if (a == nullptr || b == nullptr || a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

bool LoopbackProven(const LoopbackSecret& secret, uint64_t a, uint64_t b, const sockaddr* peer,
                    const sockaddr* local) {
  // Compared without an early exit; a zero secret (never drawn) proves nothing.
  const uint64_t diff = (secret.a ^ a) | (secret.b ^ b);
  return (secret.a | secret.b) != 0 && diff == 0 && SameHost(peer, local);
}

}  // namespace rdmalock::lockd
