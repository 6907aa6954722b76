#include "common/etcd/etcd.h"

#include <httplib.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

namespace rdmalock::etcd {
namespace {

using json = nlohmann::json;

std::string B64(std::string_view s) {
  std::string out(sodium_base64_ENCODED_LEN(s.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(s.data()),
                    s.size(), sodium_base64_VARIANT_ORIGINAL);
  out.resize(std::strlen(out.c_str()));
  return out;
}

Result<std::string> Unb64(const std::string& s) {
  std::string out(s.size(), '\0');
  size_t len = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), s.data(),
                        s.size(), nullptr, &len, nullptr, sodium_base64_VARIANT_ORIGINAL) != 0) {
    return Error(ErrorCode::kProtocol, "etcd sent a value that is not base64");
  }
  out.resize(len);
  return out;
}

// etcd's gateway writes 64-bit integers as JSON strings, and leaves out fields that are zero.
Result<int64_t> Int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return int64_t{0};
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size()) return v;
  }
  return Error(ErrorCode::kProtocol, std::string("etcd sent a bad '") + field + "'");
}

// A string field, "" when absent (etcd leaves out empty ones). json::value() would throw for a
// field of another type, and no caller of this client catches (lockd's campaign, the SDK's
// keeper and map refresher): a peer that is not quite etcd must be an error, not an abort.
Result<std::string> Str(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  return Error(ErrorCode::kProtocol, std::string("etcd sent a '") + field + "' that is no string");
}

// A boolean field, false when absent (etcd leaves out false ones).
Result<bool> Bool(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  return Error(ErrorCode::kProtocol, std::string("etcd sent a '") + field + "' that is no boolean");
}

Result<KeyValue> ToKeyValue(const json& j) {
  KeyValue kv;
  if (!j.is_object()) return Error(ErrorCode::kProtocol, "etcd sent a key-value that is no object");
  RDMALOCK_ASSIGN_OR_RETURN(std::string key, Str(j, "key"));
  RDMALOCK_ASSIGN_OR_RETURN(kv.key, Unb64(key));
  RDMALOCK_ASSIGN_OR_RETURN(std::string value, Str(j, "value"));
  RDMALOCK_ASSIGN_OR_RETURN(kv.value, Unb64(value));
  RDMALOCK_ASSIGN_OR_RETURN(kv.create_revision, Int(j, "create_revision"));
  RDMALOCK_ASSIGN_OR_RETURN(kv.mod_revision, Int(j, "mod_revision"));
  RDMALOCK_ASSIGN_OR_RETURN(kv.lease, Int(j, "lease"));
  return kv;
}

// The first key-value of a range reply, if any.
Result<std::optional<KeyValue>> FirstKv(const json& range) {
  auto it = range.find("kvs");
  if (it == range.end() || !it->is_array() || it->empty()) return std::optional<KeyValue>();
  RDMALOCK_ASSIGN_OR_RETURN(KeyValue kv, ToKeyValue(it->front()));
  return std::optional<KeyValue>(std::move(kv));
}

Result<json> ParseJson(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Error(ErrorCode::kProtocol, "etcd sent a reply that is not a JSON object");
  }
  return j;
}

}  // namespace

Result<std::pair<std::string, uint16_t>> ParseEndpoint(std::string_view endpoint) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kConfig, "etcd endpoint '" + std::string(endpoint) + "': " + why +
                                         " (expected http://HOST:PORT or https://HOST:PORT)");
  };
  std::string_view scheme;
  for (std::string_view s : {"http://", "https://"}) {
    if (endpoint.substr(0, s.size()) == s) scheme = s;
  }
  if (scheme.empty()) return bad("no http:// or https://");
  std::string_view rest = endpoint.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  std::string host;
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unclosed '['");
    host = std::string(rest.substr(1, close - 1));
    rest.remove_prefix(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("no port");
    port = rest.substr(1);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    host = std::string(rest.substr(0, colon));
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return bad("no host");
  if (port.find('/') != std::string_view::npos) return bad("a path is not allowed");
  unsigned p = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || ptr != port.data() + port.size() || p == 0 || p > 65535) {
    return bad("bad port '" + std::string(port) + "'");
  }
  return std::make_pair(host, static_cast<uint16_t>(p));
}

Client::Client(std::vector<Endpoint> endpoints, Tls tls)
    : parsed_(std::move(endpoints)), tls_(std::move(tls)) {
  for (const auto& e : parsed_) endpoints_.push_back(e.url);
}
Client::~Client() = default;

void Client::Cancel() {
  {
    MutexLock lk(&cancel_.mu);
    cancel_.cancelled = true;
  }
  cancel_.cv.SignalAll();
}

Status CheckTlsEndpoints(const std::vector<std::string>& endpoints, const Tls& tls) {
  if (tls.ca_file.empty() && tls.cert_file.empty() && tls.key_file.empty()) return Status::Ok();
  for (const std::string& e : endpoints) {
    if (e.rfind("https://", 0) != 0) {
      return Error(ErrorCode::kConfig,
                   "etcd endpoint " + e +
                       " is not https://, but etcd TLS files are given (CA, certificate or key): "
                       "they apply only to https:// endpoints; write https://, or drop the files "
                       "to talk to etcd in plain text");
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<Client>> Client::Create(const std::vector<std::string>& endpoints,
                                               const Tls& tls) {
  if (endpoints.empty()) return Error(ErrorCode::kConfig, "no etcd endpoint given");
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return Error(ErrorCode::kConfig,
                 "an etcd client certificate needs both the certificate and its key file");
  }
  for (const std::string* f : {&tls.ca_file, &tls.cert_file, &tls.key_file}) {
    if (!f->empty() && access(f->c_str(), R_OK) != 0) {
      return Error(ErrorCode::kConfig,
                   "cannot read etcd TLS file " + *f + ": " + std::strerror(errno));
    }
  }
  std::vector<Endpoint> parsed;
  for (const auto& e : endpoints) {
    RDMALOCK_ASSIGN_OR_RETURN(auto hp, ParseEndpoint(e));
    parsed.push_back({e, hp.first, hp.second, e.substr(0, 8) == "https://"});
  }
  RDMALOCK_RETURN_IF_ERROR(CheckTlsEndpoints(endpoints, tls));
  return std::unique_ptr<Client>(new Client(std::move(parsed), tls));
}

namespace {

// Keeps SIGPIPE from killing the process while this thread talks to etcd: a peer that closes a
// connection (etcd refusing a TLS handshake, say) makes the next write raise it, and OpenSSL
// writes with plain write(). Blocks it for this thread, and takes back one that this thread
// raised meanwhile; the process's own handling of SIGPIPE is left alone.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Ends one request at `until`, or when its client is cancelled (Client::Cancel): httplib bounds
// the connect, each write and each read on its own, not the request, so a peer that answers
// slowly (a reply trickling in, a connect that just makes it before a long read) could hold a call
// for several times its timeout, or for ever. From then on, a thread of its own stops the client
// (shuts its socket down) every few milliseconds until the request has returned (a connect in
// progress holds the client's socket lock, so the first stop may come before there is a socket to
// shut). Owned by the calling thread; `http` and `cancel` must outlive it.
class StopAt {
 public:
  StopAt(httplib::Client& http, std::chrono::steady_clock::time_point until, CallCancel& cancel)
      : cancel_(cancel), thread_([this, &http, until] { Run(http, until); }) {}
  ~StopAt() {
    {
      MutexLock lk(&cancel_.mu);
      done_ = true;
    }
    cancel_.cv.SignalAll();
    thread_.join();
  }
  StopAt(const StopAt&) = delete;
  StopAt& operator=(const StopAt&) = delete;
  // Whether the request was stopped (call once it has returned).
  bool fired() EXCLUDES(cancel_.mu) {
    MutexLock lk(&cancel_.mu);
    return fired_;
  }

 private:
  void Run(httplib::Client& http, std::chrono::steady_clock::time_point until)
      EXCLUDES(cancel_.mu) {
    MutexLock lk(&cancel_.mu);
    const auto done = [this] {
      cancel_.mu.AssertHeld();
      return done_;
    };
    // The client's condition variable: another call's end wakes this one too, which looks again.
    (void)cancel_.cv.WaitUntil(lk, until, [this] {
      cancel_.mu.AssertHeld();
      return done_ || cancel_.cancelled;
    });
    if (done_) return;
    fired_ = true;
    do {
      lk.Unlock();
      http.stop();
      lk.Lock();
    } while (!cancel_.cv.WaitFor(lk, std::chrono::milliseconds(5), done));
  }

  CallCancel& cancel_;
  bool done_ GUARDED_BY(cancel_.mu) = false;
  bool fired_ GUARDED_BY(cancel_.mu) = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

namespace {

// Whether `body` is an answer of etcd's gateway: a JSON object with etcd's response header, at
// its top (range, txn, put, delete, lease grant and revoke) or in "result" (keepalive, streamed).
// A JSON object of something else ({"message": "maintenance"}) would read as "no kvs", a key
// absent.
bool IsEtcdReply(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (!j.is_object()) return false;
  if (j.contains("header") && j["header"].is_object()) return true;
  return j.contains("result") && j["result"].is_object() && j["result"].contains("header");
}

}  // namespace

Result<std::string> Client::Post(const std::string& path, const std::string& body, Ms timeout) {
  const NoSigpipe no_sigpipe;
  size_t first;
  {
    MutexLock lk(&mu_);
    first = preferred_;
  }
  std::string errors;
  // One deadline for the call: each endpoint gets an equal share of what is left, so one that
  // fails fast leaves its share to the next, and the whole call ends by the deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto cancelled = [this] {
    MutexLock lk(&cancel_.mu);
    return cancel_.cancelled;
  };
  for (size_t n = 0; n < parsed_.size(); ++n) {
    if (cancelled()) {
      return Error(ErrorCode::kConnection,
                   "etcd " + path + ": cancelled (its owner is closing)" +
                       (errors.empty() ? std::string() : "; before that: " + errors));
    }
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      errors += (errors.empty() ? "" : "; ") + std::string("no time left for ") +
                parsed_[(first + n) % parsed_.size()].url;
      break;
    }
    const auto per_try =
        std::max(std::chrono::microseconds(1000), left / static_cast<int64_t>(parsed_.size() - n));
    const size_t i = (first + n) % parsed_.size();
    const Endpoint& e = parsed_[i];
    // https: verify etcd's certificate (against ca_file, else the system's CAs) and offer the
    // client certificate if there is one.
    const std::string host = e.host.find(':') != std::string::npos ? "[" + e.host + "]" : e.host;
    auto client = e.https ? std::make_unique<httplib::Client>(
                                "https://" + host + ":" + std::to_string(e.port), tls_.cert_file,
                                tls_.key_file)
                          : std::make_unique<httplib::Client>(e.host, e.port);
    httplib::Client& http = *client;
    if (e.https) {
      http.enable_server_certificate_verification(true);
      if (!tls_.ca_file.empty()) http.set_ca_cert_path(tls_.ca_file);
    }
    const auto us = per_try.count();
    http.set_connection_timeout(us / 1000000, us % 1000000);
    http.set_read_timeout(us / 1000000, us % 1000000);
    http.set_write_timeout(us / 1000000, us % 1000000);
    httplib::Result res{nullptr, httplib::Error::Unknown};
    bool stopped = false;
    try {
      StopAt stop(http, std::chrono::steady_clock::now() + per_try, cancel_);
      res = http.Post(path, body, "application/json");
      stopped = stop.fired();
    } catch (const std::system_error& thread_error) {
      // No thread for the deadline (RLIMIT_NPROC, a cgroup's pids limit): an error for the call,
      // not std::terminate in the SDK's map refresher or keeper, or lockd's campaign.
      return Error(ErrorCode::kResource, "etcd " + path + ": cannot start a thread (" +
                                             std::string(thread_error.what()) + ")");
    }
    std::string why;
    if (stopped && (!res || res->status != 200)) {
      why = cancelled() ? std::string("cancelled (its owner is closing)")
                        : "no complete answer within " + std::to_string(us / 1000) + " ms";
    } else if (!res) {
      why = httplib::to_string(res.error());
      if (res.error() == httplib::Error::SSLServerVerification) {
        why += " (etcd's certificate did not verify: " +
               std::string(X509_verify_cert_error_string(http.get_openssl_verify_result())) +
               "; check etcd_ca_file)";
      } else if (res.error() == httplib::Error::SSLConnection) {
        why += " (the TLS handshake failed: does etcd want a client certificate?)";
      }
    } else if (res->status != 200) {
      why = "HTTP " + std::to_string(res->status);
      // etcd's gateway explains: {"error": "...", "code": N}
      json j = json::parse(res->body, nullptr, false);
      if (j.is_object() && j.contains("error") && j["error"].is_string()) {
        why += ": " + j["error"].get<std::string>();
      }
    } else if (!IsEtcdReply(res->body)) {
      // A 200 that is no etcd reply (a proxy's page, say) is this member's failure: taken as an
      // answer, it made the member the preferred one, and every later call failed to parse there
      // without trying another (found by review, 2026-12-06).
      why = "HTTP 200 with a reply that is not etcd's (no JSON object with etcd's header)";
    } else {
      MutexLock lk(&mu_);
      preferred_ = i;
      return std::move(res->body);
    }
    errors += (errors.empty() ? "" : "; ") + e.url + ": " + why;
  }
  return Error(ErrorCode::kConnection, "etcd " + path + " failed: " + errors);
}

Result<std::optional<KeyValue>> Client::Get(std::string_view key, Ms timeout) {
  const std::string req = json{{"key", B64(key)}}.dump();
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/range", req, timeout));
  RDMALOCK_ASSIGN_OR_RETURN(json j, ParseJson(body));
  return FirstKv(j);
}

Result<std::vector<KeyValue>> Client::GetPrefix(std::string_view prefix, Ms timeout) {
  // range_end: the prefix with its last byte that is not 0xff incremented, the rest dropped
  // ("\0" for an empty prefix: every key).
  std::string end(prefix);
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) {
    end.assign(1, '\0');
  } else {
    end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  }
  const std::string req = json{{"key", B64(prefix)}, {"range_end", B64(end)}}.dump();
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/range", req, timeout));
  RDMALOCK_ASSIGN_OR_RETURN(json j, ParseJson(body));
  std::vector<KeyValue> out;
  auto it = j.find("kvs");
  if (it == j.end() || !it->is_array()) return out;
  for (const json& e : *it) {
    RDMALOCK_ASSIGN_OR_RETURN(KeyValue kv, ToKeyValue(e));
    out.push_back(std::move(kv));
  }
  return out;
}

Status Client::Put(std::string_view key, std::string_view value, int64_t lease, Ms timeout) {
  json req{{"key", B64(key)}, {"value", B64(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/put", req.dump(), timeout));
  return ParseJson(body).status();
}

Status Client::Delete(std::string_view key, Ms timeout) {
  const std::string req = json{{"key", B64(key)}}.dump();
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/deleterange", req, timeout));
  return ParseJson(body).status();
}

Result<bool> Client::CreateIfAbsent(std::string_view key, std::string_view value, int64_t lease,
                                    Ms timeout, std::optional<KeyValue>* existing) {
  json put{{"key", B64(key)}, {"value", B64(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const json req{
      {"compare",
       json::array({{{"target", "CREATE"}, {"key", B64(key)}, {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put", put}}})},
      {"failure", json::array({{{"request_range", {{"key", B64(key)}}}}})}};
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/txn", req.dump(), timeout));
  RDMALOCK_ASSIGN_OR_RETURN(json j, ParseJson(body));
  RDMALOCK_ASSIGN_OR_RETURN(bool succeeded, Bool(j, "succeeded"));
  if (succeeded) return true;
  if (existing != nullptr) {
    existing->reset();
    auto rs = j.find("responses");
    if (rs != j.end() && rs->is_array() && !rs->empty() && rs->front().contains("response_range")) {
      RDMALOCK_ASSIGN_OR_RETURN(*existing, FirstKv(rs->front()["response_range"]));
    }
  }
  return false;
}

Result<bool> Client::CompareAndPut(std::string_view key, int64_t mod_revision,
                                   std::string_view value, Ms timeout) {
  json cmp{{"key", B64(key)}};
  if (mod_revision == 0) {
    cmp["target"] = "CREATE";
    cmp["create_revision"] = "0";
  } else {
    cmp["target"] = "MOD";
    cmp["mod_revision"] = std::to_string(mod_revision);
  }
  const json req{
      {"compare", json::array({cmp})},
      {"success", json::array({{{"request_put", {{"key", B64(key)}, {"value", B64(value)}}}}})}};
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/kv/txn", req.dump(), timeout));
  RDMALOCK_ASSIGN_OR_RETURN(json j, ParseJson(body));
  return Bool(j, "succeeded");
}

Result<Lease> Client::GrantLease(int64_t ttl_s, Ms timeout) {
  const std::string req = json{{"TTL", ttl_s}}.dump();
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/grant", req, timeout));
  RDMALOCK_ASSIGN_OR_RETURN(json j, ParseJson(body));
  Lease l;
  RDMALOCK_ASSIGN_OR_RETURN(l.id, Int(j, "ID"));
  RDMALOCK_ASSIGN_OR_RETURN(l.ttl_s, Int(j, "TTL"));
  if (l.id == 0 || l.ttl_s <= 0) {
    auto why = Str(j, "error");
    return Error(ErrorCode::kProtocol,
                 "etcd granted no lease: " + (why.ok() && !why->empty() ? *why : body));
  }
  return l;
}

Result<int64_t> Client::KeepAlive(int64_t lease, Ms timeout) {
  const std::string req = json{{"ID", std::to_string(lease)}}.dump();
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/keepalive", req, timeout));
  RDMALOCK_ASSIGN_OR_RETURN(json j, ParseJson(body));
  auto it = j.find("result");
  if (it == j.end() || !it->is_object()) {
    return Error(ErrorCode::kProtocol, "etcd's keepalive reply has no result");
  }
  return Int(*it, "TTL");  // absent (0) once the lease has expired
}

Status Client::Revoke(int64_t lease, Ms timeout) {
  const std::string req = json{{"ID", std::to_string(lease)}}.dump();
  RDMALOCK_ASSIGN_OR_RETURN(std::string body, Post("/v3/lease/revoke", req, timeout));
  return ParseJson(body).status();
}

}  // namespace rdmalock::etcd
