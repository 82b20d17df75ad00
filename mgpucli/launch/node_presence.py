"""Which launchers of a job are here, and which are waiting for the others, seen through the rendezvous store.

Neither of torch's rendezvous says who has joined while it waits (the static one waits inside its store's
constructor; the c10d one keeps its state private). So every launcher of a job keeps its own small record in the
rendezvous store, on a connection of its own, from a daemon thread (:class:`Presence`): who it is (host, pid, the
node rank the job gives it, if any), whether it is waiting for the others now, which rendezvous of its own this is,
how many times its nodes have met, and a beat it renews every :data:`BEAT_S`. Each launcher reads every record at
each beat, so the waiting line (and the report when the wait ends) can say how many nodes are here, which are
missing, and which one was lost: a record whose beat stopped for :data:`STALE_S` is a launcher that is gone (killed,
or cut off). The main thread reads only the last :class:`View`: it never waits on the store for it.

The records live under ``mgpu/presence/<run id>/``: a counter hands each launcher a slot, ``.../<slot>`` holds its
record as JSON.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

BEAT_S = 2.0  # how often a launcher renews its record and reads the others'
STALE_S = 6.0  # a record not renewed this long: its launcher is gone
_CONNECT_S = 5.0  # one connection attempt, and the timeout of each store call on it
_STOP_WAIT_S = 4 * _CONNECT_S + 1  # a beat in flight: a connection and its store calls, each bounded by _CONNECT_S


@dataclass(frozen=True)
class Member:
    """One launcher of the job."""

    host: str
    pid: int
    node_rank: int | None = None  # as the job gives it (SLURM, PET_NODE_RANK, --node-rank); None: not given

    def label(self, hosts_differ: bool = True) -> str:
        """``node 1`` (with its host where the nodes' hosts differ), or its host where the job gives no rank."""
        if self.node_rank is None:
            return f"{self.host} (pid {self.pid})"
        return f"node {self.node_rank}" + (f" ({self.host})" if hosts_differ else "")


def labels(members: list[Member], among: list[Member] | None = None) -> list[str]:
    """The members' labels, with their hosts where the hosts of ``among`` (default: the members) differ."""
    differ = len({m.host for m in (members if among is None else among)}) > 1
    return [m.label(differ) for m in members]


@dataclass(frozen=True)
class Seen:
    """A record as read: whose, whether that launcher waits for the others now, and whether it is alive."""

    member: Member
    waiting: bool
    entry: int  # which rendezvous of that launcher (0: its first)
    fresh: bool  # renewed within STALE_S (or first read less than STALE_S ago)
    met: int = 0  # how many times that launcher's nodes have met (its rounds completed): the job ran with it


@dataclass(frozen=True)
class View:
    """What the last beat saw: whether the store answered, and every record."""

    reachable: bool = False
    seen: tuple[Seen, ...] = ()

    def waiting(self) -> list[Member]:
        """The launchers waiting for the others now, alive, by node rank then host."""
        here = [s.member for s in self.seen if s.waiting and s.fresh]
        return sorted(here, key=lambda m: (m.node_rank is None, m.node_rank or 0, m.host, m.pid))

    def gone(self, member: Member) -> bool:
        """Whether ``member``'s launcher stopped renewing its record (or has none)."""
        found = next((s for s in self.seen if (s.member.host, s.member.pid) == (member.host, member.pid)), None)
        return found is None or not found.fresh


@dataclass
class _Slot:
    beat: int
    changed: float  # when its beat was last seen to change (monotonic)
    seen: Seen


@dataclass
class _State:
    waiting: bool = False
    entry: int = 0
    met: int = 0
    slots: dict[int, _Slot] = field(default_factory=dict)


class Presence(threading.Thread):
    """This launcher's record in the store at ``host:port``, renewed from a daemon thread, and the others' read."""

    def __init__(self, host: str, port: int, run_id: str, me: Member):
        super().__init__(name="mgpu-presence", daemon=True)
        self._where, self._me, self._base = (host, port), me, f"mgpu/presence/{run_id}"
        self._lock = threading.Lock()
        self._state, self._view = _State(), View()
        self._store: Any = None
        self._slot: int | None = None
        self._beat = 0
        self._stopping = threading.Event()

    def start(self) -> None:
        super().start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """No more beats; wait for one in flight (its store calls time out within :data:`_CONNECT_S` each). Run at
        the launcher's exit: a daemon thread still inside a store call when the interpreter finalizes is ended from
        under torch's C++ client, and a failing call then aborts the process (``terminate called without an active
        exception``, exit -6: node 1 of a job whose node 0 had just finished and closed the store)."""
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=_STOP_WAIT_S)

    def view(self) -> View:
        with self._lock:
            return self._view

    def waiting(self, entry: int | None) -> None:
        """This launcher waits for the others in its rendezvous ``entry`` (None: it does not wait now)."""
        with self._lock:
            self._state.waiting = entry is not None
            if entry is not None:
                self._state.entry = entry

    def met(self) -> None:
        """This launcher's nodes have met (one more round completed)."""
        with self._lock:
            self._state.met += 1

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._beat_once()
            except Exception:  # noqa: BLE001 - the store is gone or cut off: try again, say it is unreachable
                self._store = None
                with self._lock:
                    self._view = replace(self._view, reachable=False)
            self._stopping.wait(BEAT_S)

    def _beat_once(self) -> None:
        store = self._connect()
        with self._lock:
            record = {"host": self._me.host, "pid": self._me.pid, "node": self._me.node_rank,
                      "waiting": self._state.waiting, "entry": self._state.entry, "met": self._state.met,
                      "beat": self._beat}
        self._beat += 1
        if self._slot is None:
            self._slot = int(store.add(f"{self._base}/count", 1)) - 1
        store.set(f"{self._base}/{self._slot}", json.dumps(record))
        records = {}
        for slot in range(int(store.add(f"{self._base}/count", 0))):
            key = f"{self._base}/{slot}"
            if store.check([key]):  # a launcher between taking its slot and writing it: read at the next beat
                with contextlib.suppress(ValueError):
                    records[slot] = json.loads(store.get(key))
        self._observe(records, time.monotonic())

    def _connect(self) -> Any:
        if self._store is None:
            from mgpucli.distributed.store_client import connect
            from mgpucli.launch.ports import answers

            if not answers(*self._where):  # not up yet: asked quietly (torch's client logs every failed try)
                raise ConnectionError(f"nothing listens at {self._where[0]}:{self._where[1]}")

            self._store = connect(*self._where, _CONNECT_S)
        return self._store

    def _observe(self, records: dict[int, dict[str, Any]], now: float) -> None:
        with self._lock:
            slots = self._state.slots
            for slot, rec in records.items():
                member = Member(str(rec.get("host")), int(rec.get("pid") or 0), rec.get("node"))
                beat = int(rec.get("beat") or 0)
                known = slots.get(slot)
                changed = now if known is None or known.beat != beat else known.changed
                fresh = slot == self._slot or now - changed < STALE_S
                seen = Seen(member, bool(rec.get("waiting")), int(rec.get("entry") or 0), fresh,
                            int(rec.get("met") or 0))
                slots[slot] = _Slot(beat, changed, seen)
            self._view = View(True, tuple(s.seen for _, s in sorted(slots.items())))
