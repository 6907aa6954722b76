// lockctl: the rdmalock admin and scripting CLI.
//
// Exit codes (also in docs and --help):
//   0        success (for `acquire`: the command's own status, 128+N if killed by signal N)
//   64       usage error
//   69       cannot reach or handshake with lockd
//   70       internal error
//   75       `acquire`: the lock was not granted within --timeout
//   76       `acquire`: the lock was lost while the command ran (the command was terminated)
//   1        `release --force`: lockd refused (no such session, no recorded holder)
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/lockctl/args.h"
#include "client/lockctl/bench.h"
#include "client/lockctl/json.h"
#include "common/auth/auth.h"
#include "common/etcd/etcd.h"
#include "rdmalock/client.h"
#include "rdmalock/cluster.h"
#include "rdmalock/proto/lock_word.h"

namespace {

using lockctl::ClientConfigPath;
using lockctl::Common;
using lockctl::FormatTime;
using lockctl::JsonString;
using lockctl::kExitInternal;
using lockctl::kExitLost;
using lockctl::kExitTimeout;
using lockctl::kExitUnavailable;
using lockctl::kExitUsage;
using lockctl::ModeName;
using lockctl::ReadClientConfig;
using lockctl::RequestStatusName;
using lockctl::Target;

// The cluster map of --cluster FILE or --etcd URL; on failure prints why and returns false
// (*unavailable: etcd could not be reached).
bool LoadClusterMap(const Common& c, rdmalock::ClusterMap* map, std::string* source,
                    bool* unavailable) {
  if (!c.etcd.empty()) {
    auto read = rdmalock::ReadClusterMap(c.Etcd());
    if (!read.ok()) {
      std::cerr << "lockctl: " << read.status().message() << "\n";
      *unavailable = read.status().code() == rdmalock::ErrorCode::kConnection;
      return false;
    }
    *map = *read;
    *source = "etcd cluster " + c.etcd_cluster;
    return true;
  }
  std::ifstream in(c.cluster_file);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) {
    std::cerr << "lockctl: cannot read cluster map " << c.cluster_file << "\n";
    return false;
  }
  *source = c.cluster_file;
  return lockctl::ParseClusterMap(ss.str(), c.cluster_file, map);
}

Target TargetOf(const Common& c) {
  Target t;
  t.port = c.port;
  t.auth_key_file = c.auth_key_file;
  if (!c.cluster_file.empty() || !c.etcd.empty()) {
    rdmalock::ClusterMap map;
    std::string source;
    if (!LoadClusterMap(c, &map, &source, &t.unavailable)) {
      t.usage_error = true;
      return t;
    }
    size_t shard = map.shards.size();
    if (!c.shard.empty()) {
      for (size_t i = 0; i < map.shards.size(); ++i) {
        if (map.shards[i].name == c.shard) shard = i;
      }
      if (shard == map.shards.size()) {
        std::cerr << "lockctl: no shard '" << c.shard << "' in " << source << "\n";
        t.usage_error = true;
        return t;
      }
    } else if (!c.route_name.empty()) {
      shard = rdmalock::ShardForName(map, c.route_name);
    } else {
      std::cerr << "lockctl: with a cluster map, this command needs --shard NAME\n";
      t.usage_error = true;
      return t;
    }
    t.server = map.shards[shard].server;
    t.port = map.shards[shard].port;
    t.source = source + ", shard " + map.shards[shard].name;
    if (t.server.empty()) {  // from etcd: the shard has no primary now
      std::cerr << "lockctl: shard '" << map.shards[shard].name
                << "' has no primary in etcd now (a standby takes over within its grace "
                   "period; try again)\n";
      t.usage_error = true;
      t.unavailable = true;
      return t;
    }
    const std::string path = ClientConfigPath();
    if (!ReadClientConfig(path, true, true, c.timeout_given, &t)) t.usage_error = true;
    return t;
  }
  t.connect_timeout_ms = c.connect_timeout_ms;
  if (!c.server.empty()) {
    t.server = c.server, t.source = "--server";
  } else if (const char* env = std::getenv("RDMALOCK_SERVER"); env != nullptr && *env != '\0') {
    t.server = env, t.source = "RDMALOCK_SERVER";
  }
  const std::string path = ClientConfigPath();
  if (!ReadClientConfig(path, !t.server.empty(), c.port_given, c.timeout_given, &t)) {
    t.usage_error = true;
    return t;
  }
  if (t.server.empty()) {
    std::cerr << "lockctl: no server: pass --server ADDRESS, set RDMALOCK_SERVER, or put "
                 "'server: ADDRESS' in "
              << (path.empty() ? "~/.config/rdmalock/client.yaml" : path) << "\n";
    t.usage_error = true;
  }
  return t;
}

std::unique_ptr<rdmalock::Client> ConnectOrDie(const Common& c, int* exit_code) {
  const Target t = TargetOf(c);
  if (t.usage_error) {
    *exit_code = t.unavailable ? kExitUnavailable : kExitUsage;
    return nullptr;
  }
  rdmalock::ClientOptions o;
  o.server = t.server;
  o.port = static_cast<uint16_t>(t.port);
  o.connect_timeout = std::chrono::milliseconds(t.connect_timeout_ms);
  o.client_name = "lockctl";
  o.record_requests = c.record_requests;
  // The environment's key (RDMALOCK_AUTH_KEY, RDMALOCK_AUTH_KEY_FILE) wins over the config file's.
  const bool env_key = std::getenv("RDMALOCK_AUTH_KEY") != nullptr ||
                       std::getenv("RDMALOCK_AUTH_KEY_FILE") != nullptr;
  if (!c.auth_key_file.empty() || !env_key) o.auth_key_file = t.auth_key_file;
  auto client = rdmalock::Client::Connect(o);
  if (!client.ok()) {
    std::cerr << "lockctl: lockd at " << t.server << ":" << t.port << " (server from " << t.source
              << "): " << client.status().ToString() << "\n";
    *exit_code = kExitUnavailable;
    return nullptr;
  }
  return std::move(client).value();
}

// A session with every shard of the cluster map (--cluster or --etcd), for bench.
std::unique_ptr<rdmalock::ClusterClient> ConnectClusterOrDie(const Common& c, int* exit_code) {
  rdmalock::ClusterMap map;
  std::string source;
  bool unavailable = false;
  if (!LoadClusterMap(c, &map, &source, &unavailable)) {
    *exit_code = unavailable ? kExitUnavailable : kExitUsage;
    return nullptr;
  }
  rdmalock::ClientOptions o;
  o.connect_timeout = std::chrono::milliseconds(c.connect_timeout_ms);
  o.client_name = "lockctl";
  o.record_requests = c.record_requests;
  o.auth_key_file = c.auth_key_file;  // else the SDK reads the environment
  auto client = c.etcd.empty() ? rdmalock::ClusterClient::Connect(map, o)
                               : rdmalock::ClusterClient::Connect(c.Etcd(), o);
  if (!client.ok()) {
    std::cerr << "lockctl: cluster from " << source << ": " << client.status().ToString() << "\n";
    *exit_code =
        client.status().code() == rdmalock::ErrorCode::kConnection ? kExitUnavailable : kExitUsage;
    return nullptr;
  }
  return std::move(client).value();
}

int CmdStatus(const Common& c) {
  int code = 0;
  auto client = ConnectOrDie(c, &code);
  if (!client) return code;
  auto info = client->Info();
  if (!info.ok()) {
    std::cerr << "lockctl: " << info.status().ToString() << "\n";
    return kExitUnavailable;
  }
  const double lease_ms = static_cast<double>(info->lease.count()) / 1e6;
  if (c.json) {
    std::printf(
        "{\"epoch\":%llu,\"lock_count\":%llu,\"lease_ms\":%.3f,\"stall_factor\":%u,"
        "\"max_sessions\":%llu,\"connected_clients\":%llu,\"accepted_total\":%llu,"
        "\"rejected_total\":%llu,\"recoveries\":%llu,\"grace_until_unix_ns\":%llu,"
        "\"started\":%s}\n",
        static_cast<unsigned long long>(info->epoch),
        static_cast<unsigned long long>(info->lock_count), lease_ms, info->stall_factor,
        static_cast<unsigned long long>(info->max_sessions),
        static_cast<unsigned long long>(info->connected_clients),
        static_cast<unsigned long long>(info->accepted_total),
        static_cast<unsigned long long>(info->rejected_total),
        static_cast<unsigned long long>(info->recoveries),
        static_cast<unsigned long long>(info->grace_until_unix_ns),
        JsonString(FormatTime(info->start_time_unix_ns)).c_str());
    return 0;
  }
  std::printf("epoch            %llu\n", static_cast<unsigned long long>(info->epoch));
  std::printf("started          %s\n", FormatTime(info->start_time_unix_ns).c_str());
  std::printf("locks            %llu\n", static_cast<unsigned long long>(info->lock_count));
  std::printf("lease            %.0f ms (stall factor %u: waiters recover after %.0f ms)\n",
              lease_ms, info->stall_factor, lease_ms * info->stall_factor);
  std::printf("clients          %llu connected (this lockctl included), max %llu\n",
              static_cast<unsigned long long>(info->connected_clients),
              static_cast<unsigned long long>(info->max_sessions));
  std::printf("handshakes       %llu accepted, %llu rejected\n",
              static_cast<unsigned long long>(info->accepted_total),
              static_cast<unsigned long long>(info->rejected_total));
  std::printf("recoveries       %llu session(s) ended and freed by lockd\n",
              static_cast<unsigned long long>(info->recoveries));
  if (info->grace_until_unix_ns != 0) {
    std::printf("restart grace    until %s%s\n", FormatTime(info->grace_until_unix_ns).c_str(),
                info->clock_unix_ns < info->grace_until_unix_ns ? " (in progress)" : " (over)");
  }
  return 0;
}

std::string HeartbeatText(std::chrono::milliseconds age) {
  return age.count() < 0 ? "-" : std::to_string(age.count()) + " ms ago";
}

int CmdClients(const Common& c) {
  int code = 0;
  auto client = ConnectOrDie(c, &code);
  if (!client) return code;
  auto sessions = client->Sessions();
  if (!sessions.ok()) {
    std::cerr << "lockctl: " << sessions.status().ToString() << "\n";
    return kExitUnavailable;
  }
  const uint64_t me = client->session_id();
  if (c.json) {
    std::fputs(lockctl::ClientsJson(*sessions, me).c_str(), stdout);
    return 0;
  }
  std::printf("%-8s %-20s %-8s %-22s %-24s %-14s %-5s %s\n", "SESSION", "NAME", "PID", "PEER",
              "CONNECTED", "HEARTBEAT", "HELD", "WAITING");
  for (const auto& s : *sessions) {
    size_t held = 0, waiting = 0;
    for (const auto& q : s.requests) {
      if (q.status == rdmalock::RequestInfo::Status::kHolding) ++held;
      if (q.status == rdmalock::RequestInfo::Status::kWaiting ||
          q.status == rdmalock::RequestInfo::Status::kRequesting) {
        ++waiting;
      }
    }
    std::printf("%-8llu %-20s %-8u %-22s %-24s %-14s %-5zu %zu%s\n",
                static_cast<unsigned long long>(s.session_id), s.client_name.c_str(), s.pid,
                s.peer.c_str(), FormatTime(s.since_unix_ns).c_str(),
                s.lockd_loopback ? "-" : HeartbeatText(s.heartbeat_age).c_str(), held, waiting,
                s.lockd_loopback     ? "  (lockd loopback)"
                : s.session_id == me ? "  (this lockctl)"
                                     : "");
  }
  return 0;
}

int CmdInspect(const Common& c, const std::string& name, int64_t slot) {
  if (name.empty() == (slot < 0)) {
    std::cerr << "lockctl inspect: give exactly one of NAME or --slot N\n";
    return kExitUsage;
  }
  int code = 0;
  auto client = ConnectOrDie(c, &code);
  if (!client) return code;
  const uint64_t s = slot >= 0 ? static_cast<uint64_t>(slot) : client->SlotOf(name);
  auto st = client->Inspect(s);
  if (!st.ok()) {
    std::cerr << "lockctl: " << st.status().ToString() << "\n";
    return st.status().code() == rdmalock::ErrorCode::kInvalidArgument ? kExitUsage
                                                                       : kExitUnavailable;
  }
  auto sessions = client->Sessions();
  if (!sessions.ok()) {
    std::cerr << "lockctl: " << sessions.status().ToString() << "\n";
    return kExitUnavailable;
  }
  using Who = lockctl::InspectWho;
  std::vector<Who> who;
  for (const auto& ses : *sessions) {
    for (const auto& q : ses.requests) {
      if (q.slot == s && q.status != rdmalock::RequestInfo::Status::kStale)
        who.push_back({&ses, q});
    }
  }
  std::sort(who.begin(), who.end(), [](const Who& a, const Who& b) {
    return a.request.status == b.request.status ? a.request.ticket < b.request.ticket
                                                : a.request.status > b.request.status;
  });
  const auto& v = *st;
  const char* state = v.exclusive_outstanding == 0 && v.shared_outstanding == 0 ? "free"
                      : v.exclusive_held                                        ? "held exclusive"
                      : v.shared_holders > 0                                    ? "held shared"
                                             : "held (mixed queue)";
  const uint32_t outstanding = v.exclusive_outstanding + v.shared_outstanding;
  if (c.json) {
    std::fputs(lockctl::InspectJson(name, v, state, who).c_str(), stdout);
    return 0;
  }
  if (!name.empty()) std::printf("name         %s\n", name.c_str());
  if (!c.cluster_file.empty() || !c.etcd.empty()) {  // which shard answered
    rdmalock::ClusterMap map;
    std::string source;
    bool unavailable = false;
    if (!name.empty() && c.shard.empty() && LoadClusterMap(c, &map, &source, &unavailable)) {
      std::printf("shard        %s\n", map.shards[rdmalock::ShardForName(map, name)].name.c_str());
    } else if (!c.shard.empty()) {
      std::printf("shard        %s\n", c.shard.c_str());
    }
  }
  std::printf("slot         %llu\n", static_cast<unsigned long long>(v.slot));
  std::printf("state        %s\n", state);
  std::printf("exclusive    %u outstanding (tickets issued %u, released %u)\n",
              v.exclusive_outstanding, v.exclusive_issued, v.exclusive_released);
  std::printf("shared       %u outstanding (tickets issued %u, released %u)\n",
              v.shared_outstanding, v.shared_issued, v.shared_released);
  std::printf("generation   %llu (renewals %u)%s\n", static_cast<unsigned long long>(v.generation),
              v.renewals, v.frozen ? "  [frozen: awaiting counter reset]" : "");
  for (const auto& w : who) {
    std::printf("%-12s session %llu ('%s', pid %u, %s): %s, ticket %u\n",
                RequestStatusName(w.request.status),
                static_cast<unsigned long long>(w.session->session_id),
                w.session->client_name.c_str(), w.session->pid, w.session->peer.c_str(),
                ModeName(w.request.mode), w.request.ticket);
  }
  if (outstanding > who.size()) {
    std::printf("unrecorded   %zu outstanding request(s) not in any session record\n",
                static_cast<size_t>(outstanding - who.size()));
  }
  return 0;
}

// Sends one request line to lockd's admin socket and prints the reply.
int CmdRelease(const Common& c, bool force, const std::string& name, int64_t slot, int64_t session,
               const std::string& socket_path) {
  const int given = (name.empty() ? 0 : 1) + (slot >= 0 ? 1 : 0) + (session >= 0 ? 1 : 0);
  if (!force || given != 1) {
    std::cerr << "lockctl release: give --force and exactly one of NAME, --slot N or --session "
                 "ID (it fences the holder's whole session)\n";
    return kExitUsage;
  }
  std::string request;
  if (session >= 0) {
    request = "release-session " + std::to_string(session);
  } else if (slot >= 0) {
    request = "release-slot " + std::to_string(slot);
  } else {
    int code = 0;
    auto client = ConnectOrDie(c, &code);  // for the lock count, to map the name to its slot
    if (!client) return code;
    request = "release-slot " + std::to_string(client->SlotOf(name));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || socket_path.size() >= sizeof(addr.sun_path)) {
    std::cerr << "lockctl: bad admin socket path " << socket_path << "\n";
    if (fd >= 0) close(fd);
    return kExitUsage;
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::cerr << "lockctl: cannot reach lockd's admin socket " << socket_path << ": "
              << std::strerror(errno) << " (run this on the lock node, as a user who may "
              << "open it; see admin_socket in lockd.yaml)\n";
    close(fd);
    return kExitUnavailable;
  }
  request += "\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    std::cerr << "lockctl: write to the admin socket failed: " << std::strerror(errno) << "\n";
    close(fd);
    return kExitUnavailable;
  }
  std::string reply;
  char buf[512];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) reply.append(buf, static_cast<size_t>(n));
  close(fd);
  while (!reply.empty() && reply.back() == '\n') reply.pop_back();
  const bool ok = reply.rfind("ok ", 0) == 0;
  if (c.json) {
    std::printf(
        "{\"ok\":%s,\"reply\":%s}\n", ok ? "true" : "false",
        JsonString(reply.substr(reply.find(' ') == std::string::npos ? 0 : reply.find(' ') + 1))
            .c_str());
  } else {
    std::printf("%s\n", reply.c_str());
  }
  if (reply.empty()) return kExitUnavailable;
  return ok ? 0 : 1;
}

// lockctl top: the most contended locks, refreshed every interval. Reads the whole lock table
// with RDMA READs each time (lock_count x 16 bytes) and ranks slots by waiters, then by requests
// queued per second since the previous read.
int CmdTop(const Common& c, int interval_ms, int rows, int iterations,
           const std::vector<std::string>& names) {
  int code = 0;
  auto client = ConnectOrDie(c, &code);
  if (!client) return code;
  const uint64_t n = client->lock_count();
  std::unordered_map<uint64_t, std::string> label;
  for (const auto& name : names) {
    auto& l = label[client->SlotOf(name)];
    l += (l.empty() ? "" : ",") + name;
  }
  const bool tty = !c.json && isatty(STDOUT_FILENO) == 1;
  struct Prev {
    rdmalock::proto::Word0 word;
    uint32_t generation = 0;
  };
  std::vector<Prev> prev;
  auto last = std::chrono::steady_clock::now();
  for (int it = 0; iterations == 0 || it <= iterations; ++it) {
    if (it > 0) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    auto table = client->InspectRange(0, n);
    if (!table.ok()) {
      std::cerr << "lockctl: " << table.status().ToString() << "\n";
      return kExitUnavailable;
    }
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - last).count();
    last = now;
    struct Row {
      uint64_t slot;
      uint32_t holders, waiting;
      double rate;
      const char* state;
    };
    std::vector<Row> out;
    uint64_t held = 0, waiting = 0, contended = 0;
    const bool have_prev = !prev.empty();
    prev.resize(n);
    for (const auto& v : *table) {
      const rdmalock::proto::Word0 word{.max_s = v.shared_issued,
                                        .max_x = v.exclusive_issued,
                                        .n_s = v.shared_released,
                                        .n_x = v.exclusive_released};
      const auto gen = static_cast<uint32_t>(v.generation);
      const rdmalock::proto::Occupancy occ = rdmalock::proto::OccupancyOf(word);
      const uint32_t holders = occ.holders, w = occ.waiting;
      const uint32_t outstanding = occ.exclusive_outstanding + occ.shared_outstanding;
      Prev& p = prev[v.slot];
      const uint64_t queued =
          have_prev ? rdmalock::proto::RequestsBetween(p.word, p.generation, word, gen) : 0;
      p = {word, gen};
      if (holders > 0) ++held;
      waiting += w;
      if (w > 0) ++contended;
      if (holders == 0 && queued == 0) continue;
      const char* state = v.exclusive_held       ? "exclusive"
                          : v.shared_holders > 0 ? "shared"
                          : outstanding > 0      ? "mixed"
                                                 : "free";
      out.push_back(
          {v.slot, holders, w, secs > 0 ? static_cast<double>(queued) / secs : 0.0, state});
    }
    if (it == 0) continue;  // the first read only sets the baseline for requests/s
    std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) {
      if (a.waiting != b.waiting) return a.waiting > b.waiting;
      if (a.rate != b.rate) return a.rate > b.rate;
      return a.slot < b.slot;
    });
    if (out.size() > static_cast<size_t>(rows)) out.resize(static_cast<size_t>(rows));
    const std::time_t wall = std::time(nullptr);
    char when[32];
    std::tm tm{};
    gmtime_r(&wall, &tm);
    std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (c.json) {
      std::printf(
          "{\"time\":%s,\"interval_s\":%.3f,\"lock_count\":%llu,\"held\":%llu,"
          "\"waiting\":%llu,\"contended\":%llu,\"locks\":[",
          JsonString(when).c_str(), secs, static_cast<unsigned long long>(n),
          static_cast<unsigned long long>(held), static_cast<unsigned long long>(waiting),
          static_cast<unsigned long long>(contended));
      for (size_t i = 0; i < out.size(); ++i) {
        const auto l = label.find(out[i].slot);
        std::printf(
            "%s{\"slot\":%llu,\"names\":%s,\"state\":%s,\"holders\":%u,"
            "\"waiting\":%u,\"requests_per_s\":%.1f}",
            i ? "," : "", static_cast<unsigned long long>(out[i].slot),
            JsonString(l == label.end() ? std::string() : l->second).c_str(),
            JsonString(out[i].state).c_str(), out[i].holders, out[i].waiting, out[i].rate);
      }
      std::printf("]}\n");
    } else {
      if (tty) std::printf("\033[H\033[2J");
      std::printf(
          "lockctl top  %s  %llu locks: %llu held, %llu waiting on %llu contended  (every %.1f "
          "s)\n\n",
          when, static_cast<unsigned long long>(n), static_cast<unsigned long long>(held),
          static_cast<unsigned long long>(waiting), static_cast<unsigned long long>(contended),
          interval_ms / 1000.0);
      std::printf("%-10s %-10s %8s %8s %12s  %s\n", "SLOT", "STATE", "HOLDERS", "WAITING",
                  "REQUESTS/S", "NAMES");
      for (const auto& r : out) {
        const auto l = label.find(r.slot);
        std::printf("%-10llu %-10s %8u %8u %12.1f  %s\n", static_cast<unsigned long long>(r.slot),
                    r.state, r.holders, r.waiting, r.rate,
                    l == label.end() ? "" : l->second.c_str());
      }
      if (out.empty()) std::printf("(no lock held or requested in this interval)\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

std::atomic<int> g_forward_signal{0};  // lockctl's own process-wide signal flag (main only)

// What lockctl tells the supervisor of an acquired command, in memory they share (issue 16,
// finding 13). Times are CLOCK_MONOTONIC (std::chrono::steady_clock) nanoseconds.
struct CommandWatch {
  std::atomic<int64_t> term_at_ns{INT64_MAX};  // SIGTERM the command's process group from then
  std::atomic<int64_t> kill_at_ns{INT64_MAX};  // and SIGKILL it from then, at the latest
  std::atomic<int> forward{0};                 // a signal lockctl received, for the command
  std::atomic<int> stopped_for_loss{0};        // set by the supervisor when it terminated it
};
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// The supervisor: a forked copy of lockctl (which has threads), so only async-signal-safe calls.
// It runs the command in a process group of its own and ends the whole group (a background
// grandchild included) when the command exits, when lockctl dies (or was already gone), and at
// the times lockctl last wrote, which follow the lease: if lockctl is stopped or stuck and
// renews nothing, the command is still stopped before its lease can end. Exits with the
// command's status (128+N for signal N).
//
// What the command's exec needs was built before the fork: `paths` (null-terminated) are the files
// the command may be, in PATH order, as execvp would try them; `sh_argv` is {"/bin/sh", <slot for
// the file>, arguments...} for a file that is not an executable format (execvp's ENOEXEC rule).
[[noreturn]] void Supervise(CommandWatch* w, pid_t lockctl, char* const* paths, char* const* argv,
                            char** sh_argv, char* const* envp, int64_t grace_ns) {
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);  // signals for the command come through lockctl
  // Nothing of lockctl's but stdin, stdout and stderr: its RDMA device and rdma_cm descriptors
  // held open here would keep its connections (and their locks at lockd) alive after lockctl
  // died, and the command has no use for them either.
  close_range(3, ~0U, 0);
  if (getppid() != lockctl) _exit(kExitInternal);
  // _Fork, not fork: no atfork handler (the SDK's take a mutex) runs in this copy of a threaded
  // process.
  const pid_t cmd = _Fork();
  if (cmd < 0) _exit(kExitInternal);
  if (cmd == 0) {
    setpgid(0, 0);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    int err = ENOENT;
    bool denied = false;
    for (char* const* p = paths; *p != nullptr; ++p) {
      execve(*p, argv, envp);
      if (errno == ENOEXEC) {
        sh_argv[1] = *p;
        execve(sh_argv[0], sh_argv, envp);
      }
      err = errno;
      if (err == EACCES) denied = true;
      if (err != ENOENT && err != ENOTDIR && err != EACCES && err != ESTALE) break;
    }
    if (denied && (err == ENOENT || err == ENOTDIR || err == ESTALE)) err = EACCES;
    const char* why = strerrordesc_np(err);  // a static table: no locale, no allocation
    const char* parts[] = {"lockctl: cannot run ", argv[0], ": ", why != nullptr ? why : "error",
                           "\n"};
    for (const char* p : parts) (void)!write(2, p, std::strlen(p));
    _exit(127);
  }
  setpgid(cmd, cmd);
  int status = 0;
  int64_t termed = 0;
  for (;;) {
    const pid_t r = waitpid(cmd, &status, WNOHANG);
    if (r == cmd) break;
    const int64_t now = MonotonicNs();
    if (getppid() != lockctl) {  // lockctl died: nothing holds the lock for the command
      kill(-cmd, SIGKILL);
    }
    if (const int sig = w->forward.exchange(0); sig != 0) kill(-cmd, sig);
    if (termed == 0 && now >= w->term_at_ns.load()) {
      w->stopped_for_loss.store(1);
      kill(-cmd, SIGTERM);
      termed = now;
    }
    // kill_at is the hard bound (before the lease ends), with or without a SIGTERM before it.
    if ((termed != 0 && now >= termed + grace_ns) || now >= w->kill_at_ns.load()) {
      w->stopped_for_loss.store(1);
      kill(-cmd, SIGKILL);
    }
    const timespec tick{0, 5'000'000};
    nanosleep(&tick, nullptr);
  }
  kill(-cmd, SIGKILL);  // whatever the command left running in its group ends with it
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) _exit(128 + WTERMSIG(status));
  _exit(kExitInternal);
}

int CmdAcquire(const Common& c, const std::string& name, bool shared, int64_t timeout_ms,
               int grace_ms, const std::vector<std::string>& cmd) {
  if (cmd.empty()) {
    std::cerr << "lockctl acquire: give the command after --, e.g. lockctl acquire NAME -- make\n";
    return kExitUsage;
  }
  int code = 0;
  const auto started = std::chrono::steady_clock::now();
  // Through etcd, the shard's primary is looked up before every connection attempt, and
  // connecting may take as long as the acquire's own timeout: a failover in progress costs time,
  // not an error (issue 16, finding 14).
  std::unique_ptr<rdmalock::ClusterClient> cluster;
  std::unique_ptr<rdmalock::Client> single;
  rdmalock::Client* client = nullptr;
  if (!c.etcd.empty()) {
    Common cc = c;
    if (timeout_ms > cc.connect_timeout_ms) cc.connect_timeout_ms = static_cast<int>(timeout_ms);
    cluster = ConnectClusterOrDie(cc, &code);
    if (!cluster) return code;
    auto shard = cluster->Shard(cluster->ShardOf(name));
    if (!shard.ok()) {
      std::cerr << "lockctl: lock '" << name << "': " << shard.status().ToString() << "\n";
      return kExitUnavailable;
    }
    client = *shard;
  } else {
    single = ConnectOrDie(c, &code);
    if (!single) return code;
    client = single.get();
  }
  rdmalock::LockOptions lo;
  lo.mode = shared ? rdmalock::LockMode::kShared : rdmalock::LockMode::kExclusive;
  if (timeout_ms >= 0) {
    const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - started);
    lo.timeout =
        std::max(std::chrono::milliseconds(0), std::chrono::milliseconds(timeout_ms) - spent);
  }
  auto lock = client->Lock(name, lo);
  if (!lock.ok()) {
    std::cerr << "lockctl: lock '" << name << "': " << lock.status().ToString() << "\n";
    const auto ec = lock.status().code();
    return ec == rdmalock::ErrorCode::kTimeout || ec == rdmalock::ErrorCode::kBusy
               ? kExitTimeout
               : kExitUnavailable;
  }
  std::atomic<bool> lost{false};
  lock->OnLost([&](const rdmalock::Status&) { lost.store(true); });

  // Everything the child needs is built before the fork: after it, only async-signal-safe calls.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "RDMALOCK_NAME=", 14) == 0 ||
        std::strncmp(*e, "RDMALOCK_SLOT=", 14) == 0 ||
        std::strncmp(*e, "RDMALOCK_MODE=", 14) == 0 ||
        std::strncmp(*e, "RDMALOCK_TOKEN=", 15) == 0) {
      continue;
    }
    env.emplace_back(*e);
  }
  env.push_back("RDMALOCK_NAME=" + name);
  env.push_back("RDMALOCK_SLOT=" + std::to_string(lock->slot()));
  env.push_back(std::string("RDMALOCK_MODE=") + (shared ? "shared" : "exclusive"));
  if (!shared) env.push_back("RDMALOCK_TOKEN=" + std::to_string(lock->fencing_token()));
  std::vector<char*> envp, argv;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // execvp's PATH search, done here: after the fork there is no getenv and no allocation.
  std::vector<std::string> files;
  if (cmd[0].find('/') != std::string::npos) {
    files.push_back(cmd[0]);
  } else if (!cmd[0].empty()) {
    const char* path_env = std::getenv("PATH");
    const std::string path = path_env != nullptr ? path_env : "/bin:/usr/bin";
    for (size_t at = 0;;) {
      const size_t colon = path.find(':', at);
      const std::string dir = path.substr(at, colon == std::string::npos ? colon : colon - at);
      files.push_back((dir.empty() ? std::string(".") : dir) + "/" + cmd[0]);
      if (colon == std::string::npos) break;
      at = colon + 1;
    }
  }
  std::vector<char*> paths, sh_argv{const_cast<char*>("/bin/sh"), nullptr};
  for (auto& f : files) paths.push_back(f.data());
  paths.push_back(nullptr);
  for (size_t i = 1; i < cmd.size(); ++i) sh_argv.push_back(const_cast<char*>(cmd[i].c_str()));
  sh_argv.push_back(nullptr);
  void* shm = mmap(nullptr, sizeof(CommandWatch), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) {
    std::perror("lockctl: mmap");
    return kExitInternal;
  }
  auto* watch = new (shm) CommandWatch();
  // The command is stopped once a renewal is a third of a lease overdue (they come every third),
  // and killed before the lease could end, whatever lockctl is doing then.
  const auto lease = client->lease();
  const auto steady_ns = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  const auto follow_lease = [&] {
    const auto end = lock->lease_expiry();
    watch->term_at_ns.store(steady_ns(end - lease / 3));
    watch->kill_at_ns.store(steady_ns(end - lease / 10));
  };
  follow_lease();
  // --grace: by default a quarter of the lease; the SIGKILL comes a tenth of a lease before the
  // lease ends at the latest, whatever --grace says.
  const int64_t grace_ns =
      grace_ms >= 0 ? int64_t{grace_ms} * 1'000'000
                    : std::chrono::duration_cast<std::chrono::nanoseconds>(lease).count() / 4;
  const pid_t lockctl_pid = getpid();

  const pid_t child = fork();
  if (child < 0) {
    std::perror("lockctl: fork");
    return kExitInternal;
  }
  if (child == 0) {
    Supervise(watch, lockctl_pid, paths.data(), argv.data(), sh_argv.data(), envp.data(), grace_ns);
  }
  signal(SIGTERM, [](int s) { g_forward_signal.store(s); });
  signal(SIGINT, [](int s) { g_forward_signal.store(s); });
  int status = 0;
  bool told = false;
  for (;;) {
    const pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child) break;
    if (r < 0 && errno != EINTR) {
      std::perror("lockctl: waitpid");
      return kExitInternal;
    }
    if (const int s = g_forward_signal.exchange(0); s != 0) watch->forward.store(s);
    const bool is_lost = lost.load() || lock->state() == rdmalock::LockState::kLost;
    if (is_lost) {
      if (!told) {
        std::cerr << "lockctl: lock '" << name << "' lost; sending SIGTERM to the command\n";
        // lockd may grant the lock again when the lease ends (one lease after a fence): the
        // SIGKILL stays before that, --grace after the SIGTERM if that is sooner.
        const int64_t now = MonotonicNs();
        watch->kill_at_ns.store(std::min(watch->kill_at_ns.load(), now + grace_ns));
        watch->term_at_ns.store(now);
        told = true;
      }
    } else {
      follow_lease();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool stopped = watch->stopped_for_loss.load() != 0;
  if (stopped && !told) {
    std::cerr << "lockctl: lock '" << name
              << "': its lease was about to run out without a renewal; the command was stopped\n";
  }
  const rdmalock::Status rel = lock->Release();
  munmap(shm, sizeof(CommandWatch));
  if (stopped) return kExitLost;
  if (!rel.ok()) {
    std::cerr << "lockctl: release of '" << name << "': " << rel.ToString() << "\n";
    if (rel.code() == rdmalock::ErrorCode::kLockLost) return kExitLost;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return kExitInternal;
}

// lockctl --etcd URL cluster [init SHARDS [--replace]]
int CmdCluster(const Common& c, const std::string& init, bool replace) {
  const rdmalock::EtcdCluster e = c.Etcd();
  if (!init.empty()) {
    std::vector<std::string> names;
    std::stringstream ss(init);
    for (std::string n; std::getline(ss, n, ',');) names.push_back(n);
    if (auto st = rdmalock::PublishClusterMap(e, names, replace); !st.ok()) {
      std::cerr << "lockctl: " << st.message() << "\n";
      return st.code() == rdmalock::ErrorCode::kConnection ? kExitUnavailable : kExitUsage;
    }
  }
  auto map = rdmalock::ReadClusterMap(e);
  if (!map.ok()) {
    std::cerr << "lockctl: " << map.status().message() << "\n";
    return map.status().code() == rdmalock::ErrorCode::kConnection ? kExitUnavailable : kExitUsage;
  }
  // Every lockd of each shard (primary or standby), as each registers itself on its etcd lease.
  std::vector<std::vector<std::string>> members(map->shards.size());
  if (auto etcd = rdmalock::etcd::Client::Create(
          c.etcd, {c.etcd_ca_file, c.etcd_cert_file, c.etcd_key_file});
      etcd.ok()) {
    for (size_t i = 0; i < map->shards.size(); ++i) {
      const std::string prefix =
          "/rdmalock/" + c.etcd_cluster + "/shard/" + map->shards[i].name + "/members/";
      auto kvs = (*etcd)->GetPrefix(prefix, std::chrono::milliseconds(2000));
      if (!kvs.ok()) continue;
      for (const auto& kv : *kvs) members[i].push_back(kv.value);
    }
  }
  auto primary = [](const rdmalock::ShardSpec& s) {
    return s.server.empty() ? std::string() : s.server + ":" + std::to_string(s.port);
  };
  if (c.json) {
    std::cout << lockctl::ClusterJson(c.etcd_cluster, *map, members);
  } else {
    std::cout << "cluster " << c.etcd_cluster << ": " << map->shards.size() << " shard(s)\n";
    for (size_t i = 0; i < map->shards.size(); ++i) {
      const auto& s = map->shards[i];
      std::cout << "  " << s.name << "  primary "
                << (s.server.empty() ? std::string("(none now)") : primary(s));
      std::string standbys;
      for (const auto& m : members[i]) {
        const bool is_primary =
            m == primary(s) || m == "[" + s.server + "]:" + std::to_string(s.port);  // IPv6
        if (!is_primary) standbys += (standbys.empty() ? "" : ", ") + m;
      }
      std::cout << "  standby " << (standbys.empty() ? "(none)" : standbys) << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  lockctl::Args a;
  if (const int rc = lockctl::ParseArgs(argc, argv, &a); rc >= 0) return rc;
  // With --cluster, the lock a command is about picks the shard.
  if (a.command == lockctl::Command::kAcquire) a.common.route_name = a.acq_name;
  if (a.command == lockctl::Command::kInspect && a.inspect_slot < 0) {
    a.common.route_name = a.inspect_name;
  }
  const Common& c = a.common;
  switch (a.command) {
    case lockctl::Command::kStatus:
      return CmdStatus(c);
    case lockctl::Command::kClients:
      return CmdClients(c);
    case lockctl::Command::kInspect:
      return CmdInspect(c, a.inspect_name, a.inspect_slot);
    case lockctl::Command::kTop:
      return CmdTop(c, a.top_interval, a.top_rows, a.top_iterations, a.top_names);
    case lockctl::Command::kRelease:
      return CmdRelease(c, a.rel_force, a.rel_name, a.rel_slot, a.rel_session, a.rel_socket);
    case lockctl::Command::kAcquire:
      return CmdAcquire(c, a.acq_name, a.acq_shared, a.acq_timeout, a.acq_grace, a.acq_cmd);
    case lockctl::Command::kKeygen:
      std::cout << rdmalock::auth::NewKeyHex() << "\n";
      return 0;
    case lockctl::Command::kCluster:
      return CmdCluster(c, a.cluster_init, a.cluster_replace);
    case lockctl::Command::kBench:
      if (c.cluster_file.empty() && c.etcd.empty() && TargetOf(c).usage_error) return kExitUsage;
      // Each bench process connects by itself, after the fork (RunBench).
      return lockctl::RunBench(a.bench, [&c](int* code) {
        lockctl::BenchTarget t;
        if (c.cluster_file.empty() && c.etcd.empty()) {
          t.client = ConnectOrDie(c, code);
        } else {
          t.cluster = ConnectClusterOrDie(c, code);
        }
        return t;
      });
  }
  return kExitUsage;
}
