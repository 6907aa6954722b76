// Decimal integer options for CLI11. Debian 12's CLI11 (2.1.2) converts an integer option's text
// with strtoll/strtoull in base 0, so "010" is 8 and "0x10" is 16, while its range checks
// (CLI::Range, CLI::NonNegativeNumber) read the same text as a decimal number and pass it: a
// script's zero-padded "lockctl release --force --slot 010" fenced the holder of slot 8. Every
// integer option of lockd and lockctl takes Decimal() as a transform: its text must be decimal
// digits, at most INT64_MAX, and leading zeros are dropped before CLI11 converts it.
// Header-only; stateless.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <string_view>

namespace rdmalock {

inline CLI::Validator Decimal() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
          return "'" + text + "' is not a decimal number (digits 0-9 only)";
        }
        text.erase(0, std::min(text.find_first_not_of('0'), text.size() - 1));
        // CLI11's strtoll saturates past int64 without an error: --slot 99999999999999999999 was
        // slot 9223372036854775807 (found by review, 2026-12-07). Same length: decimal digits
        // compare as text.
        static constexpr std::string_view kMax = "9223372036854775807";
        if (text.size() > kMax.size() || (text.size() == kMax.size() && text > kMax)) {
          return "'" + text + "' is out of range (at most " + std::string(kMax) + ")";
        }
        return {};
      },
      "", "decimal");
}

}  // namespace rdmalock
