"""Scripts built on a training library (Transformers' ``Trainer``, Accelerate, Lightning Fabric): a finding about
something the library did for the script gives its fix in the library's terms, and points at the user's line that
set it, never at a raw ``DDP(...)`` line the user never wrote.

One table, :data:`LIBRARIES`, says for each library how its code is recognised on the stack (its installed package),
how its messages name it, which of its objects hold the settings a fix changes (their creation sites are recorded:
:func:`watch_settings` wraps their constructors as the library's modules are imported), which of its objects iterate
a loader that they shard their own way (not the audit's to judge), and its fixes, by fix id (a finding's kind, or a
finer id where one kind has several fixes): for what the library itself did, and for the user's own object in a script
the library runs. The checks ask :func:`here` what made the call they look at: the user's line, and the library (if
any) whose code, called from that line, made it; a check whose event has no library on its stack uses the library
that built the job's DDP model (:attr:`mgpucli.audit.session.Session.library`). A fix id the library has no words for
keeps the check's own (torch's) fix.

Stdlib only: :func:`watch_settings` runs before the script's first line (:func:`mgpucli.audit.arm`).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import Any

from mgpucli.audit.where import library_of, live_frames, where_of
from mgpucli.run_records.audit_records import Where
from mgpucli.run_records.stacks import users_code

_FREEZE = ("# or make every parameter take part in the loss, or freeze the unused ones before {before}:\n"
           "for p in model.unused_part.parameters():\n"
           "    p.requires_grad_(False)")
_ADD_FIND_UNUSED = "# either let DDP look for unused parameters at every step (it costs a graph traversal):\n"


def _has_class(obj: Any, name: str) -> bool:
    return any(c.__name__ == name for c in type(obj).__mro__)


def _never(_obj: Any) -> bool:
    return False


@dataclass(frozen=True)
class Library:
    """One training library: how the audit knows its code, and how it says a fix in its terms."""

    package: str  # its folder in site-packages: a frame in it is the library's code
    name: str  # how messages name it
    holder: Callable[[Any], Any]  # the ``self`` of one of its frames -> the object holding its settings, or None
    watched: tuple[tuple[str, str, str], ...]  # (module, class, method): objects whose creation site is recorded
    fixes: Mapping[str, str]  # fix id -> the fix, as code in its terms, for what the library itself did
    job_fixes: Mapping[str, str] = field(default_factory=dict)  # fix id -> the fix for the user's own object, in a
    # script whose DDP model the library built (what to hand to the library)
    notes: Mapping[str, str] = field(default_factory=dict)  # fix id -> what the library did, added to the cost
    set_at: frozenset[str] = frozenset()  # fix ids whose fix changes its settings object: the finding names the
    # user's line that created it
    shards: Callable[[Any], bool] = _never  # the ``self`` of one of its frames iterates a loader that it shards its
    # own way, which the audit cannot see


def _dispatches(obj: Any) -> bool:
    """Accelerate's ``DataLoaderDispatcher`` in a job: every rank iterates the loader, rank 0's batches are split
    and sent to the others."""
    return _has_class(obj, "DataLoaderDispatcher") and getattr(getattr(obj, "state", None), "num_processes", 1) > 1


_TRAINER_ALONE = ("# the Trainer did not join the job: each rank trained alone (its world size was 1).\n"
                  "# On CPU workers:\n"
                  "args = TrainingArguments(..., use_cpu=True)")
_ACCELERATE_ALONE = ("# Accelerate did not join the job: each rank ran alone (its num_processes was 1).\n"
                     "# On CPU workers:\n"
                     "accelerator = Accelerator(cpu=True, ...)  # or ACCELERATE_USE_CPU=true in the environment")
_FABRIC_STRIDED = ("# every sample exactly once: a strided slice per rank, without a padding sampler\n"
                   "from torch.utils.data import Subset\n"
                   "part = Subset(val_set, range(fabric.global_rank, len(val_set), fabric.world_size))\n"
                   "val_loader = fabric.setup_dataloaders(DataLoader(part, batch_size=batch_size),\n"
                   "                                      use_distributed_sampler=False)\n"
                   "# add up the metric's sums and counts with fabric.all_reduce(..., reduce_op=\"sum\"), then divide")

TRAINER = Library(
    package="transformers",
    name="Transformers' Trainer",
    holder=lambda obj: obj.args if _has_class(getattr(obj, "args", None), "TrainingArguments") else None,
    watched=(("transformers.training_args", "TrainingArguments", "__post_init__"),),
    fixes={
        "find_unused_unneeded": "args = TrainingArguments(..., ddp_find_unused_parameters=False)\n"
                                "# from the command line (HfArgumentParser): --ddp_find_unused_parameters False",
        "ddp_unused_parameters": _ADD_FIND_UNUSED + "args = TrainingArguments(..., ddp_find_unused_parameters=True)\n"
                                 + _FREEZE.format(before="Trainer(model=model, ...)"),
        "loader_not_distributed": _TRAINER_ALONE,
        "params_not_ddp": _TRAINER_ALONE,
    },
    job_fixes={
        "same_save_path": "if trainer.is_world_process_zero():\n"
                          "    torch.save(state, path)\n"
                          "# the model itself: trainer.save_model(output_dir) writes on the main process only",
    },
    notes={
        "find_unused_unneeded": "The Trainer asks DDP for it whenever TrainingArguments' ddp_find_unused_parameters "
                                "is not set (for a model without gradient checkpointing).",
    },
    set_at=frozenset({"find_unused_unneeded", "ddp_unused_parameters", "loader_not_distributed", "params_not_ddp"}),
)

ACCELERATE = Library(
    package="accelerate",
    name="Accelerate",
    holder=lambda obj: (obj.ddp_handler or obj) if _has_class(obj, "Accelerator") else None,
    watched=(("accelerate.accelerator", "Accelerator", "__init__"),
             ("accelerate.utils.dataclasses", "DistributedDataParallelKwargs", "__init__")),
    fixes={
        "find_unused_unneeded": "accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                                "find_unused_parameters=False)])\n"
                                "# or no DistributedDataParallelKwargs at all: False is Accelerate's default",
        "ddp_unused_parameters": _ADD_FIND_UNUSED + "from accelerate import DistributedDataParallelKwargs\n"
                                 "accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                                 "find_unused_parameters=True)])\n"
                                 + _FREEZE.format(before="accelerator.prepare(model, ...)"),
        "loader_not_distributed": _ACCELERATE_ALONE,
        "params_not_ddp": "# prepare the model too: Accelerate wraps it in DDP\n"
                          "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
                          + _ACCELERATE_ALONE.replace("# Accelerate", "# if it is prepared, Accelerate"),
    },
    job_fixes={
        "loader_not_distributed": "# let Accelerate shard it (each rank gets its own batches): prepare it too\n"
                                  "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)",
        "same_save_path": "accelerator.save(state, path)  # writes on the main process only\n"
                          "accelerator.wait_for_everyone()  # the others wait until it is written",
    },
    set_at=frozenset({"find_unused_unneeded", "ddp_unused_parameters"}),
    shards=_dispatches,
)

FABRIC = Library(
    package="lightning_fabric",
    name="Lightning Fabric",
    holder=lambda obj: obj if _has_class(obj, "DDPStrategy") else None,
    watched=(("lightning_fabric.strategies.ddp", "DDPStrategy", "__init__"),),
    fixes={
        "find_unused_unneeded": "from lightning_fabric.strategies import DDPStrategy\n"
                                "fabric = Fabric(..., strategy=DDPStrategy(find_unused_parameters=False))\n"
                                "# or strategy=\"ddp\": False is its default",
        "ddp_unused_parameters": _ADD_FIND_UNUSED + "from lightning_fabric.strategies import DDPStrategy\n"
                                 "fabric = Fabric(..., strategy=DDPStrategy(find_unused_parameters=True))\n"
                                 "# (or strategy=\"ddp_find_unused_parameters_true\")\n"
                                 + _FREEZE.format(before="fabric.setup(model, optimizer)"),
        "padded_evaluation": _FABRIC_STRIDED,
        "loader_not_distributed": "# let Fabric shard it: it puts in a DistributedSampler and calls set_epoch for you\n"
                                  "loader = fabric.setup_dataloaders(loader)  # without use_distributed_sampler=False",
        "params_not_ddp": "# set up the model too: Fabric wraps it in DDP\n"
                          "model, optimizer = fabric.setup(model, optimizer)",
    },
    job_fixes={
        "padded_evaluation": _FABRIC_STRIDED,
        "loader_not_distributed": "# let Fabric shard it: it puts in a DistributedSampler and calls set_epoch for you\n"
                                  "loader = fabric.setup_dataloaders(loader)",
        "same_save_path": "fabric.save(path, state)  # every rank calls it; with DDP, rank 0 writes",
    },
    notes={
        "padded_evaluation": "fabric.setup_dataloaders put in this DistributedSampler (drop_last=False).",
    },
    set_at=frozenset({"find_unused_unneeded", "ddp_unused_parameters"}),
)

LIBRARIES = (TRAINER, ACCELERATE, FABRIC)
_BY_PACKAGE = {lib.package: lib for lib in LIBRARIES}


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
        lib = _BY_PACKAGE.get(library_of(path) or "")
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
