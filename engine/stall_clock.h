// How long a waiter has seen one view of a lock word (engine_internal::StallClock).
// Threading: a value type, owned by the one waiter, reaper or lockd step that uses it.
#pragma once

#include <chrono>
#include <cstdint>

#include "rdmalock/proto/lock_word.h"

namespace rdmalock::engine_internal {

// Stall time of one view of a slot (a waiter's, the frozen-word rescue's, a reaper's): from the
// second READ in a row that shows the view, not the first. A torn READ can show a value the word
// reaches only later (a byte from after a carry; docs/protocol.md, torn READs), and stall time
// counted from it would start before a grant made after that READ: the waiter could recover the
// lock under a holder granted less than F x L before. Two READs in a row show the same view only
// if the word held it by the second's end (its counters only grow between resets, so a second
// torn copy cannot mix into the same future value).
class StallClock {
 public:
  // The view was shown again by a READ that completed at `done`.
  void Again(std::chrono::steady_clock::time_point done) {
    if (!confirmed_) {
      confirmed_ = true;
      since_ = done;
    }
  }
  // True once the view, confirmed, has stood for `timeout`.
  bool StalledFor(std::chrono::steady_clock::time_point now,
                  std::chrono::nanoseconds timeout) const {
    return confirmed_ && now - since_ >= timeout;
  }

 private:
  bool confirmed_ = false;
  std::chrono::steady_clock::time_point since_;
};

// What a waiter (or the frozen-word rescue, or a reaper's step) last saw of a slot, and its stall
// clock: progress is any change of (nX, nS, word1).
class WordView {
 public:
  // Notes a READ's view, completed at `done`. Returns true if it changed (progress).
  bool Note(proto::Word0 w0, uint64_t w1, std::chrono::steady_clock::time_point done) {
    if (valid_ && n_x_ == w0.n_x && n_s_ == w0.n_s && word1_ == w1) {
      clock_.Again(done);
      return false;
    }
    *this = WordView{};
    valid_ = true;
    n_x_ = w0.n_x;
    n_s_ = w0.n_s;
    word1_ = w1;
    return true;
  }
  bool StalledFor(std::chrono::steady_clock::time_point now,
                  std::chrono::nanoseconds timeout) const {
    return clock_.StalledFor(now, timeout);
  }
  void Forget() { *this = WordView{}; }  // something moved: time the stall again

 private:
  bool valid_ = false;
  uint16_t n_x_ = 0, n_s_ = 0;
  uint64_t word1_ = 0;
  StallClock clock_;
};

}  // namespace rdmalock::engine_internal
