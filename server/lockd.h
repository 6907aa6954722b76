// lockd's server: the coordinator of its parts (server/lockd_impl.h lists them and the threads
// that own them): regions and devices, admission, the handshake, the session table, recovery,
// the admin socket and the metrics.
//
// Threading: Run() is the event loop and owns every rdma_cm object; it runs on one thread.
// RequestStop(), SetAliveUntil(), SetAuthKey() and connected_clients() may be called from any
// thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rdmalock/status.h"
#include "server/config.h"
#include "server/state_dir.h"

namespace rdmalock::lockd {

class Server {
 public:
  // Opens the RDMA devices, allocates and registers the regions, and starts listening. After an
  // unclean start lockd refuses clients for the restart grace period (Config::GraceMs()).
  // `auth_key` is the shared key clients must prove, read from config.auth_key_file by the
  // caller (once at start, again at a reload: cluster mode's terms serve the key in force); it is
  // ignored when auth_key_file is "" (authentication off).
  static Result<std::unique_ptr<Server>> Create(const Config& config, uint64_t epoch,
                                                bool unclean_start, std::string auth_key);
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

// BumpEpoch, MarkRunning and MarkStoppedCleanly: server/state_dir.h.

}  // namespace rdmalock::lockd
