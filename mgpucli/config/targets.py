"""Check and build ``_target_`` components.

Every ``_target_`` is checked before any training work starts: it imports, it is callable, and its arguments
bind to its signature (with the arguments mgpu injects: the optimizer gets the model's parameters, the
scheduler the optimizer, both positionally). Components are built with ``hydra.utils.instantiate``.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mgpucli.errors import RecipeError

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
# Positional arguments mgpu passes when building a top-level component.
INJECTED = {"optim": 1, "scheduler": 1}
TOP_COMPONENTS = ("model", "optim", "scheduler", "data.train", "data.val", "task")


def iter_targets(node: Any, path: str) -> Iterator[tuple[str, dict]]:
    """Yield (key path, node) for every mapping with a ``_target_``, nested ones included."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield path, node
        for key, value in node.items():
            if key not in HYDRA_KEYS:
                yield from iter_targets(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from iter_targets(value, f"{path}[{i}]")


def locate(target: str) -> Any:
    """Import the object a dotted ``_target_`` names (ImportError with Hydra's reason on failure)."""
    import logging

    from hydra.utils import get_object

    log = logging.getLogger("hydra.utils")  # get_object also logs the failure; mgpu reports it itself
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        return get_object(target)
    finally:
        log.setLevel(level)


def _unknown_keys(sig: inspect.Signature, keys: list[str]) -> list[str]:
    """The keys no parameter of ``sig`` is named (none when it takes ``**kwargs``)."""
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return []
    return [key for key in keys if key not in sig.parameters]


def _no_such_argument(path: str, target: str, sig: inspect.Signature, key: str, injected: int) -> str:
    """``optim.lrr: torch.optim.SGD takes no argument 'lrr' (did you mean 'lr'?)``: the guess comes from the
    arguments a recipe can set (not ``self``, ``*args``, or what mgpu injects, such as the optimizer's params)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [(name, p) for name, p in sig.parameters.items() if name != "self"]
    injected_names = [name for name, p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY][:injected]
    offered = [name for name, p in params if p.kind in kinds and name not in injected_names]
    close = difflib.get_close_matches(key, offered, n=1, cutoff=0.6)
    guess = f"did you mean '{close[0]}'?" if close else f"it takes {', '.join(offered) or 'no arguments'}"
    return f"{path}.{key}: {target} takes no argument '{key}' ({guess})"


def _check_one(path: str, node: dict, injected: int) -> list[str]:
    target = node["_target_"]
    if not isinstance(target, str) or not target:
        return [f"{path}._target_: expected a dotted import path like torch.optim.SGD, got {target!r}"]
    try:
        obj = locate(target)
    except Exception as err:  # ImportError, AttributeError, ValueError...: all mean "does not import"
        reason = " ".join(str(err).split())
        return [f"{path}._target_: '{target}' does not import ({reason})"]
    if not callable(obj):
        return [f"{path}._target_: '{target}' is {type(obj).__name__}, not something callable"]
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []  # builtins without a signature: nothing to check
    keys = [str(k) for k in node if k not in HYDRA_KEYS]
    unknown = _unknown_keys(sig, keys)
    problems = [_no_such_argument(path, target, sig, key, injected) for key in unknown]
    kwargs = {k: None for k in keys if k not in unknown}
    args = [None] * injected + list(node.get("_args_") or [])
    try:
        if node.get("_partial_"):
            sig.bind_partial(*args, **kwargs)
        else:
            sig.bind(*args, **kwargs)
    except TypeError as err:
        params = ", ".join(p for p in sig.parameters if p not in ("self",))
        problems.append(f"{path}: arguments don't fit {target}({params}): {err}")
    return problems


def check_recipe(cfg: DictConfig, source: str, trackers: str | None = "find") -> None:
    """Raise one RecipeError listing every ``_target_`` that doesn't import, isn't callable, or doesn't bind, and
    every tracker in ``trainer.loggers`` that isn't usable here (:mod:`mgpucli.config.tracker_check`): looked up
    (``trackers="find"``), imported (``"import"``: the launcher and ``--check``), or not checked (None: a
    checkpoint's recipe being validated trains nothing)."""
    from mgpucli.config.tracker_check import tracker_problems

    container = OmegaConf.to_container(cfg, resolve=True)
    problems = []
    for top in TOP_COMPONENTS:
        section, _, key = top.rpartition(".")
        node = container.get(section, {}).get(key) if section else container.get(key)
        for path, target_node in iter_targets(node, top):
            problems += _check_one(path, target_node, INJECTED.get(top, 0) if path == top else 0)
    tracker = tracker_problems(cfg, importing=trackers == "import") if trackers is not None else []
    if problems:
        raise RecipeError(source, problems + tracker, "Fix the _target_ paths or arguments above (key=value sets any "
                          "argument its target takes); `python -c 'import x'` shows whether a module imports.")
    from mgpucli.config.hub_check import hub_problems  # every target imports: the sources they name can be read

    sources = hub_problems(container)
    if sources:
        raise RecipeError(source, sources + tracker, "Each Hugging Face source must be a local directory or a Hub id "
                          "this machine has in its cache or can download.")
    if tracker:
        raise RecipeError(source, tracker, "Experiment trackers are optional extras of mgpu, imported only by the "
                          "rank that logs (rank 0).")


def build(node: DictConfig | dict, *args: Any, **kwargs: Any) -> Any:
    """Instantiate a component; nested containers arrive as plain lists/dicts unless the node says otherwise."""
    from hydra.utils import instantiate

    if "_convert_" not in node:
        kwargs.setdefault("_convert_", "all")
    return instantiate(node, *args, **kwargs)
