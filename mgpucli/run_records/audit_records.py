"""What ``mgpu launch --audit`` leaves: every rank's findings beside its error file, and ``RUN_DIR/audit.json``.

A worker whose script runs under ``--audit`` (:mod:`mgpucli.audit`) appends one JSON object per line to
``mgpu_audit.jsonl`` beside its torch error file (``.../attempt_N/LOCAL_RANK/``, indexed by ``launch.json``): a
``finding`` for each trap it found (once per kind and place on that rank), and a ``status`` line with what it
checked when the script ends. The launcher follows these files while the job runs, shows each kind of finding the
first time it appears, and at the end writes ``audit.json`` beside ``launch.json``: every finding, grouped by kind
with a count (:func:`summarize`), and every rank's status. ``mgpu doctor RUN_DIR`` reads it back (or, when the
launcher was killed before writing it, the per-rank files themselves). Stdlib only: the post-mortem reads these.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from mgpucli.run_layout import AUDIT_JSON as AUDIT_JSON  # its name in the run dir
from mgpucli.run_records.json_files import read_json_object, write_json

FINDINGS_NAME = "mgpu_audit.jsonl"
_IN_PACKAGES = re.compile(r"/(?:site|dist)-packages/(.+)$")

# Every kind of finding, in the order the summary lists them, with a short name for tables.
KINDS: dict[str, str] = {
    "params_diverged": "parameters differ across ranks",
    "optimizer_steps_differ": "ranks took different numbers of optimizer steps",
    "loader_not_distributed": "DataLoader without a DistributedSampler",
    "set_epoch_missing": "DistributedSampler.set_epoch not called",
    "padded_evaluation": "padded evaluation: samples counted twice",
    "same_save_path": "every rank writes the same file",
    "find_unused_unneeded": "find_unused_parameters=True, nothing unused",
    "ddp_unused_parameters": "parameters unused by a DDP model",
    "no_set_device": "no torch.cuda.set_device before NCCL init",
    "device_cuda0": "model or batch on cuda:0 in a rank that is not local rank 0",
}


@dataclass
class Where:
    """The user's own line that created the object (or made the call) a finding is about; or, when no frame of the
    user's code was on the stack, the line of the installed package (``library``) that made the call."""

    file: str
    line: int
    function: str = ""
    code: str = ""
    library: str = ""  # the package whose code it is ("torchdata"); "" for the user's own code

    def cite(self, cwd: str | None = None) -> str:
        """``train.py:31``: relative to ``cwd`` (default: this process's) when the file is below it; a library's line
        as ``torchdata/sampler.py:12 (torchdata's code)``, from the package's folder."""
        if self.library:
            inside = _IN_PACKAGES.search(self.file)
            return f"{inside.group(1) if inside else self.file}:{self.line} ({self.library}'s code)"
        here = cwd or os.getcwd()
        rel = os.path.relpath(self.file, here) if os.path.isabs(self.file) else self.file
        return f"{self.file if rel.startswith('..') else rel}:{self.line}"


@dataclass
class Finding:
    """One trap found on one rank: what (``kind``, ``title``), what it costs or breaks, the fix as code."""

    kind: str
    rank: int
    title: str
    cost: str
    fix: str
    where: Where | None = None
    local_rank: int | None = None
    attempt: int = 0
    time: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["record"] = "finding"
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding | None:
        try:
            where = data.get("where")
            return cls(kind=str(data["kind"]), rank=int(data["rank"]), title=str(data["title"]),
                       cost=str(data.get("cost") or ""), fix=str(data.get("fix") or ""),
                       where=Where(**where) if isinstance(where, dict) else None,
                       local_rank=data.get("local_rank"), attempt=int(data.get("attempt") or 0),
                       time=float(data.get("time") or 0.0), details=dict(data.get("details") or {}))
        except (KeyError, TypeError, ValueError):
            return None


def findings_path(error_file: str) -> str:
    """The rank's findings file: beside its torch error file, in its attempt's folder."""
    return os.path.join(os.path.dirname(error_file), FINDINGS_NAME)


def append(path: str, record: dict[str, Any]) -> None:
    """Append one record (a finding's ``to_json()`` or a status) as a line; OSError propagates."""
    line = json.dumps(record, default=str) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def parse_lines(lines: Iterable[str]) -> tuple[list[Finding], list[dict[str, Any]]]:
    """(findings, status records) from a findings file's lines; a partial or foreign line is skipped."""
    findings, statuses = [], []
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if data.get("record") == "status":
            statuses.append(data)
        elif data.get("record") == "finding":
            found = Finding.from_json(data)
            if found is not None:
                findings.append(found)
    return findings, statuses


def read_file(path: str) -> tuple[list[Finding], list[dict[str, Any]]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse_lines(fh.read().splitlines())
    except OSError:
        return [], []


def summarize(findings: list[Finding], cwd: str | None = None) -> list[dict[str, Any]]:
    """One entry per kind (in :data:`KINDS` order): the title, cost and fix of the lowest rank's first finding, how
    many findings (ranks x places), on which ranks, and where. The lowest rank's, not the first to arrive: ranks
    that run apart (a script that never joined the job) find their mistakes in any order between them."""
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.kind, []).append(f)
    order = [k for k in KINDS if k in groups] + sorted(k for k in groups if k not in KINDS)
    out = []
    for kind in order:
        group = groups[kind]
        first = min(group, key=lambda f: f.rank)  # the first of the lowest rank's, in the order they came
        places = []
        for f in group:
            if f.where is not None and f.where.cite(cwd) not in places:
                places.append(f.where.cite(cwd))
        out.append({"kind": kind, "name": KINDS.get(kind, kind.replace("_", " ")), "count": len(group),
                    "ranks": sorted({f.rank for f in group}), "where": places, "title": first.title,
                    "cost": first.cost, "fix": first.fix})
    return out


def write_audit(path: str, launch_id: str | None, findings: list[Finding], statuses: list[dict[str, Any]],
                cwd: str | None = None) -> None:
    """``audit.json``: every finding, the summary by kind, every rank's status. OSError propagates."""
    write_json(path, {"launch_id": launch_id, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "cwd": cwd or os.getcwd(), "summary": summarize(findings, cwd),
                      "findings": [f.to_json() for f in findings], "status": statuses}, indent=2)


def read_audit(path: str, launch_id: str | None = None) -> dict[str, Any] | None:
    """``audit.json``, or None when missing, unreadable or written by another launch than ``launch_id``."""
    data = read_json_object(path)
    if data is None or (launch_id is not None and data.get("launch_id") not in (None, launch_id)):
        return None
    return data


def from_rank_files(paths: Iterable[str], launch_id: str | None = None,
                    cwd: str | None = None) -> dict[str, Any] | None:
    """What ``audit.json`` would hold, rebuilt from the ranks' own files (the launcher did not write it); None when
    no rank left one."""
    findings: list[Finding] = []
    statuses: list[dict[str, Any]] = []
    seen = False
    for path in paths:
        if not os.path.exists(path):
            continue
        seen = True
        got, status = read_file(path)
        findings += got
        statuses += status
    if not seen:
        return None
    with contextlib.suppress(Exception):
        findings.sort(key=lambda f: f.time)
    return {"launch_id": launch_id, "written": None, "cwd": cwd, "summary": summarize(findings, cwd),
            "findings": [f.to_json() for f in findings], "status": statuses}
