// lockd: the rdmalock lock server daemon.
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <thread>

#include "common/auth/auth.h"
#include "common/cli_decimal.h"
#include "common/duration.h"
#include "common/sync/mutex.h"
#include "rdmalock/proto/layout.h"
#include "server/campaign.h"
#include "server/config.h"
#include "server/lockd.h"

namespace {

using rdmalock::lockd::Config;

int Fail(const rdmalock::Status& st) {
  spdlog::critical("{}", st.ToString());
  (void)sd_notifyf(0, "STATUS=failed: %s", st.message().c_str());
  return 1;
}

uint64_t MonotonicUsec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

// What lockd last told systemd it is doing (STATUS=), so that a reload, which must say
// RELOADING=1 and then READY=1, can say it again rather than claim something else. Threading: the
// main thread and cluster mode's campaign thread both set it; mutex_ guards status_.
class Notifier {
 public:
  // Sends `fields` (e.g. "READY=1", or "" for none) with STATUS=`status`, and keeps `status`.
  void Send(const std::string& fields, std::string status) EXCLUDES(mutex_) {
    rdmalock::MutexLock lock(&mutex_);
    if (stopping_) return;
    status_ = std::move(status);
    (void)sd_notifyf(0, "%s%sSTATUS=%s", fields.c_str(), fields.empty() ? "" : "\n",
                     status_.c_str());
  }
  // RELOADING=1 (with the time systemd asks for), unless stopping: then false, and the reload
  // is not done (a SIGHUP pending as the campaign thread failed came after its STATUS=failed).
  bool Reloading(uint64_t monotonic_usec) EXCLUDES(mutex_) {
    rdmalock::MutexLock lock(&mutex_);
    if (stopping_) return false;
    (void)sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu",
                     static_cast<unsigned long long>(monotonic_usec));
    return true;
  }
  // Sends `fields` with the last status again.
  void Resend(const std::string& fields) EXCLUDES(mutex_) {
    rdmalock::MutexLock lock(&mutex_);
    if (stopping_) return;
    (void)sd_notifyf(0, "%s\nSTATUS=%s", fields.c_str(), status_.c_str());
  }
  // STOPPING=1 with STATUS=`status` (a failure's status, when Failed came first, stays), and no
  // Send or Resend after it: cluster mode's campaign thread, still finishing a term's start,
  // would otherwise say "primary" of a lockd that is stopping (found by review, 2026-12-06).
  // (A standalone lockd whose event loop fails after it reports that with Fail.)
  void Stop(const std::string& status) EXCLUDES(mutex_) {
    rdmalock::MutexLock lock(&mutex_);
    stopping_ = true;
    if (failed_) {
      (void)sd_notify(0, "STOPPING=1");
    } else {
      (void)sd_notifyf(0, "STOPPING=1\nSTATUS=%s", status.c_str());
    }
  }
  // Cluster mode's campaign thread failed (it logged why): STATUS=failed, which no later
  // notification replaces (a reload's READY=1 or the stop's status).
  void Failed(const std::string& message) EXCLUDES(mutex_) {
    rdmalock::MutexLock lock(&mutex_);
    stopping_ = true;
    failed_ = true;
    (void)sd_notifyf(0, "STATUS=failed: %s", message.c_str());
  }

 private:
  rdmalock::Mutex mutex_;
  std::string status_ GUARDED_BY(mutex_);
  bool stopping_ GUARDED_BY(mutex_) = false;  // Stop or Failed came: nothing more is sent
  bool failed_ GUARDED_BY(mutex_) = false;    // Failed came: its status stays
};

// What a reload needs: the file, the running configuration (main thread's), the command line's
// overrides (applied to the file's keys as at start), and where a rotated key goes.
struct ReloadContext {
  std::string path;                               // "" : started without --config
  Config* running = nullptr;                      // what lockd runs with now
  std::function<void(Config*)> apply_overrides;   // the command line's keys, over the file's
  std::function<void(std::string)> set_auth_key;  // the serving Server's SetAuthKey, or empty
  std::string* auth_key = nullptr;                // the key lockd checks now ("" : none)
  Notifier* notifier = nullptr;
};

// SIGHUP (systemctl reload): re-reads the config file, with the command line's overrides applied
// over it as at start. log_level applies at once, and so does a changed shared key (the key file
// rewritten in place, or auth_key_file naming another file): handshakes from then on must prove
// the new key, admitted sessions are not affected. Any other key whose value a restart would
// change is named as needing one; a key the command line overrides is not (a restart would keep
// the override). A file that no longer parses or validates, or a key file that cannot be read,
// changes nothing. Tells systemd RELOADING=1 first, then READY=1 with the status lockd had.
void Reload(const ReloadContext& ctx) {
  if (!ctx.notifier->Reloading(MonotonicUsec())) return;  // stopping: no RELOADING=1, no READY=1
  Config* running = ctx.running;
  if (ctx.path.empty()) {
    spdlog::info("reload: no config file (started without --config); nothing to reload");
  } else if (auto loaded = rdmalock::lockd::LoadConfig(ctx.path, ctx.apply_overrides);
             !loaded.ok()) {
    spdlog::error("reload: {}; keeping the running configuration", loaded.status().message());
  } else {
    const Config& fresh = *loaded;
    std::string key;
    rdmalock::Status st;
    if (!fresh.auth_key_file.empty()) {
      auto k = rdmalock::auth::LoadKeyFile(fresh.auth_key_file, true);
      if (k.ok())
        key = *k;
      else
        st = k.status();
    }
    if (!st.ok()) {
      spdlog::error("reload: invalid configuration in {}: {}; keeping the running configuration",
                    ctx.path, st.message());
    } else {
      if (fresh.log_level != running->log_level) {
        spdlog::set_level(spdlog::level::from_str(fresh.log_level));
        spdlog::info("reload: log_level {} -> {}", running->log_level, fresh.log_level);
        running->log_level = fresh.log_level;
      }
      // The key: re-read even when the path is the same (a key rotated in place). Turning
      // authentication on or off takes a restart (clients must be told to expect it).
      if (!key.empty() && !ctx.auth_key->empty() && key != *ctx.auth_key) {
        running->auth_key_file = fresh.auth_key_file;  // before set_auth_key, which may read it
        if (ctx.set_auth_key) ctx.set_auth_key(key);
        spdlog::warn(
            "reload: new shared key from {}: handshakes from now on must prove it "
            "(sessions already admitted are not affected)",
            fresh.auth_key_file);
        *ctx.auth_key = key;
      }
      std::string restart;
      for (const auto& k : rdmalock::lockd::ChangedKeys(*running, fresh)) {
        if (k == "log_level") continue;
        restart += (restart.empty() ? "" : ", ") + k;
      }
      if (restart.empty()) {
        spdlog::info("reload: {} re-read; nothing else changed", ctx.path);
      } else {
        spdlog::warn("reload: {} changed {}: restart lockd to apply (running with the old values)",
                     ctx.path, restart);
      }
    }
  }
  ctx.notifier->Resend("READY=1");
}

int64_t MonoNs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Cluster mode: campaigns for the shard's primary in etcd; serves while primary (after the
// takeover grace); stops serving, fencing every client, a margin before its etcd lease could
// expire; campaigns again. The main thread handles signals meanwhile.
int RunCluster(const Config& config, sigset_t signals, ReloadContext reload) {
  using rdmalock::lockd::Campaign;
  using rdmalock::lockd::Server;
  auto campaign = Campaign::Create(config);
  if (!campaign.ok()) return Fail(campaign.status());
  std::atomic<bool> stop{false};
  int rc = 0;
  Config running = config;
  Notifier& notifier = *reload.notifier;
  // The serving Server while this lockd is primary (a reload's new key goes to it), else null.
  std::atomic<Server*> live{nullptr};
  // Held while using `live` from the main thread, while clearing it, and for key_file and
  // key_in_force.
  rdmalock::Mutex live_mu;
  // The key in force and the file it was read from, the start's or the last reload's: each
  // term serves that key (found by review, 2026-12-06: a term made from the start's
  // configuration went back to the old key; one that read the file again exited at the takeover
  // when the file had become unreadable, and served a key written without a reload).
  std::string key_file = config.auth_key_file;
  std::string key_in_force = *reload.auth_key;  // "" : authentication off; under live_mu
  reload.running = &running;
  reload.set_auth_key = [&](std::string key) {
    rdmalock::MutexLock lock(&live_mu);
    key_file = running.auth_key_file;
    key_in_force = key;
    if (Server* s = live.load(); s != nullptr) s->SetAuthKey(std::move(key));
  };
  // Before the campaign thread starts: sent after it, this could follow its "primary" status.
  notifier.Send("READY=1", "campaigning for shard " + config.shard);
  std::thread worker([&] {
    auto fatal = [&](const rdmalock::Status& st) {
      spdlog::critical("{}", st.ToString());
      notifier.Failed(st.message());
      rc = 1;
      stop.store(true);
      kill(getpid(), SIGTERM);  // wake main
    };
    while (!stop.load()) {
      auto epoch = (*campaign)->Win(stop);
      if (!epoch.ok()) continue;  // stopped
      Config c = config;
      c.restart_grace_ms = (*campaign)->TakeoverGraceMs();
      std::string key;
      {
        rdmalock::MutexLock lock(&live_mu);
        c.auth_key_file = key_file;
        key = key_in_force;
      }
      spdlog::info(
          "primary of shard {} (epoch {}), advertised as {}; serving after the takeover grace of "
          "{} ms (lease {} ms + etcd lease {} s + liveness timeout {} ms) [won_mono_ns={}]",
          config.shard, *epoch, config.Advertised(), c.restart_grace_ms, config.lease_ms,
          (*campaign)->ttl_s(), config.LivenessTimeoutMs(),
          MonoNs(std::chrono::steady_clock::now()));
      // The lease is kept by a thread of its own from here on: creating the server and probing
      // its loopback can take a while, and the deadline does not wait. When the lease is lost,
      // that thread stops the server itself, so the fence does not wait for this one either.
      std::atomic<bool> lost{false}, done{false};
      std::thread holder([&] {
        while (!done.load() && !stop.load()) {
          if (!(*campaign)->Hold(done)) {
            lost.store(true);
            if (Server* s = live.load(); s != nullptr) s->RequestStop();
            return;
          }
        }
      });
      auto server = Server::Create(c, *epoch, /*unclean_start=*/true, std::move(key));
      if (!server.ok()) {
        done.store(true);
        holder.join();
        (*campaign)->Resign();
        fatal(server.status());
        return;
      }
      rdmalock::Status loop_status;
      std::atomic<bool> loop_done{false};
      std::thread loop([&] {
        loop_status = (*server)->Run();
        loop_done.store(true);
      });
      {
        rdmalock::MutexLock lock(&live_mu);
        live.store(server->get());
        // A reload while the server was being made found none to give its key to.
        if (!key_in_force.empty()) (*server)->SetAuthKey(key_in_force);
      }
      if (lost.load()) (*server)->RequestStop();  // lost before `live` was set
      if (auto st = (*server)->ProbeLoopback(std::chrono::seconds(10)); !st.ok() && !lost.load()) {
        (*server)->RequestStop();
        loop.join();
        done.store(true);
        holder.join();
        {
          rdmalock::MutexLock lock(&live_mu);
          live.store(nullptr);
        }
        (*campaign)->Resign();
        fatal(st);
        return;
      }
      notifier.Send("", "primary of shard " + config.shard + ", epoch " + std::to_string(*epoch));
      // The fence point is watched here too: the holder may be stuck in a request to etcd.
      bool deadline_hit = false;
      while (!stop.load() && !loop_done.load() && !lost.load()) {
        (*server)->SetAliveUntil((*campaign)->fence_at());
        if (std::chrono::steady_clock::now() >= (*campaign)->fence_at()) {
          deadline_hit = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      (*server)->RequestStop();
      loop.join();
      const auto fenced = (*server)->fenced_at();
      done.store(true);
      holder.join();
      {
        rdmalock::MutexLock lock(&live_mu);
        live.store(nullptr);
      }
      server->reset();
      if (lost.load() || deadline_hit) {
        const auto deadline = (*campaign)->deadline();
        spdlog::warn(
            "no longer primary of shard {}: {}; stopped serving (every client's QP in the error "
            "state, or destroyed) {} ms before the lease deadline [fenced_mono_ns={} "
            "deadline_mono_ns={}]",
            config.shard,
            lost.load() ? (*campaign)->why_lost()
                        : std::string("the etcd lease was not refreshed in time"),
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - fenced).count(),
            MonoNs(fenced), MonoNs(deadline));
        notifier.Send("", "standby for shard " + config.shard + " (lost the primary)");
        continue;
      }
      (*campaign)->Resign();
      if (!loop_status.ok()) fatal(loop_status);
      return;
    }
  });
  while (!stop.load()) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      Reload(reload);
      continue;
    }
    if (!stop.load()) {
      spdlog::info("received {}, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    }
    break;
  }
  notifier.Stop("stopping");  // (after a fatal error on the campaign thread, its status stays)
  stop.store(true);
  worker.join();
  // A term lost just as we stopped went round the worker's loop no more: its lease, with the
  // primary and members keys, is revoked here rather than left to expire (found by review,
  // 2026-12-06; Resign does nothing when no lease is held).
  (*campaign)->Resign();
  if (rc == 0) spdlog::info("stopped cleanly");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "lockd: the rdmalock lock server. Serves a table of RDMA lock words to librdmalock "
      "clients over rdma_cm."};
  std::string config_path;
  bool check_config = false, print_config = false;
  std::string log_level, address, state_dir;
  int64_t port = -1, lock_count = -1, lease_ms = -1, max_clients = -1, hb_interval = -1,
          hb_timeout = -1, grace = -1, max_connects = -1, stall_factor = -1, liveness = -1;
  // The time flags' text ("2s", "500ms", or a plain number in the flag's unit), converted after
  // parsing (right after CLI11_PARSE) so that a bad value is one line naming the flag.
  std::string lease_text, hb_interval_text, hb_timeout_text, grace_text, etcd_ttl_text,
      liveness_text;
  std::string admin_socket, metrics_address, auth_key_file, memory_windows;
  std::vector<std::string> allow_from;
  int64_t max_conns_per_session = -1;
  std::vector<std::string> etcd_endpoints;
  std::string cluster, shard, advertise, etcd_ca, etcd_cert, etcd_key;
  int64_t etcd_ttl = -1;
  app.add_option("-c,--config", config_path, "YAML config file (default: none, all defaults)");
  app.add_flag("--check-config", check_config, "validate the config and exit (0 if valid)");
  app.add_flag("--print-config", print_config, "print the effective config and exit");
  app.add_option("--log-level", log_level, "override log_level (trace..off)");
  app.add_option("--address", address, "override address");
  app.add_option("--port", port, "override port")
      ->transform(rdmalock::Decimal())
      ->check(CLI::Range(1, 65535));
  // CLI::PositiveNumber's refusal printed its range as 0 to DBL_MAX (309 digits).
  app.add_option("--lock-count", lock_count, "override lock_count")
      ->transform(rdmalock::Decimal())
      ->check(CLI::Range(static_cast<int64_t>(rdmalock::proto::kMinLockCount),
                         static_cast<int64_t>(rdmalock::proto::kMaxLockCount)));
  auto* lease_opt = app.add_option("--lease-ms", lease_text, "override lease_ms (2s, or ms)")
                        ->type_name("DURATION");
  app.add_option(
         "--max-clients", max_clients,
         "override max_clients (1 to " + std::to_string(rdmalock::lockd::kMaxClientsLimit) + ")")
      ->transform(rdmalock::Decimal());
  app.add_option("--stall-factor", stall_factor,
                 "override stall_factor (F: waiters recover a lock after F x lease_ms without "
                 "progress; 2 to 100)")
      ->transform(rdmalock::Decimal())
      ->check(CLI::Range(2, 100));
  app.add_option("--max-connects-per-second", max_connects,
                 "override max_connects_per_second (0: no limit)")
      ->transform(rdmalock::Decimal())
      ->check(CLI::Range(0, 1000000));
  app.add_option("--state-dir", state_dir, "override state_dir (where the epoch persists)");
  auto* hb_interval_opt = app.add_option("--heartbeat-interval-ms", hb_interval_text,
                                         "override heartbeat_interval_ms (200ms, or ms)")
                              ->type_name("DURATION");
  auto* hb_timeout_opt = app.add_option("--heartbeat-timeout-ms", hb_timeout_text,
                                        "override heartbeat_timeout_ms (1s, or ms)")
                             ->type_name("DURATION");
  auto* grace_opt = app.add_option("--restart-grace-ms", grace_text,
                                   "override restart_grace_ms (10s, or ms; 0: one lease)")
                        ->type_name("DURATION");
  auto* liveness_opt =
      app.add_option("--liveness-timeout-ms", liveness_text,
                     "override liveness_timeout_ms (cluster mode's T; 0: twice the heartbeat "
                     "timeout)")
          ->type_name("DURATION");
  app.add_option("--admin-socket", admin_socket, "override admin_socket (\"\" disables)");
  app.add_option("--metrics-address", metrics_address,
                 "override metrics_address, HOST:PORT (\"\" serves no metrics)");
  app.add_option("--auth-key-file", auth_key_file,
                 "override auth_key_file (the shared key clients must prove; \"\" admits any)");
  app.add_option("--allow-from", allow_from,
                 "override allow_from: address ranges clients may connect from (repeatable)");
  app.add_option("--memory-windows", memory_windows,
                 "override memory_windows (true: per-connection memory windows)")
      ->check(CLI::IsMember({"true", "false"}));
  app.add_option("--max-connections-per-session", max_conns_per_session,
                 "override max_connections_per_session")
      ->transform(rdmalock::Decimal())
      ->check(CLI::Range(1, 65536));
  app.add_option("--etcd", etcd_endpoints,
                 "override etcd_endpoints: cluster mode, http://HOST:PORT (repeatable)");
  app.add_option("--cluster", cluster, "override cluster (the etcd key prefix)");
  app.add_option("--shard", shard, "override shard (this lockd's shard in cluster mode)");
  app.add_option("--advertise-address", advertise,
                 "override advertise_address (HOST:PORT clients are told to use)");
  app.add_option("--etcd-ca-file", etcd_ca, "override etcd_ca_file (CA of etcd's certificate)");
  app.add_option("--etcd-cert-file", etcd_cert,
                 "override etcd_cert_file (client certificate for etcd)");
  app.add_option("--etcd-key-file", etcd_key, "override etcd_key_file (its key)");
  auto* etcd_ttl_opt = app.add_option("--etcd-lease-ttl-s", etcd_ttl_text,
                                      "override etcd_lease_ttl_s (2s to 10m; a plain number is "
                                      "seconds)")
                           ->type_name("DURATION");
  app.set_version_flag("--version", "lockd " RDMALOCK_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that exit 0; any other refusal is an invalid
    // configuration, exit 2 as lockd(8) says (CLI11's own codes were 105 and 109).
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  {
    // Each time flag into the unit it has always had, with the range of its lockd.yaml key
    // (config.h; Validate then checks how they relate). Until stop 27 the flags took anything
    // above 0: --lease-ms 2562047h was "configuration OK", and lease_ms x 10^6 ns overflows. A
    // bad value is one line and exit 2, as for an invalid configuration file.
    using rdmalock::DurationUnit;
    namespace cfg = rdmalock::lockd;
    struct TimeFlag {
      CLI::Option* opt;
      const std::string& text;
      DurationUnit unit;
      cfg::TimeRange range;
      int64_t* out;
    };
    const TimeFlag flags[] = {
        {lease_opt, lease_text, DurationUnit::kMilliseconds, cfg::kLeaseMsRange, &lease_ms},
        {hb_interval_opt, hb_interval_text, DurationUnit::kMilliseconds,
         cfg::kHeartbeatIntervalMsRange, &hb_interval},
        {hb_timeout_opt, hb_timeout_text, DurationUnit::kMilliseconds,
         cfg::kHeartbeatTimeoutMsRange, &hb_timeout},
        {grace_opt, grace_text, DurationUnit::kMilliseconds, cfg::kRestartGraceMsRange, &grace},
        {etcd_ttl_opt, etcd_ttl_text, DurationUnit::kSeconds, cfg::kEtcdLeaseTtlSRange, &etcd_ttl},
        {liveness_opt, liveness_text, DurationUnit::kMilliseconds, cfg::kLivenessTimeoutMsRange,
         &liveness},
    };
    for (const TimeFlag& f : flags) {
      if (f.opt->count() == 0) continue;
      auto v = rdmalock::ParseDurationIn(f.text, f.unit, f.range.lo, f.range.hi);
      if (!v.ok()) {
        std::cerr << "lockd: " << f.opt->get_name() << ": " << v.status().message() << "\n";
        return 2;
      }
      *f.out = *v;
    }
  }
  // --max-clients has the range of max_clients, checked on the 64-bit value: it was cast to 32
  // bits first, and 4294968319 (2^32 + 1023) ran as 1023, "configuration OK" (found by review).
  if (app.count("--max-clients") > 0 &&
      (max_clients < 1 || max_clients > int64_t{rdmalock::lockd::kMaxClientsLimit})) {
    std::cerr << "lockd: --max-clients: " << max_clients << " is out of range: between 1 and "
              << rdmalock::lockd::kMaxClientsLimit << "\n";
    return 2;
  }

  auto logger = spdlog::stderr_color_mt("lockd");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  // The command line's keys, over the file's: at start, and again at each reload.
  auto apply_overrides = [&](Config* cfg) {
    if (!log_level.empty()) cfg->log_level = log_level;
    if (!address.empty()) cfg->address = address;
    if (port > 0) cfg->port = static_cast<uint16_t>(port);
    if (lock_count > 0) cfg->lock_count = static_cast<uint64_t>(lock_count);
    if (lease_ms > 0) cfg->lease_ms = static_cast<uint64_t>(lease_ms);
    if (max_clients > 0) cfg->max_clients = static_cast<uint32_t>(max_clients);
    if (max_connects >= 0) cfg->max_connects_per_second = static_cast<uint32_t>(max_connects);
    if (app.count("--state-dir") > 0) cfg->state_dir = state_dir;
    if (hb_interval > 0) cfg->heartbeat_interval_ms = static_cast<uint64_t>(hb_interval);
    if (hb_timeout > 0) cfg->heartbeat_timeout_ms = static_cast<uint64_t>(hb_timeout);
    if (grace >= 0) cfg->restart_grace_ms = static_cast<uint64_t>(grace);
    if (app.count("--admin-socket") > 0) cfg->admin_socket = admin_socket;
    if (app.count("--metrics-address") > 0) cfg->metrics_address = metrics_address;
    if (app.count("--auth-key-file") > 0) cfg->auth_key_file = auth_key_file;
    if (app.count("--allow-from") > 0) cfg->allow_from = allow_from;
    if (!memory_windows.empty()) cfg->memory_windows = memory_windows == "true";
    if (max_conns_per_session > 0) {
      cfg->max_connections_per_session = static_cast<uint32_t>(max_conns_per_session);
    }
    if (!etcd_endpoints.empty()) cfg->etcd_endpoints = etcd_endpoints;
    if (!cluster.empty()) cfg->cluster = cluster;
    if (!shard.empty()) cfg->shard = shard;
    if (app.count("--advertise-address") > 0) cfg->advertise_address = advertise;
    if (etcd_ttl > 0) cfg->etcd_lease_ttl_s = static_cast<uint32_t>(etcd_ttl);
    if (stall_factor > 0) cfg->stall_factor = static_cast<uint32_t>(stall_factor);
    if (liveness >= 0) cfg->liveness_timeout_ms = static_cast<uint64_t>(liveness);
    if (app.count("--etcd-ca-file") > 0) cfg->etcd_ca_file = etcd_ca;
    if (app.count("--etcd-cert-file") > 0) cfg->etcd_cert_file = etcd_cert;
    if (app.count("--etcd-key-file") > 0) cfg->etcd_key_file = etcd_key;
  };
  // The file's keys with the command line's over them, validated as one (LoadConfig).
  Config config;
  if (!config_path.empty()) {
    auto loaded = rdmalock::lockd::LoadConfig(config_path, apply_overrides);
    if (!loaded.ok()) {
      std::cerr << "lockd: " << loaded.status().message() << "\n";
      return 2;
    }
    config = *loaded;
  } else {
    apply_overrides(&config);
    if (auto st = rdmalock::lockd::Validate(config); !st.ok()) {
      std::cerr << "lockd: invalid configuration: " << st.message() << "\n";
      return 2;
    }
  }
  std::string auth_key;                 // the key lockd checks ("" : none); a reload may rotate it
  if (!config.auth_key_file.empty()) {  // its mode and length, before anything starts
    auto key = rdmalock::auth::LoadKeyFile(config.auth_key_file, true);
    if (!key.ok()) {
      std::cerr << "lockd: invalid configuration: " << key.status().message() << "\n";
      return 2;
    }
    auth_key = *key;
  }
  if (check_config) {
    std::cout << "configuration OK\n";
    return 0;
  }
  if (print_config) {
    std::cout << config.ToYaml();
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));

  // A peer that closes its socket before lockd's reply (the admin socket, a metrics scrape, etcd)
  // must cost lockd that write only: EPIPE, never SIGPIPE. The admin socket sends with
  // MSG_NOSIGNAL too; this covers every other socket the libraries write to.
  signal(SIGPIPE, SIG_IGN);
  // Signals go to the main thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      lim.rlim_cur < config.lock_count * 16 + (1 << 20)) {
    spdlog::warn(
        "RLIMIT_MEMLOCK is {} bytes; registering the lock table may fail (set "
        "LimitMEMLOCK=infinity or ulimit -l unlimited)",
        lim.rlim_cur);
  }

  Notifier notifier;
  ReloadContext reload;
  reload.path = config_path;
  reload.running = &config;
  reload.apply_overrides = apply_overrides;
  reload.auth_key = &auth_key;
  reload.notifier = &notifier;
  if (config.cluster_mode()) {
    spdlog::info("cluster mode: shard {} of cluster {}, etcd at {}", config.shard, config.cluster,
                 fmt::join(config.etcd_endpoints, ", "));
    return RunCluster(config, signals, reload);
  }

  // Before the epoch and the running mark: both are this lockd's alone.
  auto dir_lock = rdmalock::lockd::StateDirLock::Acquire(config.state_dir);
  if (!dir_lock.ok()) return Fail(dir_lock.status());
  // The epoch is stored once the server is made, before its loop serves anyone: a start that
  // fails before then uses none up (state_dir.h).
  auto epoch = rdmalock::lockd::NextEpoch(config.state_dir);
  if (!epoch.ok()) return Fail(epoch.status());
  auto unclean = rdmalock::lockd::MarkRunning(config.state_dir);
  if (!unclean.ok()) return Fail(unclean.status());
  // A start that fails before serving anyone owes the next start no grace of its own: it takes
  // its mark back unless the last run's (an unclean stop) was there, whose grace is still owed.
  // Left, every failed start under Restart=on-failure made the next one refuse clients for a
  // lease (found by review, 2026-12-06).
  auto failed_start = [&](const rdmalock::Status& st) {
    if (!*unclean) rdmalock::lockd::MarkStoppedCleanly(config.state_dir);
    return Fail(st);
  };
  // The key read above, not the file again (it may have changed in between).
  auto server = rdmalock::lockd::Server::Create(config, *epoch, *unclean, auth_key);
  if (!server.ok()) return failed_start(server.status());
  if (auto st = rdmalock::lockd::StoreEpoch(config.state_dir, *epoch); !st.ok()) {
    return failed_start(st);
  }

  rdmalock::Status loop_status;
  std::atomic<bool> stopping{false};
  std::thread loop([&] {
    loop_status = (*server)->Run();
    if (!stopping.load()) kill(getpid(), SIGTERM);  // the loop ended by itself: wake main
  });
  if (auto st = (*server)->ProbeLoopback(std::chrono::seconds(10)); !st.ok()) {
    spdlog::critical("{}", st.ToString());
    stopping.store(true);
    (*server)->RequestStop();
    loop.join();
    // The loop served while the probe waited: a client it let in is owed the grace.
    if (!*unclean && !(*server)->stopped_with_clients()) {
      rdmalock::lockd::MarkStoppedCleanly(config.state_dir);
    }
    return 1;
  }
  spdlog::info("ready");
  // systemd (Type=notify): ready once the regions are registered, lockd listens and its loopback
  // works. A no-op when NOTIFY_SOCKET is unset.
  notifier.Send("READY=1", "serving " + std::to_string(config.lock_count) + " locks on " +
                               config.address + ":" + std::to_string(config.port) + " (epoch " +
                               std::to_string(*epoch) + ")");
  reload.set_auth_key = [&](std::string key) { (*server)->SetAuthKey(std::move(key)); };

  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      Reload(reload);
      continue;
    }
    spdlog::info("received {}, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    break;
  }
  notifier.Stop("stopping: disconnecting clients");
  stopping.store(true);
  (*server)->RequestStop();
  loop.join();
  const bool had_clients = (*server)->stopped_with_clients();
  server->reset();
  if (!loop_status.ok()) return Fail(loop_status);
  if (had_clients) {
    spdlog::info(
        "clients were connected, or fenced less than a lease ago: the next start waits out the "
        "restart grace period");
  } else {
    rdmalock::lockd::MarkStoppedCleanly(config.state_dir);
  }
  spdlog::info("stopped cleanly");
  return 0;
}
