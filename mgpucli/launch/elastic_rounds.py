"""The rounds of an elastic job's c10d rendezvous: when a node enters one, and torch's settings for them (pure).

torch's c10d rendezvous completes a round once MAX nodes have joined, or ``last_call_timeout`` after MIN have; it
drops a node whose keep-alive stopped for ``keep_alive_interval`` x ``keep_alive_max_attempt``. With torch's
defaults (30 s; 5 s x 3) a lost node costs the survivors some 45 s before their workers even start again. mgpu
takes the grace for more nodes out of torch's round and keeps it in its own wait, where it knows who is here
(:mod:`mgpucli.launch.node_presence`), so that torch's round can close at once:

* at the job's start, a node enters torch's round once :data:`MAX` nodes are here, or MIN have been here for
  :data:`START_GRACE_S` (torch's own last-call grace);
* after a restart (a node lost, a worker failed, a node joined), once every node of the last round that is still
  alive waits again (the survivors finish their workers' checkpoint first), or :data:`START_GRACE_S` after MIN are
  here, whichever comes first;
* a node that finds the job already running (a launcher of it that has met before is alive) enters at once:
  torch's agent admits it at the next round (the running nodes restart their workers for it, which costs no step).

Until this node's presence sees the store (its first beats), it waits too, for up to :data:`UNSEEN_S`: a store that
never answers is torch's round's to report.

torch's round then closes :data:`LAST_CALL_S` after MIN nodes joined it, enough for nodes that entered a beat apart
(:data:`mgpucli.launch.node_presence.BEAT_S`); a node that comes later still joins at the next round.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpucli.launch.node_presence import Member, View

START_GRACE_S = 30.0  # torch's last_call_timeout default: how long MIN nodes wait for more at the job's start
LAST_CALL_S = 5.0  # torch's round closes this long after MIN nodes joined it (mgpu's wait did the grace)
UNSEEN_S = 10.0  # the store not answering this node's presence this long: torch's round says what became of it
KEEP_ALIVE_S = 2  # torch's keep-alive interval: a node dead after KEEP_ALIVE_S x KEEP_ALIVE_TRIES without one
KEEP_ALIVE_TRIES = 3
# Restarts an elastic job's membership changes may take beside --max-restarts (torch counts a lost node as a failure
# of the survivors' worker group; mgpu counts the job's own failures against --max-restarts itself).
NODE_CHANGES = 100


def rendezvous_conf() -> dict[str, str]:
    """torch's c10d settings for an elastic job's rounds (``--rdzv-conf``), beside its join timeout."""
    return {"last_call_timeout": f"{LAST_CALL_S:g}", "keep_alive_interval": str(KEEP_ALIVE_S),
            "keep_alive_max_attempt": str(KEEP_ALIVE_TRIES)}


@dataclass
class Gathering:
    """This node's wait before it enters torch's round (one per rendezvous of this launcher; see the module)."""

    low: int  # MIN nodes
    high: int  # MAX nodes
    me: Member
    met: list[Member]  # the nodes of this launcher's last round (empty at its first)
    grace_s: float = START_GRACE_S
    _enough_since: float | None = None  # when MIN nodes were first seen here
    _unseen_since: float | None = None  # since when the store has not answered (this node's presence not connected)

    def ready(self, view: View, now: float) -> bool:
        """Whether to enter torch's round now, from the last presence view."""
        if not view.reachable:  # not connected yet, or the store is gone: torch's round says the rest after a while
            self._unseen_since = now if self._unseen_since is None else self._unseen_since
            return now - self._unseen_since >= UNSEEN_S
        others = [s for s in view.seen if s.fresh and (s.member.host, s.member.pid) != (self.me.host, self.me.pid)]
        if not self.met and any(s.met for s in others):
            return True  # the job runs (or ran) elsewhere: torch's wait list admits this node
        waiting = 1 + sum(1 for s in others if s.waiting)
        if waiting >= self.low and self._enough_since is None:
            self._enough_since = now
        if self._enough_since is not None and now - self._enough_since >= self.grace_s:
            return True
        if not self.met:
            return waiting >= self.high
        alive = {(s.member.host, s.member.pid): s for s in others}
        return all(alive[(m.host, m.pid)].waiting for m in self.met if (m.host, m.pid) in alive)
