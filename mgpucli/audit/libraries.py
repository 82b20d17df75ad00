"""Scripts built on a training library (Transformers' ``Trainer``, Accelerate, Lightning Fabric): a finding about
something the library did for the script gives its fix in the library's terms, and points at the user's line that
set it, never at a raw ``DDP(...)`` line the user never wrote.

The table of what mgpu knows of each library is :data:`mgpucli.training_libraries.LIBRARIES`: how its code is
recognised on the stack, which of its objects hold the settings a fix changes (here their creation sites are recorded:
:func:`watch_settings` wraps their constructors as the library's modules are imported), which of its objects iterate
a loader that they shard their own way (not the audit's to judge), and its fixes. The checks ask :func:`here` what
made the call they look at: the user's line, and the library (if any) whose code, called from that line, made it; a
check whose event has no library on its stack uses the library that built the job's DDP model
(:attr:`mgpucli.audit.session.Session.library`). A fix id the library has no words for keeps the check's own
(torch's) fix.

Stdlib only: :func:`watch_settings` runs before the script's first line (:func:`mgpucli.audit.arm`).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Any

from mgpucli.audit.where import live_frames, where_of
from mgpucli.run_records.audit_records import Where
from mgpucli.run_records.stacks import users_code
from mgpucli.training_libraries import BY_PACKAGE, LIBRARIES, Library, package_of

# ---------------------------------------------------------------------------------------------- settings' sites
_sites: dict[int, Where] = {}  # id(object) -> where the user's code created it (removed when the object goes)


def site_of(obj: Any) -> Where | None:
    """Where the user's code created ``obj`` (one of the libraries' watched objects), if recorded."""
    return _sites.get(id(obj)) if obj is not None else None


def _record(obj: Any) -> None:
    if id(obj) in _sites:
        return  # a subclass's constructor calling its parent's: the first (outermost) call has it
    where = where_of(live_frames(1))
    if where is None:
        return
    try:
        weakref.finalize(obj, _sites.pop, id(obj), None)
    except TypeError:
        return  # not weakly referenceable: its id could be reused, so nothing is kept
    _sites[id(obj)] = where


def _watch(cls: type, method: str) -> None:
    original = getattr(cls, method)

    @functools.wraps(original)
    def constructor(obj, *args, **kwargs):
        try:
            _record(obj)
        except Exception:  # noqa: BLE001 - the audit never stands between the script and its objects
            pass
        return original(obj, *args, **kwargs)

    setattr(cls, method, constructor)


def _patch(module: ModuleType, class_name: str, method: str) -> None:
    cls = getattr(module, class_name, None)
    if isinstance(cls, type) and hasattr(cls, method):
        _watch(cls, method)


def watch_settings(when_module_loads: Callable[[str, Callable[[ModuleType], None]], None]) -> None:
    """Record the creation sites of the libraries' settings objects, from when each module is imported."""
    for lib in LIBRARIES:
        for module, class_name, method in lib.watched:
            when_module_loads(module, functools.partial(_patch, class_name=class_name, method=method))


# ---------------------------------------------------------------------------------------------- on the stack
@dataclass
class Call:
    """What made a call: the user's line (or a library's, when no user code is on the stack), and the library whose
    code, called from that line, made it (the outermost known one: the Trainer before the Accelerate it uses)."""

    where: Where | None
    library: Library | None = None
    setting: Where | None = None  # where the user created the object holding the library's settings
    sharded: bool = False  # a library on the stack shards the loader being iterated its own way

    def place(self, fix_id: str, default: Where | None) -> Where | None:
        """Where the finding with ``fix_id`` points: the user's line that created the library's settings object when
        the fix changes it (and it is known), else ``default``."""
        if self.setting is not None and self.library is not None and fix_id in self.library.set_at:
            return self.setting
        return default


def _libraries_on(frames: list[FrameType]) -> list[tuple[Library, FrameType]]:
    """The known libraries' frames inside the user's innermost one, innermost first."""
    found = []
    for frame in frames:
        path = frame.f_code.co_filename
        if users_code(path):
            break
        lib = BY_PACKAGE.get(package_of(path) or "")
        if lib is not None:
            found.append((lib, frame))
    return found


def _setting_site(lib: Library, inside: list[tuple[Library, FrameType]]) -> Where | None:
    for owner, frame in reversed(inside):  # outermost first
        holder = lib.holder(frame.f_locals.get("self")) if owner is lib else None
        if holder is not None:
            return site_of(holder)
    return None


def here(setting: bool = False, sharding: bool = False) -> Call:
    """What made the call running now (the caller of the check that asks); with ``setting``, where the user created
    the library's object holding the settings of what it builds; with ``sharding``, whether a library on the stack
    shards the loader it iterates its own way."""
    frames = live_frames()
    inside = _libraries_on(frames)
    lib = inside[-1][0] if inside else None
    site = _setting_site(lib, inside) if setting and lib is not None else None
    sharded = sharding and any(owner.shards(frame.f_locals.get("self")) for owner, frame in inside)
    return Call(where_of(frames), lib, site, sharded)


def in_terms(fix_id: str, fix: str, cost: str, library: Library | None,
             job: Library | None = None) -> tuple[str, str]:
    """(fix, cost) in the terms of ``library`` (the one whose code made the call, and what it did), else of ``job``
    (the one that built the script's DDP model: what to hand to it), where it has words for ``fix_id``; else as
    given."""
    if library is not None and fix_id in library.fixes:
        note = library.notes.get(fix_id)
        return library.fixes[fix_id], f"{cost} {note}" if note else cost
    if job is not None and fix_id in job.job_fixes:
        return job.job_fixes[fix_id], cost
    return fix, cost
