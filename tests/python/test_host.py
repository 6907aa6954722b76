"""The Python module without lockd: loading the library, argument checks and error reporting."""

import ctypes

import pytest
import rdmalock
from rdmalock import ErrorCode, RdmalockError


def test_library_loads_and_reports_its_version():
    v = rdmalock.library_version()
    assert v.count(".") == 2 and v.split(".")[0].isdigit()


def test_slot_for_name_is_stable_and_in_range():
    a = rdmalock.slot_for_name("orders/42", 65536)
    assert 0 <= a < 65536
    assert a == rdmalock.slot_for_name("orders/42", 65536)
    assert len({rdmalock.slot_for_name(f"orders/{i}", 65536) for i in range(64)}) > 60


def test_no_server_is_invalid_argument():
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect("")
    assert e.value.code == ErrorCode.INVALID_ARGUMENT
    assert e.value.name == "invalid argument"
    assert "options->server is not set" in e.value.message
    assert str(e.value).startswith("invalid argument: rdmalock_connect: ")


def test_bad_port_and_timeout_are_refused_before_connecting():
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect("192.0.2.1", port=70000)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "port 70000" in e.value.message
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect("192.0.2.1", connect_timeout=-1)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT
    # An int past float's range: refused by name, not an OverflowError from math.isnan.
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect("192.0.2.1", connect_timeout=10**400)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT


def test_unreachable_server_raises_with_a_message():
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect("192.0.2.77", port=7999, connect_timeout=0.3)
    assert e.value.code != ErrorCode.OK
    assert e.value.message.startswith("rdmalock_connect: ")


def test_error_carries_unknown_codes():
    e = RdmalockError(99, "from the future")
    assert e.code == 99 and e.name == "unknown"
    assert RdmalockError(3, "x").code is ErrorCode.BUSY


def test_error_survives_pickling_and_copying():
    # Exception pickling calls the class with ``args``, which held only the formatted string:
    # unpickling failed with a TypeError (no ``message``), so a TIMEOUT raised in a
    # multiprocessing or ProcessPoolExecutor worker never reached its caller as RdmalockError;
    # copy.copy failed the same way (found by review, 2026-12-06).
    import copy
    import pickle
    for e in (RdmalockError(2, "timed out"), RdmalockError(99, "from the future")):
        for back in (pickle.loads(pickle.dumps(e)), copy.copy(e)):
            assert type(back) is RdmalockError
            assert (back.code, back.name, back.message, str(back)) == \
                (e.code, e.name, e.message, str(e))
    assert pickle.loads(pickle.dumps(RdmalockError(2, "m"))).code is ErrorCode.TIMEOUT
    noted = RdmalockError(2, "m")
    noted.shard = "a"  # an attribute the caller added goes along
    assert pickle.loads(pickle.dumps(noted)).shard == "a"


def test_issue17_finding8_the_options_carry_the_module_own_size():
    import ctypes
    o = rdmalock._options()
    assert o.struct_size == ctypes.sizeof(rdmalock._Options)
    assert o.port == 7471 and o.connect_timeout_ms == 5000 and o.auto_renew == 1
    # An older module's shorter struct (without the last field), guard bytes after it: the
    # library writes only within the size it is given, and stamps that size.

    class Short(ctypes.Structure):
        _fields_ = rdmalock._Options._fields_[:-1]

    class Caller(ctypes.Structure):
        _fields_ = [("o", Short), ("guard", ctypes.c_uint64)]

    c = Caller(guard=0xABABABABABABABAB)
    rdmalock._lib().rdmalock_options_init_sized(
        ctypes.cast(ctypes.pointer(c), ctypes.POINTER(rdmalock._Options)), ctypes.sizeof(Short))
    assert c.guard == 0xABABABABABABABAB
    assert c.o.struct_size == ctypes.sizeof(Short) and c.o.port == 7471


def test_local_handover_maps_to_the_c_field():
    # C API version 4's field is named for its nonzero value: zero (on) unless turned off, so that
    # a librdmalock older than version 4 still accepts the module's default options.
    assert rdmalock._client_options("192.0.2.1", 7471).no_local_handover == 0
    assert rdmalock._client_options("192.0.2.1", 7471, local_handover=False).no_local_handover == 1
    assert rdmalock._lib().rdmalock_c_api_version() >= 4


def test_fencing_tokens_maps_to_the_c_field():
    # C API version 5's field, named for its nonzero value as version 4's.
    assert rdmalock._client_options("192.0.2.1", 7471).no_fencing_tokens == 0
    assert rdmalock._client_options("192.0.2.1", 7471, fencing_tokens=False).no_fencing_tokens == 1
    assert rdmalock._lib().rdmalock_c_api_version() >= 5


def _map_file(tmp_path, text):
    p = tmp_path / "cluster.yaml"
    p.write_text(text)
    return str(p)


def test_cluster_from_shard_map_opens_without_lockd_and_routes_names(tmp_path):
    path = _map_file(tmp_path, "shards:\n"
                               "  - {name: shard-a, server: 192.0.2.1}\n"
                               "  - {name: shard-b, server: 192.0.2.2, port: 7472}\n")
    with rdmalock.Cluster.from_shard_map(path, client_name="py-host") as cluster:
        assert cluster.shard_count == 2 and not cluster.closed
        shards = [cluster.shard_of(f"orders/{i}") for i in range(64)]
        assert set(shards) == {"shard-a", "shard-b"}  # both get names (about half each)
        assert shards == [cluster.shard_of(f"orders/{i}") for i in range(64)]  # stable
        assert "2 shards" in repr(cluster)
    assert cluster.closed
    with pytest.raises(RdmalockError) as e:
        cluster.lock("orders/1")
    assert e.value.code == ErrorCode.CONNECTION and "closed" in e.value.message


def test_cluster_shard_map_errors_name_the_problem(tmp_path):
    with pytest.raises(RdmalockError) as e:
        rdmalock.Cluster.from_shard_map(str(tmp_path / "absent.yaml"))
    assert e.value.code == ErrorCode.IO and "absent.yaml" in e.value.message
    bad = _map_file(tmp_path, "shards:\n  - {name: a, server: h}\n  - {name: b, host: h}\n")
    with pytest.raises(RdmalockError) as e:
        rdmalock.Cluster.from_shard_map(bad)
    assert e.value.code == ErrorCode.CONFIG and ":3: key 'host': unknown" in e.value.message
    with pytest.raises(RdmalockError) as e:
        rdmalock.Cluster()
    assert e.value.code == ErrorCode.INVALID_ARGUMENT
    assert "neither shard_map_file nor etcd_endpoints" in e.value.message
    with pytest.raises(RdmalockError) as e:
        rdmalock.Cluster.from_etcd("http://127.0.0.1:1", cert="/x.crt")
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "etcd_key_file" in e.value.message


def test_cluster_from_unreachable_etcd_is_connection():
    with pytest.raises(RdmalockError) as e:
        rdmalock.Cluster.from_etcd(["http://127.0.0.1:1"], cluster="py")
    assert e.value.code == ErrorCode.CONNECTION
    assert e.value.message.startswith("rdmalock_cluster_open: ")


def test_cluster_lock_on_an_unreachable_shard_raises_not_hangs(tmp_path):
    path = _map_file(tmp_path, "shards:\n  - {name: only, server: 192.0.2.77, port: 7999}\n")
    with rdmalock.Cluster.from_shard_map(path, connect_timeout=0.3) as cluster:
        with pytest.raises(RdmalockError) as e:
            cluster.try_lock("orders/1")
        assert e.value.code != ErrorCode.OK and e.value.code != ErrorCode.BUSY
        assert e.value.message.startswith("rdmalock_cluster_try_lock: ")
        with pytest.raises(RdmalockError) as e:
            cluster.lock("orders/1", timeout=-1)
        assert e.value.code == ErrorCode.INVALID_ARGUMENT


def test_timeouts_beyond_int64_milliseconds_wait_forever_and_nan_is_refused():
    # ctypes wraps an int beyond int64 silently: sys.maxsize seconds came to -1000 ms, refused as
    # negative; any timeout past int64 milliseconds is as good as none (the library saturates).
    import math
    import sys
    assert rdmalock._timeout_ms(sys.maxsize) == 2**63 - 1
    assert rdmalock._timeout_ms(1e300) == 2**63 - 1
    # Past float's range in milliseconds, or an int float cannot hold: still no limit, not an
    # OverflowError (1e306 * 1000 is inf, whose round() raised; math.isnan(10**400) raised).
    assert rdmalock._timeout_ms(1e306) == 2**63 - 1
    assert rdmalock._timeout_ms(10**400) == 2**63 - 1
    assert rdmalock._timeout_ms(math.inf) == rdmalock._WAIT_FOREVER
    assert rdmalock._timeout_ms(None) == rdmalock._WAIT_FOREVER
    assert rdmalock._timeout_ms(1.5) == 1500
    with pytest.raises(RdmalockError) as e:
        rdmalock._timeout_ms(math.nan)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "nan" in e.value.message
    with pytest.raises(RdmalockError) as e:
        rdmalock._timeout_ms(-0.5)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT
    with pytest.raises(RdmalockError) as e:
        rdmalock._timeout_ms(-(10**400))
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "negative" in e.value.message


def test_a_name_with_a_nul_is_refused_not_cut_short():
    # The C API takes NUL-terminated names: "a\0b" reached it as "a", another lock than the one
    # asked for (found by review, 2026-12-05).
    with pytest.raises(RdmalockError) as e:
        rdmalock._check_name("a\x00b")
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "NUL" in e.value.message
    assert rdmalock._check_name("a/b") == b"a/b"


def test_on_lost_survives_a_garbage_collection_that_frees_another_lock():
    # Finalizers of Locks in reference cycles run inside whatever allocation starts a collection,
    # and take the module's locks: a finalizer that waited for a lock its own thread held hung
    # that thread for ever (found by review, 2026-12-05). Here: Locks with a NULL handle (no lockd
    # needed), freed while on_lost's first call loads the library under _load_lock; the
    # finalizer asked _lib() for the library, and waited for that lock. In a child process, so
    # that a hang fails the test instead of hanging it.
    import os
    import subprocess
    import sys
    code = """
import faulthandler
faulthandler.dump_traceback_later(50, exit=True)  # where it hung, in the failure's message
import gc
import rdmalock
gc.set_threshold(10)  # collect often: the window is an allocation inside on_lost
for _ in range(20000):
    x = rdmalock.Lock(None, "cyclic", None)
    x.me = x  # garbage only a collection frees
    del x
    try:
        rdmalock.Lock(None, "b", None).on_lost(print)
    except rdmalock.RdmalockError:
        pass
print("churned")
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(rdmalock.__file__))
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("on_lost deadlocked in a garbage collection (no end in 60 s)")
    assert out.returncode == 0, out.stderr
    assert "churned" in out.stdout


def test_python_arguments_out_of_the_c_types_range_are_refused_not_wrapped():
    # ctypes masks an int to the C field's width without a word (found by review, 2026-12-06).
    import math
    # A positive timeout below half a millisecond was rounded to 0: a try (BUSY), not a wait.
    assert rdmalock._timeout_ms(0.0004) == 1
    assert rdmalock._timeout_ms(0.0) == 0
    # connect_timeout is a uint32 of milliseconds: 4294967.296 s was stored as 0.
    for bad in (4294967.296, 1e12, math.inf, math.nan):
        with pytest.raises(RdmalockError) as e:
            rdmalock._client_options("h", 7471, bad)
        assert e.value.code == ErrorCode.INVALID_ARGUMENT, bad
        assert "connect_timeout" in e.value.message
    assert rdmalock._client_options("h", 7471, 0.0004).connect_timeout_ms == 1
    # slot_for_name's count is a uint64: -1 wrapped to 2^64 - 1.
    with pytest.raises(RdmalockError) as e:
        rdmalock.slot_for_name("x", -1)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "lock_count" in e.value.message
    with pytest.raises(RdmalockError) as e:
        rdmalock.slot_for_name("x", 2**64)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT


def test_the_version_1_options_size_is_the_c_api_version_1_struct():
    # rdmalock_options_t of C API version 1 ends with auth_key_file (c_api.cc kOptionsV1Size);
    # the module took its whole struct's size, so with a library too old for
    # rdmalock_options_init_sized it never refused the options that library cannot honour.
    o = rdmalock._Options
    assert rdmalock._OPTIONS_V1_SIZE == o.auth_key_file.offset + ctypes.sizeof(ctypes.c_char_p)
    assert rdmalock._OPTIONS_V1_SIZE < ctypes.sizeof(o)


def test_slot_for_name_refuses_what_lock_refuses():
    # slot_for_name took "a\0b" as "a" (the library reads NUL-terminated names) and said a's
    # slot, while lock() refuses that name; a non-str raised AttributeError (found by review,
    # 2026-12-06). Both are RdmalockError(INVALID_ARGUMENT), as lock() and shard_of() raise.
    with pytest.raises(RdmalockError) as e:
        rdmalock.slot_for_name("a\0b", 1024)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "NUL" in e.value.message
    with pytest.raises(RdmalockError) as e:
        rdmalock.slot_for_name(b"a", 1024)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "str" in e.value.message


def test_a_name_utf8_cannot_encode_is_refused_as_rdmalock_error():
    # A str with a lone surrogate (os.fsdecode of a file name that is not UTF-8) raised
    # UnicodeEncodeError, where docs/sdk.md says every failure raises RdmalockError (found by
    # review, 2026-12-06).
    with pytest.raises(RdmalockError) as e:
        rdmalock.slot_for_name("lock-\udc80", 1024)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT and "UTF-8" in e.value.message


def test_an_option_a_library_would_ignore_is_refused(monkeypatch):
    # no_fencing_tokens (C API 5) lies in version 4's tail padding: a version 4 library sees the
    # same struct_size, reads nothing past no_local_handover, and ignored fencing_tokens=False
    # without a word (found by review, 2026-12-06). The module asks the library's version.
    lib = rdmalock._lib()
    monkeypatch.setattr(lib, "rdmalock_c_api_version", lambda: 4)
    with pytest.raises(RdmalockError) as e:
        rdmalock._client_options("192.0.2.1", 7471, fencing_tokens=False)
    assert e.value.code == ErrorCode.UNSUPPORTED and "no_fencing_tokens" in e.value.message
    assert rdmalock._client_options("192.0.2.1", 7471).no_fencing_tokens == 0  # not asked for
    assert rdmalock._client_options("192.0.2.1", 7471, local_handover=False).no_local_handover == 1
    monkeypatch.setattr(lib, "rdmalock_c_api_version", lambda: 3)
    with pytest.raises(RdmalockError) as e:
        rdmalock._client_options("192.0.2.1", 7471, local_handover=False)
    assert e.value.code == ErrorCode.UNSUPPORTED and "no_local_handover" in e.value.message


_FORK_MID_CALL = r"""
import os, sys, time, rdmalock
cluster = rdmalock.Cluster.from_shard_map(sys.argv[1], connect_timeout=0.3)
# As a thread inside a call on the cluster at the fork: it holds the in-flight counter's mutex
# for a moment (`with self._calls:`), and the child has no thread that would let it go.
cluster._calls._mu.acquire()
pid = os.fork()
if pid == 0:
    try:
        cluster.try_lock("orders/1")
        code = 1
    except rdmalock.RdmalockError:
        code = 0  # refused (an inherited client is inert) or failed: not hung
    sys.exit(code)  # and the exit's finalizers, which look for calls in flight, do not hang
for _ in range(100):  # 10 s
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.waitstatus_to_exitcode(status), flush=True)
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung (killed after 10 s)", flush=True)
cluster._calls._mu.release()
cluster.close()
"""


def test_a_call_in_flight_on_another_thread_at_fork_does_not_hang_the_child(tmp_path):
    # The child inherited each Client's and Cluster's in-flight counter as it was: its mutex,
    # held by a parent's thread at the fork, stayed held for good, so every call on the object
    # in the child, and the child's normal exit (its finalizer waits for no call in flight), hung
    # (found by review, 2026-12-06).
    import os
    import subprocess
    import sys
    path = _map_file(tmp_path, "shards:\n  - {name: only, server: 192.0.2.77, port: 7999}\n")
    python_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "python")
    p = subprocess.run([sys.executable, "-c", _FORK_MID_CALL, path], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=python_dir))
    assert p.returncode == 0 and p.stdout.strip() == "child 0", (p.returncode, p.stdout, p.stderr)


def _refused(call, *words):
    with pytest.raises(RdmalockError) as e:
        call()
    assert e.value.code == ErrorCode.INVALID_ARGUMENT, (e.value.code, e.value.message)
    for w in words:
        assert w in e.value.message, (w, e.value.message)
    return e.value


def test_a_nul_or_an_unencodable_str_in_an_option_is_refused_naming_it(tmp_path):
    # ctypes stores bytes in a char* field without a word about a NUL, so the library read
    # "cluster.yaml\0.bak" as cluster.yaml and "/k\0.old" as /k: another file than the one named
    # (stop 59's review, 2026-12-07). A str UTF-8 cannot encode raised UnicodeEncodeError, not
    # RdmalockError. Each option is now refused, naming it.
    path = _map_file(tmp_path, "shards:\n  - {name: a, server: 192.0.2.1}\n")
    _refused(lambda: rdmalock.Cluster.from_shard_map(path + "\0.bak"), "shard_map", "NUL")
    _refused(lambda: rdmalock._client_options("h", 7471, auth_key_file="/k\0.old"),
             "auth_key_file", "NUL")
    _refused(lambda: rdmalock._client_options("h\0x", 7471), "server", "NUL")
    _refused(lambda: rdmalock._client_options("h", 7471, client_name="a\0b"), "client_name")
    _refused(lambda: rdmalock._client_options("h", 7471, client_name="\udcff"), "client_name",
             "UTF-8")
    _refused(lambda: rdmalock.Cluster.from_etcd("http://127.0.0.1:1\0x"), "etcd_endpoints")
    _refused(lambda: rdmalock.Cluster.from_etcd("http://127.0.0.1:1", cluster="c\0"),
             "etcd_cluster")
    _refused(lambda: rdmalock.Cluster.from_etcd("http://127.0.0.1:1", ca="/ca\0"), "ca")
    # An endpoint with a comma was two endpoints once joined for the library.
    _refused(lambda: rdmalock.Cluster.from_etcd(["http://a:1,http://b:2"]), "etcd_endpoints",
             "comma")
    # A file's name is a path: os.PathLike and names that are not UTF-8 (os.fsencode) are taken,
    # as shard_map's are.
    import pathlib
    o = rdmalock._client_options("h", 7471, auth_key_file=pathlib.Path("/etc/rdmalock/k"))
    assert o.auth_key_file == b"/etc/rdmalock/k"
    assert rdmalock._client_options("h", 7471, auth_key_file="/k\udcff").auth_key_file == b"/k\xff"
    _refused(lambda: rdmalock._client_options("h", 7471, auth_key_file=42), "auth_key_file")


def test_a_number_that_is_no_int_is_refused_naming_it():
    # A float reached ctypes, which raised ctypes.ArgumentError or TypeError naming no parameter
    # (stop 59's review, 2026-12-07).
    _refused(lambda: rdmalock.slot_for_name("x", 1024.0), "lock_count")
    _refused(lambda: rdmalock._client_options("h", 7471.0), "port")
    _refused(lambda: rdmalock._client_options("h", "7471"), "port")


def test_a_map_file_with_etcd_options_is_refused_not_ignored(tmp_path):
    # rdmalock_cluster_open read only the file when shard_map_file was set, and dropped the etcd
    # CA, certificate, key and cluster name without a word (stop 59's review, 2026-12-07); the C
    # API's rule is that an option it cannot honour is refused.
    path = _map_file(tmp_path, "shards:\n  - {name: a, server: 192.0.2.1}\n")
    _refused(lambda: rdmalock.Cluster(shard_map=path, ca="/ca.crt"), "etcd_ca_file")
    _refused(lambda: rdmalock.Cluster(shard_map=path, etcd_cluster="c"), "etcd_cluster")
    _refused(lambda: rdmalock.Cluster(shard_map=path, cert="/c", key="/k"), "etcd_cert_file")


def test_on_lost_refuses_what_it_cannot_call():
    # on_lost(42) was taken: when the lock was lost, the TypeError was raised inside ctypes'
    # trampoline, printed as "Exception ignored", and the loss was told to no one (stop 59's
    # review, 2026-12-07). Checked first, before the handle (here a lock with none).
    class Owner:
        _locks: dict = {}
    lock = rdmalock.Lock(None, None, Owner())
    e = _refused(lambda: lock.on_lost(42), "callback", "callable")
    assert "int" in e.message


def test_an_empty_endpoint_list_is_named_as_such():
    # Cluster(etcd_endpoints=[]) reached C as "" and was refused as "neither shard_map_file nor
    # etcd_endpoints" set, which the caller had set (stop 59's review, 2026-12-07).
    _refused(lambda: rdmalock.Cluster.from_etcd([]), "etcd_endpoints", "empty")
    _refused(lambda: rdmalock.Cluster(etcd_endpoints=()), "etcd_endpoints", "empty")


def test_a_zero_port_or_connect_timeout_is_refused_naming_the_argument():
    # Both reached the C++ library, whose message named its own fields ("ClientOptions::port is
    # 0"), not the caller's (stop 59's review of the C API and this module, 2026-12-07).
    for kwargs, name in (({"port": 0}, "port"), ({"connect_timeout": 0}, "connect_timeout")):
        with pytest.raises(RdmalockError) as e:
            rdmalock.Client.connect("192.0.2.1", **kwargs)
        assert e.value.code == ErrorCode.INVALID_ARGUMENT, kwargs
        assert name in e.value.message and "ClientOptions" not in e.value.message, \
            (kwargs, e.value.message)
