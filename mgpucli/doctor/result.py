"""What a check returns, and the verdict over all of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

OK = "ok"
WARN = "warn"
FAIL = "fail"
SKIPPED = "skipped"
STATUSES = (OK, WARN, FAIL, SKIPPED)

# Areas, in the order the report shows them.
AREAS = ("software", "devices", "GPU visibility", "rank setup", "distributed env", "topology", "host", "live")


@dataclass(frozen=True)
class CheckResult:
    """One finding: what was checked, how it went, what was seen, and (warn/fail) a fix to paste."""

    name: str
    area: str
    status: str
    detail: str
    hint: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown check status {self.status!r}")
        if self.status in (WARN, FAIL) and not self.hint:
            raise ValueError(f"check {self.name!r} is {self.status} without a hint")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def ok(name: str, area: str, detail: str) -> CheckResult:
    return CheckResult(name, area, OK, detail)


def warn(name: str, area: str, detail: str, hint: str) -> CheckResult:
    return CheckResult(name, area, WARN, detail, hint)


def fail(name: str, area: str, detail: str, hint: str) -> CheckResult:
    return CheckResult(name, area, FAIL, detail, hint)


def skipped(name: str, area: str, reason: str) -> CheckResult:
    return CheckResult(name, area, SKIPPED, reason)


def overall_status(results: Iterable[CheckResult]) -> str:
    """fail if anything failed, warn if anything warned, ok otherwise (skipped checks do not count)."""
    statuses = {r.status for r in results}
    if FAIL in statuses:
        return FAIL
    return WARN if WARN in statuses else OK


def verdict(results: list[CheckResult], what: str) -> str:
    """One line a user can act on; ``what`` says what the machine was checked for (e.g. '2 GPUs (nccl)')."""
    failed = [r.name for r in results if r.status == FAIL]
    warned = [r.name for r in results if r.status == WARN]
    if failed:
        return f"not ready: {len(failed)} check(s) failed ({', '.join(failed)}): see their hints."
    if warned:
        return f"ready for {what}, with {len(warned)} warning(s) ({', '.join(warned)})."
    return f"ready for {what}."
