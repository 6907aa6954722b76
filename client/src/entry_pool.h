// The request entries of one session record, handed out to requests and back (the SDK's side of
// docs/protocol.md §10). Thread-safe and lock-free: any of a session's threads takes and gives
// entries, so the pool is on every thread's acquire path and must not serialise them (issue 19).
// Which entries are free is a bitmap of atomic words; an entry's seq belongs to whoever holds the
// entry (its bit clear), and passes to the next taker through the bitmap's release/acquire.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <utility>

#include "rdmalock/proto/layout.h"

namespace rdmalock {

class EntryPool {
 public:
  // The record at byte `record_offset` of the session table, with its first `entries` entries.
  EntryPool(uint64_t record_offset, uint32_t entries)
      : base_(record_offset),
        entries_(entries),
        words_((entries + 63) / 64),
        free_(std::make_unique<std::atomic<uint64_t>[]>(words_ == 0 ? 1 : words_)),
        seq_(std::make_unique<std::atomic<uint32_t>[]>(entries == 0 ? 1 : entries)) {
    for (uint32_t i = 0; i < entries; ++i) free_[i / 64].fetch_or(uint64_t{1} << (i % 64));
  }

  uint64_t record_offset() const { return base_; }

  // An entry's offset in the session table and a new seq for this use, or offset 0 when every
  // entry is in use (the request then goes unrecorded).
  std::pair<uint64_t, uint32_t> Take() {
    for (uint32_t w = 0; w < words_; ++w) {
      uint64_t v = free_[w].load(std::memory_order_relaxed);
      while (v != 0) {
        const uint32_t bit = static_cast<uint32_t>(std::countr_zero(v));
        if (free_[w].compare_exchange_weak(v, v & ~(uint64_t{1} << bit), std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
          const uint32_t i = w * 64 + bit;
          const uint32_t seq =
              proto::RequestEntry::NextSeq(seq_[i].load(std::memory_order_relaxed));
          seq_[i].store(seq, std::memory_order_relaxed);
          return {base_ + proto::SessionRecord::EntryOffset(i), seq};
        }
      }
    }
    return {0, 0};
  }

  // Hands an entry back; offsets outside this record are ignored.
  void Give(uint64_t entry) {
    const uint64_t first = base_ + proto::SessionRecord::kEntries;
    if (entry < first || entry >= base_ + proto::kSessionRecordSize) return;
    const auto i = static_cast<uint32_t>((entry - first) / proto::SessionRecord::kEntrySize);
    if (i >= entries_) return;
    free_[i / 64].fetch_or(uint64_t{1} << (i % 64), std::memory_order_release);
  }

 private:
  const uint64_t base_;
  const uint32_t entries_;
  const uint32_t words_;
  const std::unique_ptr<std::atomic<uint64_t>[]> free_;  // bit i % 64 of word i / 64: entry i free
  const std::unique_ptr<std::atomic<uint32_t>[]> seq_;   // the last seq each entry was used with
};

}  // namespace rdmalock
