// Unit tests of server/acl.h: allow_from ranges (parsing and matching IPv4, IPv6 and
// IPv4-mapped peers) and the loopback proof.
#include "server/acl.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/auth/auth.h"

using rdmalock::ErrorCode;
namespace auth = rdmalock::auth;
using rdmalock::lockd::AddressAllowed;
using rdmalock::lockd::Cidr;

namespace {

sockaddr_storage V4(const char* ip) {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  REQUIRE(inet_pton(AF_INET, ip, &in->sin_addr) == 1);
  return ss;
}

sockaddr_storage V6(const char* ip) {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in6*>(&ss);
  in->sin6_family = AF_INET6;
  REQUIRE(inet_pton(AF_INET6, ip, &in->sin6_addr) == 1);
  return ss;
}

const sockaddr* Sa(const sockaddr_storage& ss) { return reinterpret_cast<const sockaddr*>(&ss); }

}  // namespace

TEST_CASE("allow_from ranges: parsing, IPv4, IPv6 and IPv4-mapped peers") {
  REQUIRE(Cidr::Parse("10.0.0.0/8").ok());
  REQUIRE(Cidr::Parse("192.0.2.7")->prefix == 32);
  REQUIRE(Cidr::Parse("fd00::/8").ok());
  REQUIRE(Cidr::Parse("::1")->prefix == 128);
  REQUIRE(Cidr::Parse("0.0.0.0/0").ok());
  for (const char* bad : {"10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "host.example", "",
                          "fd00::/129", "10.0.0.0/-1"}) {
    INFO(bad);
    REQUIRE(Cidr::Parse(bad).status().code() == ErrorCode::kConfig);
  }
  auto host_bits = Cidr::Parse("10.1.2.3/8");
  REQUIRE(host_bits.status().message().find("10.0.0.0/8") != std::string::npos);

  std::vector<Cidr> ranges = {*Cidr::Parse("10.0.0.0/8"), *Cidr::Parse("192.0.2.128/25"),
                              *Cidr::Parse("fd00::/8")};
  REQUIRE(AddressAllowed(ranges, Sa(V4("10.200.1.1"))));
  REQUIRE_FALSE(AddressAllowed(ranges, Sa(V4("11.0.0.1"))));
  REQUIRE(AddressAllowed(ranges, Sa(V4("192.0.2.200"))));
  REQUIRE_FALSE(AddressAllowed(ranges, Sa(V4("192.0.2.127"))));
  REQUIRE(AddressAllowed(ranges, Sa(V6("fd12::1"))));
  REQUIRE_FALSE(AddressAllowed(ranges, Sa(V6("fe80::1"))));
  REQUIRE(AddressAllowed(ranges, Sa(V6("::ffff:10.1.1.1"))));  // IPv4-mapped
  REQUIRE_FALSE(AddressAllowed(ranges, Sa(V6("::ffff:11.1.1.1"))));
  REQUIRE(AddressAllowed({}, Sa(V4("203.0.113.9"))));  // no list: anyone
  REQUIRE_FALSE(AddressAllowed(ranges, nullptr));
}

// Found by review (2026-12-06): a range written IPv4-mapped ("::ffff:10.0.0.0/104") was kept
// as an IPv6 range, while every peer is compared as IPv4 (a mapped peer is unmapped first), so it
// matched no one: --check-config said OK and every client was refused not_allowed. It is now the
// IPv4 range it names; a mapped range shorter than /96 names no IPv4 range and is refused.
TEST_CASE("allow_from ranges: an IPv4-mapped range is the IPv4 range it names") {
  const auto mapped = Cidr::Parse("::ffff:10.0.0.0/104");
  REQUIRE(mapped.ok());
  CHECK(mapped->ToString() == "10.0.0.0/8");
  const std::vector<Cidr> ranges = {*mapped};
  CHECK(AddressAllowed(ranges, Sa(V4("10.1.2.3"))));
  CHECK(AddressAllowed(ranges, Sa(V6("::ffff:10.1.2.3"))));
  CHECK_FALSE(AddressAllowed(ranges, Sa(V4("11.1.2.3"))));
  const auto one = Cidr::Parse("::ffff:192.0.2.7");
  REQUIRE(one.ok());
  CHECK(one->ToString() == "192.0.2.7/32");
  const auto shorter = Cidr::Parse("::ffff:0.0.0.0/80");
  CHECK(shorter.status().code() == ErrorCode::kConfig);
  CHECK(shorter.status().message().find("IPv4-mapped") != std::string::npos);
}

TEST_CASE(
    "finding 7: the loopback flag counts only with lockd's secret, from lockd's own address") {
  using rdmalock::lockd::LoopbackProven;
  using rdmalock::lockd::LoopbackSecret;
  const LoopbackSecret secret{0x1234567890abcdefULL, 0x0fedcba987654321ULL};
  auto here = V4("192.0.2.1"), other = V4("192.0.2.9");
  REQUIRE(LoopbackProven(secret, secret.a, secret.b, Sa(here), Sa(here)));
  REQUIRE_FALSE(LoopbackProven(secret, 0, 0, Sa(here), Sa(here)));  // the flag alone
  REQUIRE_FALSE(LoopbackProven(secret, secret.a, secret.b ^ 1, Sa(here), Sa(here)));
  REQUIRE_FALSE(LoopbackProven(secret, secret.a, secret.b, Sa(other), Sa(here)));
  REQUIRE_FALSE(LoopbackProven(LoopbackSecret{}, 0, 0, Sa(here), Sa(here)));  // none drawn
  // Join keys come from the CSPRNG: two draws differ (a seeded mt19937 would be predictable).
  REQUIRE(auth::RandomU64() != auth::RandomU64());
}
