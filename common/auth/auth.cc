#include "common/auth/auth.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

namespace rdmalock::auth {
namespace {

// sodium_init is idempotent and thread-safe; every entry point that needs randomness calls it.
void InitSodium() {
  if (sodium_init() < 0) std::abort();  // no entropy source at all: nothing safe can be done
}

Mac Hmac(const std::string& key, std::string_view label, std::span<const uint8_t> a,
         std::span<const uint8_t> b, std::span<const uint8_t> c) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(label.data()),
                                label.size());
  crypto_auth_hmacsha256_update(&st, a.data(), a.size());
  crypto_auth_hmacsha256_update(&st, b.data(), b.size());
  crypto_auth_hmacsha256_update(&st, c.data(), c.size());
  Mac out{};
  crypto_auth_hmacsha256_final(&st, out.data());
  sodium_memzero(&st, sizeof(st));
  return out;
}

}  // namespace

Status CheckKey(const std::string& key, const std::string& origin) {
  if (key.size() < kMinKeyBytes) {
    return Error(ErrorCode::kConfig, origin + ": the auth key is " + std::to_string(key.size()) +
                                         " bytes; at least " + std::to_string(kMinKeyBytes) +
                                         " are needed (make one with `lockctl keygen`)");
  }
  return Status::Ok();
}

Result<std::string> LoadKeyFile(const std::string& path, bool require_private) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return Error(ErrorCode::kConfig,
                 "auth key file " + path + ": cannot open it (" + std::strerror(errno) + ")");
  }
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return Error(ErrorCode::kConfig, "auth key file " + path + ": not a regular file");
  }
  if (require_private && (sb.st_mode & 077) != 0) {
    close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(sb.st_mode & 07777));
    return Error(ErrorCode::kConfig,
                 "auth key file " + path + " has mode " + mode +
                     ": group and others must have no access (chmod 600, owned by the service "
                     "user)");
  }
  if (sb.st_size > 4096) {
    close(fd);
    return Error(ErrorCode::kConfig, "auth key file " + path + " is larger than 4096 bytes");
  }
  std::string key(static_cast<size_t>(sb.st_size), '\0');
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = read(fd, key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return Error(ErrorCode::kConfig, "auth key file " + path + ": read failed (" +
                                           (n == 0 ? "short file" : std::strerror(err)) + ")");
    }
    got += static_cast<size_t>(n);
  }
  close(fd);
  key = TrimKey(std::move(key));
  if (Status st = CheckKey(key, "auth key file " + path); !st.ok()) return st;
  return key;
}

std::string TrimKey(std::string key) {
  while (!key.empty() &&
         (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) {
    key.pop_back();
  }
  return key;
}

Nonce NewNonce() {
  InitSodium();
  Nonce n{};
  randombytes_buf(n.data(), n.size());
  return n;
}

uint64_t RandomU64() {
  InitSodium();
  uint64_t v = 0;
  randombytes_buf(&v, sizeof(v));
  return v;
}

std::string NewKeyHex() {
  const Nonce raw = NewNonce();
  char hex[2 * 32 + 1];
  sodium_bin2hex(hex, sizeof(hex), raw.data(), raw.size());
  return std::string(hex);
}

Mac HelloMac(const std::string& key, std::span<const uint8_t> lockd_nonce,
             std::span<const uint8_t> client_nonce, std::span<const uint8_t> request) {
  return Hmac(key, "rdmalock-hello-v3", lockd_nonce, client_nonce, request);
}

Mac WelcomeMac(const std::string& key, std::span<const uint8_t> client_nonce,
               std::span<const uint8_t> lockd_nonce, std::span<const uint8_t> welcome) {
  return Hmac(key, "rdmalock-welcome-v3", client_nonce, lockd_nonce, welcome);
}

bool MacEqual(const Mac& a, const Mac& b) {
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace rdmalock::auth
