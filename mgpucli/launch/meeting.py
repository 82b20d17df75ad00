"""One wait of the nodes for each other: its deadline, its waiting lines, and how it ends when they never meet.

:mod:`mgpucli.launch.rendezvous_watch` makes one :class:`Meeting` each time the launcher's rendezvous starts (the
job's start, then each restart) and calls its :meth:`Meeting.tick` between the short slices the main thread waits
in. Who is here comes from :mod:`mgpucli.launch.node_presence`; the rest is this module's (no torch, no store).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mgpucli.errors import EXIT_FAILED, EXIT_PREEMPTED, EXIT_USAGE, MgpuError
from mgpucli.launch.node_presence import Member, View, labels

FIRST_LINE_S = 5.0  # the first waiting line: a rendezvous whose nodes are all up is over before it
LINE_EVERY_S = 30.0


class NodesProblem(MgpuError):
    """The nodes did not meet (exit 1) or met and differ (exit 2): no worker started. ``status`` and ``details``
    are what ``launch.json``'s result records (``mgpu doctor RUN_DIR`` tells them)."""

    status = "unmet"  # unmet: they never met (or not again after a restart); node_lost: a node lost in training

    def __init__(self, message: str, hint: str, details: dict[str, Any], status: str | None = None,
                 exit_code: int | None = None):
        super().__init__(message, hint)
        self.details = details
        self.status = status or self.status
        if exit_code is not None:
            self.exit_code = exit_code


class NodesMissing(NodesProblem):
    exit_code = EXIT_FAILED


class NodesDiffer(NodesProblem):
    exit_code = EXIT_USAGE
    status = "refused"


@dataclass
class Watching:
    """What the launcher tells the watch about this node's job."""

    backend: str  # static | c10d (torch's names)
    endpoint: str  # HOST:PORT where the nodes meet
    run_id: str
    nnodes: int  # an elastic job's MAX
    node_rank: int | None  # as the job gives it; None: c10d, where torch's agent assigns one
    join_timeout: float
    min_nodes: int | None = None  # an elastic job's MIN (--nnodes MIN:MAX); None: a fixed count
    compared: dict[str, str] = field(default_factory=dict)  # what this node runs (node_compare.job_items)
    record: str = ""  # this node's launch record's name in the run dir: the nodes tell each other theirs
    abort: Callable[[], bool] = lambda: False  # the launch is being refused meanwhile (the recipe's check)
    last_step: Callable[[], int | None] = lambda: None  # the step this node's workers reached before a restart
    checkpoint_step: Callable[[], int | None] = lambda: None  # the step of the run's latest checkpoint, if any
    say: Callable[[str], None] = print

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None and self.min_nodes < self.nnodes

    @property
    def needed(self) -> int:
        """How many nodes the job needs to (re)start: all of them, or an elastic job's MIN."""
        return self.min_nodes if self.elastic and self.min_nodes is not None else self.nnodes

    def count(self, here: list[str]) -> str:
        """``1 of 2 here (node 0)``; an elastic job's ``1 here (node 0; the job takes 1 to 2)``."""
        if self.elastic:
            return f"{len(here)} here ({', '.join(here)}; the job takes {self.min_nodes} to {self.nnodes})"
        return f"{len(here)} of {self.nnodes} here ({', '.join(here)})"


@dataclass(frozen=True)
class Standing:
    """Where a wait stands: who is here, who is missing (by node rank, else a count), who was lost."""

    reachable: bool
    here: list[Member]
    missing: list[str]  # "node 1"; empty: unknown, see missing_count
    missing_count: int
    lost: list[Member]

    def missing_text(self) -> str:
        return ", ".join(self.missing) if self.missing else f"{self.missing_count} node(s)"


class Meeting:
    """One wait of this node for the others (``entry``: which rendezvous of this launcher; 0: the job's start)."""

    def __init__(self, watching: Watching, me: Member, entry: int, met: list[Member], view: Callable[[], View],
                 clock: Callable[[], float] = time.monotonic):
        self.w, self.me, self.entry, self.met, self._view, self._clock = watching, me, entry, met, view, clock
        self.started = clock()
        self.deadline = self.started + watching.join_timeout
        self._next_line = self.started + FIRST_LINE_S
        self._told_lost = False  # after a restart, the line that names a lost node comes as soon as it is seen
        self._step = watching.last_step() if entry else None

    def tick(self) -> None:
        """Between two slices of the wait: the refusal or the deadline that ends it, the line that is due."""
        if self.w.abort():
            raise NodesMissing("the launch was refused while the nodes met.", "", self.details())
        now = self._clock()
        if now >= self.deadline:
            raise self.missing()
        newly_lost = self.entry and not self._told_lost and self.standing().lost
        if now >= self._next_line or newly_lost:
            self._told_lost = self._told_lost or bool(newly_lost)
            self.w.say(f"mgpu launch: {self.line()}")
            self._next_line = now + LINE_EVERY_S

    def standing(self) -> Standing:
        view = self._view()
        here = view.waiting()
        if (self.me.host, self.me.pid) not in {(m.host, m.pid) for m in here}:
            here = sorted([*here, self.me], key=lambda m: (m.node_rank is None, m.node_rank or 0, m.host))
        ranks = {m.node_rank for m in here}
        missing = [] if None in ranks else [f"node {r}" for r in range(self.w.nnodes) if r not in ranks]
        lost = [m for m in self.met if (m.host, m.pid) != (self.me.host, self.me.pid) and view.reachable
                and view.gone(m)] if self.entry else []
        return Standing(view.reachable, here, missing, max(0, self.w.needed - len(here)), lost)

    def again_line(self) -> str:
        """Said at once when a restart's rendezvous starts."""
        nodes = f"the nodes (at least {self.w.min_nodes})" if self.w.elastic else f"the {self.w.nnodes} nodes"
        return (f"mgpu launch: the workers stopped; waiting for {nodes} to meet again at {self.w.endpoint} before "
                f"they restart ({self._left()}).")

    def line(self) -> str:
        """Where the wait stands (said as ``mgpu launch: LINE``): where, how many are here, who is missing or lost,
        the time left."""
        s = self.standing()
        if not s.reachable:
            return (f"waiting for the nodes to meet at {self.w.endpoint}: its rendezvous store does not "
                    f"answer yet ({self._host()}); {self._left()}.")
        count = self.w.count(self._labels(s.here))
        if s.lost and self.w.elastic:
            return (f"{self._lost(s)}; the job goes on without it once the nodes here meet at {self.w.endpoint}: "
                    f"{count}; {self._left()}.")
        if s.lost:
            them = "it" if len(s.lost) == 1 else "them"
            return (f"{self._lost(s)}; waiting for {them} to rejoin at {self.w.endpoint}: {count}; "
                    f"{self._left()}.")
        missing = f"; missing: {s.missing_text()}" if len(s.here) < self.w.needed else ""
        return f"waiting for the nodes to meet at {self.w.endpoint}: {count}{missing}; {self._left()}."

    def missing(self) -> NodesMissing:
        """The join timeout has passed: who never came, and what to check."""
        s, waited = self.standing(), f"within --join-timeout {self.w.join_timeout:g} s"
        if self.w.elastic and self.entry:
            return self._too_few(s, waited)
        if s.lost:
            message = f"{self._lost(s)} and did not rejoin at {self.w.endpoint} {waited}, so the job stops."
            hint = ("Start its launcher again with the same command within the join timeout (a c10d rendezvous, "
                    "--rdzv-endpoint, takes it back; a static one cannot), or restart the whole job: a recipe's "
                    "checkpoints are kept, continue it with --resume auto once every node is up.")
            return NodesMissing(message, hint, self.details("lost"), status="node_lost")
        if not s.reachable:
            message = (f"the nodes did not meet {waited}: the rendezvous store at {self.w.endpoint} never answered "
                       f"({self._host()}).")
        else:
            again = " again" if self.entry else ""
            message = (f"the nodes did not meet{again} at {self.w.endpoint} {waited}: {s.missing_text()} never "
                       f"joined ({len(s.here)} of {self.w.nnodes} here: {', '.join(self._labels(s.here))}).")
        return NodesMissing(message, self._checks(), self.details("timeout"))

    def _too_few(self, s: Standing, waited: str) -> NodesMissing:
        """An elastic job's restart found fewer than MIN nodes until the join timeout: stopped with its checkpoint
        (exit 75, for a scheduler to requeue), or without one (exit 1)."""
        lost = f"{self._lost(s)}; " if s.lost else ""
        saved = self.w.checkpoint_step()
        message = (f"{lost}the job needs at least {self.w.min_nodes} nodes (--nnodes {self.w.min_nodes}:"
                   f"{self.w.nnodes}) and {len(s.here)} met again at {self.w.endpoint} {waited} "
                   f"({', '.join(self._labels(s.here))}), so it stops")
        if saved is None:
            return NodesMissing(message + ".", self._checks(), self.details("too_few"), status="node_lost")
        hint = (f"Requeue the job with the same command plus --resume auto once at least {self.w.min_nodes} nodes can "
                "run it: it continues from that checkpoint.")
        return NodesMissing(f"{message}; its checkpoint at step {saved} is complete. Exit code {EXIT_PREEMPTED} "
                            "(requeue).", hint, {**self.details("too_few"), "checkpoint_step": saved},
                            status="node_lost", exit_code=EXIT_PREEMPTED)

    def failed(self, why: str, hint: str | None = None) -> NodesMissing:
        """The rendezvous itself ended the wait (closed by the others, its store gone)."""
        return NodesMissing(f"the nodes could not meet at {self.w.endpoint}: {why}.", hint or self._checks(),
                            self.details("failed"))

    def details(self, kind: str = "waiting") -> dict[str, Any]:
        s = self.standing()
        return {"kind": kind, "endpoint": self.w.endpoint, "backend": self.w.backend, "nnodes": self.w.nnodes,
                "min_nodes": self.w.min_nodes,
                "entry": self.entry, "waited_s": round(self._clock() - self.started, 1),
                "join_timeout": self.w.join_timeout, "reachable": s.reachable, "here": self._labels(s.here),
                "missing": s.missing or s.missing_count, "lost": self._labels(s.lost), "step": self._step}

    def _labels(self, members: list[Member]) -> list[str]:
        """Labels with hosts where the hosts of the nodes known here differ (node 1 (gpu-b))."""
        return labels(members, [*self.met, *self._view().waiting(), self.me])

    def _lost(self, s: Standing) -> str:
        at = f" at step {self._step}" if self._step is not None else ""
        return f"{', '.join(self._labels(s.lost))} lost{at}"

    def _left(self) -> str:
        return f"{duration(self.deadline - self._clock())} left (--join-timeout {self.w.join_timeout:g})"

    def _host(self) -> str:
        host = self.w.endpoint.rpartition(":")[0]
        if self.w.backend == "static":
            return "node 0's launcher hosts it" if self.w.node_rank != 0 else "this node hosts it"
        return f"the launcher on {host} hosts it"

    def _checks(self) -> str:
        return (f"Check that every node was started with the same mgpu launch command (a node given another "
                f"--rdzv-id or endpoint waits elsewhere), that each reaches {self.w.endpoint} (the address, the port, "
                "a firewall between the nodes), and that no pod or node of the job is still pending (kubectl get "
                "pods; squeue). --join-timeout S waits longer.")


def duration(seconds: float) -> str:
    """``9m55s``, ``45s``, ``1h05m``."""
    whole = max(0, int(seconds))
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"
