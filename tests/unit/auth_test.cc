#include "common/auth/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

using rdmalock::ErrorCode;
namespace auth = rdmalock::auth;

namespace {

std::string WriteKey(const std::string& content, mode_t mode) {
  char path[] = "/tmp/rdmalock-key-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
  REQUIRE(fchmod(fd, mode) == 0);
  close(fd);
  return path;
}

}  // namespace

TEST_CASE("key files: private, long enough, trailing newline stripped") {
  const std::string key = "0123456789abcdef0123456789abcdef";
  const std::string ok = WriteKey(key + "\n", 0600);
  auto k = auth::LoadKeyFile(ok, true);
  REQUIRE(k.ok());
  REQUIRE(*k == key);

  const std::string open_to_all = WriteKey(key, 0644);
  auto refused = auth::LoadKeyFile(open_to_all, true);
  REQUIRE(refused.status().code() == ErrorCode::kConfig);
  REQUIRE(refused.status().message().find("mode 0644") != std::string::npos);
  REQUIRE(auth::LoadKeyFile(open_to_all, false).ok());  // a client's copy may be shared

  const std::string short_key = WriteKey("tooshort\n", 0600);
  REQUIRE(auth::LoadKeyFile(short_key, true).status().message().find("at least 16") !=
          std::string::npos);
  REQUIRE(auth::LoadKeyFile("/nonexistent/key", true).status().message().find("cannot open") !=
          std::string::npos);
  unlink(ok.c_str());
  unlink(open_to_all.c_str());
  unlink(short_key.c_str());
}

TEST_CASE("proofs depend on the key, both nonces and the request; keys and nonces are fresh") {
  const std::string key = "0123456789abcdef0123456789abcdef";
  const auto n1 = auth::NewNonce(), n2 = auth::NewNonce();
  REQUIRE(n1 != n2);
  const std::array<uint8_t, 4> req{1, 2, 3, 4}, req2{1, 2, 3, 5};
  const auto mac = auth::HelloMac(key, n1, n2, req);
  REQUIRE(auth::MacEqual(mac, auth::HelloMac(key, n1, n2, req)));
  REQUIRE_FALSE(auth::MacEqual(mac, auth::HelloMac(key + "x", n1, n2, req)));
  REQUIRE_FALSE(auth::MacEqual(mac, auth::HelloMac(key, n2, n1, req)));
  REQUIRE_FALSE(auth::MacEqual(mac, auth::HelloMac(key, n1, n2, req2)));
  // The welcome's proof uses another label: a hello's MAC is never a valid welcome MAC.
  REQUIRE_FALSE(auth::MacEqual(mac, auth::WelcomeMac(key, n1, n2, req)));
  const std::string a = auth::NewKeyHex(), b = auth::NewKeyHex();
  REQUIRE(a.size() == 64);
  REQUIRE(a != b);
  REQUIRE(a.find_first_not_of("0123456789abcdef") == std::string::npos);
}
