/* librdmalock's C API: the rdmalock client SDK for C and for languages that call C (Python's
 * ctypes, Go's cgo, Rust's FFI, ...). It wraps the C++ API in client.h; see there for what locks,
 * sessions, leases and fencing tokens mean.
 *
 *   rdmalock_options_t o;
 *   rdmalock_options_init(&o);
 *   o.server = "192.0.2.1";
 *   rdmalock_client_t* client;
 *   if (rdmalock_connect(&o, &client) != RDMALOCK_OK) {
 *     fprintf(stderr, "%s\n", rdmalock_last_error());
 *     return 1;
 *   }
 *   rdmalock_lock_t* lock;
 *   if (rdmalock_lock(client, "orders/42", RDMALOCK_EXCLUSIVE, 2000, &lock) == RDMALOCK_OK) {
 *     write_to_storage(rdmalock_lock_get_token(lock));
 *     rdmalock_release(lock);
 *     rdmalock_lock_free(lock);
 *   }
 *   rdmalock_close(client);
 *
 * Errors: every function that can fail returns an rdmalock_status_t (RDMALOCK_OK is 0; the other
 * values are those of rdmalock::ErrorCode) and records a message for the calling thread, which
 * rdmalock_last_error() returns. No C++ exception leaves the library.
 *
 * Threads: a client may be shared by any number of threads. A lock handle belongs to one thread at
 * a time (it may be handed to another).
 *
 * ABI: the library is librdmalock.so.0. Structures the caller allocates carry their size in their
 * first field, so that later versions can add fields at the end: rdmalock_options_init is a
 * macro that passes the library the caller's sizeof, so a newer library writes and reads only the
 * fields the caller's header has (and takes the defaults of the rest), and an older library
 * refuses fields it does not know. Everything else is an opaque handle.
 *
 * fork(): a child process inherits its parent's clients and locks but cannot use them (every call
 * on them fails with UNSUPPORTED, accessors return 0 and locks read LOST); freeing them, or the
 * child's exit, leaves the parent's session and locks alone. A child that needs locks connects a
 * client of its own after exec. */
#ifndef RDMALOCK_RDMALOCK_H_
#define RDMALOCK_RDMALOCK_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define RDMALOCK_C_EXPORT __attribute__((visibility("default")))
#else
#define RDMALOCK_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this C interface: bumped when functions or fields are added. 2 added
 * rdmalock_options_init_sized (rdmalock_options_init became a macro over it); 3 added the
 * cluster (rdmalock_cluster_*: a sharded lock space, as the C++ ClusterClient); 4 added
 * rdmalock_options_t.no_local_handover; 5 added rdmalock_options_t.no_fencing_tokens. */
#define RDMALOCK_C_API_VERSION 5

/* Result codes. The same values as rdmalock::ErrorCode in status.h. */
typedef enum rdmalock_status {
  RDMALOCK_OK = 0,
  RDMALOCK_ERR_INVALID_ARGUMENT = 1, /* a NULL or bad argument, an empty name, a bad option */
  RDMALOCK_ERR_TIMEOUT = 2,          /* the deadline passed before the lock was granted */
  RDMALOCK_ERR_BUSY = 3,             /* try_lock found the lock taken */
  RDMALOCK_ERR_LOCK_LOST = 4,        /* the grant is no longer valid (lease lapsed, recovered) */
  RDMALOCK_ERR_NOT_HELD = 5,         /* the handle does not hold the lock (already released) */
  RDMALOCK_ERR_CONNECTION = 6,       /* connecting to or talking to lockd failed */
  RDMALOCK_ERR_REJECTED = 7,         /* lockd refused the handshake (the message says why) */
  RDMALOCK_ERR_PROTOCOL = 8,         /* a peer broke the protocol */
  RDMALOCK_ERR_RESOURCE = 9,         /* out of memory, QPs, sessions or descriptors */
  RDMALOCK_ERR_UNSUPPORTED = 10,     /* the device, the peer or this library lacks a capability */
  RDMALOCK_ERR_IO = 11,              /* a file or system call failed */
  RDMALOCK_ERR_CONFIG = 12,          /* a configuration value is invalid */
  RDMALOCK_ERR_INTERNAL = 13         /* a bug in rdmalock */
} rdmalock_status_t;

/* A mode argument other than these two is refused with RDMALOCK_ERR_INVALID_ARGUMENT.
 * RDMALOCK_MODE_INT_MIN_ and RDMALOCK_MODE_INT_RANGE_ are no modes: they make every int a value of
 * the type, so that the library can check what a C caller passed (in C++ an out-of-range value of
 * an enum without them is undefined behaviour, which clang's -fsanitize=enum reports; a negative
 * one was, until 2026-12-08). */
typedef enum rdmalock_mode {
  RDMALOCK_EXCLUSIVE = 0,
  RDMALOCK_SHARED = 1,
  RDMALOCK_MODE_INT_MIN_ = -0x7fffffff - 1,
  RDMALOCK_MODE_INT_RANGE_ = 0x7fffffff
} rdmalock_mode_t;

typedef enum rdmalock_state {
  RDMALOCK_HELD = 0,     /* granted; as far as this client knows the lease is valid */
  RDMALOCK_RELEASED = 1, /* released by this client */
  RDMALOCK_LOST = 2      /* the lease lapsed or the lock was recovered: stop using the resource */
} rdmalock_state_t;

/* timeout_ms value that waits for ever. */
#define RDMALOCK_WAIT_FOREVER (-1)

typedef struct rdmalock_client_s rdmalock_client_t; /* a session with one lockd */
typedef struct rdmalock_lock_s rdmalock_lock_t;     /* an acquired lock */

/* Fields are only ever added at the end, and a field's zero value is its default where an older
 * caller's struct lacks it. */
typedef struct rdmalock_options {
  size_t struct_size;          /* the caller's sizeof(rdmalock_options_t): rdmalock_options_init */
  const char* server;          /* lockd's address (an IP of its RDMA device, or a name). Required */
  uint16_t port;               /* lockd's rdma_cm port; default 7471 */
  uint32_t connect_timeout_ms; /* default 5000 */
  const char* client_name;     /* shown to operators; NULL: the program's name */
  int auto_renew;      /* nonzero (default): renew held locks in the background every lease/3 */
  int record_requests; /* nonzero (default): lockd frees a dead client's locks at once */
  int reconnect;       /* nonzero (default): start a new session when the session ends */
  /* A file holding the key of a lockd that authenticates clients (its auth_key_file). NULL: the
   * environment's RDMALOCK_AUTH_KEY, else RDMALOCK_AUTH_KEY_FILE, else no key. */
  const char* auth_key_file;
  /* Version 4. 0 (default): threads of this client that want an exclusive lock the client holds
   * or waits for queue in-process, and the holder hands its grant to the next of them without an
   * RDMA operation (at most 8 in a row while another session waits; each holder gets a larger
   * fencing token). Nonzero: every request takes its own ticket from lockd (lockctl bench
   * --no-local-handover; C++ ClientOptions::local_handover = false). (Named for its nonzero
   * value, as every added field's default is zero.) */
  int no_local_handover;
  /* Version 5. 0 (default): exclusive grants carry a fencing token, which costs each exclusive
   * acquire an RDMA READ of the lock's generation in the doorbell of its atomic. Nonzero: no
   * tokens (rdmalock_lock_get_token returns 0), one READ fewer per exclusive acquire; for
   * programs that pass no token to the resources they guard (C++ LockOptions::fencing_token =
   * false, for every lock of this client). On LP64 targets this field lies in version 4's tail
   * padding, so a version 4 library sees the same struct_size and ignores it rather than
   * refusing it: check rdmalock_c_api_version() >= 5 before relying on it. */
  int no_fencing_tokens;
} rdmalock_options_t;

/* Fills the struct_size bytes at *options with the defaults (zero beyond the fields this library
 * knows) and sets options->struct_size = struct_size. Call it, through rdmalock_options_init,
 * before setting fields. Does nothing for NULL or a struct_size smaller than a size_t. */
RDMALOCK_C_EXPORT void rdmalock_options_init_sized(rdmalock_options_t* options, size_t struct_size);
/* The entry point of programs built against C API version 1, whose struct has version 1's
 * fields: it writes exactly those. Source code gets the macro below. */
RDMALOCK_C_EXPORT void rdmalock_options_init(rdmalock_options_t* options);
/* Fills *options with the defaults and sets struct_size to the caller's sizeof(*options). */
#define rdmalock_options_init(options) rdmalock_options_init_sized((options), sizeof(*(options)))

/* Connects to lockd and checks the handshake. On success *out is a client to pass to
 * rdmalock_close(); on failure *out is NULL. The strings in *options are copied. Errors:
 *   INVALID_ARGUMENT  NULL options or out; no server; a server name that does not resolve;
 *                     port 0; connect_timeout_ms 0 (rdmalock_options_init sets the defaults:
 *                     a zero here is not one); struct_size not set by rdmalock_options_init
 *   UNSUPPORTED       options sets fields (beyond struct_size of this library's header) that this
 *                     library does not know
 *   CONNECTION        nothing listens at server:port, or the connection failed
 *   RESOURCE          no RDMA device on this host, or out of QPs or memory; or lockd's
 *                     max_connections_per_session is below the 3 connections a client makes
 *                     at connect (the calling thread's, the keeper's and the reaper's)
 *   REJECTED          lockd refused the handshake (version, too many clients, restart grace,
 *                     authentication failed)
 *   CONFIG            the auth key (file) cannot be read or is shorter than 16 bytes
 * Fields beyond the caller's struct_size (an older header's struct) are not read: they take their
 * defaults. */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_connect(const rdmalock_options_t* options,
                                                     rdmalock_client_t** out);

/* Ends the session and frees the client; lockd frees the locks it still held. Their handles
 * stay valid objects in state LOST (rdmalock_release returns LOCK_LOST) until rdmalock_lock_free.
 * NULL is a no-op. It may be called from a lost callback (on the library's thread, which then
 * finishes by itself once the callback returns); no other call may use the client meanwhile.
 * The locks still held are told they are lost (their callbacks run on this thread, inside this
 * call); a callback that then closes this client does nothing: this call frees it. */
RDMALOCK_C_EXPORT void rdmalock_close(rdmalock_client_t* client);

/* Acquires the lock `name` (its slot is XXH3-64(name) modulo the lock count), waiting up to
 * timeout_ms milliseconds (RDMALOCK_WAIT_FOREVER: no limit; 0: one attempt, as try_lock; one
 * beyond the clock's range, such as INT64_MAX, is no limit either).
 * Exclusive grants carry a fencing token (unless no_fencing_tokens). On success *out is a handle to
 * pass to rdmalock_lock_free(); on failure *out is NULL. Errors: INVALID_ARGUMENT (NULL client,
 * name or out, empty name, a bad mode, timeout_ms < -1), TIMEOUT, BUSY (timeout_ms 0 only),
 * CONNECTION, RESOURCE (this thread has no connection to lockd and cannot get one: lockd's
 * max_connections_per_session is taken, lockd stayed busy with handshakes past the join's
 * retries (to the deadline, and a second at least within connect_timeout_ms: a thread's first
 * call may so take longer than timeout_ms), or no memory; the lock is not taken). */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_lock(rdmalock_client_t* client, const char* name,
                                                  rdmalock_mode_t mode, int64_t timeout_ms,
                                                  rdmalock_lock_t** out);
/* One attempt: BUSY if the lock is held in a conflicting mode. */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_try_lock(rdmalock_client_t* client, const char* name,
                                                      rdmalock_mode_t mode, rdmalock_lock_t** out);
/* As rdmalock_lock, by slot number; INVALID_ARGUMENT if slot is not below the lock count. */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_lock_slot(rdmalock_client_t* client, uint64_t slot,
                                                       rdmalock_mode_t mode, int64_t timeout_ms,
                                                       rdmalock_lock_t** out);

/* Releases the lock; the handle stays allocated (state RELEASED, or LOST on error). Errors:
 * LOCK_LOST (nothing was released: the lease lapsed, the lock was recovered, the session ended or
 * the client was closed), NOT_HELD (already released), CONNECTION (the connection failed: the
 * lock is LOST), RESOURCE (this thread cannot get a connection, as for rdmalock_lock: the lock
 * is LOST, and the client's reaper releases it at lockd while its lease runs). */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_release(rdmalock_lock_t* lock);
/* Waits until the releases this thread posted on `client` have completed. rdmalock_release posts
 * its compare-and-swap and returns without waiting for it unless others were seen queued; another
 * client's try_lock right after may still find the lock taken. A thread that has not locked in
 * the current session (or while the client reconnects) has posted nothing: OK at once, no wait.
 * Errors: INVALID_ARGUMENT (NULL), CONNECTION (reaping this thread's posted releases found the
 * connection failed: the session ends). */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_flush(rdmalock_client_t* client);
/* Extends the lease by one lease period from now (clients renew by themselves unless
 * auto_renew is 0). Errors: NOT_HELD, LOCK_LOST, CONNECTION, RESOURCE (this thread cannot get a
 * connection, as for rdmalock_lock: nothing was renewed, and the lock is still held). */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_renew(rdmalock_lock_t* lock);
/* Releases the lock if it is still held (errors are dropped: call rdmalock_release first to see
 * them) and frees the handle. After it returns the lost callback does not run: a call of it
 * running on another thread (the library's) is waited for, so the caller must not hold anything
 * that callback waits for (a mutex it takes), or both wait for ever. It may be called from the
 * lock's own callback. NULL is a no-op. */
RDMALOCK_C_EXPORT void rdmalock_lock_free(rdmalock_lock_t* lock);

/* Accessors; on NULL the numbers are 0, the mode RDMALOCK_EXCLUSIVE and the state
 * RDMALOCK_RELEASED. */
/* The fencing token of an exclusive grant (0 for shared, or with no_fencing_tokens): epoch:16 |
 * generation:29 | ticket:15 | local:4 (docs/protocol.md section 6). Successive exclusive holders
 * of a lock get strictly larger tokens. */
RDMALOCK_C_EXPORT uint64_t rdmalock_lock_get_token(const rdmalock_lock_t* lock);
RDMALOCK_C_EXPORT uint64_t rdmalock_lock_get_slot(const rdmalock_lock_t* lock);
RDMALOCK_C_EXPORT rdmalock_mode_t rdmalock_lock_get_mode(const rdmalock_lock_t* lock);
RDMALOCK_C_EXPORT rdmalock_state_t rdmalock_lock_get_state(const rdmalock_lock_t* lock);
/* Milliseconds until the lease ends unless renewed (0 if it has ended or the lock is not held). */
RDMALOCK_C_EXPORT int64_t rdmalock_lock_lease_remaining_ms(const rdmalock_lock_t* lock);

/* Called at most once if the lock is found lost while held (its lease could not be renewed, a
 * waiter recovered it, or the session with lockd ended). `code` and `message` say why; the
 * message is valid during the call only. It runs on a library thread or on a thread whose call
 * noticed the loss: keep it short, and do not call rdmalock_release or rdmalock_renew on this lock
 * from it. It may free this lock (rdmalock_lock_free) and close the client (rdmalock_close). It
 * may end its thread (pthread_exit), except inside rdmalock_close or rdmalock_lock_free; on the
 * library's keeper thread the client then renews nothing more (docs/sdk.md). */
typedef void (*rdmalock_lost_fn)(rdmalock_status_t code, const char* message, void* user_data);
/* Sets (or with fn NULL, clears) the lost callback. A lock found lost while no callback was set
 * (before the first, or while cleared) is told to the next one set, at once, on this thread,
 * before this call returns (a NULL fn drops that). Errors: INVALID_ARGUMENT (NULL lock). */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_lock_on_lost(rdmalock_lock_t* lock,
                                                          rdmalock_lost_fn fn, void* user_data);

/* The client's session: lockd's lock count, lease (ms) and the current session id (0 while it
 * reconnects). 0 for NULL. */
RDMALOCK_C_EXPORT uint64_t rdmalock_client_lock_count(const rdmalock_client_t* client);
RDMALOCK_C_EXPORT uint64_t rdmalock_client_lease_ms(const rdmalock_client_t* client);
RDMALOCK_C_EXPORT uint64_t rdmalock_client_session_id(const rdmalock_client_t* client);

/* ---- A cluster: many lockds (shards) behind one handle, as the C++ ClusterClient (cluster.h).
 * A lock name picks its shard by rendezvous hashing over the shard names, then its slot inside
 * that shard as with one lockd. The cluster keeps one session per shard it uses, opened on first
 * use by that caller. Locks it grants are ordinary rdmalock_lock_t handles: release, renew,
 * on_lost, the accessors and rdmalock_lock_free work on them as on a client's.
 *
 *   rdmalock_cluster_options_t co;
 *   rdmalock_cluster_options_init(&co);
 *   co.shard_map_file = "/etc/rdmalock/cluster.yaml";   (or co.etcd_endpoints = "https://...")
 *   rdmalock_cluster_t* cluster;
 *   if (rdmalock_cluster_open(&co, &cluster) != RDMALOCK_OK) { ... rdmalock_last_error() ... }
 *   rdmalock_lock_t* lock;
 *   if (rdmalock_cluster_lock(cluster, "orders/42", RDMALOCK_EXCLUSIVE, 2000, &lock) == 0) { ... }
 *   rdmalock_cluster_close(cluster);
 *
 * Threads: a cluster may be shared by any number of threads; while one shard's session connects,
 * only callers of that shard wait. rdmalock_cluster_close must not run while another thread uses
 * the cluster. fork() and the lock handles' rules are those of a client (above). */
typedef struct rdmalock_cluster_s rdmalock_cluster_t;

/* Exactly one of shard_map_file and etcd_endpoints is set; the etcd_ fields below it are for etcd
 * only (with a map file they are refused). Fields are only ever added at the end, and a field's
 * zero value is its default. */
typedef struct rdmalock_cluster_options {
  size_t struct_size; /* the caller's sizeof: rdmalock_cluster_options_init sets it */
  /* A cluster map file, as `lockctl --cluster FILE` reads it (YAML: shards: - {name, server,
   * port}; docs/operations.md, "Several lock nodes"). Read once, by rdmalock_cluster_open. */
  const char* shard_map_file;
  /* Or a map kept in etcd (lockd's cluster mode): comma-separated http://HOST:PORT or
   * https://HOST:PORT of etcd members; each shard's session goes to the primary etcd names. */
  const char* etcd_endpoints;
  const char* etcd_cluster; /* the cluster's name in etcd; NULL or "": "default" */
  /* For https: etcd's CA (NULL: the system's CAs), and a client certificate and its key (both or
   * neither). PEM files. */
  const char* etcd_ca_file;
  const char* etcd_cert_file;
  const char* etcd_key_file;
  /* Every shard session's options (rdmalock_options_init'd; server and port are ignored: each
   * shard's come from the map). NULL: the defaults. Copied by rdmalock_cluster_open. */
  const rdmalock_options_t* client;
} rdmalock_cluster_options_t;

/* As rdmalock_options_init_sized, for rdmalock_cluster_options_t. */
RDMALOCK_C_EXPORT void rdmalock_cluster_options_init_sized(rdmalock_cluster_options_t* options,
                                                           size_t struct_size);
#define rdmalock_cluster_options_init(options) \
  rdmalock_cluster_options_init_sized((options), sizeof(*(options)))

/* Reads the map (the file, or etcd) and checks it; connects to no shard yet. On success *out is a
 * cluster to pass to rdmalock_cluster_close(); on failure *out is NULL. Errors:
 *   INVALID_ARGUMENT  NULL options or out; struct_size not set by rdmalock_cluster_options_init;
 *                     neither or both of shard_map_file and etcd_endpoints; an empty endpoint;
 *                     one of etcd_cert_file and etcd_key_file without the other;
 *                     shard_map_file with etcd_cluster or an etcd TLS file; bad client
 *                     options (as rdmalock_connect's)
 *   UNSUPPORTED       options (or *client) set fields this library does not know
 *   IO                the map file cannot be read
 *   CONFIG            the map file is not a valid map (the message names file, line and key);
 *                     the map has no shard, or duplicate or empty names; etcd has no map for
 *                     this cluster (lockctl --etcd ... cluster init writes one)
 *   CONNECTION        no etcd member answered
 *   PROTOCOL          etcd holds something that is not a map or a primary's address */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_cluster_open(const rdmalock_cluster_options_t* options,
                                                          rdmalock_cluster_t** out);
/* Ends every shard's session and frees the cluster (as rdmalock_close for each; a lost callback
 * it runs that closes this cluster does nothing). NULL: no-op. */
RDMALOCK_C_EXPORT void rdmalock_cluster_close(rdmalock_cluster_t* cluster);

/* As rdmalock_lock and rdmalock_try_lock, on the shard that owns `name` (whose session is made
 * first if this is that shard's first use: then CONNECTION, RESOURCE or REJECTED as
 * rdmalock_connect's, if the shard cannot be reached). A try (rdmalock_cluster_try_lock, or
 * timeout_ms 0) does not wait while another thread connects that shard: BUSY. */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_cluster_lock(rdmalock_cluster_t* cluster,
                                                          const char* name, rdmalock_mode_t mode,
                                                          int64_t timeout_ms,
                                                          rdmalock_lock_t** out);
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_cluster_try_lock(rdmalock_cluster_t* cluster,
                                                              const char* name,
                                                              rdmalock_mode_t mode,
                                                              rdmalock_lock_t** out);

/* The number of shards in the map in use now (0 for NULL). A map in etcd can change under it. */
RDMALOCK_C_EXPORT uint64_t rdmalock_cluster_shard_count(const rdmalock_cluster_t* cluster);
/* Copies the name of the shard that owns `name` now (NUL-terminated) into buf. Errors:
 * INVALID_ARGUMENT (NULL cluster, name or buf; an empty name; buf_size too small for the name
 * and its NUL: nothing is written then). */
RDMALOCK_C_EXPORT rdmalock_status_t rdmalock_cluster_shard_of(const rdmalock_cluster_t* cluster,
                                                              const char* name, char* buf,
                                                              size_t buf_size);

/* The slot `name` maps to among lock_count slots (0 for NULL name or lock_count 0). */
RDMALOCK_C_EXPORT uint64_t rdmalock_slot_for_name(const char* name, uint64_t lock_count);

/* The message of this thread's last call that returns rdmalock_status_t: "" if it succeeded.
 * Valid until this thread's next such call. Never NULL. */
RDMALOCK_C_EXPORT const char* rdmalock_last_error(void);
/* The name of a code, e.g. "timeout", "busy"; "unknown" for any other int. Static storage. (An
 * int, not an rdmalock_status_t, since 2026-12-08: a value outside the enum's was undefined
 * behaviour in the library's C++; callers pass an rdmalock_status_t as before.) */
RDMALOCK_C_EXPORT const char* rdmalock_error_name(int code);
/* The library's version, e.g. "0.1.0". Static storage. */
RDMALOCK_C_EXPORT const char* rdmalock_version(void);
/* The C API version the library implements (RDMALOCK_C_API_VERSION of its header). */
RDMALOCK_C_EXPORT int rdmalock_c_api_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RDMALOCK_RDMALOCK_H_ */
