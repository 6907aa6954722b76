// ClientStats: the counters each channel keeps, summed over the client's channels and the
// channels of ended sessions. ClientStats's counters are listed once, in kCounters; the sum of
// two ClientStats (AddStats) walks that list, and a channel's counters map onto it once
// (ThreadChannel::AddStats).
#include <algorithm>
#include <iterator>

#include "client/src/client_impl.h"

namespace rdmalock {

namespace {

// Every counter of ClientStats (acquire_latency aside: a histogram, summed bucket by bucket).
constexpr uint64_t ClientStats::*kCounters[] = {
    &ClientStats::acquires,        &ClientStats::releases,
    &ClientStats::timeouts,        &ClientStats::lost,
    &ClientStats::waits,           &ClientStats::renewals,
    &ClientStats::renew_failures,  &ClientStats::fetch_add,
    &ClientStats::compare_swap,    &ClientStats::read,
    &ClientStats::write,           &ClientStats::recoveries,
    &ClientStats::restarts,        &ClientStats::withdrawals,
    &ClientStats::resets,          &ClientStats::abandoned,
    &ClientStats::sessions_lost,   &ClientStats::reconnects,
    &ClientStats::unrecorded,      &ClientStats::batches,
    &ClientStats::batch_fallbacks, &ClientStats::deferred_releases,
    &ClientStats::release_misses,  &ClientStats::local_handovers,
    &ClientStats::local_shares,
};
// A counter added to ClientStats but not to kCounters would go unsummed.
static_assert(sizeof(ClientStats) ==
                  std::size(kCounters) * sizeof(uint64_t) + sizeof(LatencyHistogram),
              "every ClientStats counter is listed in kCounters");
static_assert(sizeof(LatencyHistogram) == (LatencyHistogram::kBuckets + 2) * sizeof(uint64_t),
              "every LatencyHistogram counter is summed in ForEachCounter");

// Calls f(a.x, b.x) for every counter of a and b, the histogram's included.
template <typename F>
void ForEachCounter(ClientStats& a, const ClientStats& b, F f) {
  for (uint64_t ClientStats::*c : kCounters) f(a.*c, b.*c);
  for (size_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
    f(a.acquire_latency.counts[i], b.acquire_latency.counts[i]);
  }
  f(a.acquire_latency.count, b.acquire_latency.count);
  f(a.acquire_latency.sum_us, b.acquire_latency.sum_us);
}

}  // namespace

ClientStats& operator+=(ClientStats& a, const ClientStats& b) {
  ForEachCounter(a, b, [](uint64_t& x, uint64_t y) { x += y; });
  return a;
}

ClientStats& operator-=(ClientStats& a, const ClientStats& b) {
  ForEachCounter(a, b, [](uint64_t& x, uint64_t y) { x -= y; });
  return a;
}

namespace sdk {

void AddStats(const ClientStats& from, ClientStats* to) { *to += from; }

void LatencyCounters::Add(Clock::duration d) {
  const auto us = static_cast<uint64_t>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(d).count()));
  ++buckets[LatencyHistogram::BucketOf(us)];
  ++count;
  sum_us.Add(us);
}

void LatencyCounters::AddTo(LatencyHistogram* h) const {
  for (size_t i = 0; i < LatencyHistogram::kBuckets; ++i) h->counts[i] += buckets[i].get();
  h->count += count.get();
  h->sum_us += sum_us.get();
}

void ThreadChannel::AddStats(ClientStats* out) const {
  ClientStats s;
  const OpCounters& c = mem->counters();
  s.fetch_add = c.fetch_add.get();
  s.compare_swap = c.compare_swap.get();
  s.read = c.read.get();
  s.write = c.write.get();
  s.acquires = acquires.get();
  s.waits = events.waits.get();
  latency.AddTo(&s.acquire_latency);
  s.releases = releases.get();
  s.timeouts = timeouts.get();
  s.lost = lost.get();
  s.unrecorded = unrecorded.get();
  s.recoveries = events.recoveries.get();
  s.restarts = events.restarts.get();
  s.withdrawals = events.withdrawals.get();
  s.resets = events.resets.get();
  s.abandoned = events.abandoned.get();
  s.deferred_releases = events.deferred.get();
  s.release_misses = events.release_misses.get();
  s.batch_fallbacks = events.batch_fallbacks.get();
  s.renewals = events.renewals.get();  // a set's, while it waited (the keeper's are client-wide)
  s.renew_failures = events.renew_failures.get();
  s.batches = batches.get();
  s.local_handovers = local_handovers.get();
  s.local_shares = local_shares.get();
  sdk::AddStats(s, out);
}

}  // namespace sdk

ClientStats Client::Impl::Stats() const {
  MutexLock lk(&mu_);
  return StatsLocked();
}

ClientStats Client::Impl::StatsLocked() const {
  ClientStats out;
  out.renewals = renewals_.load(std::memory_order_relaxed);
  out.renew_failures = renew_failures_.load(std::memory_order_relaxed);
  out.sessions_lost = sessions_lost_;
  out.reconnects = reconnects_;
  for (const auto& [tid, ch] : channels_) ch->AddStats(&out);
  sdk::AddStats(retired_, &out);
  return out;
}

ClientStats Client::Stats() const { return impl_->inherited() ? ClientStats{} : impl_->Stats(); }

}  // namespace rdmalock
