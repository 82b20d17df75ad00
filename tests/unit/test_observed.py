"""A script's progress observed at torch's public points, and the nested-launcher guard (in this process: the
wrappers are applied to stand-ins, never to this process's torch.distributed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mgpucli.distributed import observed
from mgpucli.launch import nested
from mgpucli.run_records.nested_launch import ERROR_NAME, FIX


@pytest.fixture
def state(monkeypatch):
    fresh = observed._State()
    monkeypatch.setattr(observed, "state", fresh)
    return fresh


def test_a_waiting_call_is_counted_on_entry_and_left_on_exit(state):
    seen = []
    reduce = observed.observe("all_reduce", lambda t: seen.append(observed.snapshot()) or t, lambda: False)
    assert reduce(3) == 3
    for snap in (*seen, now := observed.snapshot()):
        assert snap.pop("children_cpu_s") >= 0  # the CPU of this process's children (none of the script's here)
    assert seen == [{"collective": "all_reduce", "calls": 1, "joined": False, "optimizer_steps": 0}]
    assert now == {"collective": None, "calls": 1, "joined": False, "optimizer_steps": 0}


def test_joined_only_when_init_process_group_returns(state):
    def fails():
        raise RuntimeError("rendezvous timed out")

    with pytest.raises(RuntimeError):
        observed.observe(observed.INIT, fails, lambda: False)()
    assert (state.joined, state.inside, state.calls) == (False, None, 1)
    observed.observe(observed.INIT, lambda: None, lambda: False)()
    assert state.joined and state.calls == 2


def test_a_call_inside_another_counts_as_the_outer_one(state):
    gather = observed.observe("all_gather", lambda: observed.snapshot()["collective"], lambda: False)
    gather_object = observed.observe("all_gather_object", gather, lambda: False)
    assert gather_object() == "all_gather_object" and state.calls == 1


def test_while_compiling_the_wrapper_steps_aside(state):
    assert observed.observe("all_reduce", lambda: "traced", lambda: True)() == "traced"
    assert state.calls == 0


def test_optimizer_steps_are_counted_by_torchs_global_hook(state):
    import torch

    observed._stepped(None, (), {})
    assert state.optimizer_steps == 1
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(observed._stepped)
    try:
        param = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([param], lr=0.1)
        param.sum().backward()
        opt.step()
    finally:
        handle.remove()
    assert state.optimizer_steps == 2


def test_spawning_in_a_rank_of_several_is_refused_with_both_fixes():
    refused = nested._refuse("torch.multiprocessing.spawn", lambda *a: "spawned", 1, 2)
    with pytest.raises(nested.NestedLaunchError) as info:
        refused(print, nprocs=2)
    assert type(info.value).__name__ == ERROR_NAME
    assert str(info.value).startswith("the script starts its own distributed processes "
                                      "(torch.multiprocessing.spawn) in rank 1 of the 2")
    assert str(info.value).endswith(FIX) and "--nproc 1" in FIX and "--multiprocessing-distributed" in FIX


def test_init_process_group_is_refused_only_in_a_child_of_the_rank():
    calls = []
    guarded = nested._in_children(lambda **kw: calls.append(kw), os.getpid(), 0, 2)
    guarded(backend="gloo")
    assert calls == [{"backend": "gloo"}]  # the rank itself joins as usual


def test_a_job_of_one_rank_is_left_alone(monkeypatch):
    import torch.multiprocessing as mp

    before = mp.spawn
    nested.install(0, 1)
    assert mp.spawn is before


def test_the_heartbeat_writes_what_is_observed_from_the_start_and_ends_with_a_last_beat(tmp_path, monkeypatch):
    import json

    from mgpucli.distributed.heartbeat import ENDED, Heartbeat
    from mgpucli.run_records.worker_records import ERROR_FILE_ENV, progress_path

    error_file = tmp_path / "attempt_0" / "1" / "error.json"
    error_file.parent.mkdir(parents=True)
    monkeypatch.setenv(ERROR_FILE_ENV, str(error_file))
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    beat = Heartbeat(1, 2, interval_s=60, extra=lambda: {"collective": None, "calls": 0, "joined": False})
    beat.start(connect=False)  # no store, nothing imported: the file alone
    first = json.loads(Path(progress_path(str(error_file))).read_text())
    assert (first["phase"], first["joined"], first["calls"]) == ("setup", False, 0) and first["cpu_s"] >= 0
    beat.stop()
    assert json.loads(Path(progress_path(str(error_file))).read_text())["phase"] == ENDED


def test_the_post_mortem_recognises_a_nested_launcher_and_gives_both_fixes():
    from mgpucli.postmortem.lines import parse
    from mgpucli.postmortem.matchers import explain

    fixture = Path(__file__).parent / "fixtures" / "postmortem" / "nested_launcher.log"
    match = explain(parse(fixture.read_text(), rank=1, source=str(fixture)))
    assert (match.signature, match.rank, match.fix) == ("nested_launcher", 1, FIX)
    assert match.title == ("the script starts its own distributed processes (torch.multiprocessing.spawn) inside "
                           "the ranks mgpu launch started")


def test_a_traceback_through_a_wrapped_call_shows_no_frame_of_mgpus(tmp_path, monkeypatch):
    import sys
    import traceback

    from mgpucli.launch.script import ScriptTarget
    from mgpucli.launch.script_job import _run_script, _user_frames

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "main.py"
    script.write_text("from mgpucli.distributed import observed\n\n"
                      "def all_reduce(t):\n    raise RuntimeError('Connection closed by peer')\n\n"
                      "observed.observe('all_reduce', all_reduce, lambda: False)(1)\n")
    with pytest.raises(RuntimeError) as info:
        _run_script(ScriptTarget(path=str(script)), [])
    frames = traceback.extract_tb(_user_frames(info.value.__traceback__.tb_next))
    assert [(f.filename, f.name) for f in frames] == [(str(script), "<module>"), (str(script), "all_reduce")]
