#include "engine/remote_memory.h"

namespace rdmalock {

void RemoteMemory::Count(std::span<const RemoteOp> ops) {
  for (const RemoteOp& op : ops) {
    switch (op.kind) {
      case RemoteOp::Kind::kFetchAdd:
        ++counters_.fetch_add;
        break;
      case RemoteOp::Kind::kCompareSwap:
        ++counters_.compare_swap;
        break;
      case RemoteOp::Kind::kRead:
        ++counters_.read;
        break;
      case RemoteOp::Kind::kWrite:
        ++counters_.write;
        break;
    }
  }
  ++counters_.batches;
}

Status RemoteMemory::Execute(std::span<RemoteOp> ops) {
  Count(ops);
  if (before_issue_) [[unlikely]]
    before_issue_();
  const auto start = Clock::now();
  last_issued_ = start;
  Status st = DoExecute(ops);
  last_completed_ = Clock::now();
  const auto took = last_completed_ - start;
  // EWMA with weight 1/8, as TCP's SRTT.
  round_trip_ += (std::chrono::duration_cast<std::chrono::nanoseconds>(took) - round_trip_) / 8;
  return st;
}

Status RemoteMemory::Post(std::span<RemoteOp> ops) {
  for (const RemoteOp& op : ops) {
    if (op.kind != RemoteOp::Kind::kWrite) {
      return Error(ErrorCode::kInvalidArgument, "only WRITEs may be posted without waiting");
    }
    ++counters_.write;
  }
  return DoPost(ops);
}

Status RemoteMemory::Start(std::span<RemoteOp> ops) {
  if (started_) RDMALOCK_RETURN_IF_ERROR(Await());
  Count(ops);
  started_ = true;
  Status st = DoStart(ops);
  if (!st.ok()) started_ = false;
  return st;
}

Status RemoteMemory::Await() {
  if (!started_) return Status::Ok();
  Status st = DoAwait();
  started_ = false;
  return st;
}

}  // namespace rdmalock
