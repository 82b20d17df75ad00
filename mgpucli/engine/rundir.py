"""The run directory (rank 0 only): ``recipe.yaml``, ``metrics.jsonl``, ``checkpoints/``, TensorBoard events.

Run dirs are never clobbered by accident: a new run into a run dir that already holds checkpoints needs
``--resume`` or ``--overwrite`` (the rule is :mod:`mgpucli.run_files`, which the launcher applies first).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from mgpucli.engine.checkpoints.files import clean_stale_temps
from mgpucli.engine.tbevents import ScalarWriter
from mgpucli.errors import UsageError
from mgpucli.run_files import METRICS, checkpoint_dir
from mgpucli.run_layout import RECIPE, TENSORBOARD
from mgpucli.run_records import step_anatomy
from mgpucli.trackers import STATE_FILE


def prepare_run_dir(run_dir: str | Path, overwrite: bool, recipe_yaml: str) -> None:
    """Take the run dir for this run, once the rule (:func:`mgpucli.run_files.check_start`) allowed it: create it,
    delete the old checkpoints and metrics with ``overwrite``, write the resolved recipe."""
    path = Path(run_dir)
    try:
        if overwrite:
            shutil.rmtree(checkpoint_dir(path), ignore_errors=True)
            (path / METRICS).unlink(missing_ok=True)
            (path / STATE_FILE).unlink(missing_ok=True)  # new tracker runs (earlier ones stay in wandb/, mlflow.db)
        checkpoint_dir(path).mkdir(parents=True, exist_ok=True)
        clean_stale_temps(checkpoint_dir(path))
        (path / RECIPE).write_text(recipe_yaml)
    except OSError as err:
        blocker = next((p for p in [path, *path.parents] if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a directory" if blocker else (err.strerror or str(err))
        raise UsageError(
            f"cannot create run dir {path}: {why}.",
            "Choose another location with run_dir=PATH (or fix the path/permissions).",
        ) from None


class MetricsWriter:
    """Appends one JSON object per log interval / validation (``split`` train / val; an ``event``, such as a tracker
    that failed, is a record of its own) to metrics.jsonl (flushed at once), and the train and val
    scalars to a TensorBoard event file (:mod:`mgpucli.engine.tbevents`, which needs no TensorBoard import and
    writes train intervals in batches) unless TensorBoard is off (``trainer.loggers``, ``trainer.tensorboard``)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = run_dir / METRICS
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
        self._tb = ScalarWriter(run_dir / TENSORBOARD) if tensorboard else None

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        split = record.get("split", "train")
        if self._tb is not None and split in ("train", "val"):  # scalars: events and closing records have none
            step = record.get("step", 0)
            self._tb.add_scalars(step, {f"{split}/{key}": float(value) for key, value in record.items()
                                        if key not in ("split", "step", "epoch", "time")
                                        and isinstance(value, (int, float))} | step_anatomy.scalars(record),
                               wall_time=record.get("time"))
            if split != "train":  # validations are rare and worth seeing at once
                self._tb.flush()

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
