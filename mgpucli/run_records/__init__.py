"""The records a run leaves on disk, in the format ``mgpu launch`` writes and ``mgpu doctor RUN_DIR`` reads.

Stdlib only, and importing nothing else of mgpu but :mod:`mgpucli.errors`: the launcher, its workers and the
post-mortem all read these files, and the post-mortem must never import torch or the launcher.

- ``json_files``: JSON files written whole or not at all (a temporary file, then one rename), read back as a
  dict or None.
- ``launch_record``: ``RUN_DIR/launch.json``, the launcher's record of the job: what ran, the environment that
  matters, every attempt's rank -> log files index, and the result.
- ``worker_records``: what a worker leaves beside torch's ``error.json``: ``mgpu_failure.json`` (how it failed)
  ``mgpu_started`` (its training started) and ``mgpu_finished`` (the run finished); reading torch's error file.
- ``first_failure``: the failed ranks of an attempt, the one most likely to have started it first.
"""
