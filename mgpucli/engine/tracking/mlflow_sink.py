"""MLflow, on rank 0's tracking thread (imported there, and only there), through ``MlflowClient``: no fluent
``mlflow.start_run`` state shared with the user's own code.

The store (:func:`mgpucli.trackers.mlflow_uri`): ``trainer.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``,
else a SQLite store in the run dir (MLflow's own kind of default; MLflow 3 keeps the plain-files store in
maintenance mode), with artifacts beside it in ``RUN_DIR/mlartifacts``. Params are the resolved recipe's flattened
keys; a resumed run continues its run id and adds only params it does not have yet (MLflow refuses to change one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mgpucli import trackers
from mgpucli.engine.checkpoints.state import flatten
from mgpucli.engine.tracking import Context, Started
from mgpucli.run_layout import MLFLOW_DB

BATCH_PARAMS = 100  # MLflow's limit of params and tags per log_batch
BATCH_METRICS = 1000
MAX_VALUE = 6000  # MLflow 3's limit on a param's length
STATUS = {"finished": "FINISHED", "failed": "FAILED", "preempted": "KILLED"}


class MlflowSink:
    title = "MLflow"

    def __init__(self) -> None:
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, ctx: Context) -> Started:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        opts = ctx.options
        uri, chosen_by = trackers.mlflow_uri(opts.get("tracking_uri"), ctx.environ, ctx.run_dir)
        default_store = uri == trackers.mlflow_default_uri(ctx.run_dir)
        if default_store:
            _create_store(ctx.run_dir / MLFLOW_DB)
        self.client = client = MlflowClient(tracking_uri=uri)
        experiment = opts.get("experiment") or ctx.name
        warn = run = None
        if ctx.run_id:
            try:
                run = client.get_run(ctx.run_id)
                client.update_run(ctx.run_id, status="RUNNING")
            except MlflowException as err:
                warn = (f"MLflow: run {ctx.run_id} of the earlier attempt is not in {uri} "
                        f"({' '.join(str(err).split())[:200]}); logging to a new run")
                run = None
        params = {key: _param(value) for key, value in flatten(ctx.recipe).items()}
        if run is None:
            found = client.get_experiment_by_name(experiment)
            if found is not None:
                experiment_id = found.experiment_id
            else:  # the default store keeps its artifacts in the run dir too, not in the working directory
                where = (ctx.run_dir / "mlartifacts").resolve().as_uri() if default_store else None
                experiment_id = client.create_experiment(experiment, artifact_location=where)
            run = client.create_run(experiment_id, run_name=opts.get("run_name") or ctx.run_dir.name)
        else:
            experiment_id = run.info.experiment_id
            params = {k: v for k, v in params.items() if k not in run.data.params}
        self.run_id = run.info.run_id
        self._batches(params=params, tags={f"mgpu.{k}": str(v) for k, v in ctx.tags.items()})
        entry = {"id": self.run_id, "tracking_uri": uri, "experiment": experiment, "experiment_id": experiment_id}
        again = "continuing run" if warn is None and ctx.run_id else "run"
        view = f"; see it with: mlflow ui --backend-store-uri {uri}" if uri.startswith("sqlite:") else ""
        return Started(entry, f"MLflow: {again} {self.run_id} in experiment '{experiment}' at {uri} ({chosen_by})"
                       f"{view}", warn)

    def log(self, step: int, metrics: dict[str, float], wall_time: float) -> None:
        from mlflow.entities import Metric

        stamp = int(wall_time * 1000)
        items = [Metric(key, value, stamp, step) for key, value in metrics.items()]
        for i in range(0, len(items), BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=items[i:i + BATCH_METRICS])

    def finish(self, status: str, checkpoints: dict[str, str]) -> None:
        tags = {f"mgpu.checkpoint.{what}": path for what, path in checkpoints.items()}
        self._batches(params={}, tags={**tags, "mgpu.status": status})
        self.client.set_terminated(self.run_id, status=STATUS.get(status, "FAILED"))

    def _batches(self, params: dict[str, str], tags: dict[str, str]) -> None:
        from mlflow.entities import Param, RunTag

        items = [Param(k, v) for k, v in params.items()] + [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, len(items), BATCH_PARAMS):
            chunk = items[i:i + BATCH_PARAMS]
            self.client.log_batch(self.run_id, params=[p for p in chunk if isinstance(p, Param)],
                                  tags=[t for t in chunk if isinstance(t, RunTag)])


def _create_store(db: Path) -> None:
    """Create the run dir's SQLite store unless it exists. MLflow makes a new store's tables in a few seconds of
    migrations, and a process killed meanwhile (a crash on another rank, a preemption) would leave a half-made store
    that no later attempt can open ("duplicate column name"). So it is made under a temporary name, then renamed."""
    from mlflow.tracking import MlflowClient

    if db.exists():
        return
    for stale in db.parent.glob(f".{db.name}.*.tmp"):  # an earlier attempt's, killed while it made one
        stale.unlink(missing_ok=True)
    tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
    MlflowClient(tracking_uri=f"sqlite:///{tmp.resolve()}").search_experiments(max_results=1)
    os.replace(tmp, db)


def _param(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."


def make() -> MlflowSink:
    return MlflowSink()
