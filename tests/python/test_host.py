"""The Python module without lockd: loading the library, argument checks and error reporting."""

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


def test_unreachable_server_raises_with_a_message():
    with pytest.raises(RdmalockError) as e:
        rdmalock.Client.connect("192.0.2.77", port=7999, connect_timeout=0.3)
    assert e.value.code != ErrorCode.OK
    assert e.value.message.startswith("rdmalock_connect: ")


def test_error_carries_unknown_codes():
    e = RdmalockError(99, "from the future")
    assert e.code == 99 and e.name == "unknown"
    assert RdmalockError(3, "x").code is ErrorCode.BUSY


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
