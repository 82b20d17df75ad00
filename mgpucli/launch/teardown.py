"""A launched recipe worker's SIGTERM: a stop to agree on, or torch's agent tearing down a failed attempt?

torch's agent sends the workers SIGTERM in two cases. It forwards the signal that stops the launcher (Ctrl-C, a
scheduler's SIGTERM): a preemption, which every rank turns into a stop at one agreed step with a checkpoint
(:mod:`mgpucli.engine.stop_requests`), within the agent's 30 s window. And it stops the workers of an attempt that
failed, once one of them has ended with a failure: then no rank can agree on anything (one is gone), and a rank
busy in its own code (a slow read in a dataset, a long task, a save) would only reach the next collective, or the
agent's SIGKILL, seconds later.

The worker tells the two apart by what the agent did first: it tears an attempt down only after one of its workers
ended, and it has reaped that worker before it sends the first SIGTERM; it forwards the launcher's signal while
they all run. So a SIGTERM that finds another worker of this attempt on this node gone (its pid, from the stacks
file every worker opens at its start, :mod:`mgpucli.run_records.stacks`, no longer a running child of the launcher)
is the teardown: the rank says so in its log and ends at once, by that SIGTERM (the launcher's summary and the
post-mortem then count it among the ranks the teardown ended, not as a cause). Any other SIGTERM (the launcher's
forwarded signal, a scheduler's signal to every process, a ``kill`` of one worker) stays a stop request. SIGINT and
SIGUSR1 always do: the agent's teardown never sends them.

The answer is reached from the files and processes as they are when the signal arrives, with no help from the
launcher: nothing can race with it, and a launcher killed outright leaves the workers to their launcher watch
(:mod:`mgpucli.launch.parent_watch`).

Why not the other ways: torch's ``LaunchConfig.shutdown_timeout`` is only the window of a stop the launcher forwards
(the failure path, ``PContext._poll`` closing the workers, always waits 30 s), and shortening it would cut the
preemption's window too. The launcher cannot tell the workers "this is a failure" before the agent's SIGTERM either:
it learns of the failure when the agent does, and no public hook of the agent runs between the two. And it cannot tell
them "this is a preemption" alone: a scheduler's SIGTERM may reach a worker as soon as the launcher, and a SIGTERM to
one worker is a preemption too. What is certain, on every path, is the order of the agent's own steps: it ends a
failed attempt only after reaping the worker that ended.
"""

from __future__ import annotations

import glob
import os
import sys

from mgpucli import env_vars, procfs
from mgpucli.run_records import stacks


def install() -> None:
    """Under ``mgpu launch`` (torch's error file is set): SIGTERM during training asks :func:`attempt_failed`."""
    error_file = os.environ.get(env_vars.ERROR_FILE)
    if not error_file:
        return
    from mgpucli.engine.stop_requests import StopRequests

    StopRequests.is_teardown = lambda: attempt_failed(error_file)


def attempt_failed(error_file: str) -> bool:
    """Whether another worker of this attempt on this node has ended (its stacks file names its pid, and that pid is no
    longer a running child of this worker's parent, the launcher): the agent is tearing the attempt down. Says so in
    this rank's log when it is."""
    mine = os.path.dirname(error_file)
    launcher = os.getppid()
    for rank_dir in sorted(glob.glob(os.path.join(os.path.dirname(mine), "*"))):
        if rank_dir == mine or not os.path.isdir(rank_dir):
            continue
        pid = stacks.read_pid(os.path.join(rank_dir, stacks.STACKS_NAME))
        if pid is not None and pid != os.getpid() and not _running_child(pid, launcher):
            print(f"mgpu: SIGTERM from torch's agent after local rank {os.path.basename(rank_dir)} ended: the attempt "
                  "failed, so this rank ends now (no checkpoint).", file=sys.stderr, flush=True)
            return True
    return False


def _running_child(pid: int, parent: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process whose parent is ``parent``."""
    found = procfs.state_and_parent(pid)
    return found is not None and found[0] not in ("Z", "X", "x") and found[1] == parent
