"""Who holds a hung script's job up, from each rank's observed progress; and each rank's line from its stacks."""

from __future__ import annotations

from mgpucli.launch.hang_verdict import lines, verdict
from mgpucli.launch.stall_watch import where_phase
from mgpucli.run_records.stacks import Dump, Frame, ThreadStack


def _p(collective=None, calls=0, joined=True, steps=0):
    return {"step": 0, "phase": "script", "collective": collective, "calls": calls, "joined": joined,
            "optimizer_steps": steps}


def _dump(file, line, function, source):
    return Dump(1, [ThreadStack("0x1", True, [Frame(file, line, function, source)])])


def test_a_rank_that_never_joined_is_named_with_its_line():
    progress = {0: _p("init_process_group", calls=1, joined=False), 1: _p(joined=False)}
    found = verdict(progress)
    assert (found.kind, found.ranks) == ("never_joined", [1])
    assert found.headline == "rank 1 never joined the process group (rank 0 waits for it in init_process_group)"
    shown = lines(found, {0: _dump("/w/main.py", 16, "<module>", "dist.init_process_group()"),
                          1: _dump("/w/main.py", 12, "load_data", "time.sleep(3600)")}, [0, 1])
    assert shown == ["rank 1 never joined the process group: it was at /w/main.py:12 in load_data: time.sleep(3600)",
                     "rank 0 was at /w/main.py:16 in <module>: dist.init_process_group()"]


def test_a_rank_that_wrote_nothing_never_joined_either():
    found = verdict({0: _p(calls=3), 1: None, 2: _p(calls=3)})
    assert found.ranks == [1] and "ranks 0, 2 joined without it" in found.headline


def test_the_rank_outside_the_collective_the_others_wait_in_is_named():
    found = verdict({0: _p("all_reduce", calls=7, steps=5), 1: _p(calls=6, steps=5), 2: _p("all_reduce", calls=7)})
    assert (found.kind, found.ranks) == ("outside_collective", [1])
    assert found.headline == "rank 1 never entered the all_reduce ranks 0, 2 wait in"
    assert lines(found, {}, [0, 1, 2])[0] == "rank 1: no stacks (it had exited?)"


def test_ranks_in_different_collectives_are_all_named():
    found = verdict({0: _p("all_reduce", calls=4), 1: _p("barrier", calls=4)})
    assert (found.kind, found.ranks) == ("different_collectives", [0, 1])
    assert found.headline == ("the ranks wait in different collectives: rank 0 in all_reduce (its call 4), rank 1 in "
                              "barrier (its call 4)")
    found = verdict({0: _p("all_reduce", calls=5), 1: _p("all_reduce", calls=4)})
    assert found.ranks == [0, 1] and "rank 0 in all_reduce (its call 5)" in found.headline


def test_no_verdict_for_a_recipe_or_ranks_in_the_same_collective():
    assert verdict({0: {"step": 3, "phase": "forward"}, 1: {"step": 3, "phase": "forward"}}) is None
    assert verdict({0: _p("all_reduce", calls=4), 1: _p("all_reduce", calls=4)}) is None
    assert verdict({0: _p(calls=4), 1: _p(calls=4)}) is None


def test_what_a_rank_was_doing_in_words():
    assert where_phase(None) == "it wrote no progress"
    assert where_phase({"step": 6, "phase": "loading a batch"}) == "still at step 6 in 'loading a batch'"
    assert where_phase(_p(joined=False)) == "before init_process_group"
    assert where_phase(_p("barrier", calls=3, steps=2)) == "in barrier (its call 3), after 2 optimizer step(s)"
    assert where_phase(_p(calls=3, steps=2)) == "outside any collective, after 2 optimizer step(s)"
