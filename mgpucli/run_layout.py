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
LAUNCH_JSON = "launch.json"  # mgpu launch's record (node K of several: launch.nodeK.json)
POSTMORTEM_JSON = "postmortem.json"  # the post-mortem's report, beside launch.json
AUDIT_JSON = "audit.json"  # mgpu launch --audit's findings, beside launch.json
LOGS = "logs"  # every rank's stdout/stderr in torch's log layout (default --log-dir)

CHECKPOINTS = "checkpoints"
LAST_FULL = "last.pt"  # the latest full checkpoint (trainer.checkpoint_format: full)
BEST_FULL = "best.pt"
LAST_SHARDED = "last.dcp"  # a symlink to the latest sharded checkpoint's directory (checkpoint_format: sharded)
BEST_SHARDED = "best.dcp"
SHARDED_META = "meta.pt"  # in a sharded checkpoint's directory: the step, the recipe, the run's position


def last_name(sharded: bool) -> str:
    """The latest checkpoint's name in ``checkpoints/`` (what ``--resume auto`` continues from)."""
    return LAST_SHARDED if sharded else LAST_FULL


def best_name(sharded: bool) -> str:
    return BEST_SHARDED if sharded else BEST_FULL


def step_name(step: int, sharded: bool) -> str:
    """A numbered checkpoint's name: ``step-00000040.pt`` (a directory ``step-00000040.dcp`` when sharded)."""
    return f"step-{step:08d}.{'dcp' if sharded else 'pt'}"


EXAMPLE_LAST_FULL = f"RUN_DIR/{CHECKPOINTS}/{LAST_FULL}"  # how messages name a run's latest checkpoint
