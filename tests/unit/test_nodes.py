"""Several nodes, the pure parts: what the nodes compare and how a difference is told; the waiting lines and the end
of a wait (a fake clock and a fake view of who is here); the store waits, over a fake store."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from mgpucli.errors import EXIT_FAILED, EXIT_USAGE
from mgpucli.launch import node_compare, store_waits
from mgpucli.launch.meeting import Meeting, NodesDiffer, NodesMissing, Watching, duration
from mgpucli.launch.node_presence import Member, Seen, View


# ------------------------------------------------------------------------------------------- the comparison
def test_a_recipe_is_compared_key_by_key_without_what_each_node_decides_for_itself():
    recipe = {"optim": {"lr": 0.05, "momentum": 0.9}, "model": {"hidden": [64, 64]}, "run_dir": "runs/q",
              "trainer": {"cpu_threads": 4, "stall_s": 300, "epochs": 3, "profiler": None}}
    assert node_compare.recipe_items(recipe) == {
        "optim.lr": "0.05", "optim.momentum": "0.9", "model.hidden": "[64, 64]", "run_dir": "runs/q",
        "trainer.epochs": "3", "trainer.profiler": "null"}


def test_each_difference_names_the_item_and_every_nodes_value():
    nodes = {"node 0": {"optim.lr": "0.05", "run_dir": "runs/a", "torch version": "2.13.0"},
             "node 1": {"optim.lr": "0.2", "run_dir": "runs/a", "torch version": "2.13.0", "+extra": "1"}}
    found = node_compare.differences(nodes)
    assert [d.describe() for d in found] == ["optim.lr: 0.05 on node 0, 0.2 on node 1",
                                             "+extra: (not set) on node 0, 1 on node 1"]
    assert node_compare.differences({"node 0": {"a": "1"}, "node 1": {"a": "1"}}) == []


def test_nodes_that_agree_are_grouped_and_a_long_list_is_cut():
    three = {"node 0": {"lr": "0.1"}, "node 1": {"lr": "0.2"}, "node 2": {"lr": "0.1"}}
    (only,) = node_compare.differences(three)
    assert only.describe() == "lr: 0.1 on nodes 0, 2, 0.2 on node 1"
    many = node_compare.differences({"node 0": {f"k{i}": "1" for i in range(12)},
                                     "node 1": {f"k{i}": "2" for i in range(12)}})
    message, hint = node_compare.refusal(many)
    assert message.count("\n  k") == node_compare.SHOWN and "... and 4 more" in message
    assert "none of them starts" in message and "--log-dir" in hint and "trainer.cpu_threads" in hint


def test_a_script_is_compared_by_what_runs_its_arguments_and_its_content():
    assert node_compare.script_items(["main.py", "--epochs", "3"], "ab" * 32) == {
        "script": "main.py", "script arguments": "--epochs 3", "script content": "sha256 abababababab"}
    assert node_compare.script_items(["-m", "pkg.train"], "0" * 64)["script"] == "-m pkg.train"
    items = node_compare.job_items({"script": "main.py"}, {"--resume": None, "--max-restarts": "3"},
                                   {"mgpu": "1.0", "torch": "2.13.0"})
    assert items == {"script": "main.py", "--max-restarts": "3", "mgpu version": "1.0", "torch version": "2.13.0"}


# ------------------------------------------------------------------------------------------- the wait
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


ME = Member("a", 10, 0)


def meeting(view: View, entry: int = 0, node_rank: int | None = 0, backend: str = "static", met=(), step=None):
    said: list[str] = []
    clock = Clock()
    me = Member("a", 10, node_rank)
    watching = Watching(backend=backend, endpoint="10.0.0.1:29500", run_id="mgpu-x", nnodes=2, node_rank=node_rank,
                        join_timeout=600, last_step=lambda: step, say=said.append)
    return Meeting(watching, me, entry, list(met), lambda: view, clock=clock), clock, said


def test_the_first_line_comes_a_few_seconds_in_then_every_30_s_naming_who_is_missing():
    view = View(True, (Seen(ME, True, 0, True),))
    wait, clock, said = meeting(view)
    wait.tick()
    assert said == []  # nodes that are all up meet before anything is said
    clock.now += 5
    wait.tick()
    clock.now += 10
    wait.tick()
    clock.now += 20
    wait.tick()
    assert said == ["mgpu launch: waiting for the nodes to meet at 10.0.0.1:29500: 1 of 2 here (node 0); missing: "
                    "node 1; 9m55s left (--join-timeout 600).",
                    "mgpu launch: waiting for the nodes to meet at 10.0.0.1:29500: 1 of 2 here (node 0); missing: "
                    "node 1; 9m25s left (--join-timeout 600)."]


def test_without_node_ranks_the_missing_are_counted_and_an_unreachable_store_is_said():
    other = Member("b", 20, None)
    wait, _, _ = meeting(View(True, (Seen(other, True, 0, True),)), node_rank=None, backend="c10d")
    assert "2 of 2 here (a (pid 10), b (pid 20))" in wait.line()
    wait, _, _ = meeting(View(True, ()), node_rank=None, backend="c10d")
    assert wait.line().endswith("1 of 2 here (a (pid 10)); missing: 1 node(s); 10m00s left (--join-timeout 600).")
    wait, _, _ = meeting(View(False, ()), node_rank=1)
    assert "its rendezvous store does not answer yet (node 0's launcher hosts it)" in wait.line()
    wait, _, _ = meeting(View(False, ()), node_rank=None, backend="c10d")
    assert "(the launcher on 10.0.0.1 hosts it)" in wait.line()


def test_after_a_restart_the_lost_node_is_named_at_once_with_the_step():
    lost = Member("b", 20, 1)
    view = View(True, (Seen(ME, True, 1, True), Seen(lost, False, 0, False)))
    wait, clock, said = meeting(view, entry=1, met=[ME, lost], step=266)
    clock.now += 1
    wait.tick()
    assert said == ["mgpu launch: node 1 (b) lost at step 266; waiting for it to rejoin at 10.0.0.1:29500: 1 of 2 "
                    "here (node 0 (a)); 9m59s left (--join-timeout 600)."]
    clock.now += 5
    wait.tick()
    assert len(said) == 1  # then every 30 s, counting down
    clock.now += 25
    wait.tick()
    assert len(said) == 2 and said[1].startswith("mgpu launch: node 1 (b) lost at step 266;") and \
        said[1].endswith("9m29s left (--join-timeout 600)."), said
    alive = View(True, (Seen(ME, True, 1, True), Seen(lost, False, 0, True)))
    wait, _, _ = meeting(alive, entry=1, met=[ME, lost])
    assert wait.standing().lost == []  # still renewing its record: not back yet, not lost


def test_the_join_timeout_ends_the_wait_naming_who_never_came_or_who_was_lost():
    wait, clock, _ = meeting(View(True, (Seen(ME, True, 0, True),)))
    clock.now += 600
    with pytest.raises(NodesMissing) as info:
        wait.tick()
    err = info.value
    assert err.exit_code == EXIT_FAILED and err.status == "unmet"
    assert "did not meet at 10.0.0.1:29500 within --join-timeout 600 s: node 1 never joined (1 of 2 here: node 0)" \
        in err.message and "the same mgpu launch command" in err.hint
    assert err.details["missing"] == ["node 1"] and err.details["kind"] == "timeout"
    lost = Member("a", 20, 1)
    wait, clock, _ = meeting(View(True, (Seen(ME, True, 1, True),)), entry=1, met=[ME, lost], step=7)
    clock.now += 600
    with pytest.raises(NodesMissing) as info:
        wait.tick()
    assert info.value.message.startswith("node 1 lost at step 7 and did not rejoin") and "--resume auto" in \
        info.value.hint
    assert info.value.details["lost"] == ["node 1"] and info.value.details["step"] == 7
    assert info.value.status == "node_lost" and info.value.exit_code == EXIT_FAILED
    assert NodesDiffer("", "", {}).exit_code == EXIT_USAGE and NodesDiffer("", "", {}).status == "refused"


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (0, 45.9, 595, 3900, -3)] == ["0s", "45s", "9m55s", "1h05m", "0s"]


# ------------------------------------------------------------------------------------------- the store waits
class FakeStore:
    """Keys appear when a test sets them; ``check`` never blocks, ``get`` of a missing key would."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.timeout = timedelta(seconds=300)
        self.calls: list[str] = []

    def check(self, keys):
        self.calls.append("check")
        return all(k in self.data for k in keys)

    def get(self, key):
        self.calls.append("get")
        return self.data[key]

    def multi_get(self, keys):
        return [self.data[k] for k in keys]

    def set(self, key, value):
        self.data[key] = value


def test_a_watched_store_waits_for_keys_with_checks_then_reads_them():
    store = FakeStore()
    watched = store_waits.WatchedStore(store)
    threading.Timer(0.3, store.set, ("k", b"v")).start()
    assert watched.get("k") == b"v"  # it waited for the key, then read it
    assert store.calls[-1] == "get" and store.calls.count("check") > 1
    watched.set("other", b"w")  # every other call goes through
    assert watched.multi_get(["k", "other"]) == [b"v", b"w"]


def test_a_watched_store_times_out_like_torchs_and_keeps_its_own_timeout():
    import torch.distributed as dist

    watched = store_waits.WatchedStore(FakeStore())
    watched.set_timeout(timedelta(seconds=0.2))
    assert watched.timeout == timedelta(seconds=0.2)
    with pytest.raises(dist.DistStoreError):
        watched.wait(["never"])


def test_a_call_from_the_main_thread_runs_its_tick_and_raises_what_the_call_raised():
    ticks: list[int] = []
    finished = threading.Event()
    threading.Timer(0.6, finished.set).start()
    assert store_waits.call(lambda: finished.wait(5) and 7, tick=lambda: ticks.append(1)) == 7
    assert ticks  # the main thread was back between slices
    with pytest.raises(ZeroDivisionError):
        store_waits.call(lambda: 1 / 0)

    def stop():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # a tick's exception (a deadline, a signal) ends the wait
        store_waits.call(threading.Event().wait, 5, tick=stop)


def test_a_launchers_presence_stops_beating_when_asked_and_ends_its_thread():
    """At the launcher's exit (atexit) the presence thread is stopped and joined, never left inside a store call
    while the interpreter finalizes (an abort, exit -6, on the node whose node 0 had just closed the store)."""
    import time

    from mgpucli.launch.node_presence import Presence
    from mgpucli.launch.ports import free_port

    presence = Presence("127.0.0.1", free_port(), "stop-test", Member("box", 1, 1))  # nothing listens there
    presence.start()
    began = time.monotonic()
    presence.stop()
    assert not presence.is_alive() and time.monotonic() - began < 3
    assert presence.view().reachable is False
