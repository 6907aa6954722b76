#include "server/metrics.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "common/sync/mutex.h"

namespace rdmalock::lockd {

std::string_view EndReasonLabel(EndReason r) {
  switch (r) {
    case EndReason::kDisconnected:
      return "disconnected";
    case EndReason::kConnectFailed:
      return "connect_failed";
    case EndReason::kHeartbeatTimeout:
      return "heartbeat_timeout";
    case EndReason::kQpError:
      return "qp_error";
    case EndReason::kForced:
      return "forced";
    case EndReason::kCount:
      break;
  }
  return "unknown";
}

Status ParseHostPort(const std::string& address, std::string* host, uint16_t* port) {
  const auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kConfig, "'" + address + "' " + why + " (want HOST:PORT, e.g. " +
                                         "127.0.0.1:9477 or [::1]:9477)");
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("has no host and port");
  std::string h = address.substr(0, colon);
  const std::string p = address.substr(colon + 1);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return bad("has an unclosed IPv6 bracket");
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return bad("has an IPv6 host without brackets");
  }
  unsigned v = 0;
  const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (p.empty() || ec != std::errc() || end != p.data() + p.size() || v < 1 || v > 65535) {
    return bad("has a port that is not in 1..65535");
  }
  *host = h;
  *port = static_cast<uint16_t>(v);
  return Status::Ok();
}

namespace {

// httplib's task queue, bounded: kWorkers threads serve connections and at most kMaxQueued wait
// for one. When the queue is full, enqueue blocks httplib's accept thread, so further connections
// wait in the kernel's listen backlog and hold no descriptor of lockd's: a local user opening
// connections cannot take lockd's descriptors (httplib's own ThreadPool queues without a bound).
// Threading: enqueue is called by httplib's accept thread, shutdown by it on the way out; the
// workers are this object's. mutex_ guards jobs_ and shutdown_.
class BoundedTaskQueue : public httplib::TaskQueue {
 public:
  static constexpr size_t kWorkers = 2;  // one scraper's keep-alive does not lock out another's
  static constexpr size_t kMaxQueued = 8;

  BoundedTaskQueue() {
    for (size_t i = 0; i < kWorkers; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~BoundedTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    MutexLock lock(&mutex_);
    room_.Wait(lock, [&] {
      mutex_.AssertHeld();
      return jobs_.size() < kMaxQueued || shutdown_;
    });
    jobs_.push_back(std::move(fn));  // after shutdown too: a worker still runs (and closes) it
    ready_.Signal();
  }

  void shutdown() override {
    {
      MutexLock lock(&mutex_);
      if (shutdown_ && workers_.empty()) return;
      shutdown_ = true;
    }
    ready_.SignalAll();
    room_.SignalAll();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        MutexLock lock(&mutex_);
        ready_.Wait(lock, [&] {
          mutex_.AssertHeld();
          return !jobs_.empty() || shutdown_;
        });
        if (jobs_.empty()) return;  // shut down and drained
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      room_.Signal();
      fn();
    }
  }

  Mutex mutex_;
  CondVar ready_, room_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mutex_);
  bool shutdown_ GUARDED_BY(mutex_) = false;
  std::vector<std::thread> workers_;  // started in the constructor, joined in shutdown
};

}  // namespace

struct MetricsServer::Impl {
  httplib::Server http;
  std::atomic<bool> listener_done{false};  // the listening thread has returned
  std::thread thread;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() {
  // cpp-httplib's stop() (0.11) does nothing until the listening thread has entered its loop:
  // stopped before that, the loop ran for ever and this join with it (a lockd stopped just
  // after its start). Wait for the loop (a thread that is starting: microseconds), or its end.
  while (!impl_->http.is_running() && !impl_->listener_done.load()) std::this_thread::yield();
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                            Render render) {
  std::string host;
  uint16_t port = 0;
  RDMALOCK_RETURN_IF_ERROR(ParseHostPort(address, &host, &port).WithContext("metrics_address"));
  auto impl = std::make_unique<Impl>();
  httplib::Server& http = impl->http;
  http.new_task_queue = [] { return new BoundedTaskQueue(); };
  http.set_keep_alive_timeout(5);
  http.set_read_timeout(5, 0);
  http.set_write_timeout(5, 0);
  http.Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("lockd: metrics are at /metrics\n", "text/plain");
  });
  errno = 0;
  if (!http.bind_to_port(host, port)) {
    const int err = errno;
    return Error(ErrorCode::kConfig,
                 "metrics_address " + address + ": cannot listen" +
                     (err != 0 ? std::string(" (") + std::strerror(err) + ")" : std::string()) +
                     "; set metrics_address to a free HOST:PORT, or \"\" to serve no metrics");
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    raw->http.listen_after_bind();
    raw->listener_done = true;
  });
  spdlog::info("metrics: serving Prometheus text at http://{}/metrics", address);
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

void PromText::Family(std::string_view name, std::string_view type, std::string_view help) {
  family_ = name;
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += help;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void PromText::Begin(std::string_view labels) {
  out_ += family_;
  if (!labels.empty()) {
    out_ += '{';
    out_ += labels;
    out_ += '}';
  }
  out_ += ' ';
}

void PromText::Sample(uint64_t value, std::string_view labels) {
  Begin(labels);
  out_ += std::to_string(value);
  out_ += '\n';
}

void PromText::Sample(double value, std::string_view labels) {
  Begin(labels);
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  out_.append(buf, ec == std::errc() ? end : buf);
  out_ += '\n';
}

std::string PromText::Escape(std::string_view v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      o += '\\';
      o += c;
    } else if (c == '\n') {
      o += "\\n";
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace rdmalock::lockd
