// Seams into a Client for tests that reach the SDK's session logic (issue 16). Not installed,
// not part of the API: the RDMA tests include it to pause or fail a client at a named point.
// Thread-safety: set the fault point before the client is used from other threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "rdmalock/client.h"
#include "rdmalock/export.h"

namespace rdmalock {

class RDMALOCK_EXPORT ClientTestPeer {
 public:
  // Named points the SDK calls `fn` at, on the thread that passes them:
  //   "granted": an acquire (Lock, LockMany, async) was granted; its handle is not made yet.
  static void SetFaultPoint(Client& c, std::function<void(std::string_view point)> fn);
  // Ends the current session as a connection error found by any thread would.
  static void FailSession(Client& c, const std::string& why);
  // The current session's join key (what a further connection of the session presents).
  static uint64_t JoinKey(Client& c);
};

}  // namespace rdmalock
