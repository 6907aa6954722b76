// lockd's queue budgets, named and tied together: the handshake's work requests on a
// connection's QP, the completions the device CQ shared by every connection must hold, and the
// handshakes in progress that bound them. Where one number depends on another it is derived or
// static_assert'ed here, so changing one cannot silently overflow another.
//
// Threading: constants only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "rdmalock/proto/handshake.h"

namespace rdmalock::lockd {

// Memory windows bound per connection (with memory_windows on): the info page, the lock table,
// the session table, and the client's own record. The Welcome carries one rkey for each.
inline constexpr size_t kWindowsPerConnection = 4;

// The connections a client of librdmalock makes at connect: the calling thread's, the keeper's
// and the reaper's (rdmalock.h, rdmalock_connect). lockd's start check sizes max_clients against
// the device's limits with this many per client (CheckDeviceLimits).
inline constexpr uint64_t kConnectionsPerClient = 3;

// A connection's send queue carries, once, the window binds and then the Welcome (or one
// refusal) chained after them; its receive queue the Hello only. Nothing else is ever posted on
// lockd's side of a client's QP: the client's operations are one-sided.
inline constexpr uint32_t kHandshakeSends = kWindowsPerConnection + 1;
inline constexpr uint32_t kHandshakeSendDepth = 8;  // with room to spare, as it always had
inline constexpr uint32_t kHandshakeRecvDepth = 1;
static_assert(kHandshakeSendDepth >= kHandshakeSends,
              "the binds and the Welcome must fit the send queue in one post");

// Handshakes in progress at once (accepted, and neither gone nor over: a handshake is over
// when its Welcome completes, not when it is posted); more are refused with kBusy. Bounds the
// completions lockd's CQ must hold: a connection whose handshake is over has no work request
// outstanding on lockd's side.
inline constexpr size_t kMaxHandshakes = 128;
// A connection lockd accepted must be admitted (established, and its Hello verified) within this
// long. A client that never completes holds a QP and a session record, but no rkey: the rkeys
// travel only in the Welcome.
inline constexpr auto kEstablishTimeout = std::chrono::seconds(5);
// Of those, the new sessions' handshakes from one address (joins of live sessions and lockd's
// loopback not counted): one host without the key, at max_connects_per_second, would otherwise
// keep all of them (each lives up to kEstablishTimeout) and reserve a session record for each.
// A busy refusal says to retry in 100 ms, which the SDK does within its connect timeout.
inline constexpr size_t kMaxNewHandshakesPerAddress = 16;
static_assert(kMaxNewHandshakesPerAddress >= 1 && kMaxNewHandshakesPerAddress < kMaxHandshakes,
              "one address must not be able to hold every handshake in progress");
// Of the handshakes in progress, these are for joins (a live session's new thread, its join key
// checked at the connect request): new sessions' handshakes take at most the rest, so peers
// without the key, from however many addresses, cannot keep the clients that have it from
// adding threads.
inline constexpr size_t kHandshakesKeptForJoins = 32;
static_assert(kHandshakesKeptForJoins >= 1 &&
                  kHandshakesKeptForJoins + kMaxNewHandshakesPerAddress <= kMaxHandshakes,
              "new sessions and joins must each have room");

// Joins in progress (a live session's new threads, its join key checked) of one session, and
// from one address: joins need no new record and skip the rate limit (a client's threads connect
// together when they start), so without these one session's join requests that never complete
// held all kMaxHandshakes, again after each kEstablishTimeout drop, and every other client's new
// sessions and threads were refused busy (found by review, 2026-12-06). Past them a join is told
// to retry in 100 ms, which the SDK does.
inline constexpr size_t kMaxJoinHandshakesPerSession = 16;
inline constexpr size_t kMaxJoinHandshakesPerAddress = 24;
static_assert(kMaxJoinHandshakesPerSession >= 1 &&
                  kMaxJoinHandshakesPerSession <= kMaxJoinHandshakesPerAddress,
              "a session's joins come from its address");
static_assert(kMaxJoinHandshakesPerAddress + kMaxNewHandshakesPerAddress < kMaxHandshakes,
              "one address must not be able to hold every handshake in progress");
static_assert(kMaxJoinHandshakesPerAddress < kHandshakesKeptForJoins,
              "one address's joins must not take every handshake kept for joins");

// Completions one handshake can put on the device CQ: every work request it posted, when a QP
// error flushes them all (binds are unsignalled, but flushed work requests complete).
inline constexpr size_t kCompletionsPerHandshake = kHandshakeSends + kHandshakeRecvDepth;
// The device CQ shared by the connections of one device (capped by the device's max_cqe).
inline constexpr int kCqDepth = 8 * kMaxHandshakes;
static_assert(kCqDepth >= kCompletionsPerHandshake * kMaxHandshakes,
              "the CQ must hold every completion of the handshakes in progress");

// Completions taken from the CQ per poll call.
inline constexpr int kPollBatch = 16;

}  // namespace rdmalock::lockd
