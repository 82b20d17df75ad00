"""The recipe's Hugging Face sources, checked before any worker starts: every local path exists, and every Hub id
is in this machine's cache or can be downloaded now (:func:`mgpucli.hub.source_problem`).

A component says which of its arguments name a Hub repository with a ``hub_arguments`` attribute (``{argument:
"model" or "dataset"}``: mgpu's Transformers components); a ``_target_`` that is a ``from_pretrained`` (Transformers'
own classes, written directly in a recipe) names one with ``pretrained_model_name_or_path``.
"""

from __future__ import annotations

import functools
from typing import Any

from mgpucli import hub
from mgpucli.config.targets import TOP_COMPONENTS, iter_targets, locate

FROM_PRETRAINED = {"pretrained_model_name_or_path": "model"}


def _hub_arguments(target: str) -> dict[str, str]:
    if target.endswith(".from_pretrained"):
        return FROM_PRETRAINED
    try:
        return dict(getattr(locate(target), "hub_arguments", None) or {})
    except Exception:  # noqa: BLE001 - a target that doesn't import is the target check's to report
        return {}


def hub_sources(container: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(recipe key, source, repository kind) for every string argument that names a Hub repository."""
    found = []
    for top in TOP_COMPONENTS:
        section, _, key = top.rpartition(".")
        node = container.get(section, {}).get(key) if section else container.get(key)
        for path, target_node in iter_targets(node, top):
            for argument, kind in _hub_arguments(str(target_node["_target_"])).items():
                value = target_node.get(argument)
                if isinstance(value, str):
                    found.append((f"{path}.{argument}", value, kind))
    return found


def hub_problems(container: dict[str, Any]) -> list[str]:
    """One problem per source this machine can't load (the Hub's reachability probed once, when needed)."""
    reachable = functools.lru_cache(maxsize=1)(hub.hub_reachable)
    problems = []
    for key, source, kind in hub_sources(container):
        found = hub.source_problem(key, source, kind, reachable=reachable)
        if found:
            problems.append(found)
    return problems
