"""``mgpu sweep``: many runs of one recipe sharing this machine's devices, each a full ``mgpu launch``.

- ``grid``: the overrides in Hydra's sweep syntax -> the trials (every combination), each with its name and values.
- ``slots``: the devices -> the slots trials run in (GPU groups, or CPU processes side by side).
- ``check``: every trial's recipe composed and checked before anything starts.
- ``record``: ``runs/NAME/sweep.json``: the sweep as it stands, and what the same command again does with each trial.
- ``trials``: one trial's ``mgpu launch`` command, started in its slot, its state as it ends.
- ``scheduler``: trials queued for the next free slot, watched, stopped together on Ctrl-C or SIGTERM.
- ``view``: the live table on a terminal, one line per trial start and end otherwise.
- ``summary``: the trials sorted by their best validation metric, the best named with the command that reruns it.

The sweep process starts no worker itself: each trial is ``python -m mgpucli launch`` in a session of its own, with
every guarantee a launch has (checkpoints, exact validation, logs, post-mortem).
"""
