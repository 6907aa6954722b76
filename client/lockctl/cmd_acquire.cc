// lockctl acquire NAME -- COMMAND: runs a command while holding a lock, under a supervisor that
// ends the command before the lock's lease can run out (issue 16, finding 13).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "client/lockctl/commands.h"
#include "client/lockctl/lease_watch.h"

namespace lockctl {
namespace {

// The signals lockctl received and has not passed on yet, one bit per signal number: two that
// come between two polls (systemd's SIGTERM, then SIGHUP with SendSIGHUP=yes) are both passed on;
// with one number kept, the first was lost (found by review, 2026-12-07). lockctl's own
// process-wide flags (main only): its handlers set bits, its main loop takes them.
std::atomic<unsigned> g_forward_signals{0};
static_assert(std::atomic<unsigned>::is_always_lock_free);  // set by a signal handler
constexpr unsigned SignalBit(int sig) { return 1U << sig; }
static_assert(SIGTERM < 32 && SIGINT < 32 && SIGHUP < 32 && SIGQUIT < 32);

// What lockctl tells the supervisor of an acquired command, in memory they share (issue 16,
// finding 13). Times are CLOCK_MONOTONIC (std::chrono::steady_clock) nanoseconds.
struct CommandWatch {
  std::atomic<int64_t> term_at_ns{INT64_MAX};  // SIGTERM the command's process group from then
  std::atomic<int64_t> kill_at_ns{INT64_MAX};  // and SIGKILL it from then, at the latest
  std::atomic<unsigned> forward{0};      // signals lockctl received, for the command (SignalBit)
  std::atomic<int> stopped_for_loss{0};  // set by the supervisor when it terminated it
  std::atomic<int> command{0};           // the command's pid (and process group), once it is forked
};
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free &&
              std::atomic<unsigned>::is_always_lock_free);

int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Writes the decimal digits of `v` at `out` (async-signal-safe); returns the end.
char* Digits(char* out, long v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (n > 0) *out++ = tmp[--n];
  return out;
}

// The supervisor is the command's descendants' subreaper: one that left the command's process
// group (setsid, a daemon's double fork) and outlived its parent is the supervisor's child. This
// kills every child the supervisor has and waits for each, round after round (a killed child's
// own children come to the supervisor in turn), until it has none: nothing the command started
// runs on after the release. Async-signal-safe (a forked copy of a threaded process). lockctl
// calls it too, when the supervisor was killed: lockctl is the subreaper above it.
void KillDescendants() {
  char path[64] = "/proc/self/task/";
  char* end = Digits(path + std::strlen(path), getpid());
  std::memcpy(end, "/children", sizeof("/children"));
  // At most 10 s (a descendant that forks faster than it is killed): then the supervisor exits
  // and what is left goes to lockctl (a subreaper too), which tries again before the release.
  for (int round = 0; round < 10'000; ++round) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // no /proc, or a kernel without the children file: the group kill only
    // "PID PID ... " (each followed by a space), read in pieces: a pid is acted on only once its
    // space is read, never a piece of one cut at the end of a read.
    long pid = 0;
    char buf[512];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) {
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] >= '0' && buf[i] <= '9') {
          pid = pid * 10 + (buf[i] - '0');
        } else {
          if (pid > 0) {
            kill(static_cast<pid_t>(-pid), SIGKILL);  // the group it leads, if any
            kill(static_cast<pid_t>(pid), SIGKILL);
          }
          pid = 0;
        }
      }
    }
    close(fd);
    int status = 0;
    pid_t r = 0;
    while ((r = waitpid(-1, &status, WNOHANG)) > 0) {
    }
    if (r < 0 && errno == ECHILD) return;  // no child left
    const timespec tick{0, 1'000'000};
    nanosleep(&tick, nullptr);
  }
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
// [keep, keep_end): the descriptors lockctl was started with (ascending), left open for it.
//
// The terminal (`tty`, lockctl's controlling terminal, or -1): whenever lockctl's process group
// has it (lockctl runs in the foreground, or is brought there later), the supervisor passes it on
// to the command's group and continues that group, as a shell's `fg` would, so the command can
// read it and takes its Ctrl-C; lockctl's group gets it back when the command ends. Without this
// a command that read the terminal stopped (SIGTTIN: its group was in the background) while
// lockctl renewed its lock for ever. A stop by the terminal (Ctrl-Z, SIGTTIN, SIGTTOU) while the
// command has it is undone at once: the job cannot be suspended while it holds the lock (lockctl,
// stopped with it, could renew nothing). A SIGSTOP is left alone (until a signal is passed on,
// which a SIGCONT follows). Without the terminal (in a
// pipeline), a stop by it is told once on stderr.
[[noreturn]] void Supervise(CommandWatch* w, pid_t lockctl, int tty, char* const* paths,
                            char* const* argv, char** sh_argv, char* const* envp, int64_t grace_ns,
                            bool sigchld_ignored, const int* keep, const int* keep_end) {
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);  // signals for the command come through lockctl
  // Nothing of lockctl's own but stdin, stdout and stderr: its RDMA device and rdma_cm
  // descriptors held open here would keep its connections (and their locks at lockd) alive after
  // lockctl died, and the command has no use for them either. The descriptors lockctl was
  // started with (`keep`, ascending: `3<file`) stay for the command, as flock(1) passes them
  // (all of them were closed until 2026-12-07; found by review).
  unsigned from = 3;
  for (const int* k = keep; k != keep_end; ++k) {
    const auto fd = static_cast<unsigned>(*k);
    if (fd > from) close_range(from, fd - 1, 0);
    if (fd >= from) from = fd + 1;
  }
  close_range(from, ~0U, 0);
  if (getppid() != lockctl) _exit(kExitInternal);
  // _Fork, not fork: no atfork handler (the SDK's take a mutex) runs in this copy of a threaded
  // process.
  const pid_t own_group = getpgrp();  // lockctl's
  // A process group of its own: a signal to lockctl's group (`timeout -s KILL`, a shell's kill
  // of the job) must not take the supervisor with lockctl, leaving the command running without
  // the lock (found by review). It sees lockctl die and ends the command.
  setpgid(0, 0);
  // The command's descendants that leave its process group come here when their parent dies
  // (KillDescendants). Named apart from lockctl, so that `pkill -x lockctl` and `killall lockctl`
  // do not take the supervisor too: it is what ends the command when lockctl dies. (`pkill
  // lockctl`, a pattern, still matches it.)
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  prctl(PR_SET_NAME, "lockctl-super");
  const pid_t supervisor = getpid();
  const pid_t cmd = _Fork();
  if (cmd < 0) _exit(kExitInternal);
  if (cmd == 0) {
    setpgid(0, 0);
    // The supervisor killed (SIGKILL, the OOM killer): the command dies with it. (lockctl also
    // kills the command's group then; this covers a supervisor killed before it said which.)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != supervisor) _exit(kExitInternal);
    // Before the signals are let through: a read of the terminal from a background group stops.
    // (A blocked SIGTTOU lets a background group take the terminal.)
    if (tty >= 0 && tcgetpgrp(tty) == own_group) tcsetpgrp(tty, getpid());
    // lockctl set SIGCHLD to its default for itself and the supervisor (ignored, the kernel
    // reaps children and waitpid never sees them); the command gets the disposition it was given.
    if (sigchld_ignored) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      sigaction(SIGCHLD, &ign, nullptr);
    }
    // lockctl's forwarding handlers, inherited: reset to the default before the signals are let
    // through, not at the exec. A signal lockctl passed on while this child was on its way (the
    // PATH search can take a while) is pending here; let through to the inherited handler, it
    // set a flag in this copy of lockctl and was lost, and the command ran to its end under the
    // lock (found by review, 2026-12-06). Now it ends the child, as it would have the command.
    // One that lockctl was started with ignored stays ignored.
    for (const int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
      struct sigaction cur {};
      if (sigaction(sig, nullptr, &cur) == 0 && cur.sa_handler != SIG_IGN &&
          cur.sa_handler != SIG_DFL) {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, nullptr);
      }
    }
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
    // As a shell says it: 127, not found; 126, found but it cannot be run.
    _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
  }
  setpgid(cmd, cmd);
  w->command.store(cmd);
  int status = 0;
  int64_t termed = 0;
  bool told_stopped = false;  // the message of a stop by the terminal without it was written
  for (;;) {
    // The command's exit or stop, and any other child's exit: descendants orphaned while the
    // command runs come to the supervisor (its subreaper) and are reaped here, not left as
    // zombies until the command ends.
    pid_t r = 0;
    bool exited = false;
    for (int other = 0;;) {
      int st = 0;
      const pid_t got = waitpid(-1, &st, WNOHANG | WUNTRACED);
      if (got == cmd) {
        status = st;
        r = cmd;
        if (!WIFSTOPPED(st)) exited = true;
        break;
      }
      if (got > 0 && ++other < 1000) continue;  // an orphan reaped (or stopped); maybe more
      if (got < 0 && errno != EINTR) {  // the command cannot be waited for: end it, and say so
        kill(-cmd, SIGKILL);
        KillDescendants();
        _exit(kExitInternal);
      }
      break;
    }
    if (exited) break;
    if (tty >= 0) {
      const pid_t fg = tcgetpgrp(tty);
      if (fg == own_group && tcsetpgrp(tty, cmd) == 0) {
        kill(-cmd, SIGCONT);  // as `fg`: whatever the terminal stopped in the background goes on
      } else if (r == cmd && fg == cmd) {
        const int sig = WSTOPSIG(status);
        if (sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU) {
          if (sig == SIGTSTP) {
            const char msg[] =
                "lockctl: the command holds a lock and cannot be suspended; continuing it\n";
            (void)!write(2, msg, sizeof(msg) - 1);
          }
          kill(-cmd, SIGCONT);
        }
      }
    } else if (r == cmd && WIFSTOPPED(status) && !told_stopped &&
               (WSTOPSIG(status) == SIGTTIN || WSTOPSIG(status) == SIGTTOU)) {
      // In a pipeline the terminal stays with lockctl's group (above): the command that read it
      // is stopped, and holds the lock stopped. Said once; a Ctrl-C to lockctl ends it (the
      // signal is passed on with a SIGCONT, below).
      told_stopped = true;
      const char msg[] =
          "lockctl: the command is stopped: it read or set the terminal, which lockctl does not "
          "give it in a pipeline; it holds the lock until it ends (Ctrl-C or kill lockctl)\n";
      (void)!write(2, msg, sizeof(msg) - 1);
    }
    const int64_t now = MonotonicNs();
    if (getppid() != lockctl) {  // lockctl died: nothing holds the lock for the command
      kill(-cmd, SIGKILL);
    }
    // A signal for the command is followed by SIGCONT, as systemd follows its stop signal: sent
    // to a stopped command (SIGSTOP, or stopped by the terminal), it stayed pending, and lockctl
    // held the lock for as long as the command stayed stopped (found by review, 2026-12-06).
    const auto signal_command = [cmd](int sig) {
      kill(-cmd, sig);
      kill(-cmd, SIGCONT);
    };
    // Each signal passed on, in signal-number order (as the kernel delivers pending ones).
    if (const unsigned sigs = w->forward.exchange(0); sigs != 0) {
      for (int sig = 1; sig < 32; ++sig) {
        if ((sigs & SignalBit(sig)) != 0) signal_command(sig);
      }
    }
    if (termed == 0 && now >= w->term_at_ns.load()) {
      w->stopped_for_loss.store(1);
      signal_command(SIGTERM);
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
  kill(-cmd, SIGKILL);  // whatever the command left running in its group ends with it,
  KillDescendants();    // and what left the group, before lockctl releases the lock
  if (tty >= 0 && tcgetpgrp(tty) == cmd) tcsetpgrp(tty, own_group);
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) _exit(128 + WTERMSIG(status));
  _exit(kExitInternal);
}

}  // namespace

int CmdAcquire(const Common& c, const std::string& name, bool shared, int64_t timeout_ms,
               int grace_ms, const std::vector<std::string>& cmd) {
  if (cmd.empty()) {
    std::cerr << "lockctl acquire: give the command after --, e.g. lockctl acquire NAME -- make\n";
    return kExitUsage;
  }
  if (name.empty()) {  // before connecting: the SDK refuses it, and lockd is not the problem
    std::cerr << "lockctl acquire: the lock name is empty\n";
    return kExitUsage;
  }
  int code = 0;
  const auto started = std::chrono::steady_clock::now();
  // Through etcd, the shard's primary is looked up before every connection attempt, and
  // connecting may take as long as the acquire's own timeout: a failover in progress costs time,
  // not an error (issue 16, finding 14). With no --timeout (-1) only the connect timeout: a shard
  // with no primary is then an error, not a wait for ever (lockctl.1 says so).
  std::unique_ptr<rdmalock::ClusterClient> cluster;
  std::unique_ptr<rdmalock::Client> single;
  rdmalock::Client* client = nullptr;
  if (!c.etcd.empty()) {
    // --timeout goes up to a year of milliseconds, more than an int holds.
    cluster = ConnectClusterOrDie(
        c, &code, std::chrono::milliseconds(std::min<int64_t>(timeout_ms, INT32_MAX)));
    if (!cluster) return code;
    // --shard names the shard the lock must be on, as with --cluster (TargetOf): checked
    // before connecting, and again by the map the session is looked up by (etcd's may change).
    if (!c.shard.empty()) {
      const rdmalock::ClusterMap map = cluster->map();
      if (NamedShard(c, map, EtcdSource(c)) == map.shards.size()) return kExitUsage;
    }
    std::string on;
    auto shard = cluster->ShardFor(name, &on);
    if (shard.ok() && !c.shard.empty() && on != c.shard) {
      std::cerr << "lockctl: lock '" << name << "' is on shard '" << on << "' by " << EtcdSource(c)
                << " (it changed), not on --shard '" << c.shard << "'\n";
      return kExitUsage;
    }
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
    if (ec == rdmalock::ErrorCode::kTimeout || ec == rdmalock::ErrorCode::kBusy) {
      return kExitTimeout;
    }
    return ec == rdmalock::ErrorCode::kInvalidArgument ? kExitUsage : kExitUnavailable;
  }
  // Shared with the callback, which the client's keeper may run after this function returned
  // (a loss found when `lock` is dropped on a way out is told later: client.h).
  const auto lost = std::make_shared<std::atomic<bool>>(false);
  lock->OnLost([lost](const rdmalock::Status&) { lost->store(true); });

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
  // The command is stopped once a renewal is a third of a lease overdue (they come every third;
  // against a cluster-mode lockd, a third of what its trust limit leaves), and killed before the
  // lease could end, whatever lockctl is doing then (lease_watch.h).
  const auto lease = client->lease();
  const auto steady_ns = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  LeaseWatch lease_watch(lease);
  const auto follow_lease = [&] {
    const LeaseWatch::Times t = lease_watch.Follow(lock->lease_expiry(), LeaseWatch::Clock::now());
    watch->term_at_ns.store(steady_ns(t.term_at));
    watch->kill_at_ns.store(steady_ns(t.kill_at));
  };
  follow_lease();
  // --grace: by default a quarter of the lease; the SIGKILL comes a tenth of a lease before the
  // lease ends at the latest, whatever --grace says.
  const int64_t grace_ns =
      grace_ms >= 0 ? int64_t{grace_ms} * 1'000'000
                    : std::chrono::duration_cast<std::chrono::nanoseconds>(lease).count() / 4;
  const pid_t lockctl_pid = getpid();
  // lockctl's controlling terminal, when its stdin is it (tcgetpgrp answers for the controlling
  // terminal only) and neither its stdout nor its stderr is a pipe or socket: lockctl is then a job
  // of its own, as a shell runs a command typed at it, its output redirected or not (`... -- cmd >
  // log`). In a pipeline (`lockctl acquire ... | less`) or a script's background (`&`, stdin
  // /dev/null) other processes share lockctl's process group, and handing the terminal to the
  // command's group would stop them (SIGTTIN) when they read it, and lockctl with them, since the
  // signal goes to the whole group (found by the diff review). Until 2026-12-06 stdout had to be
  // the terminal: with `> log` the command stayed in the background, and a read of the terminal (a
  // prompt, sudo's password) stopped it for ever, holding the lock (found by review).
  const auto is_pipe = [](int fd) {
    struct stat st {};
    return fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
  };
  // stderr too: in `lockctl ... 2>&1 > log | less` stdout is a file, and less shares the group.
  const int tty = tcgetpgrp(0) >= 0 && !is_pipe(1) && !is_pipe(2) ? 0 : -1;

  // Started with SIGCHLD ignored (a parent's SIG_IGN survives exec), the kernel would reap the
  // supervisor and the command, and waitpid would never see them exit: lockctl renewed the lock
  // for ever after the command was gone (found by review, 2026-12-06). The default for lockctl
  // and the supervisor; the command gets back what it was given.
  struct sigaction dfl {
  }, was{};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &dfl, &was);
  const bool sigchld_ignored = was.sa_handler == SIG_IGN;
  // Passed on to the command, which decides; lockctl releases the lock when it has exited. A
  // SIGHUP (a closed ssh session, a terminal's hangup) or SIGQUIT killed lockctl until 2026-12-06:
  // the command got SIGKILL, and the lock waited for lockd's fencing. One that lockctl was started
  // with ignored (nohup, a script's background job) stays ignored, for lockctl and the command,
  // as a shell leaves it. Set before the fork: from then on the command may be running. (The
  // supervisor blocks every signal first thing; the command's child sets these back to default
  // before it lets signals through.)
  for (const int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
    struct sigaction forward {
    }, before{};
    if (sigaction(sig, nullptr, &before) == 0 && before.sa_handler == SIG_IGN) continue;
    forward.sa_handler = [](int s) { g_forward_signals.fetch_or(SignalBit(s)); };
    sigemptyset(&forward.sa_mask);
    sigaction(sig, &forward, nullptr);
  }
  // A subreaper above the supervisor: if the supervisor is killed, the command and whatever it
  // started outside its process group come to lockctl, which kills them and waits for them
  // before the release (found by review, 2026-12-07: they went to init and ran on after it). Set
  // before the fork, so that the supervisor's and the command's processes inherit the search for
  // a subreaper.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("lockctl: fork");
    return kExitInternal;
  }
  if (child == 0) {
    Supervise(watch, lockctl_pid, tty, paths.data(), argv.data(), sh_argv.data(), envp.data(),
              grace_ns, sigchld_ignored, c.inherited_fds.data(),
              c.inherited_fds.data() + c.inherited_fds.size());
  }
  // While the command has the terminal lockctl is in the background: what it writes (a lost
  // lock) must not stop it (SIGTTOU, with the terminal's tostop set). Set after the fork: the
  // command must not inherit it.
  signal(SIGTTOU, SIG_IGN);

  int status = 0;
  bool told = false;
  for (;;) {
    const pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child) break;
    if (r < 0 && errno != EINTR) {
      std::perror("lockctl: waitpid");
      return kExitInternal;
    }
    if (const unsigned s = g_forward_signals.exchange(0); s != 0) watch->forward.fetch_or(s);
    const bool is_lost = lost->load() || lock->state() == rdmalock::LockState::kLost;
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
  // The supervisor was killed (it blocks every other signal): nothing ends the command's group
  // when the command ends, so it is ended here, before the release, and what the supervisor
  // left (the command, and what the command started in a session of its own) is now lockctl's
  // (a subreaper): killed and waited for, as the supervisor would have.
  if (WIFSIGNALED(status)) {
    if (const int cmd_pid = watch->command.load(); cmd_pid > 0) kill(-cmd_pid, SIGKILL);
    std::cerr << "lockctl: the supervisor of the command died (signal " << WTERMSIG(status)
              << "); the command was killed before the release\n";
  }
  // Whatever came to lockctl (a subreaper): what the killed supervisor left, or what its own
  // bounded KillDescendants gave up on. Returns at once when lockctl has no child left.
  KillDescendants();
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

}  // namespace lockctl
