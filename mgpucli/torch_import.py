"""Run code right after the user's script imports torch, and not before (stdlib only).

A launched script worker must import nothing heavy before the script's first line (a script may set
``OMP_NUM_THREADS`` or ``CUDA_VISIBLE_DEVICES`` before ``import torch``), yet mgpu's observers (the progress seen at
torch's public points, the nested-launcher check, ``--audit``'s checks) must be in place before the script uses
torch. :func:`when_torch_loads` puts a finder first on ``sys.meta_path`` that finds ``torch`` through the other
finders and wraps its loader: the callbacks run right after ``torch/__init__.py`` has run, before the script's
``import torch`` returns. The finder removes itself at once, and torch's module names its own loader again.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable

_pending: list[Callable[[], None]] = []


class _WhenTorchLoads(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenRun(spec.loader)
                return spec
        return None


class _ThenRun(importlib.abc.Loader):
    """torch's own loader, then the callbacks."""

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
        _run_pending()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _run_pending() -> None:
    while _pending:
        _pending.pop(0)()


def when_torch_loads(callback: Callable[[], None]) -> None:
    """Call ``callback`` right after torch is imported (now, if it is already). Callbacks run in the order given;
    each must handle its own errors."""
    if "torch" in sys.modules:
        callback()
        return
    _pending.append(callback)
    if not any(isinstance(finder, _WhenTorchLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenTorchLoads())
