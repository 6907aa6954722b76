// The slots a session's requests bounced off, frozen (docs/protocol.md, section 5): a request on
// a marked slot READs the word until it thaws before it FETCH_AND_ADDs, so that a loop of
// separate calls (a try-lock loop) bounces off one freeze once, not once per call. Each bounce may
// leave its increment in the word (a withdrawal that comes late, LockEngine::WithdrawFrozen), and
// 32,768 of them in one freeze would carry the frozen field into the next.
//
// One per LockEngine, so one per session. Direct-mapped by slot: kEntries entries, each the
// marked slot + 1 (0: none). A mark that another slot's overwrites is lost: its next request
// FETCH_AND_ADDs, bounces and marks again (one more bounce, as before marks existed); so is a
// mark cleared by a request whose READ saw the word thawed just before it froze again. Neither
// is unsafe; both only loosen the bound from one bounce per freeze towards one per call.
//
// Thread-safety: lock-free, any thread. Each entry is one atomic word; Clear removes only the
// slot it is given (compare-exchange).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace rdmalock {

class FrozenMarks {
 public:
  // Words freeze once in 32,768 tickets, so a session seldom sees more than one at a time.
  static constexpr uint64_t kEntries = 64;

  FrozenMarks() = default;
  FrozenMarks(const FrozenMarks&) = delete;
  FrozenMarks& operator=(const FrozenMarks&) = delete;

  // One relaxed load: on the path of every request.
  bool Marked(uint64_t slot) const {
    return entries_[slot % kEntries].load(std::memory_order_relaxed) == slot + 1;
  }
  void Mark(uint64_t slot) { entries_[slot % kEntries].store(slot + 1, std::memory_order_relaxed); }
  void Clear(uint64_t slot) {
    uint64_t mine = slot + 1;
    entries_[slot % kEntries].compare_exchange_strong(mine, 0, std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<uint64_t>, kEntries> entries_{};
};

}  // namespace rdmalock
