"""What the launcher adds to an elastic recipe job's plan (``--nnodes MIN:MAX``): the global batch every node count
keeps, checked at launch (exit 2 for a range that cannot keep it), said at the start and handed to the workers.

The global batch is the recipe's at MAX nodes (:func:`mgpucli.launch.node_range.global_batch_at_max`), or, for a
launch that resumes a checkpoint, the checkpoint's (its last segment's). The workers get it in
:data:`mgpucli.env_vars.ELASTIC_GLOBAL_BATCH`: a fresh start on fewer nodes sets ``trainer.grad_accum`` to keep it,
and a restart keeps the checkpoint's whatever the command line pins (:meth:`mgpucli.engine.trainer.Trainer.setup`).
A script gets nothing of this: torchrun's contract (restarts with a new world size) is all an elastic script gets.
"""

from __future__ import annotations

from mgpucli import env_vars
from mgpucli.launch.node_range import check_global_batch, global_batch_at_max, layout_line
from mgpucli.run_files import requested_sharded, resume_path


def add_global_batch(plan, cfg, resume: str | None) -> None:
    """For an elastic recipe job: check the global batch over the node range (UsageError, exit 2), say it in the
    plan's notes and hand it to the workers. A fixed node count or a script: nothing."""
    nodes = plan.nodes
    if not nodes.elastic or cfg is None:
        return
    batch, accum, nproc = int(cfg.data.batch_size), int(cfg.trainer.grad_accum), plan.nproc_per_node
    kept, whose = global_batch_at_max(nodes, nproc, batch, accum), f"the recipe's on {nodes.high} nodes"
    saved = _checkpoint_global_batch(plan.run_dir, resume, requested_sharded(cfg.trainer.checkpoint_format))
    if saved is not None:
        kept, whose = saved, "the checkpoint's it resumes"
    check_global_batch(nodes, nproc, batch, kept, whose)
    plan.env[env_vars.ELASTIC_GLOBAL_BATCH] = str(kept)
    plan.notes.append(layout_line(nodes, nproc, batch, kept))


def _checkpoint_global_batch(run_dir: str, resume: str | None, sharded: bool | None) -> int | None:
    """The global batch of the checkpoint a ``--resume`` launch continues (None: a fresh start, or one it does not
    say)."""
    from mgpucli.postmortem.checkpoint_peek import read_checkpoint_info

    found = resume_path(run_dir, resume, sharded)
    info = read_checkpoint_info(str(found)) if found is not None and found.exists() else None
    return info.segments[-1].layout.global_batch if info is not None and info.segments else None
