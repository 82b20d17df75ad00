"""Show a post-mortem in one screen at most (rich, on stderr), and write ``RUN_DIR/postmortem.json``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from mgpucli.postmortem.report import Failure, Report, fate, node_line, short_path
from mgpucli.run_layout import AUDIT_JSON, LAUNCH_JSON, METRICS, POSTMORTEM_JSON
from mgpucli.run_records import stacks
from mgpucli.run_records.json_files import write_json

if TYPE_CHECKING:
    from rich.console import Console

MAX_EVIDENCE = 5
MAX_TEXT = 200


def write_report(report: Report) -> str | None:
    """Write ``postmortem.json`` into the run dir atomically; None when the run dir is read-only."""
    path = os.path.join(report.run_dir, POSTMORTEM_JSON)
    try:
        write_json(path, report.to_json(), indent=2)
    except OSError:
        return None
    return path


def _short(text: str, width: int = MAX_TEXT) -> str:
    text = text.strip()
    return text if len(text) <= width else text[: width - 3] + "..."


def _grouped(items: list[tuple[Any, str]]) -> str:
    """``rank 1, 2 (lost its connection to a peer); rank 3 (killed by SIGKILL)``: ranks grouped by what happened."""
    groups: dict[str, list[str]] = {}
    for rank, what in items:
        groups.setdefault(what, []).append(str(rank))
    out = []
    for what, ranks in groups.items():
        shown = ", ".join(ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
        out.append(f"rank{'s' if len(ranks) > 1 else ''} {shown} ({what})")
    return "; ".join(out)


def detail_line(f: Failure) -> str | None:
    """The one line of specifics a signature has (which collective, how much memory, which signal...)."""
    d: dict[str, Any] = f.match.details
    sig = f.match.signature
    if sig == "collective_timeout":
        parts = []
        if d.get("timeout_s") is not None:
            parts.append(f"timeout {d['timeout_s']:g} s")
        if d.get("waiting_ranks"):
            parts.append("waited: rank " + ", ".join(str(r) for r in d["waiting_ranks"]))
        if d.get("late_ranks"):
            parts.append("late: " + _grouped([(r, (d.get("late_rank_fates") or {}).get(str(r), "no error"))
                                              for r in d["late_ranks"]]))
        return "; ".join(parts) or None
    if sig == "cuda_oom":
        bits = [f"{k}: {d[k]}" for k in ("size", "total", "free", "mine", "reserved") if d.get(k)]
        return ", ".join(bits).replace("size:", "tried to allocate").replace("mine:", "this process:") or None
    if sig == "dataloader_worker":
        return f"worker pid(s) {d.get('pids')}; {d.get('kind')}" if d.get("pids") else None
    if sig in ("nan_loss", "cuda_oom", "ddp_unused_parameters") and d.get("ranks") and len(d["ranks"]) > 1:
        return "seen on ranks " + ", ".join(str(r) for r in d["ranks"])
    return None


def render(report: Report, console: Console | None = None, compact: bool = False) -> None:
    """The verdict, the first failure's evidence and fix, the other ranks, where to look next.

    ``compact`` (the end of ``mgpu launch``'s failure summary, which already showed the traceback): the
    verdict, three evidence lines and the fix.
    """
    from rich.text import Text

    from mgpucli.console import err_console

    console = console or err_console()
    color = "green" if report.finished else "yellow" if report.preempted else "bold red"
    console.print(Text("diagnosis: " if compact else "mgpu doctor: ", style="bold") + Text(report.verdict, style=color))
    f = report.first_failure
    if f is not None:
        extra = detail_line(f)
        if extra:
            console.print(Text(f"  {extra}"))
        evidence = f.match.evidence[: 3 if compact else MAX_EVIDENCE]
        if evidence:
            console.print(Text("  evidence:", style="bold"))
            for line in evidence:  # one terminal line each: the full text is in postmortem.json
                room = max(100, min(MAX_TEXT, console.width - len(line.cite()) - 7))
                console.print(Text(f"    {line.cite()}  ", style="dim") + Text(_short(line.text, room)))
        for label, line in fix_rows(f.match.fix) or [("fix: ", "")]:  # a fix given as code: one line each
            console.print(Text(f"  {label}", style="bold cyan") + Text(line, style="cyan"))
    if report.stacks:
        what = "where the ranks were" if f is not None and f.match.signature in ("stalled", "stopped") else \
            "where the other ranks were when it failed"
        console.print(Text(f"  {what} (their stacks):", style="bold"))
        for rank, dump in sorted(report.stacks.items()):
            console.print(Text(f"    {stacks.describe(rank, dump)}"))
    if compact:
        return
    if report.others:
        console.print(Text("  also failed: " + _grouped([(o.rank, fate(o.match)) for o in report.others]), style="dim"))
    for e in report.earlier_attempts[:3]:
        step = f" at step {e.step}" if e.step is not None else ""
        console.print(Text(f"  attempt {e.attempt + 1}: rank {e.rank}{step}: {e.match.title}", style="dim"))
    for node in report.nodes:
        console.print(Text(f"  node: {node_line(node)}", style="dim"))
    for said in report.membership:
        console.print(Text(f"  nodes: {said}", style="dim"))
    if report.segments:
        console.print(Text(f"  trained: {report.segments}", style="dim"))
    if report.last_train:
        t = report.last_train
        console.print(Text(f"  last logged: step {t.get('step')}, epoch {t.get('epoch')}"
                           + (f", loss {t['loss']:.4g}" if isinstance(t.get("loss"), (int, float)) else ""),
                           style="dim"))
    if report.resume_command and not report.finished:
        p = report.preemption
        at = f" (step {p.checkpoint_step})" if p is not None and p.checkpoint_step is not None else ""
        name = short_path(report.checkpoint) if report.checkpoint else "the last checkpoint"
        console.print(Text(f"  continue from {name}{at}: ", style="bold") + Text(report.resume_command))
    if report.straggler:
        console.print(Text("  straggler: ", style="bold yellow") + Text(report.straggler["summary"]))
    for line, problem in tracker_lines(report.trackers):
        console.print(Text(f"  {line}", style="yellow" if problem else "dim"))
    for line, style in audit_lines(report.audit):
        console.print(Text(line, style=style))
    if report.logs:
        gone = "" if os.path.exists(report.logs) else f" (gone: deleted or moved; read from {LAUNCH_JSON} alone)"
        console.print(Text(f"  logs: {report.logs}{gone}", style="dim"))


def tracker_lines(trackers: dict[str, dict[str, Any]]) -> list[tuple[str, bool]]:
    """One line per experiment tracker of the run (trackers.json): where its run is, or that it failed and training
    went on without it; (line, whether it is a problem)."""
    from mgpucli.trackers import SPECS

    out = []
    for name, entry in sorted(trackers.items()):
        title = SPECS[name].title if name in SPECS else name
        run = f"{title} run {entry.get('id') or '(not started)'}"
        failures = entry.get("failures") or []
        if failures:
            last = failures[-1]
            out.append((f"{run}: failed while {last.get('while')} ({_short(str(last.get('error')), 120)}); training "
                        f"went on without it, and {METRICS} has every record", True))
            continue
        keys = SPECS[name].where if name in SPECS else ()
        where = next((entry[key] for key in keys if entry.get(key)), None)
        mode = f", {entry['mode']}" if entry.get("mode") else ""
        out.append((f"{run} ({entry.get('status', '?')}{mode})" + (f": {where}" if where else ""), False))
    return out


def audit_lines(audit: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``mgpu launch --audit``'s findings, one kind each: where, what, and the fix."""
    if audit is None:
        return []
    summary = audit.get("summary") or []
    if not summary:
        return [("  audit: no findings", "green")]
    out = [(f"  audit: {len(summary)} kind{'s' if len(summary) > 1 else ''} of finding (what each costs: "
            f"{AUDIT_JSON})", "bold yellow")]
    for group in summary:
        where = ", ".join(group.get("where") or []) or "?"
        ranks = ", ".join(str(r) for r in group.get("ranks") or [])
        out.append((f"    {group.get('kind')} (rank {ranks}) at {where}: {_short(str(group.get('title')), 160)}",
                    "yellow"))
        out += [(f"      {label}{line}", "cyan") for label, line in fix_rows(str(group.get("fix") or ""))]
    return out


def fix_rows(fix: str) -> list[tuple[str, str]]:
    """A fix's lines, each with what goes before it: ``fix: `` before the first, as many spaces before the others
    (a fix given as code keeps its own indentation under the first line)."""
    return [("fix: " if i == 0 else "     ", line) for i, line in enumerate(fix.splitlines())]


def after_launch_failure(run_dir: str) -> str | None:
    """For ``mgpu launch``: diagnose the failed run, end its summary with the diagnosis, write the report.

    Never raises: a bug in the diagnosis must not hide the job's own failure (it is printed instead).
    Returns the path of ``postmortem.json`` (None when it could not be written).
    """
    from mgpucli.console import err_console
    from mgpucli.postmortem.diagnose import diagnose_run

    try:
        report = diagnose_run(run_dir)
        path = write_report(report)
        render(report, compact=True)
        if path:
            err_console().print(f"  full report: {path} (again any time: mgpu doctor {run_dir})", markup=False,
                                highlight=False)
        return path
    except Exception as err:  # noqa: BLE001 - the launch already failed; say why the diagnosis did not work
        err_console().print(f"mgpu launch: could not diagnose the failure ({type(err).__name__}: {err}); "
                            f"run mgpu doctor {run_dir}.", markup=False, highlight=False)
        return None
