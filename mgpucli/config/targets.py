"""Check and build ``_target_`` components.

Every ``_target_`` is checked before any training work starts: it imports, it is callable, and its arguments
bind to its signature (with the arguments mgpu injects: the optimizer gets the model's parameters, the
scheduler the optimizer, both positionally). Components are built with ``hydra.utils.instantiate``.
"""

from __future__ import annotations

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


def _check_one(path: str, node: dict, injected: int) -> str | None:
    target = node["_target_"]
    if not isinstance(target, str) or not target:
        return f"{path}._target_: expected a dotted import path like torch.optim.SGD, got {target!r}"
    try:
        obj = locate(target)
    except Exception as err:  # ImportError, AttributeError, ValueError...: all mean "does not import"
        reason = " ".join(str(err).split())
        return f"{path}._target_: '{target}' does not import ({reason})"
    if not callable(obj):
        return f"{path}._target_: '{target}' is {type(obj).__name__}, not something callable"
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None  # builtins without a signature: nothing to check
    kwargs = {k: None for k in node if k not in HYDRA_KEYS}
    args = [None] * injected + list(node.get("_args_") or [])
    try:
        if node.get("_partial_"):
            sig.bind_partial(*args, **kwargs)
        else:
            sig.bind(*args, **kwargs)
    except TypeError as err:
        params = ", ".join(p for p in sig.parameters if p not in ("self",))
        return f"{path}: arguments don't fit {target}({params}): {err}"
    return None


def check_recipe(cfg: DictConfig, source: str) -> None:
    """Raise one RecipeError listing every ``_target_`` that doesn't import, isn't callable, or doesn't bind."""
    container = OmegaConf.to_container(cfg, resolve=True)
    problems = []
    for top in TOP_COMPONENTS:
        section, _, key = top.rpartition(".")
        node = container.get(section, {}).get(key) if section else container.get(key)
        for path, target_node in iter_targets(node, top):
            problem = _check_one(path, target_node, INJECTED.get(top, 0) if path == top else 0)
            if problem:
                problems.append(problem)
    if problems:
        raise RecipeError(source, problems, "Fix the _target_ paths or arguments above; `python -c 'import x'` "
                          "shows whether a module imports.")


def build(node: DictConfig | dict, *args: Any, **kwargs: Any) -> Any:
    """Instantiate a component; nested containers arrive as plain lists/dicts unless the node says otherwise."""
    from hydra.utils import instantiate

    if "_convert_" not in node:
        kwargs.setdefault("_convert_", "all")
    return instantiate(node, *args, **kwargs)
