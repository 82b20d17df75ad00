"""The one error family mgpu raises for problems a user can fix.

Each error carries a user-facing message (what is wrong, and how to fix it) and an exit code. The CLI prints
it without a traceback. Anything else that escapes is a bug and keeps its traceback.
Exit codes: 0 success, 1 the job failed, 2 bad usage / bad input, 75 preempted (stopped on a signal with a
complete checkpoint: requeue and continue with --resume auto).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by a signal after saving a checkpoint; requeue and --resume auto


class MgpuError(Exception):
    """A problem with a message meant for the user."""

    exit_code = EXIT_FAILED
    same_on_every_rank = False  # True: in a multi-process job only rank 0 prints it

    def __init__(self, message: str, hint: str | None = None, *, retryable: bool | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        # Whether `mgpu launch --max-restarts` may retry it (None: judged from the exit code and message).
        self.retryable = retryable

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class UsageError(MgpuError):
    """Bad input: a recipe, an option, a path. Nothing was started, nothing was lost."""

    exit_code = EXIT_USAGE
    same_on_every_rank = True


class RecipeError(UsageError):
    """One or more problems in a recipe, all reported together."""

    def __init__(self, source: str, problems: list[str], hint: str | None = None):
        self.source = source
        self.problems = list(problems)
        lines = [f"{len(self.problems)} problem(s) in recipe {source}:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines), hint)


class CheckpointError(UsageError):
    """A checkpoint that cannot be used: missing, not mgpu's, unsafe, or not fitting the model."""


class JobFailed(MgpuError):
    """The job started and then failed (NaN loss, a failed rank, a collective timeout...)."""

    exit_code = EXIT_FAILED


class Preempted(MgpuError):
    """The job stopped on SIGTERM/SIGINT/SIGUSR1 after every rank agreed on a step and a checkpoint was saved.

    Not a failure: ``step`` is the step the checkpoint holds (the last one completed), ``signal`` the signal this
    rank received (None on a rank that stopped because another rank got one).
    """

    exit_code = EXIT_PREEMPTED
    same_on_every_rank = True

    def __init__(self, message: str, hint: str | None = None, *, step: int | None = None,
                 signal: str | None = None):
        super().__init__(message, hint, retryable=False)
        self.step = step
        self.signal = signal


def error_report(err: MgpuError) -> dict:
    """``err`` as a JSON object another process raises again with :func:`raise_reported` (a check run in a worker or a
    child process, told by the launcher as its own)."""
    if isinstance(err, RecipeError):
        return {"problems": err.problems, "hint": err.hint}
    return {"message": err.message, "hint": err.hint, "usage": isinstance(err, UsageError)}


def raise_reported(report: dict, source: str) -> None:
    """Raise the error :func:`error_report` described (``source``: the recipe its problems are in); return when the
    report describes none."""
    if report.get("problems"):
        raise RecipeError(source, report["problems"], report.get("hint"))
    if report.get("message"):
        raise (UsageError if report.get("usage") else MgpuError)(report["message"], report.get("hint"))
