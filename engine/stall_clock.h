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
//
// The frozen-word rescue (kTickets) also counts a ticket taken since as progress: a max field that
// moved and stayed, seen by two READs in a row. Its reset wipes word0 whole, so a request granted
// at once since its timer began (the word unfrozen for it by a withdrawal, then frozen again) would
// be wiped while it holds, with nothing else moved (found by review, 2026-12-07). A max field seen
// moved by one READ only is a request that bounced off the frozen word, not a ticket: that READ
// decides nothing (Note says progress), and the clock goes on. Max fields are compared up to
// kCountMax (a bounce on the frozen field goes above it). Not every new ticket shows: withdrawals
// in its field can bring word0 back to the timed value. Since 2026-12-07 a frozen word never
// thaws before its reset (the ticket that froze it is never withdrawn, LockEngine::GiveUpTicket),
// so no ticket is taken while the rescue times a frozen word; this rule stays for words that SDKs
// built before then can thaw (docs/protocol.md section 5).
class WordView {
 public:
  enum class Watch { kCounters, kTickets };
  explicit WordView(Watch watch = Watch::kCounters) : watch_(watch) {}

  // Notes a READ's view, completed at `done`. Returns true if it changed (progress), or (kTickets)
  // if its max fields differ from the view's, which the next READ decides.
  bool Note(proto::Word0 w0, uint64_t w1, std::chrono::steady_clock::time_point done) {
    const uint16_t mx = Clamp(w0.max_x), ms = Clamp(w0.max_s);
    if (valid_ && n_x_ == w0.n_x && n_s_ == w0.n_s && word1_ == w1) {
      if (watch_ == Watch::kCounters || (max_x_ == mx && max_s_ == ms)) {
        pending_ = false;
        clock_.Again(done);
        return false;
      }
      if (!pending_ || pending_x_ != mx || pending_s_ != ms) {  // seen once: a bounce, maybe
        pending_ = true;
        pending_x_ = mx;
        pending_s_ = ms;
        return true;
      }
      // Seen twice in a row: a ticket taken since. The new view is timed from the next READ that
      // shows it again (StallClock).
    }
    *this = WordView{watch_};
    valid_ = true;
    n_x_ = w0.n_x;
    n_s_ = w0.n_s;
    max_x_ = mx;
    max_s_ = ms;
    word1_ = w1;
    return true;
  }
  bool StalledFor(std::chrono::steady_clock::time_point now,
                  std::chrono::nanoseconds timeout) const {
    return clock_.StalledFor(now, timeout);
  }
  void Forget() { *this = WordView{watch_}; }  // something moved: time the stall again

 private:
  static uint16_t Clamp(uint16_t max) {
    return max < proto::kCountMax ? max : static_cast<uint16_t>(proto::kCountMax);
  }

  Watch watch_;
  bool valid_ = false;
  uint16_t n_x_ = 0, n_s_ = 0;
  uint16_t max_x_ = 0, max_s_ = 0;  // kTickets only
  uint64_t word1_ = 0;
  bool pending_ = false;  // kTickets: max fields seen moved by the last READ only
  uint16_t pending_x_ = 0, pending_s_ = 0;
  StallClock clock_;
};

}  // namespace rdmalock::engine_internal
