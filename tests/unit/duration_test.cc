// common/duration: durations as people write them, and plain numbers in the unit a flag or key
// has always counted (issue 20, item 4).
#include "common/duration.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>

namespace {

using rdmalock::DurationUnit;
using rdmalock::FormatDuration;
using rdmalock::ParseDurationIn;
using rdmalock::ParseDurationNs;

constexpr int64_t kUs = 1000, kMs = 1000 * kUs, kS = 1000 * kMs, kMin = 60 * kS, kH = 60 * kMin;

int64_t Ns(const std::string& s, DurationUnit bare = DurationUnit::kMilliseconds) {
  auto r = ParseDurationNs(s, bare);
  INFO(s << ": " << (r.ok() ? std::string("ok") : r.status().message()));
  REQUIRE(r.ok());
  return *r;
}

std::string Err(const std::string& s, DurationUnit bare = DurationUnit::kMilliseconds) {
  auto r = ParseDurationNs(s, bare);
  INFO(s);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == rdmalock::ErrorCode::kInvalidArgument);
  return r.status().message();
}

}  // namespace

TEST_CASE("duration: every unit, with and without a fraction", "[duration]") {
  CHECK(Ns("7ns") == 7);
  CHECK(Ns("250us") == 250 * kUs);
  CHECK(Ns("250\xc2\xb5s") == 250 * kUs);  // µs
  CHECK(Ns("500ms") == 500 * kMs);
  CHECK(Ns("10s") == 10 * kS);
  CHECK(Ns("2m") == 2 * kMin);
  CHECK(Ns("1h") == kH);
  CHECK(Ns("1.5s") == 1500 * kMs);
  CHECK(Ns("0.1s") == 100 * kMs);
  CHECK(Ns(".5s") == 500 * kMs);
  CHECK(Ns("1.25ms") == 1250 * kUs);
  CHECK(Ns("0.123456789s") == 123456789);
  CHECK(Ns("1.5h") == 90 * kMin);
  CHECK(Ns("1m30s") == 90 * kS);
  CHECK(Ns("1h2m3s4ms") == kH + 2 * kMin + 3 * kS + 4 * kMs);
  CHECK(Ns("0s") == 0);
  CHECK(Ns("0") == 0);
}

TEST_CASE("duration: a plain number is in the flag's own unit", "[duration]") {
  CHECK(Ns("60000", DurationUnit::kMilliseconds) == 60 * kS);
  CHECK(Ns("5", DurationUnit::kSeconds) == 5 * kS);
  CHECK(Ns("0.5", DurationUnit::kSeconds) == 500 * kMs);
  CHECK(Ns("100", DurationUnit::kMicroseconds) == 100 * kUs);
  CHECK(Ns("007", DurationUnit::kMilliseconds) == 7 * kMs);
}

TEST_CASE("duration: bad forms say what was given and give examples", "[duration]") {
  const std::string m = Err("60x");
  CHECK(m == "\"60x\" is not a duration (examples: 500ms, 10s, 2m, or milliseconds as a number)");
  CHECK(Err("10 s").find("is not a duration") != std::string::npos);
  CHECK(Err("s").find("is not a duration") != std::string::npos);
  CHECK(Err("1min").find("is not a duration") != std::string::npos);
  CHECK(Err("1e3").find("is not a duration") != std::string::npos);
  CHECK(Err("+5s").find("is not a duration") != std::string::npos);
  CHECK(Err("1m30").find("is not a duration") != std::string::npos);  // 30 what?
  CHECK(Err("1..5s").find("is not a duration") != std::string::npos);
  CHECK(Err("5S").find("is not a duration") != std::string::npos);
  CHECK(Err(" 5s").find("is not a duration") != std::string::npos);
  CHECK(Err("5s ").find("is not a duration") != std::string::npos);
  CHECK(Err(".s").find("is not a duration") != std::string::npos);
  CHECK(Err("").find("empty") != std::string::npos);
  CHECK(Err("x", DurationUnit::kSeconds).find("or seconds as a number") != std::string::npos);
  CHECK(Err("x", DurationUnit::kMicroseconds).find("or microseconds as a number") !=
        std::string::npos);
}

TEST_CASE("duration: negative values are refused as negative", "[duration]") {
  CHECK(Err("-5s") == "\"-5s\" is negative: a duration is 0 or more");
  CHECK(Err("-1") == "\"-1\" is negative: a duration is 0 or more");
  CHECK(Err("-x").find("is not a duration") != std::string::npos);
}

// Each leading '-' recursed once, building its own message: a value of many '-' (a YAML key, a
// flag, a SIGHUP's reload) overflowed the stack and crashed lockd or lockctl (found by review,
// 2026-12-06). It is refused as not a duration, at once.
TEST_CASE("duration: a value of many leading '-' is refused, not a crash", "[duration]") {
  const std::string many = std::string(200'000, '-') + "1s";
  const std::string e = Err(many);
  CHECK(e.find("is not a duration") != std::string::npos);
  CHECK(Err("--5s").find("is not a duration") != std::string::npos);
  CHECK(e.size() < 1000);  // the value is named, not all of it
}

TEST_CASE("duration: values beyond int64 nanoseconds are refused, not wrapped", "[duration]") {
  CHECK(Ns("2562047h") == 2562047 * kH);
  CHECK(Err("2562048h").find("too large") != std::string::npos);
  CHECK(Err("9223372036854775808ns").find("too large") != std::string::npos);
  CHECK(Ns("9223372036854775807ns") == std::numeric_limits<int64_t>::max());
  CHECK(Err(std::string(309, '9')).find("too large") != std::string::npos);
  CHECK(Err(std::string(400, '9') + "h").find("too large") != std::string::npos);
  CHECK(Err("2562047h2562047h").find("too large") != std::string::npos);  // the sum overflows
  CHECK(Err("9223372036854775807ns1ns").find("too large") != std::string::npos);
  // A long fraction is dropped below a nanosecond, not an overflow.
  CHECK(Ns("1." + std::string(300, '0') + "1s") == kS);
}

TEST_CASE("duration: a whole count of the flag's unit within its range", "[duration]") {
  using U = DurationUnit;
  CHECK(*ParseDurationIn("60s", U::kMilliseconds, 0, 3'600'000) == 60000);
  CHECK(*ParseDurationIn("60000", U::kMilliseconds, 0, 3'600'000) == 60000);
  CHECK(*ParseDurationIn("2000us", U::kMilliseconds, 0, 10000) == 2);
  CHECK(*ParseDurationIn("2m", U::kSeconds, 2, 600) == 120);
  CHECK(*ParseDurationIn("1ms", U::kMicroseconds, 0, 1'000'000) == 1000);
  auto frac = ParseDurationIn("1.2ms", U::kMilliseconds, 0, 10000);
  REQUIRE_FALSE(frac.ok());
  CHECK(frac.status().message() == "\"1.2ms\" is not a whole number of milliseconds");
  CHECK_FALSE(ParseDurationIn("1500us", U::kMilliseconds, 0, 10000).ok());
  CHECK_FALSE(ParseDurationIn("1.5", U::kMilliseconds, 0, 10000).ok());
  auto high = ParseDurationIn("2h", U::kMilliseconds, 50, 3'600'000);
  REQUIRE_FALSE(high.ok());
  CHECK(high.status().message() == "\"2h\" is out of range: between 50ms and 1h");
  auto low = ParseDurationIn("10ms", U::kMilliseconds, 50, 3'600'000);
  REQUIRE_FALSE(low.ok());
  CHECK(low.status().message() == "\"10ms\" is out of range: between 50ms and 1h");
  // A huge bound (a flag that takes anything) does not overflow the check.
  CHECK(*ParseDurationIn("5s", U::kMilliseconds, 0, std::numeric_limits<int64_t>::max()) == 5000);
}

TEST_CASE("duration: formatted for people", "[duration]") {
  CHECK(FormatDuration(0) == "0s");
  CHECK(FormatDuration(7) == "7ns");
  CHECK(FormatDuration(250 * kUs) == "250us");
  CHECK(FormatDuration(1500 * kUs) == "1.5ms");
  CHECK(FormatDuration(500 * kMs) == "500ms");
  CHECK(FormatDuration(1500 * kMs) == "1.5s");
  CHECK(FormatDuration(90 * kS) == "1m30s");
  CHECK(FormatDuration(kH) == "1h");
  CHECK(FormatDuration(kH + 1 * kS + 5 * kMs) == "1h1.005s");
  CHECK(FormatDuration(-2 * kS) == "-2s");
  CHECK(FormatDuration(std::numeric_limits<int64_t>::min()).front() == '-');
  // What FormatDuration prints parses back to the same value.
  for (const int64_t v : {int64_t{1}, 999 * kUs, 1234567 * kUs, 3 * kH + 7 * kMin + 9 * kMs,
                          std::numeric_limits<int64_t>::max()}) {
    CHECK(Ns(FormatDuration(v)) == v);
  }
}
