"""The diagnosis of whole run directories, built here in launch's own layout (files only, no processes)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from mgpucli.errors import UsageError
from mgpucli.postmortem import diagnose_run, render, write_report
from mgpucli.run_records.launch_record import build_attempt
from mgpucli.run_records.worker_records import FailureRecord, record_path, write_record

FIXTURES = Path(__file__).parent / "fixtures" / "postmortem"
CRASH_TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/work/main/mgpucli/engine/trainer.py", line 241, in _forward_backward\n'
    "    if self._faults and faults.maybe_fault(...):\n"
    '  File "/work/main/mgpucli/faults.py", line 69, in maybe_fault\n'
    '    raise RuntimeError(f"injected fault: crash at step {step} on rank {rank}")\n'
    "RuntimeError: injected fault: crash at step 3 on rank 1\n"
)
PEER = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:23226"


class RunDir:
    """A run directory as `mgpu launch` leaves it: launch.json, per-attempt per-rank logs, error files."""

    def __init__(self, root: Path, nranks: int = 2, attempts: int = 1, status: str = "failed", **result):
        self.root = root
        self.nranks = nranks
        self.attempts = [self._attempt(n) for n in range(attempts)]
        self.data = {
            "mgpu_version": "0.1.0",
            "argv": ["mgpu", "launch", "--cpu", "--nproc", str(nranks), "r.yaml", "--overwrite"],
            "run_dir": str(root), "devices": {"kind": "cpu", "nproc_per_node": nranks}, "nnodes": 1,
            "rendezvous": {"backend": "c10d", "endpoint": "localhost:0", "id": "mgpu-x"}, "log_dir": str(root / "logs"),
            "env": {"MGPU_LAUNCH_PID": "999999999"},
            "attempts": [a.to_json() for a in self.attempts],
            "result": {"status": status, "exit_code": 0 if status == "succeeded" else 1, **result},
        }
        self.write()

    def _attempt(self, n: int):
        base = self.root / "logs" / "mgpu-x_abc" / f"attempt_{n}"
        paths = {}
        for lr in range(self.nranks):
            (base / str(lr)).mkdir(parents=True)
            paths[lr] = {k: str(base / str(lr) / f) for k, f in
                         (("out", "stdout.log"), ("err", "stderr.log"), ("ef", "error.json"))}
            Path(paths[lr]["out"]).write_text("")
            Path(paths[lr]["err"]).write_text("")
        return build_attempt(n, {lr: {"RANK": str(lr)} for lr in range(self.nranks)},
                             {lr: p["out"] for lr, p in paths.items()}, {lr: p["err"] for lr, p in paths.items()},
                             {lr: p["ef"] for lr, p in paths.items()})

    def write(self) -> None:
        (self.root / "launch.json").write_text(json.dumps(self.data))

    def log(self, rank: int, text: str, attempt: int = -1) -> None:
        with open(self.attempts[attempt].ranks[rank].stderr, "a") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")

    def error(self, rank: int, message: str, trace: str = "", step: int | None = None, when: float = 100.0,
              attempt: int = -1, kind: str = "RuntimeError") -> None:
        files = self.attempts[attempt].ranks[rank]
        Path(files.error_file).write_text(json.dumps({"message": {"message": f"{kind}: {message}", "extraInfo": {
            "py_callstack": trace, "timestamp": str(int(when))}}}))
        write_record(record_path(files.error_file), FailureRecord(rank, rank, self.attempts[attempt].attempt, when,
                                                                  kind, message, step, 1))

    def metrics(self, *records: dict) -> None:
        with open(self.root / "metrics.jsonl", "a") as fh:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")


def crash_run(root: Path) -> RunDir:
    run = RunDir(root, first_failed_rank=1)
    run.log(0, "mgpu train quickstart: 2 process(es) on cpu\nglobal batch 64; 8 steps per epoch; run dir x\n"
               "step 2 epoch 1  loss 1.38\n" + "\n".join(f"[rank0]: {line}" for line in ["Traceback (most recent "
               "call last):", '  File "/x/torch/_tensor.py", line 623, in backward', "    torch.autograd.backward(",
               PEER]))
    run.error(0, PEER.split(": ", 1)[1], when=101.0)
    run.log(1, "\n".join(f"[rank1]: {line}" for line in CRASH_TRACE.splitlines()))
    run.error(1, "injected fault: crash at step 3 on rank 1", CRASH_TRACE, step=3, when=100.5)
    run.metrics({"split": "train", "step": 2, "epoch": 1, "loss": 1.38})
    return run


def test_user_exception_on_rank_1_is_the_first_failure_with_step_and_evidence(tmp_path: Path):
    crash_run(tmp_path)
    report = diagnose_run(str(tmp_path))
    assert not report.finished and report.exit_code == 1 and report.status == "failed"
    f = report.first_failure
    assert (f.rank, f.step, f.step_source, f.epoch) == (1, 3, "failure record", 1)
    assert f.match.signature == "python_exception" and "not a distributed problem" in f.match.title
    assert [(e.rank, e.line) for e in f.match.evidence] == [(1, 4), (1, 5), (1, 6)]
    assert f.match.evidence[-1].text.strip() == "RuntimeError: injected fault: crash at step 3 on rank 1"
    assert [(o.rank, o.match.signature) for o in report.others] == [(0, "peer_lost")]
    assert "rank 1 failed first at step 3 (epoch 1)" in report.verdict


def test_json_report_has_the_contract_fields_and_is_written(tmp_path: Path):
    crash_run(tmp_path)
    report = diagnose_run(str(tmp_path))
    path = write_report(report)
    data = json.loads(Path(path).read_text())
    assert path == str(tmp_path / "postmortem.json") and data == json.loads(json.dumps(report.to_json()))
    first = data["first_failure"]
    assert data["finished"] is False
    assert (first["rank"], first["step"], first["signature"]) == (1, 3, "python_exception")
    assert first["fix"] and first["evidence"][-1] == {"rank": 1, "file": report.first_failure.match.evidence[-1].source,
                                                      "line": 6, "text": first["evidence"][-1]["text"]}
    assert data["other_failures"][0]["rank"] == 0


def test_sigkill_recorded_by_the_launcher_is_the_cause_not_the_peers_echo(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=0, exitcodes={"0": -9, "1": 1})
    run.log(0, "step 8 epoch 0  loss 1.1\nval step 8  loss 0.97  accuracy 0.78  (101 samples)")
    run.log(1, f"[rank1]: {PEER}")
    run.error(1, PEER.split(": ", 1)[1])
    report = diagnose_run(str(tmp_path))
    f = report.first_failure
    assert f.rank == 0 and f.match.signature == "killed_by_signal" and f.match.details["signal"] == "SIGKILL"
    assert f.exitcode == -9 and "out-of-memory killer" in f.match.title
    assert f.match.evidence[0].source.endswith("launch.json")


def test_the_teardowns_sigkill_after_a_ranks_error_is_never_the_cause_nor_an_oom_kill(tmp_path: Path):
    """Rank 1 raised; torch's agent SIGKILLed rank 0, busy in its dataset, once its 30 s window was over."""
    run = RunDir(tmp_path, first_failed_rank=1, exitcodes={"1": 1, "0": -9})
    run.data["attempts"][0]["exits"] = {"1": {"code": 1, "time": 100.8}, "0": {"code": -9, "time": 130.9}}
    run.write()
    run.log(0, "step 8 epoch 0  loss 1.1")
    run.log(1, "\n".join(f"[rank1]: {line}" for line in CRASH_TRACE.splitlines()))
    run.error(1, "injected fault: crash at step 3 on rank 1", CRASH_TRACE, step=3, when=100.5)
    report = diagnose_run(str(tmp_path))
    assert (report.first_failure.rank, report.first_failure.match.signature) == (1, "python_exception")
    (other,) = report.others
    assert (other.rank, other.match.signature, other.match.cause) == (0, "torn_down", False)
    assert other.match.title == "rank 0 was ended by the teardown (SIGKILL) after rank 1 failed"
    assert "memory" not in json.dumps(report.to_json()) and "OOM" not in report.verdict


def test_each_attempt_of_a_restarted_run_names_its_own_first_failure_not_the_teardowns_kill(tmp_path: Path):
    run = RunDir(tmp_path, attempts=2, status="succeeded")
    run.data["attempts"][0]["exits"] = {"1": {"code": 1, "time": 100.8}, "0": {"code": -9, "time": 130.9}}
    run.write()
    run.log(1, "\n".join(f"[rank1]: {line}" for line in CRASH_TRACE.splitlines()), attempt=0)
    run.error(1, "injected fault: crash at step 3 on rank 1", CRASH_TRACE, step=3, attempt=0, when=100.5)
    report = diagnose_run(str(tmp_path))
    assert [(e.attempt, e.rank, e.match.signature) for e in report.earlier_attempts] == [(0, 1, "python_exception")]


def test_a_rank_that_exited_0_while_the_other_waited_is_the_first_failure(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=0, exitcodes={"0": 1})
    run.data["attempts"][0]["exits"] = {"1": {"code": 0, "time": 100.0}, "0": {"code": 1, "time": 100.3}}
    run.write()
    trace = ('Traceback (most recent call last):\n  File "main.py", line 14, in <module>\n    dist.barrier()\n'
             '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 5356, in barrier\n'
             f"    work.wait()\n{PEER}\n")
    run.log(0, "\n".join(f"[rank0]: {line}" for line in trace.splitlines()))
    run.error(0, PEER.split(": ", 1)[1], trace, when=100.2)
    run.log(1, "rank 1: nothing left to do")
    report = diagnose_run(str(tmp_path))
    first = report.first_failure
    assert (first.rank, first.match.signature, first.match.cause, first.exitcode) == (1, "left_early", True, 0)
    assert first.match.title.startswith("rank 1 exited with code 0 at ")
    assert first.match.title.endswith(" while rank 0 waited in barrier at main.py:14")
    assert [(o.rank, o.match.signature) for o in report.others] == [(0, "peer_lost")]
    assert "rank 1 failed first" in report.verdict and "dist.barrier() before" in first.match.fix


def test_a_script_that_never_trained_is_said_so_though_it_finished(tmp_path: Path):
    run = RunDir(tmp_path, status="succeeded")
    run.data["job"] = "script"
    run.write()
    for rank, files in run.attempts[0].ranks.items():
        folder = Path(files.error_file).parent
        (folder / "mgpu_started").write_text("100.0\n")
        (folder / "mgpu_progress.json").write_text(json.dumps({
            "step": 0, "phase": "ended", "time": 100.4 + rank / 10, "collective": None, "calls": 0, "joined": False,
            "optimizer_steps": 0, "children_cpu_s": 0.0}))
    Path(run.attempts[0].ranks[0].stdout).write_text("Unable to locate sufficient 2 gpus to run this example. "
                                                     "Exiting.\n")
    report = diagnose_run(str(tmp_path))
    assert report.finished and report.exit_code == 0
    assert report.verdict.endswith(" finished, but the script exited after 0.5 s on every rank without joining a "
                                   'process group or training; its last line: "Unable to locate sufficient 2 gpus '
                                   'to run this example. Exiting.".')
    # a rank that joined, or whose own processes did the work, did something
    progress = Path(run.attempts[0].ranks[1].error_file).parent / "mgpu_progress.json"
    for did in ({"joined": True}, {"children_cpu_s": 3.2}, {"optimizer_steps": 5}):
        progress.write_text(json.dumps({"step": 0, "phase": "ended", "time": 101.0, "joined": False,
                                        "optimizer_steps": 0, "children_cpu_s": 0.0, **did}))
        assert diagnose_run(str(tmp_path)).never_trained is None, did


def test_a_recipe_every_rank_refused_is_a_recipe_problem_whichever_rank_exited_first(tmp_path: Path):
    """Rank 1 (quiet) exited 2 first; the agent's SIGTERM reached rank 0 after it had said the problem in full."""
    run = RunDir(tmp_path, first_failed_rank=1, exitcodes={"0": -15, "1": 2})
    run.log(0, "error: [rank 0] 1 problem(s) in recipe quickstart:\n  - data.train: building X failed: TypeError: "
               "bad size\nFix data.train in the recipe (or override it); MGPU_DEBUG=1 shows the whole traceback.")
    for rank in (0, 1):
        files = run.attempts[-1].ranks[rank]
        write_record(record_path(files.error_file), FailureRecord(rank, rank, 0, 100.0 + rank, "RecipeError",
                                                                  "1 problem(s) in recipe quickstart:", None, 2))
    report = diagnose_run(str(tmp_path))
    f = report.first_failure
    assert (f.rank, f.match.signature) == (0, "recipe_problem")
    assert f.match.title.startswith("a problem in the recipe, not a crash: data.train: building X failed")
    assert "failed first" not in report.verdict  # every rank refused the recipe: no rank failed first
    assert report.verdict.endswith("failed: a problem in the recipe, not a crash: data.train: building X failed: "
                                   "TypeError: bad size.")


def test_sigkill_without_recorded_exit_codes_is_inferred_from_silence(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=0)
    run.log(0, "step 8 epoch 0  loss 1.1\nval step 8  loss 0.97  accuracy 0.78  (101 samples)")
    run.metrics({"split": "train", "step": 8, "epoch": 0, "loss": 1.1})
    report = diagnose_run(str(tmp_path))
    f = report.first_failure
    assert f.rank == 0 and f.match.signature == "killed_by_signal" and f.match.details["inferred"]
    assert (f.step, f.step_source) == (8, "last logged metrics")
    assert "after step 8" in report.verdict and [e.line for e in f.match.evidence] == [1, 2]


def test_timeout_explains_a_late_rank_killed_at_teardown(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=1, exitcodes={"0": 1, "1": -9})
    gloo = (FIXTURES / "gloo_timeout.log").read_text()
    run.log(0, gloo)
    run.error(0, gloo.strip().splitlines()[-1].split("RuntimeError: ", 1)[1])
    run.log(1, "loading shard 17 of 40")
    report = diagnose_run(str(tmp_path))
    f = report.first_failure
    assert f.rank == 0 and f.match.signature == "collective_timeout"
    d = f.match.details
    assert d["waiting_ranks"] == [0] and d["late_ranks"] == [1] and "SIGKILL" in d["late_rank_fates"]["1"]
    assert "rank 1 never arrived" in f.match.title and "dmesg" in f.match.fix
    assert f.match.evidence[-1].text == "loading shard 17 of 40"  # where the late rank was
    assert "trainer.timeout_s (now" not in f.match.fix  # no recipe.yaml here: nothing to quote


def test_fix_quotes_the_runs_own_settings(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=2, nranks=3)
    oom = (FIXTURES / "cuda_oom.log").read_text()
    run.log(2, oom)
    run.error(2, "CUDA out of memory. Tried to allocate 2.00 GiB.", kind="torch.OutOfMemoryError")
    (tmp_path / "recipe.yaml").write_text("data:\n  batch_size: 64\ntrainer:\n  grad_accum: 1\n  timeout_s: 600\n")
    f = diagnose_run(str(tmp_path)).first_failure
    assert f.rank == 2 and f.match.signature == "cuda_oom"
    assert "data.batch_size (now 64)" in f.match.fix and "trainer.grad_accum (now 1)" in f.match.fix


def test_unknown_failure_shows_the_last_error_lines_plainly(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=0)
    run.log(0, "step 4 epoch 0  loss 1.3\nsomething odd happened in the C++ extension\nwith no known words")
    run.error(0, "the widget frobnicated", kind="WidgetProblem")
    f = diagnose_run(str(tmp_path)).first_failure
    assert f.match.signature == "unknown" and f.rank == 0
    assert "WidgetProblem: the widget frobnicated" in f.match.title
    assert [e.text for e in f.match.evidence][-2:] == ["with no known words", "WidgetProblem: the widget frobnicated"]
    assert "No known failure signature" in f.match.fix


def test_a_finished_run_exits_0_and_mentions_earlier_attempts(tmp_path: Path):
    run = RunDir(tmp_path, attempts=2, status="succeeded")
    run.log(1, "\n".join(f"[rank1]: {line}" for line in CRASH_TRACE.splitlines()), attempt=0)
    run.error(1, "injected fault: crash at step 3 on rank 1", CRASH_TRACE, step=3, attempt=0)
    report = diagnose_run(str(tmp_path))
    assert report.finished and report.exit_code == 0 and report.first_failure is None
    assert "finished after 1 restart(s)" in report.verdict
    assert [(e.attempt, e.rank, e.match.signature) for e in report.earlier_attempts] == [(0, 1, "python_exception")]


def test_a_signal_in_a_finished_runs_teardown_is_named_and_nothing_is_resumed(tmp_path: Path):
    RunDir(tmp_path, status="succeeded", signal="SIGINT")
    save_checkpoint(tmp_path, 1920, 30)
    report = diagnose_run(str(tmp_path))
    assert report.finished and report.exit_code == 0 and report.first_failure is None and report.preemption is None
    assert report.verdict.endswith(" finished (SIGINT arrived during the teardown, after the final checkpoint was "
                                   "complete).")
    assert report.resume_command is None
    console = Console(file=io.StringIO(), width=200)
    render(report, console)
    assert "--resume auto" not in console.file.getvalue()


def test_the_last_attempt_is_the_one_diagnosed(tmp_path: Path):
    run = RunDir(tmp_path, attempts=2, first_failed_rank=0)
    run.error(1, "injected fault: crash at step 3 on rank 1", CRASH_TRACE, step=3, attempt=0)
    run.log(0, (FIXTURES / "nan_mgpu.log").read_text().replace("[rank 1]", "[rank 0]"))
    # The record holds the step the NaN was detected at (the next log interval); the message, when it happened.
    run.error(0, "the loss became NaN or inf at step 23; the run stopped without saving that state.", step=25,
              kind="JobFailed")
    report = diagnose_run(str(tmp_path))
    f = report.first_failure
    assert (f.attempt, f.rank, f.match.signature, f.step, f.step_source) == (1, 0, "nan_loss", 23, "log message")
    assert "in attempt 2 of 2" in report.verdict


def test_stopped_run(tmp_path: Path):
    RunDir(tmp_path, status="stopped", signal="SIGINT")
    report = diagnose_run(str(tmp_path))
    assert report.status == "stopped" and report.exit_code == 1
    assert report.first_failure.match.signature == "stopped" and report.first_failure.rank is None
    assert "stopped by SIGINT" in report.verdict


# ------------------------------------------------------------------------------------------ preempted runs
def save_checkpoint(run_dir: Path, step: int, epoch: int) -> Path:
    """A checkpoint as the trainer writes it (torch.save through the checkpoint module)."""
    import torch

    from mgpucli.engine.checkpoints.files import save_atomic
    from mgpucli.engine.checkpoints.state import build_payload

    path = run_dir / "checkpoints" / "last.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic({**build_payload(epoch=epoch, step=step, mid_epoch=True, world_size=2, per_rank=[], recipe=""),
                 "model": {"weight": torch.zeros(3)}, "optimizer": {"state": {}, "param_groups": []}}, path)
    return path


def preempted_run(root: Path, signal: str | None = "SIGINT", step: int = 40, signalled: int | None = None,
                  checkpoint: bool = True, old_records: bool = False) -> RunDir:
    """Every rank stopped at ``step`` and saved (exit 75). ``signal``: what the launcher got (None: a worker got
    ``SIGTERM`` directly, rank ``signalled``). ``old_records``: as written before records had a signal field and
    took the step in progress (step + 1), and the stop was printed as an error."""
    result = {"exit_code": 75, "signal": signal, "step": step + 1 if old_records else step}
    run = RunDir(root, status="preempted", **result)
    run.data["result"]["exit_code"] = 75
    run.write()
    run.log(0, "mgpu train quickstart: 2 process(es) on cpu\nglobal batch 64; 16 steps per epoch; run dir x\n"
               f"step {step} epoch 3  loss 0.41")
    for rank in range(2):
        got = signal or ("SIGTERM" if rank == signalled else None)
        message = f"stopped by {got or 'a signal on another rank'} at step {step} (epoch 3); every rank agreed on " \
                  "that step and the checkpoint in runs/r/checkpoints is complete."
        files = run.attempts[-1].ranks[rank]
        rec = FailureRecord(rank, rank, 0, 100.0 + rank, "Preempted", message, step + 1 if old_records else step, 75,
                            False, None if old_records else got)
        write_record(record_path(files.error_file), rec)
        if rank == 0:
            run.log(0, ("error:  " if old_records else "mgpu train: ") + message)
            run.log(0, "Continue the run with the same command plus --resume auto.")
    run.metrics({"split": "train", "step": step, "epoch": 3, "loss": 0.41})
    if checkpoint:
        save_checkpoint(root, step, 2)
    return run


def assert_no_failure_wording(report, text: str) -> None:
    assert report.first_failure is None and report.others == []
    for phrase in ("failed", "No known failure signature", "exit code None", "error:"):
        assert phrase not in text, (phrase, text)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_preempted_run_is_not_a_failure(tmp_path: Path, sig: str):
    preempted_run(tmp_path, signal=sig, step=40)
    report = diagnose_run(str(tmp_path))
    assert (report.status, report.exit_code, report.finished, report.preempted) == ("preempted", 75, False, True)
    p = report.preemption
    assert (p.signal, p.step, p.step_source, p.checkpoint_step, p.epoch) == (sig, 40, "checkpoint", 40, 3)
    assert f"was preempted by {sig} at step 40 (epoch 3)" in report.verdict
    assert "checkpoints/last.pt holds it, complete" in report.verdict
    assert report.resume_command == "mgpu launch --cpu --nproc 2 r.yaml --resume auto"
    console = Console(file=io.StringIO(), width=200)
    render(report, console)
    shown = console.file.getvalue()
    assert_no_failure_wording(report, report.verdict + shown)
    assert "continue from checkpoints/last.pt (step 40): mgpu launch --cpu --nproc 2 r.yaml --resume auto" in shown
    assert "fix:" not in shown and "evidence:" not in shown


def test_a_preempted_run_in_json_and_postmortem_json(tmp_path: Path):
    preempted_run(tmp_path, step=40)
    report = diagnose_run(str(tmp_path))
    data = json.loads(Path(write_report(report)).read_text())
    assert (data["status"], data["exit_code"], data["finished"], data["first_failure"]) == ("preempted", 75, False,
                                                                                          None)
    assert data["preempted"] == {"signal": "SIGINT", "signalled_rank": None, "step": 40, "step_source": "checkpoint",
                                 "epoch": 3, "checkpoint_step": 40, "checkpoint_complete": True, "recorded_step": 40}
    assert data["resume_command"].endswith("--resume auto") and data["other_failures"] == []


def test_a_worker_that_got_the_signal_itself(tmp_path: Path):
    preempted_run(tmp_path, signal=None, signalled=1, step=24)  # `kill -TERM <worker>`: the launcher got nothing
    report = diagnose_run(str(tmp_path))
    assert report.exit_code == 75 and report.preemption.signal == "SIGTERM" and report.preemption.signalled_rank == 1
    assert "was preempted by SIGTERM (sent to rank 1) at step 24 (epoch 2)" in report.verdict
    assert_no_failure_wording(report, report.verdict)


def test_records_of_an_older_mgpu_take_the_checkpoints_step(tmp_path: Path):
    # They recorded step + 1 (the step in progress), no signal field, and printed the stop as `error:`.
    preempted_run(tmp_path, signal=None, signalled=0, step=40, old_records=True)
    report = diagnose_run(str(tmp_path))
    p = report.preemption
    assert report.exit_code == 75 and (p.step, p.checkpoint_step, p.recorded_step, p.signal) == (40, 40, 41, "SIGTERM")
    assert_no_failure_wording(report, report.verdict)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_preempted_without_a_complete_checkpoint_is_exit_1(tmp_path: Path, damage: str):
    preempted_run(tmp_path, step=40, checkpoint=damage != "missing")
    if damage == "truncated":
        last = tmp_path / "checkpoints" / "last.pt"
        last.write_bytes(last.read_bytes()[:200])
    report = diagnose_run(str(tmp_path))
    assert report.status == "preempted" and report.exit_code == 1 and not report.preempted
    p = report.preemption
    assert (p.step, p.step_source, p.checkpoint_step) == (40, "launch record", None)
    expected = "is missing" if damage == "missing" else "cannot be read (not a complete mgpu checkpoint)"
    assert f"checkpoints/last.pt {expected}: --resume auto has nothing complete" in report.verdict


def test_a_rank_that_crashed_during_the_stop_is_still_the_failure(tmp_path: Path):
    run = preempted_run(tmp_path, step=40)
    run.log(1, "\n".join(f"[rank1]: {line}" for line in CRASH_TRACE.splitlines()))
    run.error(1, "injected fault: crash at step 3 on rank 1", CRASH_TRACE, step=41)  # replaces its Preempted record
    report = diagnose_run(str(tmp_path))
    assert report.exit_code == 1 and report.first_failure.rank == 1
    assert report.first_failure.match.signature == "python_exception"


def test_resume_command_quotes_the_launch_argv_and_names_its_directory(tmp_path: Path, monkeypatch):
    from mgpucli.postmortem.context import resume_command

    launch = {"argv": ["mgpu", "launch", "--gpus", "0,1", "my recipes/r.yaml", "optim.lr=0.1", "--resume=step.pt",
                       "--overwrite", "name=it's"], "cwd": str(tmp_path)}
    monkeypatch.chdir(tmp_path)
    assert resume_command(launch) == ("mgpu launch --gpus 0,1 'my recipes/r.yaml' optim.lr=0.1 'name=it'\"'\"'s' "
                                      "--resume auto")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert resume_command(launch, cwd=str(elsewhere)) == f"cd {tmp_path} && " + resume_command(launch)


def test_a_run_whose_launcher_still_runs(tmp_path: Path, monkeypatch):
    import time

    from mgpucli.postmortem import diagnose

    run = RunDir(tmp_path, status="running")
    run.data["result"] = {"status": "running"}
    run.write()
    run.metrics({"split": "train", "step": 40, "epoch": 1, "loss": 0.5, "time": time.time() - 125})
    monkeypatch.setattr(diagnose, "launcher_alive", lambda launch: launch["env"]["MGPU_LAUNCH_PID"] == "999999999")
    report = diagnose_run(str(tmp_path))
    assert report.status == "running" and report.exit_code == 1 and report.first_failure is None
    assert report.verdict.startswith("still running: last logged step 40 (epoch 1), 12")  # 125 s ago


def test_a_launcher_that_died_without_a_result(tmp_path: Path):
    run = RunDir(tmp_path, status="running")
    run.data["result"] = {"status": "running"}
    run.write()
    report = diagnose_run(str(tmp_path))
    assert report.status == "launcher_gone" and not report.finished and "without recording a result" in report.verdict


def test_resume_command_drops_overwrite_when_a_checkpoint_exists(tmp_path: Path):
    crash_run(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"x")
    report = diagnose_run(str(tmp_path))
    assert report.resume_command == "mgpu launch --cpu --nproc 2 r.yaml --resume auto"


def test_a_moved_run_dir_still_reads(tmp_path: Path):
    crash_run(tmp_path / "cluster")
    shutil.move(str(tmp_path / "cluster"), str(tmp_path / "laptop"))
    f = diagnose_run(str(tmp_path / "laptop")).first_failure
    assert f.rank == 1 and f.match.signature == "python_exception"
    assert f.match.evidence[0].source.startswith(str(tmp_path / "laptop"))


def test_multi_node_records_are_merged(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=None)
    node1 = json.loads(json.dumps(run.data))
    (tmp_path / "node1").mkdir()
    other = RunDir(tmp_path / "node1", nranks=2)
    att = other.attempts[0].to_json()
    att["ranks"] = {str(int(k) + 2): {**v, "rank": int(k) + 2} for k, v in att["ranks"].items()}
    node1["attempts"] = [att]
    (tmp_path / "launch.node1.json").write_text(json.dumps(node1))
    unused = (FIXTURES / "ddp_unused.log").read_text().replace("[rank1]", "[rank3]")
    Path(att["ranks"]["3"]["stderr"]).write_text(unused)
    f = diagnose_run(str(tmp_path)).first_failure
    assert f.rank == 3 and f.match.signature == "ddp_unused_parameters"


def test_nodes_launched_with_different_overrides_disagree(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=0)
    gloo = (FIXTURES / "gloo_timeout.log").read_text()
    run.log(0, gloo)
    run.error(0, gloo.strip().splitlines()[-1].split("RuntimeError: ", 1)[1])
    node1 = {**run.data, "overrides": ["optim.lr=0.1"], "rendezvous": {**run.data["rendezvous"], "id": "mgpu-y"}}
    (tmp_path / "launch.node1.json").write_text(json.dumps(node1))
    report = diagnose_run(str(tmp_path))
    f = report.first_failure
    assert f.rank is None and f.match.signature == "ranks_disagree"
    assert f.match.details["differ"] == ["overrides", "rendezvous.id"]
    assert [e.cite() for e in f.match.evidence[:2]] == ["launch.json", "launch.node1.json"]
    assert f.match.evidence[1].text == 'overrides = ["optim.lr=0.1"]'
    assert report.others[0].match.signature == "collective_timeout"  # the consequence, kept


def test_deleted_logs_are_not_mistaken_for_a_silent_death(tmp_path: Path):
    run = RunDir(tmp_path, first_failed_rank=0)
    shutil.rmtree(tmp_path / "logs")
    f = diagnose_run(str(tmp_path / "launch.json")).first_failure  # launch.json itself is accepted too
    assert f.rank == 0 and f.match.signature == "unknown" and "logs are missing" in f.match.title
    assert run.attempts[0].ranks[0].stderr in f.match.title


@pytest.mark.parametrize("setup", ["missing", "empty_dir", "a_file", "bad_json"])
def test_not_a_run_directory_is_a_usage_error(tmp_path: Path, setup: str):
    target = tmp_path / "x"
    if setup == "empty_dir":
        target.mkdir()
    elif setup == "a_file":
        target.write_text("hello")
    elif setup == "bad_json":
        target.mkdir()
        (target / "launch.json").write_text('{"attempts": [')
    with pytest.raises(UsageError) as err:
        diagnose_run(str(target))
    assert err.value.exit_code == 2 and str(target) in str(err.value)


def test_render_fits_one_screen(tmp_path: Path):
    from rich.console import Console

    codes = {**{str(r): -6 for r in (0, 2, 3)}, **{str(r): 1 for r in range(4, 8)}, "1": -15}
    run = RunDir(tmp_path, first_failed_rank=0, nranks=8, exitcodes=codes)
    for line in (FIXTURES / "nccl_timeout_interleaved.log").read_text().splitlines() * 20:  # each rank its own
        run.log(int(line[5]), line)
    for rank in range(4, 8):
        run.log(rank, f"[rank{rank}]: {PEER}")
        run.error(rank, PEER.split(": ", 1)[1], when=200.0 + rank)
    report = diagnose_run(str(tmp_path))
    f = report.first_failure
    assert f.rank == 0 and f.match.details["waiting_ranks"] == [0, 2, 3]  # SIGABRT by NCCL's watchdog: explained
    assert f.match.details["late_ranks"] == [1, 4, 5, 6, 7]
    out = io.StringIO()
    render(report, Console(file=out, width=120))
    text = out.getvalue()
    flat = " ".join(text.split())
    assert "a collective timed out on rank 0: all-reduce (NCCL ALLREDUCE, sequence number 1580)" in flat
    assert "late: rank 1 (killed by SIGTERM); ranks 4, 5, 6, 7 (lost its connection to a peer)" in flat
    assert "also failed: ranks 2, 3 (timed out in a collective); ranks 4, 5, 6, 7 (lost" in flat and "fix:" in flat
    assert len(text.splitlines()) <= 24, text
    compact = io.StringIO()
    render(report, Console(file=compact, width=120), compact=True)
    assert len(compact.getvalue().splitlines()) < len(text.splitlines())


# ------------------------------------------------------------------------------------ several nodes that never met
MEETING = {"endpoint": "10.0.0.1:29500", "backend": "static", "nnodes": 2, "entry": 0, "waited_s": 600.0,
           "join_timeout": 600.0, "reachable": True, "here": ["node 0"], "missing": ["node 1"], "lost": [],
           "step": None}


@pytest.mark.parametrize("status, meeting, said", [
    ("unmet", {**MEETING, "kind": "timeout"},
     "did not start: the nodes never met at 10.0.0.1:29500: node 1 never joined within --join-timeout 600 s"),
    ("unmet", {**MEETING, "kind": "timeout", "reachable": False, "here": ["node 1"], "missing": ["node 0"]},
     "did not start: the nodes never met: the rendezvous store at 10.0.0.1:29500 never answered"),
    ("node_lost", {**MEETING, "kind": "lost", "entry": 1, "lost": ["node 1"], "step": 266},
     "stopped at step 266: node 1 was lost and did not rejoin at 10.0.0.1:29500 within --join-timeout 600 s"),
    ("refused", {**MEETING, "kind": "differ", "differences": [
        {"item": "optim.lr", "values": {"node 0": "0.05", "node 1": "0.2"},
         "said": "optim.lr: 0.05 on node 0, 0.2 on node 1"}]},
     "did not start: refused: the nodes met, but their jobs differ: optim.lr: 0.05 on node 0, 0.2 on node 1"),
    ("stopped", {**MEETING, "kind": "waiting"},
     "was stopped: the launcher was stopped by SIGTERM while the nodes met at 10.0.0.1:29500 (1 of 2 here: node 0; "
     "missing: node 1)"),
])
def test_a_launch_that_ended_while_its_nodes_met_is_told_as_such(tmp_path: Path, status: str, meeting: dict,
                                                                  said: str):
    (tmp_path / "run").mkdir()  # no attempt: no worker ever started
    run = RunDir(tmp_path / "run", attempts=0, status=status, rendezvous=meeting,
                 **({"signal": "SIGTERM"} if status == "stopped" else {}))
    report = diagnose_run(str(run.root))
    assert said in report.verdict, report.verdict
    assert report.first_failure is not None and report.first_failure.rank is None
