"""The global batch a resume keeps (mgpucli/batch_layout.py): grad_accum changed to keep it on another process
count, refused with the layouts that would keep it, or changed on purpose by a command-line override."""

from __future__ import annotations

import pytest

from mgpucli.batch_layout import Layout, Segment, continued, describe, keep_global_batch, pinned_by, segments_of
from mgpucli.errors import EXIT_USAGE, UsageError


@pytest.mark.parametrize("saved, world, accum", [(Layout(8, 32, 1), 4, 2), (Layout(2, 32, 1), 1, 2),
                                                 (Layout(1, 32, 2), 2, 1), (Layout(2, 32, 2), 2, 2)])
def test_another_process_count_keeps_the_global_batch_with_grad_accum(saved, world, accum):
    kept = keep_global_batch(saved, world, 32, 1, frozenset())
    assert kept.layout == Layout(world, 32, accum) and kept.warning is None
    assert (kept.note is None) == (saved.world_size == world)  # said in one line when the layout changes
    if kept.note:
        assert f"keeping the checkpoint's global batch {saved.global_batch}" in kept.note
        assert f"trainer.grad_accum={accum}" in kept.note


def test_no_whole_grad_accum_is_refused_with_the_layouts_that_would_work():
    with pytest.raises(UsageError) as caught:
        keep_global_batch(Layout(3, 32, 1), 2, 32, 1, frozenset())
    err = caught.value
    assert err.exit_code == EXIT_USAGE
    assert "global batch of 96" in err.message and "no whole trainer.grad_accum keeps it" in err.message
    assert "data.batch_size=48 trainer.grad_accum=1" in err.hint
    assert "data.batch_size=24 trainer.grad_accum=2" in err.hint
    assert "run on 1 or 3 process(es)" in err.hint
    assert "set data.batch_size or trainer.grad_accum on the command line" in err.hint


def test_a_command_line_override_wins_and_says_how_the_global_batch_changed():
    kept = keep_global_batch(Layout(2, 32, 1), 1, 32, 1, frozenset({"trainer.grad_accum"}))
    assert kept.layout == Layout(1, 32, 1) and kept.note is None
    assert "the global batch changes from 64" in kept.warning and "to 32" in kept.warning and "x0.5" in kept.warning
    assert "To keep the global batch, resume without them on the command line." in kept.warning
    same = keep_global_batch(Layout(2, 32, 1), 1, 64, 1, frozenset({"data.batch_size"}))
    assert same.layout == Layout(1, 64, 1) and same.warning is None


def test_overrides_that_set_the_batch_are_found_in_every_spelling():
    assert pinned_by(["optim.lr=0.1", "+trainer.grad_accum=2", "++data.batch_size=8"]) == frozenset(
        {"trainer.grad_accum", "data.batch_size"})
    assert pinned_by(["data.batch_size_x=1", "trainer.epochs=2"]) == frozenset()


def test_segments_round_trip_and_name_each_process_count():
    segments = continued([Segment(1, Layout(2, 32, 1))], 100, Layout(1, 32, 2))
    assert continued(segments, 150, Layout(1, 32, 2)) == segments  # the same layout: the same segment
    assert segments_of({"segments": [s.record() for s in segments]}) == segments
    assert segments_of({}) == [] and segments_of({"segments": [{"first_step": "x"}]}) == []
    text = describe(segments, 192)
    assert text == ("steps 1-100 on 2 process(es) (global batch 64 = 2 x 32 x grad_accum 1), steps 101-192 on 1 "
                    "process(es) (global batch 64 = 1 x 32 x grad_accum 2)")
    assert describe(segments, 100).endswith("from step 101 on 1 process(es) (global batch 64 = 1 x 32 x grad_accum 2)")

