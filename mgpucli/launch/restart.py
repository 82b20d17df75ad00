"""Restarts: resume from the run's latest checkpoint on a restart only, and stop retrying a failure that repeats.

torch's elastic agent restarts the whole worker group after a failure (``--max-restarts K``) and tells the
new workers which attempt they are in through ``TORCHELASTIC_RESTART_COUNT``. A fresh launch (count 0) does
exactly what the user typed, so it never picks up a stale checkpoint by itself; a restart (count > 0, or, under
``mgpu launch``, any start that continues the job: :func:`continues`, e.g. a node that joins an elastic job)
continues from the run's latest checkpoint (``--resume auto``: ``checkpoints/last.pt``, or ``last.dcp`` when
sharded) and never re-applies ``--overwrite``, which would delete the very checkpoint it should continue from.

The launched worker (:mod:`mgpucli.launch.worker`) applies these rules to its job before it runs it. A plain
``torchrun --max-restarts K -m mgpucli train`` does not: it restarts with the arguments it was given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from mgpucli import env_vars
from mgpucli.run_files import saved_checkpoint
from mgpucli.run_records.worker_records import FailureRecord

RESTART_COUNT_ENV = env_vars.RESTART_COUNT
RUN_DIR_ENV = env_vars.RUN_DIR


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """Which start of this node's worker group this is (0: the first, or not under torchrun). Under ``mgpu launch`` it
    also counts the restarts torch's agent makes when a node joins an elastic job (:mod:`mgpucli.launch.runner`)."""
    env = os.environ if environ is None else environ
    raw = env.get(RESTART_COUNT_ENV, "")
    return int(raw) if raw.isdigit() else 0


def continues(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this start continues a job that already ran, and resumes from its latest checkpoint: a restart of this
    node's worker group, or (``MGPU_CONTINUES``, said by ``mgpu launch``) a node that joins an elastic job that the
    other nodes have been running."""
    env = os.environ if environ is None else environ
    said = env.get(env_vars.CONTINUES)
    return said == "1" if said in ("0", "1") else restart_count(env) > 0


def resume_arg_for_restart(
    resume: str | None, *, run_dir: str | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The ``--resume`` value to use: the user's on a first start; ``"auto"`` (the run's latest checkpoint) on a
    restart.

    On a restart an explicit checkpoint path is kept only while the run has no latest checkpoint of its own yet
    (the crash came before the first save), so the restart still starts from what the user asked for.
    ``run_dir`` defaults to ``$MGPU_RUN_DIR`` (set by ``mgpu launch``); when unknown, a restart uses "auto".
    """
    env = os.environ if environ is None else environ
    if not continues(env):
        return resume
    if resume in (None, "auto"):
        return "auto"
    directory = run_dir or env.get(RUN_DIR_ENV)
    if directory and saved_checkpoint(directory) is None:
        return resume
    return "auto"


def overwrite_for_restart(overwrite: bool, environ: Mapping[str, str] | None = None) -> bool:
    """``--overwrite`` applies to the first start only: on a restart it would delete the checkpoint to resume."""
    return overwrite and not continues(environ)


def stop_reason(previous: Sequence[FailureRecord], earlier: Sequence[FailureRecord]) -> str | None:
    """Why the worker group should not be restarted again (None: restarting may help).

    ``previous`` are the failure records of the attempt that just failed, ``earlier`` those of the attempt
    before it. A failure that says it is not retryable (bad input, a NaN) stops at once; the same exception
    with the same message at the same step as in the attempt before stops the second time it happens.
    """
    for record in sorted(previous, key=lambda r: r.time):
        if not record.retryable:
            return f"rank {record.rank} failed with {record.type}, which a restart from the last checkpoint repeats"
    seen = {signature: record for record in earlier if (signature := record.signature()) is not None}
    for record in sorted(previous, key=lambda r: r.time):
        signature = record.signature()
        if signature is not None and signature in seen:
            return (
                f"rank {record.rank} failed again with the same {record.type} at step {record.step} as in attempt "
                f"{seen[signature].attempt}: restarting would repeat it"
            )
    return None
