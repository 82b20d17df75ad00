"""Run the doctor: observe, check, live-test, decide. Returns data; the CLI renders it."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mgpucli.doctor import checks_devices, checks_host, checks_nccl, checks_rank, checks_software, checks_visible
from mgpucli.doctor.observation import Observation
from mgpucli.doctor.plan import DeviceOptions
from mgpucli.doctor.result import AREAS, FAIL, CheckResult, overall_status, skipped, verdict
from mgpucli.errors import UsageError

DEFAULT_TIMEOUT = 30.0
CHECKS = (
    *checks_software.CHECKS,
    *checks_software.tracker_checks(),  # one per tracker registered when the doctor is imported
    *checks_devices.CHECKS,
    *checks_visible.CHECKS,
    *checks_rank.CHECKS,
    *checks_nccl.CHECKS,
    *checks_host.CHECKS,
)


@dataclass(frozen=True)
class DoctorOptions:
    devices: DeviceOptions = field(default_factory=DeviceOptions)
    quick: bool = False  # skip the live test
    timeout: float = DEFAULT_TIMEOUT  # for each probe, and for the live test

    def validate(self) -> None:
        self.devices.validate()
        if not 0 < self.timeout < math.inf:  # nan and inf too: a probe needs a deadline it can reach
            raise UsageError(f"--timeout {self.timeout:g}: must be a finite number of seconds above 0.",
                             "Example: --timeout 30.")


@dataclass(frozen=True)
class Report:
    checks: list[CheckResult]
    verdict: str
    status: str
    bandwidth: list[dict[str, float]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.status == FAIL else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "checks": [c.as_dict() for c in self.checks],
            "verdict": self.verdict,
            "status": self.status,
            "bandwidth": self.bandwidth,
        }


def run_checks(obs: Observation) -> list[CheckResult]:
    return [check(obs) for check in CHECKS]


def live_checks(obs: Observation, opts: DoctorOptions) -> tuple[list[CheckResult], list[dict[str, float]]]:
    """The live test's checks and bandwidth rows, or one skipped check saying why it did not run."""
    if opts.quick:
        return [skipped("live test", "live", "skipped with --quick")], []
    if obs.plan.kind is None:
        return [skipped("live test", "live", "no runnable device selection (see 'device selection')")], []
    if obs.torch.error is not None or not obs.torch.dist_available:
        return [skipped("live test", "live", "torch.distributed is not usable (see 'software')")], []
    from mgpucli.doctor.checks_host import effective_cpus
    from mgpucli.doctor.live import run_live_test
    from mgpucli.doctor.live_summary import bandwidth_rows, summarize

    outcome = run_live_test(obs.plan, opts.timeout, obs.env, effective_cpus(obs))
    return summarize(outcome), bandwidth_rows(outcome)


def run_doctor(
    opts: DoctorOptions, environ: Mapping[str, str] | None = None, on_step: Callable[[str], None] | None = None
) -> Report:
    """Validate the options (UsageError), observe, run every check and the live test, pick the verdict."""
    from mgpucli.doctor.gather import observe

    opts.validate()
    step = on_step or (lambda _msg: None)
    step("looking at torch, the driver and the host")
    obs = observe(opts.devices, opts.timeout, os.environ if environ is None else environ)
    results = run_checks(obs)
    if not opts.quick and obs.plan.kind is not None:
        step(f"live test: {obs.plan.describe()} (at most {opts.timeout:g} s)")
    live, bandwidth = live_checks(obs, opts)
    results = sorted(results + live, key=lambda r: AREAS.index(r.area))  # stable: keeps order within an area
    what = obs.plan.describe() + (" (live test skipped)" if opts.quick else "")
    return Report(results, verdict(results, what), overall_status(results), bandwidth)
