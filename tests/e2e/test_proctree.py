"""``mgpucli.proctree``, the one place mgpu starts and kills processes: nothing a child starts outlives it."""

from __future__ import annotations

import sys
import time

import pytest

from mgpucli import proctree
from tests.e2e.test_doctor import kill_marked, processes_mentioning

SLEEPER = "import time; time.sleep(600)"


@pytest.fixture
def marker(tmp_path):
    """A word on the command line of every process a test starts; whatever carries it is killed afterwards."""
    word = str(tmp_path / "proctree-marker")
    yield word
    kill_marked(word)


def gone(marker: str, timeout: float = 5.0) -> bool:
    """No process with ``marker`` on its command line, within ``timeout`` (a SIGKILLed process takes a moment to
    leave /proc)."""
    deadline = time.monotonic() + timeout
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return processes_mentioning(marker) == []


def spawns(marker: str, own_session: bool, then: str) -> str:
    """Python code that starts a sleeping grandchild (marked by ``marker`` on its command line), then runs ``then``."""
    return ("import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}, {marker!r}], start_new_session={own_session})\n"
            f"{then}\n")


def test_a_timeout_kills_children_in_sessions_of_their_own(marker):
    """torch's launcher starts workers with start_new_session=True: a killpg of the launcher misses them."""
    began = time.monotonic()
    done = proctree.run_bounded([sys.executable, "-c", spawns(marker, True, "time.sleep(600)"), marker], timeout=3)
    assert done.timed_out and done.returncode is None
    assert time.monotonic() - began < 15
    assert gone(marker)


def test_output_and_exit_code_come_back_and_what_the_child_left_in_its_group_is_killed(marker):
    code = spawns(marker, False, "print('out'); print('err', file=sys.stderr); sys.exit(3)")
    done = proctree.run_bounded([sys.executable, "-c", code, marker], timeout=60)
    assert (done.returncode, done.stdout, done.stderr, done.timed_out) == (3, "out\n", "err\n", False)
    assert gone(marker)


def test_kill_children_takes_each_childs_whole_group(marker):
    """What ``mgpu launch`` does to its workers: each leads a session of its own, with children of its own."""
    worker = spawns(marker, False, "time.sleep(600)")
    launcher = ("import sys, time\n"
                "from mgpucli import proctree\n"
                f"worker = proctree.start([sys.executable, '-c', {worker!r}, {marker!r}])\n"
                "deadline = time.monotonic() + 30\n"
                "while not proctree.descendants(worker.pid) and time.monotonic() < deadline:\n"
                "    time.sleep(0.05)\n"
                "print(proctree.kill_children() == [worker.pid])\n"
                "worker.wait()\n")
    done = proctree.run_bounded([sys.executable, "-c", launcher, marker], timeout=60)
    assert done.stdout == "True\n", done.stderr
    assert gone(marker)


def test_a_subreaper_ends_its_daemons_and_what_left_its_session(marker):
    """What every ``mgpu launch`` worker does at its end: a double-forked daemon and a child in a session of its own
    are still its own (``adopt_orphans``) and are ended with a SIGTERM (``end_descendants``)."""
    daemon = ("import os, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              "        time.sleep(600)\n"
              "    os._exit(0)\n")
    parent = ("import subprocess, sys, time\n"
              "from mgpucli import proctree\n"
              "print(proctree.adopt_orphans())\n"
              f"subprocess.run([sys.executable, '-c', {daemon!r}, {marker!r}], check=True)\n"
              f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}, {marker!r}], start_new_session=True)\n"
              f"plain = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}, {marker!r}])\n"
              "print(len(proctree.children()))\n"  # the daemon came back to this process; the sleepers are its own
              "ended = proctree.end_descendants(grace=5, spare_group=proctree.os.getpgrp())\n"
              "print(len(ended), proctree.descendants(proctree.os.getpid()) == [plain.pid])\n"  # its group is spared
              "print(len(proctree.end_descendants()), proctree.descendants(proctree.os.getpid()))\n")
    done = proctree.run_bounded([sys.executable, "-c", parent], timeout=60)
    assert done.stdout == "True\n3\n2 True\n1 []\n", done.stderr
    assert gone(marker)
