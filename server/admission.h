// Admission: whether lockd takes a connection request, decided before any verbs object exists
// for it. Pure decisions over plain facts and a time the caller passes: the allow-list
// (allow_from), the loopback's proof, the per-address rate limit, the restart grace period, the
// caps (handshakes in progress, max_clients, connections per session), and the throttled
// refusal log. Unit-tested without verbs (tests/unit/admission_test.cc).
//
// Threading: owned by lockd's event loop and used only from it; no mutex. (The shared key, which
// a reload replaces from the main thread, is not here: the server keeps it under its mutex.)
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rdmalock/proto/handshake.h"
#include "rdmalock/status.h"
#include "server/acl.h"
#include "server/budgets.h"
#include "server/config.h"
#include "server/refusal_log.h"

namespace rdmalock::lockd {

// What the event loop knows about a connection request when it decides on it.
struct ConnectFacts {
  std::string peer;                                          // "ADDRESS:PORT"
  proto::RejectReason decoded = proto::RejectReason::kNone;  // the request's decoding
  std::string decoded_why;        // what is wrong with it, when `decoded` is not kNone
  bool flagged_loopback = false;  // it sets proto::kFlagLoopback
  bool loopback_proven = false;   // ... and proves it is this lockd's own (LoopbackProven)
  bool address_allowed = false;   // its address is in allow_from
  bool join = false;              // it sets proto::kFlagJoin
  uint64_t join_session = 0;
  // For a join: the session exists and the key matches (and the request is not flagged
  // loopback); the session's connections now.
  bool join_valid = false;
  size_t join_session_conns = 0;
  bool records_free = false;                // a session record is free (for a new session)
  bool client_records_free = false;         // ... beyond the one kept for lockd's loopback
  uint64_t connected = 0;                   // client sessions connected now
  size_t handshakes = 0;                    // handshakes in progress now
  size_t new_handshakes_from_address = 0;   // ... of new sessions, from the request's address
  size_t join_handshakes_of_session = 0;    // ... of joins of the session it joins
  size_t join_handshakes_from_address = 0;  // ... of joins, from the request's address
};

// A refusal, or kNone to go on with the handshake.
struct Verdict {
  proto::RejectReason reason = proto::RejectReason::kNone;
  std::string detail;
  uint32_t retry_after_ms = 0;
  bool log = true;  // false: counted, but the rate limiter logs its refusals itself
  bool admitted() const { return reason == proto::RejectReason::kNone; }
  bool loopback = false;  // admitted as lockd's own loopback connection
};

class Admission {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxTrackedPeers = 65536;

  // `grace_until`: clients are refused before it (lockd restarted after an unclean stop); the
  // epoch of the clock for none.
  Admission(const Config& config, std::vector<Cidr> allow_from, Clock::time_point grace_until);

  // Decides on a connection request, in the order lockd has always checked: the loopback's proof,
  // allow_from, the rate limit (except for a valid join of a thread to its own session), the
  // request's decoding, the grace period, handshakes in progress, then the session's caps.
  Verdict Decide(const ConnectFacts& f, Clock::time_point now);

  bool AddressAllowed(const sockaddr* peer) const {
    return lockd::AddressAllowed(allow_from_, peer);
  }

  // A token bucket per peer address (without the port): max_connects_per_second tokens a second,
  // bursts of as many. Returns 0 to admit, else the ms until a token is there. Refusals are
  // logged at most once a second per address, with how many there were.
  uint32_t RateLimit(const std::string& peer, Clock::time_point now);

  // Logs a refusal with the peer and the reason, at most once a second per address and reason
  // (a peer retrying in a loop cannot flood the log); says how many were not logged.
  void LogRefusal(const std::string& peer, proto::RejectReason reason, const std::string& detail,
                  uint32_t retry_after_ms, Clock::time_point now);

  // Whether to log a failed handshake of `peer` (an address and port) of the kind `what` at `now`:
  // at most once a second per address and kind, as refusals.
  bool ShouldLogFailure(const std::string& peer, std::string_view what, Clock::time_point now) {
    return refusal_log_.ShouldLog(peer.substr(0, peer.rfind(':')) + "/" + std::string(what), now);
  }

  // Every tick: logs the rate limiter's pending refusal counts and forgets idle addresses.
  void Tick(Clock::time_point now);

  size_t tracked_peers() const { return buckets_.size(); }

 private:
  struct PeerBucket {
    double tokens = 0;
    Clock::time_point refilled, logged;
    uint64_t refused = 0;  // since the last log line
  };
  void LogRefused(const std::string& addr, PeerBucket& b, Clock::time_point now);

  // Constant after construction.
  const uint32_t max_connects_per_second_;
  const uint32_t max_clients_;
  const uint32_t max_connections_per_session_;
  const std::vector<Cidr> allow_from_;  // empty: any address
  const Clock::time_point grace_until_;

  // Owned by the event loop.
  RefusalLog refusal_log_{kMaxTrackedPeers};  // refusals logged once a second per (addr, reason)
  std::unordered_map<std::string, PeerBucket> buckets_;  // by peer address
  // With kMaxTrackedPeers addresses tracked, every further address shares this one bucket.
  PeerBucket overflow_;
  bool overflow_started_ = false;
};

}  // namespace rdmalock::lockd
