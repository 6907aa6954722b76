// lockd's metrics: the counters its threads bump, and a small HTTP server that serves them in the
// Prometheus text format (GET /metrics). The HTTP server runs on its own thread and only reads:
// atomics, and the lock table through relaxed 8-byte loads. It never touches rdma_cm objects or
// the session registry, which belong to the event loop.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "rdmalock/status.h"

namespace rdmalock::lockd {

// Why a client session ended (lockd then frees its recorded requests).
enum class EndReason : uint8_t {
  kDisconnected,      // the client closed its connection or its process died
  kConnectFailed,     // an admitted session's connection failed before it was established
  kHeartbeatTimeout,  // fenced: heartbeat stopped for heartbeat_timeout_ms
  kQpError,           // fenced: a QP of it went to the error state
  kForced,            // fenced: lockctl release --force
  kCount
};
std::string_view EndReasonLabel(EndReason r);

// Every counter is exact on its own; a scrape is not a snapshot across them.
struct Counters {
  static constexpr size_t kRejectReasons = 16;  // indexed by proto::RejectReason
  std::atomic<uint64_t> accepted{0};            // sessions admitted (lockd's loopback included)
  std::atomic<uint64_t> joined{0};              // connections that joined an existing session
  std::array<std::atomic<uint64_t>, kRejectReasons> rejected{};
  // Handshakes that ended neither refused nor admitted: not established in time (half-open), a
  // send or completion that failed, a QP error (no session of a client ended: none had begun).
  std::atomic<uint64_t> handshakes_failed{0};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(EndReason::kCount)> ended{};
  std::atomic<uint64_t> forced_releases{0};  // lockctl release --force requests carried out
  // Recorded requests of ended sessions, by what lockd's recovery found.
  std::atomic<uint64_t> freed_released{0};   // it released them (the session held them)
  std::atomic<uint64_t> freed_done{0};       // they were over already
  std::atomic<uint64_t> freed_recovered{0};  // waiters had recovered past them
  std::atomic<uint64_t> freed_gave_up{0};    // lockd gave up (left to stall recovery)
  std::atomic<uint64_t> recovery_queue{0};   // sessions whose requests wait to be freed
};

// "HOST:PORT" (an IPv6 host in brackets). Returns an error that names the problem.
Status ParseHostPort(const std::string& address, std::string* host, uint16_t* port);

// Serves GET (and HEAD) /metrics with `render`'s text on `address`. Binding happens in Start, so
// a port in use fails lockd's start-up with a clear error rather than later. A server of its own
// (server/metrics_http.cc), one thread and one poll loop: at most 8 connections open, a request
// of at most 8 KiB, each connection closed 5 s after its accept whatever its peer does, one reply
// per connection; the destructor wakes the thread and closes them all at once.
class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& address, Render render);
  ~MetricsServer();  // stops serving and joins its threads
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  struct Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Builds Prometheus text exposition (format 0.0.4): HELP and TYPE once per metric family.
class PromText {
 public:
  // Starts a family; `type` is "counter" or "gauge".
  void Family(std::string_view name, std::string_view type, std::string_view help);
  // A sample of the current family; `labels` is empty or `key="value",...` (values escaped by the
  // caller with Escape).
  void Sample(double value, std::string_view labels = {});
  void Sample(uint64_t value, std::string_view labels = {});
  static std::string Escape(std::string_view v);
  const std::string& text() const { return out_; }

 private:
  void Begin(std::string_view labels);  // the sample's name and labels, up to its value
  std::string out_;
  std::string family_;
};

}  // namespace rdmalock::lockd
