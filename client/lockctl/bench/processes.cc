// lockctl bench's processes: RunBench forks --processes - 1 children, each connects by itself,
// all start together once every one is connected, and each child sends what it measured to the
// parent over a pipe (the wire below), which merges and reports it (report.cc).
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "client/lockctl/args.h"
#include "client/lockctl/bench/bench_internal.h"

namespace lockctl {
namespace bench {
namespace {

using std::chrono::duration_cast;

bool WriteAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly `len` bytes unless EOF, an error or `deadline` comes first.
bool ReadAll(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    const auto left = duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd pfd{.fd = fd, .events = POLLIN, .revents = 0};
    const int pr = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (pr < 0 && errno != EINTR) return false;
    if (pr <= 0) continue;
    const ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

constexpr uint64_t kWireMagic = 0x726c6b62656e6368ull;  // "rlkbench"

// The fixed part of a child's report; then acquire, release and pair codes, then first_error.
// Parent and child are the same binary, so the layout is the same on both ends.
struct WireHeader {
  uint64_t magic = kWireMagic;
  uint64_t n_acquire = 0, n_release = 0, n_pair = 0, error_len = 0;
  uint64_t locks = 0, late = 0, errors = 0;
  int64_t max_lag_ns = 0;
  double elapsed_s = 0;
  rdmalock::ClientStats stats;
};
static_assert(std::is_trivially_copyable_v<WireHeader>);

bool SendResult(int fd, const ProcResult& p) {
  WireHeader h;
  h.n_acquire = p.acquire.size();
  h.n_release = p.release.size();
  h.n_pair = p.pair.size();
  h.error_len = p.first_error.size();
  h.locks = p.locks;
  h.late = p.late;
  h.errors = p.errors;
  h.max_lag_ns = p.max_lag_ns;
  h.elapsed_s = p.elapsed_s;
  h.stats = p.stats;
  return WriteAll(fd, &h, sizeof(h)) &&
         WriteAll(fd, p.acquire.data(), p.acquire.size() * sizeof(uint32_t)) &&
         WriteAll(fd, p.release.data(), p.release.size() * sizeof(uint32_t)) &&
         WriteAll(fd, p.pair.data(), p.pair.size() * sizeof(uint32_t)) &&
         WriteAll(fd, p.first_error.data(), p.first_error.size());
}

bool ReceiveResult(int fd, Clock::time_point deadline, ProcResult* p) {
  WireHeader h;
  if (!ReadAll(fd, &h, sizeof(h), deadline) || h.magic != kWireMagic) return false;
  constexpr uint64_t kMaxSamples = uint64_t{1} << 32;
  if (h.n_acquire > kMaxSamples || h.n_release > kMaxSamples || h.n_pair > kMaxSamples ||
      h.error_len > (1u << 20)) {
    return false;
  }
  p->acquire.resize(h.n_acquire);
  p->release.resize(h.n_release);
  p->pair.resize(h.n_pair);
  p->first_error.resize(h.error_len);
  p->locks = h.locks;
  p->late = h.late;
  p->errors = h.errors;
  p->max_lag_ns = h.max_lag_ns;
  p->elapsed_s = h.elapsed_s;
  p->stats = h.stats;
  return ReadAll(fd, p->acquire.data(), h.n_acquire * sizeof(uint32_t), deadline) &&
         ReadAll(fd, p->release.data(), h.n_release * sizeof(uint32_t), deadline) &&
         ReadAll(fd, p->pair.data(), h.n_pair * sizeof(uint32_t), deadline) &&
         ReadAll(fd, p->first_error.data(), h.error_len, deadline);
}

// Connects, checks the lock count and opens the idle sessions (the first process only).
struct Session {
  BenchTarget target;
  std::vector<BenchTarget> idle;
};

int Connect(const BenchOptions& o, const BenchConnect& connect, int proc, Session* s) {
  int code = 0;
  s->target = connect(&code);
  if (!s->target.client && !s->target.cluster) return code != 0 ? code : kExitInternal;
  if (s->target.cluster) {  // names hash to slots: any number of keys fits
    for (size_t i = 0; i < s->target.cluster->map().shards.size(); ++i) {
      if (auto c = s->target.cluster->Shard(i); !c.ok()) {  // connect every shard before the run
        std::fprintf(stderr, "lockctl bench: %s\n", c.status().ToString().c_str());
        return kExitUnavailable;
      }
    }
  } else if (o.locks > s->target.client->lock_count()) {
    std::fprintf(stderr, "lockctl bench: --locks %llu is more than lockd's %llu locks\n",
                 static_cast<unsigned long long>(o.locks),
                 static_cast<unsigned long long>(s->target.client->lock_count()));
    return kExitUsage;
  }
  for (int i = 0; proc == 0 && i < o.idle_sessions; ++i) {
    auto extra = connect(&code);
    if (!extra.client && !extra.cluster) return code != 0 ? code : kExitInternal;
    s->idle.push_back(std::move(extra));
  }
  return 0;
}

// A child: connect, say ready ('R' on result_fd), wait for the parent's go (a byte on go_fd; EOF
// means the parent gave up), run, send the result. Its exit code says whether it could run and
// report; what went wrong in the run (errors) travels in the result.
int ChildMain(const BenchOptions& o, const BenchConnect& connect, int proc, int result_fd,
              int go_fd, ProgressCounters* progress) {
  Session s;
  if (const int rc = Connect(o, connect, proc, &s); rc != 0) return rc;
  const KeySampler keys(o);
  if (!WriteAll(result_fd, "R", 1)) return kExitInternal;
  char go = 0;
  ssize_t n;
  while ((n = read(go_fd, &go, 1)) < 0 && errno == EINTR) {
  }
  if (n != 1) return kExitInternal;
  close(go_fd);
  const ProcResult p = RunWorkload(s.target, o, keys, proc, progress, /*draw=*/false);
  if (!SendResult(result_fd, p)) {
    std::fprintf(stderr, "lockctl bench: process %d: cannot send its result: %s\n", proc,
                 std::strerror(errno));
    return kExitInternal;
  }
  close(result_fd);
  return 0;
}

struct Child {
  int proc = 0;
  pid_t pid = -1;
  int fd = -1;  // read end of its result pipe
  bool reported = false;
  bool killed = false;  // by the parent (no message when it dies of that)
};

void Kill(Child& c) {
  if (c.pid > 0) kill(c.pid, SIGKILL);
  c.killed = true;
}

// Collects a child's exit status; returns its exit code (1 if it died of a signal).
int Reap(Child& c) {
  int status = 0;
  pid_t r;
  while ((r = waitpid(c.pid, &status, 0)) < 0 && errno == EINTR) {
  }
  c.pid = -1;
  if (r < 0) return kExitInternal;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status) && !(c.killed && WTERMSIG(status) == SIGKILL)) {
    std::fprintf(stderr, "lockctl bench: process %d died of signal %d\n", c.proc, WTERMSIG(status));
  }
  return 1;
}

void KillAndReap(std::vector<Child>& children) {
  for (auto& c : children) Kill(c);
  for (auto& c : children) {
    if (c.pid > 0) (void)Reap(c);
    if (c.fd >= 0) close(c.fd);
    c.fd = -1;
  }
}

}  // namespace
}  // namespace bench

int RunBench(const BenchOptions& o, const BenchConnect& connect) {
  using namespace bench;  // this file's parts
  if (const int rc = ValidateBenchOptions(o); rc != 0) return rc;
  // A --timeline that cannot be written is said before the run, not after it.
  if (!o.timeline.empty()) {
    std::FILE* f = std::fopen(o.timeline.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "lockctl bench: cannot write --timeline %s: %s\n", o.timeline.c_str(),
                   std::strerror(errno));
      return kExitUsage;
    }
    std::fclose(f);
  }
  std::vector<Child> children;
  // The progress line (a terminal, not --json): its counters are mapped before the fork so that
  // every process's workers count into them and the parent draws the sum.
  std::unique_ptr<ProgressCounters> progress;
  if (ShouldShowProgress(o.json, STDOUT_FILENO)) {
    progress =
        ProgressCounters::Create(static_cast<size_t>(o.processes) * static_cast<size_t>(o.threads));
  }
  int go[2] = {-1, -1};
  if (o.processes > 1) {
    // A child that dies must not kill the parent's writes to it (nor the parent a child's).
    signal(SIGPIPE, SIG_IGN);
    if (pipe(go) != 0) {
      std::perror("lockctl bench: pipe");
      return kExitInternal;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t parent = getpid();
    for (int p = 1; p < o.processes; ++p) {
      int res[2];
      if (pipe(res) != 0) {
        std::perror("lockctl bench: pipe");
        close(go[0]);
        close(go[1]);
        KillAndReap(children);
        return kExitInternal;
      }
      const pid_t pid = fork();
      if (pid < 0) {
        std::perror("lockctl bench: fork");
        close(res[0]);
        close(res[1]);
        close(go[0]);
        close(go[1]);
        KillAndReap(children);
        return kExitInternal;
      }
      if (pid == 0) {
        // The child dies with the parent (the forking thread, which is the parent's main one).
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(kExitInternal);
        close(go[1]);
        close(res[0]);
        for (const auto& c : children) close(c.fd);
        _exit(ChildMain(o, connect, p, res[1], go[0], progress.get()));
      }
      close(res[1]);
      children.push_back({.proc = p, .pid = pid, .fd = res[0]});
    }
    close(go[0]);
  }

  Session s;
  int code = Connect(o, connect, 0, &s);
  std::unique_ptr<KeySampler> keys;
  if (code == 0) keys = std::make_unique<KeySampler>(o);
  // Every child says it is ready (connected) before any process starts its run.
  const auto ready_deadline = Clock::now() + kChildGrace;
  for (auto& c : children) {
    if (code != 0) break;
    char ready = 0;
    if (!ReadAll(c.fd, &ready, 1, ready_deadline) || ready != 'R') {
      close(c.fd);
      c.fd = -1;
      Kill(c);
      const int rc = Reap(c);
      std::fprintf(stderr, "lockctl bench: process %d could not start (exit %d)\n", c.proc, rc);
      code = rc != 0 ? rc : kExitInternal;
    }
  }
  if (code != 0) {
    if (go[1] >= 0) close(go[1]);
    KillAndReap(children);
    return code;
  }
  if (go[1] >= 0) {
    const std::string bytes(children.size(), 'G');
    const bool sent = WriteAll(go[1], bytes.data(), bytes.size());
    close(go[1]);
    if (!sent) {
      std::perror("lockctl bench: cannot start the other processes");
      KillAndReap(children);
      return kExitInternal;
    }
  }

  std::vector<ProcResult> procs;
  procs.push_back(RunWorkload(s.target, o, *keys, 0, progress.get(), progress != nullptr));
  s = Session{};  // the parent's sessions end now, as the children's do when they exit
  if (!o.timeline.empty() && !WriteTimeline(o.timeline, procs[0].timeline)) {
    std::fprintf(stderr, "lockctl bench: cannot write --timeline %s: %s\n", o.timeline.c_str(),
                 std::strerror(errno));
    return kExitInternal;
  }

  int failed = 0, child_code = 0;
  const auto report_deadline = Clock::now() + kChildGrace;
  for (auto& c : children) {
    ProcResult p;
    c.reported = ReceiveResult(c.fd, report_deadline, &p);
    close(c.fd);
    c.fd = -1;
    if (!c.reported) Kill(c);
    const int rc = Reap(c);
    if (c.reported && rc == 0) {
      procs.push_back(std::move(p));
      continue;
    }
    std::fprintf(stderr, "lockctl bench: process %d failed (%s, exit %d)\n", c.proc,
                 c.reported ? "reported" : "no report", rc);
    ++failed;
    if (child_code == 0) child_code = rc != 0 ? rc : 1;
  }
  const int rc = Report(o, procs, failed);
  return rc != 0 ? rc : child_code;
}

}  // namespace lockctl
