// Little-endian field access for fixed-size wire structures. Every structure that crosses the
// network is encoded through these, never by copying a C++ struct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace rdmalock::proto {

inline void PutLe(std::span<uint8_t> buf, size_t off, uint64_t v, size_t width) {
  for (size_t i = 0; i < width; ++i) buf[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t GetLe(std::span<const uint8_t> buf, size_t off, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= uint64_t{buf[off + i]} << (8 * i);
  return v;
}

// A fixed-width, NUL-padded text field. Text longer than the field is cut.
inline void PutText(std::span<uint8_t> buf, size_t off, size_t width, std::string_view s) {
  std::memset(buf.data() + off, 0, width);
  std::memcpy(buf.data() + off, s.data(), s.size() < width ? s.size() : width);
}
// Reads a fixed-width text field, stopping at the first NUL; non-printable bytes become '?'.
inline std::string GetText(std::span<const uint8_t> buf, size_t off, size_t width) {
  std::string out;
  for (size_t i = 0; i < width && buf[off + i] != 0; ++i) {
    const uint8_t c = buf[off + i];
    out.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
  }
  return out;
}

}  // namespace rdmalock::proto
