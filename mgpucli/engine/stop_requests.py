"""SIGTERM, SIGINT and SIGUSR1 as a request to stop after a checkpoint (what schedulers send before they kill).

A handler must not stop a rank by itself: a rank that leaves while the others wait in the next all-reduce
hangs them. It only notes the signal; the ranks agree on the stop at the next log-interval reduction
(:mod:`mgpucli.engine.log_interval`), save there, and leave together. A second SIGINT stops at once; the first one
delivered twice at once (GNU ``timeout`` sends it to its child and to its process group) is one
(:mod:`mgpucli.stop_signals`).

Once the run has finished (:meth:`StopRequests.finish`: its final checkpoint complete, every rank agreed), a signal
is only noted until :meth:`StopRequests.release`: it arrived during the teardown, and a rank killed there would turn
a finished run into a failed one.

Under ``mgpu launch``, a SIGTERM may also be torch's agent tearing down an attempt in which another rank failed:
there is nothing left to agree on, and the rank ends at once, by that signal (:attr:`StopRequests.is_teardown`, set by
the launched worker, :mod:`mgpucli.launch.teardown`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

from mgpucli.stop_signals import AGAIN, SAME, SignalCount

_SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None)


class StopRequests:
    """The signal this rank received (``received``: its name, None until one arrives)."""

    # Set in a launched worker: whether a SIGTERM now is torch's agent tearing down a failed attempt (None: never).
    is_teardown: Callable[[], bool] | None = None

    def __init__(self, count: SignalCount | None = None) -> None:
        self.received: str | None = None
        self.count = count or SignalCount()
        self.run_finished = False
        self._previous: dict = {}  # the handlers listening() replaced, kept after a finished run until release()

    def _note(self, signum, frame) -> None:
        teardown = StopRequests.is_teardown  # read from the class: a plain function, not a method
        if signum == signal.SIGTERM and not self.run_finished and teardown is not None and teardown():
            signal.signal(signum, signal.SIG_DFL)  # end by the signal itself, as a process without a handler would
            os.kill(os.getpid(), signum)
        counted = self.count.arrived()
        if counted == SAME:
            return  # the first signal, delivered once more
        if counted == AGAIN and signum == signal.SIGINT and not self.run_finished:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.received = signal.Signals(signum).name

    def finish(self) -> None:
        """The run finished: from now until :meth:`release`, a stop signal is only noted (the teardown goes on)."""
        self.run_finished = True

    def release(self) -> None:
        """Give the signals back to the handlers :meth:`listening` found (after a finished run's teardown)."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    @contextlib.contextmanager
    def listening(self) -> Iterator[StopRequests]:
        """Handle the signals while the block runs (main thread only). The previous handlers come back after it, or,
        when the run finished inside it, at :meth:`release`."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._previous = {sig: signal.signal(sig, self._note) for sig in _SIGNALS}
        try:
            yield self
        finally:
            if not self.run_finished:
                self.release()
