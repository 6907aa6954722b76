#include "server/campaign.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <thread>

namespace rdmalock::lockd {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kPoll{250};  // a standby's attempt to take the primary key

milliseconds Until(Campaign::Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(t - Campaign::Clock::now());
}

// Sleeps until `t` or until `stop` is set, in steps short enough to notice `stop` quickly.
void SleepUntil(Campaign::Clock::time_point t, const std::atomic<bool>& stop) {
  while (!stop.load() && Campaign::Clock::now() < t) {
    std::this_thread::sleep_for(std::min(Until(t), milliseconds(50)));
  }
}

}  // namespace

Campaign::Campaign(const Config& config, std::unique_ptr<etcd::Client> etcd)
    : config_(config),
      etcd_(std::move(etcd)),
      prefix_("/rdmalock/" + config.cluster + "/shard/" + config.shard + "/"),
      me_(config.Advertised()) {}

Result<std::unique_ptr<Campaign>> Campaign::Create(const Config& config) {
  const etcd::Tls tls{config.etcd_ca_file, config.etcd_cert_file, config.etcd_key_file};
  RDMALOCK_ASSIGN_OR_RETURN(auto etcd, etcd::Client::Create(config.etcd_endpoints, tls));
  return std::unique_ptr<Campaign>(new Campaign(config, std::move(etcd)));
}

Status Campaign::NewLease() {
  const auto sent = Clock::now();
  RDMALOCK_ASSIGN_OR_RETURN(etcd::Lease l,
                            etcd_->GrantLease(config_.etcd_lease_ttl_s, milliseconds(2000)));
  lease_ = l.id;
  ttl_ = std::chrono::seconds(l.ttl_s);
  if (l.ttl_s > int64_t{config_.etcd_lease_ttl_s} && !warned_ttl_) {
    // etcd's minimum TTL is 1.5 election timeouts. Fencing and the takeover grace use the TTL
    // granted; the operator should know that failover takes that long.
    spdlog::warn(
        "shard {}: etcd granted a lease TTL of {} s for etcd_lease_ttl_s {} (its minimum, 1.5 "
        "election timeouts); the takeover grace counts {} s (set etcd_lease_ttl_s to {} to say "
        "so)",
        config_.shard, l.ttl_s, config_.etcd_lease_ttl_s, l.ttl_s, l.ttl_s);
    warned_ttl_ = true;
  }
  // Membership, for operators (lockctl cluster): this lockd is a member of the shard while its
  // lease lives. Best effort: the campaign does not depend on it.
  if (Status st = etcd_->Put(prefix_ + "members/" + me_, me_, lease_, milliseconds(2000));
      !st.ok()) {
    spdlog::warn("shard {}: registering as a member in etcd failed: {}", config_.shard,
                 st.message());
  }
  margin_ = ttl_ / 3;
  deadline_ = sent + ttl_;
  deadline_ns_.store(deadline_.time_since_epoch().count());
  next_refresh_ = sent + ttl_ / 6;
  return Status::Ok();
}

uint64_t Campaign::TakeoverGraceMs() const {
  // The TTL etcd enforces, not only the one configured: the old primary served on such a lease.
  return config_.TakeoverGraceMs(ttl_s());
}

Result<bool> Campaign::Refresh(milliseconds timeout) {
  const auto sent = Clock::now();
  RDMALOCK_ASSIGN_OR_RETURN(int64_t ttl, etcd_->KeepAlive(lease_, timeout));
  if (ttl <= 0) return false;
  deadline_ = sent + std::chrono::seconds(ttl);
  deadline_ns_.store(deadline_.time_since_epoch().count());
  next_refresh_ = sent + ttl_ / 6;
  return true;
}

Result<bool> Campaign::Confirm(milliseconds timeout) {
  const auto sent = Clock::now();
  const auto until = sent + timeout;
  RDMALOCK_ASSIGN_OR_RETURN(int64_t ttl, etcd_->KeepAlive(lease_, timeout));
  if (ttl <= 0) {
    why_lost_ = "etcd says the lease has expired";
    return false;
  }
  // The read is what a member that is not the leader cannot answer (a linearizable range goes
  // through the leader's read index), the keepalive is not (see campaign.h).
  // All the time left: the deadline counts from before this read, so a slow read costs no
  // safety, and cutting it short would fence a primary whose etcd reads slowly.
  RDMALOCK_ASSIGN_OR_RETURN(auto kv,
                            etcd_->Get(primary_key(), std::max(Until(until), milliseconds(1))));
  if (!kv.has_value() || kv->lease != lease_) {
    // Someone may have deleted it (etcdctl del), and a standby then wins while our lease lives.
    why_lost_ = "the primary key " + primary_key() + " is no longer ours (now " +
                (kv.has_value() ? kv->value : std::string("absent")) + ")";
    return false;
  }
  deadline_ = sent + std::chrono::seconds(ttl);
  deadline_ns_.store(deadline_.time_since_epoch().count());
  next_refresh_ = sent + ttl_ / 6;
  return true;
}

Result<uint64_t> Campaign::BumpEpoch() {
  const std::string key = prefix_ + "epoch";
  for (int attempt = 0; attempt < 10; ++attempt) {
    RDMALOCK_ASSIGN_OR_RETURN(auto kv, etcd_->Get(key, milliseconds(2000)));
    uint64_t epoch = 0;
    if (kv.has_value()) {
      const std::string& v = kv->value;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), epoch);
      if (ec != std::errc() || p != v.data() + v.size()) {
        // Not "delete it": a missing key starts the shard over at epoch 1, and its fencing
        // tokens would go backwards.
        return Error(ErrorCode::kProtocol,
                     "etcd key " + key + " holds '" + v +
                         "', not an epoch number; put back the last epoch this shard served "
                         "(lockd logs it when it becomes primary), never a smaller one");
      }
    } else {
      spdlog::info(
          "shard {}: etcd has no key {}: this is the shard's first primary, at epoch 1 (a deleted "
          "key would start fencing tokens over)",
          config_.shard, key);
    }
    if (epoch >= 0xffff) {  // not epoch + 1 > 0xffff: 2^64 - 1 parses, and one more wraps to 0
      return Error(ErrorCode::kResource, "etcd key " + key +
                                             ": the epoch would exceed 65535, the width of the "
                                             "token's epoch field");
    }
    RDMALOCK_ASSIGN_OR_RETURN(
        bool wrote, etcd_->CompareAndPut(key, kv ? kv->mod_revision : 0, std::to_string(epoch + 1),
                                         milliseconds(2000)));
    if (wrote) return epoch + 1;
  }
  return Error(ErrorCode::kBusy, "etcd key " + key + " kept changing under us");
}

Result<uint64_t> Campaign::Win(const std::atomic<bool>& stop) {
  std::string last_seen, last_error;
  auto error = [&](const Status& st) {
    if (st.message() != last_error) {
      spdlog::warn("shard {}: etcd: {} (retrying)", config_.shard, st.message());
      last_error = st.message();
    }
  };
  // A lease that was primary is not campaigned with again: its term ended (lockd fenced its
  // clients), yet a keepalive that etcd carried out after the fence may have kept it, and the
  // primary key on it, alive. Revoked, the key goes at once and the shard goes to the next
  // winner (us again, or a standby); if etcd cannot be reached, no one refreshes the lease any
  // more and etcd expires it.
  if (served_) {
    Resign();
    served_ = false;
  }
  while (!stop.load()) {
    if (lease_ == 0 || Clock::now() >= deadline_ - margin_) {
      if (lease_ != 0) {
        // Too late to serve on this lease. A create of ours may have committed on it (its
        // answer lost): revoke it, so the key does not wait for etcd to expire it.
        (void)etcd_->Revoke(lease_, milliseconds(500));
        lease_ = 0;
      }
      if (Status st = NewLease(); !st.ok()) {
        error(st);
        SleepUntil(Clock::now() + milliseconds(500), stop);
        continue;
      }
    } else if (Clock::now() >= next_refresh_) {
      auto alive = Refresh(ttl_ / 6);
      if (!alive.ok()) {
        error(alive.status());
      } else if (!*alive) {
        lease_ = 0;
        continue;
      }
    }
    std::optional<etcd::KeyValue> holder;
    auto won = etcd_->CreateIfAbsent(primary_key(), me_, lease_, milliseconds(2000), &holder);
    if (won.ok() && !*won && holder.has_value() && holder->lease == lease_) {
      // The key is on our own lease: an earlier create of ours committed, but its answer did not
      // reach us in time (a slow etcd, or the timeout split over endpoints). It is ours.
      spdlog::info(
          "shard {}: the primary key {} is already on our lease (an earlier create "
          "committed unanswered)",
          config_.shard, primary_key());
      won = true;
    }
    if (!won.ok()) {
      error(won.status());
    } else if (*won) {
      // Ours. Confirmed first (Confirm: a keepalive, then a read of our key), so that a win
      // etcd cannot confirm uses up no epoch; then the epoch, once; then, if that came after
      // the fence point, confirmed again. If this cannot be had before our deadline, the lease
      // goes and we start over (serving without a new epoch could repeat tokens).
      std::optional<uint64_t> epoch;
      for (;;) {
        Status st;
        bool lost = false;  // etcd says the lease or the key is gone: no retry can help
        if (!epoch || Clock::now() >= deadline_ - margin_) {
          auto ours = ConfirmWin();
          lost = ours.ok() && !*ours;
          st = !ours.ok() ? ours.status()
               : lost     ? Error(ErrorCode::kConnection, why_lost_)
                          : Status::Ok();
        }
        if (st.ok() && !epoch) {
          auto bumped = BumpEpoch();
          if (bumped.ok()) {
            epoch = *bumped;
          } else {
            st = bumped.status();
          }
        }
        if (st.ok() && epoch && Clock::now() < deadline_ - margin_) {
          served_ = true;
          return *epoch;
        }
        if (!st.ok()) error(st);
        if (lost || stop.load()) break;
        if (!epoch && Clock::now() >= deadline_ - margin_) break;
        if (epoch && Clock::now() >= deadline_) break;  // unconfirmed past the deadline itself
        SleepUntil(Clock::now() + milliseconds(200), stop);
      }
      Resign();
      continue;
    } else {
      last_error.clear();
      const std::string now = holder ? holder->value : "(none)";
      if (now != last_seen) {
        spdlog::info("standby for shard {}: the primary is {} (etcd key {})", config_.shard, now,
                     primary_key());
        last_seen = now;
      }
    }
    SleepUntil(Clock::now() + kPoll, stop);
  }
  // Stopped: the lease goes back at once, with the members key on it (and a primary key whose
  // create committed unanswered), rather than when etcd expires it.
  Resign();
  return Error(ErrorCode::kConnection, "stopped");
}

Result<bool> Campaign::ConfirmWin() {
  // Before the first grant, as before each refresh of a term: the deadline comes from a
  // keepalive confirmed by a read of our key, never from a keepalive alone (the standby's
  // campaign refreshes its lease without a key to read). It also moves the deadline on when a
  // slow etcd answered the create or the epoch after the fence point: returned as it was, the win
  // was fenced by Hold at once, and each round of the campaign used up an epoch.
  RDMALOCK_ASSIGN_OR_RETURN(bool ours, Confirm(std::max(Until(deadline_), ttl_ / 6)));
  if (!ours) return false;
  if (Clock::now() >= deadline_ - margin_) {
    return Error(ErrorCode::kConnection, "the etcd lease was confirmed too late to serve on");
  }
  return true;
}

bool Campaign::Hold(const std::atomic<bool>& stop) {
  const auto fence_at = deadline_ - margin_;
  if (Clock::now() >= fence_at) {
    why_lost_ = "the etcd lease could not be refreshed in time (the deadline is " +
                std::to_string(Until(deadline_).count()) + " ms away)";
    return false;
  }
  if (Clock::now() >= next_refresh_) {
    // All the time left before the fence: a slow etcd (a loaded host) may answer late and still
    // in time.
    auto ours = Confirm(std::max(Until(fence_at), milliseconds(1)));
    if (!ours.ok()) {
      spdlog::warn(
          "shard {}: confirming the primary's etcd lease failed: {} ({} ms to the fence; the "
          "deadline moves only once a read confirms the key)",
          config_.shard, ours.status().message(), Until(fence_at).count());
      // Try again soon; the fence comes by itself if this goes on.
      next_refresh_ = Clock::now() + milliseconds(100);
    } else if (!*ours) {
      return false;
    }
  }
  SleepUntil(std::min(next_refresh_, deadline_ - margin_), stop);
  return true;
}

void Campaign::Resign() {
  if (lease_ == 0) return;
  if (Status st = etcd_->Revoke(lease_, milliseconds(1000)); !st.ok()) {
    spdlog::warn("shard {}: revoking the etcd lease failed: {} (it expires by itself in {} s)",
                 config_.shard, st.message(), ttl_.count() / 1000);
  }
  lease_ = 0;
}

}  // namespace rdmalock::lockd
