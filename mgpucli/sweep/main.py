"""``mgpu sweep`` end to end: the grid, the slots and every trial's recipe checked first (exit 2, nothing written);
then the sweep's record, its trials run, its summary."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from mgpucli.cpus import available_cores
from mgpucli.errors import EXIT_OK, UsageError
from mgpucli.run_files import holds_a_run
from mgpucli.run_layout import SWEEP_JSON
from mgpucli.sweep import record as records
from mgpucli.sweep.check import check_trials
from mgpucli.sweep.grid import Grid, expand
from mgpucli.sweep.record import SweepRecord
from mgpucli.sweep.search import Space, require_optuna, space
from mgpucli.sweep.slots import DeviceOptions, Slots, plan
from mgpucli.sweep.trials import TrialCommand

RUNS = "runs"  # where sweeps are kept: runs/NAME/
LOCK = ".sweep.lock"  # in the sweep's directory: held by the sweep that runs it
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class SweepOptions:
    recipe: str
    overrides: tuple[str, ...]
    name: str | None
    devices: DeviceOptions
    metric: str | None = None
    fail_fast: bool = False
    search: str = "grid"  # or "optuna"
    trials: int | None = None  # a search's trials in all


@dataclass(frozen=True)
class Prepared:
    """A sweep checked and ready to run: nothing written yet."""

    record: SweepRecord
    sweep_dir: str
    slots: Slots
    command: TrialCommand
    continued: bool  # the directory held this sweep already
    space: Space | None = None  # a search's (None: a grid)


@dataclass(frozen=True)
class _Trials:
    """What the overrides ask for: the overrides every trial gets, the axes sweep.json records, the compositions
    checked before anything starts, and a search's space."""

    common: tuple[str, ...]
    axes: list
    checked: Grid
    space: Space | None = None


def _trials(opts: SweepOptions) -> _Trials:
    if opts.search not in ("grid", "optuna"):
        raise UsageError(f"--search {opts.search}: mgpu searches with 'grid' (every combination, the default) or "
                         "'optuna'.", "Example: --search optuna --trials 20.")
    if opts.search == "grid":
        if opts.trials is not None:
            raise UsageError("--trials counts a search's trials; a grid runs every combination.",
                             "Drop --trials, or search: --search optuna --trials N.")
        grid = expand(list(opts.overrides))
        return _Trials(grid.common, records.grid_axes(grid), grid)
    if opts.trials is None or opts.trials < 1:
        raise UsageError("--search optuna needs the number of trials to run: --trials N (1 or more).",
                         "Example: --search optuna --trials 20.")
    require_optuna()
    found = space(list(opts.overrides))
    return _Trials(found.common, found.axes(), Grid(found.common, (), found.corners()), found)


def prepare(opts: SweepOptions, visible_gpus: int | None = None) -> Prepared:
    """Everything checked, nothing written: UsageError (exit 2) for any problem. ``visible_gpus``: the machine's
    (None: asked of torch when GPUs are used)."""
    asked = _trials(opts)
    if visible_gpus is None:
        visible_gpus = 0 if opts.devices.cpu else _visible_gpus()
    slots = plan(opts.devices, visible_gpus, available_cores(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    name = opts.name or f"{_recipe_name(opts.recipe)}-sweep"
    if not _NAME.fullmatch(name):
        raise UsageError(f"--name {name!r}: a sweep's name is a directory name under {RUNS}/ (letters, digits, "
                         "'.', '_' and '-').", "Example: --name lr-sweep.")
    sweep_dir = os.path.join(RUNS, name)
    recorded = records.load(sweep_dir)
    if recorded is not None:
        records.check_same(recorded, opts.recipe, list(asked.common), asked.axes, sweep_dir, opts.search)
    elif os.path.isdir(sweep_dir) and (holds_a_run(sweep_dir) or os.listdir(sweep_dir)):
        raise UsageError(f"{sweep_dir} already exists and holds no sweep ({SWEEP_JSON}).",
                         "Give the sweep another name: --name NAME.")
    device = ["trainer.device=cpu"] if opts.devices.cpu else []
    compared = check_trials(opts.recipe, asked.checked, device, opts.metric,
                            label="trial" if asked.space is None else "values")
    record = recorded or records.new(name, opts.recipe, asked.checked, sweep_dir, compared.metric, compared.mode)
    if asked.space is not None and recorded is None:  # a search's trials are asked as slots free
        record.trials, record.axes, record.search = [], asked.axes, "optuna"
    if recorded is not None and (recorded.metric, recorded.mode) != (compared.metric, compared.mode):
        _compare_again(recorded, compared.metric, compared.mode)
    record.metric, record.mode, record.budget = compared.metric, compared.mode, opts.trials
    command = TrialCommand(opts.recipe, asked.common, slots.cpu_threads)  # --cpu: the launch sets trainer.device
    return Prepared(record, sweep_dir, slots, command, recorded is not None, asked.space)


def _compare_again(record: SweepRecord, metric: str, mode: str) -> None:
    """A grid continued with another --metric: every trial's best of the new one (a search's study cannot change
    what it optimises: refused)."""
    if record.search != "grid":
        raise UsageError(f"--metric {metric}: this search's study optimises {record.metric} ({record.mode}).",
                         f"Continue it with --metric {record.metric}, or search {metric} under another --name.")
    from mgpucli.sweep.summary import record_outcome

    for trial in record.trials:
        if os.path.isdir(trial.run_dir):
            record_outcome(trial, metric, mode)


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _recipe_name(recipe: str) -> str:
    """The recipe's name as a directory name: ``quickstart``, ``recipes/lm.yaml`` -> ``lm``."""
    base = os.path.basename(recipe.rstrip("/"))
    stem = base.rsplit(".", 1)[0] if base.endswith((".yaml", ".yml")) else base
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem) or "recipe"


@contextlib.contextmanager
def held(sweep_dir: str):
    """The sweep's directory, made and locked for this process: a second ``mgpu sweep`` of it is refused."""
    import fcntl

    os.makedirs(sweep_dir, exist_ok=True)
    fh = open(os.path.join(sweep_dir, LOCK), "a+")  # noqa: SIM115 (held until the sweep ends)
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            pid = fh.read().strip() or "another process"
            raise UsageError(f"{sweep_dir} is being run by another mgpu sweep (pid {pid}).",
                             "Wait for it, or stop it (Ctrl-C there) and run this command again to continue it."
                             ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fh.close()


def run(prepared: Prepared, view_for, fail_fast: bool = False) -> int:
    """Run the trials left; returns the sweep's exit code (0 all finished, 1 one failed, 75 stopped)."""
    from mgpucli.sweep.scheduler import run_trials
    from mgpucli.sweep.summary import record_outcome

    record = prepared.record
    with held(prepared.sweep_dir):
        record.save(prepared.sweep_dir)  # a continued sweep's record as this command compares it (--metric)
        if not records.to_run(record) and len(record.trials) >= (record.budget or 0):
            return EXIT_OK
        view = view_for(record, prepared.slots.note)
        source = None
        if prepared.space is not None:
            from mgpucli.sweep.search import SearchSource

            source = SearchSource(record, prepared.space, prepared.sweep_dir)
        try:
            return run_trials(record, prepared.slots, prepared.command, prepared.sweep_dir, view,
                              lambda ran: record_outcome(ran.trial, record.metric or "loss", record.mode),
                              fail_fast=fail_fast, source=source)
        finally:
            view.close()
