// What rdma_worker processes and the test process share through a mapped file.
#pragma once

#include <atomic>

struct WorkerShared {
  std::atomic<int> writers{0}, readers{0}, violations{0}, max_readers{0}, errors{0}, ops{0};
  std::atomic<int> next{0};
  std::atomic<int> order[16] = {};
};
