// A small etcd v3 client over etcd's JSON gateway (HTTP POST /v3/...), for what rdmalock needs:
// reading and writing keys, leases, and compare-and-swap transactions. Used by lockd (to campaign
// for a shard's primary and keep its lease) and by the SDK (to read the cluster map and a shard's
// primary).
//
// Why the JSON gateway and not gRPC: it is part of every etcd v3 server, needs no generated code
// (etcd's .proto files are not packaged in Debian, and they import gogoproto), and the libraries
// it takes, cpp-httplib and nlohmann-json, are small and already in the tree or header-only. We
// issue a handful of unary calls a second at most, so gRPC's streaming and framing buy nothing.
//
// Every call takes a timeout and tries the endpoints in turn, starting with the one that answered
// last. Errors are kConnection when no endpoint answered (network, timeout, an HTTP error) and
// kProtocol for a reply that is not what etcd sends. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/sync/mutex.h"
#include "rdmalock/status.h"

namespace rdmalock::etcd {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct Lease {
  int64_t id = 0;
  int64_t ttl_s = 0;  // what etcd granted (it raises small TTLs to its minimum)
};

// Checks an endpoint, "http://HOST:PORT" or "https://HOST:PORT" (HOST may be [IPv6]); returns
// host and port.
Result<std::pair<std::string, uint16_t>> ParseEndpoint(std::string_view endpoint);

// TLS for https:// endpoints: the CA that signed etcd's certificate ("" trusts the system's CAs),
// and a client certificate and key for an etcd that requires them (--client-cert-auth): both or
// neither.
struct Tls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

// TLS files apply only to https:// endpoints: with any of them set, an http:// endpoint is a
// kConfig error that names it (its traffic would go in plain text, the files unused).
Status CheckTlsEndpoints(const std::vector<std::string>& endpoints, const Tls& tls);

// What Client::Cancel sets, and what each call's deadline thread (etcd.cc) waits on besides its
// deadline. mu guards cancelled and the deadline threads' own flags; cv is signalled when either
// changes.
struct CallCancel {
  Mutex mu;
  CondVar cv;
  bool cancelled GUARDED_BY(mu) = false;
};

class Client {
 public:
  using Ms = std::chrono::milliseconds;

  // Checks the endpoints (at least one); connects to none yet.
  // Checks the TLS files exist (they are read at each connection).
  static Result<std::unique_ptr<Client>> Create(const std::vector<std::string>& endpoints,
                                                const Tls& tls = {});
  ~Client();

  // The key's current value, or nullopt if there is none.
  Result<std::optional<KeyValue>> Get(std::string_view key, Ms timeout);
  // Every key that starts with `prefix`, in key order.
  Result<std::vector<KeyValue>> GetPrefix(std::string_view prefix, Ms timeout);
  Status Put(std::string_view key, std::string_view value, int64_t lease, Ms timeout);
  Status Delete(std::string_view key, Ms timeout);

  // Creates the key (attached to `lease`, 0 for none) only if it does not exist. Returns true if
  // it did; false if the key exists, and then `*existing` (if given) is what is there.
  Result<bool> CreateIfAbsent(std::string_view key, std::string_view value, int64_t lease,
                              Ms timeout, std::optional<KeyValue>* existing = nullptr);
  // Writes the key only if its mod_revision is still `mod_revision` (0: only if it does not
  // exist). Returns whether it wrote.
  Result<bool> CompareAndPut(std::string_view key, int64_t mod_revision, std::string_view value,
                             Ms timeout);

  // Stops every call in flight (each returns kConnection within a few milliseconds, or, if it is
  // connecting to a member or in its TLS handshake, once that ends: httplib holds the socket's
  // lock through it, at most the call's share of its timeout) and makes every later call fail at
  // once: for an owner that is closing and must not wait out a slow etcd's timeouts
  // (ClusterClient's close). Cannot be undone.
  void Cancel();

  Result<Lease> GrantLease(int64_t ttl_s, Ms timeout);
  // Refreshes the lease; returns its TTL, 0 if it has expired (or never existed).
  Result<int64_t> KeepAlive(int64_t lease, Ms timeout);
  Status Revoke(int64_t lease, Ms timeout);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  struct Endpoint {
    std::string url;
    std::string host;
    uint16_t port;
    bool https;
  };
  Client(std::vector<Endpoint> endpoints, Tls tls);
  // POSTs `body` to `path` on the endpoints in turn; returns the reply body of the first that
  // answers 200.
  Result<std::string> Post(const std::string& path, const std::string& body, Ms timeout);

  std::vector<std::string> endpoints_;
  std::vector<Endpoint> parsed_;
  Tls tls_;
  Mutex mu_;
  size_t preferred_ GUARDED_BY(mu_) = 0;  // the endpoint that answered last: tried first
  CallCancel cancel_;
};

}  // namespace rdmalock::etcd
