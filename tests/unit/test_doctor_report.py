"""Results, verdict, options and the JSON shape (no processes: the observation is faked)."""

from __future__ import annotations

import json

import pytest

from mgpucli.doctor.examine import CHECKS, DoctorOptions, Report, live_checks, run_checks
from mgpucli.doctor.observation import Observation
from mgpucli.doctor.plan import DeviceOptions
from mgpucli.doctor.result import AREAS, CheckResult, fail, ok, overall_status, skipped, verdict, warn
from mgpucli.errors import UsageError


def test_warn_and_fail_need_a_hint():
    with pytest.raises(ValueError, match="without a hint"):
        CheckResult("x", "host", "warn", "seen")
    with pytest.raises(ValueError, match="unknown check status"):
        CheckResult("x", "host", "bad", "seen")


def test_overall_status_and_verdict():
    results = [ok("a", "host", "."), skipped("b", "host", ".")]
    assert overall_status(results) == "ok"
    assert verdict(results, "2 CPU processes (gloo)") == "ready for 2 CPU processes (gloo)."
    results.append(warn("c", "host", ".", "fix c"))
    assert overall_status(results) == "warn"
    assert verdict(results, "x").startswith("ready for x, with 1 warning(s) (c)")
    results.append(fail("d", "host", ".", "fix d"))
    assert overall_status(results) == "fail"
    assert verdict(results, "x").startswith("not ready: 1 check(s) failed (d)")


def test_report_json_shape_and_exit_code():
    report = Report([ok("a", "host", "seen"), fail("b", "live", "bad", "do this")], "not ready", "fail")
    data = json.loads(json.dumps(report.to_json()))
    assert data["verdict"] == "not ready" and data["status"] == "fail"
    assert data["checks"][1] == {"name": "b", "area": "live", "status": "fail", "detail": "bad", "hint": "do this"}
    assert report.exit_code == 1
    assert Report([warn("a", "host", ".", "h")], "v", "warn").exit_code == 0


def test_every_check_runs_on_a_default_observation():
    results = run_checks(Observation())
    assert len(results) == len(CHECKS)
    assert all(r.area in AREAS for r in results)
    assert len({r.name for r in results}) == len(results)


def test_timeout_must_be_positive():
    with pytest.raises(UsageError, match="--timeout"):
        DoctorOptions(timeout=0).validate()
    DoctorOptions(DeviceOptions(cpu=True, nproc=2), timeout=5).validate()


def test_live_test_skipped_with_quick_or_without_selection():
    from mgpucli.doctor.observation import Plan

    quick, rows = live_checks(Observation(), DoctorOptions(quick=True))
    assert [r.status for r in quick] == ["skipped"] and rows == []
    none, _ = live_checks(Observation(plan=Plan(kind=None, error="x")), DoctorOptions())
    assert "device selection" in none[0].detail
