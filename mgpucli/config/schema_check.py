"""Check a composed recipe against the typed schema, collecting every problem before raising once."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mgpucli.config import run_length
from mgpucli.config.schema import BUILTIN_TASKS, COMPONENT_PATHS, TASK_METRICS, choices, recipe_schema
from mgpucli.errors import RecipeError
from mgpucli.run_layout import METRICS
from mgpucli.trackers import loggers

REQUIRED_COMPONENTS = ("model", "optim", "data.train")


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0].strip()


def _did_you_mean(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(sorted(options))})"


def _field_type(target: DictConfig, key: str) -> Any:
    """The type the schema declares for ``key`` (Optional unwrapped), read from the schema's dataclass."""
    hint = typing.get_type_hints(OmegaConf.get_type(target)).get(key)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def _section_type(target: DictConfig, key: str) -> type | None:
    """The schema's dataclass for a section key (trainer.ema...); None for a leaf."""
    declared = _field_type(target, key)
    return declared if dataclasses.is_dataclass(declared) else None


def _is_list(target: DictConfig, key: str) -> bool:
    declared = _field_type(target, key)
    return declared is list or typing.get_origin(declared) is list


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
        section = _section_type(target, key)
        current = None if section is None or OmegaConf.is_missing(target, key) else target[key]
        if section is not None and (value is not None or current is not None):
            if isinstance(value, dict):
                if current is None:  # an optional section (trainer.ema...), now given: its defaults, then the keys
                    target[key] = section()
                    current = target[key]
                _merge_section(value, current, path + ".", problems)
            else:
                problems.append(f"{path}: expected a section (mapping), got {value!r}")
            continue
        try:
            target[key] = value
        except OmegaConfBaseException as err:
            if _is_list(target, key) and isinstance(value, str):  # `key=wandb` where a list is due
                problems.append(f"{path}: expected a list, e.g. '{path}=[{value}]', got {value!r}")
            else:
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


def _at(cfg: dict[str, Any], path: str) -> Any:
    node: Any = cfg
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _logger_problems(names: list[str]) -> list[str]:
    """Each entry of ``trainer.loggers`` is a sink mgpu knows (installed or not: mgpucli.config.tracker_check)."""
    known = loggers()
    problems = []
    for name in names:
        if name in known:
            continue
        if name in ("jsonl", "metrics", METRICS):
            problems.append(f"trainer.loggers: {name!r} need not be listed: {METRICS} is always written "
                            f"(the list takes {', '.join(known)})")
            continue
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
        guess = f"did you mean '{close[0]}'? " if close else ""
        problems.append(f"trainer.loggers: {name!r} is not a logger mgpu knows ({guess}it knows {', '.join(known)})")
    return problems


def _value_problems(cfg: dict[str, Any]) -> list[str]:
    """Constraints the types alone don't express."""
    problems = []
    trainer, data = cfg.get("trainer", {}), cfg.get("data", {})
    for path, allowed in choices().items():
        value = _at(cfg, path)
        if value not in allowed:
            problems.append(f"{path}: {value!r} is not one of {', '.join(allowed)}")
    problems += _logger_problems(trainer.get("loggers") or [])

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
    at_least(trainer, "stall_s", "trainer.stall_s", 0, optional=True)  # 0: no stall watch
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
    return problems + _feature_problems(cfg)


def _feature_problems(cfg: dict[str, Any]) -> list[str]:
    """The optional trainer features' values."""
    problems = []
    trainer = cfg.get("trainer", {})
    ema, stopping = trainer.get("ema"), trainer.get("early_stopping")
    if ema is not None:
        if not 0.0 < ema["decay"] < 1.0:
            problems.append(f"trainer.ema.decay: must be between 0 and 1 (e.g. 0.999), got {ema['decay']}")
        if ema["every"] < 1:
            problems.append(f"trainer.ema.every: must be >= 1, got {ema['every']}")
        if ema["start_step"] < 0:
            problems.append(f"trainer.ema.start_step: must be >= 0, got {ema['start_step']}")
    if stopping is not None:
        problems += _early_stopping_problems(stopping, cfg)
    profile = trainer.get("profile")
    if profile is not None:
        for key in ("start_step", "steps"):
            if profile[key] < 1:
                problems.append(f"trainer.profile.{key}: must be >= 1, got {profile[key]}")
    checkpointing = trainer.get("activation_checkpointing")
    if not (isinstance(checkpointing, bool) or (isinstance(checkpointing, list) and checkpointing
                                                and all(isinstance(n, str) and n for n in checkpointing))):
        problems.append("trainer.activation_checkpointing: expected true, false or a list of module class names "
                        f"(e.g. [Block]), got {checkpointing!r}")
    return problems


def _early_stopping_problems(stopping: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    problems = []
    if stopping["mode"] not in ("auto", "min", "max"):
        problems.append(f"trainer.early_stopping.mode: {stopping['mode']!r} is not one of auto, min, max")
    if stopping["patience"] < 1:
        problems.append(f"trainer.early_stopping.patience: must be >= 1, got {stopping['patience']}")
    if stopping["min_delta"] < 0:
        problems.append(f"trainer.early_stopping.min_delta: must be >= 0, got {stopping['min_delta']}")
    names = TASK_METRICS.get(cfg.get("task")) if isinstance(cfg.get("task"), str) else None
    metric = stopping["metric"]
    if names is not None and metric not in names:  # a custom task's names are checked when it is built
        close = difflib.get_close_matches(metric, names, n=1, cutoff=0.5)
        mean = f"; did you mean '{close[0]}'?" if close else ""
        problems.append(f"trainer.early_stopping.metric: {metric!r} is not a validation metric (the {cfg['task']} "
                        f"task reports {', '.join(names)}{mean})")
    if cfg.get("data", {}).get("val") is None:
        problems.append("trainer.early_stopping: decides on validation metrics, but the recipe has no data.val")
    elif cfg.get("trainer", {}).get("val_every") == 0:
        problems.append("trainer.early_stopping: decides on validation metrics, but trainer.val_every=0 never "
                        "validates")
    return problems


def validate_recipe(raw: DictConfig, source: str) -> DictConfig:
    """Return the recipe merged onto the schema defaults and fully resolved, or raise one RecipeError."""
    user = OmegaConf.to_container(raw, resolve=False)
    if not isinstance(user, dict):
        raise RecipeError(source, ["the recipe must be a YAML mapping (key: value lines) at the top level"])
    merged = OmegaConf.structured(recipe_schema())
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
