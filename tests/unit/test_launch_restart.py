"""Resume only on a restart; stop retrying a failure that repeats (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpucli.errors import JobFailed, UsageError
from mgpucli.launch.restart import (
    overwrite_for_restart,
    restart_count,
    resume_arg_for_restart,
    stop_reason,
)
from mgpucli.launch.worker import RecipeJob, parse_job
from mgpucli.run_records.worker_records import (
    FailureRecord,
    failure_step,
    is_retryable,
    read_record,
    record_path,
    write_record,
)

FIRST = {"TORCHELASTIC_RESTART_COUNT": "0"}
RESTART = {"TORCHELASTIC_RESTART_COUNT": "1"}


def test_restart_count():
    assert restart_count({}) == 0 and restart_count(FIRST) == 0
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "3"}) == 3
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "x"}) == 0


@pytest.mark.parametrize("resume", [None, "auto", "some/ckpt.pt"])
def test_a_first_start_does_what_the_user_typed(resume):
    assert resume_arg_for_restart(resume, environ=FIRST) == resume
    assert resume_arg_for_restart(resume, environ={}) == resume  # not under torchrun at all
    assert overwrite_for_restart(True, FIRST) is True


def test_a_restart_resumes_from_the_runs_last_checkpoint(tmp_path: Path):
    assert resume_arg_for_restart(None, environ=RESTART) == "auto"
    assert resume_arg_for_restart("auto", environ=RESTART) == "auto"
    assert overwrite_for_restart(True, RESTART) is False  # would delete the checkpoint to resume from
    # An explicit checkpoint stays until the run has saved one of its own.
    assert resume_arg_for_restart("other.pt", run_dir=str(tmp_path), environ=RESTART) == "other.pt"
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"x")  # where the engine writes it
    assert resume_arg_for_restart("other.pt", run_dir=str(tmp_path), environ=RESTART) == "auto"
    env = {**RESTART, "MGPU_RUN_DIR": str(tmp_path)}
    assert resume_arg_for_restart("other.pt", environ=env) == "auto"


def test_a_recipe_job_is_rewritten_only_on_restart():
    job = RecipeJob.parse(["r.yaml", "optim.lr=0.1", "--resume", "x.pt", "--overwrite"])
    assert job.for_restart(FIRST) == job
    assert job.for_restart(RESTART) == RecipeJob("r.yaml", ("optim.lr=0.1",), "auto", False)
    assert RecipeJob.parse(["r.yaml", "--resume=auto"]).for_restart(RESTART).resume == "auto"
    assert RecipeJob.parse(["r.yaml"]).for_restart(RESTART) == RecipeJob("r.yaml", (), "auto", False)

def rec(rank=1, attempt=0, type_="RuntimeError", message="boom at step 30", step=30, retryable=True, t=1.0):
    return FailureRecord(rank=rank, local_rank=rank, attempt=attempt, time=t, type=type_, message=message,
                         step=step, exit_code=1, retryable=retryable)


def test_stop_reason_for_a_repeat_and_for_non_retryable_failures():
    assert stop_reason([rec(attempt=0)], []) is None  # first failure: a restart may help
    repeat = stop_reason([rec(attempt=1)], [rec(attempt=0)])
    assert repeat and "same RuntimeError at step 30" in repeat and "rank 1" in repeat
    assert stop_reason([rec(attempt=1, step=31, message="boom at step 31")], [rec(attempt=0)]) is None
    assert stop_reason([rec(attempt=1, message="other")], [rec(attempt=0)]) is None
    assert stop_reason([rec(attempt=1, step=None)], [rec(attempt=0, step=None)]) is None  # step unknown
    nan = stop_reason([rec(type_="JobFailed", retryable=False)], [])
    assert nan and "JobFailed" in nan


def test_is_retryable():
    assert is_retryable(RuntimeError("connection reset"), 1)
    assert not is_retryable(UsageError("bad recipe"), 2)
    assert not is_retryable(JobFailed("the loss became NaN or inf at step 12; the run stopped"), 1)
    assert not is_retryable(RuntimeError("stopped by SIGTERM at step 80"), 75)  # preempted: stop, don't restart
    err = RuntimeError("flaky")
    err.retryable = False  # type: ignore[attr-defined]
    assert not is_retryable(err, 1)


def test_failure_step():
    assert failure_step(RuntimeError("injected fault: crash at step 30 on rank 1")) == 30
    assert failure_step(RuntimeError("no step here")) is None
    err = RuntimeError("at step 3")
    err.mgpu_step = 7  # type: ignore[attr-defined]
    assert failure_step(err) == 7


def test_record_round_trip(tmp_path: Path):
    error_file = tmp_path / "attempt_0" / "1" / "error.json"
    error_file.parent.mkdir(parents=True)
    path = record_path(str(error_file))
    assert Path(path).parent == error_file.parent
    write_record(path, rec())
    assert read_record(path) == rec()
    Path(path).write_text("{half")
    assert read_record(path) is None
    assert read_record(str(tmp_path / "missing.json")) is None


def test_a_launched_worker_parses_what_launch_passes_and_refuses_anything_else():
    assert parse_job(["train", "r.yaml", "optim.lr=0.1", "+x=1", "~y", "--resume", "auto", "--overwrite"]) == \
        RecipeJob("r.yaml", ("optim.lr=0.1", "+x=1", "~y"), "auto", True)
    assert parse_job(["train", "r.yaml", "--resume=last.pt"]).resume == "last.pt"
    for other in (["train", "r.yaml", "--check"], ["train", "--help"], ["train", "r.yaml", "--resume"],
                  ["validate", "c.pt"], ["train"], ["train", "r.yaml", "--", "x=1"], []):
        with pytest.raises(UsageError, match="mgpucli.launch.worker"):
            parse_job(other)


class _Seen:
    """A Heartbeat whose beats are given: rank 0 at step 30 in the all-reduce, rank 1 left at step 20."""

    rank, world_size = 0, 2

    def others(self):
        from mgpucli.distributed.heartbeat import Seen

        return [Seen(0, 30, "backward (gradient all-reduce)", 0.0),
                Seen(1, 20, "checkpoint: NaN check all-reduce", 1.0)]


@pytest.mark.parametrize("raw", ["Connection closed by peer [127.0.0.1]:1234", "Timed out waiting 60000ms"])
def test_a_rank_that_only_lost_its_peer_is_retryable(raw):
    """Its message names where the peer was ('NaN check all-reduce'): that is not a NaN, and a restart may help
    (CI once saw --max-restarts refuse to retry a crash because the survivor's message said 'NaN check')."""
    from mgpucli.engine.clear_errors import collective_failure

    err = collective_failure(RuntimeError(raw), _Seen(), timeout_s=60)
    assert err is not None and "NaN check all-reduce" in str(err)
    assert is_retryable(err, 1)
    assert stop_reason([rec(rank=0, type_="JobFailed", message=str(err).splitlines()[0], retryable=True)],
                       []) is None
