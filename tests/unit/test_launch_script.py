"""Script mode's parts without processes: the target and its checks, the legacy --local_rank spelling, the run dir
a launch gets, the worker's script job, mgpucli.progress, the exit code passed on, records kept."""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import pytest

from mgpucli.errors import UsageError
from mgpucli.launch.script import (
    ScriptTarget,
    check_target,
    declared_local_rank_flag,
    default_run_dir,
    find_module,
    local_rank_flag,
)
from mgpucli.launch.script_job import ScriptJob, _run_script, _user_frames


# ------------------------------------------------------------------------------------------ the target
def test_a_target_is_a_path_or_a_module_with_its_arguments():
    path = ScriptTarget(path="src/main.py", args=("--lr", "1"))
    assert path.name == "main" and path.words() == ["src/main.py", "--lr", "1"] and path.argv("0") == ["--lr", "1"]
    module = ScriptTarget(module="pkg.train", local_rank_flag="--local-rank")
    assert module.name == "train" and module.worker_args() == ["script", "--local-rank-flag", "--local-rank", "-m",
                                                               "pkg.train"]
    assert module.argv("1") == ["--local-rank=1"]
    with pytest.raises(ValueError):
        ScriptTarget()


def test_a_missing_script_or_module_is_bad_input(tmp_path: Path):
    (tmp_path / "main.py").write_text("print('hi')\n")
    (tmp_path / "adir.py").mkdir()
    assert check_target(ScriptTarget(path="main.py"), str(tmp_path)) == str(tmp_path / "main.py")
    with pytest.raises(UsageError, match="does not exist"):
        check_target(ScriptTarget(path="nope.py"), str(tmp_path))
    with pytest.raises(UsageError, match="is a directory"):
        check_target(ScriptTarget(path="adir.py"), str(tmp_path))
    with pytest.raises(UsageError, match="not a module name"):
        check_target(ScriptTarget(module="main.py/x"), str(tmp_path))


def test_modules_are_found_as_python_m_finds_them_without_running_them(tmp_path: Path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('the launcher must not import this')\n")
    (pkg / "train.py").write_text("")
    (pkg / "sub" / "__main__.py").write_text("")
    (tmp_path / "nsp").mkdir()  # a namespace package
    (tmp_path / "nsp" / "go.py").write_text("")
    where = [str(tmp_path)]
    assert find_module("pkg.train", where) == str(pkg / "train.py")
    assert find_module("pkg.sub", where) == str(pkg / "sub" / "__main__.py")  # a package: its __main__
    assert find_module("nsp.go", where) == str(tmp_path / "nsp" / "go.py")
    with pytest.raises(UsageError, match="has no __main__.py"):
        find_module("pkg", where)
    with pytest.raises(UsageError, match="no module named 'pkg.nope'"):
        find_module("pkg.nope.deeper", where)
    with pytest.raises(UsageError, match="no module named 'pkg.train.x'"):
        find_module("pkg.train.x", where)  # a module is no package


@pytest.mark.parametrize("source, flag", [
    ("parser.add_argument('--local_rank', type=int, default=-1)", "--local_rank"),
    ('parser.add_argument("--local-rank", type=int)', "--local-rank"),
    ("p.add_argument('--local-rank', '--local_rank', dest='local_rank')", "--local-rank"),  # both: torch's
    ("# run with --local_rank=N\nlocal_rank = int(os.environ['LOCAL_RANK'])", None),  # a comment is no declaration
    ("", None),
])
def test_the_declared_spelling_is_read_from_the_source(source: str, flag: str | None):
    assert declared_local_rank_flag(source) == flag


def test_an_undeclared_spelling_falls_back_to_torchs_with_a_note(tmp_path: Path):
    script = tmp_path / "main.py"
    script.write_text("import os\n")
    flag, note = local_rank_flag(str(script))
    assert flag == "--local-rank" and "spells out neither" in note
    script.write_text("p.add_argument('--local_rank')\n")
    assert local_rank_flag(str(script))[0] == "--local_rank"


# ------------------------------------------------------------------------------------------ its run dir
def test_every_launch_gets_a_new_run_dir(tmp_path: Path):
    root = str(tmp_path / "runs")
    stamp = time.mktime((2026, 12, 1, 15, 30, 0, 0, 0, -1))
    named = default_run_dir("main", 1, "id", claim=False, root=root, now=lambda: stamp)
    assert named == f"{root}/main-20261201-153000" and not Path(named).exists()  # a dry run names it only
    first = default_run_dir("main", 1, "id", claim=True, root=root, now=lambda: stamp)
    second = default_run_dir("main", 1, "id", claim=True, root=root, now=lambda: stamp)
    assert first == named and second == f"{named}-2" and Path(first).is_dir() and Path(second).is_dir()
    assert default_run_dir("main", 1, "id", claim=False, root=root, now=lambda: stamp) == f"{named}-3"
    assert default_run_dir("main", 2, "mgpu-abc", claim=True, root=root) == f"{root}/main-mgpu-abc"  # all nodes


# ------------------------------------------------------------------------------------------ the worker's job
def test_the_script_job_parses_what_the_launcher_passes():
    job = ScriptJob.parse(["--local-rank-flag", "--local_rank", "main.py", "--local-rank-flag", "-m", "x"])
    assert job.target == ScriptTarget(path="main.py", args=("--local-rank-flag", "-m", "x"),
                                      local_rank_flag="--local_rank")
    assert ScriptJob.parse(["-m", "pkg.train", "a"]).target == ScriptTarget(module="pkg.train", args=("a",))
    assert job.for_restart({"TORCHELASTIC_RESTART_COUNT": "1"}) is job  # a script resumes itself
    for bad in ([], ["-m"], ["--local-rank-flag", "--rank", "main.py"]):
        with pytest.raises(UsageError):
            ScriptJob.parse(bad)


@pytest.fixture
def restored_sys(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_a_script_runs_as_python_runs_it(tmp_path: Path, restored_sys):
    out = tmp_path / "seen.json"
    script = tmp_path / "src" / "main.py"
    script.parent.mkdir()
    script.write_text("import json, sys\n"
                      "seen = {'name': __name__, 'argv': sys.argv, 'path0': sys.path[0]}\n"
                      f"json.dump(seen, open({str(out)!r}, 'w'))\n")
    _run_script(ScriptTarget(path=str(script)), ["--lr", "1"])
    assert json.loads(out.read_text()) == {"name": "__main__", "argv": [str(script), "--lr", "1"],
                                           "path0": str(script.parent)}


def test_a_failing_scripts_traceback_starts_in_the_script(tmp_path: Path, restored_sys):
    script = tmp_path / "boom.py"
    script.write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    with pytest.raises(ValueError) as info:
        _run_script(ScriptTarget(path=str(script)), [])
    below_the_test = info.value.__traceback__.tb_next  # the script job's own frames, runpy's, then the script's
    frames = traceback.extract_tb(_user_frames(below_the_test))
    assert [(f.filename, f.name) for f in frames] == [(str(script), "<module>"), (str(script), "f")]


# ------------------------------------------------------------------------------------------ mgpucli.progress
class FakeBeat:  # a Heartbeat that saw the other ranks at these steps
    def __init__(self, steps: dict[int, int | None]):
        from mgpucli.distributed.heartbeat import Seen

        self.rank, self.world_size, self.step = 0, len(steps), steps[0]
        self._seen = [Seen(r, s, "script", 0.5) for r, s in steps.items()]

    def others(self):
        return self._seen

    def connect(self):
        pass


def test_progress_is_a_no_op_outside_mgpu_launch_and_timeouts_name_every_ranks_step(monkeypatch):
    import mgpucli
    from mgpucli.distributed import step_progress

    monkeypatch.setattr(step_progress, "_enabled", False)
    monkeypatch.setattr(step_progress, "_step", None)
    mgpucli.progress(5)
    assert step_progress.current_step() is None
    monkeypatch.setattr(step_progress, "_enabled", True)
    monkeypatch.setattr(step_progress, "_heartbeat", FakeBeat({0: 7, 1: 4, 2: 7}))
    mgpucli.progress(7)
    assert step_progress.current_step() == 7
    assert step_progress.timeout_note(ValueError("bad value")) is None  # not a timeout
    note = step_progress.timeout_note(RuntimeError("Timed out waiting 3000ms for recv operation to complete"))
    assert note.startswith("mgpu: steps each rank had reached (mgpucli.progress): rank 0: 7, rank 1: 4, rank 2: 7.")
    assert "Ranks that had not arrived: rank 1 (last seen at step 4" in note and "rank 2 (" not in note


# ------------------------------------------------------------------------------------------ the exit code
@pytest.mark.parametrize("codes, expected", [([3, 3], 3), ([3, -15], 3), ([-9, 1], 137), ([None], 1), ([], 1),
                                             ([0], 1)])
def test_launch_exits_with_the_first_failing_ranks_code(codes, expected):
    from mgpucli.run_records.first_failure import RankFailure, job_exit_code

    failures = [RankFailure(r, r, c, None, None, None, None, "", "", "") for r, c in enumerate(codes)]
    assert job_exit_code(failures) == expected


# ------------------------------------------------------------------------------------------ records kept
def test_a_launch_that_starts_keeps_the_earlier_launchs_records(tmp_path: Path):
    from mgpucli.run_records.launch_record import LaunchRecord

    run_dir = tmp_path / "exp"
    (run_dir / "logs").mkdir(parents=True)
    earlier = {"rendezvous": {"id": "mgpu-old"}, "result": {"status": "failed"}}
    (run_dir / "launch.json").write_text(json.dumps(earlier))
    (run_dir / "postmortem.json").write_text("{}")
    pending = run_dir / "logs" / "launch-mgpu-new" / "launch.json"
    record = LaunchRecord(str(pending), {"rendezvous": {"id": "mgpu-new"}}, final_path=str(run_dir / "launch.json"))
    record.write()
    record.promote()
    assert json.loads((run_dir / "launch.json").read_text())["rendezvous"]["id"] == "mgpu-new"
    assert not pending.parent.exists() and not (run_dir / "postmortem.json").exists()
    kept = run_dir / "logs" / "launch-mgpu-old"
    assert json.loads((kept / "launch.json").read_text()) == earlier and (kept / "postmortem.json").is_file()


# ------------------------------------------------------------------------------------------ the live view
def test_the_live_view_follows_the_rank_asked_for_or_every_rank_prefixed(tmp_path: Path):
    from rich.console import Console

    from mgpucli.launch.live_view import LiveView
    from mgpucli.run_records.launch_record import Attempt, LaunchRecord, RankFiles

    ranks = {}
    for rank in (0, 1):
        out = tmp_path / f"out{rank}.log"
        out.write_text(f"hello from {rank}\n")
        ranks[rank] = RankFiles(rank, rank, str(out), str(tmp_path / "missing.log"), "")
    record = LaunchRecord(str(tmp_path / "launch.json"), {})
    record.add_attempt(Attempt(0, str(tmp_path), ranks))
    for show, expected in ((None, ["hello from 0"]), ("1", ["hello from 1"]),
                           ("all", ["[rank0]:hello from 0", "[rank1]:hello from 1"])):
        console = Console(record=True, width=200, file=open("/dev/null", "w"))  # noqa: SIM115
        view = LiveView(record, None, console=console, show=show)
        view._tick(final=True)
        assert console.export_text().splitlines() == expected, show
