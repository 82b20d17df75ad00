"""``mgpu doctor``: will this machine train, and if not, why and how to fix it.

Parse, call ``run_doctor``, render (a table on stderr, or one JSON object on stdout), map to exit codes:
0 nothing failed, 1 something failed, 2 bad options. The doctor itself never imports torch: torch runs in
bounded child processes, so a broken install or a hung driver is reported, not suffered.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # the command imports its machinery lazily: `mgpu --help` stays light
    from mgpucli.doctor.report import Report

STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]", "skipped": "[dim]skipped[/]"}


def doctor(
    gpus: str | None = typer.Option(
        None, "--gpus", help="Check for these GPUs: a count, a list (0,2,3) or 'all'. Default: every visible GPU."
    ),
    cpu: bool = typer.Option(False, "--cpu", help="Check for CPU processes (gloo) instead of GPUs."),
    nproc: int | None = typer.Option(None, "--nproc", help="With --cpu: how many processes (default 2)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of a table."),
    quick: bool = typer.Option(False, "--quick", help="Skip the live test (starting processes, collectives)."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds allowed for each probe and for the live test."),
) -> None:
    """Check this machine for multi-process training and say how to fix what is wrong.

    Without --gpus/--cpu it checks every visible GPU; on a machine without GPUs, 2 CPU processes (gloo).
    """
    from mgpucli.console import err_console, print_error
    from mgpucli.doctor.plan import DeviceOptions
    from mgpucli.doctor.report import DoctorOptions, run_doctor
    from mgpucli.errors import MgpuError

    opts = DoctorOptions(DeviceOptions(gpus=gpus, cpu=cpu, nproc=nproc), quick=quick, timeout=timeout)
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
