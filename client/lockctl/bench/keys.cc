// lockctl bench's key sampling: the Zipf table and the distinct slots of a set (bench_internal.h).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "client/lockctl/bench/bench_internal.h"

namespace lockctl::bench {

KeySampler::KeySampler(const BenchOptions& o) : n_(o.locks) {
  if (o.keys != "zipf") return;
  cdf_.resize(n_);
  double sum = 0;
  for (uint64_t k = 0; k < n_; ++k) {
    sum += std::pow(static_cast<double>(k + 1), -o.zipf_s);
    cdf_[k] = sum;
  }
  for (double& c : cdf_) c /= sum;
  cdf_.back() = 1.0;
  stride_ = static_cast<uint64_t>(static_cast<double>(n_) * 0.6180339887498949);
  while (std::gcd(stride_, n_) != 1) ++stride_;
  offset_ = 0x9E3779B97F4A7C15ull % n_;
}

void PickSet(const BenchOptions& o, const KeySampler& keys, std::mt19937_64& rng,
             std::bernoulli_distribution& shared, std::vector<rdmalock::SlotRequest>& set,
             std::unordered_set<uint64_t>& taken) {
  const bool small = o.batch <= 64;
  set.clear();
  taken.clear();
  auto used = [&](uint64_t s) {
    if (small) {
      return std::any_of(set.begin(), set.end(),
                         [s](const rdmalock::SlotRequest& r) { return r.slot == s; });
    }
    return taken.count(s) > 0;
  };
  for (int i = 0; i < o.batch; ++i) {
    const auto mode = shared(rng) ? rdmalock::LockMode::kShared : rdmalock::LockMode::kExclusive;
    uint64_t slot = keys(rng);
    for (int tries = 0; tries < 16 && used(slot); ++tries) slot = keys(rng);
    while (used(slot)) slot = (slot + 1) % o.locks;
    set.push_back({.slot = slot, .mode = mode});
    if (!small) taken.insert(slot);
  }
}

}  // namespace lockctl::bench
