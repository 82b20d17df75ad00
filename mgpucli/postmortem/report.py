"""The post-mortem as data: how each rank failed (``Failure``), the whole run (``Report``), and its verdict line."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from mgpucli.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from mgpucli.postmortem.matchers import Match
from mgpucli.postmortem.reader import RunRecord
from mgpucli.run_layout import CHECKPOINTS, LAST_FULL
from mgpucli.run_records.first_failure import TORN_DOWN


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
class Preemption:
    """A graceful stop: every rank stopped on a signal at one step and the checkpoint holds it. Not a failure."""

    signal: str | None  # None: the signal was not recorded
    signalled_rank: int | None  # the rank that received it, when it was sent to a worker rather than the launcher
    step: int | None
    step_source: str | None  # "checkpoint", "launch record", "failure record", "last logged metrics"
    epoch: int | None = None
    checkpoint_step: int | None = None  # None: no complete checkpoint could be read
    recorded_step: int | None = None  # the step launch.json's result names

    @property
    def resumable(self) -> bool:
        return self.checkpoint_step is not None

    def to_json(self) -> dict[str, Any]:
        return {"signal": self.signal, "signalled_rank": self.signalled_rank, "step": self.step,
                "step_source": self.step_source, "epoch": self.epoch, "checkpoint_step": self.checkpoint_step,
                "checkpoint_complete": self.resumable, "recorded_step": self.recorded_step}


@dataclass
class Report:
    """The post-mortem of one run directory (``postmortem.json``)."""

    run_dir: str
    # succeeded | failed | stopped | preempted | unmet | refused | node_lost | running | launcher_gone | not_started
    status: str
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
    preemption: Preemption | None = None
    trackers: dict[str, dict[str, Any]] = field(default_factory=dict)  # W&B/MLflow runs (trackers.json)
    stacks: dict[int, Any] = field(default_factory=dict)  # rank -> its stacks dump (run_records.stacks.Dump)
    audit: dict[str, Any] | None = None  # mgpu launch --audit's findings (audit.json); None: not audited
    segments: str | None = None  # on how many processes each stretch of the run trained (its last checkpoint's)
    membership: list[str] = field(default_factory=list)  # an elastic job's node changes, as this node's launcher said
    nodes: list[dict[str, Any]] = field(default_factory=list)  # a job of several nodes: each node's launch record
    straggler: dict[str, Any] | None = None  # the rank the others waited for (postmortem/pace.py); None: none
    never_trained: str | None = None  # a script that exited 0 on every rank without ever training: what it did

    @property
    def preempted(self) -> bool:
        """Stopped on a signal with a complete checkpoint, and no rank failed: continue it, nothing to fix."""
        return (self.status == "preempted" and self.first_failure is None and self.preemption is not None
                and self.preemption.resumable)

    @property
    def exit_code(self) -> int:
        """``mgpu doctor RUN_DIR``'s exit code: 0 the run finished, 75 (EX_TEMPFAIL, as ``mgpu launch``) it was
        preempted with a complete checkpoint, 1 it failed or did not finish otherwise (diagnosed or not)."""
        if self.finished:
            return EXIT_OK
        return EXIT_PREEMPTED if self.preempted else EXIT_FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir, "finished": self.finished, "status": self.status, "exit_code": self.exit_code,
            "verdict": self.verdict, "attempts": self.attempts, "world_size": self.world_size,
            "preempted": self.preemption.to_json() if self.preemption else None,
            "first_failure": self.first_failure.to_json() if self.first_failure else None,
            "other_failures": [_brief(f) for f in self.others],
            "earlier_attempts": [_brief(f) for f in self.earlier_attempts],
            "last_metrics": {"train": self.last_train, "val": self.last_val},
            "checkpoint": self.checkpoint, "resume_command": self.resume_command, "logs": self.logs,
            "launch_json": self.launch_json, "trackers": self.trackers, "audit": self.audit,
            "segments": self.segments, "membership": self.membership, "nodes": self.nodes,
            "straggler": self.straggler, "never_trained": self.never_trained,
            "stacks": {str(rank): dump.to_json() for rank, dump in sorted(self.stacks.items())},
            "diagnosed_at": _iso(time.time()),
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
             "cuda_oom": "CUDA out of memory", "unknown": "failed", "stopped": "stopped",
             "torn_down": f"{TORN_DOWN} ({match.details.get('signal')})"}
    return short.get(match.signature, match.signature.replace("_", " "))


def verdict(report: Report, run: RunRecord, status: str) -> str:
    rel = os.path.relpath(run.run_dir)
    where = run.run_dir if rel.startswith("..") else rel
    n = report.attempts
    if status == "succeeded":
        extra = f" after {n - 1} restart(s)" if n > 1 else ""
        late = run.result.get("signal")  # it reached mgpu launch during the teardown, after the run had finished
        if isinstance(late, str):
            extra += f" ({late} arrived during the teardown, after the final checkpoint was complete)"
        if report.never_trained:
            extra += f", but {report.never_trained}"
        return f"{where} finished{extra}."
    f = report.first_failure
    if status == "preempted" and f is None and report.preemption is not None:
        return _preempted_verdict(where, report.preemption, report.checkpoint)
    if status == "stalled" and f is not None:
        return f"{where} was stopped by mgpu launch: {f.match.title}."
    what = {"failed": "failed", "stopped": "was stopped", "preempted": "was preempted", "unmet": "did not start",
            "refused": "did not start", "node_lost": "stopped", "launcher_gone":
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
    if f.match.signature == "recipe_problem":  # every rank refused the same recipe: none "failed first"
        return f"{head}{attempt}: {f.match.title}."
    return f"{head}: rank {f.rank} failed first{when}{attempt}: {f.match.title}."


def _preempted_verdict(where: str, p: Preemption, checkpoint: str | None) -> str:
    by = f" by {p.signal}" if p.signal else " by a signal"
    if p.signal and p.signalled_rank is not None:
        by += f" (sent to rank {p.signalled_rank})"
    when = f" at step {p.step}" if p.step is not None else ""
    if p.step is not None and p.epoch is not None:
        when += f" (epoch {p.epoch})"
    ckpt = short_path(checkpoint) if checkpoint else f"{CHECKPOINTS}/{LAST_FULL}"
    if p.resumable:
        return (f"{where} was preempted{by}{when}: every rank stopped at that step and {ckpt} holds it, complete. "
                "Nothing is broken: continue it with --resume auto.")
    missing = "is missing" if checkpoint is None else "cannot be read (not a complete mgpu checkpoint)"
    return (f"{where} was preempted{by}{when}, but its checkpoint {ckpt} {missing}: --resume auto has nothing "
            "complete to continue from.")


def short_path(path: str) -> str:
    """``checkpoints/last.pt``: the checkpoint as its run dir names it."""
    parent = os.path.basename(os.path.dirname(path))
    return f"{parent}/{os.path.basename(path)}" if parent else os.path.basename(path)


def node_line(node: dict[str, Any]) -> str:
    """``node 1 (box, pid 4242): ranks 2-3, succeeded (launch.node1.json)``; a record not in the run dir says so."""
    if node["status"] is None and not node["ranks"]:
        return f"{node['record']}: not in this run dir (a node that does not share it keeps its own)"
    where = ", ".join(str(x) for x in (node["host"], f"pid {node['pid']}" if node["pid"] else None) if x)
    label = f"node {node['node_rank']} ({where})" if node["node_rank"] is not None else where or "a node"
    ranks = node["ranks"]
    said = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}" if ranks else "no rank"
    return f"{label}: {said}, {node['status'] or 'unknown'} ({node['record']})"
