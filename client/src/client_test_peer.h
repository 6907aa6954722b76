// Seams into a Client for tests that reach the SDK's session logic (issue 16). Not installed,
// not part of the API, and not exported from librdmalock.so: the tests link the SDK statically
// (rdmalock_sdk_testing) to pause or fail a client at a named test hook, or to run it over the
// in-process backend.
// Thread-safety: set the test hook before the client is used from other threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "engine/connection.h"
#include "rdmalock/client.h"

namespace rdmalock {

class ClientTestPeer {
 public:
  // Test hooks: named points the SDK calls `fn` at (Client::Impl::TestHook), on the thread that
  // passes them:
  //   "hashed": Lock, LockMany or LockAsync hashed its names to slots with the session's lock
  //     count; nothing is requested yet.
  //   "submitting": an async request passed its checks and is about to be queued.
  //   "granted": an acquire (Lock, LockMany, async) was granted; its handle is not made yet.
  //   "shared": a shared request joined another thread's shared grant in-process (cohort.h).
  //   "sharing": a blocking shared request's grant from lockd is about to become the one that
  //     the client's other readers join (Client::Impl::ShareGrant); its handle is made.
  //   "reaper_slowing": the reaper thread found no posted release left for 20 ms and is about
  //     to stop ticking; called on the reaper thread, with no mutex of the client held.
  //   "session_ended": the session has ended (a new one is not made yet), and its locks are not
  //     yet reported lost; called on the thread that ended it, with no mutex of the client held.
  static void SetTestHook(Client& c, std::function<void(std::string_view point)> fn);
  // While set, the keeper renews nothing (its heartbeats go on): leases run out as they would
  // behind a stuck renewer.
  static void PauseRenewals(Client& c, bool paused);
  // Stops (true) or restarts (false) the keeper's work: no heartbeat, renewal, liveness watch or
  // reconnect while stopped, as a keeper thread descheduled would be.
  static void PauseKeeper(Client& c, bool paused);
  // While set, the reaper thread leaves the releases other threads posted alone
  // (Client::Impl::ReapLeftReleases): a release whose CAS missed waits for its thread's next call.
  static void PauseReleaseReaping(Client& c, bool paused);
  // Takes (true) or gives back (false) the spin lock of the held list of this thread's channel,
  // as a grant or release on another thread holds it for a few stores: a fork() meanwhile leaves
  // it held in the child.
  static void HoldHeldList(Client& c, bool hold);
  // Ends the current session as a connection error found by any thread would.
  static void FailSession(Client& c, const std::string& why);
  // A client whose every connection is made by `connector` (a test lockd over the in-process
  // backend: tests/support/fake_lockd.h). options.server must not be empty. `hook` is its test
  // hook (SetTestHook) from before its threads start.
  static Result<std::unique_ptr<Client>> Connect(
      const ClientOptions& options, Connector connector,
      std::function<void(std::string_view point)> hook = nullptr);
  // The current session's join key (what a further connection of the session presents).
  static uint64_t JoinKey(Client& c);
  // Expires once the client's implementation (its threads' shared state) has been destroyed,
  // which may be after ~Client returned (issue 17, finding 9: a client closed from its own
  // callback is finished on that thread).
  static std::weak_ptr<const void> Lifetime(Client& c);
  // How many of the client's threads wait in-process for `slot` (cohort handover, cohort.h);
  // 0 with ClientOptions::local_handover off; kWaitersMiscounted if the entry's count of its
  // queue (CohortEntry::waiting) disagrees with the queue.
  static constexpr size_t kWaitersMiscounted = ~size_t{0};
  static size_t LocalWaiters(Client& c, uint64_t slot);
  // The cohort entry of `slot` says a thread of the client holds a grant lockd gave at once
  // (CohortEntry::held_here: its local waiters spin before they park).
  static bool HeldHere(Client& c, uint64_t slot);
  // The budget units (requests queued, held or left to the reaper) the client counts on `slot`'s
  // bucket now (finding 11's SlotBudget): 0 once every request on it has ended.
  static uint32_t BudgetUnits(Client& c, uint64_t slot);
};

}  // namespace rdmalock
