// server/recovery: the worker that frees ended sessions' requests, as lockd starts and stops it.
// No RDMA here (the worker's loopback connection is null); what is checked is the life cycle.
#include "server/recovery.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "server/metrics.h"

using rdmalock::Error;
using rdmalock::ErrorCode;
using rdmalock::lockd::Counters;
using rdmalock::lockd::Recovery;

// lockd's main thread starts the worker (ProbeLoopback) while the event loop already runs; a loop
// that ends by itself (the RDMA device removed, a poll error) stops the worker and drops its
// loopback on its own thread. Start wrote the worker's thread and connection with no lock while
// Stop and DropLoopback read and reset them: a data race (a worker started after its Stop, a
// connection freed twice), found by review, 2026-12-06. TSan (CI's TSan stage) reports it; here
// Start after Stop must refuse, whichever comes first.
TEST_CASE("recovery: Start racing the event loop's Stop and DropLoopback") {
  auto connect =
      [](std::chrono::milliseconds) -> rdmalock::Result<std::unique_ptr<rdmalock::VerbsMemory>> {
    return Error(ErrorCode::kConnection, "no loopback in this test");
  };
  int refused = 0;
  for (int i = 0; i < 200; ++i) {
    Counters counters;
    Recovery r(rdmalock::EngineParams{.lock_count = 8}, &counters, connect);
    rdmalock::Status started;
    std::thread main_thread([&] { started = r.Start(nullptr); });
    std::thread loop_thread([&] {
      r.Stop();
      r.DropLoopback();
    });
    main_thread.join();
    loop_thread.join();
    if (!started.ok()) {
      ++refused;
      CHECK(started.code() == ErrorCode::kConnection);
    }
  }
  Counters counters;
  Recovery stopped(rdmalock::EngineParams{.lock_count = 8}, &counters, connect);
  stopped.Stop();
  const rdmalock::Status late = stopped.Start(nullptr);
  INFO(late.ToString() << "; refused in the races: " << refused);
  CHECK_FALSE(late.ok());
}
