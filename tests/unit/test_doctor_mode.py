"""``mgpu doctor`` picks the machine check or the post-mortem from its argument alone (no process is started:
both are replaced by recorders)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mgpucli.cli.app import app
from mgpucli.doctor import examine
from mgpucli.doctor.examine import DEFAULT_TIMEOUT, DoctorOptions, Report


@pytest.fixture
def calls(monkeypatch):
    """What each mode was asked to do: ("machine", DoctorOptions) or ("postmortem", run_dir)."""
    seen: list[tuple[str, object]] = []

    def machine(opts: DoctorOptions, on_step=None) -> Report:
        seen.append(("machine", opts))
        return Report(checks=[], verdict="ok", status="ok")

    def postmortem(path: str):
        seen.append(("postmortem", path))
        raise SystemExit(0)

    monkeypatch.setattr(examine, "run_doctor", machine)
    monkeypatch.setattr("mgpucli.postmortem.diagnose_run", postmortem)
    return seen


def doctor(*args: str):
    return CliRunner().invoke(app, ["doctor", *args])


def test_no_argument_checks_the_machine_with_its_default_timeout(calls):
    assert doctor("--json").exit_code == 0
    ((mode, opts),) = calls
    assert mode == "machine" and opts.timeout == DEFAULT_TIMEOUT and not opts.quick


@pytest.mark.parametrize("timeout", ["30", "30.0", "5"])
def test_a_timeout_given_is_the_machine_checks_whatever_its_value(calls, timeout):
    assert doctor("--json", "--timeout", timeout).exit_code == 0
    assert calls[0][1].timeout == float(timeout)


def test_a_path_is_the_post_mortem(calls, tmp_path):
    assert doctor(str(tmp_path), "--json").exit_code == 0
    assert calls == [("postmortem", str(tmp_path))]


@pytest.mark.parametrize("options", [["--timeout", "30"], ["--timeout", "30.0"], ["--quick"], ["--cpu"],
                                     ["--nproc", "2"], ["--gpus", "1"], ["--cpu", "--nproc", "2", "--quick"]])
def test_machine_check_options_with_a_path_are_refused_whatever_their_value(calls, tmp_path, options):
    result = doctor(str(tmp_path), *options)
    assert result.exit_code == 2 and calls == [], result.output
    for flag in (o for o in options if o.startswith("--")):
        assert flag in result.output
    assert "check(s) this machine" in result.output and f"mgpu doctor {tmp_path}" in result.output
