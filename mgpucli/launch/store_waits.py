"""Store calls that never hold the launcher's main thread longer than a moment, so that its signals always act.

A Python signal handler runs in the main thread between two bytecodes: while that thread is inside one blocking
C++ call (a ``TCPStore`` constructor that waits for its peers, a ``get`` or ``multi_get`` of a key nobody has set,
a ``wait``), Ctrl-C and SIGTERM wait with it, up to the store's timeout (torch's static rendezvous: 900 s). So every
store call the launcher's main thread makes on behalf of torch's agent goes through here:

* :func:`call` runs a call in a daemon thread and waits for it in short slices: the main thread stays in Python,
  its signal handlers run, and a ``tick`` (the waiting line, a deadline) runs between slices. A call a signal cuts
  short is left to its thread, which dies with the process.
* :class:`WatchedStore` is the store torch's agent gets from the rendezvous (it only calls its methods): a wait for
  keys (``get``, ``multi_get``, ``wait``) is a loop of non-blocking ``check`` calls, each through :func:`call`, until
  the keys are there or the store's timeout has passed (then :class:`torch.distributed.DistStoreError`, as torch's
  own wait raises). A waiting ``get`` would also hold the store's one connection, and every other call on it.

Called outside the main thread (torch's keep-alive timer, the presence thread), a call simply runs: only the main
thread handles signals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

SLICE_S = 0.25  # the longest the main thread waits before its signal handlers and its tick run again
_CHECK_FIRST_S, _CHECK_MOST_S = 0.01, 0.2  # a wait for keys polls fast first (peers are usually right behind)


def call(fn: Callable[..., Any], *args: Any, tick: Callable[[], None] | None = None) -> Any:
    """``fn(*args)``; from the main thread, run in a daemon thread while this one waits in slices of
    :data:`SLICE_S`, calling ``tick`` between them (it may raise: the wait ends with its exception)."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = err
        finally:
            finished.set()

    threading.Thread(target=run, name="mgpu-store-call", daemon=True).start()
    while not finished.wait(SLICE_S):
        if tick is not None:
            tick()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def wait_for_keys(store: Any, keys: Sequence[str], timeout_s: float, tick: Callable[[], None] | None = None) -> bool:
    """Whether ``keys`` were all set in ``store`` within ``timeout_s``, checked without blocking (see the module)."""
    deadline = time.monotonic() + timeout_s
    pause = _CHECK_FIRST_S
    while not call(store.check, list(keys), tick=tick):
        if time.monotonic() >= deadline:
            return False
        if tick is not None:
            tick()
        time.sleep(pause)
        pause = min(pause * 2, _CHECK_MOST_S)
    return True


class WatchedStore:
    """The rendezvous store as torch's agent gets it: the same calls, none of them blocking (see the module).
    ``tick`` runs between the slices of every wait."""

    def __init__(self, store: Any, tick: Callable[[], None] | None = None):
        self._store = store
        self._tick = tick
        self._timeout: timedelta = store.timeout

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        limit = (timeout or self._timeout).total_seconds()
        if not wait_for_keys(self._store, keys, limit, self._tick):
            import torch.distributed as dist

            raise dist.DistStoreError(f"Timed out after {limit:.0f} s waiting for the store's keys {list(keys)}")

    def get(self, key: str) -> bytes:
        self.wait([key])
        return call(self._store.get, key, tick=self._tick)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self.wait(keys)
        return call(self._store.multi_get, list(keys), tick=self._tick)

    def __getattr__(self, name: str) -> Any:
        """Every other call (``set``, ``add``, ``multi_set``, ``compare_set``, ``check``...): through :func:`call`."""
        method = getattr(self._store, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: call(lambda: method(*args, **kwargs), tick=self._tick)
