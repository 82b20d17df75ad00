"""``mgpu launch --audit SCRIPT.py``: find the tutorial's traps in the user's own script while it runs.

Only a script worker launched with ``--audit`` imports this package (:mod:`mgpucli.launch.script_job`); without it
nothing here is imported, patched or paid for. :func:`arm` runs before the script's first line, and still imports
nothing heavy: the checks are installed the moment the script itself imports torch (an import hook on ``torch``),
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
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any

_session: Any = None  # the running audit (mgpucli.audit.session.Session), once torch is imported
_armed = False
_started_in = os.getcwd()  # where the script started: its own path, if relative, is relative to it


class _WhenTorchLoads(importlib.abc.MetaPathFinder):
    """Finds ``torch`` through the other finders and wraps its loader, so the checks are installed right after
    ``torch/__init__.py`` has run (and before the script's ``import torch`` returns). Removes itself at once."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenInstall(spec.loader)
                return spec
        return None


class _ThenInstall(importlib.abc.Loader):
    """torch's own loader, then the checks; afterwards torch's module names its own loader again."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self.inner
        module.__loader__ = self.inner
        _install()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def arm() -> None:
    """Install the checks when the script imports torch (now, if torch is imported already)."""
    global _armed, _started_in
    if _armed:
        return
    _armed = True
    _started_in = os.getcwd()
    if "torch" in sys.modules:
        _install()
        return
    sys.meta_path.insert(0, _WhenTorchLoads())


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
