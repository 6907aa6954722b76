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
