#include "common/duration.h"

#include <cmath>
#include <initializer_list>
#include <limits>

namespace rdmalock {
namespace {

constexpr int64_t kNs = 1;
constexpr int64_t kUs = 1000 * kNs;
constexpr int64_t kMs = 1000 * kUs;
constexpr int64_t kS = 1000 * kMs;
constexpr int64_t kMin = 60 * kS;
constexpr int64_t kHour = 60 * kMin;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// The parts, appended in order: the messages are built this way rather than with
// "literal" + std::string, where GCC 12 at -O3 warns of an overlapping memcpy (-Wrestrict, a
// false positive that -Werror makes fatal; see docs/architecture.md).
std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (const std::string_view p : parts) s.append(p);
  return s;
}

// The value as a message quotes it: whole, or its first 40 characters and its length when it is
// longer than any duration (a message stays one readable line whatever was given).
std::string Quoted(std::string_view text) {
  constexpr size_t kShown = 40;
  if (text.size() <= 2 * kShown) return Cat({"\"", text, "\""});
  size_t cut = kShown;  // not inside a UTF-8 character
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return Cat({"\"", text.substr(0, cut), "...\" (", std::to_string(text.size()), " bytes)"});
}

// The unit at the front of `s` (longest match first: "ms" before "m"), its length in *len; 0 if
// none.
int64_t UnitAt(std::string_view s, size_t* len) {
  struct U {
    std::string_view name;
    int64_t ns;
  };
  static constexpr U kUnits[] = {{"ns", kNs}, {"us", kUs}, {"\xc2\xb5s", kUs}, {"ms", kMs},
                                 {"s", kS},   {"m", kMin}, {"h", kHour}};
  for (const U& u : kUnits) {
    if (s.substr(0, u.name.size()) == u.name) {
      // "m" must not be the start of another word ("min" is not a unit here).
      const std::string_view rest = s.substr(u.name.size());
      if (!rest.empty() && !IsDigit(rest[0]) && rest[0] != '.') continue;
      *len = u.name.size();
      return u.ns;
    }
  }
  return 0;
}

// A number at the front of `s`: integer digits, optionally '.' and fraction digits (at least one
// digit in all). Leaves the integer part in *whole (false if it overflows) and the fraction as
// digits/scale; returns the characters used (0: no number).
size_t NumberAt(std::string_view s, uint64_t* whole, bool* whole_ok, uint64_t* frac,
                double* scale) {
  size_t i = 0;
  *whole = 0;
  *whole_ok = true;
  *frac = 0;
  *scale = 1;
  size_t digits = 0;
  for (; i < s.size() && IsDigit(s[i]); ++i, ++digits) {
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (*whole > (std::numeric_limits<uint64_t>::max() - d) / 10) {
      *whole_ok = false;
    } else {
      *whole = *whole * 10 + d;
    }
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    for (; i < s.size() && IsDigit(s[i]); ++i, ++digits) {
      // Past 18 digits the fraction is far below a nanosecond of any unit: dropped.
      if (*scale < 1e18) {
        *frac = *frac * 10 + static_cast<uint64_t>(s[i] - '0');
        *scale *= 10;
      }
    }
  }
  return digits == 0 ? 0 : i;
}

Status NotADuration(std::string_view text, DurationUnit bare) {
  return Error(ErrorCode::kInvalidArgument,
               Cat({Quoted(text), " is not a duration (examples: 500ms, 10s, 2m, or ",
                    BareUnitHint(bare), ")"}));
}

// v * unit + frac/scale * unit, into *out; false on overflow of int64.
bool Combine(uint64_t whole, bool whole_ok, uint64_t frac, double scale, int64_t unit,
             int64_t* out) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!whole_ok || whole > kMax) return false;
  int64_t v = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(whole), unit, &v)) return false;
  // The fraction as Go's time.ParseDuration takes it: unit / scale first, exact for every unit
  // and any fraction of up to 9 digits of seconds.
  const double f = static_cast<double>(frac) * (static_cast<double>(unit) / scale);
  if (!(f < 9.2e18)) return false;
  const auto fn = static_cast<int64_t>(f);
  if (__builtin_add_overflow(v, fn, &v)) return false;
  *out = v;
  return true;
}

// Whole and fraction digits of v / unit, trailing zeros dropped: "1.5", "250".
std::string Decimal(uint64_t v, uint64_t unit) {
  std::string s = std::to_string(v / unit);
  uint64_t rem = v % unit;
  if (rem == 0) return s;
  std::string frac;
  for (uint64_t d = unit / 10; d > 0; d /= 10) {
    frac += static_cast<char>('0' + rem / d);
    rem %= d;
  }
  while (!frac.empty() && frac.back() == '0') frac.pop_back();
  return s + "." + frac;
}

}  // namespace

int64_t NanosPerUnit(DurationUnit unit) {
  switch (unit) {
    case DurationUnit::kMicroseconds:
      return kUs;
    case DurationUnit::kMilliseconds:
      return kMs;
    case DurationUnit::kSeconds:
      return kS;
  }
  return kMs;
}

std::string BareUnitHint(DurationUnit bare) {
  switch (bare) {
    case DurationUnit::kMicroseconds:
      return "microseconds as a number";
    case DurationUnit::kMilliseconds:
      return "milliseconds as a number";
    case DurationUnit::kSeconds:
      return "seconds as a number";
  }
  return "a number";
}

Result<int64_t> ParseDurationNs(std::string_view text, DurationUnit bare) {
  if (text.empty()) {
    return Error(ErrorCode::kInvalidArgument,
                 "empty, not a duration (examples: 500ms, 10s, 2m, or " + BareUnitHint(bare) + ")");
  }
  if (text[0] == '-') {
    // Say why rather than "not a duration" when the rest would have been one. One '-' only:
    // recursing once per '-' overflowed the stack on a value of many (found by review).
    if (text.size() > 1 && text[1] != '-' && ParseDurationNs(text.substr(1), bare).ok()) {
      return Error(ErrorCode::kInvalidArgument,
                   Cat({Quoted(text), " is negative: a duration is 0 or more"}));
    }
    return NotADuration(text, bare);
  }
  const auto too_large = [&] {
    return Error(ErrorCode::kInvalidArgument,
                 Cat({Quoted(text), " is too large for a duration (at most ",
                      FormatDuration(kHour * 2'562'047), ")"}));
  };
  int64_t total = 0;
  std::string_view rest = text;
  bool first = true;
  while (!rest.empty()) {
    uint64_t whole = 0, frac = 0;
    bool whole_ok = true;
    double scale = 1;
    const size_t n = NumberAt(rest, &whole, &whole_ok, &frac, &scale);
    if (n == 0) return NotADuration(text, bare);
    rest.remove_prefix(n);
    size_t ulen = 0;
    int64_t unit = UnitAt(rest, &ulen);
    if (unit == 0) {
      // A plain number only as the whole text: "1m30" is a mistake, not 1 minute and 30 ms.
      if (!first || !rest.empty()) return NotADuration(text, bare);
      unit = NanosPerUnit(bare);
    }
    rest.remove_prefix(ulen);
    int64_t part = 0;
    if (!Combine(whole, whole_ok, frac, scale, unit, &part)) return too_large();
    if (__builtin_add_overflow(total, part, &total)) return too_large();
    first = false;
  }
  return total;
}

Result<int64_t> ParseDurationIn(std::string_view text, DurationUnit unit, int64_t lo, int64_t hi) {
  auto ns = ParseDurationNs(text, unit);
  if (!ns.ok()) return ns.status();
  const int64_t per = NanosPerUnit(unit);
  int64_t lo_ns = 0, hi_ns = 0;
  if (__builtin_mul_overflow(lo, per, &lo_ns)) lo_ns = std::numeric_limits<int64_t>::max();
  if (__builtin_mul_overflow(hi, per, &hi_ns)) hi_ns = std::numeric_limits<int64_t>::max();
  if (*ns < lo_ns || *ns > hi_ns) {
    const std::string range =
        lo == hi ? Cat({"must be ", FormatDuration(lo_ns)})
                 : Cat({"between ", FormatDuration(lo_ns), " and ", FormatDuration(hi_ns)});
    return Error(ErrorCode::kInvalidArgument, Cat({Quoted(text), " is out of range: ", range}));
  }
  if (*ns % per != 0) {
    const char* name = unit == DurationUnit::kMicroseconds   ? "microseconds"
                       : unit == DurationUnit::kMilliseconds ? "milliseconds"
                                                             : "seconds";
    return Error(ErrorCode::kInvalidArgument,
                 Cat({Quoted(text), " is not a whole number of ", name}));
  }
  return *ns / per;
}

std::string FormatDuration(int64_t ns) {
  if (ns == 0) return "0s";
  std::string sign = ns < 0 ? "-" : "";
  // Through uint64: -INT64_MIN does not fit int64.
  const uint64_t u = ns < 0 ? uint64_t{0} - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  if (u < static_cast<uint64_t>(kUs)) return sign + std::to_string(u) + "ns";
  if (u < static_cast<uint64_t>(kMs)) return sign + Decimal(u, kUs) + "us";
  if (u < static_cast<uint64_t>(kS)) return sign + Decimal(u, kMs) + "ms";
  const uint64_t h = u / kHour, m = u % kHour / kMin, rest = u % kMin;
  std::string out = sign;
  if (h > 0) out += std::to_string(h) + "h";
  if (m > 0) out += std::to_string(m) + "m";
  if (rest > 0) out += Decimal(rest, kS) + "s";
  return out;
}

}  // namespace rdmalock
