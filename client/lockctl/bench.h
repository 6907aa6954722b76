// lockctl bench: a closed-loop lock workload that prints what it measured.
#pragma once

#include <cstdint>
#include <string>

#include "rdmalock/client.h"

namespace lockctl {

struct BenchOptions {
  int threads = 1;
  uint64_t locks = 10000;  // distinct slots, chosen uniformly
  double duration_s = 5.0;
  double warmup_s = 0.5;
  double shared_ratio = 0.0;  // fraction of acquisitions in shared mode
  bool token = false;         // ask for fencing tokens (adds a READ to each acquire)
  int hold_us = 0;            // critical section: hold each lock this long (busy-wait)
  bool json = false;
};

// Runs the workload on `client` and prints the report to stdout. Returns the process exit code.
int RunBench(rdmalock::Client& client, const BenchOptions& opts);

}  // namespace lockctl
