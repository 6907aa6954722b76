"""The Python module against a running lockd (RDMALOCK_SERVER, RDMALOCK_PORT): run by
tests/sdk/run.sh on real verbs."""

import gc
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest
import rdmalock
from rdmalock import ErrorCode, LockState, RdmalockError

_PYTHON_DIR = str(pathlib.Path(__file__).resolve().parents[2] / "python")


@pytest.fixture
def client(lockd):
    server, port = lockd
    with rdmalock.Client.connect(server, port=port, connect_timeout=10, client_name="py-a") as c:
        yield c


@pytest.fixture
def other(lockd):
    server, port = lockd
    with rdmalock.Client.connect(server, port=port, connect_timeout=10, client_name="py-b") as c:
        yield c


def test_connect_gives_a_session(client, other):
    assert client.session_id != 0 and other.session_id != 0
    assert client.session_id != other.session_id
    assert client.lock_count == 1024  # tests/sdk/run.sh: --lock-count 1024
    assert client.lease == 2.0        # and --lease-ms 2000
    assert "session" in repr(client)


def test_context_manager_releases(client, other):
    with client.lock("py/cm", timeout=5) as lock:
        assert lock.held and lock.mode == "exclusive" and not lock.shared
        assert lock.slot == rdmalock.slot_for_name("py/cm", client.lock_count)
        assert 0 < lock.lease_remaining <= 2.0
        assert other.try_lock("py/cm") is None
    assert lock.state == LockState.RELEASED
    client.flush()
    again = other.try_lock("py/cm")
    assert again is not None
    again.release()


def test_try_lock_busy_from_a_second_client(client, other):
    lock = client.lock("py/busy", timeout=5)
    try:
        assert other.try_lock("py/busy") is None
        assert other.try_lock("py/busy", shared=True) is None
        t0 = time.monotonic()
        with pytest.raises(RdmalockError) as e:
            other.lock("py/busy", timeout=0.3)
        assert e.value.code == ErrorCode.TIMEOUT and e.value.name == "timeout"
        assert time.monotonic() - t0 >= 0.29
        assert lock.held
    finally:
        lock.release()


def test_tokens_increase(client, other):
    last = 0
    for i in range(10):
        c = (client, other)[i % 2]
        with c.lock("py/tokens", timeout=5) as lock:
            assert lock.token > last, f"grant {i}: token {lock.token:#x} <= {last:#x}"
            last = lock.token
        c.flush()


def test_shared_locks_coexist(client, other):
    with client.lock("py/shared", shared=True, timeout=5) as a:
        b = other.try_lock("py/shared", shared=True)
        assert b is not None
        with b:
            assert a.shared and b.shared and a.mode == "shared"
            assert a.token == 0 and b.token == 0  # shared grants carry no token
            assert other.try_lock("py/shared") is None  # readers keep a writer out
    client.flush()
    other.flush()
    w = other.try_lock("py/shared")
    assert w is not None
    w.release()


def test_release_twice_and_renew_raise_with_codes(client):
    lock = client.lock("py/twice", timeout=5)
    time.sleep(0.2)
    before = lock.lease_remaining
    lock.renew()
    assert lock.lease_remaining > before
    lock.release()
    with pytest.raises(RdmalockError) as e:
        lock.release()
    assert e.value.code == ErrorCode.NOT_HELD
    with pytest.raises(RdmalockError) as e:
        lock.renew()
    assert e.value.code == ErrorCode.NOT_HELD
    lock.close()
    with pytest.raises(RdmalockError):
        lock.release()  # a closed handle


def test_bad_arguments_raise_invalid_argument(client):
    for call in (lambda: client.lock(""), lambda: client.lock("x", timeout=-1),
                 lambda: client.lock_slot(client.lock_count), lambda: client.lock(None),
                 lambda: client.lock_slot(-1), lambda: client.lock_slot(2**64 + 5)):
        with pytest.raises(RdmalockError) as e:
            call()
        assert e.value.code == ErrorCode.INVALID_ARGUMENT, e.value


def test_lock_slot(client, other):
    with client.lock_slot(5, timeout=5) as lock:
        assert lock.slot == 5
        with pytest.raises(RdmalockError) as e:
            other.lock_slot(5, timeout=0)
        assert e.value.code == ErrorCode.BUSY


def test_unknown_server_raises_with_its_name(lockd):
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect("no-such-host.invalid", connect_timeout=2)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT
    assert "no-such-host.invalid" in e.value.message
    server, port = lockd
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect(server, port=port + 1, connect_timeout=0.5)  # nothing listens
    assert e.value.code == ErrorCode.CONNECTION


def test_closed_client_loses_its_locks(lockd, other):
    server, port = lockd
    c = rdmalock.Client.connect(server, port=port, connect_timeout=10)
    lock = c.lock("py/orphan", timeout=5)
    c.close()
    assert c.closed
    with pytest.raises(RdmalockError) as e:
        c.try_lock("py/orphan")
    assert e.value.code == ErrorCode.CONNECTION
    assert lock.state == LockState.LOST
    with pytest.raises(RdmalockError) as e:
        with lock:
            pass  # the context manager's release reports the lost lock
    assert e.value.code == ErrorCode.LOCK_LOST
    assert lock.state == LockState.LOST
    with other.lock("py/orphan", timeout=3):
        pass


def test_locks_from_threads_exclude_each_other(client):
    inside, overlaps, errors = [0], [0], []
    guard = threading.Lock()

    def worker():
        try:
            for _ in range(20):
                with client.lock("py/threads", timeout=10):
                    with guard:
                        inside[0] += 1
                        if inside[0] > 1:
                            overlaps[0] += 1
                    time.sleep(0.001)
                    with guard:
                        inside[0] -= 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and overlaps[0] == 0


def test_local_handover_option(lockd):
    # A second thread that wants the lock the first holds is handed the grant in-process: its token
    # is the grant's with 1 in the four low bits (protocol.md section 6). With local_handover=False
    # it takes a ticket of its own from lockd: low bits 0, and larger.
    server, port = lockd
    for on in (True, False):
        with rdmalock.Client.connect(server, port=port, connect_timeout=10,
                                     local_handover=on) as c:
            name = f"py/handover-{'on' if on else 'off'}"
            first = c.lock(name, timeout=5)
            t1 = first.token
            assert t1 & 0xF == 0, f"{t1:#x}: a grant from lockd has 0 in the low bits"
            got = {}

            def waiter():
                with c.lock(name, timeout=10) as lock:
                    got["token"] = lock.token

            t = threading.Thread(target=waiter)
            t.start()
            time.sleep(0.3)  # the waiter queues: in-process, or at lockd
            first.release()
            t.join()
            t2 = got["token"]
            if on:
                assert t2 == t1 + 1, f"handed over: {t2:#x} is not {t1:#x} + 1"
            else:
                assert t2 & 0xF == 0 and t2 > t1, f"from lockd: {t2:#x} after {t1:#x}"


def test_fencing_tokens_option(lockd):
    # Exclusive grants carry a token (above 0) by default; with fencing_tokens=False none (0), on
    # the same lock, and shared grants never do.
    server, port = lockd
    for on in (True, False):
        with rdmalock.Client.connect(server, port=port, connect_timeout=10,
                                     fencing_tokens=on) as c:
            for _ in range(2):  # the second: a lock the session took before
                with c.lock("py/token-option", timeout=5) as lock:
                    assert (lock.token != 0) == on, f"fencing_tokens={on}: token {lock.token:#x}"
            with c.lock("py/token-option", shared=True, timeout=5) as lock:
                assert lock.token == 0


def test_on_lost_runs_when_the_session_is_fenced(lockd):
    # lockctl release --force (through lockd's admin socket) fences the holder's session: the
    # client reports the lock lost through the callback, once, and release() says LOCK_LOST.
    import os
    import subprocess

    lockctl, sock = os.environ.get("RDMALOCK_LOCKCTL"), os.environ.get("RDMALOCK_ADMIN_SOCKET")
    if not lockctl or not sock:
        pytest.fail("RDMALOCK_LOCKCTL and RDMALOCK_ADMIN_SOCKET are not set (tests/sdk/run.sh "
                    "sets them)", pytrace=False)
    server, port = lockd
    seen, done = [], threading.Event()

    def lost(err):
        seen.append(err)
        done.set()

    with rdmalock.Client.connect(server, port=port, connect_timeout=10) as c:
        lock = c.lock("py/lost", timeout=5)
        lock.on_lost(lost)
        subprocess.run([lockctl, "--server", server, "--port", str(port), "release",
                        "--admin-socket", sock, "--force", "py/lost"], check=True,
                       stdout=subprocess.DEVNULL)
        assert done.wait(15), "the lost callback did not run within 15 s"
        assert isinstance(seen[0], RdmalockError) and seen[0].code != ErrorCode.OK
        assert lock.state == LockState.LOST
        with pytest.raises(RdmalockError) as e:
            lock.release()
        assert e.value.code == ErrorCode.LOCK_LOST
        time.sleep(0.2)
        assert len(seen) == 1
        lock.close()


def test_authentication_key_from_the_environment_or_a_file(lockd, tmp_path):
    """tests/sdk/run.sh starts lockd with a key; RDMALOCK_AUTH_KEY_FILE names it for every
    client. An explicit auth_key_file wins over the environment."""
    import os
    server, port = lockd
    key_file = os.environ["RDMALOCK_AUTH_KEY_FILE"]
    with rdmalock.Client.connect(server, port=port, connect_timeout=10,
                                 auth_key_file=key_file) as c:
        with c.lock("py/auth", timeout=5) as lock:
            assert lock.held
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-the-key-but-long-enough-0123456789\n")
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect(server, port=port, connect_timeout=10, auth_key_file=str(wrong))
    assert e.value.code == ErrorCode.REJECTED
    assert "authentication failed" in str(e.value)
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect(server, port=port, auth_key_file=str(tmp_path / "missing.key"))
    assert e.value.code == ErrorCode.CONFIG


def test_issue17_finding10_a_lock_keeps_its_client_alive(lockd, other):
    # The only reference to the client is the one the lock keeps: the session must live on.
    server, port = lockd
    lock = rdmalock.Client.connect(server, port=port, connect_timeout=10).lock("py/no-client-ref",
                                                                               timeout=5)
    gc.collect()
    time.sleep(0.5)  # lockd would have freed the lock of a closed session by now
    assert lock.held, lock.state
    assert other.try_lock("py/no-client-ref") is None
    lock.release()
    lock.close()
    del lock
    gc.collect()
    other.flush()
    with other.lock("py/no-client-ref", timeout=5):
        pass


def test_a_lost_callback_that_refers_to_its_lock_does_not_keep_it_held(client, other):
    # Found by review (2026-12-05): the module kept every lost callback in a registry of strong
    # references, so a callback that refers to its own Lock (the bound method of an object that
    # holds the lock, here a default argument) kept the Lock alive for ever: never collected,
    # never freed, held and renewed as long as the client lived. The Lock keeps its callback now,
    # and the registry only a weak reference to the Lock.
    class Worker:
        def __init__(self):
            self.lock = client.lock("py/pinned", timeout=5)
            self.lock.on_lost(self.stop)

        def stop(self, err):
            print(self.lock.name, err)

    worker = Worker()
    del worker
    gc.collect()
    other.flush()
    got = other.lock("py/pinned", timeout=5)  # released when the cycle was collected
    assert got.held
    got.release()


def test_a_lock_collected_with_its_client_in_one_cycle_is_released(lockd, other):
    # Found by review (2026-12-06): an object that holds its own client and a lock whose lost
    # callback is its bound method is one cycle with the client. The collector ran the two
    # finalizers in its own order, the client's (close: the session ends, nothing released)
    # before the lock's, and with requests unrecorded lockd freed the lock only F x L later.
    # The client's finalizer frees its locks' handles first (releasing them), as a lock
    # collected alone is.
    server, port = lockd

    class Worker:
        def __init__(self):
            self.client = rdmalock.Client.connect(server, port=port, connect_timeout=10,
                                                  record_requests=False)
            self.lock = self.client.lock("py/cycle", timeout=5)
            self.lock.on_lost(self.stop)

        def stop(self, err):
            print(self.lock.name, err)

    worker = Worker()
    assert other.try_lock("py/cycle") is None
    del worker
    gc.collect()
    other.flush()
    got = other.try_lock("py/cycle")  # released, not left for lockd to free F x L later
    assert got is not None
    got.release()


def _run_script(script: str, *args: str) -> subprocess.Popen:
    """Runs ``script`` in a Python process of its own, killed after 60 s whatever happens (so a
    hung child fails the test instead of the suite)."""
    p = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=_PYTHON_DIR))
    watchdog = threading.Timer(60, p.kill)
    watchdog.daemon = True
    watchdog.start()
    return p


def _force_release(lockd, name):
    lockctl, sock = os.environ.get("RDMALOCK_LOCKCTL"), os.environ.get("RDMALOCK_ADMIN_SOCKET")
    if not lockctl or not sock:
        pytest.fail("RDMALOCK_LOCKCTL and RDMALOCK_ADMIN_SOCKET are not set (tests/sdk/run.sh "
                    "sets them)", pytrace=False)
    server, port = lockd
    subprocess.run([lockctl, "--server", server, "--port", str(port), "release",
                    "--admin-socket", sock, "--force", name], check=True,
                   stdout=subprocess.DEVNULL)


_GC_IN_CALLBACK = r"""
import sys, threading, rdmalock
server, port = sys.argv[1], int(sys.argv[2])
box, done = {}, threading.Event()
def lost(err):
    box.clear()  # the last references to the lock and its client go, on the library's thread
    done.set()
box["client"] = rdmalock.Client.connect(server, port=port, connect_timeout=10)
box["lock"] = box["client"].lock("py/gc-in-callback", timeout=5)
box["lock"].on_lost(lost)
print("locked", flush=True)
print("lost" if done.wait(15) else "no callback", flush=True)
"""


def test_issue17_finding9_a_loss_callback_drops_the_last_client_reference(lockd, other):
    # In a process of its own: before the fix, ~Client joined the keeper from the keeper itself
    # (std::terminate), so the process died.
    server, port = lockd
    p = _run_script(_GC_IN_CALLBACK, server, str(port))
    try:
        assert p.stdout.readline().strip() == "locked", p.stderr.read()
        _force_release(lockd, "py/gc-in-callback")
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0 and out.strip() == "lost", (p.returncode, out, err)
    with other.lock("py/gc-in-callback", timeout=5):
        pass


_CLOSE_MID_CALL = r"""
import sys, threading, time, rdmalock
server, port = sys.argv[1], int(sys.argv[2])
holder = rdmalock.Client.connect(server, port=port, connect_timeout=10, client_name="py-holder")
held = holder.lock("py/close-mid-call", timeout=5)
waiter = rdmalock.Client.connect(server, port=port, connect_timeout=10, client_name="py-waiter")
box = {}
def wait():
    try:
        box["got"] = waiter.lock("py/close-mid-call", timeout=10)
    except rdmalock.RdmalockError as e:
        box["got"] = e
t = threading.Thread(target=wait)
t.start()
time.sleep(0.5)  # it waits at lockd
waiter.close()  # with that call in flight (asyncio.wait_for over to_thread, then `with` exits)
print("closed", waiter.closed, flush=True)
try:
    waiter.try_lock("py/after-close")
    print("call after close: no error", flush=True)
except rdmalock.RdmalockError as e:
    print("call after close:", e.code.name, flush=True)
held.release()
t.join(20)
got = box.get("got")
if t.is_alive():
    print("waiter: still waiting", flush=True)
elif isinstance(got, rdmalock.RdmalockError):
    print("waiter: error", got.code.name, flush=True)
else:
    print("waiter:", got.state.name, flush=True)
# The waiter's session ended as its call returned: the lock is free for another client.
for _ in range(50):
    free = holder.try_lock("py/close-mid-call")
    if free is not None:
        break
    time.sleep(0.1)
print("free" if free is not None else "still held", flush=True)
"""


def test_close_with_a_call_in_flight_on_another_thread_ends_the_session_after_it(lockd):
    # close() freed the C client at once, under another thread's lock() (Python makes that easy:
    # asyncio.wait_for over asyncio.to_thread(c.lock), then leaving `with c`); that call then
    # used the freed client (found by review, 2026-12-06). In a process of its own: it may crash.
    server, port = lockd
    p = _run_script(_CLOSE_MID_CALL, server, str(port))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, (p.returncode, out, err)
    assert out.splitlines() == ["closed True", "call after close: CONNECTION", "waiter: LOST",
                                "free"], (out, err)


_FORK = r"""
import os, sys, rdmalock
server, port = sys.argv[1], int(sys.argv[2])
client = rdmalock.Client.connect(server, port=port, connect_timeout=10, client_name="py-fork")
lock = client.lock("py/fork", timeout=5)
pid = os.fork()
if pid == 0:
    # The child: its inherited client refuses work; then the interpreter exits normally, and its
    # finalizers free the inherited lock and client.
    try:
        client.try_lock("py/fork-child")
        code = 1
    except rdmalock.RdmalockError as e:
        code = 0 if e.code == rdmalock.ErrorCode.UNSUPPORTED else 2
        if code:
            print("child:", e, file=sys.stderr)
    sys.exit(code)
import time
for _ in range(200):  # 20 s
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.waitstatus_to_exitcode(status), flush=True)
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung (killed after 20 s)", flush=True)
sys.stdin.readline()  # the test looks from another client meanwhile
print("held" if lock.held else f"not held: {lock.state.name}", flush=True)
lock.release()
client.flush()
print("released", flush=True)
"""


_SIGINT_WHILE_WAITING = r"""
import gc, sys, rdmalock
server, port = sys.argv[1], int(sys.argv[2])
client = rdmalock.Client.connect(server, port=port, connect_timeout=10, client_name="py-sigint")
print("waiting", flush=True)
interrupted = False
try:
    client.lock("py/sigint", timeout=20)
    print("granted, no interrupt", flush=True)
except KeyboardInterrupt:
    interrupted = True  # the traceback holds the call's frame until the except block ends
if interrupted:
    gc.collect()
    client.flush()
    print("interrupted", flush=True)
sys.stdin.readline()  # the test looks from another client meanwhile
"""


def test_an_interrupt_that_lands_as_a_wait_is_granted_leaks_no_lock(lockd, other):
    # Ctrl-C while lock() waits: the signal's handler runs once the C call returns, and the
    # KeyboardInterrupt came before the handle was wrapped in a Lock, so the granted lock was
    # never freed: held, and renewed, for the rest of the client's life (found by review,
    # 2026-12-06).
    import signal
    server, port = lockd
    held = other.lock("py/sigint", timeout=5)
    p = _run_script(_SIGINT_WHILE_WAITING, server, str(port))
    try:
        assert p.stdout.readline().strip() == "waiting", p.stderr.read()
        time.sleep(1.0)  # into its wait
        p.send_signal(signal.SIGINT)
        time.sleep(0.2)
        held.release()  # granted to the child now, with its interrupt pending
        said = p.stdout.readline().strip()
        assert said == "interrupted", (said, p.stderr.read())
        other.flush()
        got = other.try_lock("py/sigint")
        p.stdin.write("\n")
        p.stdin.flush()
        p.communicate(timeout=30)
    finally:
        p.kill()
    assert got is not None, "the interrupted process still holds py/sigint"
    got.release()


_EXIT_WITH_A_THREAD_WAITING = r"""
import sys, threading, time, rdmalock
server, port = sys.argv[1], int(sys.argv[2])
client = rdmalock.Client.connect(server, port=port, connect_timeout=10, client_name="py-exit")
threading.Thread(target=lambda: client.lock("py/exit-waiting"), daemon=True).start()
time.sleep(0.5)  # the thread waits in the library
print("exiting", flush=True)
"""


def test_exit_with_a_daemon_thread_waiting_does_not_close_the_client_under_it(lockd, other):
    # At exit, the Client's finalizer closed it while a daemon thread waited in lock() on it:
    # the close waited for the wait (until lockd fenced the silent session, a heartbeat timeout
    # later), then freed the client under that thread. A client in use is now left to the
    # process's end, where lockd sees its connections go (found by review, 2026-12-06).
    server, port = lockd
    held = other.lock("py/exit-waiting", timeout=5)
    p = _run_script(_EXIT_WITH_A_THREAD_WAITING, server, str(port))
    try:
        assert p.stdout.readline().strip() == "exiting", p.stderr.read()
        said = time.monotonic()
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - said
    finally:
        p.kill()
    held.release()
    # The close under the waiting thread made its lock() fail once lockd fenced the session (a
    # heartbeat timeout, 1 s, later): that thread's traceback, and an exit that took over 1 s.
    assert p.returncode == 0 and "Traceback" not in err, (p.returncode, round(took, 3), out, err)


_EXIT_WITH_A_THREAD_HOLDING = r"""
import sys, threading, time, rdmalock
server, port, marks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = rdmalock.Client.connect(server, port=port, connect_timeout=10, client_name="py-exit")
held = threading.Event()
def work():
    with client.lock("py/exit-holding", timeout=5), open(marks, "w") as f:
        held.set()
        while True:  # the critical section: a mark, in wall time, every 0.2 ms until the end
            f.write(f"{time.time()}\n")
            f.flush()
            time.sleep(0.0002)
threading.Thread(target=work, daemon=True).start()
held.wait(10)
print("exiting", flush=True)
"""


def test_exit_leaves_a_lock_a_daemon_thread_holds_to_the_process_end(lockd, other, tmp_path):
    # At exit, the Lock's finalizer released a lock a daemon thread held, while that thread was
    # still in its critical section (daemon threads run on until the interpreter stops them,
    # after the exit handlers): another process was granted it beside that thread (found by
    # review, 2026-12-06). With other threads alive at exit, locks and clients are now left to
    # the process's end, where lockd sees the connections go and frees what the records show.
    server, port = lockd
    marks = tmp_path / "marks"
    p = _run_script(_EXIT_WITH_A_THREAD_HOLDING, server, str(port), str(marks))
    try:
        assert p.stdout.readline().strip() == "exiting", p.stderr.read()
        got = other.lock("py/exit-holding", timeout=30)
        granted = time.time()
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    got.release()
    assert p.returncode == 0 and "Traceback" not in err, (p.returncode, out, err)
    late = [float(t) for t in marks.read_text().split()
            if t and float(t) >= granted]
    assert not late, (f"{len(late)} marks of the exiting process's critical section at or after "
                      f"the other client's grant, the last {max(late) - granted:.6f} s after it")


def test_issue17_finding11_a_forked_child_exit_leaves_the_parent_lock(lockd, other):
    server, port = lockd
    p = _run_script(_FORK, server, str(port))
    try:
        first = p.stdout.readline().strip()
        time.sleep(0.5)  # lockd would have acted on a disconnect by now
        busy = other.try_lock("py/fork")
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert first == "child 0", (first, err)
    assert busy is None, "the child's exit freed the parent's lock"
    assert p.returncode == 0 and out.split() == ["held", "released"], (p.returncode, out, err)
    other.flush()
    with other.lock("py/fork", timeout=5):
        pass


def _cluster_env():
    path, port_b = os.environ.get("RDMALOCK_CLUSTER_MAP"), os.environ.get("RDMALOCK_PORT_B")
    lockctl = os.environ.get("RDMALOCK_LOCKCTL")
    if not (path and port_b and lockctl):
        pytest.fail("RDMALOCK_CLUSTER_MAP, RDMALOCK_PORT_B and RDMALOCK_LOCKCTL are not set "
                    "(tests/sdk/run.sh starts the second lockd and writes the map)",
                    pytrace=False)
    return path, int(port_b), lockctl


def _name_on(cluster, shard):
    return next(n for n in (f"py/cluster/{i}" for i in range(10000))
                if cluster.shard_of(n) == shard)


def test_cluster_lock_lands_on_its_shard(lockd):
    server, port_a = lockd
    path, port_b, lockctl = _cluster_env()
    with rdmalock.Cluster.from_shard_map(path, connect_timeout=10,
                                         client_name="py-cluster") as cluster, \
            rdmalock.Client.connect(server, port=port_a, client_name="py-shard-a") as a, \
            rdmalock.Client.connect(server, port=port_b, client_name="py-shard-b") as b:
        assert cluster.shard_count == 2
        on_a, on_b = _name_on(cluster, "shard-a"), _name_on(cluster, "shard-b")
        with cluster.lock(on_a, timeout=5) as la, cluster.lock(on_b, timeout=5) as lb:
            assert la.held and lb.held and la.token != 0
            assert cluster.try_lock(on_a) is None
            # Shard a's lockd has on_a and not on_b; shard b's the reverse.
            assert a.try_lock(on_a) is None and b.try_lock(on_b) is None
            free = b.try_lock(on_a)
            assert free is not None
            free.release()
            out = subprocess.run([lockctl, "--cluster", path, "inspect", on_a],
                                 capture_output=True, text=True, check=True).stdout
            assert "shard        shard-a" in out and "held exclusive" in out, out
            assert "py-cluster" in out, out
        assert la.state == LockState.RELEASED and lb.state == LockState.RELEASED
        cluster_lock = cluster.try_lock(on_b)
        assert cluster_lock is not None  # released above, so free again
        cluster_lock.release()
