"""``mgpu launch --audit``'s records and what reads them: the findings files, ``audit.json``, the launcher's live
view and summary, ``mgpu doctor RUN_DIR``, and the option's way from the command line to the worker."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from mgpucli.errors import UsageError
from mgpucli.launch.audit_view import AuditWatch, checked_line, notes
from mgpucli.launch.plan import LaunchOptions, check_job_options
from mgpucli.launch.script import ScriptTarget
from mgpucli.launch.script_job import ScriptJob
from mgpucli.postmortem.reader import _read_audit
from mgpucli.postmortem.render import audit_lines
from mgpucli.run_records import audit_records as records
from mgpucli.run_records.audit_records import Finding, Where
from mgpucli.run_records.launch_record import Attempt, LaunchRecord, RankFiles


def finding(kind: str, rank: int, line: int, file: str = "/w/train.py") -> Finding:
    return Finding(kind=kind, rank=rank, title=f"{kind} on {rank}", cost="it costs", fix="do this\nthen that",
                   where=Where(file, line, "<module>", "code()"), time=float(rank))


def test_findings_round_trip_and_a_partial_line_is_skipped(tmp_path: Path):
    path = str(tmp_path / records.FINDINGS_NAME)
    records.append(path, finding("same_save_path", 1, 40).to_json())
    records.append(path, {"record": "status", "rank": 1, "checked": {"files saved": 1}})
    with open(path, "a") as fh:
        fh.write('{"record": "finding", "kind": "x"')  # a writer killed mid-line
    found, statuses = records.read_file(path)
    assert found == [finding("same_save_path", 1, 40)] and statuses[0]["checked"] == {"files saved": 1}
    assert records.findings_path("/logs/attempt_0/1/error.json") == "/logs/attempt_0/1/mgpu_audit.jsonl"


def test_the_summary_is_one_entry_per_kind_in_a_fixed_order_with_counts_ranks_and_places():
    found = [finding("set_epoch_missing", 0, 26), finding("params_diverged", 1, 24),
             finding("set_epoch_missing", 1, 26), finding("set_epoch_missing", 1, 31)]
    summary = records.summarize(found, cwd="/w")
    assert [g["kind"] for g in summary] == ["params_diverged", "set_epoch_missing"]
    assert summary[1] == {"kind": "set_epoch_missing", "name": records.KINDS["set_epoch_missing"], "count": 3,
                          "ranks": [0, 1], "where": ["train.py:26", "train.py:31"], "title": "set_epoch_missing on 0",
                          "cost": "it costs", "fix": "do this\nthen that"}
    assert Where("/elsewhere/x.py", 3).cite("/w") == "/elsewhere/x.py:3"


def test_a_kinds_summary_tells_of_the_lowest_ranks_first_finding_whichever_rank_came_first():
    """Ranks that run apart: rank 1 reached its evaluation loader before rank 0 reached its training loader."""
    train0, eval0 = finding("loader_not_distributed", 0, 60), finding("loader_not_distributed", 0, 60)
    eval1 = finding("loader_not_distributed", 1, 60)
    train0.title, eval0.title, eval1.title = "all 64 samples", "all 17 samples", "all 17 samples"
    (group,) = records.summarize([eval1, train0, eval0])
    assert (group["title"], group["count"], group["ranks"]) == ("all 64 samples", 3, [0, 1])


def test_audit_json_belongs_to_its_launch_and_can_be_rebuilt_from_the_ranks_files(tmp_path: Path):
    path = str(tmp_path / records.AUDIT_JSON)
    records.write_audit(path, "mgpu-1", [finding("padded_evaluation", 0, 28)], [{"record": "status", "rank": 0}])
    assert records.read_audit(path, "mgpu-1")["summary"][0]["count"] == 1
    assert records.read_audit(path, "mgpu-2") is None  # an earlier launch's, in a run dir used again
    rank_file = tmp_path / "1" / records.FINDINGS_NAME
    rank_file.parent.mkdir()
    records.append(str(rank_file), finding("same_save_path", 1, 40).to_json())
    rebuilt = records.from_rank_files([str(rank_file), str(tmp_path / "2" / records.FINDINGS_NAME)], "mgpu-2")
    assert [f["kind"] for f in rebuilt["findings"]] == ["same_save_path"]
    assert records.from_rank_files([str(tmp_path / "nothing")]) is None


# ------------------------------------------------------------------------------------------ the launcher
def _record(tmp_path: Path) -> LaunchRecord:
    ranks = {}
    for rank in (0, 1):
        (tmp_path / "attempt_0" / str(rank)).mkdir(parents=True)
        ranks[rank] = RankFiles(rank, rank, "", "", str(tmp_path / "attempt_0" / str(rank) / "error.json"))
    record = LaunchRecord(str(tmp_path / "launch.json"), {})
    record.add_attempt(Attempt(0, str(tmp_path / "attempt_0"), ranks))
    return record


def _console() -> Console:
    return Console(record=True, width=200, file=open("/dev/null", "w"))  # noqa: SIM115


def test_the_launcher_shows_each_kind_once_then_a_table_and_writes_audit_json(tmp_path: Path):
    record = _record(tmp_path)
    console = _console()
    watch = AuditWatch(record, console=console)
    files = {r: records.findings_path(f.error_file) for r, f in record.attempts[0].ranks.items()}
    records.append(files[0], finding("set_epoch_missing", 0, 26).to_json())
    watch._tick()
    records.append(files[1], finding("set_epoch_missing", 1, 26).to_json())
    records.append(files[1], finding("same_save_path", 1, 40).to_json())
    for rank in (0, 1):
        records.append(files[rank], {"record": "status", "rank": rank, "checked": {"optimizer steps": 8},
                                     "notes": ["a note"]})
    path = watch.finish("mgpu-1")
    text = console.export_text()
    assert text.count("mgpu audit: rank") == 2  # set_epoch_missing shown once, same_save_path once
    assert "mgpu audit: rank 0, " in text and "set_epoch_missing on 0" in text and "    then that" in text
    assert "2 kinds of finding (3 in all)" in text and "note: a note (ranks 0, 1)" in text
    data = json.loads(Path(path).read_text())
    assert path == str(tmp_path / "audit.json") and data["launch_id"] == "mgpu-1"
    assert [(g["kind"], g["count"]) for g in data["summary"]] == [("set_epoch_missing", 2), ("same_save_path", 1)]
    assert len(data["status"]) == 2


def test_a_finding_starts_its_own_line_after_a_progress_bars_partial_line(tmp_path: Path):
    record = _record(tmp_path)
    stream = io.StringIO()
    watch = AuditWatch(record, console=Console(file=stream, width=200))
    stream.write("[rank0]:  0%|          | 0/2 [00:00<?, ?it/s]")  # torch's tee: tqdm's line, no newline yet
    records.append(records.findings_path(record.attempts[0].ranks[0].error_file),
                   finding("set_epoch_missing", 0, 26).to_json())
    watch._tick()
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("it/s]") and lines[1].startswith("mgpu audit: rank 0, /w/train.py:26: "), lines


def test_no_findings_says_what_was_checked(tmp_path: Path):
    record = _record(tmp_path)
    console = _console()
    watch = AuditWatch(record, console=console)
    error_file = record.attempts[0].ranks[0].error_file
    records.append(records.findings_path(error_file), {"record": "status", "rank": 0, "checked": {
        "optimizer steps": 64, "parameter comparisons": 7}})
    records.append(records.findings_path(record.attempts[0].ranks[1].error_file), {
        "record": "status", "rank": 1, "checked": {"optimizer steps": 60}})
    watch.finish(None)
    text = console.export_text()
    assert "mgpu audit: no findings" in text
    assert ("checked on 2 ranks: optimizer steps 64 (the most on one rank); parameter comparisons 7" in text)
    assert checked_line([]).startswith("no rank reported") and notes([]) == []


# ------------------------------------------------------------------------------------------ mgpu doctor RUN_DIR
def test_the_post_mortem_reads_this_launchs_findings_or_rebuilds_them(tmp_path: Path):
    record = _record(tmp_path)
    launch = {"script": {"audit": True}, "rendezvous": {"id": "mgpu-2"}, "cwd": "/w"}
    records.write_audit(str(tmp_path / "audit.json"), "mgpu-1", [finding("padded_evaluation", 0, 28)], [])
    records.append(records.findings_path(record.attempts[0].ranks[1].error_file),
                   finding("same_save_path", 1, 40).to_json())
    audit = _read_audit(str(tmp_path), launch, record.attempts)
    assert [g["kind"] for g in audit["summary"]] == ["same_save_path"]  # audit.json was another launch's
    assert _read_audit(str(tmp_path), {"script": {"audit": False}}, record.attempts) is None
    lines = [text for text, _ in audit_lines(audit)]
    assert "1 kind of finding" in lines[0] and lines[1].startswith("    same_save_path (rank 1) at train.py:40: ")
    assert lines[2:] == ["      fix: do this", "           then that"]
    assert audit_lines(None) == [] and audit_lines({"summary": []}) == [("  audit: no findings", "green")]


# ------------------------------------------------------------------------------------------ the option
def test_audit_reaches_the_worker_and_is_refused_with_a_recipe():
    target = ScriptTarget(path="main.py", args=("--audit",), local_rank_flag="--local_rank", audit=True)
    args = target.worker_args()
    assert args == ["script", "--local-rank-flag", "--local_rank", "--audit", "main.py", "--audit"]
    assert ScriptJob.parse(args[1:]).target == target  # the script's own --audit stays the script's
    assert ScriptJob.parse(["--audit", "-m", "pkg.train"]).target == ScriptTarget(module="pkg.train", audit=True)
    with pytest.raises(UsageError, match="--audit checks your own training script"):
        check_job_options(LaunchOptions(recipe="quickstart", audit=True))
