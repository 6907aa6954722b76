// server/metrics_render: GET /metrics' text from counters, constants and a lock table in plain
// memory (no verbs, no HTTP).
#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "rdmalock/proto/handshake.h"
#include "rdmalock/proto/layout.h"
#include "server/metrics_render.h"

using namespace rdmalock;
using namespace rdmalock::lockd;

namespace {

// A lock table of `n` slots, 16-byte aligned like lockd's mapping.
struct Table {
  std::vector<uint64_t> words;
  explicit Table(uint64_t n) : words(proto::LockTableBytes(n) / 8, 0) {}
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words.data()); }
  void Set(uint64_t slot, proto::Word0 w, uint64_t generation = 0) {
    words[proto::SlotOffset(slot) / 8] = w.Encode();
    words[proto::SlotOffset(slot) / 8 + 1] = generation << 16;
  }
};

// The value of the sample line that starts with `series` (name and labels), or "" if none.
std::string Value(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return "";
  const size_t start = at + key.size() - 1;
  return text.substr(start, text.find('\n', start) - start);
}

// One slot's lock table and a sampler over it: lock_requests_total, scrape after scrape.
struct OneSlot {
  Config config;
  Counters counters;
  std::atomic<uint64_t> connected{0};
  Table table{1};
  LockTableSampler sampler{table.data(), 1};
  MetricsSource src;
  OneSlot() {
    config.lock_count = 1;
    src.config = &config;
    src.counters = &counters;
    src.connected = &connected;
  }
  std::string Requests() {
    return Value(RenderMetrics(src, sampler, std::chrono::system_clock::now()),
                 "rdmalock_lockd_lock_requests_total");
  }
};

}  // namespace

TEST_CASE("metrics: the counters and constants, one family each with HELP and TYPE") {
  Config config;
  config.lock_count = 8;
  config.lease_ms = 1500;
  config.stall_factor = 3;
  config.max_clients = 20;
  Counters counters;
  counters.accepted = 5;
  counters.joined = 2;
  counters.rejected[static_cast<size_t>(proto::RejectReason::kAuthFailed)] = 4;
  counters.ended[static_cast<size_t>(EndReason::kHeartbeatTimeout)] = 1;
  counters.forced_releases = 1;
  counters.freed_released = 7;
  counters.recovery_queue = 1;
  std::atomic<uint64_t> connected{3};
  Table table(config.lock_count);
  LockTableSampler sampler(table.data(), config.lock_count);
  MetricsSource src;
  src.epoch = 9;
  src.config = &config;
  src.counters = &counters;
  src.connected = &connected;
  const auto now = std::chrono::system_clock::now();
  src.started_wall = now - std::chrono::seconds(10);
  src.grace_until_wall = now + std::chrono::seconds(2);
  const std::string text = RenderMetrics(src, sampler, now);

  CHECK(Value(text, "rdmalock_lockd_info{version=\"" RDMALOCK_VERSION "\",epoch=\"9\"}") == "1");
  CHECK(Value(text, "rdmalock_lockd_epoch") == "9");
  CHECK(Value(text, "rdmalock_lockd_lease_seconds") == "1.5");
  CHECK(Value(text, "rdmalock_lockd_stall_factor") == "3");
  CHECK(Value(text, "rdmalock_lockd_grace_remaining_seconds") == "2");
  CHECK(Value(text, "rdmalock_lockd_sessions_connected") == "3");
  CHECK(Value(text, "rdmalock_lockd_sessions_max") == "20");
  CHECK(Value(text, "rdmalock_lockd_handshakes_accepted_total") == "5");
  CHECK(Value(text, "rdmalock_lockd_connections_joined_total") == "2");
  CHECK(Value(text, "rdmalock_lockd_handshakes_rejected_total{reason=\"" +
                        std::string(proto::RejectReasonLabel(proto::RejectReason::kAuthFailed)) +
                        "\"}") == "4");
  CHECK(Value(text, "rdmalock_lockd_sessions_ended_total{reason=\"" +
                        std::string(EndReasonLabel(EndReason::kHeartbeatTimeout)) + "\"}") == "1");
  CHECK(Value(text, "rdmalock_lockd_forced_releases_total") == "1");
  CHECK(Value(text, "rdmalock_lockd_recovered_requests_total{outcome=\"released\"}") == "7");
  CHECK(Value(text, "rdmalock_lockd_recovered_requests_total{outcome=\"gave_up\"}") == "0");
  CHECK(Value(text, "rdmalock_lockd_recovery_pending") == "1");
  CHECK(text.find("# TYPE rdmalock_lockd_handshakes_accepted_total counter\n") !=
        std::string::npos);
  CHECK(text.find("# TYPE rdmalock_lockd_sessions_connected gauge\n") != std::string::npos);
  // The reason "none" (0) is no rejection and has no sample.
  CHECK(text.find("reason=\"" + std::string(proto::RejectReasonLabel(proto::RejectReason::kNone)) +
                  "\"") == std::string::npos);

  // No grace period: 0, not a negative number.
  src.grace_until_wall = {};
  CHECK(Value(RenderMetrics(src, sampler, now), "rdmalock_lockd_grace_remaining_seconds") == "0");
  CHECK(Value(RenderMetrics(src, sampler, now), "rdmalock_lockd_grace_end_time_seconds") == "0");

  // When the grace period ends (or ended), in Unix seconds, after it is over too: the alert
  // rules see a restart with a grace however short it was and whenever they scrape.
  const std::chrono::system_clock::time_point t(std::chrono::seconds(1'800'000'000));
  src.grace_until_wall = t + std::chrono::milliseconds(2500);
  CHECK(Value(RenderMetrics(src, sampler, t), "rdmalock_lockd_grace_end_time_seconds") ==
        "1800000002.5");
  const std::string after = RenderMetrics(src, sampler, t + std::chrono::seconds(60));
  CHECK(Value(after, "rdmalock_lockd_grace_end_time_seconds") == "1800000002.5");
  CHECK(Value(after, "rdmalock_lockd_grace_remaining_seconds") == "0");
  CHECK(after.find("# TYPE rdmalock_lockd_grace_end_time_seconds gauge\n") != std::string::npos);
}

TEST_CASE("metrics: lock-table occupancy and requests counted between scrapes") {
  Config config;
  config.lock_count = 6;
  Counters counters;
  std::atomic<uint64_t> connected{0};
  Table table(config.lock_count);
  // slot 0: one exclusive holder, two waiting; slot 1: three shared holders; slot 2: free after
  // traffic; slot 3: frozen.
  table.Set(0, proto::Word0{0, 3, 0, 0});
  table.Set(1, proto::Word0{3, 0, 0, 0});
  table.Set(2, proto::Word0{4, 4, 4, 4});
  table.Set(3, proto::Word0{0, proto::kCountMax, 0, proto::kCountMax});
  LockTableSampler sampler(table.data(), config.lock_count);
  MetricsSource src;
  src.config = &config;
  src.counters = &counters;
  src.connected = &connected;
  const std::string first = RenderMetrics(src, sampler, std::chrono::system_clock::now());
  CHECK(Value(first, "rdmalock_lockd_lock_slots") == "6");
  CHECK(Value(first, "rdmalock_lockd_locks_held{mode=\"exclusive\"}") == "1");
  CHECK(Value(first, "rdmalock_lockd_locks_held{mode=\"shared\"}") == "1");
  CHECK(Value(first, "rdmalock_lockd_lock_holders") == "4");
  CHECK(Value(first, "rdmalock_lockd_lock_waiters") == "2");
  CHECK(Value(first, "rdmalock_lockd_locks_contended") == "1");
  CHECK(Value(first, "rdmalock_lockd_locks_frozen") == "1");
  // The first scrape has nothing to compare with.
  CHECK(Value(first, "rdmalock_lockd_lock_requests_total") == "0");

  // Two more exclusive requests on slot 0, one shared on slot 2; slot 4 reset to a new
  // generation that shows one request.
  table.Set(0, proto::Word0{0, 5, 0, 0});
  table.Set(2, proto::Word0{5, 4, 4, 4});
  table.Set(4, proto::Word0{1, 0, 0, 0}, /*generation=*/1);
  const std::string second = RenderMetrics(src, sampler, std::chrono::system_clock::now());
  CHECK(Value(second, "rdmalock_lockd_lock_requests_total") == "4");
  CHECK(Value(second, "rdmalock_lockd_lock_waiters") == "4");
  // Unchanged since: the counter stays.
  const std::string third = RenderMetrics(src, sampler, std::chrono::system_clock::now());
  CHECK(Value(third, "rdmalock_lockd_lock_requests_total") == "4");
}

TEST_CASE(
    "metrics: a scrape between a reset's generation bump and its word0 counts nothing twice") {
  // A reset bumps the generation (word1) first, then zeroes word0: a scrape in between reads
  // the frozen word0 with the new generation. Read as a reset, it counted the frozen word's
  // 32,768 requests again, and the next scrape, same generation and a word0 back near 0, the
  // wrap-around of the difference: about 65,000 requests that never were.
  OneSlot one;
  const proto::Word0 frozen{0, proto::kCountMax, 0, proto::kCountMax};
  one.table.Set(0, proto::Word0{0, proto::kCountMax - 2, 0, proto::kCountMax - 2}, 5);
  auto& table = one.table;
  const auto scrape = [&] { return one.Requests(); };
  CHECK(scrape() == "0");
  table.Set(0, frozen, 5);  // two more requests froze it
  CHECK(scrape() == "2");
  table.Set(0, frozen, 6);  // the reset's generation bump, word0 not yet zeroed
  CHECK(scrape() == "2");
  table.Set(0, proto::Word0{0, 3, 0, 0}, 6);  // zeroed; three requests since
  CHECK(scrape() == "5");
  // A reset whose word0 CAS failed after its bump (another reset won), then the winner's: one
  // bump, the frozen word, a second bump, the new word.
  table.Set(0, frozen, 7);
  CHECK(scrape() == "32770");  // 3 to 32,768 in generation 6
  table.Set(0, frozen, 8);
  CHECK(scrape() == "32770");
  table.Set(0, proto::Word0{1, 0, 0, 0}, 8);
  CHECK(scrape() == "32771");
}

// word1's 16-bit renewal counter carries into the generation every 65,536 renewals (protocol.md):
// a new generation with word0 as it was, or risen, is no reset (the diff review, 2026-12-06: it
// counted everything word0 showed again, up to 32,767 requests that never were).
TEST_CASE("metrics: a renewal counter's carry into the generation is not read as a reset") {
  OneSlot one;
  auto& table = one.table;
  table.Set(0, proto::Word0{0, 20000, 0, 19999}, 4);
  const auto scrape = [&] { return one.Requests(); };
  CHECK(scrape() == "0");
  table.Set(0, proto::Word0{0, 20000, 0, 19999}, 5);  // the carry
  CHECK(scrape() == "0");
  table.Set(0, proto::Word0{0, 20002, 0, 20001}, 6);  // another carry, and two requests
  CHECK(scrape() == "2");
  table.Set(0, proto::Word0{0, 1, 0, 0}, 7);  // a reset (the word drained, zeroed)
  CHECK(scrape() == "3");
}

TEST_CASE("metrics: a request that withdrew between two scrapes is not counted as 65,535") {
  // A try-lock on a held lock takes a ticket (FETCH_AND_ADD) and gives it back (a CAS that takes
  // maxX down again); so does a request that times out at the end of the queue. A scrape that
  // saw the ticket and one after it saw maxX one lower: its difference, modulo 2^16, was 65,535.
  OneSlot one;
  auto& table = one.table;
  table.Set(0, proto::Word0{0, 1, 0, 0}, 3);  // held
  const auto scrape = [&] { return one.Requests(); };
  CHECK(scrape() == "0");
  table.Set(0, proto::Word0{0, 2, 0, 0}, 3);  // a try-lock's ticket
  CHECK(scrape() == "1");
  table.Set(0, proto::Word0{0, 1, 0, 0}, 3);  // withdrawn
  CHECK(scrape() == "1");
  table.Set(0, proto::Word0{0, 2, 0, 1}, 3);  // released; another request granted
  CHECK(scrape() == "2");
}

namespace {

// A free loopback address (metrics_address takes no port 0); "127.0.0.1:1", which fails to bind,
// if none could be had.
std::string FreeAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    if (fd >= 0) close(fd);
    return "127.0.0.1:1";
  }
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
}

// A metrics server on a free port, serving `page`; retried on another port if one is taken
// between FreeAddress and the bind.
std::unique_ptr<MetricsServer> ServeOnFreePort(std::string* address, std::string page) {
  for (int i = 0; i < 20; ++i) {
    *address = FreeAddress();
    auto s = MetricsServer::Start(*address, [page] { return page; });
    if (s.ok()) return std::move(s).value();
  }
  FAIL("no free port for the metrics server");
  return nullptr;
}

// A blocking TCP connection to `address` ("127.0.0.1:PORT"), its sends and receives bounded by
// `timeout`; -1 if it could not connect. (No REQUIRE: the tricklers below call it on threads.)
int RawConnect(const std::string& address, std::chrono::milliseconds timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

int Connect(const std::string& address,
            std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const int fd = RawConnect(address, timeout);
  REQUIRE(fd >= 0);
  return fd;
}

// Everything the server sends until it closes (or the receive times out).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

// One request on a new connection; the whole reply.
std::string Ask(const std::string& address, const std::string& request,
                std::chrono::milliseconds recv_timeout = std::chrono::seconds(10)) {
  const int fd = Connect(address, recv_timeout);
  REQUIRE(send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size()));
  std::string reply = ReadAll(fd);
  close(fd);
  return reply;
}

std::string StatusLine(const std::string& reply) { return reply.substr(0, reply.find("\r\n")); }

}  // namespace

TEST_CASE("metrics: GET and HEAD of /metrics, and what is not there") {
  std::string address;
  auto server = ServeOnFreePort(&address, "rdmalock_lockd_epoch 7\n");
  const std::string got = Ask(address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(StatusLine(got) == "HTTP/1.1 200 OK");
  CHECK(got.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n") !=
        std::string::npos);
  CHECK(got.find("Content-Length: 23\r\n") != std::string::npos);
  CHECK(got.substr(got.size() - 23) == "rdmalock_lockd_epoch 7\n");
  // HTTP/1.0, a query string, and a bare LF ending the header (as some tools send).
  CHECK(Ask(address, "GET /metrics?x=1 HTTP/1.0\n\n").find("\r\n\r\nrdmalock_lockd_epoch 7\n") !=
        std::string::npos);
  const std::string head = Ask(address, "HEAD /metrics HTTP/1.1\r\n\r\n");
  CHECK(StatusLine(head) == "HTTP/1.1 200 OK");
  CHECK(head.find("Content-Length: 23\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");  // no body
  CHECK(StatusLine(Ask(address, "GET / HTTP/1.1\r\n\r\n")) == "HTTP/1.1 200 OK");
  CHECK(StatusLine(Ask(address, "GET /nope HTTP/1.1\r\n\r\n")) == "HTTP/1.1 404 Not Found");
  CHECK(StatusLine(Ask(address, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")) ==
        "HTTP/1.1 405 Method Not Allowed");
  CHECK(StatusLine(Ask(address, "nonsense\r\n\r\n")) == "HTTP/1.1 400 Bad Request");
}

// A metrics client could run lockd out of memory: cpp-httplib (0.11) read a request's whole first
// line, and each header line, before it checked their length (found by review, 2026-12-06).
TEST_CASE("metrics: a request that never ends is refused, not read into memory") {
  std::string address;
  auto server = ServeOnFreePort(&address, "x 1\n");
  {  // 16 KiB of request line and no end: the server answers and closes
    const int fd = Connect(address, std::chrono::seconds(8));
    const std::string line = "GET /" + std::string(16 * 1024, 'a');
    REQUIRE(send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size()));
    const std::string reply = ReadAll(fd);
    close(fd);
    CHECK(StatusLine(reply) == "HTTP/1.1 431 Request Header Fields Too Large");
  }
  {  // a stream of 64 MiB with no newline is cut off long before its end
    const int fd = Connect(address, std::chrono::seconds(8));
    const std::string chunk(64 * 1024, 'a');
    size_t sent = 0;
    while (sent < (size_t{64} << 20)) {
      const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    close(fd);
    INFO("sent " << sent << " bytes before the server cut the connection");
    CHECK(sent < (size_t{32} << 20));  // socket buffers take a few MiB; the server reads 8 KiB
  }
  CHECK(StatusLine(Ask(address, "GET /metrics HTTP/1.1\r\n\r\n")) == "HTTP/1.1 200 OK");
}

// Two peers sending a byte now and then held cpp-httplib's two workers for as long as they kept
// it up (each read had its own 5 s timeout, a request none): every scrape waited, and lockd's stop
// waited in the workers' join, past systemd's stop timeout (found by review, 2026-12-06).
TEST_CASE("metrics: slow peers neither keep a scrape out nor hold up the server's stop") {
  std::string address;
  auto server = ServeOnFreePort(&address, "x 1\n");
  std::atomic<bool> stop_trickling{false};
  std::atomic<int> cut_off{0};  // tricklers whose connection the server closed
  std::vector<std::thread> tricklers;
  for (int i = 0; i < 3; ++i) {
    tricklers.emplace_back([&] {
      const int fd = RawConnect(address, std::chrono::seconds(10));
      if (fd < 0) return;  // counted as not cut off: the check below fails
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(12);
      while (!stop_trickling && std::chrono::steady_clock::now() < until) {
        if (send(fd, "G", 1, MSG_NOSIGNAL) != 1) {
          ++cut_off;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      close(fd);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the tricklers are in
  const auto asked = std::chrono::steady_clock::now();
  const std::string reply = Ask(address, "GET /metrics HTTP/1.1\r\n\r\n", std::chrono::seconds(3));
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - asked);
  INFO("the scrape beside 3 slow peers took " << waited.count() << " ms: " << StatusLine(reply));
  CHECK(StatusLine(reply) == "HTTP/1.1 200 OK");
  // A trickling peer's request has a deadline of its own: the server ends it.
  const auto cut_by = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  while (cut_off.load() < 3 && std::chrono::steady_clock::now() < cut_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(cut_off.load() == 3);
  // ... and a stop does not wait for peers (new ones, trickling again).
  std::vector<std::thread> more;
  for (int i = 0; i < 3; ++i) {
    more.emplace_back([&] {
      const int fd = RawConnect(address, std::chrono::seconds(10));
      if (fd < 0) return;
      for (int k = 0; k < 20 && !stop_trickling; ++k) {
        if (send(fd, "G", 1, MSG_NOSIGNAL) != 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      close(fd);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto stopping = std::chrono::steady_clock::now();
  server.reset();
  const auto stop_took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - stopping);
  stop_trickling = true;
  for (auto& t : tricklers) t.join();
  for (auto& t : more) t.join();
  INFO("stopping the server took " << stop_took.count() << " ms");
  CHECK(stop_took < std::chrono::seconds(2));
}

// Found by the diff review (2026-12-06): with its 8 connections open the server polled with a
// timeout of 0 (the accept pause's time, long past) and spun a core for as long as they stayed.
TEST_CASE("metrics: a server with every connection taken waits, it does not spin") {
  std::string address;
  auto server = ServeOnFreePort(&address, "x 1\n");
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) held.push_back(Connect(address));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted, all 8
  const auto cpu = [] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return std::chrono::seconds(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           std::chrono::microseconds(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  };
  const auto before = cpu();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto used = std::chrono::duration_cast<std::chrono::milliseconds>(cpu() - before);
  for (const int fd : held) close(fd);
  INFO("the process used " << used.count() << " ms of CPU in 1 s with 8 idle connections");
  CHECK(used < std::chrono::milliseconds(300));
}

TEST_CASE("metrics: a server stopped as soon as it started stops (its listener never hangs)") {
  // cpp-httplib's stop() does nothing until the listening thread has begun its loop; a lockd
  // stopped right after its start waited for that thread for ever (SIGTERM just after start).
  // What the starting thread shares with the test, on the heap: on a hang the thread is left
  // behind, and must not refer to the test's stack.
  struct Run {
    std::promise<int> done;
    std::string first_error;
  };
  auto run = std::make_shared<Run>();
  auto finished = run->done.get_future();
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);  // not 2,000 "serving" lines
  std::thread([run] {  // a new port if another process takes the free one between two servers
    int started = 0, refused = 0;
    std::string address = FreeAddress();
    while (started < 2000 && refused < 20) {
      auto s = MetricsServer::Start(address, [] { return std::string(); });
      if (!s.ok()) {
        if (run->first_error.empty()) run->first_error = s.status().ToString();
        ++refused;
        address = FreeAddress();
        continue;
      }
      ++started;
    }  // each one destroyed at once
    run->done.set_value(started);
  })
      .detach();
  const bool in_time = finished.wait_for(std::chrono::seconds(120)) == std::future_status::ready;
  spdlog::set_level(level);
  // On a hang the thread stays stuck in a join (the process ends with the tests).
  REQUIRE(in_time);
  INFO(run->first_error);
  CHECK(finished.get() == 2000);
}
