#include "tests/support/inproc_memory.h"

#include <cstring>
#include <string>

#include "engine/budgets.h"
#include "rdmalock/proto/layout.h"

namespace rdmalock {

InProcessTable::InProcessTable(uint64_t lock_count, uint64_t session_bytes)
    : lock_count_(lock_count),
      words_(std::make_unique<std::atomic<uint64_t>[]>((lock_count + 1) * 2)),
      session_words_(session_bytes / 8),
      sessions_(std::make_unique<std::atomic<uint64_t>[]>(session_bytes / 8)),
      info_(std::make_unique<std::atomic<uint64_t>[]>(kInfoBytes / 8)) {
  for (uint64_t i = 0; i < kInfoBytes / 8; ++i) info_[i].store(0);
  for (uint64_t i = 0; i < (lock_count + 1) * 2; ++i) words_[i].store(0);
  for (uint64_t i = 0; i < session_words_; ++i) sessions_[i].store(0);
  words_[lock_count * 2].store(proto::kProbePattern);
}

Status InProcessMemory::Check(const RemoteOp& op) const {
  if (op.region == RegionId::kInfo) {
    if (op.kind != RemoteOp::Kind::kRead || op.offset % 8 != 0 || op.into != nullptr ||
        op.offset + op.length > InProcessTable::kInfoBytes) {
      return Error(ErrorCode::kConnection, "remote access error on the info page");
    }
    return Status::Ok();
  }
  if (op.region != RegionId::kLocks) {
    return Error(ErrorCode::kInvalidArgument, "in-process backend serves the lock table only");
  }
  const uint64_t bytes = proto::LockTableBytes(table_->lock_count());
  // A READ into a caller's buffer (RemoteOp::into): whole words, at most kMaxBlockRead bytes.
  const bool length_ok = op.into != nullptr
                             ? op.kind == RemoteOp::Kind::kRead && op.length % 8 == 0 &&
                                   op.length <= budget::kMaxBlockRead
                             : op.length == 8 || op.length == 16;
  if (op.offset % 8 != 0 || op.offset + op.length > bytes || !length_ok) {
    return Error(ErrorCode::kInvalidArgument,
                 "remote access error: offset " + std::to_string(op.offset));
  }
  if (op.kind == RemoteOp::Kind::kWrite) {
    // The lock table is registered without REMOTE_WRITE.
    return Error(ErrorCode::kConnection, "remote access error: WRITE to the lock table");
  }
  return Status::Ok();
}

Status InProcessMemory::ExecuteSessions(RemoteOp& op) {
  if (op.offset % 8 != 0 || op.offset + op.length > table_->session_bytes() ||
      (op.length != 8 && op.length != 16) || op.into != nullptr ||
      (op.kind != RemoteOp::Kind::kWrite && op.kind != RemoteOp::Kind::kRead)) {
    return Error(ErrorCode::kConnection,
                 "remote access error on the session table: offset " + std::to_string(op.offset));
  }
  const uint64_t n = op.length / 8;
  for (uint64_t i = 0; i < n; ++i) {
    std::atomic<uint64_t>& w = table_->session_word(op.offset + i * 8);
    if (op.kind == RemoteOp::Kind::kWrite) {
      w.store(i == 0 ? op.operand : op.swap, std::memory_order_release);
    } else {
      op.result[i] = w.load(std::memory_order_acquire);
    }
  }
  return Status::Ok();
}

Status InProcessMemory::DoPost(std::span<RemoteOp> ops) {
  if (has_started_) {
    std::shared_lock lk(fence_);
    RDMALOCK_RETURN_IF_ERROR(LandStarted());
  }
  if (!hold_posts_) return Run(ops);
  held_.insert(held_.end(), ops.begin(), ops.end());
  return Status::Ok();
}

void InProcessMemory::LandHeld() {
  std::vector<RemoteOp> held;
  held.swap(held_);
  (void)Run(held);
}

Status InProcessMemory::DoExecute(std::span<RemoteOp> ops) {
  std::shared_lock lk(fence_);
  LandHeld();  // RC: what this channel posted earlier lands first
  RDMALOCK_RETURN_IF_ERROR(LandStarted());
  return Run(ops);
}

Status InProcessMemory::LandStarted() {
  if (!has_started_) return Status::Ok();
  has_started_ = false;
  Status st = Run(started_ops_);
  StartedDone();  // its results are in place, as a verbs Execute completes a started batch
  return st;
}

Status InProcessMemory::DoStart(std::span<RemoteOp> ops) {
  if (!defer_starts_) return DoExecute(ops);
  std::shared_lock lk(fence_);
  LandHeld();
  RDMALOCK_RETURN_IF_ERROR(LandStarted());
  if (broken_.load()) return Error(ErrorCode::kConnection, "channel broken (injected)");
  started_ops_ = ops;
  has_started_ = true;
  return Status::Ok();
}

Status InProcessMemory::DoAwait() {
  std::shared_lock lk(fence_);
  LandHeld();
  return LandStarted();
}

Status InProcessMemory::CheckConnection() {
  return broken_.load() ? Error(ErrorCode::kConnection, "connection to lockd lost (in-process)")
                        : Status::Ok();
}

void InProcessMemory::Shutdown() {
  Break();
  if (!shut_.exchange(true) && on_shutdown_) on_shutdown_();
}

Status InProcessMemory::Run(std::span<RemoteOp> ops) {
  for (RemoteOp& op : ops) {
    if (broken_.load()) return Error(ErrorCode::kConnection, "channel broken (injected)");
    if (hook_ && !hook_(op)) {
      broken_.store(true);
      return Error(ErrorCode::kConnection, "channel dropped (injected)");
    }
    if (op.region == RegionId::kSessions) {
      RDMALOCK_RETURN_IF_ERROR(ExecuteSessions(op));
      continue;
    }
    RDMALOCK_RETURN_IF_ERROR(Check(op));
    if (op.region == RegionId::kInfo) {
      op.result[0] = table_->info_word(op.offset).load(std::memory_order_acquire);
      if (op.length == 16) op.result[1] = table_->info_word(op.offset + 8).load();
      continue;
    }
    std::atomic<uint64_t>& w = table_->word(op.offset / 8);
    switch (op.kind) {
      case RemoteOp::Kind::kFetchAdd:
        op.result[0] = w.fetch_add(op.operand, std::memory_order_acq_rel);
        break;
      case RemoteOp::Kind::kCompareSwap: {
        uint64_t expected = op.operand;
        w.compare_exchange_strong(expected, op.swap, std::memory_order_acq_rel);
        op.result[0] = expected;  // the old value, whether or not it swapped
        break;
      }
      case RemoteOp::Kind::kRead:
        if (op.into != nullptr) {
          for (uint64_t i = 0; i < op.length / 8; ++i) {
            op.into[i] = table_->word(op.offset / 8 + i).load(std::memory_order_acquire);
          }
          if (read_filter_) read_filter_(op);
          break;
        }
        op.result[0] = w.load(std::memory_order_acquire);
        if (op.length == 16) op.result[1] = table_->word(op.offset / 8 + 1).load();
        if (read_filter_) read_filter_(op);
        break;
      case RemoteOp::Kind::kWrite:
        break;  // refused by Check
    }
    if (after_hook_ && !after_hook_(op)) {
      broken_.store(true);
      return Error(ErrorCode::kConnection, "channel dropped before the completion (injected)");
    }
  }
  return Status::Ok();
}

Status InProcessMemory::ReadBytes(RegionId region, uint64_t offset, std::span<uint8_t> dst) {
  if (has_started_) {
    std::shared_lock lk(fence_);
    RDMALOCK_RETURN_IF_ERROR(LandStarted());
  }
  if (broken_.load()) return Error(ErrorCode::kConnection, "channel broken (injected)");
  const uint64_t size = region == RegionId::kLocks ? proto::LockTableBytes(table_->lock_count())
                        : region == RegionId::kSessions ? table_->session_bytes()
                                                        : InProcessTable::kInfoBytes;
  if (offset % 8 != 0 || dst.size() % 8 != 0 || offset + dst.size() > size) {
    return Error(ErrorCode::kInvalidArgument, "bad in-process read");
  }
  for (size_t i = 0; i < dst.size(); i += 8) {
    const uint64_t at = offset + i;
    const uint64_t v = region == RegionId::kLocks      ? table_->word(at / 8).load()
                       : region == RegionId::kSessions ? table_->session_word(at).load()
                                                       : table_->info_word(at).load();
    std::memcpy(dst.data() + i, &v, 8);
  }
  return Status::Ok();
}

}  // namespace rdmalock
