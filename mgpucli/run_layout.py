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
LAUNCH_JSON = "launch.json"  # mgpu launch's record (another node's: launch.nodeK.json, launch.HOST-ID.json)
NODE_LAUNCH_JSONS = "launch.*.json"  # how a message names the other nodes' records (launch_json_name)
POSTMORTEM_JSON = "postmortem.json"  # the post-mortem's report, beside launch.json
AUDIT_JSON = "audit.json"  # mgpu launch --audit's findings, beside launch.json
LOGS = "logs"  # every rank's stdout/stderr in torch's log layout (default --log-dir)
SWEEP_JSON = "sweep.json"  # mgpu sweep's record, in its folder runs/NAME/ (not a run dir: one run dir per trial in it)
SWEEP_LOGS = "sweep-logs"  # in a sweep's folder: each trial's launcher output (TRIAL.log) and progress file
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


def launch_json_name(nnodes: int, node_rank: int | None, launcher: str) -> str:
    """The launch record's name in the run dir: ``launch.json`` for node 0 (and a job of one node);
    ``launch.nodeK.json`` for node K of a static rendezvous (its node ranks are fixed and unique);
    ``launch.LAUNCHER.json`` where the rendezvous ranks the nodes itself (c10d, again at every round of an elastic
    job: ``node_rank`` None), LAUNCHER naming this launcher alone (:func:`launcher_name`): two nodes' records never
    share a name."""
    if nnodes == 1 or node_rank == 0:
        return LAUNCH_JSON
    stem, ext = LAUNCH_JSON.rsplit(".", 1)
    return f"{stem}.node{node_rank}.{ext}" if node_rank is not None else f"{stem}.{launcher}.{ext}"


def launcher_name(hostname: str, unique: str) -> str:
    """``HOST-UNIQUE``: the host's name (kept to the characters safe in a file name) and a part unique to the launcher
    (a host name alone is not: containers, several nodes on one machine)."""
    host = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in hostname) or "host"
    return f"{host}-{unique}"


def record_node_rank(name: str) -> int | None:
    """The node rank a launch record's name holds (``launch.json``: 0, ``launch.nodeK.json``: K); None for a name of
    another kind."""
    stem, ext = LAUNCH_JSON.rsplit(".", 1)
    node = name.removeprefix(f"{stem}.node").removesuffix(f".{ext}")
    if name == f"{stem}.node{node}.{ext}" and node.isascii() and node.isdigit():
        return int(node)
    return 0 if name == LAUNCH_JSON else None


def is_launch_json(name: str) -> bool:
    """``launch.json`` or any node's ``launch.NAME.json`` (``launch.nodeK.json``, ``launch.HOST-ID.json``, and the
    ``launch.HOST.json`` earlier versions wrote): the launch records ``mgpu doctor RUN_DIR`` reads."""
    stem, ext = LAUNCH_JSON.rsplit(".", 1)
    node = name.removeprefix(f"{stem}.").removesuffix(f".{ext}")
    return name == LAUNCH_JSON or (name == f"{stem}.{node}.{ext}" and bool(node) and "/" not in node)


EXAMPLE_LAST_FULL = f"RUN_DIR/{CHECKPOINTS}/{LAST_FULL}"  # how messages name a run's latest checkpoint
