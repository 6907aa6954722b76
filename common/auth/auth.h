// The shared-key proofs of the handshake (protocol version 3), with libsodium's HMAC-SHA256.
//
// lockd sends a fresh 32-byte nonce in its accept. The client answers with its own nonce and
//   client MAC = HMAC(key, "rdmalock-hello-v3" | lockd nonce | client nonce | connect request)
// and lockd, if that verifies, sends the rkeys with
//   lockd MAC  = HMAC(key, "rdmalock-welcome-v3" | client nonce | lockd nonce | welcome[0, kMac))
// The key never travels; a recorded Hello is useless against another nonce; the client knows the
// rkeys it got come from a lockd that holds the key.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "rdmalock/status.h"

namespace rdmalock::auth {

using Mac = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 32>;

// Shortest key accepted, in bytes (after trailing whitespace is stripped).
inline constexpr size_t kMinKeyBytes = 16;

// Reads a key file: its bytes with trailing whitespace (a newline) stripped. With
// `require_private`, a file that group or others may read or write is refused (lockd's key).
Result<std::string> LoadKeyFile(const std::string& path, bool require_private);
// Checks a key given directly (the environment): at least kMinKeyBytes.
Status CheckKey(const std::string& key, const std::string& origin);
// A key as written in a file or the environment: trailing whitespace (a newline) is not part of it.
std::string TrimKey(std::string key);

// A fresh random nonce (libsodium's randombytes).
Nonce NewNonce();
// 64 random bits from libsodium's CSPRNG (join keys, secrets).
uint64_t RandomU64();
// 32 random bytes as 64 hex digits: a new key (lockctl keygen).
std::string NewKeyHex();

Mac HelloMac(const std::string& key, std::span<const uint8_t> lockd_nonce,
             std::span<const uint8_t> client_nonce, std::span<const uint8_t> request);
Mac WelcomeMac(const std::string& key, std::span<const uint8_t> client_nonce,
               std::span<const uint8_t> lockd_nonce, std::span<const uint8_t> welcome);
// Constant-time comparison.
bool MacEqual(const Mac& a, const Mac& b);

}  // namespace rdmalock::auth
