"""Fixtures every end-to-end module shares (pytest finds them here; no test module imports another's fixture)."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid

import pytest

from tests.procs import TAG, tagged, wait_until


@pytest.fixture
def tag():
    """A fresh value of :data:`tests.procs.TAG` for the processes the test starts; at teardown every process still
    carrying it is killed by pid, and the test fails if one was left (after 20 s for them to end on their own)."""
    value = uuid.uuid4().hex
    yield value
    wait_until(lambda: not tagged(TAG, value), timeout=20)
    left = tagged(TAG, value)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
