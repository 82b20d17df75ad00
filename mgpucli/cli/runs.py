"""``mgpu runs [DIR]``: every run under DIR, sweep trials included, one line each: how it ended (the post-mortem's
state), how far it got, its best validation metric and its wall time; ``--plot METRIC`` draws their curves.

Parse, call :func:`mgpucli.postmortem.run_summary.list_runs`, render: the table (and the plot) on stdout, the
command's output; notes on stderr; ``--json`` one JSON object on stdout. Exit 0, or 2 for bad input (DIR missing,
no run under it, a metric no run records). Never imports torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mgpucli.errors import EXIT_PREEMPTED, MgpuError, UsageError

if TYPE_CHECKING:
    from mgpucli.postmortem.run_summary import RunSummary

STATE_STYLE = {"succeeded": "green", "preempted": "yellow", "running": "cyan", "unknown": "dim"}
PLOT_HEIGHT = 20
MARKERS = "•x+o*#@%"  # one per run where the plot has no colors (a pipe, a file)
PLOTEXT = "plotext>=5.3,<6"  # as pyproject.toml's dependencies name it


def runs(
    directory: str = typer.Argument("runs", metavar="DIR", help="Where to look for runs, at any depth."),
    sort: str | None = typer.Option(
        None, "--sort", metavar="METRIC",
        help="Sort by a validation metric's best value (best first; runs without it last), or by step, time or name.",
        show_default=False,
    ),
    plot: str | None = typer.Option(
        None, "--plot", metavar="METRIC",
        help="Below the table, draw each run's curve of this metric (its validations; a training-only metric such "
        "as lr from its training records).", show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout (and nothing else there)."),
) -> None:
    """List every run under DIR (default: runs), sweep trials included: state, steps, best metric, wall time.

    The state is what `mgpu doctor RUN_DIR` says of the run: succeeded, failed, preempted, running...

    The best metric is the recipe's trainer.best_metric (else loss), or the --sort metric.

    Exit codes: 0 listed, 2 bad input (DIR missing or without runs, a metric no run records).
    """
    from mgpucli.console import print_error
    from mgpucli.postmortem.run_summary import list_runs, plot_split

    try:
        if plot is not None and as_json:
            raise UsageError("--plot draws for a person and --json prints for a program: give one of them.",
                             "Drop --plot for the JSON, or --json for the table and the plot.")
        summaries = list_runs(Path(directory), sort)
        split = plot_split(summaries, plot, Path(directory)) if plot is not None else None
        plotter = _plotext() if plot is not None else None
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    if as_json:
        sys.stdout.write(json.dumps({"root": directory, "runs": [s.to_json() for s in summaries]}, indent=2) + "\n")
        return
    render(summaries, directory)
    if plot is not None and split is not None:
        draw(plotter, summaries, plot, split)


def _plotext():
    """plotext, or a UsageError naming how to install it (it is a dependency: only a broken install lacks it)."""
    try:
        import plotext
    except ImportError:
        raise UsageError("--plot draws with plotext, which is not installed.", f"pip install '{PLOTEXT}'") from None
    return plotext


def render(summaries: list[RunSummary], directory: str) -> None:
    """One row per run: the table on stdout, a note on stderr."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from mgpucli.console import err_console

    metrics = {s.metric for s in summaries}
    one = next(iter(metrics)) if len(metrics) == 1 else None
    table = Table(show_header=True, header_style="bold", pad_edge=False, expand=False)
    for name, opts in (("run", {"no_wrap": True}), ("state", {"no_wrap": True}), ("step", {"justify": "right"}),
                       (f"best {one}" if one else "best", {"justify": "right"}), ("at step", {"justify": "right"}),
                       ("wall time", {"justify": "right", "no_wrap": True}), ("note", {"overflow": "fold"})):
        table.add_column(name, **opts)
    for s in summaries:
        best = "" if s.best is None else f"{s.best:.4g}" if one else f"{s.metric} {s.best:.4g}"
        table.add_row(Text(s.name), Text(s.status, style=STATE_STYLE.get(s.status, "red")), _int(s.step), best,
                      _int(s.best_step), duration(s.seconds), Text(note(s)))
    Console(highlight=False, soft_wrap=False).print(table)
    sys.stdout.flush()  # before the note on stderr
    err_console().print(f"{len(summaries)} run(s) under {directory}. Why one ended as it did: mgpu doctor RUN_DIR.",
                        markup=False, highlight=False, style="dim")


def _int(value: int | None) -> str:
    return "" if value is None else str(value)


def note(s: RunSummary) -> str:
    """What a person needs beside the state: the cause of a failure, how to continue a stopped run."""
    if s.cause:
        return s.cause
    if s.exit_code == EXIT_PREEMPTED:
        return "stopped with a complete checkpoint: --resume auto continues it"
    return "" if s.status in ("succeeded", "running") else s.verdict


def duration(seconds: float | None) -> str:
    """``4.0 s``, ``3 min 12 s``, ``2 h 05 min``."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def draw(plt, summaries: list[RunSummary], metric: str, split: str) -> None:
    """Each run's curve of ``metric`` (``split`` records) in one plot on stdout: in color on a terminal, else
    with a marker of its own per run and no escape codes."""
    import shutil

    from mgpucli.console import err_console
    from mgpucli.postmortem.run_summary import curve

    color = sys.stdout.isatty()
    plt.clear_figure()
    plt.theme("pro" if color else "clear")
    plt.plotsize(min(shutil.get_terminal_size((100, 24)).columns, 140), PLOT_HEIGHT)
    drawn, empty = 0, []
    for s in summaries:
        points = curve(Path(s.run_dir), metric, split)
        if not points:
            empty.append(s.name)
            continue
        marker = "braille" if color else MARKERS[drawn % len(MARKERS)]
        plt.plot([p[0] for p in points], [p[1] for p in points], label=s.name, marker=marker)
        drawn += 1
    plt.title(f"{split} {metric}")
    plt.xlabel("step")
    built = plt.build()
    sys.stdout.write((built if color else plt.uncolorize(built)) + "\n")
    if empty:
        err_console().print(f"no {split} {metric} recorded (not drawn): {', '.join(empty)}", markup=False,
                            highlight=False, style="dim")
