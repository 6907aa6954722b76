"""rdmalock for Python: distributed locks over RDMA, through librdmalock's C API (ctypes).

    import rdmalock

    with rdmalock.Client.connect("192.0.2.1") as client:
        with client.lock("orders/42", timeout=2.0) as lock:
            write_to_storage(lock.token)      # released when the block ends
        maybe = client.try_lock("orders/43")  # None if another holder has it
        if maybe is not None:
            maybe.release()

    with rdmalock.Cluster.from_shard_map("/etc/rdmalock/cluster.yaml") as cluster:
        with cluster.lock("orders/42", timeout=2.0) as lock:   # on the name's shard
            write_to_storage(lock.token)

Every failure of a call into the library raises RdmalockError, whose ``code`` is an ErrorCode
(the C API's rdmalock_status_t values); each method's docstring lists the codes it raises. A
Client or a Cluster may be shared between threads; a Lock belongs to one thread at a time.

The library is found, on first use, through:

1. the RDMALOCK_LIBRARY environment variable (a path to librdmalock.so*): only that is tried;
2. librdmalock.so.0 through the dynamic loader (what the librdmalock package installs);
3. the system's library search (ctypes.util.find_library("rdmalock"));
4. in a source checkout only, the build tree next to this package (build/librdmalock.so).

None found raises OSError naming every place tried.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import enum
import itertools
import math
import os
import pathlib
import threading
import weakref
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

__version__ = "0.1.0"  # the project's version (CMakeLists.txt); librdmalock's: library_version()

__all__ = [
    "Client",
    "Cluster",
    "ErrorCode",
    "Lock",
    "LockState",
    "LostCallback",
    "RdmalockError",
    "__version__",
    "library_version",
    "slot_for_name",
]

# The soname of the librdmalock this module speaks to (CMakeLists.txt's SOVERSION).
_SONAME = "librdmalock.so.0"


class ErrorCode(enum.IntEnum):
    """The C API's rdmalock_status_t (and rdmalock::ErrorCode) values."""

    OK = 0
    INVALID_ARGUMENT = 1  # a bad argument, an empty name, a bad option
    TIMEOUT = 2  # the deadline passed before the lock was granted
    BUSY = 3  # one attempt found the lock taken (try_lock returns None for it)
    LOCK_LOST = 4  # the grant is no longer valid (lease lapsed, recovered, session ended)
    NOT_HELD = 5  # the handle does not hold the lock (already released)
    CONNECTION = 6  # connecting to or talking to lockd (or etcd) failed; or a closed object
    REJECTED = 7  # lockd refused the handshake (the message says why)
    PROTOCOL = 8  # a peer broke the protocol
    RESOURCE = 9  # out of memory, QPs, sessions or descriptors; no RDMA device
    UNSUPPORTED = 10  # the device, the peer or the library lacks a capability; after fork()
    IO = 11  # a file or system call failed
    CONFIG = 12  # a configuration value (a key file, a cluster map) is invalid
    INTERNAL = 13  # a bug in rdmalock


class LockState(enum.IntEnum):
    """Where a Lock stands: HELD, RELEASED (by this client) or LOST (stop using the resource)."""

    HELD = 0
    RELEASED = 1
    LOST = 2


_EXCLUSIVE, _SHARED = 0, 1
_WAIT_FOREVER = -1


class RdmalockError(Exception):
    """A failed rdmalock call.

    Attributes: ``code`` (an ErrorCode, or the raw int for a code this module does not know),
    ``name`` (the library's name for it, e.g. "busy") and ``message`` (what went wrong).
    """

    code: Union[ErrorCode, int]
    name: str
    message: str

    def __init__(self, code: int, message: str) -> None:
        try:
            self.code = ErrorCode(code)
        except ValueError:
            self.code = code
        self.name = str(_lib().rdmalock_error_name(code).decode())
        self.message = message
        super().__init__(f"{self.name}: {message}")

    def __reduce__(self) -> Tuple[type, Tuple[int, str], Dict[str, Any]]:
        # Pickled and copied as the call that made it, with its attributes (notes added to it
        # too): Exception's own way calls the class with `args`, the formatted string alone
        # (unpickling failed with a TypeError, so an error raised in a multiprocessing worker
        # never reached its caller as RdmalockError).
        return (type(self), (int(self.code), self.message), self.__dict__)


LostCallback = Callable[[RdmalockError], None]
"""A lost callback: called with the error that says why the lock was lost."""


# ---- the library


class _Options(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("server", ctypes.c_char_p),
        ("port", ctypes.c_uint16),
        ("connect_timeout_ms", ctypes.c_uint32),
        ("client_name", ctypes.c_char_p),
        ("auto_renew", ctypes.c_int),
        ("record_requests", ctypes.c_int),
        ("reconnect", ctypes.c_int),
        ("auth_key_file", ctypes.c_char_p),
        ("no_local_handover", ctypes.c_int),  # C API version 4
        ("no_fencing_tokens", ctypes.c_int),  # C API version 5
    ]


class _ClusterOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("shard_map_file", ctypes.c_char_p),
        ("etcd_endpoints", ctypes.c_char_p),
        ("etcd_cluster", ctypes.c_char_p),
        ("etcd_ca_file", ctypes.c_char_p),
        ("etcd_cert_file", ctypes.c_char_p),
        ("etcd_key_file", ctypes.c_char_p),
        ("client", ctypes.POINTER(_Options)),
    ]


# rdmalock_options_t of C API version 1 (what a library without rdmalock_options_init_sized
# fills): up to auth_key_file, as c_api.cc's kOptionsV1Size.
_OPTIONS_V1_SIZE = _Options.auth_key_file.offset + ctypes.sizeof(ctypes.c_char_p)

_LOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

_loaded: Optional[ctypes.CDLL] = None
_load_lock = threading.Lock()

# Lost callbacks: one C trampoline for every lock, never freed, finds the lock's Python callback
# by the key the library hands back as user_data. (A ctypes callback object per lock would have
# to outlive every call the library makes through it, including the one during which its Lock is
# collected; issue 17, finding 9.) The registry holds a weak reference to the Lock, which holds
# its callback: a callback that refers to its own Lock (the bound method of an object that holds
# the lock) makes a cycle the collector frees, where a strong registry kept the Lock, and so its
# lock, held for ever. _callbacks_lock guards _callbacks; it is never held while a callback runs.
_callbacks: Dict[int, "weakref.ReferenceType[Lock]"] = {}
# Reentrant: a garbage collection on a thread that holds it may run a Lock's finalizer
# (_free_lock), which takes it too (it was a plain Lock, and that thread hung for ever).
_callbacks_lock = threading.RLock()
_callback_keys = itertools.count(1)


def _on_lost(code: int, message: Optional[bytes], key: Optional[int]) -> None:
    # Read without _callbacks_lock (one dict.get is atomic under the GIL). The library calls
    # this holding the lock's gate, and a thread holding _callbacks_lock may be in a collection
    # that frees that same lock, which waits for the gate (from Python 3.12 a collection may run
    # at any call): taking the lock here could deadlock the two.
    ref = _callbacks.get(key) if key is not None else None
    lock = ref() if ref is not None else None  # None once the Lock is being collected
    callback = lock._lost_callback if lock is not None else None
    if callback is not None:
        callback(RdmalockError(code, (message or b"").decode(errors="replace")))


_LOST_TRAMPOLINE = _LOST_FN(_on_lost)


def _after_fork_in_child() -> None:
    # The child has only the thread that forked: a lock another thread held stays held in it.
    # (The C library makes the inherited clients and locks inert; see docs/sdk.md, fork().)
    global _callbacks_lock, _load_lock
    _callbacks_lock = threading.RLock()
    _load_lock = threading.Lock()
    # So do the in-flight counters of the Clients and Clusters: one a parent's thread held at
    # the fork hung every call, and the exit, of the child (found by review, 2026-12-06). No
    # call of the parent's threads is in flight in the child.
    for calls in list(_Calls.every):
        calls._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _candidates() -> List[str]:
    env = os.environ.get("RDMALOCK_LIBRARY")
    if env:
        return [env]  # named explicitly: nothing else is tried
    found = [_SONAME]  # the librdmalock package's, through the loader's own search
    system = ctypes.util.find_library("rdmalock")
    if system and system != _SONAME:
        found.append(system)
    # A source checkout: python/rdmalock/ next to build/ (an installed package has no such tree).
    root = pathlib.Path(__file__).resolve().parents[2]
    in_tree = root / "build" / "librdmalock.so"
    if (root / "CMakeLists.txt").is_file() and in_tree.exists():
        found.append(str(in_tree))
    return found


def _declare(lib: ctypes.CDLL) -> None:
    c_client, c_lock = ctypes.c_void_p, ctypes.c_void_p
    st, u64, i64 = ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
    sigs: Dict[str, Tuple[Any, List[Any]]] = {
        "rdmalock_options_init": (None, [ctypes.POINTER(_Options)]),
        "rdmalock_connect": (st, [ctypes.POINTER(_Options), ctypes.POINTER(c_client)]),
        "rdmalock_close": (None, [c_client]),
        "rdmalock_lock": (st, [c_client, ctypes.c_char_p, ctypes.c_int, i64,
                               ctypes.POINTER(c_lock)]),
        "rdmalock_try_lock": (st, [c_client, ctypes.c_char_p, ctypes.c_int,
                                   ctypes.POINTER(c_lock)]),
        "rdmalock_lock_slot": (st, [c_client, u64, ctypes.c_int, i64, ctypes.POINTER(c_lock)]),
        "rdmalock_flush": (st, [c_client]),
        "rdmalock_release": (st, [c_lock]),
        "rdmalock_renew": (st, [c_lock]),
        "rdmalock_lock_free": (None, [c_lock]),
        "rdmalock_lock_get_token": (u64, [c_lock]),
        "rdmalock_lock_get_slot": (u64, [c_lock]),
        "rdmalock_lock_get_mode": (ctypes.c_int, [c_lock]),
        "rdmalock_lock_get_state": (ctypes.c_int, [c_lock]),
        "rdmalock_lock_lease_remaining_ms": (i64, [c_lock]),
        "rdmalock_lock_on_lost": (st, [c_lock, _LOST_FN, ctypes.c_void_p]),
        "rdmalock_client_lock_count": (u64, [c_client]),
        "rdmalock_client_lease_ms": (u64, [c_client]),
        "rdmalock_client_session_id": (u64, [c_client]),
        "rdmalock_slot_for_name": (u64, [ctypes.c_char_p, u64]),
        "rdmalock_last_error": (ctypes.c_char_p, []),
        "rdmalock_error_name": (ctypes.c_char_p, [ctypes.c_int]),
        "rdmalock_version": (ctypes.c_char_p, []),
        "rdmalock_c_api_version": (ctypes.c_int, []),
    }
    for name, (restype, argtypes) in sigs.items():
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = argtypes
    # C API version 3: the cluster (older libraries lack it; Cluster raises UNSUPPORTED there).
    c_cluster, c_cluster_opts = ctypes.c_void_p, ctypes.POINTER(_ClusterOptions)
    cluster_sigs: Dict[str, Tuple[Any, List[Any]]] = {
        "rdmalock_cluster_options_init_sized": (None, [c_cluster_opts, ctypes.c_size_t]),
        "rdmalock_cluster_open": (st, [c_cluster_opts, ctypes.POINTER(c_cluster)]),
        "rdmalock_cluster_close": (None, [c_cluster]),
        "rdmalock_cluster_lock": (st, [c_cluster, ctypes.c_char_p, ctypes.c_int, i64,
                                       ctypes.POINTER(c_lock)]),
        "rdmalock_cluster_try_lock": (st, [c_cluster, ctypes.c_char_p, ctypes.c_int,
                                           ctypes.POINTER(c_lock)]),
        "rdmalock_cluster_shard_count": (u64, [c_cluster]),
        "rdmalock_cluster_shard_of": (st, [c_cluster, ctypes.c_char_p, ctypes.c_char_p,
                                           ctypes.c_size_t]),
    }
    for name, (restype, argtypes) in cluster_sigs.items():
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = restype
            f.argtypes = argtypes
    # C API version 2: the options carry the caller's size (older libraries lack it).
    sized = getattr(lib, "rdmalock_options_init_sized", None)
    if sized is not None:
        sized.restype = None
        sized.argtypes = [ctypes.POINTER(_Options), ctypes.c_size_t]


def _lib() -> ctypes.CDLL:
    """The loaded librdmalock (loaded on first use). Raises OSError if none is found."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _load_lock:
        if _loaded is None:
            errors = []
            for path in _candidates():
                try:
                    lib = ctypes.CDLL(path)
                except OSError as e:
                    errors.append(f"{path}: {e}")
                    continue
                _declare(lib)
                if lib.rdmalock_c_api_version() < 1:
                    errors.append(f"{path}: C API version {lib.rdmalock_c_api_version()} < 1")
                    continue
                _loaded = lib
                break
            else:
                raise OSError("librdmalock not found (install the librdmalock package, or set "
                              "RDMALOCK_LIBRARY to its path); tried " + "; ".join(errors))
    return _loaded


def _check(status: int) -> None:
    if status != 0:
        raise RdmalockError(status, _lib().rdmalock_last_error().decode(errors="replace"))


_INT64_MAX = 2**63 - 1


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None or timeout == math.inf:
        return _WAIT_FOREVER
    if timeout != timeout:  # NaN (math.isnan raised OverflowError for an int past float's range)
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT, f"timeout {timeout} is not a number")
    if timeout < 0:
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT, f"timeout {timeout} is negative")
    # ctypes would wrap a value beyond int64 silently (sys.maxsize seconds came out negative);
    # anything that large is as good as no limit, and the library waits without one (checked
    # before the product, which past 1.8e305 s is inf and cannot be rounded). A positive timeout
    # is at least 1 ms: 0 is a single try (BUSY), not a wait.
    if timeout >= _INT64_MAX / 1000:
        return _INT64_MAX
    ms = min(int(round(timeout * 1000)), _INT64_MAX)
    return 1 if ms == 0 and timeout > 0 else ms


def _options() -> _Options:
    """An _Options with the library's defaults and this module's own struct size (issue 17,
    finding 8: a newer library reads only the fields this module has)."""
    lib = _lib()
    o = _Options()
    if hasattr(lib, "rdmalock_options_init_sized"):
        lib.rdmalock_options_init_sized(ctypes.byref(o), ctypes.sizeof(o))
    else:
        # C API version 1: it fills version 1's fields, and struct_size says so; a later field
        # set here would be ignored by that library, so _client_options refuses it.
        lib.rdmalock_options_init(ctypes.byref(o))
        o.struct_size = _OPTIONS_V1_SIZE
    return o


def _client_options(server: Optional[str], port: int, connect_timeout: float = 5.0,
                    client_name: Optional[str] = None, auto_renew: bool = True,
                    record_requests: bool = True, reconnect: bool = True,
                    auth_key_file: Optional[str] = None,
                    local_handover: bool = True, fencing_tokens: bool = True) -> _Options:
    """The options of a session (a Client's, or each shard's of a Cluster, whose server is None).
    Raises RdmalockError(INVALID_ARGUMENT) for a port out of range or a timeout of 0 or less."""
    o = _options()
    o.server = _c_str(server, "server") if server else None
    o.port = _c_uint(port, "port", 16)
    # A uint32 of milliseconds: ctypes would wrap a larger value (4294967.296 s was 0, the
    # library's default), and inf and nan are no number of milliseconds.
    # (NaN is the value not equal to itself: math.isnan raised OverflowError for a huge int.)
    # 0 is refused here too, by the argument's name (the library would name its C field).
    if connect_timeout != connect_timeout or not 0 < connect_timeout <= 0xFFFFFFFF / 1000:
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                            f"connect_timeout {connect_timeout} is not above 0 and at most "
                            f"{0xFFFFFFFF / 1000} seconds")
    ms = int(round(connect_timeout * 1000))
    o.connect_timeout_ms = max(ms, 1)  # above 0 but under half a millisecond: 1 ms, not 0
    o.client_name = _c_str(client_name, "client_name") if client_name else None
    o.auto_renew = int(auto_renew)
    o.record_requests = int(record_requests)
    o.reconnect = int(reconnect)
    o.auth_key_file = _c_path(auth_key_file, "auth_key_file") if auth_key_file else None
    # Zero (the field's default) unless turned off: a librdmalock older than C API version 4
    # refuses a field it does not know only when it is set.
    o.no_local_handover = 0 if local_handover else 1
    o.no_fencing_tokens = 0 if fencing_tokens else 1  # likewise, C API version 5
    # Set only where the library reads it: its struct_size covers the field (a version 1
    # library's does not) and its C API version has it (version 5's no_fencing_tokens lies in
    # version 4's tail padding, which a version 4 library ignores without a word).
    version = _lib().rdmalock_c_api_version()
    for field, wanted, since in (("no_local_handover", not local_handover, 4),
                                 ("no_fencing_tokens", not fencing_tokens, 5)):
        end = getattr(_Options, field).offset + ctypes.sizeof(ctypes.c_int)
        if wanted and (o.struct_size < end or version < since):
            raise RdmalockError(ErrorCode.UNSUPPORTED,
                                f"{field}: librdmalock (C API version {version}) is older than "
                                f"this option (version {since})")
    return o


def _c_str(value: object, what: str) -> bytes:
    """A str option for a char* field: UTF-8, without a NUL (ctypes stores the bytes as they are,
    and the library would read them only up to the NUL: another value than the one given)."""
    if not isinstance(value, str):
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                            f"{what} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                            f"{what} {value!r} contains a NUL character")
    try:
        return value.encode()
    except UnicodeEncodeError as e:
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                            f"{what} {value!r} cannot be encoded as UTF-8 ({e.reason})") from None


def _c_path(value: object, what: str) -> bytes:
    """A file name for a char* field: a str (os.fsencode: names that are not UTF-8 too), bytes or
    os.PathLike, without a NUL (as _c_str)."""
    try:
        encoded = os.fsencode(value)  # type: ignore[arg-type]
    except TypeError:
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                            f"{what} must be a path, not {type(value).__name__}") from None
    if b"\0" in encoded:
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                            f"{what} {value!r} contains a NUL character")
    return encoded


def _c_uint(value: object, what: str, bits: int) -> int:
    """An int for a C unsigned integer of `bits` bits (bool aside): ctypes refuses a float with an
    error that names no parameter, and wraps an int out of the type's range without a word."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                            f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value < 2**bits:
        raise RdmalockError(ErrorCode.INVALID_ARGUMENT, f"{what} {value} is out of range")
    return value


def _check_name(name: object) -> bytes:
    # The library takes NUL-terminated names: one with a NUL would be cut short there, and name
    # another lock; a lone surrogate (os.fsdecode of non-UTF-8 bytes) cannot be encoded.
    return _c_str(name, "lock name")


def _free_lock(handle: ctypes.c_void_p, key: int, owners: Dict[int, Any]) -> None:
    # A handle means the library is loaded: a finalizer run by a collection inside _lib()'s first
    # load (a NULL handle's, which frees nothing) must not wait for that load's lock.
    if _Exit.threads_alive:
        return  # at exit with another thread running: left to the process's end (_Exit)
    if handle.value is not None:
        _lib().rdmalock_lock_free(handle)  # after it returns the library never calls back for it
    owners.pop(key, None)
    with _callbacks_lock:
        _callbacks.pop(key, None)


class _Calls:
    """The calls in flight on one Client or Cluster. At exit its finalizer closes it only when
    none is (a daemon thread waiting in lock(), say): closing it under such a call waited for the
    call, until lockd fenced the session, then freed the client while the call still used it.
    (A collection never finds one in flight: a call holds its object.)"""

    every: "weakref.WeakSet[_Calls]" = weakref.WeakSet()  # for the fork handler

    def __init__(self) -> None:
        # Reentrant: a signal handler or a finalizer that closes the client may run on a thread
        # that is inside __enter__ or __exit__ here.
        self._mu = threading.RLock()
        self._n = 0
        self._then: Optional[Callable[[], None]] = None  # a close() that came during calls
        _Calls.every.add(self)

    def _after_fork(self) -> None:
        self._mu = threading.RLock()
        self._n = 0
        self._then = None

    def __enter__(self) -> None:
        with self._mu:
            self._n += 1

    def __exit__(self, *exc: object) -> None:
        then = None
        with self._mu:
            self._n -= 1
            if self._n == 0:
                then, self._then = self._then, None
        if then is not None:
            then()

    def when_idle(self, fn: Callable[[], None]) -> None:
        """Runs ``fn`` now if no call is in flight, else as the last one returns (close():
        freeing the client under another thread's call let that call use freed memory; found by
        review, 2026-12-06). The caller has made new calls fail first (its finalizer detached)."""
        with self._mu:
            if self._n > 0:
                self._then = fn
                return
        fn()

    def idle(self) -> bool:
        with self._mu:
            return self._n == 0


def _close_when_idle(close: Callable[[ctypes.c_void_p], None], handle: ctypes.c_void_p,
                     calls: _Calls, locks: Dict[int, Any]) -> None:
    # Left to the process's end when a call is in flight (only at exit) or when another thread
    # runs on at exit (_Exit): lockd sees the connections go, and frees what the session's
    # record shows.
    if calls.idle() and not _Exit.threads_alive:
        # Its Locks' finalizers first (each frees its handle, releasing a lock still held), as a
        # Lock collected alone is: a Lock collected in one cycle with its client (an object that
        # holds both, and a lost callback that refers to it) had its finalizer run in the
        # collector's order, after the client's close, and nothing was released (found by
        # review, 2026-12-06). dict.copy is one step under the GIL; a finalizer runs once.
        for free in locks.copy().values():
            free()
        close(handle)


class _Exit:
    """At exit, weakref.finalize's own exit handler runs the finalizers still alive (a Lock's
    frees its handle, so releases a held lock; a Client's closes it, which ends its session and
    so frees its locks), and only after the exit handlers does the interpreter stop its daemon
    threads. A lock a daemon thread held was released while that thread still ran in its
    critical section, and another process was granted it beside that thread (found by review,
    2026-12-06). _at_exit, registered after weakref's handler and so run before it, looks whether
    any thread but the exiting one still runs; if one does, the finalizers leave every lock and
    client to the process's end, where lockd sees the connections go and frees what the
    sessions' records show (at once; a waiter recovers an unrecorded lock after F x L)."""

    threads_alive = False  # set once, at exit
    registered = False


def _at_exit() -> None:
    me = threading.current_thread()
    # A _DummyThread is one the library started (its keeper, running a lost callback): never an
    # application's critical section, and never marked ended.
    dummy = getattr(threading, "_DummyThread", ())
    _Exit.threads_alive = any(t is not me and t.is_alive() and not isinstance(t, dummy)
                              for t in threading.enumerate())


def _watch_exit() -> None:
    # After a weakref.finalize is made: weakref registers its exit handler with the first one,
    # and exit handlers run last registered first. Two threads may both register it: harmless.
    if not _Exit.registered:
        _Exit.registered = True
        atexit.register(_at_exit)


def library_version() -> str:
    """librdmalock's version, e.g. "0.1.0". Raises OSError if the library cannot be loaded."""
    return str(_lib().rdmalock_version().decode())


def slot_for_name(name: str, lock_count: int) -> int:
    """The slot ``name`` maps to among ``lock_count`` slots (XXH3-64 modulo the count; 0 for a
    count of 0). Raises RdmalockError(INVALID_ARGUMENT) for a name lock() refuses (not a str, or
    with a NUL character) or a count outside 0 .. 2^64 - 1, OSError if the library cannot be
    loaded."""
    encoded = _check_name(name)  # a NUL would cut the name short: another lock's slot
    count = _c_uint(lock_count, "lock_count", 64)  # a uint64: ctypes would wrap -1 to 2^64 - 1
    return int(_lib().rdmalock_slot_for_name(encoded, count))


# ---- the API


class Lock:
    """An acquired lock. Use it as a context manager (released when the block ends), or call
    release(). The handle is freed by close() or when the object is collected; a lock still held
    then is released. A Lock keeps its Client (or Cluster) alive (issue 17, finding 10): the
    session lasts at least as long as the locks it granted, unless the client is closed.

    The accessors (token, slot, state, ...) raise RdmalockError(INVALID_ARGUMENT) once the handle
    is closed, and nothing else."""

    name: Optional[str]

    def __init__(self, handle: Optional[int], name: Optional[str],
                 client: Union[Client, Cluster]) -> None:
        self._handle = ctypes.c_void_p(handle)
        self.name = name
        self._client: Optional[Union[Client, Cluster]] = client
        self._key = next(_callback_keys)  # this lock's entry in _callbacks and client._locks
        self._lost_callback: Optional[LostCallback] = None
        # Runs before the Lock's attributes go (so before its reference to the client): the
        # handle is freed while the session is still there. The client's own finalizer runs it
        # first too (client._locks), whatever order a collection takes.
        owners: Dict[int, Any] = client._locks if client is not None else {}
        self._finalizer = weakref.finalize(self, _free_lock, self._handle, self._key, owners)
        owners[self._key] = self._finalizer

    def _h(self) -> ctypes.c_void_p:
        if not self._finalizer.alive:
            raise RdmalockError(ErrorCode.INVALID_ARGUMENT, "lock handle was closed")
        return self._handle

    def release(self) -> None:
        """Releases the lock. Raises RdmalockError: LOCK_LOST (it was lost, or its client was
        closed or its session ended: nothing released), NOT_HELD (already released),
        INVALID_ARGUMENT (the handle was closed), UNSUPPORTED (inherited across fork())."""
        _check(_lib().rdmalock_release(self._h()))

    def renew(self) -> None:
        """Extends the lease by one lease period (the client also renews in the background).
        Raises RdmalockError: NOT_HELD, LOCK_LOST (also once its client was closed), CONNECTION
        (the connection to lockd failed), INVALID_ARGUMENT (closed handle), UNSUPPORTED
        (inherited across fork())."""
        _check(_lib().rdmalock_renew(self._h()))

    def close(self) -> None:
        """Frees the handle, releasing the lock if still held (errors dropped: call release()
        first to see them). Idempotent; raises nothing."""
        self._finalizer()
        self._client = None

    @property
    def token(self) -> int:
        """The fencing token of an exclusive grant (0 for shared): larger for every later
        exclusive holder (of the same lockd; a Cluster's tokens are per shard)."""
        return int(_lib().rdmalock_lock_get_token(self._h()))

    @property
    def slot(self) -> int:
        """The lock's slot in its lockd's table."""
        return int(_lib().rdmalock_lock_get_slot(self._h()))

    @property
    def shared(self) -> bool:
        """True for a shared grant, False for an exclusive one."""
        return bool(_lib().rdmalock_lock_get_mode(self._h()) == _SHARED)

    @property
    def mode(self) -> str:
        """"exclusive" or "shared"."""
        return "shared" if self.shared else "exclusive"

    @property
    def state(self) -> LockState:
        """HELD, RELEASED or LOST."""
        return LockState(_lib().rdmalock_lock_get_state(self._h()))

    @property
    def held(self) -> bool:
        """state == HELD."""
        return self.state == LockState.HELD

    @property
    def lease_remaining(self) -> float:
        """Seconds until the lease ends unless renewed (0.0 if not held)."""
        return float(_lib().rdmalock_lock_lease_remaining_ms(self._h())) / 1000.0

    def on_lost(self, callback: Optional[LostCallback]) -> None:
        """Calls ``callback(error)`` at most once if the lock is lost while held (on a library
        thread, or inside the call that noticed the loss or ended the session, such as
        ``client.close()``, on the thread that made it: keep it short, take no lock that thread
        may hold, and do not release or renew this lock from it); a lock lost before any
        callback was set is told at once, on this thread. None clears it.
        Raises RdmalockError: INVALID_ARGUMENT (closed handle, or a callback that is not
        callable), UNSUPPORTED (inherited across fork())."""
        if callback is not None and not callable(callback):
            # Else its TypeError would be raised in ctypes' trampoline at the loss, printed as
            # "Exception ignored", and the loss told to no one.
            raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                                f"callback must be callable, not {type(callback).__name__}")
        handle = self._h()
        if callback is None:
            # _LOST_FN() is a NULL function pointer (typeshed lacks the no-argument form).
            null_fn = _LOST_FN()  # type: ignore[call-overload]
            _check(_lib().rdmalock_lock_on_lost(handle, null_fn, None))
            with _callbacks_lock:
                _callbacks.pop(self._key, None)
            self._lost_callback = None
            return
        self._lost_callback = callback
        ref = weakref.ref(self)  # made before the lock is taken: an allocation may collect
        with _callbacks_lock:
            _callbacks[self._key] = ref
        try:
            _check(_lib().rdmalock_lock_on_lost(handle, _LOST_TRAMPOLINE, self._key))
        except RdmalockError:
            with _callbacks_lock:
                _callbacks.pop(self._key, None)
            self._lost_callback = None
            raise

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        # Release unless already released. Losing the lock inside the block matters: raise it,
        # unless the block is failing anyway. The handle stays readable (state, token).
        if self._finalizer.alive and self.state != LockState.RELEASED:
            try:
                self.release()
            except RdmalockError:
                if exc_type is None:
                    raise

    def __repr__(self) -> str:
        if not self._finalizer.alive:
            return f"<rdmalock.Lock {self.name!r} closed>"
        return (f"<rdmalock.Lock {self.name!r} slot={self.slot} {self.mode} "
                f"{self.state.name.lower()} token={self.token:#x}>")


class Client:
    """A session with one lockd. Connects on construction; close() (or the end of a with-block)
    ends the session, and lockd frees the locks it still held. Threads may share a Client; a
    close() while another thread's call is in flight ends the session as that call returns (see
    close()). Its Locks keep it alive; a lost callback may
    close it or drop the last references to it. After os.fork(), the child's copy refuses every
    call (UNSUPPORTED) and leaves the parent's session alone. A closed Client raises
    RdmalockError(CONNECTION) from every call but close()."""

    server: str
    port: int

    def __init__(self, server: str, port: int = 7471, connect_timeout: float = 5.0,
                 client_name: Optional[str] = None, auto_renew: bool = True,
                 record_requests: bool = True, reconnect: bool = True,
                 auth_key_file: Optional[str] = None,
                 local_handover: bool = True, fencing_tokens: bool = True) -> None:
        """Connects to lockd, as connect(). Raises RdmalockError: INVALID_ARGUMENT (no server, a
        name that does not resolve, a port of 0 or out of range, a connect_timeout of 0 or
        less), CONNECTION (nothing listens, or the connection failed), RESOURCE (no RDMA device,
        out of QPs or memory), REJECTED (lockd refused the handshake: version, too many
        clients, restart grace, authentication), CONFIG (the auth key file cannot be read or is
        too short). Raises OSError if librdmalock cannot be loaded."""
        lib = _lib()
        o = _client_options(server, port, connect_timeout, client_name, auto_renew,
                            record_requests, reconnect, auth_key_file, local_handover,
                            fencing_tokens)
        # The finalizer first, on the handle the call fills in: an interrupt (Ctrl-C) that lands
        # as the call returns leaves no session unclosed.
        self._handle = ctypes.c_void_p()
        self._calls = _Calls()
        # The finalizers of this client's Locks not freed yet, by key (Lock, _close_when_idle).
        self._locks: Dict[int, Any] = {}
        self.server, self.port = server, port
        self._finalizer = weakref.finalize(self, _close_when_idle, lib.rdmalock_close,
                                           self._handle, self._calls, self._locks)
        _watch_exit()
        _check(lib.rdmalock_connect(ctypes.byref(o), ctypes.byref(self._handle)))

    @classmethod
    def connect(cls, server: str, port: int = 7471, *, connect_timeout: float = 5.0,
                client_name: Optional[str] = None, auto_renew: bool = True,
                record_requests: bool = True, reconnect: bool = True,
                auth_key_file: Optional[str] = None,
                local_handover: bool = True, fencing_tokens: bool = True) -> Client:
        """Connects to lockd at ``server`` (an IP of its RDMA device, or a name) and ``port``.
        connect_timeout (seconds), client_name (shown to operators), auto_renew (renew held
        locks every lease/3), record_requests (lockd frees a dead client's locks at once),
        reconnect (a new session when the session ends), auth_key_file (else
        $RDMALOCK_AUTH_KEY / $RDMALOCK_AUTH_KEY_FILE), local_handover (threads of this client
        that want an exclusive lock it holds or waits for are handed the grant in-process;
        False: each request takes its own ticket from lockd; UNSUPPORTED from a librdmalock
        older than C API version 4), fencing_tokens (exclusive grants carry a token, which costs
        each exclusive acquire an RDMA READ in its atomic's doorbell; False: Lock.token is 0 and
        that READ is not made, for programs that pass no token to what they guard; UNSUPPORTED
        from a librdmalock older than C API version 5). Raises RdmalockError: INVALID_ARGUMENT
        (no server, a name that does not resolve, a port of 0 or out of range, a connect_timeout
        of 0 or less), CONNECTION (nothing listens, or the connection failed), RESOURCE (no RDMA
        device, out of QPs or memory), REJECTED (lockd refused the handshake: version, too many
        clients, restart grace, authentication), CONFIG (the auth key file cannot be read or is
        too short). Raises OSError if librdmalock cannot be loaded."""
        return cls(server, port, connect_timeout=connect_timeout, client_name=client_name,
                   auto_renew=auto_renew, record_requests=record_requests, reconnect=reconnect,
                   auth_key_file=auth_key_file, local_handover=local_handover,
                   fencing_tokens=fencing_tokens)

    def _h(self) -> ctypes.c_void_p:
        if not self._finalizer.alive:
            raise RdmalockError(ErrorCode.CONNECTION, "client is closed")
        return self._handle

    def _acquire(self, name: str, shared: bool, timeout_ms: int) -> Lock:
        encoded = _check_name(name)
        # The Lock first, its handle filled in by the call: an interrupt (Ctrl-C) that lands as
        # a wait is granted drops the Lock, whose finalizer frees the handle and so releases it.
        lock = Lock(None, name, self)
        with self._calls:
            _check(_lib().rdmalock_lock(self._h(), encoded, _SHARED if shared else _EXCLUSIVE,
                                        timeout_ms, ctypes.byref(lock._handle)))
        return lock

    def lock(self, name: str, shared: bool = False, timeout: Optional[float] = None) -> Lock:
        """Acquires ``name``, waiting up to ``timeout`` seconds (None: for ever). Raises
        RdmalockError: TIMEOUT (not granted in time), BUSY (timeout 0, taken),
        INVALID_ARGUMENT (an empty or non-str name, a negative timeout), CONNECTION (the
        connection failed, or the client is closed), UNSUPPORTED (inherited across fork())."""
        return self._acquire(name, shared, _timeout_ms(timeout))

    def try_lock(self, name: str, shared: bool = False) -> Optional[Lock]:
        """One attempt: the Lock, or None if the lock is held in a conflicting mode. Raises
        RdmalockError as lock() does, except BUSY and TIMEOUT."""
        try:
            return self._acquire(name, shared, 0)
        except RdmalockError as e:
            if e.code == ErrorCode.BUSY:
                return None
            raise

    def lock_slot(self, slot: int, shared: bool = False,
                  timeout: Optional[float] = None) -> Lock:
        """As lock(), by slot number (0 .. lock_count - 1). Raises RdmalockError as lock();
        INVALID_ARGUMENT for a slot out of range."""
        _c_uint(slot, "slot", 64)  # a uint64: ctypes would wrap 2^64 + 5 to slot 5
        lock = Lock(None, None, self)  # as _acquire's
        with self._calls:
            _check(_lib().rdmalock_lock_slot(self._h(), slot, _SHARED if shared else _EXCLUSIVE,
                                             _timeout_ms(timeout), ctypes.byref(lock._handle)))
        return lock

    def flush(self) -> None:
        """Waits until this thread's posted releases have completed at lockd. Raises
        RdmalockError: CONNECTION (the connection failed, or the client is closed)."""
        with self._calls:
            _check(_lib().rdmalock_flush(self._h()))

    @property
    def lock_count(self) -> int:
        """lockd's number of locks (slots)."""
        with self._calls:
            return int(_lib().rdmalock_client_lock_count(self._h()))

    @property
    def lease(self) -> float:
        """lockd's lease, in seconds."""
        with self._calls:
            return float(_lib().rdmalock_client_lease_ms(self._h())) / 1000.0

    @property
    def session_id(self) -> int:
        """The current session (0 while reconnecting)."""
        with self._calls:
            return int(_lib().rdmalock_client_session_id(self._h()))

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Ends the session. Idempotent; raises nothing. Locks still held become LOST; lockd
        frees them. Calls after it raise CONNECTION; a call another thread has in flight on this
        client (a lock() waiting, say) goes on, and the session ends as the last such call
        returns, on that thread (a lock() without a timeout keeps it until granted: one waiting
        for a lock this client holds waits for ever, so release those first)."""
        if self._finalizer.detach() is not None:  # no new call from here on
            handle = self._handle
            self._calls.when_idle(lambda: _lib().rdmalock_close(handle))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"session {self.session_id}"
        return f"<rdmalock.Client {self.server}:{self.port} {state}>"


class Cluster:
    """A sharded lock space: many lockds (shards) behind one object, as the C++ ClusterClient.

    A lock name picks its shard by rendezvous hashing over the shard names, then its slot inside
    that shard as with one lockd. The cluster opens a session with a shard the first time it uses
    it (so opening needs no lockd, and a shard's connection errors come from lock()). Threads may
    share a Cluster (a close() during another thread's call: as Client's). Its Locks keep it
    alive.
    Fencing tokens are per shard: tokens of locks on different shards are not comparable. A
    closed Cluster raises RdmalockError(CONNECTION) from every call but close().

        with rdmalock.Cluster.from_shard_map("/etc/rdmalock/cluster.yaml") as cluster:
            with cluster.lock("orders/42", timeout=2.0) as lock:
                write_to_storage(lock.token)
    """

    source: str

    def __init__(self, shard_map: Optional[str] = None,
                 etcd_endpoints: Union[str, Sequence[str], None] = None,
                 etcd_cluster: Optional[str] = None, ca: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None, *,
                 connect_timeout: float = 5.0, client_name: Optional[str] = None,
                 auto_renew: bool = True, record_requests: bool = True, reconnect: bool = True,
                 auth_key_file: Optional[str] = None,
                 local_handover: bool = True, fencing_tokens: bool = True) -> None:
        """Opens a cluster from a map file (``shard_map``) or from etcd (``etcd_endpoints``,
        exactly one of them); prefer from_shard_map() and from_etcd(). The keyword options are
        Client.connect's, for every shard's session. Raises RdmalockError: INVALID_ARGUMENT
        (neither or both sources, an empty endpoint, cert without key or key without cert, a
        connect_timeout of 0 or less), IO (the map file cannot be read), CONFIG (not a valid
        map: the message names file, line and key; no map for this cluster in etcd), CONNECTION
        (no etcd member answered), PROTOCOL (etcd holds something that is not a map), UNSUPPORTED
        (librdmalock older than the cluster API). Raises OSError if librdmalock cannot be
        loaded."""
        lib = _lib()
        if not hasattr(lib, "rdmalock_cluster_open"):
            raise RdmalockError(ErrorCode.UNSUPPORTED,
                                "librdmalock is older than this module (no rdmalock_cluster_open)")
        co = _ClusterOptions()
        lib.rdmalock_cluster_options_init_sized(ctypes.byref(co), ctypes.sizeof(co))
        if isinstance(etcd_endpoints, str):
            etcd_endpoints = [etcd_endpoints]
        endpoints: Optional[str] = None
        # ctypes keeps a reference to each bytes object assigned to a c_char_p field.
        if etcd_endpoints is not None:
            members = []  # any iterable, walked once
            for e in etcd_endpoints:
                m = _c_str(e, "etcd_endpoints member")
                # The library takes them comma-separated: a comma in one would make it two.
                if b"," in m:
                    raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                                        f"etcd_endpoints member {e!r} contains a comma (give "
                                        "each endpoint as its own member)")
                members.append(m)
            if not members:  # C would see "", and say neither source was set
                raise RdmalockError(ErrorCode.INVALID_ARGUMENT,
                                    "etcd_endpoints is empty: give at least one etcd member")
            joined = b",".join(members)
            co.etcd_endpoints = joined
            endpoints = joined.decode()
        co.shard_map_file = _c_path(shard_map, "shard_map") if shard_map is not None else None
        co.etcd_cluster = _c_str(etcd_cluster, "etcd_cluster") if etcd_cluster else None
        co.etcd_ca_file = _c_path(ca, "ca") if ca else None
        co.etcd_cert_file = _c_path(cert, "cert") if cert else None
        co.etcd_key_file = _c_path(key, "key") if key else None
        o = _client_options(None, 0, connect_timeout, client_name, auto_renew, record_requests,
                            reconnect, auth_key_file, local_handover, fencing_tokens)
        co.client = ctypes.pointer(o)
        self._handle = ctypes.c_void_p()  # the finalizer first, as Client's
        self._calls = _Calls()
        self._locks: Dict[int, Any] = {}  # as Client's
        self.source = shard_map if shard_map is not None else (endpoints or "")
        self._finalizer = weakref.finalize(self, _close_when_idle, lib.rdmalock_cluster_close,
                                           self._handle, self._calls, self._locks)
        _watch_exit()
        _check(lib.rdmalock_cluster_open(ctypes.byref(co), ctypes.byref(self._handle)))

    @classmethod
    def from_shard_map(cls, path: str, *, connect_timeout: float = 5.0,
                       client_name: Optional[str] = None, auto_renew: bool = True,
                       record_requests: bool = True, reconnect: bool = True,
                       auth_key_file: Optional[str] = None,
                       local_handover: bool = True, fencing_tokens: bool = True) -> Cluster:
        """Opens the cluster a map file describes (YAML, as ``lockctl --cluster FILE`` reads it:
        ``shards: [{name, server, port}]``), read once, now. The keyword options are
        Client.connect's, for every shard's session. Raises RdmalockError: IO (the file cannot
        be read), CONFIG (not a valid map; the message names file, line and key),
        INVALID_ARGUMENT (a connect_timeout of 0 or less), UNSUPPORTED (librdmalock older than
        the cluster API); OSError if librdmalock cannot be loaded."""
        return cls(shard_map=path, connect_timeout=connect_timeout, client_name=client_name,
                   auto_renew=auto_renew, record_requests=record_requests, reconnect=reconnect,
                   auth_key_file=auth_key_file, local_handover=local_handover,
                   fencing_tokens=fencing_tokens)

    @classmethod
    def from_etcd(cls, endpoints: Union[str, Sequence[str]], cluster: str = "default",
                  ca: Optional[str] = None, cert: Optional[str] = None,
                  key: Optional[str] = None, *, connect_timeout: float = 5.0,
                  client_name: Optional[str] = None, auto_renew: bool = True,
                  record_requests: bool = True, reconnect: bool = True,
                  auth_key_file: Optional[str] = None,
                  local_handover: bool = True, fencing_tokens: bool = True) -> Cluster:
        """Opens a cluster whose map and primaries live in etcd (lockd's cluster mode).
        ``endpoints``: http[s]://HOST:PORT of etcd members (a str or a list); ``cluster``: its
        name in etcd; ``ca``, ``cert``, ``key``: PEM files for https (cert and key both or
        neither). Each shard's session follows the primary etcd names. Raises RdmalockError:
        CONNECTION (no etcd member answered), CONFIG (etcd has no map for this cluster),
        PROTOCOL (etcd holds something that is not a map), INVALID_ARGUMENT (an empty
        endpoint, cert without key or key without cert, a connect_timeout of 0 or less),
        UNSUPPORTED (librdmalock older than the cluster API); OSError if librdmalock cannot be
        loaded."""
        return cls(etcd_endpoints=endpoints, etcd_cluster=cluster, ca=ca, cert=cert, key=key,
                   connect_timeout=connect_timeout, client_name=client_name,
                   auto_renew=auto_renew, record_requests=record_requests, reconnect=reconnect,
                   auth_key_file=auth_key_file, local_handover=local_handover,
                   fencing_tokens=fencing_tokens)

    def _h(self) -> ctypes.c_void_p:
        if not self._finalizer.alive:
            raise RdmalockError(ErrorCode.CONNECTION, "cluster is closed")
        return self._handle

    def _acquire(self, name: str, shared: bool, timeout_ms: int) -> Lock:
        encoded = _check_name(name)
        lock = Lock(None, name, self)  # as Client._acquire's
        mode = _SHARED if shared else _EXCLUSIVE
        with self._calls:
            if timeout_ms == 0:
                _check(_lib().rdmalock_cluster_try_lock(self._h(), encoded, mode,
                                                        ctypes.byref(lock._handle)))
            else:
                _check(_lib().rdmalock_cluster_lock(self._h(), encoded, mode, timeout_ms,
                                                    ctypes.byref(lock._handle)))
        return lock

    def lock(self, name: str, shared: bool = False, timeout: Optional[float] = None) -> Lock:
        """As Client.lock, on the shard that owns ``name``. Raises RdmalockError as
        Client.lock does, and, on that shard's first use, as Client.connect does (CONNECTION,
        RESOURCE, REJECTED, CONFIG)."""
        return self._acquire(name, shared, _timeout_ms(timeout))

    def try_lock(self, name: str, shared: bool = False) -> Optional[Lock]:
        """As Client.try_lock, on the shard that owns ``name``: None if it is taken, or if
        another thread of this Cluster is connecting that shard right now (a try does not wait
        for it: not now, as the C++ and C APIs say). Raises RdmalockError as lock() does, except
        BUSY and TIMEOUT."""
        try:
            return self._acquire(name, shared, 0)
        except RdmalockError as e:
            if e.code == ErrorCode.BUSY:
                return None
            raise

    def shard_of(self, name: str) -> str:
        """The name of the shard that owns ``name`` now (a map in etcd can change). Raises
        RdmalockError: INVALID_ARGUMENT (an empty or non-str name), CONNECTION (closed)."""
        encoded = _check_name(name)
        buf = ctypes.create_string_buffer(256)  # shard names are at most 64 bytes
        with self._calls:
            _check(_lib().rdmalock_cluster_shard_of(self._h(), encoded, buf, len(buf)))
        return buf.value.decode()

    @property
    def shard_count(self) -> int:
        """The number of shards in the map in use now."""
        with self._calls:
            return int(_lib().rdmalock_cluster_shard_count(self._h()))

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Ends every shard's session. Idempotent; raises nothing. Locks still held become
        LOST; their lockds free them. Calls in flight on other threads: as Client.close."""
        if self._finalizer.detach() is not None:  # as Client.close
            handle = self._handle
            self._calls.when_idle(lambda: _lib().rdmalock_cluster_close(handle))

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.shard_count} shards"
        return f"<rdmalock.Cluster {self.source} {state}>"
