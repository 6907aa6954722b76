// lockctl acquire's times to end its command (client/lockctl/lease_watch.h), over a simulated
// lease: renewals every L/3, and against a cluster-mode lockd a trust limit the keeper moves to
// (its previous READ's issue + T) at every heartbeat.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>

#include "client/lockctl/lease_watch.h"

using namespace std::chrono_literals;
using Clock = lockctl::LeaseWatch::Clock;

namespace {

// A healthy holder's lease_expiry() over `run`, sampled every 20 ms as lockctl does; returns the
// first time the command would have been sent SIGTERM (Clock::time_point::max() if never), and
// checks the SIGKILL always comes before the lease's end.
Clock::time_point FirstTerm(std::chrono::milliseconds lease, std::chrono::milliseconds t,
                            std::chrono::milliseconds heartbeat, std::chrono::milliseconds run) {
  const Clock::time_point start{};  // the simulation's time 0
  lockctl::LeaseWatch watch(lease);
  Clock::time_point lease_start = start, trusted_until = start + t, prev_read = start;
  Clock::time_point next_renewal = start + lease / 3, next_beat = start + heartbeat;
  for (auto now = start; now < start + run; now += 20ms) {
    while (next_renewal <= now) {
      lease_start = next_renewal;
      next_renewal += lease / 3;
    }
    while (next_beat <= now) {  // lockd ticked since: trust until the previous READ + T
      trusted_until = prev_read + t;
      prev_read = next_beat;
      next_beat += heartbeat;
    }
    const auto expiry = std::min(lease_start + lease, trusted_until);
    const lockctl::LeaseWatch::Times times = watch.Follow(expiry, now);
    REQUIRE(times.kill_at < expiry);
    if (now >= times.term_at) return now;
  }
  return Clock::time_point::max();
}

}  // namespace

// Found by review (2026-12-05): the SIGTERM came a third of a *lease* before lease_expiry(), which
// against a cluster-mode lockd is bounded by the trust limit too: with lease_ms 6000 and the
// default heartbeats (T 2 s) the time left is about 1.6-2 s, less than L/3, and a healthy
// command was stopped at once ("its lease was about to run out without a renewal", exit 76).
TEST_CASE("lockctl acquire: a healthy holder's command is never stopped, cluster mode or not") {
  const auto never = Clock::time_point::max();
  // No trust limit (T far beyond the run): the lease alone, as before.
  CHECK(FirstTerm(2000ms, 3600s, 200ms, 10s) == never);
  CHECK(FirstTerm(6000ms, 3600s, 200ms, 20s) == never);
  // A cluster-mode lockd with the default T (2 s) and heartbeats (200 ms).
  const auto term = FirstTerm(6000ms, 2000ms, 200ms, 10s);
  INFO("lease 6000 ms, T 2000 ms: stopped after "
       << (term == never
               ? -1
               : std::chrono::duration_cast<std::chrono::milliseconds>(term - Clock::time_point{})
                     .count())
       << " ms (-1: never)");
  CHECK(term == never);
  CHECK(FirstTerm(2000ms, 2000ms, 200ms, 10s) == never);
  CHECK(FirstTerm(15000ms, 1400ms, 200ms, 10s) == never);  // T at its smallest: 1000 + 2 x 200
}

// The bound the supervisor keeps: a holder that renews nothing more is stopped before its lease
// ends, SIGTERM first.
TEST_CASE("lockctl acquire: a holder whose renewals stop is stopped before its lease ends") {
  lockctl::LeaseWatch watch(2000ms);
  const Clock::time_point t0{};
  const auto expiry = t0 + 2000ms;  // no renewal after the grant
  lockctl::LeaseWatch::Times times = watch.Follow(expiry, t0);
  for (auto now = t0; now < expiry; now += 20ms) times = watch.Follow(expiry, now);
  CHECK(times.term_at < times.kill_at);
  CHECK(times.kill_at < expiry);
  CHECK(times.term_at <= expiry - 600ms);  // about a third of a lease overdue
}
