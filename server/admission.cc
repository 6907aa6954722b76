#include "server/admission.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace rdmalock::lockd {

Admission::Admission(const Config& config, std::vector<Cidr> allow_from,
                     Clock::time_point grace_until)
    : max_connects_per_second_(config.max_connects_per_second),
      max_clients_(config.max_clients),
      max_connections_per_session_(config.max_connections_per_session),
      allow_from_(std::move(allow_from)),
      grace_until_(grace_until) {}

Verdict Admission::Decide(const ConnectFacts& f, Clock::time_point now) {
  using proto::RejectReason;
  auto refuse = [](RejectReason r, std::string detail, uint32_t retry = 0) {
    Verdict v;
    v.reason = r;
    v.detail = std::move(detail);
    v.retry_after_ms = retry;
    return v;
  };
  // lockd's own loopback proves itself with the secret it drew at start, from its own address;
  // a peer that only sets the flag is refused. Anyone else must be in allow_from.
  const bool is_loopback = f.flagged_loopback && f.loopback_proven;
  if (f.flagged_loopback && !is_loopback) {
    return refuse(RejectReason::kNotAllowed,
                  "the loopback flag from a peer that is not this lockd");
  }
  if (!is_loopback && !f.address_allowed) {
    return refuse(RejectReason::kNotAllowed, "not in allow_from");
  }
  // Every attempt counts against its address's rate, except a thread joining its own session
  // with the right key (a client's threads connect together when they start).
  // Nor does lockd's own loopback: its recovery reconnects through it, and at start lockd exits
  // without it, so no peer's attempts may crowd it out (nor may handshakes in progress, nor
  // clients taking every record: found by review, 2026-12-05).
  const bool valid_join = f.decoded == RejectReason::kNone && f.join && f.join_valid;
  if (!valid_join && !is_loopback) {
    if (const uint32_t retry = RateLimit(f.peer, now); retry > 0) {
      Verdict v =
          refuse(RejectReason::kRateLimited,
                 "over " + std::to_string(max_connects_per_second_) +
                     " connection attempts per second; retry in " + std::to_string(retry) + " ms",
                 retry);
      v.log = false;
      return v;
    }
  }
  if (f.decoded != RejectReason::kNone) return refuse(f.decoded, f.decoded_why);
  if (!is_loopback && now < grace_until_) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(grace_until_ - now).count() + 1;
    return refuse(RejectReason::kGrace,
                  "lockd restarted after an unclean stop; retry in " + std::to_string(left) + " ms",
                  static_cast<uint32_t>(left));
  }
  if (f.handshakes >= kMaxHandshakes && !is_loopback) {
    return refuse(RejectReason::kBusy,
                  std::to_string(kMaxHandshakes) + " handshakes in progress; retry in 100 ms", 100);
  }
  if (!f.join && !is_loopback && f.handshakes >= kMaxHandshakes - kHandshakesKeptForJoins) {
    return refuse(RejectReason::kBusy,
                  std::to_string(kMaxHandshakes - kHandshakesKeptForJoins) +
                      " new sessions' handshakes in progress; retry in 100 ms",
                  100);
  }
  if (!f.join && !is_loopback && f.new_handshakes_from_address >= kMaxNewHandshakesPerAddress) {
    return refuse(RejectReason::kBusy,
                  std::to_string(kMaxNewHandshakesPerAddress) +
                      " new sessions' handshakes in progress from this address; retry in 100 ms",
                  100);
  }
  if (f.join) {
    if (!f.join_valid) {
      return refuse(RejectReason::kBadSession, "session " + std::to_string(f.join_session));
    }
    // Joins skip the rate limit and the new sessions' caps: bounded here, or one session's joins
    // that never complete held every handshake (server/budgets.h).
    if (f.join_handshakes_of_session >= kMaxJoinHandshakesPerSession) {
      return refuse(RejectReason::kBusy,
                    std::to_string(kMaxJoinHandshakesPerSession) + " joins of session " +
                        std::to_string(f.join_session) + " in progress; retry in 100 ms",
                    100);
    }
    if (f.join_handshakes_from_address >= kMaxJoinHandshakesPerAddress) {
      return refuse(RejectReason::kBusy,
                    std::to_string(kMaxJoinHandshakesPerAddress) +
                        " joins in progress from this address; retry in 100 ms",
                    100);
    }
    if (f.join_session_conns >= max_connections_per_session_) {
      return refuse(RejectReason::kTooManyConnections,
                    "session " + std::to_string(f.join_session) + " has " +
                        std::to_string(f.join_session_conns) + " connections");
    }
  } else if (!(is_loopback ? f.records_free : f.client_records_free) ||
             (f.connected >= max_clients_ && !is_loopback)) {
    std::string detail = "max_clients " + std::to_string(max_clients_);
    // A record is reserved at accept, before the Hello proves the key: with fewer clients
    // connected than max_clients, handshakes in progress hold the rest (found by review,
    // 2026-12-08: the refusal read "max_clients N" with no client connected).
    if (f.connected < max_clients_ || is_loopback) {
      // At most 95 characters, RejectReply's detail: "handshakes in progress" must not be cut.
      detail += "; records taken: " + std::to_string(f.connected) +
                " by clients, the rest by handshakes in progress (" +
                std::to_string(kEstablishTimeout.count()) + " s max)";
    }
    return refuse(RejectReason::kServerFull, detail);
  }
  Verdict ok;
  ok.loopback = is_loopback;
  return ok;
}

uint32_t Admission::RateLimit(const std::string& peer, Clock::time_point now) {
  const uint32_t rate = max_connects_per_second_;
  if (rate == 0) return 0;
  const std::string addr = peer.substr(0, peer.rfind(':'));
  auto it = buckets_.find(addr);
  PeerBucket* bucket = nullptr;
  if (it != buckets_.end()) {
    bucket = &it->second;
  } else if (buckets_.size() < kMaxTrackedPeers) {
    bucket =
        &buckets_.emplace(addr, PeerBucket{static_cast<double>(rate), now, {}, 0}).first->second;
  } else {
    // The table is full (Tick forgets addresses idle for 10 s): the addresses it has no room for
    // share one bucket, so that none goes unlimited (until 2026-12-06 each did).
    if (!overflow_started_) {
      overflow_ = PeerBucket{static_cast<double>(rate), now, {}, 0};
      overflow_started_ = true;
    }
    bucket = &overflow_;
  }
  PeerBucket& b = *bucket;
  b.tokens = std::min<double>(
      rate, b.tokens + rate * std::chrono::duration<double>(now - b.refilled).count());
  b.refilled = now;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return 0;
  }
  ++b.refused;
  if (now - b.logged >= std::chrono::seconds(1)) {
    LogRefused(bucket == &overflow_
                   ? "the addresses past the " + std::to_string(kMaxTrackedPeers) + " tracked"
                   : addr,
               b, now);
  }
  return static_cast<uint32_t>(std::ceil((1 - b.tokens) / rate * 1000.0));
}

void Admission::LogRefused(const std::string& addr, PeerBucket& b, Clock::time_point now) {
  spdlog::warn(
      "rate limit: refused {} connection attempt(s) from {} (over max_connects_per_second {})",
      b.refused, addr, max_connects_per_second_);
  b.refused = 0;
  b.logged = now;
}

void Admission::LogRefusal(const std::string& peer, proto::RejectReason reason,
                           const std::string& detail, uint32_t retry_after_ms,
                           Clock::time_point now) {
  const std::string key =
      peer.substr(0, peer.rfind(':')) + "/" + std::string(proto::RejectReasonLabel(reason));
  if (!refusal_log_.ShouldLog(key, now)) return;
  if (reason == proto::RejectReason::kGrace) {
    spdlog::info("refused {} during the restart grace period ({} ms left)", peer, retry_after_ms);
  } else {
    spdlog::warn("rejected connection from {}: {}{}{}", peer, proto::RejectReasonName(reason),
                 detail.empty() ? "" : ": ", detail);
  }
}

void Admission::Tick(Clock::time_point now) {
  if (overflow_.refused > 0 && now - overflow_.logged >= std::chrono::seconds(1)) {
    LogRefused("the addresses past the " + std::to_string(kMaxTrackedPeers) + " tracked", overflow_,
               now);
  }
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    if (it->second.refused > 0 && now - it->second.logged >= std::chrono::seconds(1)) {
      LogRefused(it->first, it->second, now);
    }
    // Idle for 10 s: its bucket is full again; forget it.
    it = now - it->second.refilled > std::chrono::seconds(10) && it->second.refused == 0
             ? buckets_.erase(it)
             : std::next(it);
  }
}

}  // namespace rdmalock::lockd
