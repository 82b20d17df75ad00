"""The run dir's layout: every file and folder name a run leaves, said once (stdlib only, imports nothing).

Every reader and writer takes the names from here: the engine's rank 0 (recipe, metrics, checkpoints), the
launcher (launch record, logs, the audit's summary), the post-mortem and the run records. Paths are built by
the callers (``os.path.join(run_dir, METRICS)``, ``Path(run_dir) / CHECKPOINTS``).
"""

from __future__ import annotations

RECIPE = "recipe.yaml"  # the resolved recipe the run trained with
METRICS = "metrics.jsonl"  # one JSON record per log interval, validation and event
TENSORBOARD = "tensorboard"  # TensorBoard's event files (trainer.loggers: tensorboard)
TRACKERS = "trackers.json"  # each experiment tracker's run id, mode, status and failure
MLFLOW_DB = "mlflow.db"  # MLflow's default store (SQLite), when the recipe and the environment name none
WANDB = "wandb"  # W&B's own folder (``wandb.init(dir=RUN_DIR)`` makes it)
LAUNCH_JSON = "launch.json"  # mgpu launch's record (node K of several: launch.nodeK.json)
POSTMORTEM_JSON = "postmortem.json"  # the post-mortem's report, beside launch.json
AUDIT_JSON = "audit.json"  # mgpu launch --audit's findings, beside launch.json
LOGS = "logs"  # every rank's stdout/stderr in torch's log layout (default --log-dir)
LAUNCH_DIR_PREFIX = "launch-"  # logs/launch-<rendezvous id>/: a launch's record while an earlier run's stays

CHECKPOINTS = "checkpoints"
FULL_SUFFIX = ".pt"  # a full checkpoint is one file (trainer.checkpoint_format: full)
SHARDED_SUFFIX = ".dcp"  # a sharded one a directory of shards (checkpoint_format: sharded)
LAST_FULL = "last.pt"  # the latest full checkpoint
BEST_FULL = "best.pt"
LAST_SHARDED = "last.dcp"  # a symlink to the latest sharded checkpoint's directory
BEST_SHARDED = "best.dcp"
SHARDED_META = "meta.pt"  # in a sharded checkpoint's directory: the step, the recipe, the run's position
_STEP_PREFIX = "step-"


def last_name(sharded: bool) -> str:
    """The latest checkpoint's name in ``checkpoints/`` (what ``--resume auto`` continues from)."""
    return LAST_SHARDED if sharded else LAST_FULL


def best_name(sharded: bool) -> str:
    return BEST_SHARDED if sharded else BEST_FULL


def suffix(sharded: bool) -> str:
    return SHARDED_SUFFIX if sharded else FULL_SUFFIX


def step_name(step: int, sharded: bool) -> str:
    """A numbered checkpoint's name: ``step-00000040.pt`` (a directory ``step-00000040.dcp`` when sharded)."""
    return f"{_STEP_PREFIX}{step:08d}{suffix(sharded)}"


def step_glob(sharded: bool) -> str:
    """The pattern every numbered checkpoint's name matches: ``step-*.pt`` (``step-*.dcp``)."""
    return f"{_STEP_PREFIX}*{suffix(sharded)}"


def launch_json_name(nnodes: int, node_rank: int | None, hostname: str) -> str:
    """The launch record's name in the run dir: ``launch.json`` for node 0 (and a job of one node); on another node
    ``launch.nodeK.json``, or ``launch.HOST.json`` while its rank is not known."""
    if nnodes == 1 or node_rank == 0:
        return LAUNCH_JSON
    stem, ext = LAUNCH_JSON.rsplit(".", 1)
    return f"{stem}.node{node_rank}.{ext}" if node_rank is not None else f"{stem}.{hostname}.{ext}"


def is_launch_json(name: str) -> bool:
    """``launch.json`` or a node's ``launch.nodeK.json``: the launch records ``mgpu doctor RUN_DIR`` reads."""
    stem, ext = LAUNCH_JSON.rsplit(".", 1)
    node = name.removeprefix(f"{stem}.node").removesuffix(f".{ext}")
    return name == LAUNCH_JSON or (name == f"{stem}.node{node}.{ext}" and node.isascii() and node.isdigit())


EXAMPLE_LAST_FULL = f"RUN_DIR/{CHECKPOINTS}/{LAST_FULL}"  # how messages name a run's latest checkpoint
