"""The worker's entry points: recipe -> process group -> Trainer.fit (or the fit probe), with cleanup on every exit
path."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import Any

from mgpucli import faults
from mgpucli.distributed.env import RankEnv
from mgpucli.engine.reporter import NullReporter, Reporter
from mgpucli.errors import Preempted
from mgpucli.heap import settle_gc


def ensure_cwd_on_path() -> None:
    """Let ``_target_: mymodule.Net`` find modules in the current directory (as torchtune does)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def composed(recipe: str, overrides: list[str]) -> tuple[Any, bool]:
    """(the recipe this process runs, whether ``mgpu launch`` checked it): the one the launcher handed over, else
    composed here and checked against the schema. Neither imports torch: a typo in a key or an override, a file that
    is no recipe, is refused before torch is imported (seconds sooner)."""
    from mgpucli.config import handoff, load_recipe

    ensure_cwd_on_path()
    cfg = handoff.read(recipe, overrides)  # launched by `mgpu launch`: the recipe it checked, as is
    if cfg is not None:
        return cfg, True
    return load_recipe(recipe, overrides), False


def run_training(recipe: str, overrides: list[str], *, resume: str | None = None, overwrite: bool = False,
                 env: RankEnv, reporter: Reporter | None = None, recipe_cfg: tuple[Any, bool] | None = None,
                 started: Callable[[dict[str, Any]], None] | None = None,
                 finished: Callable[[], None] | None = None) -> dict[str, Any]:
    """Load and check the recipe (``recipe_cfg``: as :func:`composed` gave it), set up the process group, train,
    and always tear down. ``started`` is called once set-up is done (the run dir taken, a checkpoint loaded) and
    training begins, with where it starts (:meth:`mgpucli.engine.trainer.Trainer.started_details`); ``finished`` once
    the run has finished on every rank (its final checkpoint complete), before the teardown."""

    def train(trainer) -> dict[str, Any]:
        trainer.setup()
        if started is not None:
            started(trainer.started_details())
        settle_gc()  # the start-up's objects are frozen: no collection walks them again (mgpucli/heap.py)
        return trainer.fit()

    def ended(trainer) -> None:
        if finished is not None:
            finished()
        faults.hold("hold_at_exit", lambda: trainer.stop.received is not None)  # test-only; inert unless MGPU_FAULT

    from mgpucli.batch_layout import pinned_by

    return _with_trainer(recipe, overrides, env, reporter, train, recipe_cfg, resume=resume, overwrite=overwrite,
                         ended=ended, pinned=pinned_by(overrides))


def run_probe(recipe: str, overrides: list[str], *, env: RankEnv, reporter: Reporter | None = None,
              steps: int = 20, warmup: int | None = None,
              recipe_cfg: tuple[Any, bool] | None = None) -> dict[str, Any] | None:
    """``mgpu train --probe``: build everything, measure ``steps`` optimizer steps after a warm-up on every rank,
    write nothing (see engine/probe.py). Returns the report on rank 0 (None on the others)."""
    import torch

    from mgpucli.distributed import collectives
    from mgpucli.engine import probe

    warmup = probe.WARMUP_STEPS if warmup is None else warmup

    def measure(trainer) -> dict[str, Any] | None:
        stepping = False
        try:
            trainer.setup()
            stepping = True
            mine = probe.measure(trainer, steps, warmup)
        except torch.OutOfMemoryError as err:
            phase = probe.phase_of(trainer.heartbeat.phase if trainer.heartbeat is not None else None, stepping)
            raise probe.out_of_memory(err, phase, trainer.step + 1, warmup, trainer.cfg, env.rank,
                                      trainer.runtime.device) from None
        ranks = collectives.all_gather_objects(mine, trainer.runtime)
        return probe.report(ranks, trainer, steps, warmup) if env.rank == 0 else None

    return _with_trainer(recipe, overrides, env, reporter, measure, recipe_cfg, probe=True)


def _with_trainer(recipe: str, overrides: list[str], env: RankEnv, reporter: Reporter | None,
                  body: Callable[[Any], Any], recipe_cfg: tuple[Any, bool] | None,
                  ended: Callable[[Any], None] | None = None, **trainer_args: Any) -> Any:
    """The recipe (:func:`composed`, then checked unless ``mgpu launch`` did), the process group, a Trainer given to
    ``body``; every rank meets at a barrier after it (then ``ended(trainer)``), and on every exit path the trainer is
    closed and the process group destroyed."""
    import torch

    from mgpucli.config import check_recipe
    from mgpucli.distributed import collectives
    from mgpucli.distributed.runtime import setup_process_group, teardown
    from mgpucli.engine import clear_errors
    from mgpucli.engine.trainer import Trainer

    cfg, checked = recipe_cfg if recipe_cfg is not None else composed(recipe, overrides)
    if not checked:
        # Trackers: a job's ranks only look them up (rank 1 must not import one, and every rank must reach the same
        # verdict before the process group exists); a single process imports them, as the launcher does.
        check_recipe(cfg, recipe, trackers="find" if env.distributed else "import")
    reporter = reporter if reporter is not None and env.rank == 0 else NullReporter()
    trainer = stop = None
    status = "failed"  # how the run ended, for its experiment trackers
    try:
        runtime = setup_process_group(env, cfg.trainer.device, cfg.trainer.timeout_s, cfg.trainer.cpu_threads)
        trainer = Trainer(cfg, runtime, reporter, source=recipe, **trainer_args)
        stop = trainer.stop  # after a finished run it only notes signals, until the teardown is done
        result = body(trainer)
        status = "finished"
        # Every rank is done with the group before any rank destroys it: a rank that tore gloo down while another
        # still finished its last save could abort at exit ("terminate called without an active exception",
        # SIGABRT), and a finished run was reported as failed.
        collectives.barrier(runtime)
        if ended is not None:
            ended(trainer)
        return result
    except Preempted:
        status = "preempted"
        collectives.barrier(runtime)  # every rank agreed on the stop and saved: the same meeting before teardown
        raise
    except (RuntimeError, torch.OutOfMemoryError) as err:
        clearer = None if trainer is None else clear_errors.translate(
            err, trainer.heartbeat, env.rank, trainer.step + 1, cfg.trainer.timeout_s,
            cfg.data.batch_size)
        if clearer is None:
            raise
        raise clearer from err
    finally:
        if trainer is not None:
            trainer.close(status)  # also drops the DDP module, whose reducer holds the process group
        trainer = None
        reporter.close()
        # The process group must die in destroy_process_group (which releases the GIL while gloo's threads
        # finish), not later in DDP's destructor (which holds it): that order deadlocked at exit. The DDP module
        # was frozen with the rest of the start-up (settle_gc): unfreeze, or this collection would not see it
        # (nor the start-up's garbage, which waited there).
        gc.unfreeze()
        gc.collect()
        teardown()
        if stop is not None:
            stop.release()
