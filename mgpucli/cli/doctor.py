"""``mgpu doctor``: will this machine train, and if not, why and how to fix it.

Parse, call ``run_doctor``, render (a table on stderr, or one JSON object on stdout), map to exit codes:
0 nothing failed, 1 something failed, 2 bad options. The doctor itself never imports torch: torch runs in
bounded child processes, so a broken install or a hung driver is reported, not suffered.

``mgpu doctor RUN_DIR`` is the post-mortem of a run instead (``mgpucli.postmortem``): 0 the run finished,
75 it was preempted with a complete checkpoint (EX_TEMPFAIL, what ``mgpu launch`` exited with), 1 it failed or
did not finish otherwise (diagnosed or not), 2 the path is not a run directory.

Which of the two runs depends on the argument alone: a path means the post-mortem, none the machine check. The
machine check's options given with a path are refused (exit 2) rather than ignored.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # the command imports its machinery lazily: `mgpu --help` stays light
    from mgpucli.doctor.examine import Report

STACK_LINES = 12  # frames of each rank's main thread shown, innermost first
STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]", "skipped": "[dim]skipped[/]"}


def doctor(
    run_dir: str | None = typer.Argument(
        None, metavar="RUN_DIR", show_default=False,
        help="A run directory of `mgpu launch`: say how that run ended (finished, preempted, or why it failed) "
        "instead of checking the machine.",
    ),
    gpus: str | None = typer.Option(
        None, "--gpus", metavar="N|LIST|all",
        help="Check for these GPUs: a count, a list (0,2,3) or 'all'. Default: every visible GPU."
    ),
    cpu: bool = typer.Option(False, "--cpu", help="Check for CPU processes (gloo) instead of GPUs."),
    nproc: int | None = typer.Option(None, "--nproc", metavar="N", help="With --cpu: how many processes (default 2)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of a table."),
    quick: bool = typer.Option(False, "--quick", help="Skip the live test (starting processes, collectives)."),
    timeout: float | None = typer.Option(
        None, "--timeout", metavar="SECONDS", help="Seconds allowed for each probe and for the live test (default 30).",
        show_default=False,
    ),
    stacks: bool = typer.Option(
        False, "--stacks", help="With RUN_DIR of a running job: ask every rank (on this machine) for its Python "
        "stacks now and print them; the job goes on training.",
    ),
) -> None:
    """Check this machine for multi-process training and say how to fix what is wrong.

    Without --gpus/--cpu it checks every visible GPU; on a machine without GPUs, 2 CPU processes (gloo).

    With RUN_DIR (a run directory of mgpu launch): did it finish; if preempted, at which step and how to continue.

    If it failed: which rank failed first, when, why, quoting the log lines that show it, and the fix.

    That report is also written to RUN_DIR/postmortem.json.

    Exit codes: 0 nothing failed (warnings allowed), 1 a check failed, 2 bad options.

    With RUN_DIR: 0 finished, 75 preempted with a complete checkpoint, 1 failed or unfinished, 2 not a run dir.
    """
    if run_dir is None:
        if stacks:
            from mgpucli.console import print_error

            print_error("--stacks asks a running job for its ranks' stacks: give its run directory "
                        "(mgpu doctor RUN_DIR --stacks).")
            from mgpucli.errors import EXIT_USAGE

            sys.exit(EXIT_USAGE)
        machine_check(gpus, cpu, nproc, json_out, quick, timeout)
        return
    # Every machine-check option defaults to "not given" (None, or False for a flag): those given are refused.
    given = {"--gpus": gpus is not None, "--cpu": cpu, "--nproc": nproc is not None, "--quick": quick,
             "--timeout": timeout is not None}
    used = [name for name, on in given.items() if on]
    if stacks:
        running_stacks(run_dir, json_out, used)
        return
    postmortem(run_dir, json_out, used)


def running_stacks(run_dir: str, json_out: bool, machine_only: list[str]) -> None:
    """``mgpu doctor RUN_DIR --stacks``: every running rank's stacks now; exit 0, 1 when none is running here."""
    from mgpucli.console import err_console, print_error
    from mgpucli.errors import EXIT_USAGE, MgpuError
    from mgpucli.postmortem.live_stacks import running_stacks as ask
    from mgpucli.run_records import stacks

    if machine_only:
        print_error(f"{', '.join(machine_only)} check(s) this machine; --stacks asks a run's ranks. Drop "
                    f"{', '.join(machine_only)}.")
        sys.exit(EXIT_USAGE)
    try:
        dumps = ask(run_dir)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    if json_out:
        sys.stdout.write(json.dumps({str(rank): dump.to_json() for rank, dump in dumps.items()}, indent=2) + "\n")
        return
    console = err_console()
    for rank, dump in dumps.items():
        console.print(f"{stacks.describe(rank, dump)}  (pid {dump.pid})", markup=False, highlight=False)
        main = dump.main
        for frame in (stacks.code_frames(main) if main else [])[:STACK_LINES]:
            console.print(f"    {frame.cite()}", markup=False, highlight=False, style="dim")
        others = len(dump.threads) - 1
        if others > 0:
            console.print(f"    (and {others} other thread(s): see --json)", markup=False, highlight=False,
                          style="dim")


def machine_check(gpus: str | None, cpu: bool, nproc: int | None, json_out: bool, quick: bool,
                  timeout: float | None) -> None:
    """``mgpu doctor``: check this machine; exit 0 nothing failed / 1 a check failed / 2 bad options."""
    from mgpucli.console import err_console, print_error
    from mgpucli.doctor.examine import DEFAULT_TIMEOUT, DoctorOptions, run_doctor
    from mgpucli.doctor.plan import DeviceOptions
    from mgpucli.errors import MgpuError

    opts = DoctorOptions(DeviceOptions(gpus=gpus, cpu=cpu, nproc=nproc), quick=quick,
                         timeout=DEFAULT_TIMEOUT if timeout is None else timeout)
    try:
        if json_out:
            report = run_doctor(opts)
        else:
            with err_console().status("mgpu doctor: starting") as status:
                report = run_doctor(opts, on_step=lambda msg: status.update(f"mgpu doctor: {msg}"))
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    if json_out:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        render(report)
    sys.exit(report.exit_code)


def render(report: Report) -> None:
    """A table grouped by area, hints under their finding, then the verdict line (all on stderr)."""
    from rich.table import Table
    from rich.text import Text

    from mgpucli.console import err_console

    table = Table(show_header=True, header_style="bold", pad_edge=False, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("what was seen / fix", overflow="fold")
    area = None
    for check in report.checks:
        if check.area != area:
            if area is not None:
                table.add_section()
            table.add_row(Text(check.area, style="bold underline"), "", "")
            area = check.area
        detail = Text(check.detail)
        if check.hint:
            detail.append("\nfix: ", style="bold cyan")
            detail.append(check.hint, style="cyan")
        table.add_row(f"  {check.name}", STYLE[check.status], detail)
    console = err_console()
    console.print(table)
    color = {"ok": "green", "warn": "yellow", "fail": "bold red"}[report.status]
    console.print(Text(report.verdict, style=color))


def postmortem(run_dir: str, json_out: bool, machine_only: list[str]) -> None:
    """``mgpu doctor RUN_DIR``: diagnose, write postmortem.json, render; exit 0 finished / 75 preempted with a
    complete checkpoint / 1 failed or unfinished / 2 bad path, or machine-check options (``machine_only``) given."""
    from mgpucli.console import print_error
    from mgpucli.errors import EXIT_USAGE, MgpuError
    from mgpucli.postmortem import diagnose_run, render, write_report

    if machine_only:
        print_error(f"{', '.join(machine_only)} check(s) this machine; with a run directory mgpu doctor reads that "
                    f"run's logs instead.\nRun `mgpu doctor {' '.join(machine_only)}` and `mgpu doctor {run_dir}` "
                    "separately.")
        sys.exit(EXIT_USAGE)
    from mgpucli.cli.sweep_doctor import is_sweep, sweep_postmortem

    if is_sweep(run_dir):
        sweep_postmortem(run_dir, json_out)
    try:
        report = diagnose_run(run_dir)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    written = write_report(report)
    if json_out:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        render(report)
        if written:
            from mgpucli.console import err_console

            err_console().print(f"  report: {written}", markup=False, highlight=False, style="dim")
    sys.exit(report.exit_code)
