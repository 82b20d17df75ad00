"""When a stop signal (SIGINT, SIGTERM) is a second one, "again": stop at once (stdlib only).

A person who presses Ctrl-C twice, or a scheduler that sends its second signal, does so a moment after the first. A
wrapper can deliver one signal twice at once: GNU ``timeout`` (and wrapper scripts that do as it does) sends it to its
child and then to its own process group, which holds the child too, so the child receives it twice within
milliseconds. So a stop signal counts as "again" only when it comes :data:`AGAIN_AFTER_S` or more after the
signal before it that counted; sooner, it is that one delivered once more, and changes nothing. ``mgpu launch`` (whose
second signal kills the workers) and ``mgpu train`` (whose second Ctrl-C stops without a checkpoint) count them both
this way.
"""

from __future__ import annotations

import time
from collections.abc import Callable

AGAIN_AFTER_S = 0.5  # a double press of Ctrl-C is slower; a signal forwarded twice comes within milliseconds
FIRST, SAME, AGAIN = "first", "same", "again"


class SignalCount:
    """The stop signals one process received, told apart by when they came (``clock``: seconds, monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.counted_at: float | None = None  # when the latest signal that counted came

    def arrived(self) -> str:
        """Count the signal that arrives now: :data:`FIRST`, :data:`AGAIN`, or :data:`SAME` (the one that counted
        before it, delivered once more: within :data:`AGAIN_AFTER_S` of it)."""
        now = self._clock()
        if self.counted_at is not None and now - self.counted_at < AGAIN_AFTER_S:
            return SAME
        first = self.counted_at is None
        self.counted_at = now
        return FIRST if first else AGAIN
