"""How the engine reports progress: a small interface the CLI implements with rich (rank 0 only)."""

from __future__ import annotations

from typing import Any, Protocol


class Reporter(Protocol):
    def start(self, info: dict[str, Any]) -> None: ...
    def epoch_start(self, epoch: int, steps: int, done: int) -> None: ...
    def step(self, step: int) -> None: ...  # called every optimizer step: must be cheap
    def log(self, record: dict[str, Any]) -> None: ...  # a train log interval or a validation
    def epoch_end(self, epoch: int, train: dict[str, Any] | None, val: dict[str, Any] | None) -> None: ...
    def message(self, text: str) -> None: ...
    def warn(self, text: str) -> None: ...
    def close(self) -> None: ...


class NullReporter:
    """What ranks other than 0 use: they print nothing."""

    def start(self, info):
        pass

    def epoch_start(self, epoch, steps, done):
        pass

    def step(self, step):
        pass

    def log(self, record):
        pass

    def epoch_end(self, epoch, train, val):
        pass

    def message(self, text):
        pass

    def warn(self, text):
        pass

    def close(self):
        pass
