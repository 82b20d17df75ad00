"""``mgpu launch --audit SCRIPT.py``: find the tutorial's traps in the user's own script while it runs.

Only a script worker launched with ``--audit`` imports this package (:mod:`mgpucli.launch.script_job`); without it
nothing here is imported, patched or paid for. :func:`arm` runs before the script's first line, and still imports
nothing heavy: the checks are installed the moment the script itself imports torch (:mod:`mgpucli.torch_import`),
so a script that sets environment variables before ``import torch`` (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``)
behaves as it does without the audit. :func:`finish` runs when the script ends.

The checks (one module each, :mod:`mgpucli.audit.install` installs them) patch torch at a few public points and
never change what the script computes: no RNG draw, no collective on the script's process groups, no device
synchronisation on its streams. What they find goes to the rank's findings file
(:mod:`mgpucli.run_records.audit_records`), which the launcher shows live and sums up in ``RUN_DIR/audit.json``.

- :mod:`~mgpucli.audit.divergence`: parameters that differ across ranks (a model not wrapped in DDP, a rank that
  skipped a step), and ranks that took different numbers of optimizer steps, compared through the rendezvous store;
- :mod:`~mgpucli.audit.loaders`: a DataLoader that hands every rank the same samples;
- :mod:`~mgpucli.audit.samplers`: ``DistributedSampler.set_epoch`` never called, and padded evaluation;
- :mod:`~mgpucli.audit.saves`: every rank writing the same file with ``torch.save``;
- :mod:`~mgpucli.audit.unused`: ``find_unused_parameters=True`` with nothing unused, and the parameters behind DDP's
  unused-parameter error;
- :mod:`~mgpucli.audit.devices` (GPUs): a model or batch on ``cuda:0`` in a rank whose local rank is not 0, and NCCL
  initialised before ``torch.cuda.set_device``.

In a script built on Transformers' ``Trainer``, Accelerate or Lightning Fabric, :mod:`~mgpucli.audit.libraries` says
which library's code made the call a check judges, where the user created its settings (recorded from :func:`arm` on,
as the library's modules are imported), and the fix in its terms.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mgpucli.torch_import import when_module_loads, when_torch_loads

_session: Any = None  # the running audit (mgpucli.audit.session.Session), once torch is imported
_armed = False
_started_in = os.getcwd()  # where the script started: its own path, if relative, is relative to it


def arm() -> None:
    """Install the checks when the script imports torch (now, if torch is imported already)."""
    global _armed, _started_in
    if _armed:
        return
    _armed = True
    _started_in = os.getcwd()
    when_torch_loads(_install)
    try:
        from mgpucli.audit import libraries

        libraries.watch_settings(when_module_loads)
    except Exception as err:  # noqa: BLE001 - the audit must never stop the script
        print(f"mgpu audit: could not watch the training libraries ({type(err).__name__}: {err}).", file=sys.stderr,
              flush=True)


def _install() -> None:
    global _session
    if _session is not None:
        return
    try:
        from mgpucli.audit import where
        from mgpucli.audit.install import install

        where.started_in = _started_in
        _session = install()
    except Exception as err:  # noqa: BLE001 - the audit must never stop the script
        print(f"mgpu audit: could not install the checks ({type(err).__name__}: {err}); the script runs without "
              "them.", file=sys.stderr, flush=True)


def finish(clean: bool) -> None:
    """The script ended (``clean``: without an error): the end-of-run comparisons, then this rank's status line."""
    if _session is None:
        return
    try:
        _session.finish(clean)
    except Exception as err:  # noqa: BLE001
        print(f"mgpu audit: could not finish ({type(err).__name__}: {err}).", file=sys.stderr, flush=True)
