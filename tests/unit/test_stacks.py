"""Stack dumps on request: faulthandler writes them, parse() reads the latest back, user_frame() finds the user's
line. In this process: the test installs the handler, signals itself, and reads its own stack."""

from __future__ import annotations

import faulthandler
import os
import threading

import pytest

from mgpucli.run_records import stacks


@pytest.fixture
def installed(tmp_path):
    error_file = tmp_path / "attempt_0" / "0" / "error.json"
    path = stacks.install(str(error_file))
    yield path
    faulthandler.unregister(stacks.DUMP_SIGNAL)


def _stuck_here(path: str) -> None:
    stacks.request([os.getpid()], [path], wait_s=3.0)  # the line a user would be stuck on


def test_a_dump_names_the_main_threads_innermost_user_frame(installed):
    assert installed.endswith("attempt_0/0/stacks.txt") and stacks.read_pid(installed) == os.getpid()
    release = threading.Event()
    helper = threading.Thread(target=release.wait, name="helper", daemon=True)
    helper.start()
    try:
        _stuck_here(installed)
    finally:
        release.set()
    dump = stacks.parse(installed)
    assert dump is not None and dump.pid == os.getpid() and len(dump.threads) >= 2
    frame = stacks.user_frame(dump.main)
    assert frame.function == "_stuck_here" and frame.file == __file__
    assert frame.source.startswith("stacks.request([os.getpid()]")
    assert dump.to_json()["user_frame"]["function"] == "_stuck_here"


def test_only_the_latest_dump_is_read(installed):
    _stuck_here(installed)
    first = stacks.parse(installed)

    def elsewhere():
        _stuck_here(installed)

    elsewhere()
    latest = stacks.parse(installed)
    assert "elsewhere" in [f.function for f in latest.main.frames]
    assert "elsewhere" not in [f.function for f in first.main.frames]


def test_frames_of_packages_and_of_mgpu_are_not_the_users():
    thread = stacks.ThreadStack("0x1", True, [
        stacks.Frame("/usr/lib/python3.11/threading.py", 320, "wait"),
        stacks.Frame("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 700, "__next__"),
        stacks.Frame("/work/mgpucli/engine/trainer.py", 180, "train_step"),
        stacks.Frame("/home/me/project/data.py", 12, "__getitem__", "blob = fetch(url)"),
    ])
    assert stacks.user_frame(thread).cite() == "/home/me/project/data.py:12 in __getitem__: blob = fetch(url)"
    assert stacks.waiting_frame(thread).function == "wait"


def test_a_rank_caught_importing_is_shown_where_the_import_is_and_where_mgpu_was():
    thread = stacks.ThreadStack("0x1", True, [
        stacks.Frame("<frozen importlib._bootstrap>", 1070, "_find_spec"),
        stacks.Frame("<frozen importlib._bootstrap>", 1147, "_find_and_load_unlocked"),
        stacks.Frame("/venv/lib/python3.11/site-packages/torch/distributed/tensor/__init__.py", 4, "<module>"),
        stacks.Frame("<frozen importlib._bootstrap>", 1176, "_find_and_load"),
        stacks.Frame("/venv/lib/python3.11/site-packages/mgpucli/engine/checkpoints/training.py", 90, "save"),
        stacks.Frame("/venv/lib/python3.11/site-packages/mgpucli/engine/trainer.py", 300, "fit"),
    ])
    assert [f.line for f in stacks.code_frames(thread)] == [4, 90, 300]
    described = stacks.describe(0, stacks.Dump(123, [thread]))
    assert described == ("rank 0 was waiting at /venv/lib/python3.11/site-packages/torch/distributed/tensor/"
                         "__init__.py:4 in <module>, under /venv/lib/python3.11/site-packages/mgpucli/engine/"
                         "checkpoints/training.py:90 in save"), described


def test_no_error_file_no_handler(tmp_path):
    assert stacks.install(None) is None
    assert stacks.parse(str(tmp_path / "missing.txt")) is None
