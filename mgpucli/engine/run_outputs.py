"""Where a run's records go as it trains: ``metrics.jsonl`` and TensorBoard (rank 0), the experiment trackers (rank
0, when ``trainer.loggers`` names any), and the reporter (rank 0's terminal or log).

Every rank has one; on the other ranks only the reporter (a NullReporter) is there, so the loop calls :meth:`emit`
on every rank alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mgpucli import trackers
from mgpucli.distributed.runtime import Runtime
from mgpucli.engine.anatomy import StragglerWatch
from mgpucli.engine.checkpoints import state as engine_state
from mgpucli.engine.reporter import Reporter
from mgpucli.engine.rundir import MetricsWriter
from mgpucli.run_files import saved_checkpoint


class RunOutputs:
    def __init__(self, reporter: Reporter):
        self.reporter = reporter
        self.writer: MetricsWriter | None = None
        self.tracking = None  # engine/tracking's Tracking, on rank 0 when trainer.loggers names a tracker
        self.run_dir: Path | None = None
        self.stragglers: StragglerWatch | None = None  # rank 0 of a run with the step anatomy on, on N processes

    def open(self, cfg: DictConfig, run_dir: Path, runtime: Runtime, tags: dict[str, str], resumed_at: int | None,
             tracker_ids: dict[str, str] | None) -> None:
        """Rank 0: open metrics.jsonl (and TensorBoard), and start the trackers' runs (or continue those of the
        checkpoint, ``tracker_ids``, from step ``resumed_at``)."""
        self.run_dir = run_dir
        if not runtime.is_main:
            return
        sinks = trackers.enabled(list(cfg.trainer.loggers), cfg.trainer.tensorboard)
        self.writer = MetricsWriter(run_dir, tensorboard="tensorboard" in sinks)
        if trackers.trackers_in(sinks):
            from mgpucli.engine.tracking import Tracking

            tags = {**tags, **{f"{name}_version": value for name, value in engine_state.versions().items()}}
            self.tracking = Tracking.open(cfg, run_dir, tags, resumed_at, tracker_ids, self.writer.write,
                                          self.reporter)

    @property
    def tracker_ids(self):
        """The trackers' run ids for the checkpoints (a callable, None without trackers)."""
        return self.tracking.ids if self.tracking is not None else None

    def emit(self, record: dict[str, Any]) -> None:
        """A train or validation record: to metrics.jsonl, the trackers (queued for their thread), the reporter."""
        if self.writer is not None:
            self.writer.write(record)
        if self.tracking is not None:
            self.tracking.log(record)
        self.reporter.log(record)
        if self.stragglers is not None:
            line = self.stragglers.observe(record)
            if line:
                self.reporter.message(f"straggler: {line}")

    def write(self, record: dict[str, Any]) -> None:
        """A record for metrics.jsonl only (a closing record, an event)."""
        if self.writer is not None:
            self.writer.write(record)

    def finish_tracking(self, status: str) -> None:
        """Finish the trackers' runs (once) with ``status``: finished, failed or preempted."""
        if self.tracking is not None:
            tracking, self.tracking = self.tracking, None
            tracking.close(status, self._checkpoint_paths())

    def close(self, status: str) -> None:
        self.finish_tracking(status)
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _checkpoint_paths(self) -> dict[str, str]:
        """The run's last and best checkpoints that exist (full files or sharded directories)."""
        if self.run_dir is None:
            return {}
        saved = {which: saved_checkpoint(self.run_dir, which) for which in ("last", "best")}
        return {which: str(path.parent.resolve() / path.name) for which, path in saved.items() if path is not None}
