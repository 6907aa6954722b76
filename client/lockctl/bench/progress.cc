#include "client/lockctl/bench/progress.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <new>

namespace lockctl::bench {

std::unique_ptr<ProgressCounters> ProgressCounters::Create(size_t slots) {
  if (slots == 0) return nullptr;
  void* p = mmap(nullptr, slots * sizeof(ProgressSlot), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* s = static_cast<ProgressSlot*>(p);
  for (size_t i = 0; i < slots; ++i) new (&s[i]) ProgressSlot();
  return std::unique_ptr<ProgressCounters>(new ProgressCounters(s, slots));
}

ProgressCounters::~ProgressCounters() {
  for (size_t i = 0; i < n_; ++i) slots_[i].~ProgressSlot();
  munmap(slots_, n_ * sizeof(ProgressSlot));
}

uint64_t ProgressCounters::Sum() const {
  uint64_t sum = 0;
  for (size_t i = 0; i < n_; ++i) sum += slots_[i].acquired.load(std::memory_order_relaxed);
  return sum;
}

bool ShouldShowProgress(bool json, int fd) { return !json && isatty(fd) == 1; }

std::string FormatProgress(bool warmup, double elapsed_s, double total_s, uint64_t acquired,
                           double rate_per_s) {
  char buf[160];
  if (warmup) {
    std::snprintf(buf, sizeof(buf), "bench: warm-up %.1fs of %gs", elapsed_s, total_s);
  } else {
    const double rate = std::isfinite(rate_per_s) && rate_per_s > 0 ? rate_per_s : 0;
    std::snprintf(buf, sizeof(buf), "bench: %.1fs of %gs  %llu acquisitions  %.0f/s now", elapsed_s,
                  total_s, static_cast<unsigned long long>(acquired), rate);
  }
  return buf;
}

}  // namespace lockctl::bench
