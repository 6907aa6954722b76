// What a session has learned of its slots' generations (the low 32 bits of word1's), so that a
// request's record entry can be tagged without a READ of word1 (docs/protocol.md, sections 10
// and 11: lockd acts on a tagged entry only in its generation, and a tagged exclusive release
// writes no done mark). One per LockEngine, so one per
// session with lockd: a new session (a lockd restart zeroes its lock table) starts empty.
//
// Thread-safety: lock-free, any thread. Each entry is a seqlock of two atomic words: `a` holds the
// slot and a sequence that is odd while a writer fills `b`; a reader that sees `a` change (or odd)
// under it takes a miss. No standalone fences (ThreadSanitizer does not model them): `b` is
// stored with release and loaded with acquire. Two writers of one entry at once: the second drops
// its learning (a hint, nothing more). The entries are allocated by the first Learn (lockd's
// recovery engine and clients that record nothing never do).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "rdmalock/proto/layout.h"

namespace rdmalock {

class GenerationTable {
 public:
  using Clock = std::chrono::steady_clock;

  // Direct-mapped by slot; lockd's default lock table (65,536 slots) fits whole, in 1 MiB.
  static constexpr uint64_t kMaxEntries = uint64_t{1} << 16;

  // What a session saw on a slot: `generation`, and `tickets` (max_x + max_s) before the FA of
  // the request that learned it (or as a READ saw them), posted at `at`. Generations only grow, so
  // a hint is never newer than the slot's generation at any later time.
  struct Hint {
    uint32_t generation = 0;
    uint32_t tickets = 0;  // kept up to 65,535 (more is kept as that: a stricter check)
    Clock::time_point at{};
  };
  // How long ago (by `now`) a hint Find returned was learned. Kept to about a millisecond, and
  // modulo about 69 s: a hint older than that may pass for a younger one (see kTimeBits).
  static Clock::duration Age(const Hint& h, Clock::time_point now) {
    return Clock::duration(
        static_cast<Clock::rep>(((Ticks(now) - Ticks(h.at)) & kTimeMask) << kTickShift));
  }

  explicit GenerationTable(uint64_t lock_count)
      : size_(lock_count < kMaxEntries ? (lock_count == 0 ? 1 : lock_count) : kMaxEntries) {}
  ~GenerationTable() { delete[] entries_.load(std::memory_order_acquire); }
  GenerationTable(const GenerationTable&) = delete;
  GenerationTable& operator=(const GenerationTable&) = delete;

  // The slot's hint, if this session has one (and no writer is filling its entry right now). Its
  // `at` keeps only the time's low bits: read it with Age(), not directly.
  bool Find(uint64_t slot, Hint* out) const {
    const Entry* es = entries_.load(std::memory_order_acquire);
    if (es == nullptr) return false;
    const Entry& e = es[slot % size_];
    const uint64_t a = e.a.load(std::memory_order_acquire);
    if ((a & kWriting) != 0 || SlotOf(a) != slot) return false;
    // Acquire: the second load of `a` comes after it. If it saw a writer's `b`, that writer's
    // odd `a` (stored before its release store of `b`) is visible to the second load.
    const uint64_t b = e.b.load(std::memory_order_acquire);
    if (e.a.load(std::memory_order_relaxed) != a) return false;
    out->generation = static_cast<uint32_t>(b >> 32);
    out->tickets = static_cast<uint32_t>((b >> kTimeBits) & 0xffff);
    out->at =
        Clock::time_point(Clock::duration(static_cast<Clock::rep>((b & kTimeMask) << kTickShift)));
    return true;
  }

  void Learn(uint64_t slot, const Hint& h) { Store(slot, h, true); }
  // The slot's hint is no longer to be trusted (its word was reset since): the next request
  // there reads word1.
  void Forget(uint64_t slot) { Store(slot, Hint{}, false); }

 private:
  struct Entry {
    std::atomic<uint64_t> a{0};  // seq << kSlotBits | (slot + 1); 0: never written
    std::atomic<uint64_t> b{0};  // generation << 32 | tickets << kTimeBits | time
  };
  static constexpr int kSlotBits = 30;  // slot + 1, slots below kMaxLockCount (2^28)
  static constexpr uint64_t kSlotMask = (uint64_t{1} << kSlotBits) - 1;
  static constexpr uint64_t kWriting = uint64_t{1} << kSlotBits;  // the seq's low bit
  static_assert(proto::kMaxLockCount < kSlotMask, "a slot + 1 must fit below the seq");
  // `at` in units of 2^20 ns (about 1 ms), 16 bits: it wraps after about 69 s. A hint older than
  // that may pass for a recent one; the engine's other check (the FA's count) still applies, and
  // a wrong hint costs only fast recovery (LockEngine::AcquireImpl), never safety.
  static constexpr int kTimeBits = 16;
  static constexpr uint64_t kTimeMask = (uint64_t{1} << kTimeBits) - 1;
  static constexpr int kTickShift = 20;

  static uint64_t SlotOf(uint64_t a) { return (a & kSlotMask) - 1; }
  static uint64_t Ticks(Clock::time_point t) {
    return static_cast<uint64_t>(t.time_since_epoch().count()) >> kTickShift;
  }

  void Store(uint64_t slot, const Hint& h, bool known) {
    Entry* es = entries_.load(std::memory_order_acquire);
    if (es == nullptr) {
      if (!known) return;
      auto* fresh = new Entry[size_];
      if (entries_.compare_exchange_strong(es, fresh, std::memory_order_acq_rel)) {
        es = fresh;
      } else {
        delete[] fresh;  // another thread's went in first (`es` is it now)
      }
    }
    Entry& e = es[slot % size_];
    uint64_t a = e.a.load(std::memory_order_relaxed);
    if ((a & kWriting) != 0) return;          // another writer: drop this one
    if (!known && SlotOf(a) != slot) return;  // holds another slot's hint, or none
    const uint64_t seq = a >> kSlotBits;
    if (!e.a.compare_exchange_strong(a, ((seq + 1) << kSlotBits) | (a & kSlotMask),
                                     std::memory_order_relaxed)) {
      return;
    }
    e.b.store((uint64_t{h.generation} << 32) |
                  (uint64_t{std::min<uint32_t>(h.tickets, 0xffff)} << kTimeBits) |
                  (Ticks(h.at) & kTimeMask),
              std::memory_order_release);  // after the odd `a`, for Find's second load
    e.a.store(((seq + 2) << kSlotBits) | (known ? slot + 1 : 0), std::memory_order_release);
  }

  const uint64_t size_;
  std::atomic<Entry*> entries_{nullptr};
};

}  // namespace rdmalock
