// Cluster mode: lockd's campaign for its shard's primary in etcd, and the lease that keeps it.
//
// etcd keys (docs/operations.md, "Failover with etcd"), under /rdmalock/<cluster>/:
//   map                  the shard names, comma-separated (written by lockctl cluster init)
//   shard/<s>/primary    the primary's HOST:PORT, attached to the primary's etcd lease
//   shard/<s>/epoch      the shard's epoch: bumped by each new primary; it leads every token
//   shard/<s>/members/<HOST:PORT>  every lockd of the shard, primary or standby, on its lease
//
// A lockd of shard s grants itself a lease (etcd_lease_ttl_s) and creates shard/<s>/primary with
// it if no one holds it; the winner bumps the epoch, then serves after the takeover grace. While
// primary it refreshes the lease every TTL/6 and keeps a local deadline: the send time of the
// last refresh etcd confirmed, plus the TTL. etcd cannot expire the lease (and so let a standby
// win) before that deadline, because etcd's own countdown started when the refresh arrived. The
// primary stops serving (every QP to the error state) a margin before the deadline, whether or
// not it can reach etcd: a primary cut off from etcd fences itself before anyone can replace it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/etcd/etcd.h"
#include "rdmalock/status.h"
#include "server/config.h"

namespace rdmalock::lockd {

// Thread-safety: one thread at a time calls Win, Hold and Resign (lockd's worker campaigns and
// resigns; while primary, its holder thread calls Hold, and is joined before Win is called
// again). deadline(), fence_at() and margin() may be read from any thread.
class Campaign {
 public:
  using Clock = std::chrono::steady_clock;

  static Result<std::unique_ptr<Campaign>> Create(const Config& config);

  // Campaigns until this lockd holds its shard's primary key, then bumps the shard's epoch and
  // returns it. Returns kConnection "stopped" once `stop` is set. A key already on our own lease
  // (a create that committed unanswered) is ours. Called again after a term (lockd fenced its
  // clients), it first revokes that term's lease: a term's lease is never campaigned with again.
  Result<uint64_t> Win(const std::atomic<bool>& stop);

  // While primary: refreshes the lease when due and checks that the primary key is still ours.
  // Returns false when this lockd must stop serving now: the deadline is within the margin, or
  // etcd says the lease or the key is gone. Waits at most until the next refresh is due (or
  // `stop`).
  bool Hold(const std::atomic<bool>& stop);

  // The takeover grace a new primary waits before it serves, after Win (Config::TakeoverGraceMs).
  // The campaign's thread.
  uint64_t TakeoverGraceMs() const;
  // The TTL etcd granted the campaign's lease (at least etcd_lease_ttl_s). The campaign's thread.
  uint64_t ttl_s() const {
    return std::max<uint64_t>(config_.etcd_lease_ttl_s,
                              std::chrono::duration_cast<std::chrono::seconds>(ttl_).count());
  }

  // Gives up the primary key at a clean stop (revokes the lease), so a standby need not wait for
  // it to expire (it still waits the takeover grace).
  void Resign();

  // The last moment this lockd may serve (see above), and the margin it stops before it. Any
  // thread may read them (Hold moves them).
  Clock::time_point deadline() const {
    return Clock::time_point(Clock::duration(deadline_ns_.load()));
  }
  Clock::time_point fence_at() const { return deadline() - margin_; }
  std::chrono::milliseconds margin() const { return margin_; }
  const std::string& why_lost() const { return why_lost_; }
  std::string primary_key() const { return prefix_ + "primary"; }

 private:
  Campaign(const Config& config, std::unique_ptr<etcd::Client> etcd);
  Status NewLease();
  Result<uint64_t> BumpEpoch();
  // After the epoch: true if the lease may be served on now, confirmed (Confirm) first; false if
  // etcd says the lease or the key is gone (why_lost_); an error to retry (a call failed, or the
  // confirmation came too late to serve on).
  Result<bool> ConfirmWin();
  // While campaigning: refreshes the lease and moves the deadline (the campaign's own check that
  // its lease is young enough to win with). Returns whether the lease is alive.
  Result<bool> Refresh(std::chrono::milliseconds timeout);
  // While primary: a keepalive, then a linearizable read of the primary key; the deadline moves
  // (to the keepalive's send time plus the TTL etcd gave) only when the read shows the key on our
  // lease. A keepalive alone is no proof: etcd before 3.4.25 and 3.5.8 (etcd issue 15247;
  // Debian 12 has 3.4.23) let a leader that had stepped down while stuck keep renewing leases
  // for the clients connected to it, while the new leader expired them; such a member cannot
  // answer a linearizable read. Returns false (why_lost_ says why) when etcd says the lease
  // expired or the key is not ours; an error when a call failed (the deadline stays).
  Result<bool> Confirm(std::chrono::milliseconds timeout);

  Config config_;
  std::unique_ptr<etcd::Client> etcd_;
  std::string prefix_;  // /rdmalock/<cluster>/shard/<shard>/
  std::string me_;      // what we write in the primary key: our advertised HOST:PORT
  int64_t lease_ = 0;
  std::chrono::milliseconds ttl_{0};  // the TTL etcd granted (it may raise the one asked for)
  bool warned_ttl_ = false;           // that etcd raised it, logged once
  std::chrono::milliseconds margin_{0};
  Clock::time_point deadline_{};
  std::atomic<Clock::rep> deadline_ns_{0};  // deadline_, for other threads
  Clock::time_point next_refresh_{};
  bool served_ = false;  // lease_ won the primary key (Win returned with it)
  std::string why_lost_;
};

}  // namespace rdmalock::lockd
