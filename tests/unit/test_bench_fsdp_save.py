"""benchmarks/fsdp_save.py's reading of rank 0's save lines (the runs themselves: tests/e2e covers fsdp's saves)."""

from __future__ import annotations

from benchmarks.fsdp_save import save_times


def test_a_save_in_the_foreground_holds_training_until_it_is_complete():
    log = "checkpoint at step 1 written in 9.00 s (sharded)\ncheckpoint at step 2 written in 3.25 s (full)\n"
    assert save_times(log) == (3.25, 3.25)


def test_a_background_save_holds_training_for_its_staging_alone():
    log = ("checkpoint at step 2: training goes on after 0.50 s; its shards are written in the background\n"
           "checkpoint at step 2 complete, 4.75 s after it began\n")
    assert save_times(log) == (0.5, 4.75)
    assert save_times("no save") == (None, None)
