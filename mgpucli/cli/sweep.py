"""``mgpu sweep``: one recipe over a grid of values, each trial a full ``mgpu launch`` in its own run dir, on its own
devices, queued for the next free slot; stopped and continued as one; compared at the end."""

from __future__ import annotations

import sys

import typer

from mgpucli.errors import MgpuError
from mgpucli.run_layout import SWEEP_JSON

_RECIPE = typer.Argument(..., metavar="RECIPE", show_default=False,
                         help="A recipe YAML file or a shipped recipe's name (see `mgpu recipes`).")
_OVERRIDES = typer.Argument(
    None, metavar="[OVERRIDES]...", show_default=False,
    help="Hydra overrides: a key with several values is swept (key=a,b,c, 'key=range(1,4)', 'key=choice(a,b)'), "
    "every combination a trial; the others apply to every trial.",
)
_NAME = typer.Option(None, "--name", metavar="NAME", show_default=False,
                     help="The sweep's directory, runs/NAME (default: RECIPE-sweep). The same command again "
                     "continues it.")
_GPUS = typer.Option(None, "--gpus", metavar="N|LIST|all", show_default=False,
                     help="The GPUs the sweep may use, as mgpu launch takes them (default: all visible).")
_GPUS_PER_RUN = typer.Option(None, "--gpus-per-run", metavar="K", show_default=False,
                             help="GPUs per trial (default 1): as many trials run at once as there are groups of K.")
_CPU = typer.Option(False, "--cpu", help="Run the trials on CPUs with gloo.")
_NPROC_PER_RUN = typer.Option(None, "--nproc-per-run", metavar="N", show_default=False,
                              help="With --cpu: processes per trial (default 1).")
_PARALLEL = typer.Option(None, "--parallel", metavar="P", show_default=False,
                         help="With --cpu: trials at once (default 1); the cores are shared out between them.")
_METRIC = typer.Option(None, "--metric", metavar="NAME", show_default=False,
                       help="The validation metric trials are compared by (default: the recipe's "
                       "trainer.best_metric, else loss).")
_FAIL_FAST = typer.Option(False, "--fail-fast", help="Stop every trial (at a checkpoint) when one fails.")
_SEARCH = typer.Option("grid", "--search", metavar="grid|optuna",
                       help="grid: every combination of the values. optuna: --trials N trials whose values Optuna's "
                       "sampler picks in 'interval(lo,hi)', 'tag(log, interval(lo,hi))', range(...) or a,b,c, its "
                       "pruner stopping a trial whose validation falls behind (pip install 'mgpu\\[sweep]').")
_TRIALS = typer.Option(None, "--trials", metavar="N", show_default=False,
                       help="With --search optuna: how many trials to run in all.")


def sweep(
    recipe: str = _RECIPE,
    overrides: list[str] | None = _OVERRIDES,
    name: str | None = _NAME,
    gpus: str | None = _GPUS,
    gpus_per_run: int | None = _GPUS_PER_RUN,
    cpu: bool = _CPU,
    nproc_per_run: int | None = _NPROC_PER_RUN,
    parallel: int | None = _PARALLEL,
    metric: str | None = _METRIC,
    fail_fast: bool = _FAIL_FAST,
    search: str = _SEARCH,
    trials: int | None = _TRIALS,
) -> None:
    """Run a recipe over a grid of values: each trial a full mgpu launch, in runs/NAME/, queued for the next free
    GPU (or group of GPUs, or CPU slot).

    Every trial's recipe is checked before any starts. Ctrl-C or SIGTERM stops every running trial at a checkpoint
    (exit 75); the same command again continues the sweep. Exit codes: 0 every trial finished; 1 a trial failed;
    2 bad input, nothing started; 75 stopped, continue it with the same command.
    """
    from mgpucli.cli.sweep_view import view_for
    from mgpucli.console import print_error
    from mgpucli.sweep.main import SweepOptions, prepare, run
    from mgpucli.sweep.slots import DeviceOptions

    devices = DeviceOptions(gpus, gpus_per_run, cpu, nproc_per_run, parallel)
    try:
        prepared = prepare(SweepOptions(recipe, tuple(overrides or ()), name, devices, metric, fail_fast, search,
                                        trials))
        if prepared.continued:
            _said_continued(prepared.record)
        code = run(prepared, view_for, fail_fast)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    _summary(prepared, code)
    sys.exit(code)


def _said_continued(record) -> None:
    from mgpucli.console import err_console

    counts = ", ".join(f"{n} {state}" for state, n in record.counts().items())
    err_console().print(f"sweep {record.name}: continuing ({counts}).", markup=False)


def _summary(prepared, code: int) -> None:
    """The trials, best first; the best named with the command that reruns it alone; where the record is."""
    import os

    from rich.table import Table
    from rich.text import Text

    from mgpucli.console import err_console
    from mgpucli.errors import EXIT_PREEMPTED
    from mgpucli.sweep.summary import ranked, value

    record = prepared.record
    order = ranked(record)
    table = Table(title=f"sweep {record.name}: trials by best {record.metric} ({record.mode})", title_justify="left")
    for column in ("#", "trial", "values", "state", f"best {record.metric}", "at step", "time"):
        table.add_column(column, overflow="fold")
    for place, t in enumerate(order.trials, 1):
        cause = f": {t.cause}" if t.cause else ""
        cells = (str(place), t.name, t.describe(), t.state + cause, value(t.best),
                 "-" if t.best_step is None else str(t.best_step), f"{t.seconds:.0f} s" if t.launches else "-")
        table.add_row(*(Text(c) for c in cells))  # a value such as [64] is no markup
    console = err_console()
    console.print(table)
    if order.best is not None:
        slot = prepared.slots.slots[0]
        console.print(f"best: trial {order.best.name} ({order.best.describe()}), {record.metric} "
                      f"{value(order.best.best)} at step {order.best.best_step}; run it alone with:\n  "
                      f"{prepared.command.rerun(order.best, slot)}", markup=False)
    if code == EXIT_PREEMPTED:
        console.print("stopped: every running trial stopped at a checkpoint. Run the same command again to continue "
                      "the sweep.", markup=False)
    console.print(f"record: {os.path.join(prepared.sweep_dir, SWEEP_JSON)}", markup=False)
