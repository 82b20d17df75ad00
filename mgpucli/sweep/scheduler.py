"""The sweep's loop: trials queued for the next free slot, each launch watched until it ends, all of them stopped
together on Ctrl-C or SIGTERM.

A stop signal reaches the sweep alone (every trial's launcher is in a session of its own); the sweep passes it on to
each running launcher, which stops its ranks at one step with a checkpoint (exit 75), and starts no more trials. A
second signal (``mgpucli.stop_signals``: not the first delivered twice at once) is passed on too: the launchers then
stop at once. A failed trial does not stop the others, unless ``fail_fast``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mgpucli.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from mgpucli.stop_signals import SAME, SignalCount
from mgpucli.sweep.record import FAILED, PRUNED, STOPPED, SweepRecord, TrialRecord, to_run
from mgpucli.sweep.slots import Slot, Slots
from mgpucli.sweep.trials import Running, TrialCommand, start

POLL_S = 0.2  # how often the launchers' exits and the progress files are looked at


@dataclass
class StopRequests:
    """The stop signals the sweep received, and what it passed on to the running trials."""

    running: Callable[[], list[Running]]
    count: SignalCount = field(default_factory=SignalCount)
    signal_name: str | None = None
    passed_on: int | None = None  # the latest signal passed on
    fail_fast: bool = False  # a trial failed under --fail-fast: the others are being stopped

    @property
    def requested(self) -> bool:
        return self.signal_name is not None or self.fail_fast

    def handle(self, signum: int, _frame) -> None:
        if self.count.arrived() == SAME:
            return  # the one that counted, delivered once more (a wrapper's): already passed on
        self.signal_name = self.signal_name or signal.Signals(signum).name
        self.pass_on(signum)

    def pass_on(self, signum: int) -> None:
        self.passed_on = signum
        for run in self.running():
            self.catch_up(run)

    def catch_up(self, run: Running) -> None:
        """Pass the latest signal on to ``run`` too (a trial started as the signal came: not yet among the running
        when it was passed on)."""
        if self.passed_on is not None and run.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.proc.pid, self.passed_on)


class GridSource:
    """The trials a grid has left (:func:`mgpucli.sweep.record.to_run`), in order. A search
    (:class:`mgpucli.sweep.search.SearchSource`) has the same four methods and asks for its trials as slots free."""

    def __init__(self, record: SweepRecord):
        self.queue = collections.deque(to_run(record))

    def has_next(self) -> bool:
        return bool(self.queue)

    def next(self) -> TrialRecord:
        return self.queue.popleft()

    def to_prune(self, running: list[Running]) -> list[Running]:
        """The running trials to stop now, their validation fallen behind (a grid stops none)."""
        return []

    def ended(self, run: Running) -> None:
        pass


def run_trials(record: SweepRecord, slots: Slots, command: TrialCommand, sweep_dir: str, view,
               ended: Callable[[Running], None], fail_fast: bool = False, source=None) -> int:
    """Run the trials ``source`` gives (default: every one ``record`` has left) in ``slots``; ``ended(run)`` is
    called as each trial's launch ends, after its state is set. Returns the sweep's exit code: 75 when it was
    stopped, else 1 when a trial failed, else 0."""
    source = source or GridSource(record)
    free: list[Slot] = list(slots.slots)
    running: list[Running] = []
    stops = StopRequests(lambda: running)
    previous = {sig: signal.signal(sig, stops.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while running or (source.has_next() and not stops.requested):
            while free and not stops.requested and source.has_next():
                run = start(source.next(), free.pop(0), command, sweep_dir)
                running.append(run)
                stops.catch_up(run)  # a signal that came while it started
                record.save(sweep_dir)
                view.started(run)
            view.refresh(running)
            time.sleep(POLL_S)
            for run in source.to_prune(running):
                run.pruned = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(run.proc.pid, signal.SIGTERM)  # stops at a checkpoint, as a preemption
            for run in [r for r in running if r.proc.poll() is not None]:
                running.remove(run)
                free.append(run.slot)
                free.sort(key=lambda s: s.index)
                _ended(run, stops, record, sweep_dir, view, [ended, source.ended])
                if fail_fast and run.trial.state == FAILED and not stops.requested:
                    stops.fail_fast = True
                    stops.pass_on(signal.SIGTERM)
    except BaseException:  # the sweep itself failed (a bug, the study's storage): no trial runs on without it
        stops.pass_on(signal.SIGTERM)
        for run in running:
            run.proc.wait()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stops.signal_name is not None:
        return EXIT_PREEMPTED
    return EXIT_FAILED if any(t.state == FAILED for t in record.trials) else EXIT_OK


def _ended(run: Running, stops: StopRequests, record: SweepRecord, sweep_dir: str, view, then) -> None:
    run.log.close()
    run.trial.end(run.proc.returncode, time.time(), signalled=stops.passed_on is not None or run.pruned)
    if run.pruned and run.trial.state == STOPPED:
        run.trial.state = PRUNED
    for call in then:
        call(run)
    record.save(sweep_dir)
    view.ended(run)
