"""When a launch of several nodes ended while its nodes met: they never met, a lost node never came back, they met
and run different jobs, or a signal stopped the wait. ``launch.json``'s result says so (``rendezvous``: what
``mgpu launch``'s rendezvous watch recorded); this turns it into the report's first failure (pure, no torch)."""

from __future__ import annotations

from typing import Any

from mgpucli.postmortem.lines import LogLine
from mgpucli.postmortem.matchers import Match
from mgpucli.postmortem.reader import RunRecord
from mgpucli.postmortem.report import Failure

_SAME_JOB = ("Start every node with the same mgpu launch command (the same recipe and overrides, or the same script "
             "and arguments) and the same mgpu and torch; mgpu launch names every item that differs.")


def meeting_failure(run: RunRecord) -> Failure | None:
    """The launch's end while its nodes met, as the report's first failure; None when it did not end so."""
    result = run.result
    meet = result.get("rendezvous")
    if not isinstance(meet, dict):
        return None
    attempt = run.attempts[-1].attempt if run.attempts else 0
    where = f" at {meet.get('endpoint')}" if meet.get("endpoint") else ""
    if meet.get("kind") == "differ":
        match = _differ(meet, run.launch_paths[0])
    elif result.get("status") == "stopped":
        match = Match("stopped_while_meeting", f"the launcher was stopped by {result.get('signal') or 'a signal'} "
                      f"while the nodes met{where} ({_standing(meet)})", None, [], _checks(meet), cause=False)
    else:
        match = Match(f"nodes_{meet.get('kind') or 'unmet'}", _unmet_title(meet, where), None, [], _checks(meet),
                      details=meet)
    failure = Failure(None, None, attempt, match)
    if isinstance(meet.get("step"), int):
        failure.step, failure.step_source = meet["step"], "failure record"
    return failure


def _differ(meet: dict[str, Any], source: str) -> Match:
    said = [str(d.get("said") or d.get("item")) for d in meet.get("differences") or [] if isinstance(d, dict)]
    more = f" (and {len(said) - 1} more)" if len(said) > 1 else ""
    title = f"refused: the nodes met, but their jobs differ: {said[0] if said else '?'}{more}"
    return Match("nodes_differ", title, None, [LogLine(None, line, source) for line in said[:5]], _SAME_JOB,
                 details=meet)


def _unmet_title(meet: dict[str, Any], where: str) -> str:
    timeout = f"--join-timeout {meet.get('join_timeout'):g} s" if isinstance(meet.get("join_timeout"),
                                                                          int | float) else "the join timeout"
    if meet.get("kind") == "too_few":  # an elastic job below its MIN nodes
        saved = meet.get("checkpoint_step")
        kept = f"; it stopped with its checkpoint at step {saved} (exit 75: requeue it)" if saved is not None else ""
        lost = f"{_names(meet.get('lost'))} lost; " if meet.get("lost") else ""
        return (f"{lost}fewer than the {meet.get('min_nodes')} nodes the elastic job needs met again{where} within "
                f"{timeout}{kept}")
    if meet.get("kind") == "lost":  # the verdict says at which step
        return f"{_names(meet.get('lost'))} was lost and did not rejoin{where} within {timeout}"
    if meet.get("kind") == "failed":
        return f"the nodes could not meet{where}"
    if not meet.get("reachable", True):
        return f"the nodes never met: the rendezvous store{where} never answered within {timeout}"
    again = " again after a restart" if meet.get("entry") else ""
    return f"the nodes never met{again}{where}: {_missing(meet)} never joined within {timeout} ({_standing(meet)})"


def _standing(meet: dict[str, Any]) -> str:
    if meet.get("lost"):
        return f"{_names(meet['lost'])} lost"
    if not meet.get("reachable", True):
        return "its rendezvous store did not answer"
    here = meet.get("here") or []
    return f"{len(here)} of {meet.get('nnodes', '?')} here: {_names(here)}; missing: {_missing(meet)}"


def _missing(meet: dict[str, Any]) -> str:
    missing = meet.get("missing")
    return _names(missing) if isinstance(missing, list) else f"{missing} node(s)"


def _names(items: Any) -> str:
    return ", ".join(str(i) for i in items) if isinstance(items, list) and items else "none"


def _checks(meet: dict[str, Any]) -> str:
    endpoint = meet.get("endpoint") or "the rendezvous endpoint"
    if meet.get("kind") == "lost" or meet.get("lost"):
        return ("The lost node's launcher stopped (killed, its machine or pod gone, the network cut): see its own "
                "logs and `mgpu doctor` there. Restart the job once every node is up; a recipe continues with "
                "--resume auto.")
    return (f"Check that every node was started with the same mgpu launch command and reaches {endpoint} (the address, "
            "the port, a firewall between the nodes), and that no pod or node of the job is still pending (kubectl get "
            "pods; squeue). --join-timeout S waits longer.")
