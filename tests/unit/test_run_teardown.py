"""run_training's teardown: after a finished run (and after an agreed stop) every rank meets at a barrier before
the process group is destroyed; after a failure it does not wait there (another rank may be gone)."""

from __future__ import annotations

import pytest

from mgpucli.distributed import collectives, runtime
from mgpucli.distributed.env import RankEnv
from mgpucli.engine import run as run_module
from mgpucli.engine import trainer as trainer_module
from mgpucli.errors import Preempted
from tests.procs import RECIPES


@pytest.fixture
def calls(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(collectives, "barrier", lambda runtime: seen.append("barrier"))
    original = runtime.teardown
    monkeypatch.setattr(runtime, "teardown", lambda: (seen.append("teardown"), original())[1])
    return seen


def _train(tmp_path):
    overrides = [f"run_dir={tmp_path / 'run'}", "trainer.device=cpu", "trainer.epochs=1",
                 "data.train.num_samples=128", "data.val.num_samples=64"]
    return run_module.run_training(str(RECIPES / "quickstart.yaml"), overrides, env=RankEnv())


def test_a_finished_run_meets_at_a_barrier_before_teardown(tmp_path, calls):
    result = _train(tmp_path)
    assert result["epoch"] == 1 and calls == ["barrier", "teardown"]


def test_an_agreed_stop_meets_at_a_barrier_too(tmp_path, calls, monkeypatch):
    def stopped(self):
        raise Preempted("stopped by SIGTERM at step 3", "Continue with --resume auto.")

    monkeypatch.setattr(trainer_module.Trainer, "fit", stopped)
    with pytest.raises(Preempted):
        _train(tmp_path)
    assert calls == ["barrier", "teardown"]


def test_a_failed_run_tears_down_without_waiting_for_the_others(tmp_path, calls, monkeypatch):
    def crash(self):
        raise ValueError("a bug in the user's model")

    monkeypatch.setattr(trainer_module.Trainer, "fit", crash)
    with pytest.raises(ValueError):
        _train(tmp_path)
    assert calls == ["teardown"]
