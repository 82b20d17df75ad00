"""The nodes of a job meet with a voice, a deadline and every signal working; then they compare what they run.

torch's agent runs in the launcher's main thread, and its rendezvous waits there: the static one inside its store's
constructor (node 0 until every node has connected, the others until node 0 listens) and in the rank assignment's
``multi_get``, where no Python signal handler runs; the c10d one in a polling loop that says nothing. So a node whose
peers never come waited in silence until killed, deaf to Ctrl-C and SIGTERM. mgpu registers two rendezvous backends
with torch's public registry, ``mgpu-static`` and ``mgpu-c10d`` (:func:`prepare` names the one the plan's backend
becomes; the torchrun command shown keeps torch's name), whose handler (:class:`WatchedRendezvous`):

* runs the blocking part (torch's c10d rendezvous, or the static store's connection) in a daemon thread while the
  main thread waits in short slices (:func:`mgpucli.launch.store_waits.call`): a signal acts within a moment, the
  agent takes its usual path (the workers, if any, stopped; exit 130/143), and the thread dies with the process;
* says, a few seconds after it starts waiting and every 30 s after, where the nodes meet, how many are here, which
  are missing (by node rank where the job gives them) or lost (after a restart: the node whose launcher stopped,
  :mod:`mgpucli.launch.node_presence`), and the time left; and ends the wait at the join timeout
  (``--join-timeout``) with exit 1, naming who never came and what to check (:mod:`mgpucli.launch.meeting`);
* once the nodes have met, before the agent assigns ranks or starts a worker, has every node put what it runs in the
  store and compares them all (:mod:`mgpucli.launch.node_compare`): any difference stops every node with exit 2;
* hands torch's agent a store whose waits never block (:class:`mgpucli.launch.store_waits.WatchedStore`): the rank
  assignment and the exit barrier wait in Python too.
* for an elastic job (``--nnodes MIN:MAX``), enters torch's round only once the nodes have gathered
  (:mod:`mgpucli.launch.elastic_rounds`), and records every round it completes (:func:`last_round`): who was lost or
  joined since the round before, and whether the job ran before it (its workers then resume from its checkpoint).

The static handler is mgpu's own (:class:`StaticNodes`, torch's minus the store's wait for its peers, which the
presence and the comparison do instead); the c10d one is torch's, made with torch's public ``create_backend`` and
``create_handler`` inside the thread (connecting to an endpoint that is not up yet blocks).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)

from mgpucli.launch import node_compare
from mgpucli.launch.elastic_rounds import Gathering
from mgpucli.launch.meeting import Meeting, NodesDiffer, Watching
from mgpucli.launch.node_presence import Member, Presence, labels
from mgpucli.launch.ports import answers, listens_here
from mgpucli.launch.store_waits import WatchedStore, call, wait_for_keys

BACKENDS = {"static": "mgpu-static", "c10d": "mgpu-c10d"}  # torch's backend -> mgpu's watched one
READ_WAIT_S = 10.0  # nodes that differ: how long each waits for the others to have read every node's items
_RETRY_S = 1.0  # the c10d endpoint not up yet: the next try
_STORE_GONE = ("A c10d rendezvous keeps its store in the launcher on the endpoint's host; with that node gone the "
               "others cannot meet again. Restart the job once every node is up (a recipe continues with --resume "
               "auto); keep the endpoint on a node that stays.")


_GATHER_EVERY_S = 0.25  # an elastic job's wait before torch's round: how often it looks again


@dataclass(frozen=True)
class Round:
    """One rendezvous this launcher completed: who met, and how that differs from its round before."""

    entry: int  # which rendezvous of this launcher (0: its first)
    members: tuple[Member, ...]
    lost: tuple[Member, ...]  # in this launcher's round before, not in this one
    joined: tuple[Member, ...]  # in this one, not in the round before (none at this launcher's first)
    continues: bool  # a node of it had met before: the job ran, and its workers resume from its checkpoint
    records: tuple[str, ...] = ()  # each member's launch record's name in the run dir, in the members' order

    @property
    def changed(self) -> bool:
        return bool(self.lost or self.joined)

    def nodes(self) -> list[dict[str, Any]]:
        """The members as a launch record keeps them (an attempt's ``nodes``): label, host, pid, record's name."""
        return [{"node": label, "host": m.host, "pid": m.pid, "record": record}
                for m, label, record in zip(self.members, self.labels(self.members), self.records, strict=True)]

    def labels(self, members: tuple[Member, ...]) -> list[str]:
        return labels(list(members), [*self.members, *self.lost])


_watching: Watching | None = None
_meeting: Meeting | None = None  # the wait in progress, for a signal's report (:func:`waiting_now`)
_rounds: list[Round] = []  # the rendezvous this launcher completed, in order


def last_round() -> Round | None:
    """The rendezvous this launcher completed last (None: none yet)."""
    return _rounds[-1] if _rounds else None


def prepare(watching: Watching) -> str:
    """Watch this launch's rendezvous; returns the backend name torch's launch config takes instead of its own."""
    global _watching
    _watching = watching
    for name, creator in ((BACKENDS["static"], _create_static), (BACKENDS["c10d"], _create_c10d)):
        rendezvous_handler_registry.register(name, creator)  # the same creator again is a no-op
    return BACKENDS[watching.backend]


def meeting() -> bool:
    """Whether the nodes are meeting now (no worker runs); safe in a signal handler: it takes no lock."""
    return _meeting is not None


def waiting_now() -> tuple[str, dict[str, Any]] | None:
    """While the nodes meet: (a line saying where the wait stands, its details for the record); else None."""
    meeting = _meeting
    return None if meeting is None else (meeting.line(), meeting.details())


def _create_static(params: RendezvousParameters) -> RendezvousHandler:
    host, _, port = params.endpoint.rpartition(":")
    inner = StaticNodes(host, int(port), int(params.config["rank"]), params.max_nodes, params.run_id,
                        float(params.config.get("timeout", 900)))

    def open_handler(deadline: float) -> RendezvousHandler:
        if inner.rank != 0:  # node 0 hosts the store: the others connect once it listens
            _await(lambda: answers(inner.host, inner.port), deadline)
        return inner

    return WatchedRendezvous(_required(), open_handler)


def _create_c10d(params: RendezvousParameters) -> RendezvousHandler:
    host, _, port = params.endpoint.rpartition(":")

    def open_handler(deadline: float) -> RendezvousHandler:
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

        while True:  # the endpoint's host hosts the store; the others connect once it listens
            _await(lambda: listens_here(host, int(port)) or answers(host, int(port)), deadline)
            try:
                backend, store = create_backend(params)
                return create_handler(store, backend, params)
            except RendezvousConnectionError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(_RETRY_S)

    return WatchedRendezvous(_required(), open_handler)


def _await(ready, deadline: float) -> None:
    """Until ``ready()``, trying every :data:`_RETRY_S` (in the waiting thread); TimeoutError at ``deadline``."""
    while not ready():
        if time.monotonic() >= deadline:
            raise TimeoutError("the rendezvous store never answered")
        time.sleep(_RETRY_S)


def _required() -> Watching:
    if _watching is None:
        raise RuntimeError("mgpu's rendezvous backends are used through mgpucli.launch.rendezvous_watch.prepare")
    return _watching


class StaticNodes(RendezvousHandler):
    """torch's static rendezvous (node 0 hosts the store at the master's address, every node knows its rank),
    without the store's blocking wait for every node to connect: :class:`WatchedRendezvous` waits instead."""

    def __init__(self, host: str, port: int, rank: int, nnodes: int, run_id: str, timeout_s: float):
        self.host, self.port, self.rank, self.nnodes, self.run_id = host, port, rank, nnodes, run_id
        self.timeout = timedelta(seconds=timeout_s)
        self._store: TCPStore | None = None

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:  # node 0 listens at once; another node blocks here until node 0 does
            self._store = TCPStore(self.host, self.port, self.nnodes, self.rank == 0, self.timeout,
                                   wait_for_workers=False, multi_tenant=True)
        return RendezvousInfo(PrefixStore(self.run_id, self._store), self.rank, self.nnodes,
                              RendezvousStoreInfo(self.host, self.port))

    def get_backend(self) -> str:
        return "static"

    @property
    def use_agent_store(self) -> bool:
        return True

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


class WatchedRendezvous(RendezvousHandler):
    """torch's rendezvous (``open_inner(deadline)`` makes it, in the waiting thread), with the waiting lines, the join
    timeout, the comparison of what the nodes run and a store whose waits never block (see the module)."""

    def __init__(self, watching: Watching, open_inner):
        self._w, self._open = watching, open_inner
        self._inner: RendezvousHandler | None = None
        self._me = Member(socket.gethostname(), os.getpid(), watching.node_rank)
        self._presence: Presence | None = None
        self._entries = 0
        self._met: list[Member] = []  # the nodes of the last rendezvous: after a restart, who was lost
        self._refused = False  # the nodes differ: every one stops, nothing to close
        self._gathering: Gathering | None = None  # an elastic job's wait before torch's round (elastic_rounds)

    def next_rendezvous(self) -> RendezvousInfo:
        global _meeting
        entry, self._entries = self._entries, self._entries + 1
        presence = self._presence_started()
        meeting = Meeting(self._w, self._me, entry, self._met, presence.view)
        if entry:
            self._w.say(meeting.again_line())
        _meeting = meeting  # kept when the wait ends otherwise: a signal's report says where it stood
        presence.waiting(entry)
        if self._w.elastic:
            self._gathering = Gathering(self._w.needed, self._w.nnodes, self._me, list(self._met))
        try:
            info = self._join(meeting)
            try:
                self._met = self._compare(info, entry, meeting)
                presence.met()
            except RuntimeError as err:  # the store's host left (its own join timeout, a refusal, a crash)
                raise meeting.failed(f"the rendezvous store went away while they compared their jobs ({err})") \
                    from None
        finally:
            presence.waiting(None)
        _meeting = None
        return RendezvousInfo(WatchedStore(info.store), info.rank, info.world_size, info.bootstrap_store_info)

    def _presence_started(self) -> Presence:
        if self._presence is None:
            host, _, port = self._w.endpoint.rpartition(":")
            self._presence = Presence(host, int(port), self._w.run_id, self._me)
            self._presence.start()
        return self._presence

    def _join(self, meeting: Meeting) -> RendezvousInfo:
        """torch's rendezvous, in a thread; its own ends of the wait said as mgpu's."""
        try:
            return call(self._inner_rendezvous, meeting.deadline, tick=meeting.tick)
        except RendezvousTimeoutError:
            raise meeting.missing() from None
        except RendezvousClosedError:
            raise meeting.failed("the rendezvous was closed: the other nodes stopped waiting for this one (their "
                                 "join timeout)") from None
        except RendezvousConnectionError as err:
            raise meeting.failed(f"the connection to its store failed ({err.__cause__ or err}); the launcher "
                                 "that hosted it is gone", _STORE_GONE) from None
        except (RuntimeError, TimeoutError) as err:  # the static store: node 0's port taken, or never reached
            if time.monotonic() >= meeting.deadline:
                raise meeting.missing() from None
            raise meeting.failed(f"its store failed ({err})") from None

    def _inner_rendezvous(self, deadline: float) -> RendezvousInfo:
        if self._inner is None:
            self._inner = self._open(deadline)
        gathering, self._gathering = self._gathering, None
        while gathering is not None and not gathering.ready(self._presence_started().view(), time.monotonic()):
            if time.monotonic() >= deadline:  # (in the waiting thread) said as the meeting's own timeout
                raise TimeoutError("the nodes never gathered")
            time.sleep(_GATHER_EVERY_S)
        return self._inner.next_rendezvous()

    def _compare(self, info: RendezvousInfo, entry: int, meeting: Meeting) -> list[Member]:
        """Every node puts what it runs in the rendezvous's store, reads every node's and compares them
        (:mod:`mgpucli.launch.node_compare`); the nodes as they met, or :class:`NodesDiffer` on every node."""
        store = info.store
        prefix = "mgpu/compare/" + (f"{entry}/" if self._w.backend == "static" else "")  # c10d: a store per round
        node = self._me.node_rank if self._me.node_rank is not None else info.rank
        mine = {"host": self._me.host, "pid": self._me.pid, "node": node, "met": len(_rounds),
                "items": self._w.compared, "record": self._w.record}
        call(store.set, f"{prefix}{info.rank}", json.dumps(mine), tick=meeting.tick)
        keys = [f"{prefix}{rank}" for rank in range(info.world_size)]
        wait_for_keys(store, keys, float("inf"), tick=meeting.tick)  # the meeting's deadline ends it
        records = [json.loads(raw) for raw in call(store.multi_get, keys, tick=meeting.tick)]
        members = [Member(r["host"], int(r["pid"]), r["node"]) for r in records]
        names = labels(members)
        if len(set(names)) < len(names):  # node ranks given twice: the rendezvous's own ranks tell them apart
            names = [f"node {rank}" for rank in range(len(records))]
        found = node_compare.differences(dict(zip(names, (r["items"] for r in records), strict=True)))
        if found:
            self._leave_after_all_read(store, prefix, info)
            message, hint = node_compare.refusal(found)
            raise NodesDiffer(message, hint, {**meeting.details("differ"), "differences": [
                {"item": d.item, "values": d.values, "said": d.describe()} for d in found]})
        _note_round(entry, self._met, members, any(int(r.get("met") or 0) > 0 for r in records),
                    tuple(str(r.get("record") or "") for r in records))
        return members

    def _leave_after_all_read(self, store, prefix: str, info: RendezvousInfo) -> None:
        """Before the nodes that differ stop: the node that hosts the store waits (a while) until every node has read
        every node's items, so that it does not take the store away from under them; the others have read them."""
        self._refused = True
        call(store.set, f"{prefix}read/{info.rank}", "1")
        host, _, port = self._w.endpoint.rpartition(":")
        hosting = info.rank == 0 if self._w.backend == "static" else listens_here(host, int(port))
        if hosting:
            with contextlib.suppress(RuntimeError):
                wait_for_keys(store, [f"{prefix}read/{rank}" for rank in range(info.world_size)], READ_WAIT_S)

    def get_backend(self) -> str:
        return BACKENDS[self._w.backend]  # torch's registry checks the handler's name against the one asked for

    @property
    def use_agent_store(self) -> bool:
        return self._inner.use_agent_store if self._inner is not None else True

    def is_closed(self) -> bool:
        return bool(call(self._inner.is_closed)) if self._inner is not None else False

    def set_closed(self) -> None:
        if self._inner is not None:
            call(self._inner.set_closed)

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join (torch's agent asks while the workers run); 0 when the store cannot say: the workers
        then fail on their own, and the next rendezvous tells what became of the store."""
        if self._inner is None or self._w.backend == "static":
            return 0
        try:
            return int(call(self._inner.num_nodes_waiting))
        except RendezvousError:
            return 0

    def get_run_id(self) -> str:
        return self._w.run_id

    def shutdown(self) -> bool:
        if self._inner is None or self._refused:
            return True
        return bool(call(self._inner.shutdown))


def _note_round(entry: int, before: list[Member], members: list[Member], continues: bool,
                records: tuple[str, ...] = ()) -> None:
    """Record a completed rendezvous (:func:`last_round`), with who was lost and who joined since the one before
    (``records``: each member's launch record's name)."""
    def key(m: Member) -> tuple[str, int]:
        return m.host, m.pid

    now, then = {key(m) for m in members}, {key(m) for m in before}
    lost = tuple(m for m in before if key(m) not in now)
    joined = tuple(m for m in members if key(m) not in then) if entry else ()
    _rounds.append(Round(entry, tuple(members), lost, joined, continues, records or ("",) * len(members)))


def watch_plan(plan, abort, last_step, checkpoint_step=lambda: None) -> str:
    """Watch the rendezvous of ``plan`` (a :class:`mgpucli.launch.plan.LaunchPlan` of several nodes): the backend name
    torch's launch config takes instead of its own. ``abort()``: the launch is being refused meanwhile;
    ``last_step()``: the step this node's workers reached, for the line after a restart; ``checkpoint_step()``: the
    step of the run's latest checkpoint (an elastic job's stop below its MIN nodes says it)."""
    from mgpucli.console import err_console

    def say(line: str) -> None:
        err_console().print(line, markup=False, highlight=False)

    if plan.join_timeout is None:
        raise ValueError("a plan of one node has no rendezvous to watch")
    return prepare(Watching(backend=plan.rdzv_backend, endpoint=plan.rdzv_endpoint, run_id=plan.rdzv_id,
                            nnodes=plan.nnodes, node_rank=plan.node_rank, join_timeout=plan.join_timeout,
                            min_nodes=plan.nnodes_min, compared=dict(plan.compared),
                            record=os.path.basename(plan.launch_json), abort=abort,
                            last_step=last_step, checkpoint_step=checkpoint_step, say=say))
