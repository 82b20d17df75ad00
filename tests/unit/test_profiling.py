"""The profiler window (engine/profiling.py): which steps it records, and that a cut-short window still writes."""

from __future__ import annotations

import json

import torch

from mgpucli.engine.profiling import ProfileWindow


def steps_of(window: ProfileWindow, first: int, last: int) -> None:
    for step in range(first, last + 1):
        window.before_step(step)
        torch.ones(4).add_(1)
        window.after_step(step)


def traced(path) -> list[int]:
    events = json.loads(path.read_text())["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})


def test_only_the_window_is_recorded_and_written_once(tmp_path):
    written = []
    window = ProfileWindow(3, 2, tmp_path, rank=1, device=torch.device("cpu"), written=written.append)
    steps_of(window, 1, 2)
    assert not (tmp_path / "profile").exists()  # nothing before the window
    steps_of(window, 3, 6)
    assert written == [tmp_path / "profile/rank1.json"] and traced(written[0]) == [3, 4]
    assert window.close() == written[0] and len(written) == 1


def test_a_run_resumed_inside_the_window_or_ending_in_it_writes_what_it_recorded(tmp_path):
    window = ProfileWindow(3, 5, tmp_path, rank=0, device=torch.device("cpu"))
    steps_of(window, 5, 6)  # resumed at step 5; the run ends after step 6
    assert window.close() == tmp_path / "profile/rank0.json"
    assert traced(tmp_path / "profile/rank0.json") == [5, 6]
    assert [p.name for p in (tmp_path / "profile").iterdir()] == ["rank0.json"]  # no temporary file left
