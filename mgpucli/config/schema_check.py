"""Check a composed recipe against the typed schema, collecting every problem before raising once."""

from __future__ import annotations

import difflib
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mgpucli.config import run_length
from mgpucli.config.schema import BUILTIN_TASKS, CHOICES, COMPONENT_PATHS, RecipeSchema
from mgpucli.errors import RecipeError

REQUIRED_COMPONENTS = ("model", "optim", "data.train")


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0].strip()


def _did_you_mean(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(sorted(options))})"


def _merge_section(user: dict, target: DictConfig, prefix: str, problems: list[str]) -> None:
    """Assign user values into the typed ``target`` key by key, so that every problem is seen."""
    for key, value in user.items():
        path = f"{prefix}{key}"
        if path in COMPONENT_PATHS:
            target[key] = value
            continue
        if key not in list(target.keys()):  # (`in` is False for MISSING values)
            known = [f"{prefix}{k}" for k in target.keys()]
            problems.append(f"{path}: unknown key{_did_you_mean(path, known)}")
            continue
        child = target._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none():
            if isinstance(value, dict):
                _merge_section(value, child, path + ".", problems)
            else:
                problems.append(f"{path}: expected a section (mapping), got {value!r}")
            continue
        try:
            target[key] = value
        except OmegaConfBaseException as err:
            problems.append(f"{path}: {_first_line(err)}")


def _resolve_leaves(node: DictConfig, prefix: str, problems: list[str]) -> None:
    """Resolve interpolations leaf by leaf (one bad reference must not hide the others)."""
    for key in node.keys():
        path = f"{prefix}{key}"
        if OmegaConf.is_missing(node, key):
            continue
        try:
            value = node[key]
        except OmegaConfBaseException as err:
            problems.append(f"{path}: {_first_line(err)}")
            continue
        if isinstance(value, DictConfig) and path not in COMPONENT_PATHS:
            _resolve_leaves(value, path + ".", problems)
        elif isinstance(value, DictConfig):
            try:
                OmegaConf.to_container(value, resolve=True)
            except OmegaConfBaseException as err:
                problems.append(f"{path}: {_first_line(err)}")


def _missing(merged: DictConfig, user: dict) -> list[str]:
    problems = []
    for section in ("model", "optim", "data"):
        if section not in user:
            problems.append(f"{section}: missing required section (see recipes/quickstart.yaml for an example)")
    for path in ("name", "data.train", "data.batch_size", "model", "optim"):
        head = path.split(".")[0]
        if head in ("model", "optim", "data") and head not in user:
            continue
        parent, _, leaf = path.rpartition(".")
        node = OmegaConf.select(merged, parent) if parent else merged
        if node is not None and OmegaConf.is_missing(node, leaf):
            problems.append(f"{path}: missing required value")
    return problems


def _naming_problems(cfg: dict[str, Any]) -> list[str]:
    """An empty ``name`` or ``run_dir`` (``name=`` on the command line, ``${oc.env:VAR,}`` of an unset variable)
    would train into ``runs/`` itself or into the working directory."""
    why = {"name": "it names the run dir (runs/${name}, unless run_dir says otherwise)",
           "run_dir": "the run would write its checkpoints and records into the working directory"}
    return [f"{key}: empty; {reason}" for key, reason in why.items()
            if isinstance(cfg.get(key), str) and not cfg[key].strip()]


def _value_problems(cfg: dict[str, Any]) -> list[str]:
    """Constraints the types alone don't express."""
    problems = []
    trainer, data = cfg.get("trainer", {}), cfg.get("data", {})
    for path, choices in CHOICES.items():
        section, _, key = path.partition(".")
        value = cfg.get(section, {}).get(key)
        if value not in choices:
            problems.append(f"{path}: {value!r} is not one of {', '.join(choices)}")

    def at_least(section: dict, name: str, path: str, low: int, optional: bool = False) -> None:
        value = section.get(name)
        if value is None and optional:
            return
        if isinstance(value, (int, float)) and value < low:
            problems.append(f"{path}: must be >= {low}, got {value}")

    at_least(data, "batch_size", "data.batch_size", 1)
    at_least(data, "val_batch_size", "data.val_batch_size", 1, optional=True)
    for name in ("epochs", "grad_accum", "log_every", "timeout_s"):
        at_least(trainer, name, f"trainer.{name}", 1)
    for name in ("max_steps", "cpu_threads", "checkpoint_every_steps"):
        at_least(trainer, name, f"trainer.{name}", 1, optional=True)
    for name in ("val_every", "checkpoint_every", "keep_checkpoints"):
        at_least(trainer, name, f"trainer.{name}", 0)
    clip = trainer.get("clip_grad_norm")
    if isinstance(clip, (int, float)) and not clip > 0:
        problems.append(f"trainer.clip_grad_norm: must be > 0 (the largest gradient norm allowed), got {clip}; "
                        "drop it (null) to train without clipping")
    workers = data.get("num_workers")
    if workers != "auto" and not (isinstance(workers, int) and not isinstance(workers, bool) and workers >= 0):
        problems.append(f"data.num_workers: expected 'auto' or an integer >= 0, got {workers!r}")
    if data.get("pin_memory") not in ("auto", True, False):
        problems.append(f"data.pin_memory: expected auto, true or false, got {data.get('pin_memory')!r}")
    task = cfg.get("task")
    if not (task in BUILTIN_TASKS or (isinstance(task, dict) and "_target_" in task)):
        problems.append(f"task: expected one of {', '.join(BUILTIN_TASKS)} or a component with _target_, got {task!r}")
    for path in REQUIRED_COMPONENTS + ("scheduler", "data.val"):
        section, _, key = path.rpartition(".")
        node = cfg.get(section, {}).get(key) if section else cfg.get(key)
        if node is None and path not in REQUIRED_COMPONENTS:
            continue
        if not (isinstance(node, dict) and "_target_" in node):
            problems.append(f"{path}: expected a component with a _target_ (e.g. _target_: torch.optim.SGD), "
                            f"got {node!r}")
    return problems


def validate_recipe(raw: DictConfig, source: str) -> DictConfig:
    """Return the recipe merged onto the schema defaults and fully resolved, or raise one RecipeError."""
    user = OmegaConf.to_container(raw, resolve=False)
    if not isinstance(user, dict):
        raise RecipeError(source, ["the recipe must be a YAML mapping (key: value lines) at the top level"])
    merged = OmegaConf.structured(RecipeSchema)
    problems: list[str] = []
    _merge_section(user, merged, "", problems)
    missing = _missing(merged, user)
    refused = {p.split(":")[0] for p in problems}  # a value refused above is not reported missing as well
    problems += [p for p in missing if p.split(":")[0] not in refused]
    unresolved: list[str] = []
    _resolve_leaves(merged, "", unresolved)
    early = run_length.misplaced(user)  # ${total_steps:} where it can't be known yet (said once per key)
    said = {p.split(":")[0] for p in early}
    problems += early + [p for p in unresolved if p.split(":")[0] not in said]
    if not missing and not unresolved:  # value checks need a complete, resolvable recipe
        resolved = OmegaConf.to_container(merged, resolve=True)
        problems += _naming_problems(resolved) + _value_problems(resolved)
        problems += [p for p in run_length.misplaced(resolved) if p.split(":")[0] not in said]  # via ${vars.x}
    if problems:
        raise RecipeError(source, problems)
    return OmegaConf.create(OmegaConf.to_container(merged, resolve=True))
