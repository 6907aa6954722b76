#include "client/lockctl/args.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "common/cli_decimal.h"
#include "common/duration.h"
#include "common/yaml_keys.h"

namespace lockctl {

std::string ClientConfigPath() {
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x != nullptr && *x != '\0') {
    return std::string(x) + "/rdmalock/client.yaml";
  }
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    return std::string(h) + "/.config/rdmalock/client.yaml";
  }
  return "";
}

// Reads the client config file into `t` (only keys the command line left open). A missing file
// is fine; a bad one is a usage error that names the file, line and key.
bool ReadClientConfig(const std::string& path, bool have_server, bool have_port, bool have_timeout,
                      Target* t) {
  if (path.empty() || access(path.c_str(), F_OK) != 0) return true;
  std::ifstream in(path);
  if (!in) {
    std::cerr << "lockctl: cannot read " << path << "\n";
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseClientConfig(ss.str(), path, have_server, have_port, have_timeout, t);
}

using rdmalock::Decimal;

namespace {

// Parses YAML text; a syntax error is printed with the file and line.
bool LoadYaml(const std::string& text, const std::string& path, YAML::Node* root) {
  try {
    *root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    std::cerr << "lockctl: " << path << ":" << e.mark.line + 1 << ": " << e.msg << "\n";
    return false;
  }
  if (auto d = rdmalock::FindDuplicateKey(*root)) {
    std::cerr << "lockctl: " << d->Message(path) << "\n";
    return false;
  }
  return true;
}

// A time flag: CLI11 takes its text (shown as DURATION in --help) and ParseArgs converts it after
// parsing, so that a bad value is one line that names the flag and gives examples, not CLI11's
// range message with a 309-digit bound. A plain number means what it meant before units were
// accepted (the flag's own unit).
struct TimeFlag {
  CLI::Option* opt = nullptr;
  std::string text;
};

void AddTimeFlag(CLI::App* app, const std::string& names, TimeFlag* flag, const std::string& help,
                 const std::string& default_text = "") {
  flag->opt = app->add_option(names, flag->text, help)->type_name("DURATION");
  if (!default_text.empty()) flag->opt->default_str(default_text);
}

bool BadTime(const TimeFlag& flag, const rdmalock::Status& st) {
  std::cerr << "lockctl: " << flag.opt->get_name() << ": " << st.message() << "\n";
  return false;
}

// The flag's value, if given, into *out: a whole count of `unit` in [lo, hi]. False after
// printing why not.
template <typename T>
bool ConvertTime(const TimeFlag& flag, rdmalock::DurationUnit unit, int64_t lo, int64_t hi,
                 T* out) {
  if (flag.opt->count() == 0) return true;
  auto v = rdmalock::ParseDurationIn(flag.text, unit, lo, hi);
  if (!v.ok()) return BadTime(flag, v.status());
  *out = static_cast<T>(*v);
  return true;
}

// The same for bench's seconds, kept as a double (a fraction of a second is fine there).
bool ConvertSeconds(const TimeFlag& flag, double* out) {
  if (flag.opt->count() == 0) return true;
  auto ns = rdmalock::ParseDurationNs(flag.text, rdmalock::DurationUnit::kSeconds);
  if (!ns.ok()) return BadTime(flag, ns.status());
  *out = static_cast<double>(*ns) / 1e9;
  return true;
}

// Where `acquire`'s command starts in argv, as flock(1) sees it: at the first word after NAME that
// is not one of acquire's options or an option's value, or after a "--" that follows NAME. CLI11
// alone would go on reading options in the command (`acquire job df -h` was acquire's help, exit
// 0, and df never ran). {argc, argc} when argv is not an acquire with a command: CLI11 then sees
// all of it. Else CLI11 parses argv[0, cut) and the command is argv[begin, argc).
struct CommandStart {
  int cut, begin;
};
CommandStart FindAcquireCommand(const CLI::App& app, const CLI::App& acquire, int argc,
                                const char* const* argv) {
  const CommandStart none{argc, argc};
  // How many words after `word` are its values when `word` is one of `a`'s options: 0 (a flag,
  // --opt=value, a word CLI11 will refuse), 1, or kSeveral (a repeatable option: CLI11 takes
  // every plain word up to the next option or subcommand, `--etcd A B`).
  constexpr int kSeveral = 2;
  auto values_after = [](const CLI::App& a, const std::string& word) {
    const bool is_long = word.rfind("--", 0) == 0;
    const size_t eq = word.find('=');
    const std::string name = is_long ? word.substr(0, eq) : word.substr(0, 2);
    const CLI::Option* opt = a.get_option_no_throw(name);
    const bool value_inside = is_long ? eq != std::string::npos : word.size() > 2;
    if (opt == nullptr || value_inside || opt->get_expected_min() == 0) return 0;
    return opt->get_expected_max() > 1 ? kSeveral : 1;
  };
  // As CLI11 tells them: "-" alone and a negative number ("-1") are plain words.
  auto is_option = [](const std::string& word) {
    return word.size() > 1 && word[0] == '-' && !std::isdigit(static_cast<unsigned char>(word[1]));
  };
  auto is_subcommand = [&app](const std::string& word) {
    return !app.get_subcommands([&word](const CLI::App* s) { return s->get_name() == word; })
                .empty();
  };
  int i = 1;
  while (i < argc && is_option(argv[i]) && std::string(argv[i]) != "--") {
    const int values = values_after(app, argv[i]);
    i += 1 + (values == kSeveral ? 1 : values);
    while (values == kSeveral && i < argc && !is_option(argv[i]) && !is_subcommand(argv[i])) ++i;
  }
  if (i >= argc || std::string(argv[i]) != acquire.get_name()) return none;
  bool name_seen = false;
  for (int j = i + 1; j < argc; ++j) {
    const std::string word = argv[j];
    if (word == "--") return name_seen ? CommandStart{j, j + 1} : none;
    if (is_option(word)) {
      j += std::min(values_after(acquire, word), 1);  // acquire has no repeatable option
    } else if (!name_seen) {
      name_seen = true;
    } else {
      return {j, j};
    }
  }
  return none;
}

// "--opt=" with nothing after the '=', for one of lockctl's options (of `app` or a subcommand):
// CLI11 takes the next word as its value (`--server= status` then has no command), so the
// empty-value check after the parse never names it. Returns the option's name, or "".
std::string EmptyAssignment(const CLI::App& app, int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (word.size() < 4 || word.rfind("--", 0) != 0 || word.back() != '=') continue;
    const std::string name = word.substr(0, word.size() - 1);
    if (name.find('=') != std::string::npos) continue;
    if (app.get_option_no_throw(name) != nullptr) return name;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      if (sub->get_option_no_throw(name) != nullptr) return name;
    }
  }
  return "";
}

}  // namespace

bool ParseClientConfig(const std::string& text, const std::string& path, bool have_server,
                       bool have_port, bool have_timeout, Target* t) {
  YAML::Node root;
  if (!LoadYaml(text, path, &root)) return false;
  if (root.IsNull()) return true;
  if (!root.IsMap()) {
    std::cerr << "lockctl: " << path << ": expected a map of keys (server, port, "
              << "connect_timeout_ms, auth_key_file)\n";
    return false;
  }
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>("");
    const int line = kv.first.Mark().line + 1;
    auto bad = [&](const std::string& why) {
      std::cerr << "lockctl: " << path << ":" << line << ": key '" << key << "': " << why << "\n";
      return false;
    };
    if (!kv.second.IsScalar()) return bad("expected a single value");
    const std::string v = kv.second.Scalar();
    if (key == "server") {
      if (v.empty()) return bad("empty");
      if (!have_server) t->server = v, t->source = path;
    } else if (key == "port") {
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > 65535) {
        return bad("'" + v + "' is not an integer in 1..65535");
      }
      if (!have_port) t->port = static_cast<int>(n);
    } else if (key == "connect_timeout_ms") {
      // "5s" or milliseconds as a number, as on the command line.
      auto ms = rdmalock::ParseDurationIn(v, rdmalock::DurationUnit::kMilliseconds, 1, 3600000);
      if (!ms.ok()) return bad(ms.status().message());
      if (!have_timeout) t->connect_timeout_ms = static_cast<int>(*ms);
    } else if (key == "auth_key_file") {
      if (v.empty()) return bad("empty");
      if (t->auth_key_file.empty()) t->auth_key_file = v;
    } else {
      return bad("unknown key (known: server, port, connect_timeout_ms, auth_key_file)");
    }
  }
  return true;
}

bool ParseClusterMap(const std::string& text, const std::string& path, rdmalock::ClusterMap* out) {
  YAML::Node root;
  if (!LoadYaml(text, path, &root)) return false;
  auto bad = [&](const YAML::Node& n, const std::string& why) {
    std::cerr << "lockctl: " << path << ":" << n.Mark().line + 1 << ": " << why << "\n";
    return false;
  };
  if (!root.IsMap() || !root["shards"] || !root["shards"].IsSequence()) {
    return bad(root, "expected 'shards:', a list of {name, server, port}");
  }
  out->shards.clear();
  for (const auto& item : root["shards"]) {
    if (!item.IsMap()) return bad(item, "a shard must be a map of name, server, port");
    rdmalock::ShardSpec s;
    for (const auto& kv : item) {
      const std::string key = kv.first.as<std::string>("");
      if (!kv.second.IsScalar()) return bad(kv.first, "key '" + key + "': expected a value");
      const std::string v = kv.second.Scalar();
      if (key == "name") {
        s.name = v;
      } else if (key == "server") {
        s.server = v;
      } else if (key == "port") {
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1 || n > 65535) {
          return bad(kv.first, "key 'port': '" + v + "' is not a port (1..65535)");
        }
        s.port = static_cast<uint16_t>(n);
      } else {
        return bad(kv.first, "key '" + key + "': unknown (known: name, server, port)");
      }
    }
    out->shards.push_back(s);
  }
  if (const rdmalock::Status st = out->Validate(); !st.ok()) {
    std::cerr << "lockctl: " << path << ": " << st.message() << "\n";
    return false;
  }
  return true;
}

int ParseArgs(int argc, char** argv, Args* args) {
  CLI::App app{
      "lockctl: inspect and use an rdmalock lock server.\n"
      "Exit codes: 0 ok (acquire: the command's status), 64 usage, 69 lockd "
      "unreachable, 70 internal, 74 output not written, 75 lock not granted in time, 76 lock "
      "lost, 127/126 "
      "acquire's command not found/not runnable, 1 release --force refused or bench errors."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lockctl " RDMALOCK_VERSION);
  Common& c = args->common;
  app.add_option("-s,--server", c.server,
                 "lockd address (default: $RDMALOCK_SERVER, then 'server' in "
                 "~/.config/rdmalock/client.yaml)");
  app.add_option("-p,--port", c.port, "lockd port")
      ->transform(Decimal())
      ->check(CLI::Range(1, 65535));
  TimeFlag connect_timeout;
  AddTimeFlag(&app, "--connect-timeout-ms", &connect_timeout,
              "connect timeout: 5s, 500ms, or milliseconds as a number", "5000");
  app.add_flag("--json", c.json, "print JSON");
  app.add_option("--cluster", c.cluster_file,
                 "cluster map (YAML: shards: [{name, server, port}]); a command's lock name "
                 "picks the shard by rendezvous hashing, or --shard names one");
  app.add_option("--etcd", c.etcd,
                 "etcd endpoint, http://HOST:PORT (repeatable): the cluster map and each shard's "
                 "primary come from etcd (lockd's cluster mode)");
  app.add_option("--etcd-cluster", c.etcd_cluster, "with --etcd: the cluster's name")
      ->capture_default_str();
  app.add_option("--etcd-ca-file", c.etcd_ca_file,
                 "with https:// etcd endpoints: the CA of etcd's certificate (default: the "
                 "system's CAs)");
  app.add_option("--etcd-cert-file", c.etcd_cert_file,
                 "with https:// etcd endpoints: a client certificate for etcd");
  app.add_option("--etcd-key-file", c.etcd_key_file, "the key of --etcd-cert-file");
  app.add_option("--shard", c.shard, "with --cluster or --etcd: the shard to talk to, by name");
  app.add_option("--auth-key-file", c.auth_key_file,
                 "file with lockd's shared key (default: $RDMALOCK_AUTH_KEY, "
                 "$RDMALOCK_AUTH_KEY_FILE, then 'auth_key_file' in client.yaml)");

  auto* status = app.add_subcommand("status", "show lockd's epoch, lock count, lease, clients");
  auto* clients = app.add_subcommand(
      "clients",
      "list lockd's sessions: name, pid, address, since when, last heartbeat, locks held");

  auto* inspect = app.add_subcommand("inspect", "decode one lock slot: holders, waiters, tickets");
  std::string& inspect_name = args->inspect_name;
  int64_t& inspect_slot = args->inspect_slot;
  inspect->add_option("name", inspect_name, "lock name");
  inspect->add_option("--slot", inspect_slot, "slot number instead of a name")
      ->transform(Decimal());

  auto* release = app.add_subcommand(
      "release",
      "force-release: lockctl release --force NAME|--slot N|--session ID (on the lock node)");
  bool& rel_force = args->rel_force;
  std::string& rel_name = args->rel_name;
  std::string& rel_socket = args->rel_socket;
  int64_t& rel_slot = args->rel_slot;
  int64_t& rel_session = args->rel_session;
  release->add_flag("--force", rel_force, "required: fence the holder's session and free it");
  release->add_option("name", rel_name, "lock name");
  release->add_option("--slot", rel_slot, "slot number")->transform(Decimal());
  release->add_option("--session", rel_session, "session id (see lockctl clients)")
      ->transform(Decimal());
  release->add_option("--admin-socket", rel_socket, "lockd's admin socket")->capture_default_str();

  auto* acquire = app.add_subcommand(
      "acquire", "hold a lock while a command runs: lockctl acquire NAME [--shared] -- CMD...");
  std::string& acq_name = args->acq_name;
  bool& acq_shared = args->acq_shared;
  std::vector<std::string>& acq_cmd = args->acq_cmd;
  acquire->add_option("name", acq_name, "lock name")->required();
  acquire->add_flag("--shared", acq_shared, "take the lock in shared mode");
  TimeFlag acq_timeout, acq_grace;
  AddTimeFlag(acquire, "--timeout", &acq_timeout,
              "how long to wait for the lock: 60s, 500ms, 2m, or milliseconds as a number "
              "(default: for ever)");
  AddTimeFlag(acquire, "--grace", &acq_grace,
              "from SIGTERM to SIGKILL when the lock is lost or a renewal is overdue: 2s, 500ms, "
              "or milliseconds as a number (default: a quarter of lockd's lease, 500ms at "
              "lease_ms 2000); the SIGKILL comes a tenth of a lease before the lease ends at the "
              "latest, whatever --grace says");
  // The command's words are its own from the first (FindAcquireCommand), "--" or not.
  acquire->add_option("cmd", acq_cmd,
                      "the command and its arguments (lockctl's options end at its first word)");

  auto* top = app.add_subcommand(
      "top", "the most contended locks now: holders, waiters, requests/s; refreshes");
  int& top_rows = args->top_rows;
  int& top_iterations = args->top_iterations;
  std::vector<std::string>& top_names = args->top_names;
  TimeFlag top_interval;
  AddTimeFlag(top, "-i,--interval-ms", &top_interval,
              "refresh interval, 50ms to 1h: 2s, 500ms, or milliseconds as a number", "1000");
  top->add_option("-n,--rows", top_rows, "locks shown")
      ->transform(Decimal())
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  top->add_option("--iterations", top_iterations, "refreshes before exiting (0: until interrupted)")
      ->transform(Decimal())
      ->capture_default_str();
  top->add_option("--name", top_names,
                  "label the slot of this lock name (repeatable; names are hashed, lockd "
                  "does not know them)");

  auto* keygen = app.add_subcommand(
      "keygen", "print a new random shared key (for lockd's auth_key_file and its clients)");

  auto* cluster = app.add_subcommand(
      "cluster", "with --etcd: show the cluster map and each shard's primary, or write the map");
  auto* cluster_init = cluster->add_subcommand(
      "init", "write the cluster map to etcd: the shard names, comma-separated");
  cluster_init->add_option("shards", args->cluster_init, "shard names, e.g. a,b")->required();
  cluster_init->add_flag("--replace", args->cluster_replace,
                         "replace a different map (moves lock names between shards)");

  auto* bench = app.add_subcommand("bench", "run a lock workload and print latency/throughput");
  BenchOptions& bo = args->bench;
  bench->add_option("--threads", bo.threads, "client threads (per process)")
      ->transform(Decimal())
      ->check(CLI::PositiveNumber);
  bench->add_option("--locks", bo.locks, "slots 0..N-1 the keys are drawn from")
      ->transform(Decimal())
      ->check(CLI::PositiveNumber);
  bench->add_option("--keys", bo.keys, "key distribution over the slots: uniform or zipf")
      ->capture_default_str();
  bench->add_option("--zipf-s", bo.zipf_s, "Zipf skew exponent (> 0) for --keys zipf")
      ->capture_default_str();
  bench
      ->add_option("--batch", bo.batch,
                   "distinct locks per set, acquired together (LockManySlots if > 1)")
      ->transform(Decimal())
      ->capture_default_str();
  bench
      ->add_option("--inflight", bo.inflight,
                   "asynchronous acquires (LockSlotAsync) kept in flight per thread; 0: "
                   "synchronous")
      ->transform(Decimal())
      ->capture_default_str();
  bench
      ->add_option("--rate", bo.rate,
                   "open loop: start this many sets/s in all (fixed inter-arrival per thread; "
                   "latency from the scheduled start); 0: closed loop")
      ->capture_default_str();
  bench
      ->add_option("--processes", bo.processes,
                   "run in this many processes, each with its own session and --threads threads")
      ->transform(Decimal())
      ->capture_default_str();
  TimeFlag bench_duration, bench_warmup, bench_hold;
  AddTimeFlag(bench, "--duration", &bench_duration,
              "how long to measure: 10s, 1m, 500ms, or seconds as a number", "5");
  AddTimeFlag(bench, "--warmup", &bench_warmup,
              "how long to run before measuring: 2s, 500ms, or seconds as a number", "0.5");
  bench->add_option("--shared-ratio", bo.shared_ratio, "fraction of shared acquisitions")
      ->check(CLI::Range(0.0, 1.0));
  bench->add_flag("--token", bo.token, "request fencing tokens");
  AddTimeFlag(bench, "--hold-us", &bench_hold,
              "hold each lock this long: 20us, 1ms, or microseconds as a number", "0");
  bench
      ->add_option("--idle-sessions", bo.idle_sessions,
                   "also open this many idle client sessions for the run, in the first process "
                   "(connection cost)")
      ->transform(Decimal())
      ->check(CLI::Range(0, 4096));
  bench
      ->add_option("--timeline", bo.timeline,
                   "write each measured set's start and grant time (CLOCK_MONOTONIC ns) and "
                   "fencing token, one line each, to this file, to line up separate runs; "
                   "--processes 1 only")
      ->type_name("FILE");
  bool no_records = false;
  bench->add_flag("--no-records", no_records,
                  "do not record requests in the session record (lockd cannot free them if this "
                  "process dies; measures what recording costs)");
  bool no_auto_renew = false;
  bench->add_flag("--no-auto-renew", no_auto_renew,
                  "hold each lock without the keeper renewing its lease (until 2026-12-03 the "
                  "bench's only way; readers of one process then each go to lockd)");
  bool no_local_handover = false;
  bench->add_flag("--no-local-handover", no_local_handover,
                  "threads of one process queue at lockd even for a lock another of them holds "
                  "(measures what cohort handover saves)");

  const CommandStart command = FindAcquireCommand(app, *acquire, argc, argv);
  if (const std::string name = EmptyAssignment(app, command.cut, argv); !name.empty()) {
    std::cerr << "lockctl: " << name << ": empty value (leave the flag out for its default)\n";
    return kExitUsage;
  }
  try {
    app.parse(command.cut, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  // A flag given an empty value is refused: lockctl reads "" as a flag left out, so `--cluster
  // "$MAP"` with MAP unset went to RDMALOCK_SERVER's lockd, not the name's shard (found by
  // review, 2026-12-08).
  for (const CLI::App* a :
       {&app, app.get_subcommands().empty() ? &app : app.get_subcommands()[0]}) {
    for (const CLI::Option* opt : a->get_options()) {
      // Positionals (a lock name, acquire's command) have their own checks, which name them.
      if (!opt->nonpositional() || opt->get_expected_min() == 0 || opt->count() == 0) continue;
      for (const std::string& v : opt->results()) {
        if (!v.empty()) continue;
        std::cerr << "lockctl: " << opt->get_name() << ": empty value (leave the flag out for "
                  << "its default)\n";
        return kExitUsage;
      }
    }
  }
  // The time flags, each into the unit it has always had; one line on a bad value.
  using rdmalock::DurationUnit;
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (!ConvertTime(connect_timeout, DurationUnit::kMilliseconds, 1, kIntMax,
                   &c.connect_timeout_ms) ||
      // At most a year: the SDK adds the timeout to the clock's now, in nanoseconds.
      !ConvertTime(acq_timeout, DurationUnit::kMilliseconds, 0, int64_t{365} * 24 * 3600 * 1000,
                   &args->acq_timeout) ||
      !ConvertTime(acq_grace, DurationUnit::kMilliseconds, 0, kIntMax, &args->acq_grace) ||
      !ConvertTime(top_interval, DurationUnit::kMilliseconds, 50, 3600000, &args->top_interval) ||
      !ConvertSeconds(bench_duration, &bo.duration_s) ||
      !ConvertSeconds(bench_warmup, &bo.warmup_s) ||
      !ConvertTime(bench_hold, DurationUnit::kMicroseconds, 0, kIntMax, &bo.hold_us)) {
    return kExitUsage;
  }
  c.port_given = app.count("--port") > 0;
  if (!c.etcd.empty() && !c.cluster_file.empty()) {
    std::cerr << "lockctl: --cluster FILE and --etcd URL both give a cluster map: pass one\n";
    return kExitUsage;
  }
  // Where lockd is comes from --server and --port, or from a map with --shard: a flag of the one
  // given with the other was dropped without a word, and the command went elsewhere.
  const bool map = !c.etcd.empty() || !c.cluster_file.empty();
  if (!c.shard.empty() && !map) {
    std::cerr << "lockctl: --shard names a shard of a cluster map: give --cluster FILE or --etcd "
                 "URL with it\n";
    return kExitUsage;
  }
  if (map && (!c.server.empty() || c.port_given)) {
    std::cerr << "lockctl: --server and --port say where lockd is, and so does the cluster map "
                 "(--cluster or --etcd): pass one\n";
    return kExitUsage;
  }
  c.timeout_given = app.count("--connect-timeout-ms") > 0;
  if (status->parsed()) {
    args->command = Command::kStatus;
  } else if (clients->parsed()) {
    args->command = Command::kClients;
  } else if (inspect->parsed()) {
    args->command = Command::kInspect;
  } else if (top->parsed()) {
    args->command = Command::kTop;
  } else if (release->parsed()) {
    args->command = Command::kRelease;
  } else if (acquire->parsed()) {
    args->command = Command::kAcquire;
    if (command.begin < argc) {
      // CLI11 saw only what comes before the command: it filled none of it (else the scan and
      // CLI11 read the words apart, and a word would be lost; refused rather than guessed).
      if (!acq_cmd.empty()) {
        std::cerr << "lockctl acquire: cannot tell where the command starts: put it after --\n";
        return kExitUsage;
      }
      acq_cmd.assign(argv + command.begin, argv + argc);
    }
  } else if (keygen->parsed()) {
    args->command = Command::kKeygen;
  } else if (cluster->parsed()) {
    args->command = Command::kCluster;
    if (c.etcd.empty()) {
      std::cerr << "lockctl: cluster needs --etcd URL (where the cluster map lives)\n";
      return kExitUsage;
    }
    if (cluster_init->parsed() && args->cluster_init.empty()) {  // else it would only show the map
      std::cerr << "lockctl cluster init: give the shard names, comma-separated (e.g. a,b)\n";
      return kExitUsage;
    }
  } else if (bench->parsed()) {
    args->command = Command::kBench;
    c.record_requests = !no_records;
    c.local_handover = !no_local_handover;
    bo.auto_renew = !no_auto_renew;
    bo.json = c.json;
    bo.cluster = !c.cluster_file.empty() || !c.etcd.empty();
    if (const int rc = ValidateBenchOptions(bo); rc != 0) return rc;
  } else {
    return kExitUsage;
  }
  return -1;
}

int ValidateBenchOptions(const BenchOptions& o) {
  auto bad = [](const char* what) {
    std::fprintf(stderr, "lockctl bench: %s\n", what);
    return kExitUsage;
  };
  char buf[160];
  if (o.threads < 1 || o.threads > kMaxThreads) {
    std::snprintf(buf, sizeof(buf), "--threads must be in [1, %d], not %d", kMaxThreads, o.threads);
    return bad(buf);
  }
  if (o.processes < 1 || o.processes > kMaxProcesses) {
    std::snprintf(buf, sizeof(buf), "--processes must be in [1, %d], not %d", kMaxProcesses,
                  o.processes);
    return bad(buf);
  }
  if (o.locks < 1 || o.locks > kMaxLocks) {
    std::snprintf(buf, sizeof(buf), "--locks must be in [1, %llu]",
                  static_cast<unsigned long long>(kMaxLocks));
    return bad(buf);
  }
  if (o.batch < 1) return bad("--batch must be at least 1");
  if (o.inflight < 0 || o.inflight > 4096) return bad("--inflight must be between 0 and 4096");
  if (o.inflight > 0 && (o.batch != 1 || o.rate > 0)) {
    return bad("--inflight (async acquires) works with --batch 1 and a closed loop (no --rate)");
  }
  if (o.cluster && (o.batch != 1 || o.inflight != 0)) {
    return bad(
        "over a cluster (--cluster or --etcd) bench takes single synchronous locks: "
        "--batch 1 and --inflight 0");
  }
  if (o.cluster && o.locks > (uint64_t{1} << 22)) {
    return bad("over a cluster, --locks is at most 4194304 (each key is a lock name in memory)");
  }
  if (static_cast<uint64_t>(o.batch) > o.locks) {
    std::snprintf(buf, sizeof(buf),
                  "--batch %d is larger than --locks %llu (a set takes distinct locks)", o.batch,
                  static_cast<unsigned long long>(o.locks));
    return bad(buf);
  }
  if (o.keys != "uniform" && o.keys != "zipf") {
    const std::string msg = "--keys must be uniform or zipf, not '" + o.keys + "'";
    return bad(msg.c_str());
  }
  if (!(o.zipf_s > 0) || !std::isfinite(o.zipf_s)) {
    std::snprintf(buf, sizeof(buf), "--zipf-s must be a number > 0, not %g", o.zipf_s);
    return bad(buf);
  }
  if (!(o.rate >= 0) || !std::isfinite(o.rate)) {
    std::snprintf(buf, sizeof(buf), "--rate must be >= 0 sets/s (0: closed loop), not %g", o.rate);
    return bad(buf);
  }
  if (!(o.duration_s > 0) || !std::isfinite(o.duration_s)) return bad("--duration must be > 0");
  // Open loop: each thread starts a set every threads x processes / rate seconds; a rate that
  // starts none within the run measures nothing (and its schedule overflows the clock).
  if (o.rate > 0 && o.threads * o.processes / o.rate > o.duration_s) {
    std::snprintf(buf, sizeof(buf),
                  "--rate %g sets/s over %d threads starts no set per thread within --duration "
                  "%g s: raise --rate or --duration, or use fewer threads",
                  o.rate, o.threads * o.processes, o.duration_s);
    return bad(buf);
  }
  if (!(o.warmup_s >= 0) || !std::isfinite(o.warmup_s)) return bad("--warmup must be >= 0");
  if (!(o.shared_ratio >= 0 && o.shared_ratio <= 1)) {
    return bad("--shared-ratio must be in [0, 1]");
  }
  if (o.hold_us < 0) return bad("--hold-us must be >= 0");
  if (o.idle_sessions < 0) return bad("--idle-sessions must be >= 0");
  if (!o.timeline.empty() && o.processes != 1) {
    return bad("--timeline records one process's sets: it needs --processes 1");
  }
  return 0;
}

}  // namespace lockctl
