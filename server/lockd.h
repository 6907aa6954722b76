// lockd's server core: the registered regions, the rdma_cm listener and the session registry.
//
// Threading: Run() is the event loop and owns every rdma_cm object; it runs on one thread.
// RequestStop() may be called from any thread (it writes an eventfd).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rdmalock/status.h"
#include "server/config.h"

namespace rdmalock::lockd {

class Server {
 public:
  // Opens the RDMA devices, allocates and registers the regions, and starts listening. After an
  // unclean start lockd refuses clients for the restart grace period (Config::GraceMs()).
  static Result<std::unique_ptr<Server>> Create(const Config& config, uint64_t epoch,
                                                bool unclean_start);
  ~Server();

  // Runs the event loop until RequestStop(); then disconnects every client and tears down.
  Status Run();
  void RequestStop();

  // Connects to this server through its own NIC (the event loop must be running on another
  // thread) and checks the byte order of atomic replies with a FETCH_AND_ADD of 0 on the probe
  // word. The loopback connection stays open: the recovery thread, started here, frees ended
  // sessions' locks through it.
  Status ProbeLoopback(std::chrono::milliseconds timeout);

  uint16_t port() const;
  // After Run(): whether clients were connected when it stopped (their leases may still run).
  bool stopped_with_clients() const;
  // After Run(): when every client's QP was moved to the error state.
  std::chrono::steady_clock::time_point fenced_at() const;
  // Sessions connected now (lockd's own loopback excluded).
  uint64_t connected_clients() const;
  // Cluster mode: the event loop advances the info page's alive ticks only before `t` (the
  // campaign's fence point); clients stop trusting a lockd whose ticks stop. Any thread.
  void SetAliveUntil(std::chrono::steady_clock::time_point t);
  // A reload's new shared key (a key file rotated): handshakes from now on must prove it;
  // sessions already admitted are not affected. Any thread.
  void SetAuthKey(std::string key);

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads the epoch persisted in `state_dir`, adds one and writes it back (atomically, fsync'd).
// An empty state_dir, or an epoch file that exists but cannot be read, is an error: an epoch
// handed out twice would let fencing tokens go backwards.
Result<uint64_t> BumpEpoch(const std::string& state_dir);

// Marks lockd as running in `state_dir`; returns whether the previous run did not stop cleanly
// (its mark is still there), or true with no state_dir (nothing to tell).
Result<bool> MarkRunning(const std::string& state_dir);
// Removes the mark at a clean stop with no client connected.
void MarkStoppedCleanly(const std::string& state_dir);

}  // namespace rdmalock::lockd
