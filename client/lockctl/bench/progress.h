// lockctl bench's progress line: on a terminal (and never with --json), one line redrawn in place
// a few times a second while the bench runs, "bench: 2.0s of 5s  123456 acquisitions  61728/s
// now", cleared before the report. It reads counters the workers keep; it takes nothing from
// the measured path but one relaxed store per set (each worker its own cache line).
//
// Threading: a ProgressCounters is created by RunBench's main thread before it forks, so the
// children share its mapping; each worker thread of each process writes only its own slot (one
// writer: a relaxed load and store, no read-modify-write), and only the parent's main thread
// reads the sum (relaxed loads: a figure for people, not a synchronization). The functions are
// pure.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace lockctl::bench {

// One worker's measured acquisitions, alone on its cache line.
struct alignas(64) ProgressSlot {
  std::atomic<uint64_t> acquired{0};
  // The worker's own addition: it is this slot's only writer, so no atomic RMW is needed.
  void Add(uint64_t n) {
    acquired.store(acquired.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

// `slots` ProgressSlots in anonymous shared memory (MAP_SHARED: forked children write the same
// pages), unmapped at destruction.
class ProgressCounters {
 public:
  // Null if the mapping fails (the bench then runs without a progress line).
  static std::unique_ptr<ProgressCounters> Create(size_t slots);
  ~ProgressCounters();
  ProgressCounters(const ProgressCounters&) = delete;
  ProgressCounters& operator=(const ProgressCounters&) = delete;

  ProgressSlot* slot(size_t i) { return &slots_[i]; }
  uint64_t Sum() const;

 private:
  ProgressCounters(ProgressSlot* slots, size_t n) : slots_(slots), n_(n) {}
  ProgressSlot* slots_;
  size_t n_;
};

// Whether to draw the line: `fd` (stdout) is a terminal and the output is not JSON.
bool ShouldShowProgress(bool json, int fd);

// The line's text (no \r): "bench: warm-up 0.3s of 0.5s" while warming up, else "bench: 2.0s of
// 5s  123456 acquisitions  61728/s now" (the rate over the last redraw interval).
std::string FormatProgress(bool warmup, double elapsed_s, double total_s, uint64_t acquired,
                           double rate_per_s);

// How often the line is redrawn.
inline constexpr int kProgressIntervalMs = 250;

}  // namespace lockctl::bench
