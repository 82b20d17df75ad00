"""``--check`` on ``mgpu train`` and ``mgpu launch``: the whole recipe checked in seconds, nothing trained.

The resolved recipe goes to stdout (it is the output: redirect it to a file to keep it); what was checked goes
to stderr. Problems raise an MgpuError (exit 2) that the calling command prints.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def check_and_print(recipe: str, overrides: list[str], quiet: bool = False,
                    check_run_dir: Callable[[str, bool | None], Path | None] | None = None,
                    world_size: int | None = None) -> None:
    """Run the deep check (see :mod:`mgpucli.config.deep_check`) and report it; ``quiet`` for non-zero ranks.

    ``check_run_dir(run_dir, sharded)``: whether the run may start in its run dir as asked (UsageError if not),
    returning the checkpoint it would resume (None: a fresh start). ``world_size``: the job's process count when
    known, to check that the train set holds a batch for every process."""
    from mgpucli.config.deep_check import check_deep
    from mgpucli.console import err_console
    from mgpucli.engine.run import ensure_cwd_on_path
    from mgpucli.run_files import requested_sharded

    ensure_cwd_on_path()  # user components in the working directory, as a run finds them
    result = check_deep(recipe, overrides, trackers="find" if quiet else "import")  # a job's other ranks: no import
    train = next((ds for ds in result.datasets if ds.path == "data.train"), None)
    if world_size is not None and train is not None and train.size is not None:
        from mgpucli.engine.data import train_set_too_small

        too_small = train_set_too_small(train.size, int(result.cfg.data.batch_size), world_size)
        if too_small is not None:
            raise too_small
    if quiet:
        return
    run_dir = str(result.cfg.run_dir)
    resumes = (check_run_dir(run_dir, requested_sharded(result.cfg.trainer.checkpoint_format))
               if check_run_dir is not None else None)
    print(result.resolved_yaml(), end="", flush=True)
    where = f"shipped recipe {result.source} ({result.file})" if result.shipped else f"recipe {result.file}"
    lines = [f"ok: {where} checks out",
             f"  schema ok; {result.targets} _target_(s) import and their arguments fit"]
    for ds in result.datasets:
        size = f"{ds.size} samples" if ds.size is not None else "iterable (no length)"
        lines.append(f"  {ds.path}: {ds.target}, {size}, first sample {ds.sample}")
    if check_run_dir is not None:
        lines.append(f"  run dir {run_dir}: " + (f"resumes from {resumes}" if resumes is not None else "a fresh start"))
    lines.append("  nothing was trained or written; the resolved recipe is on stdout. Drop --check to train.")
    console = err_console()
    for line in lines:  # no markup: paths and sample shapes hold brackets
        console.print(line, markup=False, highlight=False)
