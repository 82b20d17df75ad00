"""Post-mortem of a run: did it finish, which rank failed first, when, why, and how to fix it.

Layout (stdlib only: ``mgpu doctor RUN_DIR`` never imports torch, nor the launcher: the files it reads are
described in :mod:`mgpucli.run_records`, which ``mgpu launch`` writes through):

- ``lines``: log lines tagged with their rank, file and line number (``[rankN]:`` prefixes understood, so
  lines interleaved from several ranks work as well as one rank's own file).
- ``matchers`` (+ ``tracebacks``): one pure matcher per known failure (log lines -> a ``Match`` with
  the evidence lines and the fix), in priority order.
- ``reader``: ``launch.json`` -> every rank's logs, torch error files and mgpu failure records for every
  attempt, plus ``metrics.jsonl`` and the recipe.
- ``checkpoint_peek``: the step a checkpoint holds, read without torch (a preempted run continues from it).
- ``diagnose``: which rank failed first and why, or that the run was preempted (``diagnose_run``); ``context``
  adds what the run's records know (its settings in the fixes, nodes launched differently, the resume command);
  ``report``: the result as data.
- ``render``: the report in one screen at most (rich, for stderr), and ``postmortem.json``.
"""

from mgpucli.postmortem.diagnose import diagnose_run
from mgpucli.postmortem.render import after_launch_failure, render, write_report
from mgpucli.postmortem.report import Report

__all__ = ["Report", "after_launch_failure", "diagnose_run", "render", "write_report"]
