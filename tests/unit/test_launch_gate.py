"""The launcher's verdict (mgpucli/launch/gate.py), in this process; its workers' wait for it, with real worker
processes, is in tests/e2e/test_launch_gate.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mgpucli.launch import gate


def test_a_refusal_removes_what_the_launch_created_and_only_that(tmp_path):
    (tmp_path / "runs" / "old" / "logs").mkdir(parents=True)
    (tmp_path / "runs" / "old" / "logs" / "earlier.log").write_text("kept")
    g = gate.Gate()
    try:
        g.note(str(tmp_path / "runs" / "new" / "deep"))  # none of it exists: runs/new goes
        g.note(str(tmp_path / "runs" / "old" / "logs"))  # exists: only what comes into it goes
        (tmp_path / "runs" / "new" / "deep" / "logs").mkdir(parents=True)
        (tmp_path / "runs" / "old" / "logs" / "job_1" / "attempt_0").mkdir(parents=True)
        (tmp_path / "runs" / "old" / "logs" / "checked.json").write_text("{}")
        g.remove_created()
    finally:
        g.close()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["old"]
    assert [p.name for p in (tmp_path / "runs" / "old" / "logs").iterdir()] == ["earlier.log"]


def test_the_check_gives_its_verdict_and_its_error(tmp_path):
    said = []
    passed, refused = gate.Gate(), gate.Gate()
    try:
        passed.check(lambda: None, lambda: said.append("go"), lambda: said.append("killed"))
        passed.start()
        assert passed.refused() is None and json.loads(Path(passed.path).read_text()) == {"verdict": gate.GO}

        def bad() -> None:
            raise ValueError("no")

        refused.check(bad, lambda: said.append("go?"), lambda: said.append("killed"))
        refused.start()
        assert isinstance(refused.refused(), ValueError)
        assert json.loads(Path(refused.path).read_text()) == {"verdict": gate.REFUSED}
    finally:
        passed.close()
        refused.close()
    assert said == ["go", "killed"] and not os.path.exists(os.path.dirname(passed.path))


def test_a_refusal_of_the_part_begun_first_is_known_at_once_and_the_rest_never_runs():
    """The targets' check begins before torch's agent starts a worker: its refusal is there to see before any starts."""
    said = []
    g = gate.Gate()
    try:
        g.begin(lambda: (_ for _ in ()).throw(ValueError("optim.lrr")), lambda: said.append("killed"))
        g.check(lambda: said.append("builds checked"), lambda: said.append("go"), lambda: said.append("killed"))
        assert isinstance(g.refused(), ValueError)  # before start(): begin()'s part alone decided
        g.start()
        assert isinstance(g.refused(), ValueError)
        assert json.loads(Path(g.path).read_text()) == {"verdict": gate.REFUSED}
    finally:
        g.close()
    assert said == ["killed"]


def test_the_rest_of_the_check_runs_once_the_part_begun_first_passed():
    said = []
    g = gate.Gate()
    try:
        g.begin(lambda: said.append("targets"), lambda: said.append("killed"))
        g.check(lambda: said.append("builds"), lambda: said.append("go"), lambda: said.append("killed"))
        g.start()
        assert g.refused() is None and g.passed
    finally:
        g.close()
    assert said == ["targets", "builds", "go"]


@pytest.mark.parametrize("handed_over", [True, False], ids=["the launcher's recipe", "composed by the worker"])
def test_local_rank_0_reports_the_components_problems_to_the_launcher(tmp_path, monkeypatch, handed_over):
    from mgpucli.config import handoff, load_recipe
    from mgpucli.errors import RecipeError

    overrides = ["optim.momentum=-1", "trainer.device=cpu"]
    monkeypatch.delenv(handoff.ENV, raising=False)
    if handed_over:
        monkeypatch.setenv(handoff.ENV, str(handoff.write(load_recipe("quickstart", overrides), "quickstart",
                                                          overrides, tmp_path)))
    g = gate.Gate()
    try:
        env = {gate.ENV: g.path, "MGPU_LAUNCH_PID": str(os.getppid()), "LOCAL_RANK": "1"}
        gate.check_builds_here("quickstart", overrides, env)  # not local rank 0: built (the imports), not reported
        assert not os.path.exists(os.path.join(os.path.dirname(g.path), "builds.json"))
        gate.check_builds_here("quickstart", overrides, {**env, "LOCAL_RANK": "0"})
        with pytest.raises(RecipeError) as err:
            g.builds_checked("quickstart")
    finally:
        g.close()
    assert len(err.value.problems) == 1 and "MGPU_DEBUG=1" in (err.value.hint or "")
    assert err.value.problems[0].startswith("optim: building torch.optim.SGD failed: ValueError: Invalid momentum "
                                            "value: -1")
