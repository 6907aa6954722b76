#include "client/lockctl/lease_watch.h"

#include <algorithm>

namespace lockctl {

LeaseWatch::Times LeaseWatch::Follow(Clock::time_point expiry, Clock::time_point now) {
  window_ = std::clamp<std::chrono::nanoseconds>(expiry - now, window_, lease_);
  return {expiry - window_ / 3, expiry - window_ / 10};
}

}  // namespace lockctl
