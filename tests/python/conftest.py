"""Makes the in-tree python/rdmalock importable and gives the tests lockd's address.

RDMALOCK_SERVER (and RDMALOCK_PORT, default 7471) name a running lockd for test_rdmalock.py;
tests/sdk/run.sh sets them. Without them those tests fail: they do not skip.
RDMALOCK_LIBRARY names librdmalock.so (else the system's, else build/librdmalock.so).
"""

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))


@pytest.fixture(scope="session")
def lockd():
    server = os.environ.get("RDMALOCK_SERVER")
    if not server:
        pytest.fail("RDMALOCK_SERVER is not set: these tests need a running lockd "
                    "(tests/sdk/run.sh starts one)", pytrace=False)
    return server, int(os.environ.get("RDMALOCK_PORT", "7471"))
