// What rdma_worker processes and the test process share through a mapped file.
#pragma once

#include <atomic>

struct WorkerShared {
  std::atomic<int> writers{0}, readers{0}, violations{0}, max_readers{0}, errors{0}, ops{0};
  std::atomic<int> next{0};
  std::atomic<int> order[16] = {};
  // "hold" workers
  std::atomic<int> granted{0}, lost{0}, release_code{-1}, stale_accepted{0}, stale_rejected{0};
  std::atomic<uint64_t> token{0};
  // "hold ... warm": RDMA READs of the held lock's acquire (0: its entry was tagged from the
  // session's generation table, no READ of word1), -1 until known.
  std::atomic<int> held_reads{-1};
  // A fenced resource: accepts a write only with a token above every token it accepted before.
  std::atomic<uint64_t> resource_max{0};
  std::atomic<int> resource_writes{0};

  bool WriteResource(uint64_t tok) {
    uint64_t cur = resource_max.load();
    while (tok > cur) {
      if (resource_max.compare_exchange_weak(cur, tok)) {
        resource_writes++;
        return true;
      }
    }
    return false;
  }
};
