// The C API (rdmalock/rdmalock.h) over the C++ SDK. Every entry point catches everything: no
// exception crosses into C. Each function that returns rdmalock_status_t stores its message in the
// calling thread's last-error string. The one exception let through is a thread's own exit
// (pthread_exit, pthread_cancel; glibc unwinds them as abi::__forced_unwind): a lost callback may
// end its thread (Python ends a thread that calls in while the interpreter exits), and such an
// unwind must go on: glibc aborts the process if it is caught and not rethrown.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif
#include <exception>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/src/c_api_internal.h"
#include "client/src/shard_map_file.h"
#include "common/sync/mutex.h"
#include "common/sync/thread_annotations.h"
#include "engine/fork_guard.h"
#include "rdmalock/client.h"
#include "rdmalock/cluster.h"
#include "rdmalock/rdmalock.h"
#include "rdmalock/status.h"

#ifndef RDMALOCK_VERSION
#error "RDMALOCK_VERSION must be defined by the build"
#endif

using rdmalock::ErrorCode;
using rdmalock::Mutex;
using rdmalock::MutexLock;
using rdmalock::Status;

// The codes are rdmalock::ErrorCode's values, one for one.
static_assert(RDMALOCK_OK == static_cast<int>(ErrorCode::kOk));
static_assert(RDMALOCK_ERR_INVALID_ARGUMENT == static_cast<int>(ErrorCode::kInvalidArgument));
static_assert(RDMALOCK_ERR_TIMEOUT == static_cast<int>(ErrorCode::kTimeout));
static_assert(RDMALOCK_ERR_BUSY == static_cast<int>(ErrorCode::kBusy));
static_assert(RDMALOCK_ERR_LOCK_LOST == static_cast<int>(ErrorCode::kLockLost));
static_assert(RDMALOCK_ERR_NOT_HELD == static_cast<int>(ErrorCode::kNotHeld));
static_assert(RDMALOCK_ERR_CONNECTION == static_cast<int>(ErrorCode::kConnection));
static_assert(RDMALOCK_ERR_REJECTED == static_cast<int>(ErrorCode::kRejected));
static_assert(RDMALOCK_ERR_PROTOCOL == static_cast<int>(ErrorCode::kProtocol));
static_assert(RDMALOCK_ERR_RESOURCE == static_cast<int>(ErrorCode::kResource));
static_assert(RDMALOCK_ERR_UNSUPPORTED == static_cast<int>(ErrorCode::kUnsupported));
static_assert(RDMALOCK_ERR_IO == static_cast<int>(ErrorCode::kIo));
static_assert(RDMALOCK_ERR_CONFIG == static_cast<int>(ErrorCode::kConfig));
static_assert(RDMALOCK_ERR_INTERNAL == static_cast<int>(ErrorCode::kInternal));
static_assert(RDMALOCK_EXCLUSIVE == static_cast<int>(rdmalock::LockMode::kExclusive));
static_assert(RDMALOCK_SHARED == static_cast<int>(rdmalock::LockMode::kShared));
static_assert(RDMALOCK_HELD == static_cast<int>(rdmalock::LockState::kHeld));
static_assert(RDMALOCK_RELEASED == static_cast<int>(rdmalock::LockState::kReleased));
static_assert(RDMALOCK_LOST == static_cast<int>(rdmalock::LockState::kLost));

// The lost callback as the C caller set it. Shared with the std::function given to
// LockHandle::OnLost, which may run on the client's keeper thread after the C handle is freed:
// rdmalock_lock_free clears `fn` under `mu`, so no callback runs once it has returned. A callback
// that frees its own lock runs with `mu` held on its own thread; `caller` lets the free see that.
struct LostGate {
  Mutex mu;
  rdmalock_lost_fn fn GUARDED_BY(mu) = nullptr;
  void* user_data GUARDED_BY(mu) = nullptr;
  std::atomic<std::thread::id> caller{};

  void Call(const Status& why) EXCLUDES(mu) {
    MutexLock lk(&mu);
    if (fn == nullptr) {  // cleared (NULL): told to the next callback set (Set)
      untold = why;
      return;
    }
    Tell(why);
  }
  void Set(rdmalock_lost_fn f, void* data) {
    if (caller.load() == std::this_thread::get_id()) {  // from inside the callback: mu is ours
      mu.AssertHeld();
      fn = f;
      user_data = data;
      return;
    }
    MutexLock lk(&mu);
    fn = f;
    user_data = data;
    // A loss found while no callback was set is told to the one set now, on this thread, before
    // rdmalock_lock_on_lost returns; a NULL fn drops it (rdmalock.h).
    std::optional<Status> why = std::exchange(untold, std::nullopt);
    if (why && fn != nullptr) Tell(*why);
  }

 private:
  void Tell(const Status& why) REQUIRES(mu) {
    caller.store(std::this_thread::get_id());
    // Cleared however the callback leaves, before `mu` is unlocked: it may end its thread, and a
    // later thread may be given the same id.
    struct Clear {
      std::atomic<std::thread::id>& id;
      ~Clear() { id.store(std::thread::id()); }
    } clear{caller};
    fn(static_cast<rdmalock_status_t>(why.code()), why.message().c_str(), user_data);
  }
  // The loss the C++ handle reported while fn was NULL.
  std::optional<Status> untold GUARDED_BY(mu);
};

// Constant once made but `closing`: any thread that may use the client reads it. `closing` is
// set by the first rdmalock_close: the close tells the locks still held that they are lost, and
// a callback that closes the client then calls rdmalock_close inside it, which must do nothing
// (it freed the client twice; found by review, 2026-12-07).
// (First member: destroyed last, after `client`, whose destruction runs the callbacks.)
struct rdmalock_client_s {
  std::atomic<bool> closing{false};
  std::unique_ptr<rdmalock::Client> client;
  bool fencing_tokens = true;  // every exclusive acquire asks for one (!no_fencing_tokens)
};

// As rdmalock_client_s.
struct rdmalock_cluster_s {
  std::atomic<bool> closing{false};
  std::unique_ptr<rdmalock::ClusterClient> cluster;
  bool fencing_tokens = true;  // options->client's !no_fencing_tokens
};

struct rdmalock_lock_s {
  rdmalock::LockHandle handle;
  std::shared_ptr<LostGate> gate;  // set by the first rdmalock_lock_on_lost
  // In a forked child no callback can run (the keeper is the parent's), and the gate's mutex may
  // have been held by a parent's thread: it is left alone (issue 17, finding 11).
  const uint64_t fork_gen = rdmalock::fork_guard::Generation();
  bool inherited() const { return rdmalock::fork_guard::Generation() != fork_gen; }
  ~rdmalock_lock_s() {
    if (gate && !inherited()) gate->Set(nullptr, nullptr);
  }
};

namespace {

thread_local std::string last_error;

// Called in a catch (...) handler: rethrows a thread's own exit (above), returns for anything
// else.
void PassThreadExit() {
#if defined(__GLIBCXX__)
  try {
    throw;
  } catch (const abi::__forced_unwind&) {
    throw;
  } catch (...) {  // NOLINT(bugprone-empty-catch): anything else is the caller's to handle
  }
#endif
}

rdmalock_status_t Record(const Status& st, const char* function) {
  try {
    if (st.ok()) {
      last_error.clear();
    } else {
      last_error = function;
      last_error += ": ";
      last_error += st.message();
    }
  } catch (...) {
    // Out of memory for the message: the code still says what happened.
    last_error.clear();
  }
  return static_cast<rdmalock_status_t>(st.code());
}

rdmalock_status_t Fail(ErrorCode code, const char* function, const char* message) {
  try {
    return Record(Status(code, message), function);
  } catch (...) {
    last_error.clear();
    return static_cast<rdmalock_status_t>(code);
  }
}

// Turns an exception escaping the C++ SDK into a code and message.
rdmalock_status_t FromException(const char* function) {
  PassThreadExit();
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return Fail(ErrorCode::kResource, function, "out of memory");
  } catch (const std::exception& e) {
    return Fail(ErrorCode::kInternal, function, e.what());
  } catch (...) {
    return Fail(ErrorCode::kInternal, function, "unknown exception");
  }
}

bool ValidMode(rdmalock_mode_t mode) {
  return mode == RDMALOCK_EXCLUSIVE || mode == RDMALOCK_SHARED;
}

// rdmalock_options_t of C API version 1, which the function rdmalock_options_init (not the
// macro) fills for programs built against that header. Frozen: later fields go after it.
constexpr size_t kOptionsV1Size =
    offsetof(rdmalock_options_t, auth_key_file) + sizeof(rdmalock_options_t::auth_key_file);
static_assert(kOptionsV1Size <= sizeof(rdmalock_options_t));

// Where each field of rdmalock_options_t ends, in order: a caller's struct_size covers a prefix
// of them (an older header's struct), and only whole fields are read.
#define RDMALOCK_FIELD_END(f) (offsetof(rdmalock_options_t, f) + sizeof(rdmalock_options_t::f))
constexpr size_t kOptionsFieldEnds[] = {RDMALOCK_FIELD_END(struct_size),
                                        RDMALOCK_FIELD_END(server),
                                        RDMALOCK_FIELD_END(port),
                                        RDMALOCK_FIELD_END(connect_timeout_ms),
                                        RDMALOCK_FIELD_END(client_name),
                                        RDMALOCK_FIELD_END(auto_renew),
                                        RDMALOCK_FIELD_END(record_requests),
                                        RDMALOCK_FIELD_END(reconnect),
                                        RDMALOCK_FIELD_END(auth_key_file),
                                        RDMALOCK_FIELD_END(no_local_handover),
                                        RDMALOCK_FIELD_END(no_fencing_tokens)};
#undef RDMALOCK_FIELD_END
// No padding after the last field: a newer header's next field would start in it, and the check
// of a newer caller's unknown fields (ToClientOptions) starts at sizeof, so a field set there
// would be ignored, not refused. A field that leaves padding must move that check to its end.
static_assert(kOptionsFieldEnds[std::size(kOptionsFieldEnds) - 1] == sizeof(rdmalock_options_t));
// The smallest struct connect accepts: up to the one required field, the server.
constexpr size_t kOptionsMinSize = kOptionsFieldEnds[1];
// No options struct of any version is larger: a struct_size past it is garbage (a struct nobody
// initialised), not a newer caller's, and reading that far for unknown fields ran past the
// caller's object (found by review, 2026-12-06).
constexpr size_t kOptionsMaxSize = 4096;
static_assert(sizeof(rdmalock_options_t) * 8 <= kOptionsMaxSize);
static_assert(sizeof(rdmalock_cluster_options_t) * 8 <= kOptionsMaxSize);

// The bytes of a caller's struct of `struct_size` bytes that hold whole fields this library knows.
size_t KnownPrefix(size_t struct_size) {
  size_t known = 0;
  for (size_t end : kOptionsFieldEnds) {
    if (end <= struct_size) known = end;
  }
  return known;
}

void FillDefaults(rdmalock_options_t* o) {
  std::memset(o, 0, sizeof(*o));
  const rdmalock::ClientOptions defaults;
  o->struct_size = sizeof(*o);
  o->server = nullptr;
  o->port = defaults.port;
  o->connect_timeout_ms = static_cast<uint32_t>(defaults.connect_timeout.count());
  o->client_name = nullptr;
  o->auto_renew = defaults.auto_renew ? 1 : 0;
  o->record_requests = defaults.record_requests ? 1 : 0;
  o->reconnect = defaults.reconnect ? 1 : 0;
  o->auth_key_file = nullptr;
  o->no_local_handover = defaults.local_handover ? 0 : 1;
  o->no_fencing_tokens = rdmalock::LockOptions{}.fencing_token ? 0 : 1;
}

// Reads the caller's rdmalock_options_t (of its struct_size) into ClientOptions, and into
// *fencing_tokens whether its exclusive acquires ask for a token (a LockOptions field in C++);
// the server may be empty (the caller checks it where it is required). `what` names the struct in
// messages.
rdmalock_status_t ToClientOptions(const char* fn, const char* what,
                                  const rdmalock_options_t* options, rdmalock::ClientOptions* out,
                                  bool* fencing_tokens) {
  const size_t size = options->struct_size;
  if (size < kOptionsMinSize || size > kOptionsMaxSize) {
    return Fail(ErrorCode::kInvalidArgument, fn,
                (std::string(what) + "->struct_size is " + std::to_string(size) + ", not " +
                 std::to_string(kOptionsMinSize) + " to " + std::to_string(kOptionsMaxSize) +
                 ": call rdmalock_options_init first")
                    .c_str());
  }
  // A newer caller's fields beyond what this library knows must be unset (zero): an option the
  // library cannot honour is refused, not ignored.
  const auto* bytes = reinterpret_cast<const unsigned char*>(options);
  for (size_t i = sizeof(rdmalock_options_t); i < size; ++i) {
    if (bytes[i] != 0) {
      return Fail(
          ErrorCode::kUnsupported, fn,
          (std::string(what) +
           " set fields this librdmalock (" RDMALOCK_VERSION ") does not know (struct_size " +
           std::to_string(size) + ")")
              .c_str());
    }
  }
  // An older caller's struct ends earlier: its fields, and the defaults of the rest. Nothing
  // past its struct_size is read.
  rdmalock_options_t merged;
  FillDefaults(&merged);
  std::memcpy(&merged, options, KnownPrefix(size));
  // Refused here, naming the caller's field (the C++ check names ClientOptions::connect_timeout).
  if (merged.connect_timeout_ms == 0) {
    return Fail(ErrorCode::kInvalidArgument, fn,
                (std::string(what) +
                 "->connect_timeout_ms is 0: give the milliseconds to wait for lockd, 1 or more "
                 "(rdmalock_options_init sets 5000)")
                    .c_str());
  }
  rdmalock::ClientOptions o;
  if (merged.server != nullptr) o.server = merged.server;
  o.port = merged.port;
  o.connect_timeout = std::chrono::milliseconds(merged.connect_timeout_ms);
  if (merged.client_name != nullptr) o.client_name = merged.client_name;
  o.auto_renew = merged.auto_renew != 0;
  o.record_requests = merged.record_requests != 0;
  o.reconnect = merged.reconnect != 0;
  if (merged.auth_key_file != nullptr) o.auth_key_file = merged.auth_key_file;
  o.local_handover = merged.no_local_handover == 0;
  *out = std::move(o);
  *fencing_tokens = merged.no_fencing_tokens == 0;
  return RDMALOCK_OK;
}

// rdmalock_cluster_options_t's fields, as for rdmalock_options_t above. Version 3 is the first.
#define RDMALOCK_FIELD_END(f) \
  (offsetof(rdmalock_cluster_options_t, f) + sizeof(rdmalock_cluster_options_t::f))
constexpr size_t kClusterFieldEnds[] = {
    RDMALOCK_FIELD_END(struct_size),    RDMALOCK_FIELD_END(shard_map_file),
    RDMALOCK_FIELD_END(etcd_endpoints), RDMALOCK_FIELD_END(etcd_cluster),
    RDMALOCK_FIELD_END(etcd_ca_file),   RDMALOCK_FIELD_END(etcd_cert_file),
    RDMALOCK_FIELD_END(etcd_key_file),  RDMALOCK_FIELD_END(client)};
#undef RDMALOCK_FIELD_END
static_assert(kClusterFieldEnds[std::size(kClusterFieldEnds) - 1] ==
              sizeof(rdmalock_cluster_options_t));  // no padding after it, as kOptionsFieldEnds
constexpr size_t kClusterOptionsMinSize = kClusterFieldEnds[std::size(kClusterFieldEnds) - 1];

bool Set(const char* s) { return s != nullptr && s[0] != '\0'; }

// "a,b , c" -> {"a", "b", "c"}; an empty member is refused (false).
bool SplitEndpoints(const std::string& text, std::vector<std::string>* out) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string e = text.substr(pos, comma - pos);
    e.erase(0, e.find_first_not_of(" \t"));
    e.erase(e.find_last_not_of(" \t") + 1);
    if (e.empty()) return false;
    out->push_back(e);
    pos = comma + 1;
  }
  return !out->empty();
}

// The checks and options every acquire shares (client or cluster): mode and timeout. Returns
// RDMALOCK_OK with *o filled, or the failure already recorded.
rdmalock_status_t AcquireOptions(const char* function, rdmalock_mode_t mode, int64_t timeout_ms,
                                 rdmalock::LockOptions* o) {
  if (!ValidMode(mode)) {
    return Fail(ErrorCode::kInvalidArgument, function,
                ("mode " + std::to_string(static_cast<int>(mode)) +
                 " is neither RDMALOCK_EXCLUSIVE nor RDMALOCK_SHARED")
                    .c_str());
  }
  if (timeout_ms < RDMALOCK_WAIT_FOREVER) {
    return Fail(
        ErrorCode::kInvalidArgument, function,
        ("timeout_ms " + std::to_string(timeout_ms) + " is negative (RDMALOCK_WAIT_FOREVER is -1)")
            .c_str());
  }
  o->mode = static_cast<rdmalock::LockMode>(mode);
  if (timeout_ms != RDMALOCK_WAIT_FOREVER) o->timeout = std::chrono::milliseconds(timeout_ms);
  return RDMALOCK_OK;
}

// An acquire's result as the C API gives it: a new lock in *out, or the error recorded.
rdmalock_status_t AcquireResult(const char* function, rdmalock::Result<rdmalock::LockHandle> r,
                                rdmalock_lock_t** out) {
  if (!r.ok()) return Record(r.status(), function);
  auto lock = std::make_unique<rdmalock_lock_s>();
  lock->handle = std::move(r).value();
  *out = lock.release();
  return Record(Status::Ok(), function);
}

rdmalock_status_t ClusterAcquire(const char* function, rdmalock_cluster_t* cluster,
                                 const char* name, rdmalock_mode_t mode, int64_t timeout_ms,
                                 rdmalock_lock_t** out) {
  if (out == nullptr) return Fail(ErrorCode::kInvalidArgument, function, "out is NULL");
  *out = nullptr;
  if (cluster == nullptr) return Fail(ErrorCode::kInvalidArgument, function, "cluster is NULL");
  if (name == nullptr) return Fail(ErrorCode::kInvalidArgument, function, "lock name is NULL");
  rdmalock::LockOptions o;
  if (auto st = AcquireOptions(function, mode, timeout_ms, &o); st != RDMALOCK_OK) return st;
  o.fencing_token = cluster->fencing_tokens;
  return AcquireResult(function, cluster->cluster->Lock(std::string_view(name), o), out);
}

}  // namespace

namespace rdmalock {

rdmalock_cluster_t* WrapClusterForTesting(std::unique_ptr<ClusterClient> cluster) {
  auto c = std::make_unique<rdmalock_cluster_s>();
  c->cluster = std::move(cluster);
  return c.release();
}

rdmalock_client_t* WrapClientForTesting(std::unique_ptr<Client> client) {
  auto c = std::make_unique<rdmalock_client_s>();
  c->client = std::move(client);
  return c.release();
}

}  // namespace rdmalock

namespace {

rdmalock_status_t Acquire(const char* function, rdmalock_client_t* client, const char* name,
                          const uint64_t* slot, rdmalock_mode_t mode, int64_t timeout_ms,
                          rdmalock_lock_t** out) {
  if (out == nullptr) return Fail(ErrorCode::kInvalidArgument, function, "out is NULL");
  *out = nullptr;
  if (client == nullptr) return Fail(ErrorCode::kInvalidArgument, function, "client is NULL");
  if (slot == nullptr && name == nullptr) {
    return Fail(ErrorCode::kInvalidArgument, function, "lock name is NULL");
  }
  rdmalock::LockOptions o;
  if (auto st = AcquireOptions(function, mode, timeout_ms, &o); st != RDMALOCK_OK) return st;
  o.fencing_token = client->fencing_tokens;
  return AcquireResult(function,
                       slot != nullptr ? client->client->LockSlot(*slot, o)
                                       : client->client->Lock(std::string_view(name), o),
                       out);
}

}  // namespace

extern "C" {

// The caller's struct is struct_size bytes: nothing past them is written (issue 17, finding 8).
void rdmalock_options_init_sized(rdmalock_options_t* options, size_t struct_size) {
  if (options == nullptr || struct_size < sizeof(size_t)) return;
  rdmalock_options_t d;
  FillDefaults(&d);
  std::memset(options, 0, struct_size);
  std::memcpy(options, &d, std::min(struct_size, sizeof(d)));
  options->struct_size = struct_size;
}

// The name in parentheses: rdmalock.h's macro of the same name is not expanded.
void(rdmalock_options_init)(rdmalock_options_t* options) {
  rdmalock_options_init_sized(options, kOptionsV1Size);
}

rdmalock_status_t rdmalock_connect(const rdmalock_options_t* options, rdmalock_client_t** out) {
  constexpr const char* fn = "rdmalock_connect";
  try {
    if (out == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "out is NULL");
    *out = nullptr;
    if (options == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "options is NULL");
    rdmalock::ClientOptions o;
    bool tokens = true;
    if (const rdmalock_status_t st = ToClientOptions(fn, "options", options, &o, &tokens);
        st != RDMALOCK_OK) {
      return st;
    }
    if (o.server.empty()) {
      return Fail(ErrorCode::kInvalidArgument, fn,
                  "options->server is not set: name lockd's address");
    }
    if (o.port == 0) {  // a cluster's shards take theirs from the map, so only here
      return Fail(ErrorCode::kInvalidArgument, fn,
                  "options->port is 0: give lockd's port (rdmalock_options_init sets 7471)");
    }
    auto c = std::make_unique<rdmalock_client_s>();
    auto r = rdmalock::Client::Connect(o);
    if (!r.ok()) return Record(r.status(), fn);
    c->client = std::move(r).value();
    c->fencing_tokens = tokens;
    *out = c.release();
    return Record(Status::Ok(), fn);
  } catch (...) {
    return FromException(fn);
  }
}

void rdmalock_close(rdmalock_client_t* client) {
  // A close inside this client's close (a lost callback it runs) does nothing.
  if (client == nullptr || client->closing.exchange(true)) return;
  try {
    delete client;
  } catch (...) {
    // ~Client does not throw; nothing to report through a void function anyway.
  }
}

rdmalock_status_t rdmalock_lock(rdmalock_client_t* client, const char* name, rdmalock_mode_t mode,
                                int64_t timeout_ms, rdmalock_lock_t** out) {
  try {
    return Acquire("rdmalock_lock", client, name, nullptr, mode, timeout_ms, out);
  } catch (...) {
    return FromException("rdmalock_lock");
  }
}

rdmalock_status_t rdmalock_try_lock(rdmalock_client_t* client, const char* name,
                                    rdmalock_mode_t mode, rdmalock_lock_t** out) {
  try {
    return Acquire("rdmalock_try_lock", client, name, nullptr, mode, 0, out);
  } catch (...) {
    return FromException("rdmalock_try_lock");
  }
}

rdmalock_status_t rdmalock_lock_slot(rdmalock_client_t* client, uint64_t slot, rdmalock_mode_t mode,
                                     int64_t timeout_ms, rdmalock_lock_t** out) {
  try {
    return Acquire("rdmalock_lock_slot", client, nullptr, &slot, mode, timeout_ms, out);
  } catch (...) {
    return FromException("rdmalock_lock_slot");
  }
}

rdmalock_status_t rdmalock_release(rdmalock_lock_t* lock) {
  constexpr const char* fn = "rdmalock_release";
  try {
    if (lock == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "lock is NULL");
    return Record(lock->handle.Release(), fn);
  } catch (...) {
    return FromException(fn);
  }
}

rdmalock_status_t rdmalock_flush(rdmalock_client_t* client) {
  constexpr const char* fn = "rdmalock_flush";
  try {
    if (client == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "client is NULL");
    return Record(client->client->Flush(), fn);
  } catch (...) {
    return FromException(fn);
  }
}

rdmalock_status_t rdmalock_renew(rdmalock_lock_t* lock) {
  constexpr const char* fn = "rdmalock_renew";
  try {
    if (lock == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "lock is NULL");
    return Record(lock->handle.Renew(), fn);
  } catch (...) {
    return FromException(fn);
  }
}

void rdmalock_lock_free(rdmalock_lock_t* lock) {
  try {
    delete lock;  // ~rdmalock_lock_s closes the gate first; ~LockHandle releases if still held
  } catch (...) {
  }
}

uint64_t rdmalock_lock_get_token(const rdmalock_lock_t* lock) {
  try {
    return lock != nullptr ? lock->handle.fencing_token() : 0;
  } catch (...) {
    return 0;
  }
}

uint64_t rdmalock_lock_get_slot(const rdmalock_lock_t* lock) {
  try {
    return lock != nullptr ? lock->handle.slot() : 0;
  } catch (...) {
    return 0;
  }
}

rdmalock_mode_t rdmalock_lock_get_mode(const rdmalock_lock_t* lock) {
  try {
    return lock != nullptr ? static_cast<rdmalock_mode_t>(lock->handle.mode()) : RDMALOCK_EXCLUSIVE;
  } catch (...) {
    return RDMALOCK_EXCLUSIVE;
  }
}

rdmalock_state_t rdmalock_lock_get_state(const rdmalock_lock_t* lock) {
  try {
    return lock != nullptr ? static_cast<rdmalock_state_t>(lock->handle.state())
                           : RDMALOCK_RELEASED;
  } catch (...) {
    return RDMALOCK_RELEASED;
  }
}

int64_t rdmalock_lock_lease_remaining_ms(const rdmalock_lock_t* lock) {
  try {
    if (lock == nullptr || lock->handle.state() != rdmalock::LockState::kHeld) return 0;
    const auto left = lock->handle.lease_expiry() - std::chrono::steady_clock::now();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
    return ms > 0 ? ms : 0;
  } catch (...) {
    return 0;
  }
}

rdmalock_status_t rdmalock_lock_on_lost(rdmalock_lock_t* lock, rdmalock_lost_fn fn,
                                        void* user_data) {
  constexpr const char* name = "rdmalock_lock_on_lost";
  try {
    if (lock == nullptr) return Fail(ErrorCode::kInvalidArgument, name, "lock is NULL");
    if (lock->inherited()) {
      return Fail(ErrorCode::kUnsupported, name,
                  "this lock was inherited across fork(): the parent process holds it");
    }
    // The gate has its callback before the handle has the gate: a lock lost already is told
    // at once, from OnLost, on this thread.
    const bool first = !lock->gate;
    if (first) lock->gate = std::make_shared<LostGate>();
    // Held here: a loss told from Set may run a callback that frees the lock, and its gate.
    const std::shared_ptr<LostGate> gate = lock->gate;
    gate->Set(fn, user_data);
    if (first) {
      lock->handle.OnLost([gate = lock->gate](const Status& why) {
        try {
          gate->Call(why);
        } catch (...) {
          PassThreadExit();  // the callback ended its thread: the unwind goes on
          // A C callback cannot throw; a failed mutex lock is dropped.
        }
      });
      // A loss the handle kept (found while no callback was set) came to the gate just now; a
      // NULL fn drops it (rdmalock.h), as a later NULL would: the gate kept it for the next
      // callback set (found by review, 2026-12-06).
      if (fn == nullptr) gate->Set(nullptr, nullptr);
    }
    return Record(Status::Ok(), name);
  } catch (...) {
    return FromException(name);
  }
}

uint64_t rdmalock_client_lock_count(const rdmalock_client_t* client) {
  try {
    return client != nullptr ? client->client->lock_count() : 0;
  } catch (...) {
    return 0;
  }
}

uint64_t rdmalock_client_lease_ms(const rdmalock_client_t* client) {
  try {
    if (client == nullptr) return 0;
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(client->client->lease()).count());
  } catch (...) {
    return 0;
  }
}

uint64_t rdmalock_client_session_id(const rdmalock_client_t* client) {
  try {
    return client != nullptr ? client->client->session_id() : 0;
  } catch (...) {
    return 0;
  }
}

void rdmalock_cluster_options_init_sized(rdmalock_cluster_options_t* options, size_t struct_size) {
  if (options == nullptr || struct_size < sizeof(size_t)) return;
  std::memset(options, 0, struct_size);  // every field's default is its zero
  options->struct_size = struct_size;
}

rdmalock_status_t rdmalock_cluster_open(const rdmalock_cluster_options_t* options,
                                        rdmalock_cluster_t** out) {
  constexpr const char* fn = "rdmalock_cluster_open";
  try {
    if (out == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "out is NULL");
    *out = nullptr;
    if (options == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "options is NULL");
    const size_t size = options->struct_size;
    if (size < kClusterOptionsMinSize || size > kOptionsMaxSize) {
      return Fail(ErrorCode::kInvalidArgument, fn,
                  ("options->struct_size is " + std::to_string(size) + ", not " +
                   std::to_string(kClusterOptionsMinSize) + " to " +
                   std::to_string(kOptionsMaxSize) + ": call rdmalock_cluster_options_init first")
                      .c_str());
    }
    const auto* bytes = reinterpret_cast<const unsigned char*>(options);
    for (size_t i = sizeof(rdmalock_cluster_options_t); i < size; ++i) {
      if (bytes[i] != 0) {
        return Fail(ErrorCode::kUnsupported, fn,
                    ("options set fields this librdmalock (" RDMALOCK_VERSION
                     ") does not know (struct_size " +
                     std::to_string(size) + ")")
                        .c_str());
      }
    }
    const bool file = Set(options->shard_map_file);
    const bool etcd = Set(options->etcd_endpoints);
    if (file == etcd) {
      return Fail(ErrorCode::kInvalidArgument, fn,
                  file ? "options set both shard_map_file and etcd_endpoints: choose one"
                       : "options set neither shard_map_file nor etcd_endpoints");
    }
    rdmalock::ClientOptions o;
    bool tokens = true;
    if (options->client != nullptr) {
      if (const rdmalock_status_t st =
              ToClientOptions(fn, "options->client", options->client, &o, &tokens);
          st != RDMALOCK_OK) {
        return st;
      }
    }
    auto c = std::make_unique<rdmalock_cluster_s>();
    c->fencing_tokens = tokens;
    if (file) {
      // The etcd source's options mean nothing to a map file: refused, not ignored (a caller
      // who set a CA file for etcd and a map file by mistake would otherwise never know).
      for (const auto& [name, value] : {std::pair{"etcd_cluster", options->etcd_cluster},
                                        std::pair{"etcd_ca_file", options->etcd_ca_file},
                                        std::pair{"etcd_cert_file", options->etcd_cert_file},
                                        std::pair{"etcd_key_file", options->etcd_key_file}}) {
        if (Set(value)) {
          const std::string why = std::string("options set shard_map_file and ") + name +
                                  ", which is for an etcd source (etcd_endpoints) only";
          return Fail(ErrorCode::kInvalidArgument, fn, why.c_str());
        }
      }
      auto map = rdmalock::ReadClusterMapFile(options->shard_map_file);
      if (!map.ok()) return Record(map.status(), fn);
      auto r = rdmalock::ClusterClient::Connect(*map, o);
      if (!r.ok()) return Record(r.status(), fn);
      c->cluster = std::move(r).value();
    } else {
      rdmalock::EtcdCluster e;
      if (!SplitEndpoints(options->etcd_endpoints, &e.endpoints)) {
        return Fail(ErrorCode::kInvalidArgument, fn,
                    "options->etcd_endpoints has an empty member (expected "
                    "http[s]://HOST:PORT, comma-separated)");
      }
      if (Set(options->etcd_cluster)) e.cluster = options->etcd_cluster;
      if (Set(options->etcd_cert_file) != Set(options->etcd_key_file)) {
        return Fail(ErrorCode::kInvalidArgument, fn,
                    "options set one of etcd_cert_file and etcd_key_file: give both or neither");
      }
      if (Set(options->etcd_ca_file)) e.ca_file = options->etcd_ca_file;
      if (Set(options->etcd_cert_file)) e.cert_file = options->etcd_cert_file;
      if (Set(options->etcd_key_file)) e.key_file = options->etcd_key_file;
      auto r = rdmalock::ClusterClient::Connect(e, o);
      if (!r.ok()) return Record(r.status(), fn);
      c->cluster = std::move(r).value();
    }
    *out = c.release();
    return Record(Status::Ok(), fn);
  } catch (...) {
    return FromException(fn);
  }
}

void rdmalock_cluster_close(rdmalock_cluster_t* cluster) {
  // A close inside this cluster's close (a lost callback it runs) does nothing.
  if (cluster == nullptr || cluster->closing.exchange(true)) return;
  try {
    delete cluster;
  } catch (...) {
    // ~ClusterClient does not throw; nothing to report through a void function anyway.
  }
}

rdmalock_status_t rdmalock_cluster_lock(rdmalock_cluster_t* cluster, const char* name,
                                        rdmalock_mode_t mode, int64_t timeout_ms,
                                        rdmalock_lock_t** out) {
  try {
    return ClusterAcquire("rdmalock_cluster_lock", cluster, name, mode, timeout_ms, out);
  } catch (...) {
    return FromException("rdmalock_cluster_lock");
  }
}

rdmalock_status_t rdmalock_cluster_try_lock(rdmalock_cluster_t* cluster, const char* name,
                                            rdmalock_mode_t mode, rdmalock_lock_t** out) {
  try {
    return ClusterAcquire("rdmalock_cluster_try_lock", cluster, name, mode, 0, out);
  } catch (...) {
    return FromException("rdmalock_cluster_try_lock");
  }
}

uint64_t rdmalock_cluster_shard_count(const rdmalock_cluster_t* cluster) {
  try {
    return cluster != nullptr ? cluster->cluster->map().shards.size() : 0;
  } catch (...) {
    return 0;
  }
}

rdmalock_status_t rdmalock_cluster_shard_of(const rdmalock_cluster_t* cluster, const char* name,
                                            char* buf, size_t buf_size) {
  constexpr const char* fn = "rdmalock_cluster_shard_of";
  try {
    if (cluster == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "cluster is NULL");
    if (name == nullptr || name[0] == '\0') {
      return Fail(ErrorCode::kInvalidArgument, fn, "lock name is NULL or empty");
    }
    if (buf == nullptr) return Fail(ErrorCode::kInvalidArgument, fn, "buf is NULL");
    // One copy of the map for both lookups: a map in etcd can change between two calls.
    const rdmalock::ClusterMap map = cluster->cluster->map();
    if (map.shards.empty()) {  // a forked child's copy, whose map() is empty (cluster.h)
      return Fail(ErrorCode::kUnsupported, fn,
                  "this cluster client was inherited across fork(); it has no shards here");
    }
    const std::string& shard = map.shards[rdmalock::ShardForName(map, name)].name;
    if (shard.size() + 1 > buf_size) {
      return Fail(
          ErrorCode::kInvalidArgument, fn,
          ("buf_size " + std::to_string(buf_size) + " is too small for shard name '" + shard + "'")
              .c_str());
    }
    std::memcpy(buf, shard.c_str(), shard.size() + 1);
    return Record(Status::Ok(), fn);
  } catch (...) {
    return FromException(fn);
  }
}

uint64_t rdmalock_slot_for_name(const char* name, uint64_t lock_count) {
  try {
    if (name == nullptr || lock_count == 0) return 0;
    return rdmalock::SlotForName(name, lock_count);
  } catch (...) {
    return 0;
  }
}

const char* rdmalock_last_error(void) { return last_error.c_str(); }

const char* rdmalock_error_name(int code) {
  // ErrorCodeName's views are string literals, so NUL-terminated.
  if (code < RDMALOCK_OK || code > RDMALOCK_ERR_INTERNAL) return "unknown";
  return rdmalock::ErrorCodeName(static_cast<ErrorCode>(code)).data();
}

const char* rdmalock_version(void) { return RDMALOCK_VERSION; }

int rdmalock_c_api_version(void) { return RDMALOCK_C_API_VERSION; }

}  // extern "C"
