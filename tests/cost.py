"""What each test costs the machine, shown at the end of every run (CI's included): the tests whose processes used
the most CPU, beside pytest's ``--durations`` (wall time). A test's CPU is the test process's own plus that of
every process it started and reaped (a launcher's workers count in the launcher, which reaps them), read with
``getrusage``; with xdist, each worker measures its tests and the controller prints the list.
"""

from __future__ import annotations

import resource

import pytest

SHOWN = 15
_KEY = "cpu_seconds"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Measure the test with its fixtures' set-up and teardown: a module's shared run counts in its first test."""
    item.stash[_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        report = outcome.get_result()
        report.user_properties = [*report.user_properties, (_KEY, _cpu_seconds() - item.stash[_START])]


class _Totals:
    def __init__(self):
        self.cost: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "teardown":
            for key, value in report.user_properties:
                if key == _KEY:
                    self.cost[report.nodeid] = value

    def pytest_terminal_summary(self, terminalreporter):
        if not self.cost:
            return
        terminalreporter.write_sep("=", f"{SHOWN} tests whose processes used the most CPU "
                                        f"(all tests: {sum(self.cost.values()):.0f} CPU-s)")
        for nodeid, seconds in sorted(self.cost.items(), key=lambda kv: -kv[1])[:SHOWN]:
            terminalreporter.write_line(f"{seconds:7.1f} CPU-s  {nodeid}")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) gathers and prints
        config.pluginmanager.register(_Totals(), "mgpu-test-cost")
