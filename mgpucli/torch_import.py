"""Run code right after the user's script imports torch (or another named module), and not before (stdlib only).

A launched script worker must import nothing heavy before the script's first line (a script may set
``OMP_NUM_THREADS`` or ``CUDA_VISIBLE_DEVICES`` before ``import torch``), yet mgpu's observers (the progress seen at
torch's public points, the nested-launcher check, ``--audit``'s checks) must be in place before the script uses
torch. :func:`when_torch_loads` (and :func:`when_module_loads`, for the modules of the training libraries the audit
knows) puts a finder first on ``sys.meta_path`` that finds a module it waits for through the other finders and wraps
its loader: the callbacks run right after the module's code has run, before the script's import returns. The module
names its own loader again at once; the finder answers nothing for any other name (one dictionary look-up per
import) and removes itself once nothing is awaited.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType

_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


class _WhenLoaded(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in list(sys.meta_path):
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenRun(spec.loader)
                return spec
        return None


class _ThenRun(importlib.abc.Loader):
    """The module's own loader, then the callbacks waiting for it."""

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
        _run_pending(module)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _run_pending(module: ModuleType) -> None:
    callbacks = _pending.pop(module.__name__, [])
    if not _pending:
        for finder in [f for f in sys.meta_path if isinstance(f, _WhenLoaded)]:
            sys.meta_path.remove(finder)
    while callbacks:
        callbacks.pop(0)(module)


def when_module_loads(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` right after the module ``name`` is imported (now, if it is already). Callbacks run in
    the order given; each must handle its own errors."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    _pending.setdefault(name, []).append(callback)
    if not any(isinstance(finder, _WhenLoaded) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenLoaded())


def when_torch_loads(callback: Callable[[], None]) -> None:
    """Call ``callback`` right after torch is imported (now, if it is already)."""
    when_module_loads("torch", lambda _module: callback())
