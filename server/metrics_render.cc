#include "server/metrics_render.h"

#include <string>

#include "rdmalock/proto/handshake.h"
#include "rdmalock/proto/layout.h"
#include "server/words.h"

namespace rdmalock::lockd {

std::string RenderMetrics(const MetricsSource& s, LockTableSampler& sampler,
                          std::chrono::system_clock::time_point now_wall) {
  using std::chrono::duration;
  PromText p;
  p.Family("rdmalock_lockd_info", "gauge", "lockd's version (label) and epoch; always 1");
  p.Sample(uint64_t{1},
           "version=\"" RDMALOCK_VERSION "\",epoch=\"" + std::to_string(s.epoch) + "\"");
  p.Family("rdmalock_lockd_epoch", "gauge",
           "epoch of this run (bumped at every start; it leads every fencing token)");
  p.Sample(s.epoch);
  p.Family("rdmalock_lockd_start_time_seconds", "gauge", "when lockd started, Unix seconds");
  p.Sample(duration<double>(s.started_wall.time_since_epoch()).count());
  p.Family("rdmalock_lockd_lease_seconds", "gauge", "a holder's lease (lease_ms)");
  p.Sample(static_cast<double>(s.config->lease_ms) / 1000.0);
  p.Family("rdmalock_lockd_stall_factor", "gauge",
           "waiters recover a lock after stall_factor x lease without progress");
  p.Sample(uint64_t{s.config->stall_factor});
  p.Family("rdmalock_lockd_grace_remaining_seconds", "gauge",
           "restart grace period left (clients are refused until it ends); 0 if none");
  p.Sample(s.grace_until_wall > now_wall ? duration<double>(s.grace_until_wall - now_wall).count()
                                         : 0.0);
  // A constant of the run, so an alert sees a grace of one lease whenever it scrapes (the
  // remaining time above is > 0 for that lease only).
  p.Family("rdmalock_lockd_grace_end_time_seconds", "gauge",
           "when this run's restart grace period ends or ended, Unix seconds; 0 if it had none");
  p.Sample(duration<double>(s.grace_until_wall.time_since_epoch()).count());
  p.Family("rdmalock_lockd_sessions_connected", "gauge", "client sessions connected now");
  p.Sample(s.connected->load(std::memory_order_relaxed));
  p.Family("rdmalock_lockd_sessions_max", "gauge", "max_clients");
  p.Sample(uint64_t{s.config->max_clients});
  p.Family("rdmalock_lockd_handshakes_accepted_total", "counter",
           "client sessions admitted (their first connection established)");
  p.Sample(s.counters->accepted.load(std::memory_order_relaxed));
  p.Family("rdmalock_lockd_connections_joined_total", "counter",
           "further connections accepted into existing sessions (one per client thread)");
  p.Sample(s.counters->joined.load(std::memory_order_relaxed));
  p.Family("rdmalock_lockd_handshakes_rejected_total", "counter",
           "connections rejected, by reason");
  for (uint16_t r = 1; r < proto::kRejectReasonCount; ++r) {
    const auto reason = static_cast<proto::RejectReason>(r);
    p.Sample(s.counters->rejected[r].load(std::memory_order_relaxed),
             "reason=\"" + std::string(proto::RejectReasonLabel(reason)) + "\"");
  }
  p.Family("rdmalock_lockd_handshakes_failed_total", "counter",
           "handshakes that ended neither refused nor admitted: not established in time, a failed "
           "send or completion, a QP error");
  p.Sample(s.counters->handshakes_failed.load(std::memory_order_relaxed));
  p.Family("rdmalock_lockd_sessions_ended_total", "counter",
           "client sessions that ended, by reason (lockd then frees their recorded requests)");
  for (size_t r = 0; r < static_cast<size_t>(EndReason::kCount); ++r) {
    p.Sample(s.counters->ended[r].load(std::memory_order_relaxed),
             "reason=\"" + std::string(EndReasonLabel(static_cast<EndReason>(r))) + "\"");
  }
  p.Family("rdmalock_lockd_forced_releases_total", "counter",
           "lockctl release --force requests carried out");
  p.Sample(s.counters->forced_releases.load(std::memory_order_relaxed));
  p.Family("rdmalock_lockd_recovered_requests_total", "counter",
           "recorded requests of ended sessions, by what lockd's recovery found: released (it "
           "freed them), done (already over), recovered (waiters had recovered past them), "
           "gave_up (left to waiters' stall recovery)");
  p.Sample(s.counters->freed_released.load(std::memory_order_relaxed), "outcome=\"released\"");
  p.Sample(s.counters->freed_done.load(std::memory_order_relaxed), "outcome=\"done\"");
  p.Sample(s.counters->freed_recovered.load(std::memory_order_relaxed), "outcome=\"recovered\"");
  p.Sample(s.counters->freed_gave_up.load(std::memory_order_relaxed), "outcome=\"gave_up\"");
  p.Family("rdmalock_lockd_recovery_pending", "gauge",
           "ended sessions whose recorded requests lockd has yet to free");
  p.Sample(s.counters->recovery_queue.load(std::memory_order_relaxed));
  sampler.Render(p);
  return p.text();
}

void LockTableSampler::Render(PromText& p) {
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t held_x = 0, held_s = 0, holders = 0, waiting = 0, contended = 0, frozen = 0;
  MutexLock lock(&mu_);
  if (word0_.size() != lock_count_) {
    word0_.assign(lock_count_, 0);
    gen_.assign(lock_count_, 0);
  }
  for (uint64_t slot = 0; slot < lock_count_; ++slot) {
    const size_t off = proto::SlotOffset(slot);
    const proto::Word0 w = proto::Word0::Decode(Load64(locks_, off));
    const auto gen = static_cast<uint32_t>(proto::Generation(Load64(locks_, off + 8)));
    const proto::Occupancy o = proto::OccupancyOf(w);
    if (o.holders > 0) {
      if (o.exclusive_outstanding > 0) {
        ++held_x;
      } else {
        ++held_s;
      }
    }
    holders += o.holders;
    waiting += o.waiting;
    if (o.waiting > 0) ++contended;
    if (w.Frozen()) ++frozen;
    if (sampled_) {
      requests_ += proto::RequestsBetween(proto::Word0::Decode(word0_[slot]), gen_[slot], w, gen);
    }
    word0_[slot] = w.Encode();
    gen_[slot] = sampled_ ? proto::GenerationSeen(gen_[slot], w, gen) : gen;
  }
  sampled_ = true;
  p.Family("rdmalock_lockd_lock_slots", "gauge", "slots in the lock table (lock_count)");
  p.Sample(lock_count_);
  p.Family("rdmalock_lockd_locks_held", "gauge",
           "slots with a holder now, by mode (a queue of both modes counts as exclusive)");
  p.Sample(held_x, "mode=\"exclusive\"");
  p.Sample(held_s, "mode=\"shared\"");
  p.Family("rdmalock_lockd_lock_holders", "gauge",
           "requests holding a lock now (shared holders counted one by one)");
  p.Sample(holders);
  p.Family("rdmalock_lockd_lock_waiters", "gauge", "requests queued behind a holder now");
  p.Sample(waiting);
  p.Family("rdmalock_lockd_locks_contended", "gauge", "slots with at least one waiter now");
  p.Sample(contended);
  p.Family("rdmalock_lockd_locks_frozen", "gauge",
           "slots whose counters reached the reset threshold and await a reset");
  p.Sample(frozen);
  p.Family("rdmalock_lockd_lock_requests_total", "counter",
           "lock requests (FETCH_AND_ADDs) seen queueing in the table, counted at each scrape "
           "(withdrawn requests between two scrapes may go uncounted)");
  p.Sample(requests_);
  p.Family("rdmalock_lockd_table_scan_seconds", "gauge",
           "how long this scrape took to read the lock table");
  p.Sample(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace rdmalock::lockd
