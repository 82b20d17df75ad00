"""How a worker ends on an error it can explain (:func:`mgpucli.engine.train_entry.run_as_rank`): who says it."""

from __future__ import annotations

import pytest

from mgpucli import env_vars
from mgpucli.engine.train_entry import run_as_rank
from mgpucli.errors import EXIT_FAILED, EXIT_USAGE, MgpuError, RecipeError


def _as_rank(monkeypatch, rank: str, launched: bool) -> None:
    """This process as rank ``rank`` of a 2-process job, started by mgpu launch (``launched``) or by plain torchrun."""
    for name, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    if launched:
        monkeypatch.setenv(env_vars.LAUNCH_PID, "12345")
    else:
        monkeypatch.delenv(env_vars.LAUNCH_PID, raising=False)


def _refuse(error: MgpuError):
    def body(env):
        raise error

    return body


@pytest.mark.parametrize(("rank", "launched", "says"), [
    ("0", False, True), ("1", False, False),  # under plain torchrun every rank's lines meet: rank 0 alone says it
    ("0", True, True), ("1", True, True),  # mgpu launch keeps a log per rank and shows the rank that refused first
])
def test_bad_input_is_said_by_rank_0_or_under_mgpu_launch_by_every_rank(monkeypatch, capsys, rank, launched, says):
    _as_rank(monkeypatch, rank, launched)
    with pytest.raises(SystemExit) as exited:
        run_as_rank(_refuse(RecipeError("r.yaml", ["data: the labels run from 0 to 2"])))
    assert exited.value.code == EXIT_USAGE
    assert ("the labels run from 0 to 2" in capsys.readouterr().err) is says


def test_a_failure_is_said_by_every_rank(monkeypatch, capsys):
    _as_rank(monkeypatch, "1", launched=False)
    with pytest.raises(SystemExit) as exited:
        run_as_rank(_refuse(MgpuError("the disk is full")))
    assert exited.value.code == EXIT_FAILED
    assert "the disk is full" in capsys.readouterr().err
