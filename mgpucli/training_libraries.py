"""The training libraries mgpu knows (Transformers' ``Trainer``, Accelerate, Lightning Fabric): one table,
:data:`LIBRARIES`, of how each one's code is recognised (its installed package), how messages name it, which of its
objects hold the settings a fix changes, which of its objects iterate a loader they shard their own way, and its
fixes by fix id (a finding's kind or a failure's signature, or a finer id where one kind has several fixes): for what
the library itself did, and for the user's own object in a script the library runs.

Read by the audit (:mod:`mgpucli.audit.libraries`: a finding in the library's terms) and the post-mortem
(:mod:`mgpucli.postmortem.context`: a failure's fix in them). Stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
BY_PACKAGE = {lib.package: lib for lib in LIBRARIES}


_PACKAGES = re.compile(r"/(?:site|dist)-packages/([^/]+)")


def package_of(path: str) -> str | None:
    """The installed package a file belongs to (``torch``, ``transformers``), None for the user's own code, mgpu's, or
    the standard library's."""
    found = _PACKAGES.search(path)
    if found is None:
        return None
    name = found.group(1)
    return name[:-3] if name.endswith(".py") else name
