"""``mgpu launch --audit``: the workers' findings on the launcher's terminal as they come, a summary at the end, and
``audit.json``.

Each worker appends its findings to ``mgpu_audit.jsonl`` beside its error file
(:mod:`mgpucli.run_records.audit_records`). A thread follows those files for every attempt the launch record indexes
and prints each kind of finding the first time any rank reports it: the rank, the user's file:line, the finding, what
it costs and the fix. Torch's tutorial has rank 0 print every rank's findings; here the launcher does it for every
rank of its node (on several nodes, each node's launcher shows its own ranks'), each after an empty line: without a
terminal, torch's tee copies rank 0's output as it comes, a progress bar's partial line too. When the job ends: a
table, one line per kind with its count and places, and ``audit.json`` beside ``launch.json``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any

from mgpucli.launch.live_view import _Follow
from mgpucli.run_records.audit_records import AUDIT_JSON, Finding, findings_path, parse_lines, summarize, write_audit

if TYPE_CHECKING:
    from mgpucli.run_records.launch_record import LaunchRecord

POLL_S = 0.5


class AuditWatch(threading.Thread):
    """Follows the findings files of ``record``'s attempts until :meth:`finish`."""

    def __init__(self, record: LaunchRecord, console=None, poll_s: float = POLL_S):
        super().__init__(name="mgpu-audit-view", daemon=True)
        from mgpucli.console import err_console

        self.record, self.poll_s = record, poll_s
        self.console = console or err_console()
        self.findings: list[Finding] = []
        self.statuses: list[dict[str, Any]] = []
        self._files: dict[str, _Follow] = {}
        self._shown: set[str] = set()
        self._lock = threading.Lock()
        self._finished = threading.Event()

    def run(self) -> None:
        while not self._finished.wait(self.poll_s):
            self._tick()

    def _tick(self, final: bool = False) -> None:
        with self._lock:
            for attempt in list(self.record.attempts):
                for files in attempt.ranks.values():
                    if not files.error_file:
                        continue
                    path = findings_path(files.error_file)
                    follow = self._files.setdefault(path, _Follow(path))
                    findings, statuses = parse_lines(follow.lines(final))
                    self.statuses += statuses
                    for finding in findings:
                        self.findings.append(finding)
                        if finding.kind not in self._shown:
                            self._shown.add(finding.kind)
                            self._show(finding)

    def _show(self, f: Finding) -> None:
        from rich.text import Text

        self.console.print()  # off any partial line on the same stream (torch's tee copies a progress bar's)
        where = f", {f.where.cite()}" if f.where is not None else ""
        self.console.print(Text(f"mgpu audit: rank {f.rank}{where}: ", style="bold yellow") + Text(f.title))
        if f.where is not None and f.where.code:
            self.console.print(Text(f"    {f.where.code}", style="dim"))
        self.console.print(Text("  costs: ", style="bold") + Text(f.cost))
        self.console.print(Text("  fix:", style="bold cyan"))
        for line in f.fix.splitlines():
            self.console.print(Text(f"    {line}", style="cyan"))

    def finish(self, launch_id: str | None) -> str | None:
        """Stop following, show the summary, write ``audit.json`` beside the launch record; its path (None: it could
        not be written)."""
        self._finished.set()
        if self.is_alive():
            self.join(timeout=5)
        self._tick(final=True)
        path = os.path.join(os.path.dirname(self.record.path), AUDIT_JSON)
        try:
            write_audit(path, launch_id, self.findings, self.statuses)
        except OSError:
            path = None
        self._summary(path)
        return path

    def _summary(self, path: str | None) -> None:
        from rich.table import Table
        from rich.text import Text

        where = f": {path}" if path else ""
        groups = summarize(self.findings)
        if not groups:
            self.console.print(Text(f"mgpu audit: no findings{where}", style="bold green"))
            self.console.print(Text(f"  {checked_line(self.statuses)}", style="dim"))
        else:
            total = sum(g["count"] for g in groups)
            self.console.print(Text(f"mgpu audit: {len(groups)} kind{'s' if len(groups) > 1 else ''} of finding "
                                    f"({total} in all){where}", style="bold yellow"))
            table = Table(show_header=True, header_style="bold", pad_edge=False, expand=False)
            table.add_column("finding", overflow="fold")
            table.add_column("ranks", no_wrap=True)
            table.add_column("count", justify="right", no_wrap=True)
            table.add_column("where", overflow="fold")
            for g in groups:
                table.add_row(g["name"], ", ".join(map(str, g["ranks"])), str(g["count"]),
                              ", ".join(g["where"][:3]) + (" ..." if len(g["where"]) > 3 else ""))
            self.console.print(table)
            self.console.print(Text(f"  each kind's cost and fix: shown above when found, in {AUDIT_JSON}, and in "
                                    "mgpu doctor RUN_DIR", style="dim"))
        for note in notes(self.statuses):
            self.console.print(Text(f"  note: {note}", style="dim"))


SUMMED = ("parameter comparisons",)  # made by the rank that compares; the other counts are per rank


def checked_line(statuses: list[dict[str, Any]]) -> str:
    """What the ranks checked: ``checked on 2 ranks: 64 optimizer steps, 1 DDP models, ... (the most on one rank);
    7 parameter comparisons``."""
    most: dict[str, int] = {}
    summed: dict[str, int] = {}
    for status in statuses:
        for what, n in (status.get("checked") or {}).items():
            with contextlib.suppress(TypeError, ValueError):
                if what in SUMMED:
                    summed[what] = summed.get(what, 0) + int(n)
                else:
                    most[what] = max(most.get(what, 0), int(n))
    ranks = len({s.get("rank") for s in statuses})
    if not ranks:
        return "no rank reported what it checked (none reached the end of the script)"
    line = f"checked on {ranks} rank{'s' if ranks > 1 else ''}: "
    line += ", ".join(f"{what} {n}" for what, n in most.items()) or "nothing the checks look at"
    if most and ranks > 1:
        line += " (the most on one rank)"
    return line + "".join(f"; {what} {n}" for what, n in summed.items())


def notes(statuses: list[dict[str, Any]]) -> list[str]:
    """The ranks' notes (a check that could not run), each once, with the ranks that made it."""
    by_note: dict[str, list[int]] = {}
    for status in statuses:
        for note in status.get("notes") or []:
            by_note.setdefault(str(note), []).append(status.get("rank"))
    return [f"{note} (rank{'s' if len(r) > 1 else ''} {', '.join(map(str, sorted(set(r))))})"
            for note, r in by_note.items()]
