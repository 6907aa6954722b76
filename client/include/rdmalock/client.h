// librdmalock: the rdmalock client SDK.
//
//   auto client = rdmalock::Client::Connect({.server = "192.0.2.1"});
//   if (!client.ok()) { /* client.status().ToString() says why */ }
//   auto lock = (*client)->Lock("orders/42", {.timeout = std::chrono::seconds(1)});
//   if (lock.ok()) { ... critical section ...; }  // released when `lock` goes out of scope
//
// Locks are acquired and released with one-sided RDMA atomics on lockd's lock table; lockd's CPU
// is not involved. Every call returns Status or Result<T>; nothing throws.
//
// Thread-safety: a Client may be shared by any number of threads. Each thread's operations go out
// on an RDMA connection of its own, made on the thread's first operation, so the lock path takes
// no lock that threads share: only the calling thread's own (uncontended) ones, and no heap
// allocation once warm. A LockHandle belongs to one thread at a time but may be moved between
// threads.
//
// Sessions: a Client is one session at lockd; its threads' connections join it. The client keeps
// a heartbeat in its session record and records each request there, so that lockd frees a dead
// client's locks at once. If the session ends (lockd restarted, or fenced this client, or the
// network failed), every lock it held is reported lost (OnLost), and the client reconnects by
// itself with back-off; calls made meanwhile wait for the new session within their timeout.
//
// Callbacks (OnLost, LockAsync's) may destroy the Client, also on the client's own threads: that
// thread is then detached and finishes by itself once the callback returns. Not the ones the
// Client's own destructor runs (the locks still held are told they are lost, on the destroying
// thread, inside ~Client): destroying it again from there destroys it twice.
//
// fork(): a child process inherits its parent's Clients and LockHandles but cannot use them:
// every call fails with kUnsupported (accessors return 0, handles read kLost), and destroying them
// (or the child's exit) touches nothing of the parent's, which keeps its session and locks. A
// child that needs locks connects a Client of its own after exec.
#pragma once

#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rdmalock/export.h"
#include "rdmalock/status.h"

namespace rdmalock {

enum class LockMode : uint8_t { kExclusive = 0, kShared = 1 };

struct ClientOptions {
  std::string server;    // lockd's address (an IP of its RDMA device, or a name). Required.
  uint16_t port = 7471;  // lockd's rdma_cm port (not 0)
  // How long Connect (and each reconnect) may take: 1 ms to kMaxConnectTimeout, else Connect
  // fails with kInvalidArgument.
  std::chrono::milliseconds connect_timeout{5000};
  static constexpr std::chrono::hours kMaxConnectTimeout{24 * 366};
  std::string client_name;  // shown to operators; defaults to the program name
  // Renew held locks on a background thread every lease/3 (per-lock opt-out in LockOptions).
  bool auto_renew = true;
  // Record requests in the session record (so lockd frees them at once if this client dies).
  // Off: a dead client's locks are recovered by waiters after F x L only (tests use this).
  bool record_requests = true;
  // Reconnect by itself when the session ends. Off: calls fail with kConnection from then on.
  bool reconnect = true;
  // Threads of this client that want an exclusive lock another of its threads holds or is
  // acquiring queue in-process, and the holder hands the grant to the next of them with no RDMA
  // operation (at most 8 in a row, then it goes back to lockd so that other clients get their
  // turn). Blocking exclusive requests (Lock, LockSlot, TryLock, with or without a timeout); a
  // holder handed a grant gets a fencing token larger than the one before it. Auto-renewed shared
  // requests join another thread's shared grant of the lock in-process (at most 8 per grant,
  // and not while a writer of the client waits for it). See docs/sdk.md.
  bool local_handover = true;
  // The shared key of a lockd that authenticates clients (its auth_key_file). auth_key gives the
  // bytes; auth_key_file names a file holding them (trailing whitespace is stripped). Both empty:
  // the environment's RDMALOCK_AUTH_KEY, else the file RDMALOCK_AUTH_KEY_FILE names, else no key.
  // With a key the client also checks that lockd proves it holds the same one.
  std::string auth_key_file;
  std::string auth_key;
};

struct LockOptions {
  LockMode mode = LockMode::kExclusive;
  // How long to wait; nullopt waits for ever. Zero makes one attempt (as TryLock). One beyond
  // the steady clock's range (milliseconds::max()) waits for ever too. (A thread's first call
  // joins the session first, which a busy lockd may make take longer: see Client::Connect.)
  std::optional<std::chrono::milliseconds> timeout;
  // Read the slot's generation with the grant so an exclusive grant carries a fencing token. Costs
  // an RDMA READ in the same doorbell as the acquire's atomic.
  bool fencing_token = true;
  // Keep the lease alive while the handle lives (only if ClientOptions::auto_renew).
  bool auto_renew = true;
};

enum class LockState : uint8_t {
  kHeld,      // granted and, as far as this client knows, the lease is valid
  kReleased,  // released by this client
  kLost,      // the lease lapsed or a waiter recovered the lock: stop using the resource
};

class Client;

// An acquired lock. Releases on destruction and on being assigned to. A loss that release finds
// (the lease had run out, a waiter had recovered the lock) goes to the loss callback, once, as the
// owner cannot see a result: the client's keeper thread calls it soon after, not the thread that
// dropped the handle (dropped if the client closes first). Movable, not copyable.
class RDMALOCK_EXPORT LockHandle {
 public:
  LockHandle() = default;
  LockHandle(LockHandle&&) noexcept;
  LockHandle& operator=(LockHandle&&) noexcept;
  LockHandle(const LockHandle&) = delete;
  LockHandle& operator=(const LockHandle&) = delete;
  ~LockHandle();

  bool valid() const { return state_ != nullptr; }
  uint64_t slot() const;
  LockMode mode() const;
  // kLost as soon as the lease has run out, whether or not anything renewed it (auto_renew off,
  // or the renewer stuck); OnLost fires then too (from the keeper, within a twelfth of a lease).
  LockState state() const;
  // Fencing token of an exclusive grant (0 for shared grants or without
  // LockOptions::fencing_token): epoch:16 | generation:29 | ticket:15 | local:4, local being the
  // number of in-process handovers of the client's grant (0 for a grant from lockd). Successive
  // exclusive holders get strictly larger tokens.
  uint64_t fencing_token() const;
  // When the lease ends on this process's monotonic clock unless renewed.
  std::chrono::steady_clock::time_point lease_expiry() const;

  // Releases the lock. kLockLost (nothing released) if the lease lapsed, the session with lockd
  // had ended, or the lock was recovered by a waiter, whatever else failed on the way; the handle
  // is then in state kLost.
  //
  // Unless requests were seen queued behind the grant (then it releases at once, for their
  // sake), the release's COMPARE_AND_SWAP is posted and Release() returns without waiting for it:
  // its completion is reaped by this thread's next call on the client, or by the client's reaper
  // thread within about a millisecond. If the CAS finds requests queued since the grant was last
  // seen, the release is retried then. A failure found that late (the connection broke) ends the
  // session like any other: every held lock is reported lost. Client::Flush() waits for them.
  Status Release();
  // Extends the lease by one lease period from now.
  Status Renew();
  // Called once if the lock is found lost while held: its lease could not be renewed, a waiter
  // recovered it, or the session with lockd ended. Runs on the thread that noticed (the client's
  // keeper thread, or a thread whose call found the session broken; never one dropping a handle:
  // the keeper tells for it); keep it short. It may
  // destroy the Client (not call Release or Renew on this handle). A lock found lost before any
  // callback was set is told to the first one set, at once, on the thread that sets it. Closing
  // the Client waits for its keeper thread: do not close it while holding a mutex that a loss
  // callback takes.
  void OnLost(std::function<void(const Status&)> callback);

  struct State;

 private:
  friend class Client;
  explicit LockHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

// What lockd publishes in its info page.
struct ServerInfo {
  uint64_t epoch = 0;
  uint64_t lock_count = 0;
  std::chrono::nanoseconds lease{0};
  uint32_t stall_factor = 0;
  uint64_t max_sessions = 0;
  uint64_t connected_clients = 0;
  uint64_t accepted_total = 0;
  uint64_t rejected_total = 0;
  uint64_t start_time_unix_ns = 0;
  uint64_t clock_unix_ns = 0;        // lockd's clock at its last tick
  uint64_t grace_until_unix_ns = 0;  // restart grace end (0: none)
  uint64_t recoveries = 0;           // sessions lockd recovered (dead, fenced or forced)
};

// A decoded lock slot as read (not atomically across both words) from lockd.
struct SlotState {
  uint64_t slot = 0;
  uint16_t exclusive_issued = 0, shared_issued = 0;      // maxX, maxS
  uint16_t exclusive_released = 0, shared_released = 0;  // nX, nS
  uint64_t generation = 0;
  uint16_t renewals = 0;
  // Derived: outstanding requests, and who holds it now.
  uint32_t exclusive_outstanding = 0, shared_outstanding = 0;
  bool exclusive_held = false;  // the oldest outstanding exclusive request is granted
  uint32_t shared_holders = 0;  // shared requests granted and not yet released
  bool frozen = false;          // counters reached the reset threshold
};

// A request a session's record shows.
struct RequestInfo {
  enum class Status : uint8_t {
    kRequesting,  // the atomic was posted; its ticket is not known yet
    kWaiting,     // queued behind others
    kHolding,     // granted
    kStale,       // the ticket is no longer in the lock word (released or recovered meanwhile)
  };
  uint64_t slot = 0;
  LockMode mode = LockMode::kExclusive;
  Status status = Status::kRequesting;
  uint16_t ticket = 0;  // maxX (exclusive) or maxS (shared) as the request's atomic found it
};

// A client session lockd has now, as its session table shows it.
struct SessionInfo {
  uint64_t session_id = 0;
  std::string client_name;
  uint32_t pid = 0;
  std::string peer;  // address:port as lockd saw it
  uint64_t since_unix_ns = 0;
  bool lockd_loopback = false;  // lockd's own connection to its lock table
  // How long ago lockd last saw the client's heartbeat move (by lockd's clock); -1 if never.
  std::chrono::milliseconds heartbeat_age{-1};
  std::vector<RequestInfo> requests;  // from the record, checked against the lock words
};

// One lock of a set acquired together (Client::LockMany).
struct LockRequest {
  std::string_view name;
  LockMode mode = LockMode::kExclusive;
};
struct SlotRequest {
  uint64_t slot = 0;
  LockMode mode = LockMode::kExclusive;
};

// Acquire latency, from the call to the grant, in power-of-two buckets of microseconds.
struct LatencyHistogram {
  static constexpr size_t kBuckets = 26;
  // counts[i]: acquires that took more than UpperBoundUs(i - 1) and at most UpperBoundUs(i)
  // microseconds (bucket 0: at most 1 us); the last bucket has no upper bound.
  std::array<uint64_t, kBuckets> counts{};
  uint64_t count = 0;
  uint64_t sum_us = 0;

  static constexpr uint64_t UpperBoundUs(size_t i) { return uint64_t{1} << i; }
  static constexpr size_t BucketOf(uint64_t us) {
    const size_t b = us <= 1 ? 0 : static_cast<size_t>(std::bit_width(us - 1));
    return b < kBuckets ? b : kBuckets - 1;
  }
  // The upper bound of the bucket the q-quantile (0 < q <= 1) falls in; 0 if empty. For the last
  // bucket, its lower bound.
  uint64_t QuantileUs(double q) const {
    if (count == 0) return 0;
    const auto rank = static_cast<uint64_t>(q * static_cast<double>(count) + 0.999999);
    uint64_t seen = 0;
    for (size_t i = 0; i < kBuckets; ++i) {
      seen += counts[i];
      if (seen >= rank && counts[i] > 0) {
        return i + 1 < kBuckets ? UpperBoundUs(i) : UpperBoundUs(i - 1);
      }
    }
    return UpperBoundUs(kBuckets - 2);
  }
};

struct ClientStats {
  uint64_t acquires = 0, releases = 0, timeouts = 0, lost = 0;
  uint64_t waits = 0;  // acquires not granted by their first atomic (they queued behind others)
  // Background renewals (the keeper's, and a LockMany set's while it waits), and those that
  // failed.
  uint64_t renewals = 0, renew_failures = 0;
  uint64_t fetch_add = 0, compare_swap = 0, read = 0, write = 0;
  uint64_t recoveries = 0, restarts = 0, withdrawals = 0, resets = 0, abandoned = 0;
  uint64_t sessions_lost = 0;    // sessions that ended under this client (all locks reported lost)
  uint64_t reconnects = 0;       // new sessions after a loss
  uint64_t unrecorded = 0;       // requests made without a record entry (record full)
  uint64_t batches = 0;          // LockMany calls that acquired their set
  uint64_t batch_fallbacks = 0;  // of those, sets not all free at once (acquired in slot order)
  uint64_t deferred_releases = 0;  // posted releases whose CAS had to be retried later
  uint64_t release_misses = 0;     // release CASes that missed (requests queued since the grant
                                   // was last seen): each costs one more round trip
  uint64_t local_handovers = 0;    // grants handed to another thread of this client in-process
  uint64_t local_shares = 0;  // shared grants joined in-process (another thread's shared grant)
  LatencyHistogram acquire_latency;  // every granted acquire, blocking, batched or async
};
// Counter by counter (the histogram bucket by bucket): totals over several clients, or what a
// run added (end -= start).
RDMALOCK_EXPORT ClientStats& operator+=(ClientStats& a, const ClientStats& b);
RDMALOCK_EXPORT ClientStats& operator-=(ClientStats& a, const ClientStats& b);

class RDMALOCK_EXPORT Client {
 public:
  // Connects to lockd and checks the handshake. Each thread that uses the client later opens its
  // own connection on first use. The client's keeper (heartbeats, renewals) and reaper have theirs
  // before Connect returns, so the application's threads never take them: a lockd whose
  // max_connections_per_session is below those 3 (this thread's, the keeper's, the reaper's)
  // fails Connect with kResource, naming the key; a thread past the cap gets kResource. A
  // thread's first call joins the session first: lockd takes at most 16 of a session's joins in
  // handshake at once and tells the rest to retry in 100 ms, which the call does until its
  // deadline, and for a second at least (within connect_timeout) when the deadline is sooner (a
  // try-lock's, a renewal's, a release's; not an async request's, which its pump retries), so
  // such a first call may take longer than its timeout; kResource if lockd stays busy past that.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Locks by name: the name picks a slot by XXH3-64 modulo the lock count. Distinct names may
  // share a slot (and then a lock): that costs concurrency, never safety. A request (here, in
  // LockMany or LockAsync) whose session ended and was replaced, while it was made, by one with
  // a lockd of another lock count (restarted with a new configuration, or a standby configured
  // otherwise) fails with kConnection and holds nothing: the name maps to another slot there.
  Result<LockHandle> Lock(std::string_view name, const LockOptions& options = {});
  // One attempt: kBusy if the lock is held.
  Result<LockHandle> TryLock(std::string_view name, LockMode mode = LockMode::kExclusive);
  Result<LockHandle> LockSlot(uint64_t slot, const LockOptions& options = {});
  Result<LockHandle> TryLockSlot(uint64_t slot, LockMode mode = LockMode::kExclusive);

  // Acquires a set of locks (mixed modes), all or none. Every request's FETCH_AND_ADD goes out
  // in one doorbell, so a set whose locks are all free costs one round trip. If some are not
  // free, the set falls back to acquiring in ascending slot order (holding only locks below the
  // one it waits for), so two sets never deadlock. options.mode is ignored; timeout, fencing_token
  // and auto_renew apply to every lock. On failure (kTimeout, kBusy for a zero timeout, ...) no
  // lock of the set is held. Names that map to the same slot are acquired once, exclusive if any
  // of them asks so. The handles come back one per distinct slot, in ascending slot order.
  Result<std::vector<LockHandle>> LockMany(std::span<const LockRequest> requests,
                                           const LockOptions& options = {});
  Result<std::vector<LockHandle>> LockManySlots(std::span<const SlotRequest> requests,
                                                const LockOptions& options = {});
  // Asynchronous acquire: queues the request and returns at once; `done` runs exactly once, on
  // one of the client's async threads, with the handle or the error (kTimeout, kBusy, ...). The
  // client's async thread posts the FETCH_AND_ADDs of up to 8 queued requests in one doorbell, so
  // one application thread can keep many requests in flight. A request that must wait goes to
  // one of the client's 4 waiter threads, each waiting for one request at a time; while all four
  // are busy, the others wait in a queue, and one whose timeout passes there is given up (its
  // ticket withdrawn or released; one granted just then completes with the grant) by the async
  // thread within about 10 ms. A request that another
  // of this client's requests must be granted before (the cohort) waits for that grant on a
  // waiter thread, and at most 3 of the 4 do so at once: a fourth such request, whatever its
  // lock, waits for one of those three to end (its grant or its timeout). Without a timeout, a
  // request whose turn at lockd comes while all four are busy holds the lock until a thread is
  // free. Keep `done` short; it may release the handle or queue more requests. Errors found before
  // queueing (a bad argument, the client closing) are returned, and `done` does not run. Requests
  // still queued or waiting when the client closes complete with kConnection, and so does a request
  // queued at lockd when the session ends (as a blocking Lock that waits then): its ticket was that
  // session's, and lockd frees it.
  using LockCallback = std::function<void(Result<LockHandle>)>;
  Status LockAsync(std::string_view name, const LockOptions& options, LockCallback done);
  Status LockSlotAsync(uint64_t slot, const LockOptions& options, LockCallback done);

  // Releases handles together (their CASes in one doorbell). Returns the first error; every
  // handle is released or marked lost either way.
  Status ReleaseMany(std::span<LockHandle> handles);
  // Waits for this thread's posted releases to complete (and retries any that must be). A thread
  // with no connection in the current session (or while the client reconnects) posted none: Ok
  // at once, nothing joined, no wait.
  Status Flush();

  uint64_t SlotOf(std::string_view name) const;
  uint64_t lock_count() const;
  // The current session (changes when the client reconnects); 0 while reconnecting.
  uint64_t session_id() const;
  // lockd's epoch as of the current session.
  uint64_t epoch() const;
  std::chrono::nanoseconds lease() const;

  Result<ServerInfo> Info();
  Result<SlotState> Inspect(uint64_t slot);
  // Slots [first, first + count) read in bulk (RDMA READs of up to 64 KiB): for tools that scan
  // the table, such as lockctl top. Not a snapshot: words change while it reads.
  Result<std::vector<SlotState>> InspectRange(uint64_t first, uint64_t count);
  // Every session lockd has now, with the requests its record shows.
  Result<std::vector<SessionInfo>> Sessions();
  // Counters summed over every thread's connection.
  ClientStats Stats() const;

  class Impl;

 private:
  friend class ClusterClient;
  friend class ClientTestPeer;  // tests' seams (client/src/client_test_peer.h), not installed
  // Where lockd is now (server, port): asked before every (re)connection, for a lockd that can
  // move (a shard's primary in etcd). options.server and .port are ignored.
  using Resolver = std::function<Result<std::pair<std::string, uint16_t>>()>;
  static Result<std::unique_ptr<Client>> ConnectResolving(const ClientOptions& options,
                                                          Resolver resolve);
  explicit Client(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// The slot a name maps to among `lock_count` slots (XXH3-64, seed 0); 0 if `lock_count` is 0.
RDMALOCK_EXPORT uint64_t SlotForName(std::string_view name, uint64_t lock_count);

}  // namespace rdmalock
