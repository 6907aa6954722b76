// lockctl bench: a lock workload that prints what it measured.
//
// Each iteration acquires a set of --batch distinct slots (one lock with LockSlot, or several with
// LockManySlots), holds them --hold-us, and releases them. Slots are drawn uniformly or from a Zipf
// distribution over --locks slots. Closed loop (each thread starts its next set when the last one
// is released) or open loop (--rate: sets start on a fixed schedule and latency counts from the
// scheduled start). --processes runs the threads in several processes, each with its own client
// session, and reports the aggregate.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "rdmalock/client.h"
#include "rdmalock/cluster.h"

namespace lockctl {

struct BenchOptions {
  int threads = 1;               // per process
  int processes = 1;             // this one and processes-1 forked children
  uint64_t locks = 10000;        // slots 0..locks-1 are drawn from
  std::string keys = "uniform";  // "uniform" or "zipf"
  double zipf_s = 0.99;          // Zipf exponent (keys == "zipf")
  int batch = 1;                 // distinct locks per set
  int inflight = 0;              // >0: async acquires, this many in flight per thread
  double rate = 0;               // open loop: sets/s over all threads of all processes; 0: closed
  double duration_s = 5.0;
  double warmup_s = 0.5;
  double shared_ratio = 0.0;  // fraction of locks taken in shared mode
  bool token = false;         // ask for fencing tokens (adds a READ to each acquire)
  // Keep each held lock's lease renewed by the client's keeper (LockOptions::auto_renew, the
  // SDK's default; readers of one process share a grant in-process only then).
  bool auto_renew = true;
  int hold_us = 0;        // critical section: hold each set this long (busy-wait)
  int idle_sessions = 0;  // extra idle client sessions, opened by the first process only
  bool json = false;
  // Over a cluster (lockctl --cluster or --etcd): key k is the lock name "bench/k", which picks
  // its shard, then its slot there (ClusterClient::Lock). Single locks, synchronous only.
  bool cluster = false;
  // Non-empty: write each measured set's start and grant times to this file, one line
  // "START_NS GRANTED_NS TOKEN" a set (CLOCK_MONOTONIC, the clock every process of the host
  // shares; TOKEN the (first) lock's fencing token, 0 without --token), so that the runs of
  // separate processes can be lined up (run-perf.sh's cohort rows). One process only
  // (--processes 1).
  std::string timeline;
};

// What a bench process locks through: one lockd, or a cluster of them.
struct BenchTarget {
  std::unique_ptr<rdmalock::Client> client;
  std::unique_ptr<rdmalock::ClusterClient> cluster;
};

// Connects a client, or prints why not, sets *exit_code and returns null. RunBench calls it once
// per process (plus idle_sessions times in the first), after forking.
// Returns a target with neither set on failure.
using BenchConnect = std::function<BenchTarget(int* exit_code)>;

// Checks what can be checked without lockd. Prints the problem, naming the option, and returns 64;
// 0 if the options are good.
int ValidateBenchOptions(const BenchOptions& opts);

// Forks processes-1 children, connects in each process, runs the workload and prints the
// aggregate report to stdout. Returns the process exit code (non-zero if any process failed).
// Call it from the main thread of a process that has started no other threads.
int RunBench(const BenchOptions& opts, const BenchConnect& connect);

}  // namespace lockctl
