"""``mgpu launch --audit SCRIPT.py``: the tutorial's traps found in users' own scripts, under the real CLI, 2 CPU
workers with gloo (issue 27's Verify list). The scripts are in ``tests/e2e/scripts`` (``audit_*.py``), copied into
each test's temporary directory; processes are tagged and checked as in tests/e2e/test_launch.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

from tests.e2e import test_scripts
from tests.e2e.test_launch import run_launch
from tests.e2e.test_scripts import CPU2, doctor_json

work = test_scripts.work  # the fixture: a working directory holding the test scripts


def traps(script: Path) -> dict[str, int]:
    """The kind of finding each ``# TRAP kind`` line of the script should produce -> its line number."""
    out = {}
    for number, line in enumerate(script.read_text().splitlines(), start=1):
        found = re.search(r"# TRAP (\w+)", line)
        if found:
            out[found.group(1)] = number
    return out


def live_findings(output: str) -> list[str]:
    """The findings the launcher printed as they came: ``mgpu audit: rank N, FILE:LINE: title``."""
    return [line for line in output.splitlines() if re.match(r"mgpu audit: rank \d+", line)]


def test_a_wrong_tutorial_script_gets_each_trap_with_its_line_and_keeps_its_exit_code(work: Path, tag: str):
    run_dir = work / "wrong"
    code, launch = run_launch([*CPU2, "--audit", "--run-dir", str(run_dir), "audit_wrong.py", "--exit-code", "3"],
                              work, tag, timeout=120)
    out = launch.output
    assert code == 3, out  # the script's own code: findings never change it
    expected = traps(work / "audit_wrong.py")
    assert len(expected) == 5
    shown = live_findings(out)
    for kind, line in expected.items():  # each kind live, once, at the user's line
        assert len([s for s in shown if f"audit_wrong.py:{line}: " in s]) == 1, (kind, out)
    assert len(shown) == 5, out
    assert "mgpu audit: 5 kinds of finding" in out and f"{run_dir / 'audit.json'}" in out
    audit = json.loads((run_dir / "audit.json").read_text())
    summary = {g["kind"]: g for g in audit["summary"]}
    assert sorted(summary) == sorted(expected), summary
    for kind, line in expected.items():
        assert summary[kind]["where"] == [f"audit_wrong.py:{line}"], summary[kind]
        assert summary[kind]["fix"] and summary[kind]["cost"]
    assert "not wrapped in DistributedDataParallel" in summary["params_diverged"]["title"]
    assert "every rank iterates all 64 samples" in summary["loader_not_distributed"]["title"]
    assert "over 101 samples on 2 ranks" in summary["padded_evaluation"]["title"]
    assert summary["set_epoch_missing"]["ranks"] == [0, 1] and summary["same_save_path"]["count"] == 1
    assert {s["rank"] for s in audit["status"]} <= {0, 1}  # a rank still finishing when the other exited 3 is
    # stopped by torch's agent: its status line may be missing, never its findings (written as they are found)
    doctor_code, report = doctor_json(run_dir, work)
    assert doctor_code == 1, report  # the run failed: it exited 3
    assert sorted(g["kind"] for g in report["audit"]["summary"]) == sorted(expected)
    assert report["first_failure"]["signature"] == "script_exit"


def test_a_correct_script_has_no_findings_and_the_same_final_weights_as_without_audit(work: Path, tag: str):
    runs = {}
    for audited in (True, False):
        run_dir = work / ("audited" if audited else "plain")
        args = [*CPU2, *(["--audit"] if audited else []), "--run-dir", str(run_dir), "audit_correct.py"]
        code, launch = run_launch(args, work, tag, timeout=120, name=run_dir.name)
        assert code == 0, launch.output
        runs[audited] = (run_dir, launch.output)
    run_dir, out = runs[True]
    assert "torch before the first line: False; audit loaded: True" in out  # installed when the script imports it
    assert "torch before the first line: False; audit loaded: False" in runs[False][1]  # nothing without --audit
    assert "mgpu audit: no findings" in out and not live_findings(out), out
    audit = json.loads((run_dir / "audit.json").read_text())
    assert audit["summary"] == [] and audit["findings"] == []
    checked = {s["rank"]: s["checked"] for s in audit["status"]}
    assert checked[0]["optimizer steps"] == 64 and checked[0]["DDP models"] == 1 and checked[0]["data loaders"] == 3
    assert sum(c.get("parameter comparisons", 0) for c in checked.values()) >= 3  # steps 1, 2 (more unless they
    # cost too much next to the steps: the audit backs off) and the end
    assert not (runs[False][0] / "audit.json").exists()
    audited, plain = (torch.load(r / "final.pt", weights_only=True) for r in (run_dir, runs[False][0]))
    assert audited.keys() == plain.keys()
    for key in audited:  # bitwise
        assert torch.equal(audited[key].view(torch.uint8), plain[key].view(torch.uint8)), key
    doctor_code, report = doctor_json(run_dir, work)
    assert doctor_code == 0 and report["audit"]["summary"] == []


def test_ranks_taking_different_numbers_of_steps_do_not_hang_the_audit_and_are_a_finding(work: Path, tag: str):
    run_dir = work / "uneven"
    began = time.monotonic()
    code, launch = run_launch([*CPU2, "--audit", "--run-dir", str(run_dir), "audit_uneven_steps.py"], work, tag,
                              timeout=120)
    took = time.monotonic() - began
    out = launch.output
    assert code == 0, out
    assert took < 90, f"took {took:.0f} s"  # a generous bound: a hang would run into the test's timeout
    audit = json.loads((run_dir / "audit.json").read_text())
    (steps,) = [f for f in audit["findings"] if f["kind"] == "optimizer_steps_differ"]
    assert steps["details"]["steps"] == [20, 15], steps  # rank 1 skipped one step in each of 5 epochs
    assert "ranks took different numbers of optimizer steps (rank 0: 20, rank 1: 15)" in steps["title"]
    assert "a rank that never arrives holds nobody up, so nothing hung" in steps["cost"]
    unmatched = steps["details"]["unmatched_checks"]  # rank 0's comparisons past step 15 (how many: its timing's)
    assert all(n > 15 for n in unmatched) and (not unmatched or "rank 1 never got there" in steps["cost"])
    assert steps["where"]["line"] == traps(work / "audit_uneven_steps.py")["optimizer_steps_differ"]
    assert "ranks took different numbers of optimizer steps" in out  # shown live


@pytest.mark.gpu
def test_device_mistakes_on_two_gpus_are_found_in_local_rank_1(work: Path, tag: str):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: with one, cuda:0 is every rank's only GPU")
    run_dir = work / "gpus"
    code, launch = run_launch(["--gpus", "2", "--audit", "--run-dir", str(run_dir), "audit_gpu_wrong.py"], work, tag,
                              timeout=180)
    assert code == 0, launch.output
    audit = json.loads((run_dir / "audit.json").read_text())
    summary = {g["kind"]: g for g in audit["summary"]}
    expected = traps(work / "audit_gpu_wrong.py")
    for kind, line in expected.items():
        assert summary[kind]["ranks"] == [1] and f"audit_gpu_wrong.py:{line}" in summary[kind]["where"], summary
