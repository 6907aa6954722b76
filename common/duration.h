// Durations as people write them: "500ms", "10s", "2m", "1h", "250us", "1.5s", "1m30s", or a
// plain number in the unit the flag or key has always counted in (milliseconds for most, seconds
// for bench's --duration, microseconds for --hold-us). One parser for lockctl's and lockd's flags
// and for both YAML files (lockd.yaml, client.yaml), so that every time value reads the same way
// and a bad one is refused with the same short message, never a raw range with a 309-digit bound.
//
// Threading: pure functions over their arguments, no state; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rdmalock/status.h"

namespace rdmalock {

// The unit a plain number is in (what the flag or key counted before units were accepted), and
// the unit a whole count is returned in.
enum class DurationUnit { kMicroseconds, kMilliseconds, kSeconds };

// Nanoseconds in one `unit`.
int64_t NanosPerUnit(DurationUnit unit);

// Parses `text` into nanoseconds. Accepted: one or more <number><unit> pairs (units ns, us, µs,
// ms, s, m, h; the number may have a fraction: "1.5s"; "1m30s" adds up), or one plain number
// (digits, an optional fraction) taken in `bare`. Refused, with kInvalidArgument and a message
// that quotes `text` and gives examples (the caller prefixes the flag's or key's name): anything
// else, including a sign ("-5s" says it is negative), spaces inside, exponents, and a value
// beyond what int64 nanoseconds hold (about 292 years). A fraction finer than a nanosecond is
// dropped.
[[nodiscard]] Result<int64_t> ParseDurationNs(std::string_view text, DurationUnit bare);

// ParseDurationNs, as a whole count of `unit` in [lo, hi] (both in `unit`). Also refuses a value
// that is not a whole number of `unit` ("2000us" is fine for milliseconds, "1.2ms" is not: the
// flag or key cannot hold it, and rounding it silently would run with a value nobody wrote), and
// one out of range, naming the range in readable units ("between 50ms and 1h").
[[nodiscard]] Result<int64_t> ParseDurationIn(std::string_view text, DurationUnit unit, int64_t lo,
                                              int64_t hi);

// A duration for people: the largest units that say it exactly, "1h30m", "1.5s", "250ms", "0s".
// Negative values get a leading '-'.
std::string FormatDuration(int64_t ns);

// The examples the error messages give for a plain number in `bare` ("milliseconds as a number").
std::string BareUnitHint(DurationUnit bare);

}  // namespace rdmalock
