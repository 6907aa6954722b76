// A client process for the RDMA integration tests. The tests exec it (a forked child of a process
// that already used librdmacm cannot use rdma_cm itself), and it reports through a shared file.
//
//   rdma_worker exclusion SERVER PORT SHM INDEX OPS
//   rdma_worker fifo      SERVER PORT SHM INDEX
//   rdma_worker hold      SERVER PORT SHM INDEX NAME x|s [norecord]
//     takes the lock, writes the fenced resource with its token, and holds it (renewing) until
//     told it lost it; then tries the resource again and releases, recording what happened.
//     norecord: without request records (lockd cannot free it; only stall recovery can).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "rdmalock/client.h"
#include "tests/rdma/worker_shared.h"

using namespace rdmalock;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: rdma_worker MODE SERVER PORT SHM INDEX [OPS]\n");
    return 64;
  }
  const std::string mode = argv[1];
  const int index = std::atoi(argv[5]);
  const int fd = open(argv[4], O_RDWR);
  if (fd < 0) return 65;
  void* p = mmap(nullptr, sizeof(WorkerShared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return 66;
  auto* sh = static_cast<WorkerShared*>(p);

  ClientOptions o;
  o.server = argv[2];
  o.port = static_cast<uint16_t>(std::atoi(argv[3]));
  o.client_name = "rdma_worker-" + std::to_string(index);
  o.record_requests = !(mode == "hold" && argc > 8 && std::string(argv[8]) == "norecord");
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "rdma_worker %d: %s\n", index, c.status().ToString().c_str());
    return 10;
  }

  if (mode == "exclusion") {
    const int ops = argc > 6 ? std::atoi(argv[6]) : 100;
    std::mt19937 rng(static_cast<unsigned>(index) * 31 + 7);
    for (int i = 0; i < ops; ++i) {
      const bool excl = rng() % 3 == 0;
      LockOptions lo;
      lo.mode = excl ? LockMode::kExclusive : LockMode::kShared;
      lo.timeout = std::chrono::milliseconds(30000);
      auto h = (*c)->Lock("contended", lo);
      if (!h.ok()) {
        std::fprintf(stderr, "rdma_worker %d: %s\n", index, h.status().ToString().c_str());
        sh->errors++;
        continue;
      }
      if (excl) {
        if (sh->writers.fetch_add(1) != 0 || sh->readers.load() != 0) sh->violations++;
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        sh->writers.fetch_sub(1);
      } else {
        const int r = sh->readers.fetch_add(1) + 1;
        if (sh->writers.load() != 0) sh->violations++;
        int m = sh->max_readers.load();
        while (r > m && !sh->max_readers.compare_exchange_weak(m, r)) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        sh->readers.fetch_sub(1);
      }
      if (const Status st = h->Release(); !st.ok()) {
        std::fprintf(stderr, "rdma_worker %d: release: %s\n", index, st.ToString().c_str());
        sh->errors++;
      }
      sh->ops++;
    }
    return 0;
  }
  if (mode == "hold") {
    if (argc < 8) return 64;
    LockOptions lo;
    lo.mode = std::string(argv[7]) == "s" ? LockMode::kShared : LockMode::kExclusive;
    // "warm": no fencing token, and the lock taken and released once before the held
    // acquisition, whose entry is then tagged from what the session learned (no READ).
    const bool warm = argc > 8 && std::string(argv[8]) == "warm";
    if (warm) {
      lo.fencing_token = false;
      auto first = (*c)->Lock(argv[6], lo);
      if (!first.ok() || !first->Release().ok() || !(*c)->Flush().ok()) return 14;
    }
    const uint64_t reads = (*c)->Stats().read;
    auto h = (*c)->Lock(argv[6], lo);
    if (!h.ok()) {
      std::fprintf(stderr, "rdma_worker %d: %s\n", index, h.status().ToString().c_str());
      return 11;
    }
    sh->held_reads = static_cast<int>((*c)->Stats().read - reads);
    std::atomic<bool> lost{false};
    h->OnLost([&](const Status&) { lost = true; });
    sh->token = h->fencing_token();
    if (lo.mode == LockMode::kExclusive && lo.fencing_token &&
        !sh->WriteResource(h->fencing_token())) {
      return 13;
    }
    sh->granted = 1;
    while (!lost && h->state() == LockState::kHeld) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    sh->lost = 1;
    // A holder that lost its lock and still tries the resource is refused by the token check.
    if (lo.mode == LockMode::kExclusive) {
      if (sh->WriteResource(h->fencing_token())) {
        sh->stale_accepted++;
      } else {
        sh->stale_rejected++;
      }
    }
    sh->release_code = static_cast<int>(h->Release().code());
    return 0;
  }
  if (mode == "fifo") {
    LockOptions lo;
    lo.mode = index == 2 ? LockMode::kShared : LockMode::kExclusive;
    lo.timeout = std::chrono::milliseconds(60000);
    auto h = (*c)->Lock("fifo", lo);
    if (!h.ok()) return 11;
    sh->order[sh->next.fetch_add(1)] = index;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return h->Release().ok() ? 0 : 12;
  }
  return 64;
}
