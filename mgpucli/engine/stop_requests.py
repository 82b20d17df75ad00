"""SIGTERM, SIGINT and SIGUSR1 as a request to stop after a checkpoint (what schedulers send before they kill).

A handler must not stop a rank by itself: a rank that leaves while the others wait in the next all-reduce
hangs them. It only notes the signal; the ranks agree on the stop at the next log-interval reduction
(:mod:`mgpucli.engine.log_interval`), save there, and leave together. A second SIGINT stops at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_SIGNALS = tuple(s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None)


class StopRequests:
    """The signal this rank received (``received``: its name, None until one arrives)."""

    def __init__(self) -> None:
        self.received: str | None = None

    def _note(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.received = signal.Signals(signum).name

    @contextlib.contextmanager
    def listening(self) -> Iterator[StopRequests]:
        """Handle the signals while the block runs (main thread only; the previous handlers come back after)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._note) for sig in _SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
