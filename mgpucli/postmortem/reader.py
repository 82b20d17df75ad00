"""Read a run directory: the launch record, every rank's logs and error files per attempt, metrics, recipe.

``mgpu launch`` writes ``RUN_DIR/launch.json`` (each other node of a job of several: its own record; every one of
the latest job is read, :mod:`mgpucli.run_records.node_records`) with an index from global rank to its
stdout/stderr/error files for every restart attempt; the workers leave torch's ``error.json`` and mgpu's
``mgpu_failure.json`` beside them; rank 0 writes ``metrics.jsonl``, ``recipe.yaml``,
``checkpoints/`` and, with experiment trackers, ``trackers.json``. A run dir copied elsewhere (from a cluster to a
laptop) still reads: recorded paths that no longer exist are looked up again under the directory actually given.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass, field
from typing import Any

from mgpucli.errors import UsageError
from mgpucli.postmortem.lines import LogLine, parse, read_log
from mgpucli.run_files import saved_checkpoint
from mgpucli.run_layout import METRICS, NODE_LAUNCH_JSONS, RECIPE, is_launch_json
from mgpucli.run_records.audit_records import AUDIT_JSON, findings_path, from_rank_files, read_audit
from mgpucli.run_records.first_failure import TORN_DOWN, failure_record_of, first_to_fail, torn_down
from mgpucli.run_records.launch_record import LAUNCH_JSON, Attempt, RankExit, RankFiles, record_problem
from mgpucli.run_records.node_records import job_records
from mgpucli.run_records.worker_records import FailureRecord, read_error_file, record_path
from mgpucli.trackers import read_state

_SPE = re.compile(r"\b(\d+) steps per epoch\b")


@dataclass
class RankRun:
    """One rank in one attempt: its files, its last log lines and whatever it left about its failure."""

    rank: int
    local_rank: int
    attempt: int
    files: RankFiles
    lines: list[LogLine]
    record: FailureRecord | None
    error_message: str | None
    error_time: float | None
    exitcode: int | None  # known when the launcher recorded it (torch's report, or how it saw the worker end)
    torn_down: bool = False  # ended by the attempt's teardown after another rank failed

    @property
    def left_error(self) -> bool:
        return self.record is not None or self.error_message is not None

    @property
    def time(self) -> float | None:
        return self.record.time if self.record is not None else self.error_time


@dataclass
class RunRecord:
    """Everything ``mgpu doctor RUN_DIR`` reads, already parsed."""

    run_dir: str
    launch_paths: list[str]
    launch: dict[str, Any]
    attempts: list[Attempt]
    exitcodes: dict[int, int]
    node_records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # every node's launch record
    metrics: list[dict[str, Any]] = field(default_factory=list)  # the last records of metrics.jsonl
    recipe: dict[str, Any] | None = None
    checkpoint: str | None = None
    trackers: dict[str, dict[str, Any]] = field(default_factory=dict)  # trackers.json: W&B/MLflow runs, failures
    audit: dict[str, Any] | None = None  # audit.json of a script run under --audit (None: not audited)

    @property
    def result(self) -> dict[str, Any]:
        return self.launch.get("result") or {}

    @property
    def is_script(self) -> bool:
        """The run was the user's own script (``mgpu launch SCRIPT.py``), not a recipe."""
        return self.launch.get("job") == "script"

    def last_metrics(self, split: str) -> dict[str, Any] | None:
        return next((m for m in reversed(self.metrics) if m.get("split") == split), None)

    def recipe_value(self, dotted: str) -> Any:
        node: Any = self.recipe
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node


def read_run(path: str) -> RunRecord:
    """Read ``path`` (a run dir, or its launch.json); UsageError (exit 2) when it is not a run directory."""
    if not path.strip():  # an unset shell variable, usually: it would read the current directory
        raise UsageError(f"RUN_DIR is {path!r}: empty.", "Give the run directory of a `mgpu launch` run, e.g. "
                         "mgpu doctor runs/quickstart (the run_dir of its recipe).")
    if os.path.isfile(path) and not is_launch_json(os.path.basename(path)):
        raise UsageError(f"{path} is a file, not a run directory.", "Give the directory `mgpu launch` trained into "
                         f"(its recipe's run_dir, e.g. runs/quickstart), or its {LAUNCH_JSON}.")
    run_dir = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else os.path.abspath(path)
    if not os.path.isdir(run_dir):
        raise UsageError(f"{path}: no such directory.", "Give the run directory of a `mgpu launch` run, e.g. "
                         "mgpu doctor runs/quickstart (the run_dir of its recipe).")
    found = job_records(run_dir, os.path.abspath(path) if os.path.isfile(path) else None)
    if not found:
        raise UsageError(
            f"{path} is not a run directory of `mgpu launch`: it holds no {LAUNCH_JSON} (nor a node's "
            f"{NODE_LAUNCH_JSONS}).",
            "Give the directory `mgpu launch` trained into (its recipe's run_dir, e.g. runs/quickstart). Runs "
            "started with `mgpu train` or torchrun directly leave no launch record to read.",
        )
    paths, records = [p for p, _ in found], [r for _, r in found]
    if records[0] is None:
        raise UsageError(f"{paths[0]} cannot be read as JSON (truncated or not written by mgpu launch).",
                         "Give the run directory of a `mgpu launch` run.")
    for where, record in zip(paths, records, strict=True):
        problem = record_problem(record) if record is not None else None
        if problem:
            written = f" (written by mgpu {record['mgpu_version']})" if isinstance(record.get("mgpu_version"),
                                                                                  str) else ""
            raise UsageError(f"{where} is no launch record mgpu doctor can read{written}: {problem}.",
                             f"Give the run directory of a `mgpu launch` run, with its {LAUNCH_JSON} as mgpu launch "
                             "wrote it (edited by hand, it may no longer read).")
    launch = records[0]
    recorded_root = str(launch.get("run_dir") or run_dir)
    attempts = _merge_attempts([r for r in records if r], run_dir, recorded_root)
    exitcodes: dict[int, int] = {}
    for record in records:
        for rank, code in ((record or {}).get("result") or {}).get("exitcodes", {}).items():
            exitcodes[int(rank)] = int(code)
    run = RunRecord(run_dir=run_dir, launch_paths=paths, launch=launch, attempts=attempts, exitcodes=exitcodes,
                    node_records=[(p, r) for p, r in zip(paths, records, strict=True) if r])
    run.metrics = read_metrics(os.path.join(run_dir, METRICS))
    run.recipe = read_recipe(os.path.join(run_dir, RECIPE))
    last = saved_checkpoint(run_dir)
    run.checkpoint = str(last) if last is not None else None
    run.trackers = read_state(run_dir)
    run.audit = _read_audit(run_dir, launch, attempts)
    return run


def _read_audit(run_dir: str, launch: dict[str, Any], attempts: list[Attempt]) -> dict[str, Any] | None:
    """The findings of ``mgpu launch --audit``: ``audit.json`` of this launch, else rebuilt from every rank's own
    findings file (the launcher was killed before writing it); None when the run was not audited."""
    if not (launch.get("script") or {}).get("audit"):
        return None
    launch_id = (launch.get("rendezvous") or {}).get("id")
    found = read_audit(os.path.join(run_dir, AUDIT_JSON), launch_id)
    if found is None:
        paths = [findings_path(f.error_file) for a in attempts for f in a.ranks.values() if f.error_file]
        found = from_rank_files(paths, launch_id, launch.get("cwd"))
    return found or {"launch_id": launch_id, "summary": [], "findings": [], "status": []}


def _relocate(path: str, run_dir: str, recorded_root: str) -> str:
    """``path`` as recorded, or the same file under the run dir given (a run dir that was moved or copied)."""
    if not path or os.path.exists(path):
        return path
    root = os.path.abspath(recorded_root)
    if os.path.commonpath([root, os.path.abspath(path)]) == root:
        moved = os.path.join(run_dir, os.path.relpath(path, root))
        if os.path.exists(moved) or os.path.exists(os.path.dirname(moved)):
            return moved
    return path


def _merge_attempts(records: list[dict[str, Any]], run_dir: str, recorded_root: str) -> list[Attempt]:
    """Attempts by number, with the ranks of every node's record."""
    merged: dict[int, Attempt] = {}
    for record in records:
        for item in record.get("attempts") or []:
            number = int(item.get("attempt", 0))
            attempt = merged.setdefault(number, Attempt(number, _relocate(item.get("dir", ""), run_dir,
                                                                          recorded_root)))
            for key, files in (item.get("ranks") or {}).items():
                fix = {k: _relocate(files.get(k, ""), run_dir, recorded_root)
                       for k in ("stdout", "stderr", "error_file")}
                rank = int(files.get("rank", key))
                attempt.ranks[rank] = RankFiles(rank, int(files.get("local_rank", rank)), **fix)
            for key, ended in (item.get("exits") or {}).items():
                attempt.exits[int(key)] = RankExit(ended.get("code"), float(ended.get("time") or 0.0))
    return [merged[n] for n in sorted(merged)]


def rank_runs(run: RunRecord, attempt: Attempt) -> dict[int, RankRun]:
    """Every rank of ``attempt`` with its log tail and its error records (exit codes for the last attempt)."""
    last = bool(run.attempts) and attempt.attempt == run.attempts[-1].attempt
    reported = run.exitcodes if last else {}
    ending = torn_down(attempt, reported)
    failed = first_to_fail(attempt, reported)
    out = {}
    for rank, files in sorted(attempt.ranks.items()):
        record = failure_record_of(files)
        message, trace, stamp = read_error_file(files.error_file)
        lines = read_log(files.stderr, rank) + read_log(files.stdout, rank)
        lines += _unless_logged(lines, message, trace, rank, files.error_file)
        if record is not None:
            lines += _unless_logged(lines, f"{record.type}: {record.message}", None, rank,
                                    record_path(files.error_file), record.message)
        ended = attempt.exits.get(rank)
        code = reported.get(rank, ended.code if ended is not None else None)
        if rank in ending:
            lines.append(LogLine(rank, f"{TORN_DOWN} with {_signal_name(code)} after rank {failed} failed, as recorded "
                                 "by the launcher", run.launch_paths[0]))
        elif code is not None and code < 0:
            lines.append(LogLine(rank, f"exit code {code} ({_signal_name(code)}), as recorded by the launcher",
                                 run.launch_paths[0]))
        out[rank] = RankRun(rank, files.local_rank, attempt.attempt, files, lines, record, message, stamp, code,
                            rank in ending)
    return out


def _unless_logged(lines: list[LogLine], message: str | None, trace: str | None, rank: int, source: str,
                   probe: str | None = None) -> list[LogLine]:
    """The error file's text as lines, unless the log already shows it (then the log, with line numbers, is
    the better evidence). ``probe``: the part of the message to look for in the log."""
    if not message or not message.strip():
        return []
    head = message.strip().splitlines()[0][-100:]
    look = (probe or message).strip().splitlines()[0][-100:] if (probe or message).strip() else head
    if any(look in line.text for line in lines):
        return []
    return parse((trace or "") + ("" if (trace or "").rstrip().endswith(head) else f"\n{message}"), rank, source)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def read_metrics(path: str, max_bytes: int | None = 256 * 1024) -> list[dict[str, Any]]:
    """The records of metrics.jsonl, its last ``max_bytes`` only unless None (a partial line, from a killed or
    still running writer, or cut by ``max_bytes``, is skipped); [] when there is none or it cannot be read."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(0 if max_bytes is None else max(0, size - max_bytes))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def read_recipe(path: str) -> dict[str, Any] | None:
    """The resolved recipe rank 0 wrote (PyYAML comes with omegaconf; without it the fixes stay generic)."""
    try:
        import yaml

        with open(path) as fh:
            data = yaml.safe_load(fh)
    except Exception:
        return None
    return data if isinstance(data, dict) else None


def steps_per_epoch(runs: dict[int, RankRun]) -> int | None:
    """From rank 0's start-up line ("... 8 steps per epoch; ..."), read from the head of its log."""
    first = runs.get(0) or next(iter(runs.values()), None)
    if first is None:
        return None
    for path in (first.files.stderr, first.files.stdout):
        try:
            with open(path, errors="replace") as fh:
                for _, line in zip(range(80), fh, strict=False):
                    found = _SPE.search(line)
                    if found:
                        return int(found.group(1))
        except OSError:
            continue
    return None
