"""One trial: the ``mgpu launch`` it is, started in its slot, followed through rank 0's progress file, ended.

Each trial's launcher writes its own output (what ``mgpu launch`` prints: its summary, a failure's post-mortem) to
``runs/NAME/sweep-logs/TRIAL.log``; its ranks' logs are in its own run dir, as for any launch.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from mgpucli import proctree
from mgpucli.launch import progress_file
from mgpucli.run_files import holds_a_run
from mgpucli.run_layout import SWEEP_LOGS
from mgpucli.sweep.record import RUNNING, TrialRecord
from mgpucli.sweep.slots import Slot


@dataclass(frozen=True)
class TrialCommand:
    """What every trial's launch shares: the recipe, the overrides every trial gets, the threads per CPU process."""

    recipe: str
    common: tuple[str, ...]
    cpu_threads: int | None = None  # None: the launch's own choice (GPU trials, or a recipe that sets it)

    def launch_args(self, trial: TrialRecord, slot: Slot, resume: bool) -> list[str]:
        """``launch [device options] [--resume auto] RECIPE OVERRIDES run_dir=...``: the trial as ``mgpu`` runs it."""
        threads = [f"trainer.cpu_threads={self.cpu_threads}"] if self.cpu_threads is not None and not _sets(
            [*self.common, *trial.overrides], "trainer.cpu_threads") else []
        return ["launch", *slot.launch_args(), *(["--resume", "auto"] if resume else []), self.recipe,
                *self.common, *trial.overrides, *threads, f"run_dir={_quoted(trial.run_dir)}"]

    def rerun(self, trial: TrialRecord, slot: Slot) -> str:
        """The shell command that runs the trial alone (with this machine's cores all its own), in a run dir of its
        own (``-alone``)."""
        alone = TrialRecord(trial.index, trial.name, trial.values, trial.run_dir + "-alone")
        args = TrialCommand(self.recipe, self.common).launch_args(alone, slot, resume=False)
        return " ".join(_shell_word(a) for a in ["mgpu", *args])


def _sets(overrides: list[str], key: str) -> bool:
    return any(o.lstrip("+~").partition("=")[0].strip() == key for o in overrides)


def _shell_word(arg: str) -> str:
    """``arg`` as a shell reads it: ``"run_dir='runs/x/0-lr=0.1'"`` rather than shlex's quotes within quotes."""
    if "'" in arg and not any(c in arg for c in '"$`\\!'):
        return f'"{arg}"'
    return shlex.quote(arg)


def _quoted(path: str) -> str:
    """A path as a Hydra override's value: quoted, so that a comma or an ``=`` in it is no sweep and no key."""
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class Running:
    """A trial whose launcher runs now."""

    trial: TrialRecord
    slot: Slot
    proc: Any  # subprocess.Popen
    progress_path: str
    log: IO[str]
    progress: dict[str, Any] = field(default_factory=dict)
    pruned: bool = False  # the search stopped it, its validation fallen behind

    def poll_progress(self) -> dict[str, Any]:
        """Rank 0's latest progress (epoch, steps per epoch, steps done, total epochs), kept when unreadable."""
        self.progress = progress_file.read(self.progress_path) or self.progress
        return self.progress


def start(trial: TrialRecord, slot: Slot, command: TrialCommand, sweep_dir: str) -> Running:
    """Start the trial's launcher in a session of its own (a Ctrl-C at the terminal reaches the sweep, which stops
    every trial itself); resumed with ``--resume auto`` when its run dir already holds a run."""
    logs = os.path.join(sweep_dir, SWEEP_LOGS)
    os.makedirs(logs, exist_ok=True)
    progress = os.path.join(logs, f"{trial.name}.progress.json")
    resume = holds_a_run(trial.run_dir)
    log = open(os.path.join(logs, f"{trial.name}.log"), "a", encoding="utf-8")  # noqa: SIM115 (closed at its end)
    args = command.launch_args(trial, slot, resume)
    log.write(f"$ mgpu {shlex.join(args)}\n")
    log.flush()
    env = {**os.environ, progress_file.ENV: progress, "PYTHONUNBUFFERED": "1"}
    proc = proctree.start([sys.executable, "-m", "mgpucli", *args], env=env, stdout=log, stderr=log)
    trial.state, trial.slot, trial.started, trial.ended, trial.exit_code = RUNNING, slot.describe(), time.time(), \
        None, None
    trial.launches += 1
    return Running(trial, slot, proc, progress, log)
