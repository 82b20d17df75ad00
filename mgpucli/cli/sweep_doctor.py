"""``mgpu doctor runs/NAME`` of a sweep's folder: one line per trial (its post-mortem's verdict), and the sweep's exit
code: 0 every trial finished, 75 none failed but some were stopped with a checkpoint, 1 otherwise."""

from __future__ import annotations

import json
import os
import sys

from mgpucli.errors import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED


def is_sweep(path: str) -> bool:
    from mgpucli.run_layout import SWEEP_JSON

    return os.path.isfile(os.path.join(path, SWEEP_JSON))


def sweep_postmortem(sweep_dir: str, json_out: bool) -> None:
    from pathlib import Path

    from mgpucli.console import err_console, print_error
    from mgpucli.errors import MgpuError
    from mgpucli.postmortem.run_summary import summarize
    from mgpucli.sweep import record as records

    try:
        record = records.load(sweep_dir)
    except MgpuError as err:
        print_error(str(err))
        sys.exit(err.exit_code)
    assert record is not None  # is_sweep() found its record
    lines, codes, trials = [], [], []
    for t in record.trials:
        started = os.path.isdir(t.run_dir)
        summary = summarize(Path(t.run_dir), record.metric) if started else None
        code = summary.exit_code if summary is not None else None
        said = summary.verdict if summary is not None else f"{t.run_dir} not started yet ({t.state})."
        if t.state == records.PRUNED:  # stopped at a checkpoint by the search: its end, not a preemption
            code = EXIT_OK
            said = f"{t.run_dir} was pruned by the search (its validation fell behind the others')."
        lines.append(f"trial {t.name} ({t.describe()}): {said}")
        codes.append(code)
        trials.append({"name": t.name, "values": t.values, "state": t.state,
                       "summary": summary.to_json() if summary is not None else None})
    code = EXIT_OK if all(c == EXIT_OK for c in codes) else EXIT_PREEMPTED if all(
        c in (EXIT_OK, EXIT_PREEMPTED, None) for c in codes) else EXIT_FAILED
    if json_out:
        sys.stdout.write(json.dumps({"sweep": record.name, "exit_code": code, "trials": trials}, indent=2) + "\n")
    else:
        console = err_console()
        console.print(f"sweep {record.name} ({sweep_dir}): {len(record.trials)} trial(s)", markup=False)
        for line in lines:
            console.print(f"  {line}", markup=False, highlight=False)
    sys.exit(code)
