// RefusalLog: decides which handshake refusals lockd logs, so that a peer retrying in a loop (or
// many peers) cannot flood the log: at most one line a second per (address, reason).
//
// Threading: owned by lockd's event-loop thread; not thread-safe (no mutex). Pure: the caller
// passes the time, so it is unit-tested without verbs (tests/unit/admission_test.cc).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <unordered_map>

namespace rdmalock::lockd {

class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;

  // At most `max_tracked` (address, reason) keys are remembered; past that the table is forgotten
  // (bounded memory whatever the number of source addresses).
  explicit RefusalLog(size_t max_tracked) : max_tracked_(max_tracked) {}

  // True if a refusal of `key` at `now` should be logged (and remembers it as logged).
  bool ShouldLog(const std::string& key, Clock::time_point now) {
    if (auto it = logged_.find(key); it != logged_.end()) {
      if (now - it->second < std::chrono::seconds(1)) return false;
      it->second = now;
      return true;
    }
    if (logged_.size() >= max_tracked_) {
      // Full: forget the keys whose second is over (they would be logged anyway); if every key
      // is recent (a flood from many addresses), forget them all. Never erase under a live
      // iterator: the new key is inserted after.
      std::erase_if(logged_,
                    [&](const auto& kv) { return now - kv.second >= std::chrono::seconds(1); });
      if (logged_.size() >= max_tracked_) logged_.clear();
    }
    logged_.emplace(key, now);
    return true;
  }

  size_t tracked() const { return logged_.size(); }

 private:
  const size_t max_tracked_;
  std::unordered_map<std::string, Clock::time_point> logged_;  // when each key was last logged
};

}  // namespace rdmalock::lockd
