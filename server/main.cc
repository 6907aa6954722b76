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
#include <iostream>
#include <thread>

#include "auth.h"
#include "campaign.h"
#include "config.h"
#include "lockd.h"

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

// SIGHUP (systemctl reload): re-reads the config file. log_level applies at once; any other
// changed key is named as needing a restart. A file that no longer parses or validates changes
// nothing. Tells systemd RELOADING=1 first and READY=1 when done (sd_notify is a no-op outside
// systemd).
void Reload(const std::string& path, Config* running, const Config& overrides_applied,
            const std::string& log_level_override) {
  (void)sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu",
                   static_cast<unsigned long long>(MonotonicUsec()));
  if (path.empty()) {
    spdlog::info("reload: no config file (started without --config); nothing to reload");
  } else if (auto loaded = rdmalock::lockd::LoadConfig(path); !loaded.ok()) {
    spdlog::error("reload: {}; keeping the running configuration", loaded.status().message());
  } else if (auto st = rdmalock::lockd::Validate(*loaded); !st.ok()) {
    spdlog::error("reload: invalid configuration in {}: {}; keeping the running configuration",
                  path, st.message());
  } else {
    Config fresh = *loaded;
    if (!log_level_override.empty()) fresh.log_level = log_level_override;
    if (fresh.log_level != running->log_level) {
      spdlog::set_level(spdlog::level::from_str(fresh.log_level));
      spdlog::info("reload: log_level {} -> {}", running->log_level, fresh.log_level);
      running->log_level = fresh.log_level;
    }
    // Keys given on the command line override the file; compare the file against what the file
    // said at start, so that an override is not reported as a change.
    std::string restart;
    for (const auto& key : rdmalock::lockd::ChangedKeys(overrides_applied, fresh)) {
      if (key == "log_level") continue;
      restart += (restart.empty() ? "" : ", ") + key;
    }
    if (restart.empty()) {
      spdlog::info("reload: {} re-read; nothing else changed", path);
    } else {
      spdlog::warn("reload: {} changed {}: restart lockd to apply (running with the old values)",
                   path, restart);
    }
  }
  (void)sd_notify(0, "READY=1\nSTATUS=serving");
}

int64_t MonoNs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Cluster mode: campaigns for the shard's primary in etcd; serves while primary (after the
// takeover grace); stops serving, fencing every client, a margin before its etcd lease could
// expire; campaigns again. The main thread handles signals meanwhile.
int RunCluster(const Config& config, sigset_t signals, const std::string& config_path,
               const Config& from_file, const std::string& log_level) {
  using rdmalock::lockd::Campaign;
  using rdmalock::lockd::Server;
  auto campaign = Campaign::Create(config);
  if (!campaign.ok()) return Fail(campaign.status());
  std::atomic<bool> stop{false};
  int rc = 0;
  Config running = config;
  std::thread worker([&] {
    auto fatal = [&](const rdmalock::Status& st) {
      rc = Fail(st);
      stop.store(true);
      kill(getpid(), SIGTERM);  // wake main
    };
    while (!stop.load()) {
      auto epoch = (*campaign)->Win(stop);
      if (!epoch.ok()) continue;  // stopped
      Config c = config;
      c.restart_grace_ms = config.TakeoverGraceMs();
      spdlog::info(
          "primary of shard {} (epoch {}), advertised as {}; serving after the takeover grace of "
          "{} ms (lease {} ms + etcd lease {} s + liveness timeout {} ms) [won_mono_ns={}]",
          config.shard, *epoch, config.Advertised(), c.restart_grace_ms, config.lease_ms,
          config.etcd_lease_ttl_s, config.LivenessTimeoutMs(),
          MonoNs(std::chrono::steady_clock::now()));
      // The lease is kept by a thread of its own from here on: creating the server and probing
      // its loopback can take a while, and the deadline does not wait. When the lease is lost,
      // that thread stops the server itself, so the fence does not wait for this one either.
      std::atomic<bool> lost{false}, done{false};
      std::atomic<Server*> live{nullptr};
      std::thread holder([&] {
        while (!done.load() && !stop.load()) {
          if (!(*campaign)->Hold(done)) {
            lost.store(true);
            if (Server* s = live.load(); s != nullptr) s->RequestStop();
            return;
          }
        }
      });
      auto server = Server::Create(c, *epoch, /*unclean_start=*/true);
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
      live.store(server->get());
      if (lost.load()) (*server)->RequestStop();  // lost before `live` was set
      if (auto st = (*server)->ProbeLoopback(std::chrono::seconds(10)); !st.ok() && !lost.load()) {
        (*server)->RequestStop();
        loop.join();
        done.store(true);
        holder.join();
        (*campaign)->Resign();
        fatal(st);
        return;
      }
      (void)sd_notifyf(0, "STATUS=primary of shard %s, epoch %llu", config.shard.c_str(),
                       static_cast<unsigned long long>(*epoch));
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
      live.store(nullptr);
      server->reset();
      if (lost.load() || deadline_hit) {
        const auto deadline = (*campaign)->deadline();
        spdlog::warn(
            "no longer primary of shard {}: {}; stopped serving (every client's QP in the error "
            "state) {} ms before the lease deadline [fenced_mono_ns={} deadline_mono_ns={}]",
            config.shard,
            lost.load() ? (*campaign)->why_lost()
                        : std::string("the etcd lease was not refreshed in time"),
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - fenced).count(),
            MonoNs(fenced), MonoNs(deadline));
        (void)sd_notifyf(0, "STATUS=standby for shard %s (lost the primary)", config.shard.c_str());
        continue;
      }
      (*campaign)->Resign();
      if (!loop_status.ok()) fatal(loop_status);
      return;
    }
  });
  (void)sd_notifyf(0, "READY=1\nSTATUS=campaigning for shard %s", config.shard.c_str());
  while (!stop.load()) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      Reload(config_path, &running, from_file, log_level);
      continue;
    }
    if (!stop.load()) {
      spdlog::info("received {}, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    }
    break;
  }
  (void)sd_notify(0, "STOPPING=1\nSTATUS=stopping");
  stop.store(true);
  worker.join();
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
          hb_timeout = -1, grace = -1, max_connects = -1;
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
  app.add_option("--port", port, "override port")->check(CLI::Range(1, 65535));
  app.add_option("--lock-count", lock_count, "override lock_count")->check(CLI::PositiveNumber);
  app.add_option("--lease-ms", lease_ms, "override lease_ms")->check(CLI::PositiveNumber);
  app.add_option("--max-clients", max_clients, "override max_clients")->check(CLI::PositiveNumber);
  app.add_option("--max-connects-per-second", max_connects,
                 "override max_connects_per_second (0: no limit)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--state-dir", state_dir, "override state_dir (where the epoch persists)");
  app.add_option("--heartbeat-interval-ms", hb_interval, "override heartbeat_interval_ms")
      ->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-timeout-ms", hb_timeout, "override heartbeat_timeout_ms")
      ->check(CLI::PositiveNumber);
  app.add_option("--restart-grace-ms", grace, "override restart_grace_ms (0: one lease)")
      ->check(CLI::NonNegativeNumber);
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
  app.add_option("--etcd-lease-ttl-s", etcd_ttl, "override etcd_lease_ttl_s")
      ->check(CLI::Range(2, 600));
  app.set_version_flag("--version", "lockd " RDMALOCK_VERSION);
  CLI11_PARSE(app, argc, argv);

  auto logger = spdlog::stderr_color_mt("lockd");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  Config config;
  Config from_file;  // what the file said at start (reload compares against it)
  if (!config_path.empty()) {
    auto loaded = rdmalock::lockd::LoadConfig(config_path);
    if (!loaded.ok()) {
      std::cerr << "lockd: " << loaded.status().message() << "\n";
      return 2;
    }
    config = *loaded;
    from_file = *loaded;
  }
  if (!log_level.empty()) config.log_level = log_level;
  if (!address.empty()) config.address = address;
  if (port > 0) config.port = static_cast<uint16_t>(port);
  if (lock_count > 0) config.lock_count = static_cast<uint64_t>(lock_count);
  if (lease_ms > 0) config.lease_ms = static_cast<uint64_t>(lease_ms);
  if (max_clients > 0) config.max_clients = static_cast<uint32_t>(max_clients);
  if (max_connects >= 0) config.max_connects_per_second = static_cast<uint32_t>(max_connects);
  if (app.count("--state-dir") > 0) config.state_dir = state_dir;
  if (hb_interval > 0) config.heartbeat_interval_ms = static_cast<uint64_t>(hb_interval);
  if (hb_timeout > 0) config.heartbeat_timeout_ms = static_cast<uint64_t>(hb_timeout);
  if (grace >= 0) config.restart_grace_ms = static_cast<uint64_t>(grace);
  if (app.count("--admin-socket") > 0) config.admin_socket = admin_socket;
  if (app.count("--metrics-address") > 0) config.metrics_address = metrics_address;
  if (app.count("--auth-key-file") > 0) config.auth_key_file = auth_key_file;
  if (app.count("--allow-from") > 0) config.allow_from = allow_from;
  if (!memory_windows.empty()) config.memory_windows = memory_windows == "true";
  if (max_conns_per_session > 0) {
    config.max_connections_per_session = static_cast<uint32_t>(max_conns_per_session);
  }
  if (!etcd_endpoints.empty()) config.etcd_endpoints = etcd_endpoints;
  if (!cluster.empty()) config.cluster = cluster;
  if (!shard.empty()) config.shard = shard;
  if (app.count("--advertise-address") > 0) config.advertise_address = advertise;
  if (etcd_ttl > 0) config.etcd_lease_ttl_s = static_cast<uint32_t>(etcd_ttl);
  if (app.count("--etcd-ca-file") > 0) config.etcd_ca_file = etcd_ca;
  if (app.count("--etcd-cert-file") > 0) config.etcd_cert_file = etcd_cert;
  if (app.count("--etcd-key-file") > 0) config.etcd_key_file = etcd_key;
  if (auto st = rdmalock::lockd::Validate(config); !st.ok()) {
    std::cerr << "lockd: invalid configuration: " << st.message() << "\n";
    return 2;
  }
  if (!config.auth_key_file.empty()) {  // its mode and length, before anything starts
    if (auto key = rdmalock::auth::LoadKeyFile(config.auth_key_file, true); !key.ok()) {
      std::cerr << "lockd: invalid configuration: " << key.status().message() << "\n";
      return 2;
    }
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

  if (config.cluster_mode()) {
    spdlog::info("cluster mode: shard {} of cluster {}, etcd at {}", config.shard, config.cluster,
                 fmt::join(config.etcd_endpoints, ", "));
    return RunCluster(config, signals, config_path, from_file, log_level);
  }

  auto epoch = rdmalock::lockd::BumpEpoch(config.state_dir);
  if (!epoch.ok()) return Fail(epoch.status());
  auto unclean = rdmalock::lockd::MarkRunning(config.state_dir);
  if (!unclean.ok()) return Fail(unclean.status());
  auto server = rdmalock::lockd::Server::Create(config, *epoch, *unclean);
  if (!server.ok()) return Fail(server.status());

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
    return 1;
  }
  spdlog::info("ready");
  // systemd (Type=notify): ready once the regions are registered, lockd listens and its loopback
  // works. A no-op when NOTIFY_SOCKET is unset.
  (void)sd_notifyf(0, "READY=1\nSTATUS=serving %llu locks on %s:%u (epoch %llu)",
                   static_cast<unsigned long long>(config.lock_count), config.address.c_str(),
                   config.port, static_cast<unsigned long long>(*epoch));

  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      Reload(config_path, &config, from_file, log_level);
      continue;
    }
    spdlog::info("received {}, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    break;
  }
  (void)sd_notify(0, "STOPPING=1\nSTATUS=stopping: disconnecting clients");
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
