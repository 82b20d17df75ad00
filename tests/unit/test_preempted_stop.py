"""A graceful stop (Preempted) as a worker leaves it: the step its checkpoint holds in ``mgpu_failure.json``, the
signal it got, and a plain note on stderr rather than an error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mgpucli.engine import run as run_module
from mgpucli.engine import train_entry
from mgpucli.errors import EXIT_PREEMPTED, Preempted
from mgpucli.launch import worker
from mgpucli.run_records.worker_records import failure_step, read_record, record_path
from mgpucli.stop_signals import SignalCount

MESSAGE = ("stopped by SIGTERM at step 40 (epoch 2); every rank agreed on that step and the checkpoint in "
           "runs/q/checkpoints is complete.")


def preempted(step: int | None = 40, signal: str | None = "SIGTERM") -> Preempted:
    err = Preempted(MESSAGE, "Continue the run with the same command plus --resume auto.", step=step, signal=signal)
    err.mgpu_step = step + 1 if step is not None else None  # what an engine that tags every error would add
    return err


def test_a_stop_is_recorded_at_the_step_its_checkpoint_holds():
    assert failure_step(preempted(step=40)) == 40
    assert failure_step(preempted(step=None)) == 40  # no step carried: the message names it
    crash = RuntimeError("boom")
    crash.mgpu_step = 41  # type: ignore[attr-defined]
    assert failure_step(crash) == 41  # a failure keeps the step in progress


def test_the_worker_records_step_signal_and_exit_75(tmp_path: Path, monkeypatch):
    error_file = tmp_path / "attempt_0" / "1" / "error.json"
    error_file.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    try:
        try:
            raise preempted(step=40, signal="SIGTERM")
        except Preempted:
            sys.exit(EXIT_PREEMPTED)  # what train_entry.run_as_rank does
    except SystemExit as exc:
        worker._record_failure(exc)
    rec = read_record(record_path(str(error_file)))
    assert rec is not None
    assert (rec.rank, rec.type, rec.step, rec.exit_code, rec.retryable, rec.signal) == (1, "Preempted", 40, 75, False,
                                                                                         "SIGTERM")


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # torch's @record, under capsys
@pytest.mark.parametrize("rank", [None, "0", "1"])
def test_the_stop_is_a_note_not_an_error(monkeypatch, capsys, rank):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "29500")

    def stopped(*args, **kwargs):
        raise preempted()

    monkeypatch.setattr(run_module, "run_training", stopped)
    with pytest.raises(SystemExit) as exited:
        train_entry.train_recipe("quickstart", [])
    assert exited.value.code == EXIT_PREEMPTED
    err = capsys.readouterr().err
    assert "error" not in err
    if rank == "1":
        assert err == ""  # every rank agreed: rank 0 alone says it
    else:
        assert err.startswith(f"mgpu train: {MESSAGE}\n") and "--resume auto" in err


@pytest.mark.parametrize(("code", "ignored"), [(0, True), (EXIT_PREEMPTED, True), (1, False)])
def test_after_a_graceful_stop_the_worker_exits_through_signals(monkeypatch, code, ignored):
    """torch's agent SIGTERMs the ranks still exiting once one has exited: that must not turn exit 75 into -15."""
    import signal

    def run(args):
        raise SystemExit(code)

    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setattr(worker.parent_watch, "install_parent_watch", lambda: None)
    monkeypatch.setattr(worker, "_run", run)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as exited:
            worker.main(["train", "quickstart"])
        assert exited.value.code == code
        for sig in before:
            assert (signal.getsignal(sig) == signal.SIG_IGN) is ignored
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def seconds_apart():
    """A clock for signals that come a second apart each (none is the one before it delivered again)."""
    ticks = iter(range(1000))
    return lambda: float(next(ticks))


def test_after_a_finished_run_a_signal_is_only_noted_until_released():
    """A finished run's teardown: Ctrl-C (twice) and SIGTERM are noted, not raised; release() gives them back."""
    import os
    import signal

    from mgpucli.engine.stop_requests import StopRequests

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop = StopRequests(SignalCount(seconds_apart()))
    with stop.listening():
        stop.finish()
    for sig in (signal.SIGINT, signal.SIGINT, signal.SIGTERM):
        os.kill(os.getpid(), sig)  # the handler runs in this (main) thread before kill returns
    assert stop.received == "SIGTERM"
    stop.release()
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_an_unfinished_run_gives_the_signals_back_at_once_and_a_second_ctrl_c_stops_now():
    import os
    import signal

    from mgpucli.engine.stop_requests import StopRequests
    from mgpucli.stop_signals import AGAIN_AFTER_S

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    now = [50.0]
    stop = StopRequests(SignalCount(lambda: now[0]))
    with pytest.raises(KeyboardInterrupt), stop.listening():
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == "SIGINT"
        now[0] += AGAIN_AFTER_S / 10
        os.kill(os.getpid(), signal.SIGINT)  # the same Ctrl-C delivered again (GNU timeout: child and group)
        assert stop.received == "SIGINT"
        now[0] += AGAIN_AFTER_S
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C, a moment later: stop now
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_the_run_is_finished_for_the_launcher_only_once_every_rank_marked_it(tmp_path: Path):
    from mgpucli.run_records.first_failure import all_finished
    from mgpucli.run_records.launch_record import build_attempt
    from mgpucli.run_records.worker_records import mark_finished

    files = {lr: str(tmp_path / "attempt_0" / str(lr) / "error.json") for lr in (0, 1)}
    attempt = build_attempt(0, {lr: {"RANK": str(lr)} for lr in files}, {}, {}, files)
    assert not all_finished(attempt)
    mark_finished({"TORCHELASTIC_ERROR_FILE": files[0]})
    assert not all_finished(attempt)  # rank 1 may still be saving or agreeing on a stop
    mark_finished({"TORCHELASTIC_ERROR_FILE": files[1]})
    assert all_finished(attempt)


def test_a_sigterm_of_the_teardown_ends_the_rank_by_that_signal_any_other_is_a_stop_request(monkeypatch):
    import signal

    from mgpucli.engine import stop_requests
    from mgpucli.engine.stop_requests import StopRequests

    done = []
    monkeypatch.setattr(stop_requests.os, "kill", lambda pid, sig: done.append(("kill", sig)))
    monkeypatch.setattr(stop_requests.signal, "signal", lambda sig, handler: done.append(("handler", sig, handler)))
    asked = []
    monkeypatch.setattr(StopRequests, "is_teardown", staticmethod(lambda: asked.append(1) or True))
    stop = StopRequests(SignalCount(seconds_apart()))
    stop._note(signal.SIGINT, None)  # the agent's teardown never sends SIGINT: a stop request, not asked
    assert (stop.received, asked, done) == ("SIGINT", [], [])
    stop._note(signal.SIGTERM, None)
    assert done == [("handler", signal.SIGTERM, signal.SIG_DFL), ("kill", signal.SIGTERM)] and asked == [1]
    done.clear()
    stop.finish()  # a finished run's teardown: only noted
    stop._note(signal.SIGTERM, None)
    assert done == [] and stop.received == "SIGTERM" and asked == [1]
    monkeypatch.setattr(StopRequests, "is_teardown", staticmethod(lambda: False))
    other = StopRequests()
    other._note(signal.SIGTERM, None)  # a scheduler's SIGTERM, the launcher's forwarded one: a stop request
    assert done == [] and other.received == "SIGTERM"


def _stacks_header(folder: Path, pid: int) -> None:
    folder.mkdir(parents=True)
    (folder / "stacks.txt").write_text(f"# mgpu: pid {pid} main thread 0x0000000000000001\n")


def test_the_teardown_is_told_by_a_sibling_of_the_attempt_that_has_ended(tmp_path: Path, monkeypatch, capsys):
    import os

    from mgpucli.launch import teardown

    attempt = tmp_path / "attempt_0"
    mine = attempt / "0" / "error.json"
    _stacks_header(attempt / "0", os.getpid())
    assert not teardown.attempt_failed(str(mine))  # alone: nothing ended
    # a sibling that is running: here this process's parent, as a child of its own parent (the "launcher")
    grandparent = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[1])
    monkeypatch.setattr(teardown.os, "getppid", lambda: grandparent)
    _stacks_header(attempt / "1", int(Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[1]))
    assert not teardown.attempt_failed(str(mine))
    (attempt / "2").mkdir()  # a sibling still starting: no pid yet, not a sign of anything
    assert not teardown.attempt_failed(str(mine)) and capsys.readouterr().err == ""
    _stacks_header(attempt / "3", 2**22 + 1)  # above any pid_max: a worker that has ended
    assert teardown.attempt_failed(str(mine))
    assert "after local rank 3 ended: the attempt failed, so this rank ends now" in capsys.readouterr().err
