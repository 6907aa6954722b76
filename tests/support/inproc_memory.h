// The in-process backend: lockd's lock table as std::atomic words in this process, with the
// atomicity a NIC reporting ATOMIC_HCA gives (each 8-byte FA/CAS atomic; a 16-byte READ is two
// atomic 8-byte loads, not one snapshot). A test seam for running the protocol engine under many
// threads, sanitizers and injected faults; not a transport for users.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "engine/connection.h"

namespace rdmalock {

class InProcessTable {
 public:
  // `session_bytes`: the size of the session table (WRITE and READ, as lockd registers it).
  explicit InProcessTable(uint64_t lock_count, uint64_t session_bytes = 4 * 4096);

  uint64_t lock_count() const { return lock_count_; }
  // Word `index` (0 = word0 of slot 0, 1 = word1 of slot 0, ...) of the lock table.
  std::atomic<uint64_t>& word(uint64_t index) { return words_[index]; }
  uint64_t Load(uint64_t slot, int w) const {
    return words_[slot * 2 + static_cast<uint64_t>(w)].load(std::memory_order_acquire);
  }
  // Test set-up only (no channel may be running).
  void Store(uint64_t slot, int w, uint64_t v) {
    words_[slot * 2 + static_cast<uint64_t>(w)].store(v, std::memory_order_release);
  }
  uint64_t session_bytes() const { return session_words_ * 8; }
  // The 8-byte word of the info page at byte `offset` (lockd's side: plain stores).
  std::atomic<uint64_t>& info_word(uint64_t offset) { return info_[offset / 8]; }
  static constexpr uint64_t kInfoBytes = 4096;
  // The 8-byte word of the session table at byte `offset`.
  std::atomic<uint64_t>& session_word(uint64_t offset) { return sessions_[offset / 8]; }

 private:
  uint64_t lock_count_;
  std::unique_ptr<std::atomic<uint64_t>[]> words_;
  uint64_t session_words_;
  std::unique_ptr<std::atomic<uint64_t>[]> sessions_;
  std::unique_ptr<std::atomic<uint64_t>[]> info_;
};

// One channel on an InProcessTable, with fault injection. As a Connection (for the SDK's host
// tests) its reply is what a test lockd set, and Shutdown() fences it like Break().
class InProcessMemory : public Connection {
 public:
  // Runs before each operation of a batch; may sleep (delay, freeze) or return false to fail the
  // batch as if the connection had dropped.
  using Hook = std::function<bool(const RemoteOp&)>;

  explicit InProcessMemory(InProcessTable* table) : table_(table) {}
  // Destroying a connection disconnects it, as destroying an rdma_cm id does (a DREQ).
  ~InProcessMemory() override {
    if (!shut_.exchange(true) && on_shutdown_) on_shutdown_();
  }

  void set_hook(Hook hook) { hook_ = std::move(hook); }
  // Runs in Execute() before the batch's issue time is read: the caller descheduled just before
  // posting (set_hook's delay comes after the issue time, as an operation slow in flight).
  using RemoteMemory::set_before_issue;
  // Runs after each operation on the lock table has taken effect; returning false fails the batch
  // as if the connection had dropped before the completion came back (the operation landed, its
  // caller cannot know).
  void set_after_hook(Hook hook) { after_hook_ = std::move(hook); }
  // Runs after each READ of the lock table with the op's result in place (`result`, or `into`);
  // may change it, as a NIC whose READ is no snapshot of the word does: rdma_rxe copies a READ
  // bytewise, and a copy stalled halfway mixes two values (docs/protocol.md §8, torn READs).
  // Called on the channel's thread; several channels may call one filter at once.
  using ReadFilter = std::function<void(RemoteOp&)>;
  void set_read_filter(ReadFilter f) { read_filter_ = std::move(f); }
  // Makes every later operation fail with kConnection, as a dropped QP would. Returns once no
  // operation of this channel is in flight (a fence: nothing lands afterwards).
  void Break() {
    std::unique_lock lk(fence_);
    broken_.store(true);
  }
  bool broken() const { return broken_.load(); }
  // While set, what is posted without waiting (Post) is held back, as a retransmission holds a
  // write on a real QP: it lands at this channel's next Execute or Start (RC keeps a QP's order)
  // or at LandHeld(). Lets a test land one QP's write after another QP's.
  void set_hold_posts(bool hold) { hold_posts_ = hold; }
  void LandHeld();
  // While set, a started batch (RemoteMemory::Start: a posted release) does not land at once, as
  // it does not on a real QP: it lands at this channel's next Execute, Post, Start, Await or
  // ReadBytes (RC keeps a QP's order), so other channels' operations come between a release's
  // posting and its CAS, and its results are known only then. Unset, Start executes at once.
  void set_defer_starts(bool defer) { defer_starts_ = defer; }

  Status ReadBytes(RegionId region, uint64_t offset, std::span<uint8_t> dst) override;

  // Connection
  void set_reply(const proto::AcceptReply& r) { reply_ = r; }
  const proto::AcceptReply& reply() const override { return reply_; }
  Status CheckConnection() override;
  // Break(), then tells the test lockd (on_shutdown), as a DISCONNECTED would.
  void Shutdown() override;
  void set_on_shutdown(std::function<void()> fn) { on_shutdown_ = std::move(fn); }
  std::chrono::steady_clock::time_point connect_started() const override { return started_; }

 protected:
  Status DoExecute(std::span<RemoteOp> ops) override;
  Status DoPost(std::span<RemoteOp> ops) override;
  Status DoStart(std::span<RemoteOp> ops) override;
  Status DoAwait() override;

 private:
  // Lands the deferred started batch, if any (defer_starts_), with fence_ held shared.
  Status LandStarted();
  Status ExecuteSessions(RemoteOp& op);
  Status Check(const RemoteOp& op) const;
  Status Run(std::span<RemoteOp> ops);

  InProcessTable* table_;
  Hook hook_;
  ReadFilter read_filter_;
  std::atomic<bool> broken_{false};
  std::shared_mutex fence_;  // batches hold it shared; Break() exclusive
  proto::AcceptReply reply_;
  std::function<void()> on_shutdown_;
  std::atomic<bool> shut_{false};
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  Hook after_hook_;
  bool hold_posts_ = false;
  std::vector<RemoteOp> held_;  // posted, not landed yet (hold_posts_)
  bool defer_starts_ = false;
  std::span<RemoteOp> started_ops_;  // started, not landed yet (defer_starts_): the caller's ops
  bool has_started_ = false;
};

}  // namespace rdmalock
