"""``${total_steps:}`` and ``${steps_per_epoch:}``: a recipe's schedule tied to the run's real length.

A schedule's length (``CosineAnnealingLR``'s ``T_max``, ``OneCycleLR``'s ``total_steps``) depends on the dataset
size, the batch size, the number of processes, ``trainer.grad_accum`` and ``trainer.epochs``/``max_steps``:
numbers only a worker knows, once it has built its train loader. Everything before that (composing, the
schema, ``--check``, the ``_target_`` binding check, the launcher's hand-off to its workers) runs with these
resolvers returning their own interpolation text: OmegaConf 2.3 does not re-resolve a string a resolver returns,
so ``OmegaConf.to_container(resolve=True)`` keeps ``"${total_steps:}"``, and ``OmegaConf.create`` of that
container makes it an interpolation again. The trainer then calls :func:`resolve` with the real numbers before
it builds the scheduler, so the recipe it writes (``RUN_DIR/recipe.yaml``, checkpoints) holds them.

Both count optimizer steps (what a ``trainer.scheduler_interval: step`` scheduler counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

# What each one is, for users (docs/components.md is generated from this).
MEANINGS = {
    "total_steps": "optimizer steps in the whole run: `${steps_per_epoch:}` x `trainer.epochs`, or "
                   "`trainer.max_steps` when set (where the run stops)",
    "steps_per_epoch": "optimizer steps per epoch on each process: the batches of its share of the train set, "
                       "divided by `trainer.grad_accum`, rounded up (a last, partial accumulation still steps)",
}
NAMES = tuple(MEANINGS)
# Sections built after the trainer's loaders exist (the optimizer, the scheduler), and vars (built by nothing,
# only interpolated into them): the only places where the run's length can be known in time.
ALLOWED_SECTIONS = ("optim", "scheduler", "vars")

_known: dict[str, int] = {}  # set by resolve() for the time it resolves a recipe; empty otherwise


def _placeholder(name: str) -> str:
    return "${" + name + ":}"


def _resolver(name: str):
    def value(*args: Any) -> int | str:
        if args:
            raise ValueError(f"{_placeholder(name)} takes no arguments, got {', '.join(map(repr, args))}")
        return _known.get(name, _placeholder(name))

    value.__name__ = name
    return value


for _name in NAMES:
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver(_name))


@dataclass(frozen=True)
class RunLength:
    steps_per_epoch: int  # optimizer steps per epoch on each rank
    total_steps: int  # optimizer steps in the whole run


def of(batches_per_epoch: int, grad_accum: int, epochs: int, max_steps: int | None) -> RunLength:
    """The run's length in optimizer steps, as the trainer runs it: a partial accumulation at an epoch's end
    still makes a step, and ``max_steps``, when set, is where the run stops."""
    per_epoch = math.ceil(batches_per_epoch / grad_accum)
    return RunLength(per_epoch, int(max_steps) if max_steps is not None else per_epoch * int(epochs))


def resolve(cfg: DictConfig, length: RunLength) -> DictConfig:
    """A copy of ``cfg`` with every ``${total_steps:}`` and ``${steps_per_epoch:}`` replaced by ``length``."""
    _known.update(total_steps=length.total_steps, steps_per_epoch=length.steps_per_epoch)
    try:
        return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    finally:
        _known.clear()


def _uses(value: Any) -> list[str]:
    return [name for name in NAMES if isinstance(value, str) and _placeholder(name) in value]


def misplaced(container: Any, path: str = "") -> list[str]:
    """Problems for every use outside ALLOWED_SECTIONS, in a resolved recipe container (where each use is its
    placeholder text): the model, the datasets and the trainer's settings are built before the length is known."""
    problems: list[str] = []
    if isinstance(container, dict):
        for key, value in container.items():
            child = f"{path}.{key}" if path else str(key)
            if not path and key in ALLOWED_SECTIONS:
                continue
            problems += misplaced(value, child)
    elif isinstance(container, list):
        for i, value in enumerate(container):
            problems += misplaced(value, f"{path}[{i}]")
    else:
        for name in _uses(container):
            problems.append(
                f"{path}: {_placeholder(name)} is known only once the run's train loader exists, after this value "
                f"is needed; use it in the scheduler or optim section (or in vars they interpolate)")
    return problems
