// An HTTP proxy in front of a test's etcd (LocalEtcd) that forwards every request, and can delay
// or fail some of them: a loaded etcd, a slow network, a member that cannot confirm a read.
// Thread-safety: the test's thread owns it; its flags (atomics) may be set from any thread while
// the proxy's own listener thread serves.
#pragma once

#include <httplib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "common/etcd/etcd.h"

namespace rdmalock::testing {

// An HTTP proxy in front of etcd that forwards every request at once and can hold back the
// reply of the next `delay_txns` transactions (/v3/kv/txn) by `delay`: a request etcd carried
// out whose answer comes too late for the caller (a loaded etcd, a slow network); with
// `delay_reads`, every read's (/v3/kv/range) reply too.
class DelayingProxy {
 public:
  DelayingProxy(std::string upstream, std::chrono::milliseconds delay)
      : upstream_(std::move(upstream)), delay_(delay) {
    auto where = etcd::ParseEndpoint(upstream_);
    REQUIRE(where.ok());
    host_ = where->first;
    port_ = where->second;
    svr_.Post(R"(/v3/.*)", [this](const httplib::Request& req, httplib::Response& res) {
      httplib::Client up(host_, port_);
      up.set_read_timeout(5, 0);
      auto r = up.Post(req.path.c_str(), req.body, "application/json");
      if (!r) {
        res.status = 502;
        return;
      }
      // The primary key's name in base64, as etcd's gateway takes it.
      const bool primary_read =
          req.body.find("L3JkbWFsb2NrL3Rlc3Qvc2hhcmQvYS9wcmltYXJ5") != std::string::npos;
      // A prefix read (every shard's primary, a shard's members) has a range_end.
      const bool prefix_read = req.body.find("\"range_end\"") != std::string::npos;
      if (req.path == "/v3/kv/range" &&
          (fail_ranges.load() || (fail_primary_reads.load() && primary_read) ||
           (fail_prefix_reads.load() && prefix_read))) {
        res.status = 503;  // after etcd carried it out: as a member that cannot confirm a read
        return;
      }
      if (req.path == "/v3/kv/range" &&
          (garble_ranges.load() || (prefix_read && garble_prefix_reads.load()))) {
        res.status = 200;  // an answer that is no etcd reply (a proxy's error page, say)
        if (garble_as_json.load()) {
          res.set_content("{\"message\":\"maintenance\"}", "application/json");
        } else {
          res.set_content("<html>gateway</html>", "text/html");
        }
        return;
      }
      res.status = r->status;
      res.set_content(r->body, "application/json");
      if (req.path == "/v3/kv/range" && delay_reads.load()) {
        reads_held.fetch_add(1);
        std::this_thread::sleep_for(delay_);
      }
      if (req.path == "/v3/kv/txn" &&
          ((delay_mod_txns.load() && req.body.find("\"MOD\"") != std::string::npos) ||
           delay_txns.fetch_sub(1) > 0)) {
        delayed.fetch_add(1);
        std::this_thread::sleep_for(delay_);
      }
    });
    const int port = svr_.bind_to_any_port("127.0.0.1");
    REQUIRE(port > 0);
    url_ = "http://127.0.0.1:" + std::to_string(port);
    thread_ = std::thread([this] {
      svr_.listen_after_bind();
      listener_done_ = true;
    });
  }
  ~DelayingProxy() {
    // cpp-httplib 0.11's stop() does nothing before the listening loop runs: wait for it first.
    while (!svr_.is_running() && !listener_done_.load()) std::this_thread::yield();
    svr_.stop();
    thread_.join();
  }
  const std::string& url() const { return url_; }

  std::atomic<int> delay_txns{0};
  std::atomic<int> delayed{0};
  std::atomic<bool> delay_reads{false};          // hold back every read's reply by `delay`
  std::atomic<bool> delay_mod_txns{false};       // and every compare-on-mod_revision transaction's
  std::atomic<int> reads_held{0};                // reads whose reply was held back so
  std::atomic<bool> fail_ranges{false};          // answer every read (/v3/kv/range) with an error
  std::atomic<bool> fail_primary_reads{false};   // only the reads of shard a's primary key
  std::atomic<bool> fail_prefix_reads{false};    // only reads of a prefix (with a range_end)
  std::atomic<bool> garble_prefix_reads{false};  // those answered 200 with a body not etcd's
  std::atomic<bool> garble_ranges{false};        // every read answered so
  std::atomic<bool> garble_as_json{false};       // ... with a JSON object that is not etcd's

 private:
  std::string upstream_, host_, url_;
  uint16_t port_ = 0;
  std::chrono::milliseconds delay_;
  std::atomic<bool> listener_done_{false};
  httplib::Server svr_;
  std::thread thread_;
};

}  // namespace rdmalock::testing
