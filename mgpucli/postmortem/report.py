"""The post-mortem as data: how each rank failed (``Failure``), the whole run (``Report``), and its verdict line."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from mgpucli.postmortem.matchers import Match
from mgpucli.postmortem.reader import RunRecord


@dataclass
class Failure:
    """How one rank failed in one attempt."""

    rank: int | None  # None: not a rank's failure (the whole job was stopped)
    local_rank: int | None
    attempt: int
    match: Match
    step: int | None = None
    step_source: str | None = None  # "failure record", "log message", "last logged metrics"
    epoch: int | None = None
    time: float | None = None
    exitcode: int | None = None

    def to_json(self) -> dict[str, Any]:
        m = self.match
        return {
            "rank": self.rank, "local_rank": self.local_rank, "attempt": self.attempt, "step": self.step,
            "step_source": self.step_source, "epoch": self.epoch,
            "time": _iso(self.time), "exit_code": self.exitcode, "signature": m.signature, "title": m.title,
            "cause": m.cause, "evidence": [e.to_json() for e in m.evidence], "fix": m.fix, "details": m.details,
        }


@dataclass
class Report:
    """The post-mortem of one run directory (``postmortem.json``)."""

    run_dir: str
    status: str  # succeeded | failed | stopped | running | launcher_gone | not_started
    finished: bool
    verdict: str
    attempts: int
    world_size: int | None
    first_failure: Failure | None = None
    others: list[Failure] = field(default_factory=list)
    earlier_attempts: list[Failure] = field(default_factory=list)
    last_train: dict[str, Any] | None = None
    last_val: dict[str, Any] | None = None
    checkpoint: str | None = None
    resume_command: str | None = None
    logs: str | None = None
    launch_json: str | None = None

    @property
    def exit_code(self) -> int:
        """``mgpu doctor RUN_DIR``'s exit code: 0 the run finished, 1 it did not (diagnosed or not)."""
        return 0 if self.finished else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir, "finished": self.finished, "status": self.status, "verdict": self.verdict,
            "attempts": self.attempts, "world_size": self.world_size,
            "first_failure": self.first_failure.to_json() if self.first_failure else None,
            "other_failures": [_brief(f) for f in self.others],
            "earlier_attempts": [_brief(f) for f in self.earlier_attempts],
            "last_metrics": {"train": self.last_train, "val": self.last_val},
            "checkpoint": self.checkpoint, "resume_command": self.resume_command, "logs": self.logs,
            "launch_json": self.launch_json, "diagnosed_at": _iso(time.time()),
        }


def _brief(f: Failure) -> dict[str, Any]:
    return {"rank": f.rank, "attempt": f.attempt, "signature": f.match.signature, "title": f.match.title,
            "step": f.step, "exit_code": f.exitcode}


def _iso(stamp: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(stamp)) if stamp else None


def fate(match: Match) -> str:
    """A few words for what happened to a rank (for lists of ranks)."""
    if match.signature == "killed_by_signal":
        return f"killed by {match.details.get('signal') or 'a signal'}"
    short = {"peer_lost": "lost its connection to a peer", "collective_timeout": "timed out in a collective",
             "python_exception": match.details.get("exception", "an exception"), "nan_loss": "NaN loss",
             "cuda_oom": "CUDA out of memory", "unknown": "failed", "stopped": "stopped"}
    return short.get(match.signature, match.signature.replace("_", " "))


def verdict(report: Report, run: RunRecord, status: str) -> str:
    rel = os.path.relpath(run.run_dir)
    where = run.run_dir if rel.startswith("..") else rel
    n = report.attempts
    if status == "succeeded":
        extra = f" after {n - 1} restart(s)" if n > 1 else ""
        return f"{where} finished{extra}."
    f = report.first_failure
    what = {"failed": "failed", "stopped": "was stopped", "preempted": "was preempted", "launcher_gone":
            "did not finish: the launcher stopped without recording a result (killed, or the machine went down)"}
    head = f"{where} {what.get(status, 'did not finish')}"
    if f is None:
        return head + ", and no rank left an error to read."
    when = ""
    if f.step is not None:
        when = f" at step {f.step}" if f.step_source != "last logged metrics" else f" after step {f.step}"
        if f.epoch is not None:
            when += f" (epoch {f.epoch})"
    attempt = f" in attempt {f.attempt + 1} of {n}" if n > 1 else ""
    if f.rank is None:
        return f"{head}{when}: {f.match.title}."
    return f"{head}: rank {f.rank} failed first{when}{attempt}: {f.match.title}."
