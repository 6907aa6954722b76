// The request entries of one session record, handed out to requests and back (the SDK's side of
// docs/protocol.md §10). Thread-safe: any of a session's threads takes and gives entries; mu_
// guards which are free and their seqs.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/sync/mutex.h"
#include "common/sync/thread_annotations.h"
#include "rdmalock/proto/layout.h"

namespace rdmalock {

class EntryPool {
 public:
  // The record at byte `record_offset` of the session table, with its first `entries` entries.
  EntryPool(uint64_t record_offset, uint32_t entries) : base_(record_offset), seq_(entries, 0) {
    free_.reserve(entries);
    for (uint32_t i = entries; i > 0; --i) free_.push_back(i - 1);
  }

  uint64_t record_offset() const { return base_; }

  // An entry's offset in the session table and a new seq for this use, or offset 0 when every
  // entry is in use (the request then goes unrecorded).
  std::pair<uint64_t, uint32_t> Take() EXCLUDES(mu_) {
    MutexLock lk(&mu_);
    if (free_.empty()) return {0, 0};
    const uint32_t i = free_.back();
    free_.pop_back();
    seq_[i] = proto::RequestEntry::NextSeq(seq_[i]);
    return {base_ + proto::SessionRecord::EntryOffset(i), seq_[i]};
  }

  // Hands an entry back; offsets outside this record are ignored.
  void Give(uint64_t entry) EXCLUDES(mu_) {
    const uint64_t first = base_ + proto::SessionRecord::kEntries;
    if (entry < first || entry >= base_ + proto::kSessionRecordSize) return;
    MutexLock lk(&mu_);
    free_.push_back(static_cast<uint32_t>((entry - first) / proto::SessionRecord::kEntrySize));
  }

 private:
  const uint64_t base_;
  Mutex mu_;
  std::vector<uint32_t> seq_ GUARDED_BY(mu_);  // the last seq each entry was used with
  std::vector<uint32_t> free_ GUARDED_BY(mu_);
};

}  // namespace rdmalock
